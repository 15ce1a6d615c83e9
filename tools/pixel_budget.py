"""Pixels SNIPER processes per epoch relative to single-scale 800 x 1333 training (spec section 9: the
paper's "about 30% more pixels" on COCO).

    .venv/bin/python tools/pixel_budget.py --cfg FILE [--set KEY VALUE ...] [--limit N] [--seed S]

One epoch as the training iterator samples it: the stride drawn once, every image's chips mined,
all positive chips plus at most TRAIN.MAX_NEG_CHIPS negative ones (when negative chips are on and
the roidb has proposals). Every chip costs CHIP_SIZE x CHIP_SIZE pixels, the padded network input;
the chip content (smaller at the coarsest scale) is shown too. The baseline resizes every image of
the same roidb to shorter side 800, longer side at most 1333.
"""
import argparse
import os
import sys

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chip_generator.mining import draw_epoch_stride, mine_image_chips, sample_epoch_chips  # noqa: E402
from lib.config import load_config, parse_cli_overrides  # noqa: E402
from lib.dataset import load_roidb  # noqa: E402
from lib.logger import setup_logging  # noqa: E402
from lib.scales import parse_scales  # noqa: E402

BASELINE_SCALE = [800, 1333]  # (shorter side, longer side cap) of the single-scale baseline


def epoch_pixel_budget(roidb, cfg, rng):
    """Dict of epoch totals: images, chips per scale (positive, negative), padded and content chip
    pixels, and the baseline's pixels."""
    baseline = parse_scales([BASELINE_SCALE], "baseline")[0]
    num_scales = len(cfg.TRAIN.SCALES)
    max_neg = cfg.TRAIN.MAX_NEG_CHIPS if cfg.TRAIN.USE_NEG_CHIPS else 0
    stride = draw_epoch_stride(cfg, rng)
    totals = {"images": len(roidb), "stride": stride, "positive": np.zeros(num_scales, np.int64),
              "negative": np.zeros(num_scales, np.int64), "chip_pixels": 0, "content_pixels": 0,
              "baseline_pixels": 0}
    for entry in tqdm(roidb, desc="mining chips", leave=False):
        chips = mine_image_chips(entry, cfg, stride, rng)
        sampled = sample_epoch_chips(chips, rng, max_neg)
        for level, chip, negative in sampled:
            totals["negative" if negative else "positive"][level] += 1
            totals["content_pixels"] += int((chip[2] - chip[0] + 1) * (chip[3] - chip[1] + 1))
        totals["chip_pixels"] += len(sampled) * cfg.TRAIN.CHIP_SIZE ** 2
        scale = baseline.image_scale(entry["height"], entry["width"])
        totals["baseline_pixels"] += int(round(entry["height"] * scale)) * int(round(entry["width"] * scale))
    return totals


def print_report(totals, chip_size):
    images = max(totals["images"], 1)
    print(f"images {totals['images']}, chip stride {totals['stride']}")
    print(f"{'scale':<8}{'positive/img':>14}{'negative/img':>14}")
    for level, (pos, neg) in enumerate(zip(totals["positive"], totals["negative"])):
        print(f"{level:<8}{pos / images:>14.2f}{neg / images:>14.2f}")
    chips = int(totals["positive"].sum() + totals["negative"].sum())
    baseline = max(totals["baseline_pixels"], 1)
    print(f"{'all':<8}{totals['positive'].sum() / images:>14.2f}{totals['negative'].sum() / images:>14.2f}")
    print()
    print(f"{'pixels per image':<40}{'Mpx':>8}{'vs 800x1333':>14}")
    rows = ((f"SNIPER chips ({chips} x {chip_size}x{chip_size}, padded)", totals["chip_pixels"]),
            ("SNIPER chip content (unpadded)", totals["content_pixels"]),
            ("single scale 800 x 1333", totals["baseline_pixels"]))
    for name, pixels in rows:
        print(f"{name:<40}{pixels / images / 1e6:>8.3f}{pixels / baseline:>13.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", required=True, help="config YAML")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY VALUE", help="config overrides")
    parser.add_argument("--limit", type=int, default=0, help="only the first N roidb entries (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup_logging()
    cfg = load_config(args.cfg, parse_cli_overrides(args.set))
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    if args.limit:
        roidb = roidb[:args.limit]
    print_report(epoch_pixel_budget(roidb, cfg, np.random.default_rng(args.seed)), cfg.TRAIN.CHIP_SIZE)


if __name__ == "__main__":
    main()
