"""Write the synthetic COCO-format shapes dataset (lib/dataset/synthetic.py) to a folder.

    python tools/make_synthetic_coco.py --out data/synthetic --train 200 --val 50 --seed 0

Does nothing when the folder already holds the dataset for these settings.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import time

from lib.dataset.synthetic import DEFAULT_SEED, DEFAULT_TRAIN, DEFAULT_VAL, ensure_synthetic_dataset
from lib.logger import report_user_errors, setup_logging


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="dataset folder (COCO layout)")
    parser.add_argument("--train", type=int, default=DEFAULT_TRAIN, help="training images")
    parser.add_argument("--val", type=int, default=DEFAULT_VAL, help="validation images")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed (same seed, same bytes)")
    args = parser.parse_args()
    setup_logging()
    start = time.perf_counter()
    ensure_synthetic_dataset(args.out, train=args.train, val=args.val, seed=args.seed)
    logging.getLogger("make_synthetic_coco").info(
        "%s ready (train %d, val %d, seed %d) in %.1f s", args.out, args.train, args.val, args.seed,
        time.perf_counter() - start)


if __name__ == "__main__":
    main()
