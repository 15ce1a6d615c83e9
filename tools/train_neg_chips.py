"""Negative chip mining end to end (spec section 3): RPN -> proposals -> SNIPER with negative chips.

    python tools/train_neg_chips.py --cfg FILE [--set KEY VALUE ...] [--rpn-epochs N]
        [--rpn-set KEY VALUE ...] [--eval]

Stages (``{out}`` is ``{output_path}/{config name}``): 1. rpn, the RPN alone for ``--rpn-epochs``
epochs; 2. proposals, that RPN over the training images; 3. sniper, SNIPER with negative chips
from those proposals; 4. eval (``--eval``), the tester on the SNIPER checkpoint. ``--set`` applies to
every stage, ``--rpn-set`` to stages 1 and 2 only. A stage whose output exists is skipped and an
unfinished training stage resumes, so the same command continues a stopped run. Details in
lib/pipeline/neg_chips.py; logs in ``{out}/neg_chips_{time}.log``.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import sys

from lib.config import ConfigError, add_config_arguments
from lib.config.core import parse_cli_overrides
from lib.logger import logged_outcome, report_user_errors, setup_logging
from lib.pipeline.neg_chips import DEFAULT_RPN_EPOCHS, NegChipPipeline

logger = logging.getLogger("train_neg_chips")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--rpn-set", action="extend", nargs="+", default=[], metavar="KEY VALUE",
                        help="overrides for the RPN training and proposal extraction only")
    parser.add_argument("--rpn-epochs", type=int, default=DEFAULT_RPN_EPOCHS,
                        help=f"epochs of RPN-only training (default {DEFAULT_RPN_EPOCHS}, as in the paper)")
    parser.add_argument("--eval", action="store_true", help="evaluate the SNIPER checkpoint on the test image set")
    return parser.parse_args(argv)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    args = parse_args(argv)
    try:
        pipeline = NegChipPipeline(args.cfg, parse_cli_overrides(args.set), args.rpn_epochs,
                                   parse_cli_overrides(args.rpn_set))
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
    pipeline.check_start()  # what can fail before any work, nothing written yet (as main_train.py)
    setup_logging(pipeline.output_dir, name="neg_chips")
    with logged_outcome("negative chip pipeline"):
        logger.info("negative chip pipeline for %s with overrides %s (RPN stages also %s)", args.cfg, args.set,
                    args.rpn_set)
        outputs = pipeline.run(evaluate=args.eval)
        logger.info("negative chip pipeline done: %s", {k: v for k, v in outputs.items() if k != "summary"})


if __name__ == "__main__":
    main()
