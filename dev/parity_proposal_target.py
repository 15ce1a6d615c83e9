"""The fork's MultiProposalTarget (on a CUDA GPU) against the project's, in three steps
(dev/parity/proposal_target.py):

    python dev/parity_proposal_target.py inputs --out inputs.npz [--chips 128] [--seed 0]
    python dev/parity_proposal_target.py fork --fork DIR --inputs inputs.npz --out fork.npz [--any-commit]  # GPU
    python dev/parity_proposal_target.py compare --inputs inputs.npz --fork-outputs fork.npz

DIR is a checkout (or bare clone) of the reference's MXNet fork, mahyarnajibi/SNIPER-mxnet, at its pinned commit
(another is refused unless --any-commit, then a warning; the step prints which commit it compiled).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # _bootstrap
import _bootstrap  # noqa: F401,E402  (repository root on sys.path, the project's virtualenv)

import numpy as np  # noqa: E402

from lib.config import load_config  # noqa: E402
from dev.parity.fork import TARGET_INPUTS, TARGET_OUTPUTS, ForkCheckout, run_fork_targets  # noqa: E402
from dev.parity.proposal_target import (STRIDE, compare_proposal_targets, project_targets,  # noqa: E402
                                        random_target_inputs)
from dev.parity.reference import check_pinned  # noqa: E402
from dev.parity.tables import format_table  # noqa: E402
from lib.logger import report_user_errors  # noqa: E402


def arrays(path, names, parser):
    try:
        with np.load(path) as data:
            return {name: data[name] for name in names}
    except (OSError, KeyError, ValueError) as err:
        parser.error(f"{path}: not a file of this tool's ({err})")


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    step = steps.add_parser("inputs", help="write random chips")
    step.add_argument("--out", required=True)
    step.add_argument("--chips", type=int, default=128)
    step.add_argument("--seed", type=int, default=0)
    step = steps.add_parser("fork", help="the fork's operator on them (a CUDA GPU and nvcc)")
    step.add_argument("--fork", required=True, help="checkout (or bare clone) of the reference's MXNet fork")
    step.add_argument("--inputs", required=True)
    step.add_argument("--out", required=True)
    step.add_argument("--nvcc", default="nvcc")
    step.add_argument("--any-commit", action="store_true", help="another commit than the pinned one too (warning)")
    step = steps.add_parser("compare", help="the project's operator on them, against the fork's outputs")
    step.add_argument("--inputs", required=True)
    step.add_argument("--fork-outputs", required=True)
    args = parser.parse_args(argv)
    if args.step == "inputs":
        np.savez(args.out, **random_target_inputs(np.random.default_rng(args.seed), args.chips))
    elif args.step == "fork":
        try:
            fork = ForkCheckout(args.fork)
            warnings = check_pinned([fork], args.any_commit)
        except FileNotFoundError as err:
            parser.error(str(err))
        print("\n".join(warnings + [f"fork read: {fork.provenance()[0]}"]), file=sys.stderr)
        network = load_config(None).network
        with tempfile.TemporaryDirectory(prefix="sniper_parity_") as workdir:
            run_fork_targets(fork, args.inputs, args.out, workdir, STRIDE, network.ANCHOR_SCALES,
                             network.ANCHOR_RATIOS, args.nvcc)
    else:
        inputs = arrays(args.inputs, TARGET_INPUTS, parser)
        theirs = arrays(args.fork_outputs, TARGET_OUTPUTS, parser)
        print(format_table(f"MultiProposalTarget ({len(inputs['cls_prob'])} random chips, "
                           f"`TRAIN.PROPOSAL_TARGET_RULES: reference`)", ["quantity", "agreement"],
                           compare_proposal_targets(inputs, theirs, project_targets(inputs))))


if __name__ == "__main__":
    main()
