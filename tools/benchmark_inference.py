"""Inference speed: the test pipeline's host side with a null forward; SNIPER single- and multi-scale testing
vs GluonCV's Faster R-CNN ResNet-101.

    python tools/benchmark_inference.py --model RUN_FOLDER | --cfg FILE [--set KEY VALUE ...] [--images 2] [--runs 3]
    python tools/benchmark_inference.py --cfg FILE --null-forward [--images 48] [--workers 0 2] [--runs 3]

``--null-forward`` measures everything around the network: ``--images`` JPEG files of ``--image_size`` are
written to a temporary folder and tested as a dataset (lib.inference.streaming: decoding, the resizes of
every TEST.SCALES level, mean subtraction onto the batch canvases, the per-image merge), with the network
replaced by a no-op returning fixed-shape outputs shaped like a trained network's (300 rois per image and
scale, each with one likely class and two unlikely ones above the score threshold, so that the merge has
realistic work). Each ``--workers`` count (TEST.NUM_PROCESS; 0 = in the main process) runs once per round,
side by side, for ``--runs`` rounds; the table gives the median images/s.

Otherwise the tool times ``Detector.detect`` (network, decoding, merging) on the configured contexts for
one test scale (``--single_scale``, an index into TEST.SCALES) and for all of TEST.SCALES, after a warm-up
pass, as the median of ``--runs`` runs over ``--images`` random images of ``--image_size``. With
``--deformable stock compiled`` the SNIPER rows are repeated for each network.CPU_DEFORMABLE_OPS value (the
same weights), the variants taking turns within every run so that machine load hits them alike; with
``--backend mxnet onnxruntime`` likewise for MXNet and ONNX Runtime (the ONNX export of the same weights, as
many threads: OMP_NUM_THREADS for both; ``onnxruntime`` pools in the head as TEST.ONNX_POOLING says (auto: lib/ops'
compiled pooling where built); ``onnxruntime-graph``: that export with its head run whole (TEST.ONNX_POOLING graph,
RoiAlign pooling); ``onnxruntime-int8``: that export with its body quantised to int8, tools/export_model.py
--quantize int8, calibrated on the benchmark's own images). GluonCV's
``faster_rcnn_resnet101_v1d_coco`` (built with pretrained=False, pretrained_base=False: no download) runs in
the same process on the first context at the same input sizes, one image per call. Weights are the
checkpoint's when it exists, else random: speed does not depend on them, except that random weights give
the most detections to merge. Peak memory is the largest RSS of the process sampled up to the end of each
row: MXNet keeps freed memory in its pool, so it only grows from row to row (the SNIPER rows run first, and
the GluonCV rows include SNIPER's pool; a back end's own peak needs a run with that ``--backend`` alone).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import shutil
import statistics
import sys
import tempfile

import cv2
import mxnet as mx
import numpy as np

from lib.benchmarking import PeakMemory, markdown_table, measure
from lib.config import parsed, with_overrides
from lib.inference.detector import Detector
from lib.inference.mxnet_network import DATA_NAMES
from lib.inference.streaming import RoidbImages
from lib.logger import report_user_errors
from lib.dataset.base import numbered_classes
from lib.errors import ConfigError
from lib.run.checkpoint import checkpoint_file, load_params
from lib.run.folder import add_model_arguments, checkpoint_classes, config_from_model_arguments, read_model_info
from lib.scales import ScaleLevel
from symbols import inference_symbol

ONNX_BACKENDS = ("onnxruntime", "onnxruntime-graph", "onnxruntime-int8")


def side_by_side(calls, runs):
    """{key: (median seconds, peak RSS)} of ``calls`` ({key: function}) after one warm-up call each, the
    keys taking turns in each of ``runs`` rounds; the peak RSS (sampled every 20 ms) is the process's up
    to the end of that key's last call."""
    def finished(function):
        function()
        mx.nd.waitall()

    for function in calls.values():
        finished(function)
    seconds, peaks = {key: [] for key in calls}, {}
    with PeakMemory() as memory:
        for _ in range(runs):
            for key, function in calls.items():
                seconds[key] += measure(lambda: finished(function), repeat=1, warmup=0).seconds
                peaks[key] = memory.rss
    return {key: (statistics.median(seconds[key]), peaks[key]) for key in calls}


