"""Times the SNIPER network (symbols/) on the CPU: training forward+backward and test forward.

Random weights and inputs; the point is the cost per batch of chips and which operators dominate it.
Timings use MXNet's defaults; the operator shares come from a separate profiled pass (one context) with
bulk execution and operator fusion off, so that each operator is timed on its own. With ``--contexts N``
the batch is split over N CPU contexts (cpu(0)..cpu(N-1)), as ``gpus: 'cpu:N'`` trains; the CPU column
is process CPU time over wall time (how many cores were busy).

    python tools/benchmark_network.py [--symbol resnet_tiny] [--cfg FILE] [--chips 2] [--size 512] [--repeat 3]
        [--contexts 1] [--rois 300] [--masks]

The network settings (anchors) come from ``--cfg`` (default: the defaults); ``--symbol`` replaces its
symbol and the feature strides follow the body (16 for the ResNets, 32 for MobileNetV2), so e.g.
``--symbol mobilenetv2 --cfg configs/faster/sniper_mobilenetv2_e2e.yml`` times the published one. The
deformable layers use the operators the trainer would (network.CPU_DEFORMABLE_OPS, compiled by default;
tools/benchmark_deformable.py compares both). ``--masks`` times the mask network (TRAIN.WITH_MASK: the
mask branch on up to 50 rois per chip, rectangle polygons of the four gts in ``gt_masks``).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import shutil
import tempfile

import mxnet as mx
import numpy as np

import lib.ops  # noqa: F401  (the training graph's proposal-target operator)
from lib.benchmarking import markdown_table, measure
from lib.config import load_config
from lib.data.chip_masks import MAX_POLYGON_LEN
from lib.logger import report_user_errors
from symbols import inference_symbol, training_symbol, use_compiled_deformable
from symbols.backbones import BACKBONES


def bind(symbol, shapes, for_training, rng, context=None):
    executor = symbol.simple_bind(context or mx.cpu(), grad_req="write" if for_training else "null", **shapes)
    for name, array in executor.arg_dict.items():
        if name not in shapes:
            array[:] = rng.normal(0, 0.02, array.shape) if name.endswith("weight") else name.endswith("gamma")
    for name, array in executor.aux_dict.items():
        array[:] = name.endswith("var")
    size = shapes["data"][2]
    executor.arg_dict["data"][:] = rng.uniform(-100, 100, shapes["data"])
    executor.arg_dict["im_info"][:] = [size, size, 1.0]
    if for_training:
        executor.arg_dict["valid_ranges"][:] = [-1, -1]
        gt = -np.ones(shapes["gt_boxes"])
        gt[:, :4] = [[10, 10, 100, 120, 1], [200, 150, 300, 380, 2], [50, 300, 90, 330, 3], [400, 20, 500, 60, 1]]
        executor.arg_dict["gt_boxes"][:] = gt
        executor.arg_dict["label"][:] = rng.randint(-1, 2, shapes["label"])
        executor.arg_dict["bbox_weight"][:] = 1
        if "gt_masks" in shapes:  # each gt's box as its polygon, in the iterator's encoding
            masks = -np.ones(shapes["gt_masks"])
            for row, (x1, y1, x2, y2, label) in enumerate(gt[0, :4]):
                masks[:, row, :11] = [label - 1, 1, 8, x1, y1, x2, y1, x2, y2, x1, y2]
            executor.arg_dict["gt_masks"][:] = masks
    return executor


def run(executors, for_training):
    """One pass of every executor (one per context), pushed before waiting so that they overlap."""
    for executor in executors:
        executor.forward(is_train=for_training)
    if for_training:
        for executor in executors:
            executor.backward()
    mx.nd.waitall()


UNFUSED = {"MXNET_SUBGRAPH_BACKEND": "NONE", "MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_INFERENCE": "0"}


def profile_top(symbol, shapes, for_training, rng, top):
    """(operator, share of the profiled time) for the `top` most expensive operators of one pass."""
    os.environ.update(UNFUSED)  # read when binding
    executor = bind(symbol, shapes, for_training, rng)
    for name in UNFUSED:
        del os.environ[name]
    run([executor], for_training)
    # MXNet's profiler replaces the file it is given: never point it at /dev/null.
    trace = os.path.join(tempfile.mkdtemp(prefix="sniper-profile-"), "profile.json")
    mx.profiler.set_config(profile_symbolic=True, aggregate_stats=True, filename=trace)
    mx.profiler.set_state("run")
    run([executor], for_training)
    mx.profiler.set_state("stop")
    shutil.rmtree(os.path.dirname(trace), ignore_errors=True)
    totals, section = {}, None
    for line in mx.profiler.dumps(reset=True).splitlines():
        fields = line.split()
        if len(fields) == 1 and not fields[0].startswith("="):
            section = fields[0]
        elif section == "operator" and len(fields) == 6 and fields[1].isdigit():
            totals[fields[0]] = totals.get(fields[0], 0.0) + float(fields[2])
    whole = sum(totals.values()) or 1.0
    return [(name, ms / whole) for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--symbol", default="resnet_tiny", choices=sorted(BACKBONES))
    parser.add_argument("--cfg", default=None, help="config file for the network settings (anchors)")
    parser.add_argument("--chips", type=int, default=2)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--classes", type=int, default=81)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--contexts", type=int, default=1, help="CPU contexts sharing the batch (gpus 'cpu:N')")
    parser.add_argument("--rois", type=int, default=300, help="proposals per chip in training (RPN_POST_NMS_TOP_N)")
    parser.add_argument("--masks", action="store_true", help="the mask network (TRAIN.WITH_MASK)")
    args = parser.parse_args()
    if args.contexts < 1 or args.chips % args.contexts:
        parser.error(f"--chips ({args.chips}) must be a positive multiple of --contexts ({args.contexts})")
    chips = args.chips // args.contexts  # per context
    stride = BACKBONES[args.symbol].stride
    cfg = load_config(args.cfg, [("symbol", args.symbol), ("TRAIN.fp16", False), ("TEST.fp16", False),
                                 ("TRAIN.RPN_POST_NMS_TOP_N", args.rois), ("TRAIN.WITH_MASK", args.masks)])
    size, anchors, feat = args.size, cfg.network.NUM_ANCHORS, args.size // stride
    train_shapes = dict(data=(chips, 3, size, size), im_info=(chips, 3), valid_ranges=(chips, 2),
                        gt_boxes=(chips, 100, 5), label=(chips, anchors * feat * feat),
                        bbox_target=(chips, 4 * anchors, feat, feat), bbox_weight=(chips, 4 * anchors, feat, feat))
    if args.masks:
        train_shapes["gt_masks"] = (chips, cfg.TRAIN.MAX_GT_PER_CHIP, MAX_POLYGON_LEN)
    test_shapes = dict(data=(chips, 3, size, size), im_info=(chips, 3), im_ids=(chips,), chip_ids=(chips,))
    rng = np.random.RandomState(0)
    rows = []
    contexts = [mx.cpu(i) for i in range(args.contexts)]
    compiled = use_compiled_deformable(cfg, contexts)  # as the trainer and the Detector choose
    for label, for_training, shapes in (("train fwd+bwd", True, train_shapes), ("test fwd", False, test_shapes)):
        symbol = (training_symbol(cfg, args.classes, chips, compiled_deformable=compiled) if for_training
                  else inference_symbol(cfg, args.classes, compiled_deformable=compiled))
        executors = [bind(symbol, shapes, for_training, rng, context) for context in contexts]
        timing = measure(lambda: run(executors, for_training), repeat=args.repeat)
        top = ", ".join(f"{name} {100 * share:.0f}%"
                        for name, share in profile_top(symbol, shapes, for_training, rng, 3))
        rows.append((label, 1000 * timing.median, args.chips / timing.median, timing.cpu_fraction, top))
    print(f"{args.symbol}{' with masks' if args.masks else ''} (stride {stride}, {anchors} anchors), {args.chips} chips of {size}x{size} on "
          f"{args.contexts} CPU context(s), {args.rois} rois/chip, {args.classes} classes, "
          f"{'compiled' if compiled else 'stock'} deformable operators, "
          f"CPU with {os.cpu_count()} cores")
    print(markdown_table(["pass", "ms/batch", "chips/s", "CPU", "largest operator shares (profiled pass)"], rows,
                         [None, ".0f", ".2f", ".2f", None]))


if __name__ == "__main__":
    main()
