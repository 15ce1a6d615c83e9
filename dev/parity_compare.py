"""Run the parity harness against a checkout of the reference and print its tables (dev/parity).

    python dev/parity_compare.py --reference DIR [--fork DIR] [--cases 200] [--images 100] [--scenes 20]
                                   [--test-images 16] [--batches 100] [--mask-chips 2] [--mask-chip-size 192]
                                   [--seed 0] [--any-commit]

--reference is a checkout of mahyarnajibi/SNIPER (or a bare clone: its HEAD is read); --fork one of its MXNet
fork mahyarnajibi/SNIPER-mxnet (default: the reference's SNIPER-mxnet submodule when it is checked out; without
one the fork's tables are left out). g++ compiles their C++. Checkouts at other commits than the pinned ones
(dev/parity/reference.py: those docs/reference_differences.md was measured on), or with modified files, are
refused unless --any-commit (then a warning); the first table says which commits were read.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # _bootstrap
import _bootstrap  # noqa: F401,E402  (repository root on sys.path, the project's virtualenv)

from lib.errors import ConfigError  # noqa: E402
from dev.parity.harness import run  # noqa: E402
from dev.parity.fork import PROPOSAL_SOURCE, ForkCheckout  # noqa: E402
from dev.parity.mask_network import MIN_CHIP_SIZE, project_mask_config  # noqa: E402
from dev.parity.reference import MASK_SYMBOL, ReferenceCheckout, check_pinned  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="checkout (or bare clone) of the reference")
    parser.add_argument("--fork", help="checkout (or bare clone) of the reference's MXNet fork")
    parser.add_argument("--cases", type=int, default=200, help="random images for the chip generator")
    parser.add_argument("--images", type=int, default=100, help="random images for the COCO and results tables")
    parser.add_argument("--scenes", type=int, default=20, help="random scenes (and mirror images) for the chip targets")
    parser.add_argument("--test-images", type=int, default=16, help="random images for the test batches")
    parser.add_argument("--batches", type=int, default=100, help="random batches for the fork's proposal layer")
    parser.add_argument("--mask-chips", type=int, default=2,
                        help="random chips for the mask training graphs' outputs and gradients (0: no mask tables)")
    parser.add_argument("--mask-chip-size", type=int, default=192,
                        help=f"their size in px (at least {MIN_CHIP_SIZE}, a multiple of the features' stride)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--any-commit", action="store_true",
                        help="compare checkouts at other than the pinned commits too (with a warning)")
    args = parser.parse_args(argv)
    if args.mask_chips < 0 or (args.mask_chips and args.mask_chip_size < MIN_CHIP_SIZE):
        parser.error(f"--mask-chips {args.mask_chips} --mask-chip-size {args.mask_chip_size}: 0 chips (no mask "
                     f"tables) or more, of at least {MIN_CHIP_SIZE} px")
    fork = args.fork
    if fork is None and os.path.isfile(os.path.join(args.reference, "SNIPER-mxnet", PROPOSAL_SOURCE)):
        fork = os.path.join(args.reference, "SNIPER-mxnet")
    try:
        reference = ReferenceCheckout(args.reference)
        fork = fork and ForkCheckout(fork)
        if args.mask_chips:
            project_mask_config(args.mask_chips, args.mask_chip_size, False)  # the config's own checks, now
            reference.read(MASK_SYMBOL)
        warnings = check_pinned([reference] + ([fork] if fork else []), args.any_commit)
    except FileNotFoundError as err:
        parser.error(str(err))
    except ConfigError as err:
        parser.error(f"--mask-chips {args.mask_chips} --mask-chip-size {args.mask_chip_size}: {err}")
    for warning in warnings:
        print(warning, file=sys.stderr)
    print(run(reference, args.cases, args.images, args.seed, fork=fork, batches=args.batches, scenes=args.scenes,
              test_images=args.test_images, mask_chips=args.mask_chips, mask_chip_size=args.mask_chip_size))


if __name__ == "__main__":
    main()
