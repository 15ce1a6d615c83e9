"""Deformable operators on the CPU: MXNet's stock kernels against lib/ops' compiled ones, side by side.

Rows: each operator (forward, backward) at the network's shapes; the ResNet-101 test forward of one
800x1280 image; a tiny-default training step (resnet_tiny, 4 chips of 512x512 per context on 2 CPU
contexts, 128 rois per chip, as configs/faster/sniper_synthetic_tiny.yml trains). Within every repeat
the stock and the compiled variant run back to back, so machine load hits both alike; the table gives
the median and the min over ``--repeat`` repeats, and the machine load before and after.

    OMP_NUM_THREADS=2 .venv/bin/python tools/benchmark_deformable.py [--repeat 5] [--parts ops,test,train]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import lib.ops  # noqa: E402,F401  (the compiled operators and the training graph's proposal target)
from lib.config import load_config  # noqa: E402
from symbols import get_symbol  # noqa: E402
from symbols.deformable import deformable_convolution, deformable_psroi_pooling  # noqa: E402
from tools.benchmark_network import bind, run  # noqa: E402

VARIANTS = ("stock", "compiled")


def conv_case(label, batch, channels, height, width):
    """A res5 deformable 3x3 convolution (dilation 2, 4 deformable groups, channels -> channels)."""
    def build(compiled):
        return deformable_convolution(mx.sym.var("data"), mx.sym.var("offset"), "conv", in_channels=channels,
                                      num_filter=channels, kernel=(3, 3), pad=(2, 2), dilate=(2, 2),
                                      num_deformable_group=4, compiled=compiled)
    shapes = dict(data=(batch, channels, height, width), offset=(batch, 72, height, width))
    return label, build, shapes, {}


def pooling_case(label, batch, channels, height, width, rois, samples, offsets):
    """The R-CNN head's PS-ROI pooling 7x7 (group 1) of `rois` boxes of up to half the image, with or
    without offsets."""
    attrs = dict(spatial_scale=1 / 16, output_dim=channels, group_size=1, pooled_size=7, part_size=7,
                 sample_per_part=samples)

    def build(compiled):
        trans = mx.sym.var("trans") if offsets else None
        extra = dict(trans_std=0.1) if offsets else {}
        return deformable_psroi_pooling(mx.sym.var("data"), mx.sym.var("rois"), "pool", trans=trans,
                                        compiled=compiled, **attrs, **extra)
    shapes = dict(data=(batch, channels, height, width), rois=(rois, 5))
    if offsets:
        shapes["trans"] = (rois, 2, 7, 7)
    rng = np.random.RandomState(1)
    corner = rng.uniform(0, [16 * width, 16 * height], (rois, 2))
    size = rng.uniform(16, [8 * width, 8 * height], (rois, 2))
    boxes = np.hstack([rng.randint(0, batch, (rois, 1)), corner, corner + size])
    return label, build, shapes, {"rois": boxes}


OP_CASES = (
    conv_case("deformable conv, resnet101 res5, 800x1280 image", 1, 512, 50, 80),
    conv_case("deformable conv, resnet101 res5, 512x512 chip", 1, 512, 32, 32),
    conv_case("deformable conv, resnet_tiny res5, 4 chips", 4, 64, 32, 32),
    pooling_case("PS-ROI pooling + offsets, resnet101, 800x1280, 300 rois", 1, 256, 50, 80, 300, 4, True),
    pooling_case("PS-ROI pooling, resnet101, 800x1280, 300 rois", 1, 256, 50, 80, 300, 4, False),
    pooling_case("PS-ROI pooling + offsets, resnet_tiny, 4 chips x 128 rois", 4, 16, 32, 32, 512, 2, True),
)


def op_executor(build, shapes, fixed, compiled):
    symbol = build(compiled)
    grad_req = {name: "null" if name == "rois" else "write" for name in symbol.list_arguments()}
    executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **shapes)
    rng = np.random.RandomState(0)
    for name, array in executor.arg_dict.items():
        array[:] = fixed[name] if name in fixed else rng.normal(0, 1, array.shape)
    executor.outputs_grad = [mx.nd.array(rng.normal(0, 1, out.shape)) for out in executor.outputs]
    return executor


def time_op(executor):
    """(forward seconds, backward seconds) of one pass."""
    tic = time.perf_counter()
    executor.forward(is_train=True)
    mx.nd.waitall()
    middle = time.perf_counter()
    executor.backward(executor.outputs_grad)
    mx.nd.waitall()
    return middle - tic, time.perf_counter() - middle


def test_passes(rng):
    """{variant: pass()} of the resnet101 test network on one 800x1280 image."""
    cfg = load_config(None)
    cfg.symbol, cfg.dataset.NUM_CLASSES = "resnet101", 81
    shapes = dict(data=(1, 3, 800, 1280), im_info=(1, 3), im_ids=(1,), chip_ids=(1,))
    passes = {}
    for variant in VARIANTS:
        executor = bind(get_symbol(cfg, is_train=False, compiled_deformable=variant == "compiled"), shapes, False, rng)
        executor.arg_dict["im_info"][:] = [800, 1280, 1.0]
        passes[variant] = lambda executor=executor: run([executor], False)
    return passes


def training_passes(rng, contexts=2):
    """{variant: pass()} of a tiny-default training step: the yml's chips per context on `contexts`."""
    cfg = load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                   "configs/faster/sniper_synthetic_tiny.yml"))
    cfg.dataset.NUM_CLASSES = 6
    chips, feat, anchors = cfg.TRAIN.BATCH_IMAGES, 512 // 16, cfg.network.NUM_ANCHORS
    shapes = dict(data=(chips, 3, 512, 512), im_info=(chips, 3), valid_ranges=(chips, 2), gt_boxes=(chips, 100, 5),
                  label=(chips, anchors * feat * feat), bbox_target=(chips, 4 * anchors, feat, feat),
                  bbox_weight=(chips, 4 * anchors, feat, feat))
    passes = {}
    for variant in VARIANTS:
        symbol = get_symbol(cfg, is_train=True, compiled_deformable=variant == "compiled")
        executors = [bind(symbol, shapes, True, rng, mx.cpu(i)) for i in range(contexts)]
        passes[variant] = lambda executors=executors: run(executors, True)
    label = (f"resnet_tiny training step, {contexts} contexts x {chips} chips 512x512, "
             f"{cfg.TRAIN.RPN_POST_NMS_TOP_N} rois/chip")
    return label, passes, contexts * chips


