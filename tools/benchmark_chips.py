"""Speed of the compiled greedy chip cover against the pure-Python reference.

Two tables: COCO-like scenes (1-50 boxes, images resized to at most 1400 x 2000, the finest training
scale) in images/s and chips/s, and the cost per image as the number of boxes grows. Both generators
get the same seeds, so their outputs must be identical; the script checks it.

    python tools/benchmark_chips.py [--scenes 300] [--reference-scenes 30] [--full]
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import platform

import numpy as np

import chip_generator
from chip_generator.reference import reference_generate
from lib.benchmarking import markdown_table, measure

CHIP_SIZE = 512


def coco_like_scene(rng, num_boxes, width=None, height=None, short=1400, long=2000):
    """(boxes, width, height): a COCO-sized image (random unless given) resized to `short` x `long` at
    most, with boxes whose sqrt(area) is log-uniform in 8..400 original pixels, aspect ratio 1/3..3."""
    width = width or int(rng.integers(320, 641))
    height = height or int(rng.integers(240, 641))
    scale = min(short / min(width, height), long / max(width, height))
    sizes = np.exp(rng.uniform(np.log(8), np.log(400), num_boxes))
    ratios = np.exp(rng.uniform(np.log(1 / 3), np.log(3), num_boxes))
    w, h = np.minimum(sizes * np.sqrt(ratios), width), np.minimum(sizes / np.sqrt(ratios), height)
    x1, y1 = rng.uniform(0, width - w), rng.uniform(0, height - h)
    boxes = np.stack([x1, y1, x1 + w - 1, y1 + h - 1], axis=1) * scale
    scaled_w, scaled_h = int(round(width * scale)), int(round(height * scale))
    return np.clip(boxes, 0, [scaled_w - 1, scaled_h - 1] * 2).astype(np.float32), scaled_w, scaled_h


def time_generator(generate, scenes, stride, repeats=1):
    """(seconds per image, chips per image, outputs) of `generate` over `scenes`, best of `repeats`.
    Scene i gets a generator seeded with i, made beforehand (untimed) as the chip miner does."""
    timing = measure(lambda rngs: [generate(boxes, w, h, CHIP_SIZE, stride, rng=rng)
                                   for rng, (boxes, w, h) in zip(rngs, scenes)],
                     repeat=repeats, warmup=0, setup=lambda: [np.random.default_rng(i) for i in range(len(scenes))])
    outputs = timing.result
    return timing.best / len(scenes), sum(len(c) for c in outputs) / len(scenes), outputs


def check_same(fast, slow):
    for a, b in zip(fast, slow):
        if not np.array_equal(a, b):
            raise SystemExit("compiled and reference chips differ: the benchmark is not comparing like with like")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenes", type=int, default=300, help="COCO-like scenes for the compiled generator")
    parser.add_argument("--reference-scenes", type=int, default=30, help="of those, timed with the reference")
    parser.add_argument("--stride", type=int, default=32)
    parser.add_argument("--full", action="store_true", help="also time the reference with 1000 boxes (minutes)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; chip {CHIP_SIZE}, stride {args.stride}\n")

    scenes = [coco_like_scene(rng, int(rng.integers(1, 51))) for _ in range(args.scenes)]
    subset = scenes[:args.reference_scenes]
    fast_s, fast_chips, _ = time_generator(chip_generator.generate, scenes, args.stride, repeats=3)
    sub_s, _, fast_out = time_generator(chip_generator.generate, subset, args.stride, repeats=3)
    ref_s, ref_chips, ref_out = time_generator(reference_generate, subset, args.stride)
    check_same(fast_out, ref_out)
    print(f"COCO-like scenes (1-50 boxes, up to 1400 x 2000): compiled on {len(scenes)}, reference on {len(subset)}")
    rows = [(name, seconds * 1e3, 1 / seconds, chips, chips / seconds)
            for name, seconds, chips in (("compiled", fast_s, fast_chips), ("reference", ref_s, ref_chips))]
    print(markdown_table(["generator", "ms/image", "images/s", "chips/image", "chips/s"], rows,
                         [None, ".3f", ".0f", ".2f", ".0f"]))
    print(f"speed-up on the same {len(subset)} scenes: {ref_s / sub_s:.0f}x\n")

    print("Growth with the number of boxes (a 640 x 448 image resized to 2000 x 1400)")
    rows = []
    for num_boxes in (10, 100, 1000, 5000):
        scene = [coco_like_scene(np.random.default_rng(num_boxes), num_boxes, width=640, height=448)]
        repeats = 20 if num_boxes <= 100 else 5
        fast_s, chips, fast_out = time_generator(chip_generator.generate, scene, args.stride, repeats=repeats)
        if num_boxes <= 100 or (num_boxes <= 1000 and args.full):
            ref_repeats = 3 if num_boxes <= 10 else 1
            ref_s, _, ref_out = time_generator(reference_generate, scene, args.stride, repeats=ref_repeats)
            check_same(fast_out, ref_out)
            ref_ms, ratio = ref_s * 1e3, f"{ref_s / fast_s:.0f}x"
        else:
            ref_ms, ratio = None, None
        rows.append((num_boxes, fast_s * 1e3, chips, ref_ms, ratio))
    print(markdown_table(["boxes", "compiled ms", "chips", "reference ms", "speed-up"], rows,
                         [None, ".3f", ".0f", ".1f", None]))


if __name__ == "__main__":
    main()
