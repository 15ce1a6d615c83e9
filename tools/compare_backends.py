"""The same checkpoint (or random weights) tested by MXNet and by ONNX Runtime (its ONNX export):

    python tools/compare_backends.py --model RUN_FOLDER|FILE.params [--set KEY VALUE ...] [--dataset]
    python tools/compare_backends.py --cfg configs/faster/sniper_res101_e2e.yml --set TEST.SCALES "[[480, 512]]"

prints (1) the multi-scale detections of ``--images`` smooth random images of ``--image_size``: per back end
the count, how many MXNet detections have an ONNX Runtime one of the same class at IoU >= 0.99 and the
largest score difference among them (lib.inference.backend_comparison.match_detections); (2) per exported
output the largest difference on the first image at the first scale (the head on MXNet's rois); (3) with
``--dataset``, the COCO/VOC evaluation of the config's test set on both (main_test.py --backend). Weights:
the checkpoint's when there is one, else random (``--init``) from MXNet's seed 0 (speed and agreement do
not need trained weights; the synthetic run's AP does). Exit status 1 when a detection is not matched or a
score differs by more than ``--score_tolerance``. ``--quantize int8`` compares MXNet with the export quantised
to int8 (tools/export_model.py --quantize int8, calibrated on the first ``--calibration`` images of the test
set with ``--dataset``, else on the random images): what int8 costs, in detections and with ``--dataset`` in
AP; the matching is then reported, not required.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys
import tempfile

import cv2
import numpy as np

from lib.benchmarking import smooth_images
from lib.config import with_overrides
from lib.config.core import plain
from lib.dataset.base import numbered_classes
from lib.inference.backend_comparison import layer_differences, match_detections, random_weights
from lib.inference.detector import Detector
from lib.inference.export import export_onnx_params
from lib.inference.onnx_quantize import QUANTIZATIONS, calibration_images, check_quantization, quantize_export
from lib.logger import report_user_errors
from lib.run.checkpoint import checkpoint_file, load_params
from lib.run.folder import add_model_arguments, checkpoint_classes, config_from_model_arguments

def weights(cfg, num_classes, init):
    """(classes, arg_params, aux_params, description): the checkpoint's, or random ones (``init``)."""
    path = checkpoint_file(cfg)
    if os.path.isfile(path):
        return (checkpoint_classes(path, cfg), *load_params(path), path)
    return (numbered_classes(num_classes), *random_weights(cfg, num_classes, init),
            f"random {init} weights (MXNet seed 0)")


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--images", type=int, default=2, help="random images tested on both back ends")
    parser.add_argument("--image_size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--num_classes", type=int, default=81, help="random weights: when dataset.NUM_CLASSES is 0")
    parser.add_argument("--init", choices=("xavier", "normal"), default="xavier",
                        help="random weights: Xavier Gaussians (variance 1 / fan-in) and the input normaliser "
                             "scaled to the pixels, so that deep bodies neither explode nor tie; or N(0, 0.05)")
    parser.add_argument("--score_tolerance", type=float, default=1e-3)
    parser.add_argument("--dataset", action="store_true", help="also evaluate the config's test set on both")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default="none",
                        help="int8: ONNX Runtime runs the export with its body quantised to int8")
    parser.add_argument("--calibration", type=int, default=8, help="--quantize int8: calibration images")
    args = parser.parse_args(argv)
    check_quantization(args.quantize, args.calibration)
    cfg = with_overrides(config_from_model_arguments(args), {"TEST.fp16": False, "TEST.BACKEND": "mxnet"})
    classes, arg_params, aux_params, source = weights(cfg, cfg.dataset.NUM_CLASSES or args.num_classes,
                                                      args.init)
    on_mxnet = Detector.from_params(cfg, classes, arg_params, aux_params, source=source)
    with tempfile.TemporaryDirectory() as folder:
        export_onnx_params(cfg, classes, arg_params, aux_params, folder, source)
        images = smooth_images(args.images, *args.image_size)
        if args.quantize == "int8":
            quantize_export(folder, calibration_images(cfg, args.calibration) if args.dataset else images)
        on_onnx = Detector.from_onnx(folder, cfg, classes)
        expected, found = on_mxnet.detect(images), on_onnx.detect(images)
        body = "float32" if args.quantize == "none" else args.quantize
        print(f"{cfg.symbol}, {source}, TEST.SCALES {plain(cfg.TEST.SCALES)}, {args.images} images of "
              f"{args.image_size[0]}x{args.image_size[1]}, ONNX body {body}")
        print("| image | MXNet | ONNX Runtime | matched at IoU >= 0.99 | lowest best IoU | largest score diff |")
        print("|---|---|---|---|---|---|")
        failed = False
        for index, (image_expected, image_found) in enumerate(zip(expected, found)):
            stats = match_detections(image_expected, image_found)
            failed |= args.quantize == "none" and (stats["matched"] < stats["expected"] or stats["expected"] !=
                                                   stats["found"] or stats["max_score_diff"] > args.score_tolerance)
            print(f"| {index} | {stats['expected']} | {stats['found']} | {stats['matched']} | {stats['worst_iou']:.6f} "
                  f"| {stats['max_score_diff']:.2e} |")
        level = on_mxnet.levels[0]
        scale = level.spec.image_scale(*images[0].shape[:2])
        resized = cv2.resize(images[0], None, fx=scale, fy=scale).astype(np.float32)
        pixels = resized - np.asarray(cfg.network.PIXEL_MEANS, np.float32)
        if cfg.network.CHANNEL_ORDER == "RGB":
            pixels = pixels[:, :, ::-1]
        data = np.ascontiguousarray(pixels.transpose(2, 0, 1)[None])
        im_info = np.array([[data.shape[2], data.shape[3], 1]], np.float32)
        print(f"\nper layer, image 0 at {data.shape[2]}x{data.shape[3]} (the head on MXNet's rois)")
        print("| output | max abs difference | max abs MXNet value |")
        print("|---|---|---|")
        for name, (difference, magnitude) in layer_differences(cfg, len(classes), arg_params, aux_params,
                                                               on_onnx.network, data, im_info).items():
            print(f"| {name} | {difference:.2e} | {magnitude:.3g} |")
        if args.dataset:
            from lib.inference import tester

            summaries = {name: tester.test(cfg, detector=detector, out_dir=os.path.join(folder, name))
                         for name, detector in (("mxnet", on_mxnet), ("onnxruntime", on_onnx))}
            print("\n| back end | " + " | ".join(summaries["mxnet"]["stats"]) + " |")
            print("|---" * (1 + len(summaries["mxnet"]["stats"])) + "|")
            for name, summary in summaries.items():
                print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in summary["stats"].values()) + " |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
