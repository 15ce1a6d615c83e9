"""Detect objects in one image and draw them:
``python demo.py --model RUN_FOLDER|FILE.params --im_path IMAGE [--out PNG] [--thresh 0.5] [--set KEY VALUE ...]``.

With ``--model`` alone the run folder's config.yaml is the config and the checkpoint's metadata names the
classes (no dataset needed). ``--cfg FILE`` instead (or with ``--model``) uses that config, and the
checkpoint ``--model``, ``TEST.MODEL`` or the training run's ``TEST.TEST_EPOCH``; a checkpoint without
metadata then takes the class names of the config's test set when its annotations are on disk, else
numbers its classes up to ``dataset.NUM_CLASSES``. The picture goes to ``--out``, by default
``{output_path}/{name}/demo/IMAGE_detections.png`` (the run folder), never beside the image.
"""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse
import logging
import os
import sys

import cv2

from lib.logger import report_user_errors, setup_logging
from lib.inference.onnx_network import add_backend_argument, with_backend
from lib.run.folder import add_model_arguments, config_from_model_arguments

logger = logging.getLogger("demo")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    add_backend_argument(parser)
    parser.add_argument("--im_path", required=True, help="image to run on")
    parser.add_argument("--out", default=None,
                        help="PNG to write (default: {output_path}/{name}/demo/IMAGE_detections.png)")
    parser.add_argument("--thresh", type=float, default=0.5, help="draw detections scoring at least this")
    return with_backend(parser.parse_args(argv))


def default_out(cfg, im_path):
    """The run folder's ``demo/IMAGE_detections.png``: never written into the dataset's image folder."""
    from lib.run.checkpoint import output_dir

    stem = os.path.splitext(os.path.basename(im_path))[0]
    return os.path.join(output_dir(cfg), "demo", f"{stem}_detections.png")


@report_user_errors  # a user's mistake (lib/errors.py) in one line
def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_model_arguments(args)
    out = args.out or default_out(cfg, args.im_path)
    if not cv2.haveImageWriter(out):  # checked before the network runs, not by a failed write after it
        sys.exit(f"--out {out}: not an image file name OpenCV can write; end it in .png or .jpg")
    from lib.start_checks import check_devices

    check_devices(cfg, ("TEST",))  # a GPU config on a CPU machine: every key to change, in one line
    setup_logging()
    from lib.dataset import read_image
    from lib.paths import shown_path
    from lib.inference import Detector
    from lib.run.checkpoint import checkpoint_file
    from lib.run.folder import checkpoint_classes

    image = read_image(args.im_path, max_pixels=cfg.dataset.MAX_IMAGE_PIXELS)
    params = checkpoint_file(cfg)
    detector = Detector.from_config(cfg, params, checkpoint_classes(params, cfg))
    detections = detector(image)
    shown = detections.above(args.thresh)
    areas = shown.masks.sum(axis=(1, 2)) if shown.masks is not None else [None] * len(shown)
    for box, score, name, area in zip(shown.boxes, shown.scores, shown.names, areas):
        logger.info("%-15s %.3f  [%.0f, %.0f, %.0f, %.0f]%s", name, score, *box,
                    "" if area is None else f"  mask {area} px")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if not cv2.imwrite(out, detector.draw(image, detections, args.thresh)):
        sys.exit(f"cannot write {out}")
    logger.info("%d detections, %d with score >= %.2f, drawn to %s", len(detections), len(shown), args.thresh,
                shown_path(out))


if __name__ == "__main__":
    main()
