"""Deformable operators on the CPU: MXNet's stock kernels against lib/ops' compiled ones, side by side.

Rows: each operator (forward, backward) at the network's shapes; the ResNet-101 test forward of one
800x1280 image (one context); a tiny-default training step (resnet_tiny, the yml's 4 chips of 512x512
per context on 2 CPU contexts, its 128 rois per chip); ``trainer``: ``--iterations`` real training
iterations of the tiny default per repeat (the trainer's module and initialisation, SGD updates, batches
from the ChipLoader over the synthetic training set, which is generated on first use), the two variants
drawing their batches from one loader. Within every repeat the stock and the compiled
variant run back to back, so machine load hits both alike; cells are the median / min over ``--repeat``
repeats, after one warm-up pass of each. The machine load before and after is printed.

MXNet gives each CPU context's worker OMP_NUM_THREADS threads (unset: half the cores). The stock
training step on 2 contexts hangs in OpenBLAS 0.3.13 (the wheel's) when a worker has more than one
thread: both workers call its OpenMP sgemm at once. The ``train`` row therefore needs
``OMP_NUM_THREADS=1``, which is what MXNet picks on a 2-core machine anyway.

    OMP_NUM_THREADS=2 python tools/benchmark_deformable.py --parts ops,test [--repeat 5]
    OMP_NUM_THREADS=1 python tools/benchmark_deformable.py --parts train,trainer [--repeat 5] [--iterations 10]
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os

import mxnet as mx
import numpy as np

import lib.ops  # noqa: F401  (the compiled operators and the training graph's proposal target)
from lib.benchmarking import markdown_table, measure
from lib.config import load_config
from lib.contexts import parse_contexts
from lib.data import ChipLoader
from lib.dataset import load_roidb
from lib.logger import report_user_errors
from lib.train.optimizer import make_optimizer_params
from lib.train.pretrained import initial_params
from lib.train.trainer import bind_module
from symbols import inference_symbol, training_symbol
from symbols.deformable import deformable_convolution, deformable_psroi_pooling
from tools.benchmark_network import bind, run

VARIANTS = ("stock", "compiled")
PARTS = ("ops", "test", "train", "trainer")
TINY_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "faster", "sniper_synthetic_tiny.yml")


def conv_case(label, batch, channels, height, width):
    """A res5 deformable 3x3 convolution (dilation 2, 4 deformable groups, channels -> channels)."""
    def build(compiled):
        return deformable_convolution(mx.sym.var("data"), mx.sym.var("offset"), "conv", in_channels=channels,
                                      num_filter=channels, kernel=(3, 3), pad=(2, 2), dilate=(2, 2),
                                      num_deformable_group=4, compiled=compiled)
    shapes = dict(data=(batch, channels, height, width), offset=(batch, 72, height, width))
    return label, build, shapes, {}


def pooling_case(label, batch, channels, height, width, rois, samples, offsets):
    """The R-CNN head's PS-ROI pooling 7x7 (group 1), with or without offsets, of random rois up to
    half the image wide."""
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


def op_passes(build, shapes, fixed):
    """{variant: (forward(), backward())} of one operator on random inputs."""
    passes = {}
    for variant in VARIANTS:
        symbol = build(variant == "compiled")
        grad_req = {name: "null" if name == "rois" else "write" for name in symbol.list_arguments()}
        executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **shapes)
        rng = np.random.RandomState(0)
        for name, array in executor.arg_dict.items():
            array[:] = fixed[name] if name in fixed else rng.normal(0, 1, array.shape)
        head_grads = [mx.nd.array(rng.normal(0, 1, out.shape)) for out in executor.outputs]

        def forward(executor=executor):
            executor.forward(is_train=True)
            mx.nd.waitall()

        def backward(_, executor=executor, head_grads=head_grads):
            executor.backward(head_grads)
            mx.nd.waitall()
        passes[variant] = (forward, backward)
    return passes


def test_passes(rng):
    """{variant: pass()} of the resnet101 test network on one 800x1280 image."""
    cfg = load_config(None, [("symbol", "resnet101"), ("TEST.fp16", "false")])
    shapes = dict(data=(1, 3, 800, 1280), im_info=(1, 3), im_ids=(1,), chip_ids=(1,))
    passes = {}
    for variant in VARIANTS:
        executor = bind(inference_symbol(cfg, 81, compiled_deformable=variant == "compiled"), shapes, False, rng)
        executor.arg_dict["im_info"][:] = [800, 1280, 1.0]
        passes[variant] = lambda executor=executor: run([executor], False)
    return passes


def training_passes(rng, contexts=2):
    """(label, {variant: pass()}, chips per pass) of a tiny-default training step on `contexts` CPUs."""
    cfg = load_config(TINY_CONFIG)
    chips, feat, anchors = cfg.TRAIN.BATCH_IMAGES, cfg.TRAIN.CHIP_SIZE // 16, cfg.network.NUM_ANCHORS
    size = cfg.TRAIN.CHIP_SIZE
    shapes = dict(data=(chips, 3, size, size), im_info=(chips, 3), valid_ranges=(chips, 2), gt_boxes=(chips, 100, 5),
                  label=(chips, anchors * feat * feat), bbox_target=(chips, 4 * anchors, feat, feat),
                  bbox_weight=(chips, 4 * anchors, feat, feat))
    passes = {}
    for variant in VARIANTS:
        symbol = training_symbol(cfg, 6, chips, compiled_deformable=variant == "compiled")
        executors = [bind(symbol, shapes, True, rng, mx.cpu(i)) for i in range(contexts)]
        passes[variant] = lambda executors=executors: run(executors, True)
    label = (f"resnet_tiny training step, {contexts} contexts x {chips} chips {size}x{size}, "
             f"{cfg.TRAIN.RPN_POST_NMS_TOP_N} rois/chip")
    return label, passes, contexts * chips


def trainer_passes(loader, cfg, num_classes, iterations):
    """(label, {variant: pass()}, chips per pass): each pass is ``iterations`` training iterations
    (forward, backward, SGD update) of the trainer's module for that variant, on batches of ``loader``."""
    contexts = parse_contexts(cfg.gpus)
    shapes = dict(loader.provide_data + loader.provide_label)
    passes = {}
    for variant in VARIANTS:
        symbol = training_symbol(cfg, num_classes, cfg.TRAIN.BATCH_IMAGES, compiled_deformable=variant == "compiled")
        module = bind_module(cfg, symbol, loader, contexts)
        arg_params, aux_params = initial_params(cfg, symbol, shapes)
        module.init_params(arg_params=arg_params, aux_params=aux_params, allow_missing=False)
        module.init_optimizer(kvstore=cfg.default.kvstore, optimizer="sgd",
                              optimizer_params=make_optimizer_params(cfg, loader.num_batches, 0, False))

        def train(module=module):
            for _ in range(iterations):
                try:
                    batch = next(loader)
                except StopIteration:
                    loader.reset()
                    batch = next(loader)
                module.forward_backward(batch)
                module.update()
            mx.nd.waitall()
        passes[variant] = train
    label = (f"tiny-default training, {iterations} iterations of {loader.batch_size} chips ({len(contexts)} contexts, "
             f"ChipLoader with {cfg.TRAIN.NUM_PROCESS} workers)")
    return label, passes, iterations * loader.batch_size


