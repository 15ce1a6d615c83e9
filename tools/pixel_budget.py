"""Pixels SNIPER processes per epoch relative to single-scale 800 x 1333 training (spec section 9: the
paper's "about 30% more pixels" on COCO).

    python tools/pixel_budget.py --cfg FILE [--set KEY VALUE ...] [--limit N] [--seed S]

One epoch as the training iterator samples it (lib/pixel_budget.py): the stride drawn once, every
image's chips mined, all positive chips plus at most TRAIN.MAX_NEG_CHIPS negative ones. Every chip
costs CHIP_SIZE x CHIP_SIZE pixels, the padded network input; the chip content (smaller at the
coarsest scale) is shown too. The baseline resizes every image of the same roidb to shorter side 800,
longer side at most 1333.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import numpy as np

from lib.config import add_config_arguments, config_from_arguments
from lib.dataset import load_roidb
from lib.logger import report_user_errors, setup_logging
from lib.pixel_budget import epoch_pixel_budget


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


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--limit", type=int, default=0, help="only the first N roidb entries (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = config_from_arguments(args)
    setup_logging()
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    if args.limit:
        roidb = roidb[:args.limit]
    print_report(epoch_pixel_budget(roidb, cfg, np.random.default_rng(args.seed)), cfg.TRAIN.CHIP_SIZE)


if __name__ == "__main__":
    main()
