"""Times the training iterator (ChipLoader) end to end with 0 (in-process), 1, 2 and N worker processes,
and with each decoded-image cache size (TRAIN.IMAGE_CACHE_MB, 0: today's decode for every chip).

Prints chips/s as the consumer sees them (batches handed out as NDArrays) and per worker process, the
speed-up over the same processes without the cache, the image decodes per chip, the per-chip time of
each stage inside the workers (decode, crop/resize/mean, anchor targets + gt boxes; decode time is
averaged over all chips, cache hits included), the main process's CPU time per chip (scheduling,
handing out batches; in-process it includes the chip work), the set-up time (first epoch's mining,
forking), and the peak memory of the pool: the workers' proportional set size (their share of pages
they touch, the shared batch ring and the cache included), the ring's size, and the main process's
resident memory.

    python tools/benchmark_iterator.py --cfg configs/faster/sniper_synthetic_tiny.yml [--set KEY VALUE ...]
        [--images 40] [--batches 12] [--workers 0,1,2] [--cache-mb 0,256] [--max-side 640]
        [--synthetic 1200x1200,640x480]

The images are the first ``--images`` of the config's ``dataset.image_set`` (and their flipped copies).
The synthetic images are 600-1600 px a side with grain noise, so JPEG decoding dominates;
``--max-side 640`` re-encodes them at COCO size (longest side 640, boxes scaled) into a temporary
folder to measure the COCO case. ``--synthetic WxH,...`` instead generates ``--images`` images of
each size (smooth texture, grain, 24 boxes of 12 px to half the image; no download) into a temporary
folder. ``--batches 0`` times one whole epoch of a fresh loader, so the cache's first decode of each
image is counted: an image is then decoded about once per epoch (cache sizes are per worker).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import tempfile

import cv2
import numpy as np

from lib.benchmarking import PeakMemory, markdown_table, measure
from lib.config import add_config_arguments, config_from_arguments, with_overrides
from lib.data import ChipLoader
from lib.dataset import load_roidb, read_image
from lib.dataset.roidb import flip_entry
from lib.logger import report_user_errors

MB = 1 << 20


def shrink_roidb(roidb, max_side, folder):
    """Copies of the entries with images re-encoded so the longer side is ``max_side`` (boxes and polygons
    scaled)."""
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
        scaled = {key: (entry[key] * (width / entry["width"])).astype("float32")
                  for key in ("boxes", "crowd_boxes", "mask_coords") if key in entry}  # polygons: TRAIN.WITH_MASK
        entries.append(dict(entry, image=written[path], height=height, width=width, **scaled))
    return entries


def synthetic_roidb(folder, count, width, height, seed=0):
    """``count`` generated ``width`` x ``height`` JPEGs in ``folder`` and their roidb, flipped copies appended."""
    rng = np.random.default_rng([seed, width, height])
    entries = []
    for index in range(count):
        texture = rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
        image = cv2.resize(texture, (width, height), interpolation=cv2.INTER_CUBIC)
        sizes = np.exp(rng.uniform(np.log(12), np.log(min(width, height) / 2), 24))
        boxes = []
        for size in sizes:
            w, h = size * rng.uniform(0.7, 1.4, 2)
            x1, y1 = int(rng.uniform(0, width - w)), int(rng.uniform(0, height - h))
            x2, y2 = int(x1 + w), int(y1 + h)
            cv2.rectangle(image, (x1, y1), (x2, y2), [int(c) for c in rng.integers(0, 256, 3)], -1)
            boxes.append((x1, y1, x2, y2))
        grain = rng.integers(-8, 9, (height, width, 1), dtype=np.int16)
        image = np.clip(image + grain, 0, 255).astype(np.uint8)
        path = os.path.join(folder, f"{width}x{height}_{index:04d}.jpg")
        cv2.imwrite(path, image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        entries.append({"image": path, "id": index + 1, "height": height, "width": width, "flipped": False,
                        "boxes": np.array(boxes, np.float32), "crowd_boxes": np.zeros((0, 4), np.float32),
                        "gt_classes": rng.integers(1, 6, len(boxes)).astype(np.int32)})
    return entries + [flip_entry(entry) for entry in entries]


def sizes_argument(text):
    """``WxH,...`` -> [(width, height)] (argparse type: a bad value is a one-line usage error)."""
    try:
        sizes = [tuple(int(v) for v in size.lower().split("x")) for size in text.split(",")]
    except ValueError:
        sizes = None
    if not sizes or any(len(size) != 2 or min(size) < 64 for size in sizes):
        raise argparse.ArgumentTypeError(f"expected comma-separated WIDTHxHEIGHT of at least 64 px, got {text!r}")
    return sizes


def counts_argument(text):
    """``a,b,...`` -> sorted distinct integers >= 0 (argparse type)."""
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        values = [-1]
    if values[0] < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def run(roidb, cfg, workers, batches, warmup):
    """One configuration: returns a dict of figures. ``batches`` 0: one whole epoch, no warm-up."""
    construction = measure(lambda: ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, num_workers=workers, seed=0),
                           repeat=1, warmup=0)
    loader = construction.result
    whole_epoch = not batches
    if whole_epoch:
        batches, warmup = loader.num_batches, 0

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
            stats = loader.stats
            # a whole epoch counts from construction: the workers' prefetch may have built its first chips
            # (and decoded their images) already, and those belong to the epoch
            before = (0, 0, 0.0, 0.0, 0.0) if whole_epoch else (
                stats.chips, stats.decoded_images, stats.decode_seconds, stats.image_seconds, stats.target_seconds)
            timing = measure(consume, repeat=1, warmup=0)
        built, decoded, decode, image, targets = (now - then for now, then in zip(
            (stats.chips, stats.decoded_images, stats.decode_seconds, stats.image_seconds, stats.target_seconds),
            before))
        chips = batches * loader.batch_size
        return {
            "chips/s": chips / timing.best,
            "chips/image": loader.num_chips / len(roidb),
            "decodes/chip": decoded / built,
            "decode": decode / built * 1e3,
            "image": image / built * 1e3,
            "targets": targets / built * 1e3,
            "setup": construction.best,
            "main cpu": timing.cpu_seconds[0] / chips * 1e3,
            "workers MB": memory.pss / MB,
            "ring MB": loader.ring_bytes / MB,
            "main MB": memory.rss / MB,
        }
    finally:
        loader.close()


def image_sets(cfg, args, folder):
    """``[(name, roidb)]`` to measure: the generated sizes of ``--synthetic``, else the config's images."""
    if args.synthetic:
        sets = []
        for width, height in args.synthetic:
            sets.append((f"generated {width}x{height}", synthetic_roidb(folder, args.images, width, height)))
        return sets
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set)
    ids = {entry["id"] for entry in roidb[:args.images]}
    roidb = [entry for entry in roidb if entry["id"] in ids]
    if args.max_side:
        roidb = shrink_roidb(roidb, args.max_side, folder)
    sizes = sorted(max(e["height"], e["width"]) for e in roidb)
    return [(f"{cfg.dataset.image_set}, longest side {sizes[0]}-{sizes[-1]} px", roidb)]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="config YAML naming the images (dataset.image_set) and the loader's "
                                          "settings, e.g. configs/faster/sniper_synthetic_tiny.yml")
    parser.add_argument("--images", type=int, default=40, help="images used (their flipped copies too)")
    parser.add_argument("--batches", type=int, default=12,
                        help="timed batches per configuration (0: one whole epoch from a cold start)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    parser.add_argument("--workers", type=counts_argument, default=f"0,1,2,{os.cpu_count()}",
                        help="comma-separated process counts")
    parser.add_argument("--cache-mb", type=counts_argument,
                        help="comma-separated TRAIN.IMAGE_CACHE_MB values (default: 0 and the config's)")
    parser.add_argument("--max-side", type=int, default=0, help="re-encode images to this longest side (0: keep)")
    parser.add_argument("--synthetic", type=sizes_argument, help="comma-separated WIDTHxHEIGHT: generate the images")
    args = parser.parse_args(argv)
    cfg = config_from_arguments(args)
    caches = args.cache_mb or sorted({0, cfg.TRAIN.IMAGE_CACHE_MB})
    with tempfile.TemporaryDirectory() as tmp:
        sets = image_sets(cfg, args, tmp)
        print(f"batch {cfg.TRAIN.BATCH_IMAGES} chips, {args.batches or 'one epoch of'} timed batches, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
        rows = []
        for name, roidb in sets:
            uncached = {}
            for workers in args.workers:
                for cache in caches:
                    r = run(roidb, with_overrides(cfg, {"TRAIN.IMAGE_CACHE_MB": cache}), workers, args.batches,
                            args.warmup)
                    uncached.setdefault(workers, r["chips/s"] if cache == 0 else None)
                    speedup = f"{r['chips/s'] / uncached[workers]:.2f}x" if cache and uncached[workers] else None
                    rows.append((name, f"{len(roidb)} ({r['chips/image']:.1f})",
                                 "0 (inline)" if workers == 0 else str(workers), cache, r["chips/s"],
                                 r["chips/s"] / max(workers, 1), speedup, r["decodes/chip"], r["decode"], r["image"],
                                 r["targets"], r["main cpu"], r["setup"], r["workers MB"], r["ring MB"],
                                 r["main MB"]))
                    print(f"{name}, {workers} processes, cache {cache} MB: {r['chips/s']:.1f} chips/s", flush=True)
        print(markdown_table(["images", "entries (chips each)", "processes", "cache MB", "chips/s", "per proc",
                              "vs cache 0", "decodes/chip", "decode ms", "resize ms", "targets ms", "main ms",
                              "setup s", "workers MB", "ring MB", "main MB"], rows,
                             [None, None, None, "d", ".1f", ".1f", None, ".2f", ".2f", ".2f", ".2f", ".2f", ".2f",
                              ".0f", ".0f", ".0f"]))


if __name__ == "__main__":
    main()