def summary(times):
    return statistics.median(times), min(times)


def print_row(label, stock, compiled):
    (stock_median, stock_min), (compiled_median, compiled_min) = summary(stock), summary(compiled)
    print(f"| {label} | {stock_median * 1000:.0f} / {stock_min * 1000:.0f} | {compiled_median * 1000:.0f} / "
          f"{compiled_min * 1000:.0f} | {stock_median / compiled_median:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--parts", default="ops,test,train", help="comma-separated rows to run: ops, test, train")
    args = parser.parse_args()
    parts = args.parts.split(",")
    unknown = set(parts) - {"ops", "test", "train"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))} (choose from ops, test, train)")
    load_before = os.getloadavg()
    print(f"CPU with {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
          f"median / min of {args.repeat} repeats")
    print("| row | stock ms | compiled ms | speed-up (medians) |")
    print("|---|---|---|---|")
    if "ops" in parts:
        for label, build, shapes, fixed in OP_CASES:
            executors = {v: op_executor(build, shapes, fixed, v == "compiled") for v in VARIANTS}
            times = {v: [] for v in VARIANTS}
            for variant in VARIANTS:
                time_op(executors[variant])  # warm-up
            for _ in range(args.repeat):
                for variant in VARIANTS:
                    times[variant].append(time_op(executors[variant]))
            for part, name in enumerate(("forward", "backward")):
                print_row(f"{label}: {name}", *([t[part] for t in times[v]] for v in VARIANTS))
            del executors
    rng = np.random.RandomState(0)
    networks = []
    if "test" in parts:
        networks.append(("resnet101 test forward, 1 image 800x1280", test_passes(rng), 1))
    if "train" in parts:
        networks.append(training_passes(rng))
    for label, passes, chips in networks:
        times = {v: [] for v in VARIANTS}
        for variant in VARIANTS:
            passes[variant]()  # warm-up
        for _ in range(args.repeat):
            for variant in VARIANTS:
                tic = time.perf_counter()
                passes[variant]()
                times[variant].append(time.perf_counter() - tic)
        print_row(label, times["stock"], times["compiled"])
        if chips > 1:
            rates = {v: " ".join(f"{chips / t:.2f}" for t in sorted(times[v])) for v in VARIANTS}
            print(f"| &nbsp; chips/s, best first | {rates['stock']} | {rates['compiled']} | |")
    load_after = os.getloadavg()
    print(f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")


if __name__ == "__main__":
    main()
