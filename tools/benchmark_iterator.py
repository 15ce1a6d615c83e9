"""Times the training iterator (ChipLoader) end to end with 0 (in-process), 1, 2 and N worker processes.

Prints chips/s as the consumer sees them (batches handed out as NDArrays), the per-chip time of each
stage inside the workers (decode, crop/resize/mean, anchor targets + gt boxes), the main process's
CPU time per chip (scheduling, handing out batches; in-process it includes the chip work), the
set-up time (first epoch's mining, forking), and the peak memory of the pool: the workers'
proportional set size (their share of pages they touch, the shared batch ring included), the ring's
size, and the main process's resident memory.

    python tools/benchmark_iterator.py --cfg configs/faster/sniper_synthetic_tiny.yml [--set KEY VALUE ...]
        [--images 40] [--batches 12] [--workers 0,1,2] [--max-side 640]

The images are the first ``--images`` of the config's ``dataset.image_set`` (and their flipped copies).
The synthetic images are 600-1600 px a side with grain noise, so JPEG decoding dominates;
``--max-side 640`` re-encodes them at COCO size (longest side 640, boxes scaled) into a temporary
folder to measure the COCO case.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import tempfile

import cv2

from lib.benchmarking import PeakMemory, markdown_table, measure
from lib.config import add_config_arguments, config_from_arguments
from lib.data import ChipLoader
from lib.dataset import load_roidb, read_image

MB = 1 << 20


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
    construction = measure(lambda: ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, num_workers=workers, seed=0), repeat=1, warmup=0)
    loader = construction.result

    def consume():
        consumed = 0
        while consumed < batches:
            try:
                batch = next(loader)
            except StopIteration:
                loader.reset()
                continue
            batch.data[0].wait_to_read()
            consumed += 1

    try:
        # sampling a worker's proportional memory walks its page tables: once a second, not to slow it down
        with PeakMemory(loader.pids, interval=1.0) as memory:
            for _ in range(warmup):
                next(loader)
            chips_before, stats = loader.stats.chips, loader.stats
            seconds = (stats.decode_seconds, stats.image_seconds, stats.target_seconds)
            timing = measure(consume, repeat=1, warmup=0)
        built, chips = stats.chips - chips_before, batches * loader.batch_size
        return {
            "chips/s": chips / timing.best,
            "decode": (stats.decode_seconds - seconds[0]) / built * 1e3,
            "image": (stats.image_seconds - seconds[1]) / built * 1e3,
            "targets": (stats.target_seconds - seconds[2]) / built * 1e3,
            "setup": construction.best,
            "main cpu": timing.cpu_seconds[0] / chips * 1e3,
            "workers MB": memory.pss / MB,
            "ring MB": loader._resources.ring.nbytes / MB,
            "main MB": memory.rss / MB,
        }
    finally:
        loader.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="config YAML naming the images (dataset.image_set) and the loader's "
                                          "settings, e.g. configs/faster/sniper_synthetic_tiny.yml")
    parser.add_argument("--images", type=int, default=40, help="images used (their flipped copies too)")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    parser.add_argument("--workers", default=f"0,1,2,{os.cpu_count()}", help="comma-separated process counts")
    parser.add_argument("--max-side", type=int, default=0, help="re-encode images to this longest side (0: keep)")
    args = parser.parse_args(argv)
    cfg = config_from_arguments(args)
    with tempfile.TemporaryDirectory() as tmp:
        roidb, _ = load_roidb(cfg, cfg.dataset.image_set)
        ids = {entry["id"] for entry in roidb[:args.images]}
        roidb = [entry for entry in roidb if entry["id"] in ids]
        if args.max_side:
            roidb = shrink_roidb(roidb, args.max_side, tmp)
        sizes = sorted(max(e["height"], e["width"]) for e in roidb)
        print(f"{len(roidb)} roidb entries (longest side {sizes[0]}-{sizes[-1]} px), batch {cfg.TRAIN.BATCH_IMAGES} "
              f"chips, {args.batches} timed batches, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} at start")
        counts = sorted({int(w) for w in args.workers.split(",")})
        rows, one = [], None
        for workers in counts:
            r = run(roidb, cfg, workers, args.batches, args.warmup)
            one = r["chips/s"] if workers == 1 else one
            speedup = f"{r['chips/s'] / one:.2f}x" if one and workers >= 1 else None
            rows.append(("0 (inline)" if workers == 0 else str(workers), r["chips/s"], r["chips/s"] / max(workers, 1),
                         speedup, r["decode"], r["image"], r["targets"], r["main cpu"], r["setup"], r["workers MB"],
                         r["ring MB"], r["main MB"]))
        print(markdown_table(["processes", "chips/s", "per proc", "speed-up", "decode ms", "resize ms", "targets ms",
                              "main ms", "setup s", "workers MB", "ring MB", "main MB"], rows,
                             [None, ".1f", ".1f", None, ".2f", ".2f", ".2f", ".2f", ".2f", ".0f", ".0f", ".0f"]))


if __name__ == "__main__":
    main()