def side_by_side(calls, repeat, setups=None):
    """Seconds of every call in ``calls`` ({key: function}) per repeat, the keys taking turns; with
    ``setups`` ({key: function}) each timed call gets the value of its untimed setup call."""
    setups = setups or {}
    for key, function in calls.items():  # warm-up
        function(setups[key]()) if key in setups else function()
    seconds = {key: [] for key in calls}
    for _ in range(repeat):
        for key, function in calls.items():
            seconds[key] += measure(function, repeat=1, warmup=0, setup=setups.get(key)).seconds
    return seconds


def row(label, seconds, chips=None):
    """Table row: stock and compiled median / min in ms (chips/s for a batch of ``chips``), speed-up."""
    def cell(times):
        median, best = float(np.median(times)), min(times)
        if chips:
            return f"{chips / median:.2f} / {chips / best:.2f} chips/s"
        return f"{1000 * median:.0f} / {1000 * best:.0f} ms"
    stock, compiled = seconds["stock"], seconds["compiled"]
    return [label, cell(stock), cell(compiled), float(np.median(stock) / np.median(compiled))]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--parts", default="ops,test", help=f"comma-separated rows to run, of {', '.join(PARTS)}")
    parser.add_argument("--iterations", type=int, default=10, help="training iterations per repeat (trainer row)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts {args.parts!r}: choose from {', '.join(PARTS)}")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if {"train", "trainer"} & set(parts) and threads != "1":
        parser.error(f"the train and trainer rows need OMP_NUM_THREADS=1 (got {threads or 'unset'}): with more "
                     f"threads per CPU worker the stock training step hangs in OpenBLAS (see the module docstring)")
    load = os.getloadavg()
    print(f"CPU with {os.cpu_count()} cores, OMP_NUM_THREADS={threads or 'unset'}, load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; median / min of {args.repeat} repeats")
    rows = []
    if "ops" in parts:
        for label, build, shapes, fixed in OP_CASES:
            passes = op_passes(build, shapes, fixed)
            forwards = {v: passes[v][0] for v in VARIANTS}
            rows.append(row(f"{label}: forward", side_by_side(forwards, args.repeat)))
            backwards = {v: passes[v][1] for v in VARIANTS}  # each after an untimed forward
            rows.append(row(f"{label}: backward", side_by_side(backwards, args.repeat, setups=forwards)))
    rng = np.random.RandomState(0)
    if "test" in parts:
        rows.append(row("resnet101 test forward, 1 image 800x1280", side_by_side(test_passes(rng), args.repeat)))
    if "train" in parts:
        label, passes, chips = training_passes(rng)
        seconds = side_by_side(passes, args.repeat)
        rows.append(row(label, seconds))
        rows.append(row("  the same in chips/s", seconds, chips))
    if "trainer" in parts:
        cfg = load_config(TINY_CONFIG)
        roidb, dataset = load_roidb(cfg, cfg.dataset.image_set, training=True)
        with ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, num_ctx=len(parse_contexts(cfg.gpus)),
                        seed=cfg.default.seed) as loader:
            label, passes, chips = trainer_passes(loader, cfg, dataset.num_classes, args.iterations)
            rows.append(row(label, side_by_side(passes, args.repeat), chips))
    print(markdown_table(["row", "stock (median / min)", "compiled (median / min)", "speed-up"], rows,
                         [None, None, None, ".2f"]))
    load = os.getloadavg()
    print(f"load average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
