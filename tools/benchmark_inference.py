"""Inference speed: SNIPER single-scale and multi-scale testing vs GluonCV's Faster R-CNN ResNet-101.

    python tools/benchmark_inference.py --cfg FILE [--set KEY VALUE ...] [--images 2] [--runs 3]

Times ``Detector.detect`` (network, decoding, merging) on the configured contexts for one test scale
(``--single_scale``, an index into TEST.SCALES) and for all of TEST.SCALES, after a warm-up pass, as the
median of ``--runs`` runs over ``--images`` random images of ``--image_size``. GluonCV's
``faster_rcnn_resnet101_v1d_coco`` (built with pretrained=False, pretrained_base=False: no download)
runs in the same process on the first context at the same input sizes, one image per call. Weights
are the checkpoint's when it exists, else random: speed does not depend on them, except that random
weights give the most detections to merge. Peak memory is the largest RSS of the process sampled up
to the end of each row: MXNet keeps freed memory in its pool, so it only grows from row to row (the
SNIPER rows run first, and the GluonCV rows include SNIPER's pool).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os

import mxnet as mx
import numpy as np

from lib.benchmarking import PeakMemory, markdown_table, measure
from lib.config import add_config_arguments, config_from_arguments, with_overrides
from lib.inference.detector import DATA_NAMES, Detector, checkpoint_file
from lib.scales import pyramid
from symbols import inference_symbol


def timed(run, runs):
    """Warm up once, then the median wall time of ``runs`` calls and the peak RSS over them (sampled every
    20 ms)."""
    def call():
        run()
        mx.nd.waitall()

    call()
    with PeakMemory() as memory:
        timing = measure(call, repeat=runs, warmup=0)
    return timing.median, memory.rss


def load_detector(cfg, num_classes):
    path = checkpoint_file(cfg)
    if os.path.isfile(path):
        return Detector.from_checkpoint(cfg, num_classes, path), path
    module = mx.mod.Module(inference_symbol(cfg, num_classes), data_names=DATA_NAMES, label_names=None,
                           context=mx.cpu())
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    module.init_params(mx.init.Normal(0.01))
    return Detector(cfg, num_classes, *module.get_params()), "random weights"


def gluoncv_runner(images, specs, context):
    """Run GluonCV's Faster R-CNN on every image at every scale's input size, one image per call."""
    from gluoncv import model_zoo

    net = model_zoo.get_model("faster_rcnn_resnet101_v1d_coco", pretrained=False, pretrained_base=False)
    net.initialize(ctx=context)
    net.hybridize(static_alloc=True)
    inputs = []
    for spec in specs:
        for image in images:
            scale = spec.image_scale(*image.shape[:2])
            height, width = (max(1, int(round(side * scale))) for side in image.shape[:2])
            inputs.append(mx.nd.random.uniform(shape=(1, 3, height, width), ctx=context))

    def run():
        for x in inputs:
            net(x)[0].wait_to_read()
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--images", type=int, default=2, help="images per run")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median reported)")
    parser.add_argument("--image_size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--single_scale", type=int, default=1, help="index into TEST.SCALES for single-scale")
    parser.add_argument("--num_classes", type=int, default=81, help="when dataset.NUM_CLASSES is 0")
    parser.add_argument("--no_gluoncv", action="store_true", help="skip the GluonCV baseline")
    args = parser.parse_args(argv)
    cfg = config_from_arguments(args)  # a bad file, key or value stops here
    single = with_overrides(cfg, {"TEST.SCALES": [cfg.TEST.SCALES[args.single_scale]], "TEST.VALID_RANGES": [[-1, -1]]})
    detector, weights = load_detector(cfg, cfg.dataset.NUM_CLASSES or args.num_classes)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (*args.image_size, 3), dtype=np.uint8) for _ in range(args.images)]
    runs = (("single-scale", single), ("multi-scale", cfg))
    rows = []
    for name, run_cfg in runs:
        levels = pyramid(run_cfg.TEST, "TEST")  # same network, other scales
        seconds, peak = timed(lambda: detector.detect(images, levels), args.runs)
        rows.append((f"SNIPER {cfg.symbol}", name, run_cfg.TEST.SCALES, detector.contexts, seconds, peak))
    if not args.no_gluoncv:
        for name, run_cfg in runs:
            specs = [level.spec for level in pyramid(run_cfg.TEST, "TEST")]
            run = gluoncv_runner(images, specs, detector.contexts[0])
            seconds, peak = timed(run, args.runs)
            rows.append(("GluonCV faster_rcnn_resnet101_v1d_coco", name, run_cfg.TEST.SCALES,
                         detector.contexts[:1], seconds, peak))

    print(f"\n{args.images} images of {args.image_size[0]}x{args.image_size[1]} per run, median of {args.runs} "
          f"runs after warm-up, {os.cpu_count()} CPU cores, MXNet {mx.__version__}; SNIPER weights: {weights}")
    print(markdown_table(
        ["model", "test", "scales", "contexts", "images/s", "ms/image", "peak RSS MB"],
        [(model, name, str(scales), ",".join(map(str, contexts)), args.images / seconds, 1000 * seconds / args.images,
          peak / 2 ** 20) for model, name, scales, contexts, seconds, peak in rows],
        [None, None, None, None, ".3f", ".1f", ".0f"]))


if __name__ == "__main__":
    main()
