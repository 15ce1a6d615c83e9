"""Times the training iterator (ChipLoader) end to end with 0 (in-process), 1, 2 and N worker processes.

Prints chips/s as the consumer sees them (batches handed out as NDArrays), the per-chip time of each
stage inside the workers (decode, crop/resize/mean, anchor targets + gt boxes), the main process's
CPU time per chip (scheduling, handing out batches; in-process it includes the chip work), the
set-up time (first epoch's mining, forking), and the peak memory of the pool: the workers'
proportional set size (their share of pages they touch, the shared batch ring included), the ring's
size, and the main process's resident memory.

    .venv/bin/python tools/benchmark_iterator.py [--images 40] [--batches 12] [--workers 0,1,2]
        [--max-side 640] [--synthetic data/synthetic]

The synthetic images are 600-1600 px a side with grain noise, so JPEG decoding dominates;
``--max-side 640`` re-encodes them at COCO size (longest side 640, boxes scaled) into a temporary
folder to measure the COCO case.
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import cv2
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lib.config import load_config, parse_cli_overrides  # noqa: E402
from lib.data import ChipLoader  # noqa: E402
from lib.dataset import ensure_synthetic_dataset, load_roidb, read_image  # noqa: E402

MB = 1 << 20


class MemoryPeak:
    """Samples the loader's processes every ``interval`` s and keeps the peaks (reading a worker's proportional
    memory walks its page tables, so sampling often would slow the workers down)."""

    def __init__(self, pids, interval=1.0):
        self.pids, self.interval = pids, interval
        self.workers_pss = 0
        self.main_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        total = 0
        for pid in self.pids:
            try:
                total += psutil.Process(pid).memory_full_info().pss
            except psutil.Error:
                pass
        self.workers_pss = max(self.workers_pss, total)
        self.main_rss = max(self.main_rss, psutil.Process().memory_info().rss)

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()
        self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def shrink_roidb(roidb, max_side, folder):
    """Copies of the entries with images re-encoded so the longer side is ``max_side`` (boxes scaled)."""
    written, entries = {}, []
    for entry in roidb:
        scale = min(1.0, max_side / max(entry["height"], entry["width"]))
        path = entry["image"]
        if path not in written:
            image = read_image(path)
            small = cv2.resize(image, (round(entry["width"] * scale), round(entry["height"] * scale)),
                               interpolation=cv2.INTER_AREA)
            written[path] = os.path.join(folder, os.path.basename(path))
            cv2.imwrite(written[path], small, [cv2.IMWRITE_JPEG_QUALITY, 90])
        height, width = read_image(written[path]).shape[:2]
        entries.append(dict(entry, image=written[path], height=height, width=width,
                            boxes=(entry["boxes"] * (width / entry["width"])).astype("float32"),
                            crowd_boxes=(entry["crowd_boxes"] * (width / entry["width"])).astype("float32")))
    return entries


def run(roidb, cfg, workers, batches, warmup):
    """One configuration: returns a dict of figures."""
    start = time.perf_counter()
    loader = ChipLoader(roidb, cfg, num_workers=workers, seed=0)
    setup = time.perf_counter() - start
    try:
        with MemoryPeak(loader.pids) as memory:
            for _ in range(warmup):
                next(loader)
            chips_before, stats = loader.stats.chips, loader.stats
            seconds = (stats.decode_seconds, stats.image_seconds, stats.target_seconds)
            consumed = 0
            cpu_before = psutil.Process().cpu_times()
            start = time.perf_counter()
            while consumed < batches:
                try:
                    batch = next(loader)
                except StopIteration:
                    loader.reset()
                    continue
                batch.data[0].wait_to_read()
                consumed += 1
            elapsed = time.perf_counter() - start
            cpu_after = psutil.Process().cpu_times()
        built = stats.chips - chips_before
        return {
            "chips/s": consumed * loader.batch_size / elapsed,
            "decode": (stats.decode_seconds - seconds[0]) / built * 1e3,
            "image": (stats.image_seconds - seconds[1]) / built * 1e3,
            "targets": (stats.target_seconds - seconds[2]) / built * 1e3,
            "setup": setup,
            "main cpu": (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system)
            / (consumed * loader.batch_size) * 1e3,
            "workers MB": memory.workers_pss / MB,
            "ring MB": loader._resources.ring.nbytes / MB,
            "main MB": memory.main_rss / MB,
        }
    finally:
        loader.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", default="data/synthetic", help="synthetic dataset folder (made if missing)")
    parser.add_argument("--images", type=int, default=40, help="images used (their flipped copies too)")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    parser.add_argument("--workers", default=f"0,1,2,{os.cpu_count()}", help="comma-separated process counts")
    parser.add_argument("--max-side", type=int, default=0, help="re-encode images to this longest side (0: keep)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY VALUE", help="config overrides")
    args = parser.parse_args(argv)

    path = ensure_synthetic_dataset(args.synthetic)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [("dataset.dataset_path", path), ("dataset.image_set", "train"),
                                 ("dataset.root_path", os.path.join(tmp, "root"))] + parse_cli_overrides(args.set))
        roidb, _ = load_roidb(cfg, "train")
        ids = {entry["id"] for entry in roidb[:args.images]}
        roidb = [entry for entry in roidb if entry["id"] in ids]
        if args.max_side:
            roidb = shrink_roidb(roidb, args.max_side, tmp)
        sizes = sorted(max(e["height"], e["width"]) for e in roidb)
        print(f"{len(roidb)} roidb entries (longest side {sizes[0]}-{sizes[-1]} px), batch {cfg.TRAIN.BATCH_IMAGES} "
              f"chips, {args.batches} timed batches, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} at start")
        counts = sorted({int(w) for w in args.workers.split(",")})
        header = (f"{'processes':>10} {'chips/s':>8} {'per proc':>8} {'speed-up':>8} {'decode ms':>9} "
                  f"{'resize ms':>9} {'targets ms':>10} {'main ms':>8} {'setup s':>7} {'workers MB':>10} "
                  f"{'ring MB':>7} {'main MB':>7}")
        print(header)
        print("-" * len(header))
        one = None
        for workers in counts:
            r = run(roidb, cfg, workers, args.batches, args.warmup)
            one = r["chips/s"] if workers == 1 else one
            speedup = f"{r['chips/s'] / one:.2f}x" if one and workers >= 1 else "-"
            per_process = r["chips/s"] / max(workers, 1)
            label = "0 (inline)" if workers == 0 else str(workers)
            print(f"{label:>10} {r['chips/s']:8.1f} {per_process:8.1f} {speedup:>8} {r['decode']:9.2f} "
                  f"{r['image']:9.2f} {r['targets']:10.2f} {r['main cpu']:8.2f} {r['setup']:7.2f} "
                  f"{r['workers MB']:10.0f} {r['ring MB']:7.0f} {r['main MB']:7.0f}", flush=True)


if __name__ == "__main__":
    main()