def say(message):
    """A progress line on stderr (the table goes to stdout): a long benchmark shows what it is doing."""
    print(f"benchmark_inference: {message}", file=sys.stderr, flush=True)


def load_detectors(cfg, num_classes, variants, backends=("mxnet",), folder=None, calibration=()):
    """({(variant, backend): Detector}, weights): one Detector per network.CPU_DEFORMABLE_OPS value in
    ``variants`` (None: the config's) on MXNet and, with "onnxruntime" in ``backends``, one on ONNX Runtime (the
    export of the same weights into ``folder``, as many intra-op threads as OMP_NUM_THREADS gives MXNet), with
    "onnxruntime-graph" one on that export with its head run whole (TEST.ONNX_POOLING graph), with
    "onnxruntime-int8" one on that export quantised to int8 (calibrated on the ``calibration`` images), on the
    same weights, the checkpoint's when it exists, else random."""
    path = checkpoint_file(cfg)
    classes, rpn_only = numbered_classes(num_classes), False
    if os.path.isfile(path):  # the network the checkpoint was trained as: its metadata's classes, RPN-only or not
        info = read_model_info(path)
        rpn_only = bool(info and info.get("rpn_only"))
        classes = None if rpn_only else checkpoint_classes(path, cfg)
        arg_params, aux_params = load_params(path)
        weights = path
    else:
        module = mx.mod.Module(inference_symbol(cfg, num_classes), data_names=DATA_NAMES, label_names=None,
                               context=mx.cpu())
        module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                    for_training=False)
        module.init_params(mx.init.Normal(0.01))
        (arg_params, aux_params), weights = module.get_params(), "random weights"
    detectors = {}
    if "mxnet" in backends:
        for variant in variants:
            c = cfg if variant is None else with_overrides(cfg, {"network.CPU_DEFORMABLE_OPS": variant})
            detectors[(variant, "mxnet")] = Detector.from_params(c, classes, arg_params, aux_params, rpn_only=rpn_only,
                                                                 source=weights)
    float_export = os.path.join(folder, "float32")  # one export serves onnxruntime and onnxruntime-graph
    for backend in [b for b in ONNX_BACKENDS if b in backends]:
        if rpn_only:
            raise ConfigError(f"--backend {backend}: RPN-only networks (proposal extraction) run on mxnet")
        from lib.inference.export import export_onnx_params

        if not os.path.isdir(float_export):
            export_onnx_params(cfg, classes, arg_params, aux_params, float_export, weights)
        export = float_export
        if backend == "onnxruntime-int8":  # quantised in place: a copy of the float export
            from lib.inference.onnx_quantize import quantize_export

            export = shutil.copytree(float_export, os.path.join(folder, "int8"))
            quantize_export(export, calibration)
        run_cfg = with_overrides(cfg, {"TEST.ONNX_POOLING": "graph"}) if backend == "onnxruntime-graph" else cfg
        detectors[(None, backend)] = Detector.from_onnx(export, run_cfg, classes,
                                                        threads=int(os.environ.get("OMP_NUM_THREADS", 0)))
    return detectors, weights


class NullForwardNetwork:
    """A no-op network on the CPU: per image ``rois`` boxes spread over the image extent ``im_info`` gives,
    class scores with one likely and two unlikely foreground classes per roi, zero box deltas. Outputs
    depend only on the forward's shape and ``im_info``."""

    contexts = (mx.cpu(),)

    def __init__(self, cfg, num_classes):
        rois, rng = cfg.TEST.RPN_POST_NMS_TOP_N, np.random.default_rng(0)
        centres, sides = rng.uniform(0, 1, (rois, 2)), np.exp(rng.uniform(np.log(0.02), np.log(0.8), (rois, 2)))
        self.unit_boxes = np.clip(np.hstack([centres - sides / 2, centres + sides / 2]), 0, 1).astype(np.float32)
        self.scores = np.full((rois, num_classes), 1e-5, np.float32)
        for roi in range(rois):
            likely, *unlikely = rng.choice(np.arange(1, num_classes), 3, replace=False)
            self.scores[roi, likely] = rng.uniform(0.05, 0.9)
            self.scores[roi, unlikely] = rng.uniform(0.002, 0.01, 2)
        self.scores[:, 0] = 1 - self.scores[:, 1:].sum(axis=1)

    def forward(self, data, im_info):
        size = len(data)
        extent = np.tile(im_info[:, None, 1::-1] - 1, (1, 1, 2))  # (w - 1, h - 1, w - 1, h - 1) per image
        boxes = self.unit_boxes[None] * extent
        rois = np.concatenate([np.repeat(np.arange(size, dtype=np.float32), len(self.unit_boxes))[:, None],
                               boxes.reshape(-1, 4)], axis=1)
        return {"rois_output": rois, "cls_prob_reshape_output": np.broadcast_to(self.scores, (size,) + self.scores.shape),
                "bbox_pred_reshape_output": np.zeros((size, len(self.unit_boxes), 4), np.float32)}

    def release_buffers(self):
        """Nothing to free."""


