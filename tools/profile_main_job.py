"""Where a training run or a test spends its time: the main job's profile (BENCHMARKS.md, issue 41).

    python tools/profile_main_job.py train --cfg FILE [--set KEY VALUE ...] [--out DIR]
    python tools/profile_main_job.py test --cfg FILE --model FILE.params [--set ...] [--out DIR]

Runs ``lib.train.trainer.train`` or ``lib.inference.tester.test`` in this process under cProfile and MXNet's
aggregate operator profiler, then prints the CPU time of this process and of its waited-for children (the
loader's and the test pipeline's worker processes), the operators' time by group, and the project's
functions by cumulative time. Operator times are the engine's wall times: on a loaded machine read them as
shares. ``--out`` keeps the cProfile file (``{part}.pstats``) and MXNet's whole table (``{part}_operators.txt``).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import cProfile
import io
import os
import pstats
import time

import mxnet as mx

from lib.config import add_config_arguments, config_from_arguments
from lib.logger import report_user_errors, setup_logging
from lib.ops.proposal_layer import OP_TYPE as TEST_PROPOSAL_OP

# operator name -> group, by the name without MXNet's "_backward_" prefix; the rest is "other"
OPERATOR_GROUPS = {
    "Convolution": "convolution", "DeformableIm2Col": "deformable convolution (im2col)",
    "CompiledDeformablePSROIPooling": "PS-ROI pooling", "DeformablePSROIPooling": "PS-ROI pooling",
    "BatchNorm": "BatchNorm, ReLU, pooling, adds, concat", "Activation": "BatchNorm, ReLU, pooling, adds, concat",
    "Pooling": "BatchNorm, ReLU, pooling, adds, concat", "elemwise_add": "BatchNorm, ReLU, pooling, adds, concat",
    "add_n": "BatchNorm, ReLU, pooling, adds, concat", "Concat": "BatchNorm, ReLU, pooling, adds, concat",
    "FullyConnected": "fully connected", "MultiProposalTarget": "proposal target",
    "SoftmaxOutput": "losses, softmax", "SoftmaxActivation": "losses, softmax", "smooth_l1": "losses, softmax",
    "multi_sgd_mom_update": "optimizer, gradient sum", "KVStoreReduce": "optimizer, gradient sum",
    "CopyCPU2CPU": "copies, waits", "WaitForVar": "copies, waits",
}
SKIPPED_SECTIONS = ("MXNET_C_API", "Device Storage")


def operator_times(table):
    """``{operator: total ms}`` from MXNet's aggregate table (``mx.profiler.dumps``): the operator sections,
    not the C API calls (which wait on the operators) or the memory section."""
    times = {}
    lines = table.splitlines()
    section = None
    for line, underline in zip(lines, lines[1:] + [""]):
        if underline.startswith("====="):
            section = line.strip()
        words = line.split()
        if section not in SKIPPED_SECTIONS and len(words) >= 6 and words[-5].isdigit():
            try:
                total = float(words[-4])
            except ValueError:
                continue
            name = " ".join(words[:-5])
            times[name] = times.get(name, 0.0) + total
    return times


def grouped(times):
    """``[(group, share)]`` of the operators' total time, largest first."""
    groups = {}
    for name, total in times.items():
        if name.startswith("["):  # a test graph's oneDNN subgraph, named by the operators fused in it
            group = "fused subgraph (test network)"
        elif name.startswith(f"{TEST_PROPOSAL_OP}::"):  # a custom operator's domain: its Python, its waits
            group = "test proposal layer (host, Python custom operator)"
        else:
            group = OPERATOR_GROUPS.get(name.removeprefix("_backward_"), "other")
        if name.startswith("_backward_") and group != "other":
            group += " (backward)"
        groups[group] = groups.get(group, 0.0) + total
    whole = sum(groups.values()) or 1.0
    return sorted(((group, total / whole) for group, total in groups.items()), key=lambda row: -row[1])


def run(part, cfg, model):
    if part == "train":
        from lib.train.trainer import train

        train(cfg)
    else:
        from lib.inference.tester import test

        test(cfg, checkpoint=model)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("train", "test"))
    add_config_arguments(parser)
    parser.add_argument("--model", default=None, help="test: the checkpoint (.params); default: the config's")
    parser.add_argument("--out", default="output/profile", help="folder for the profile files")
    args = parser.parse_args()
    cfg = config_from_arguments(args)
    setup_logging()
    os.makedirs(args.out, exist_ok=True)
    mx.profiler.set_config(profile_symbolic=True, profile_imperative=True, profile_api=False, aggregate_stats=True,
                           filename=os.path.join(args.out, f"{args.part}_trace.json"))
    profile = cProfile.Profile()
    start, wall = os.times(), time.time()
    mx.profiler.set_state("run")
    profile.enable()
    try:
        run(args.part, cfg, args.model)
    finally:
        profile.disable()
        mx.profiler.set_state("stop")
    end, wall = os.times(), time.time() - wall
    table = mx.profiler.dumps(reset=True)
    with open(os.path.join(args.out, f"{args.part}_operators.txt"), "w") as f:
        f.write(table)
    profile.dump_stats(os.path.join(args.out, f"{args.part}.pstats"))
    print(f"CPU s: this process {end.user - start.user + end.system - start.system:.1f}, its children "
          f"{end.children_user - start.children_user + end.children_system - start.children_system:.1f}; "
          f"wall {wall:.1f} s")
    print(f"{'operator group':<56}{'share':>7}")
    for group, share in grouped(operator_times(table)):
        print(f"{group:<56}{100 * share:>6.1f}%")
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(r"/(lib|symbols|chip_generator)/", 25)
    print(text.getvalue())


if __name__ == "__main__":
    main()
