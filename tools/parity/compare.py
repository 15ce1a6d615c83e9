"""Run the parity harness against a checkout of the reference and print its tables (lib/parity).

    python tools/parity/compare.py --reference DIR [--cases 200] [--images 100] [--seed 0]

DIR is a checkout of mahyarnajibi/SNIPER (or a bare clone: its HEAD is read); g++ compiles its C++.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for _bootstrap
import _bootstrap  # noqa: F401,E402  (repository root on sys.path, the project's virtualenv)

from lib.parity.compare import run  # noqa: E402
from lib.parity.reference import ReferenceCheckout  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="checkout (or bare clone) of the reference")
    parser.add_argument("--cases", type=int, default=200, help="random images for the chip generator")
    parser.add_argument("--images", type=int, default=100, help="random images for the COCO and results tables")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        reference = ReferenceCheckout(args.reference)
    except FileNotFoundError as err:
        parser.error(str(err))
    print(run(reference, args.cases, args.images, args.seed))


if __name__ == "__main__":
    main()