def test_images(folder, count, height, width):
    """``count`` JPEG files of smooth random content (decoding like photographs, not like noise), as roidb
    entries."""
    rng = np.random.default_rng(1)
    entries = []
    for index in range(count):
        small = rng.integers(0, 255, (height // 16, width // 16, 3), dtype=np.uint8)
        image = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
        path = os.path.join(folder, f"{index:05d}.jpg")
        cv2.imwrite(path, image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        entries.append({"image": path, "id": index, "height": height, "width": width})
    return entries


def all_cpu_seconds():
    """CPU time of this process and of its ended, waited-for children (the pipeline's workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def null_forward_rows(cfg, num_classes, args):
    detector = Detector(cfg, numbered_classes(num_classes), NullForwardNetwork(cfg, num_classes),
                        source="null forward")
    seconds = {workers: [] for workers in args.workers}
    cpu = {workers: [] for workers in args.workers}
    with tempfile.TemporaryDirectory() as folder:
        source = RoidbImages(test_images(folder, args.images, *args.image_size))

        def run(workers):
            start = all_cpu_seconds()
            results = sum(1 for _, result in detector.run(source, num_workers=workers) if not isinstance(result, Exception))
            if results != args.images:
                raise RuntimeError(f"{args.images - results} of {args.images} images failed")
            cpu[workers].append(all_cpu_seconds() - start)

        for _ in range(args.runs):  # side by side: every setting once per round
            for workers in args.workers:
                seconds[workers].append(measure(lambda: run(workers), repeat=1, warmup=0).median)
    return [(workers, args.images / statistics.median(seconds[workers]),
             min(args.images / s for s in seconds[workers]), max(args.images / s for s in seconds[workers]),
             1000 * statistics.median(cpu[workers]) / args.images)
            for workers in args.workers]


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


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)  # --model RUN_FOLDER (its config.yaml) or --cfg FILE [--set ...]
    parser.add_argument("--images", type=int, default=None, help="images per run (default 2, null forward 48)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median reported)")
    parser.add_argument("--image_size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--single_scale", type=int, default=None,
                        help="index into TEST.SCALES for single-scale (default 1, or 0 with one scale)")
    parser.add_argument("--num_classes", type=int, default=81,
                        help="random weights when dataset.NUM_CLASSES is 0 (a checkpoint's come from its metadata)")
    parser.add_argument("--no_gluoncv", action="store_true", help="skip the GluonCV baseline")
    parser.add_argument("--null-forward", dest="null_forward", action="store_true",
                        help="the host pipeline alone, the network replaced by a no-op")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="null forward: TEST.NUM_PROCESS values to compare (default: 0 and the config's)")
    parser.add_argument("--backend", nargs="+", choices=("mxnet",) + ONNX_BACKENDS, default=["mxnet"],
                        help="SNIPER rows for each back end (TEST.BACKEND), side by side on the same weights and "
                             "threads (onnxruntime: the ONNX export, made in a temporary folder, its head pooling "
                             "as TEST.ONNX_POOLING says; onnxruntime-graph: its head run whole (RoiAlign pooling); "
                             "onnxruntime-int8: its body quantised to int8, calibrated on the benchmark's images)")
    parser.add_argument("--deformable", nargs="+", choices=("stock", "compiled"),
                        help="SNIPER rows for each network.CPU_DEFORMABLE_OPS value, side by side "
                             "(default: the config's only)")
    args = parser.parse_args(argv)
    cfg = config_from_model_arguments(args)  # a bad file, key or value stops here
    num_classes = cfg.dataset.NUM_CLASSES or args.num_classes
    cores = f"{os.cpu_count()} CPU cores (affinity {len(os.sched_getaffinity(0))})"
    if args.null_forward:
        args.images = args.images or 48
        args.workers = args.workers or sorted({0, cfg.TEST.NUM_PROCESS})
        rows = null_forward_rows(cfg, num_classes, args)
        print(f"\nnull forward: {args.images} JPEG images of {args.image_size[0]}x{args.image_size[1]} per run at "
              f"TEST.SCALES {cfg.TEST.SCALES}, TEST.BATCH_IMAGES {cfg.TEST.BATCH_IMAGES}, {args.runs} rounds side by "
              f"side, {cores}")
        print(markdown_table(["TEST.NUM_PROCESS", "images/s (median)", "min", "max", "CPU ms/image (all processes)"],
                             rows, [None, ".1f", ".1f", ".1f", ".1f"]))
        print(f"load average while measuring: {os.getloadavg()[0]:.1f}")
        return
    args.images = args.images or 2
    export_folder = tempfile.TemporaryDirectory()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (*args.image_size, 3), dtype=np.uint8) for _ in range(args.images)]
    detectors, weights = load_detectors(cfg, num_classes, args.deformable or [None], args.backend,
                                        export_folder.name, calibration=images)
    detector = next(iter(detectors.values()))
    single = detector.levels[single_scale_index(args.single_scale, len(detector.levels))]
    runs = (("single-scale", (ScaleLevel(single.spec, (-1, -1)),)), ("multi-scale", parsed(cfg).test_levels))
    rows = []
    total = len(runs) * (len(detectors) + (0 if args.no_gluoncv else 1))

    def done(row):
        rows.append(row)
        say(f"row {len(rows)}/{total} done: {row[0]}, {row[1]}: {args.images / row[4]:.3f} images/s")

    for name, levels in runs:
        first, last = len(rows) + 1, len(rows) + len(detectors)
        numbers = f"row {first}" if first == last else f"rows {first}-{last}"
        say(f"{numbers}/{total}: SNIPER {cfg.symbol} {name}, {args.runs} runs of {args.images} images after a "
            f"warm-up ...")
        calls = {variant: lambda d=d: d.detect(images, levels) for variant, d in detectors.items()}
        for (variant, backend), (seconds, peak) in side_by_side(calls, args.runs).items():
            ops = f", {variant} deformable ops" if variant else ""
            on = f", {backend}" if len(args.backend) > 1 or backend != "mxnet" else ""
            done((f"SNIPER {cfg.symbol}{ops}{on}", name, [level.spec for level in levels],
                  detectors[(variant, backend)].contexts, seconds, peak))
    if not args.no_gluoncv:
        for name, levels in runs:
            say(f"row {len(rows) + 1}/{total}: GluonCV faster_rcnn_resnet101_v1d_coco {name} ...")
            run = gluoncv_runner(images, [level.spec for level in levels], detector.contexts[0])
            seconds, peak = side_by_side({None: run}, args.runs)[None]
            done(("GluonCV faster_rcnn_resnet101_v1d_coco", name, [level.spec for level in levels],
                  detector.contexts[:1], seconds, peak))

    print(f"\n{args.images} images of {args.image_size[0]}x{args.image_size[1]} per run, median of {args.runs} "
          f"runs after warm-up, {cores}, MXNet {mx.__version__}; SNIPER weights: {weights}; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(markdown_table(
        ["model", "test", "scales", "contexts", "images/s", "ms/image", "peak RSS MB"],
        [(model, name, ", ".join(_spec_text(spec) for spec in specs), ",".join(map(str, contexts)),
          args.images / seconds, 1000 * seconds / args.images, peak / 2 ** 20)
         for model, name, specs, contexts, seconds, peak in rows],
        [None, None, None, None, ".3f", ".1f", ".0f"]))


def single_scale_index(chosen, count):
    """``--single_scale`` (None: the second of ``count`` TEST.SCALES, the first of a single-scale pyramid),
    refused in one line when it is not an index into them."""
    if chosen is None:
        return min(1, count - 1)
    if not 0 <= chosen < count:
        raise ConfigError(f"--single_scale {chosen}: TEST.SCALES has {count} scale{'s' if count > 1 else ''} "
                          f"(indices 0..{count - 1})")
    return chosen


def _spec_text(spec):
    return f"x{spec.factor:g}" if spec.factor > 0 else f"({spec.short:g}, {spec.long:g})"


if __name__ == "__main__":
    main()
