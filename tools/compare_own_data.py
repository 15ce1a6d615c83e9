"""Own data (issue 25): the config as it is against the config fit_scales.py writes, and images without objects
dropped against kept for negative chips, trained and tested in sequence; prints a Markdown table.

    python tools/compare_own_data.py --cfg FILE --data NAME[=FOLDER] [NAME=FOLDER ...] [--epochs N]
        [--empty-images NAME ...] [--configs embedded,fitted] [--rpn-epochs N] [--out DIR] [--set KEY VALUE ...]

``--data NAME`` is the config's own dataset, ``NAME=FOLDER`` a COCO-layout folder with train and val sets
(tools/make_variant_set.py). The sets named by ``--empty-images`` (those with images without objects) run the
negative chip pipeline twice, with TRAIN.EMPTY_IMAGES drop and negative, instead of plain training. ``--epochs``
(default: the config's end_epoch) stretches the config's lr steps to the same fractions. ``--set`` applies to
every run. Hours for real sets on CPUs (BENCHMARKS.md): every run and its result are kept under ``--out``, so the
same command continues a stopped comparison. Writes ``{out}/comparison.md`` and ``.json``; details in
lib/pipeline/own_data.py.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import os
import sys

from lib.atomic import write_bytes, write_json
from lib.config import ConfigError, add_config_arguments
from lib.config.core import parse_cli_overrides
from lib.logger import logged_outcome, report_user_errors, setup_logging
from lib.pipeline.neg_chips import DEFAULT_RPN_EPOCHS
from lib.pipeline.own_data import CONFIGS, DataSet, OwnDataComparison, format_table
from lib.scales_fit import FitError

logger = logging.getLogger("compare_own_data")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="the config to compare, e.g. configs/faster/sniper_synthetic_tiny.yml")
    parser.add_argument("--data", nargs="+", required=True, metavar="NAME[=FOLDER]",
                        help="the sets: NAME (the config's dataset) or NAME=FOLDER (a COCO-layout train/val folder)")
    parser.add_argument("--empty-images", nargs="+", default=[], metavar="NAME",
                        help="sets with images without objects: TRAIN.EMPTY_IMAGES drop vs negative (negative chips)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma separated subset of {CONFIGS}")
    parser.add_argument("--epochs", type=int, default=0, help="training epochs of every run (0: the config's)")
    parser.add_argument("--rpn-epochs", type=int, default=DEFAULT_RPN_EPOCHS,
                        help=f"RPN epochs of the negative chip runs (default {DEFAULT_RPN_EPOCHS})")
    parser.add_argument("--out", default="output/compare_own_data", help="output folder")
    args = parser.parse_args(argv)
    if args.epochs < 0:
        parser.error(f"--epochs must be >= 0, got {args.epochs}")
    return args


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    args = parse_args(argv)
    try:
        comparison = OwnDataComparison(args.cfg, parse_cli_overrides(args.set), [DataSet.parse(t) for t in args.data],
                                       args.out, args.epochs, [c for c in args.configs.split(",") if c],
                                       args.empty_images, args.rpn_epochs)
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
    comparison.check_start()  # a doomed comparison fails in seconds, nothing written (as main_train.py)
    setup_logging(args.out, name="compare_own_data")

    def save(results):
        table = format_table(results)
        write_bytes((table + "\n").encode(), os.path.join(args.out, "comparison.md"))
        write_json(results, os.path.join(args.out, "comparison.json"))
        return table

    with logged_outcome("own-data comparison"):
        logger.info("comparing %s on %s (%d epochs, overrides %s): %d runs", args.cfg, args.data, comparison.epochs,
                    args.set, len(comparison.rows))
        try:
            results = comparison.run(on_row=lambda so_far: logger.info("after %d of %d runs:\n%s", len(so_far),
                                                                       len(comparison.rows), save(so_far)))
        except FitError as err:
            sys.exit(f"compare_own_data: {err}")
    print(save(results))


if __name__ == "__main__":
    main()
