"""Own-data variants of a COCO-format set for measuring (lib/dataset/variants.py): dense small objects
(mosaics of ``--tile`` x ``--tile`` shrunk source images) and/or images without objects (inpainted copies).

    python tools/make_variant_set.py --source data/synthetic --out data/synthetic_small --tile 3 \\
        --train 100 --val 30 [--empty 50]
    python tools/make_variant_set.py --out data/synthetic_small --empty 50     # add empty images only
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging

from lib.dataset.variants import add_empty_images, small_object_set
from lib.logger import report_user_errors, setup_logging


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", help="a COCO-layout set to make mosaics of (omit: only add empty images)")
    parser.add_argument("--out", required=True, help="the variant's folder (COCO layout)")
    parser.add_argument("--tile", type=int, default=3, help="mosaic side in source images (objects ~1/tile size)")
    parser.add_argument("--train", type=int, default=100, help="training mosaics")
    parser.add_argument("--val", type=int, default=30, help="validation mosaics")
    parser.add_argument("--empty", type=int, default=0, help="object-free images appended to the training set")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    setup_logging()
    log = logging.getLogger("make_variant_set")
    if args.source:
        for image_set, count in (("train", args.train), ("val", args.val)):
            log.info("wrote %s", small_object_set(args.source, args.out, image_set, count, args.tile, args.seed))
    if args.empty:
        log.info("added %d empty training images", len(add_empty_images(args.out, "train", args.empty, args.seed)))


if __name__ == "__main__":
    main()
