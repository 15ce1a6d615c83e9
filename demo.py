"""Detect objects in one image and draw them:
``python demo.py --cfg FILE --im_path IMAGE [--out PNG] [--thresh 0.5] [--set KEY VALUE ...]``.

The checkpoint is ``TEST.MODEL`` or the training run's ``TEST.TEST_EPOCH``; class names come from the
config's test image set (``dataset.test_image_set``), or are numbered when that set is not on disk.
"""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse
import logging
import os
import sys

import cv2

from lib.config import add_config_arguments, config_from_arguments
from lib.drawing import draw_detections
from lib.logger import setup_logging

logger = logging.getLogger("demo")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="YAML config the checkpoint was trained with")
    parser.add_argument("--im_path", required=True, help="image to run on")
    parser.add_argument("--out", default=None, help="PNG to write (default: IMAGE_detections.png beside it)")
    parser.add_argument("--thresh", type=float, default=0.5, help="draw detections scoring at least this")
    return parser.parse_args(argv)


def class_names(cfg):
    """Names of the contiguous labels (index 0 is background); their count is the network's class count."""
    from lib.dataset import load_roidb

    try:
        _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    except FileNotFoundError as err:
        if not cfg.dataset.NUM_CLASSES:
            raise ValueError(f"{err}; without the dataset set dataset.NUM_CLASSES to name the classes") from None
        logger.warning("%s: classes are shown by number", err)
        return ["__background__"] + [f"class {label}" for label in range(1, cfg.dataset.NUM_CLASSES)]
    return list(dataset.classes)


def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_arguments(args)
    out = args.out or os.path.splitext(args.im_path)[0] + "_detections.png"
    if not cv2.haveImageWriter(out):  # checked before the network runs, not by a failed write after it
        sys.exit(f"--out {out}: not an image file name OpenCV can write; end it in .png or .jpg")
    setup_logging()
    from lib.dataset import read_image
    from lib.inference.detector import Detector

    try:
        image = read_image(args.im_path)
    except IOError as err:
        sys.exit(str(err))
    names = class_names(cfg)
    detections = Detector.from_checkpoint(cfg, len(names)).detect([image])[0]
    shown = detections[detections[:, 4] >= args.thresh]
    for x1, y1, x2, y2, score, label in shown:
        logger.info("%-15s %.3f  [%.0f, %.0f, %.0f, %.0f]", names[int(label)], score, x1, y1, x2, y2)
    if not cv2.imwrite(out, draw_detections(image, detections, names, args.thresh)):
        sys.exit(f"cannot write {out}")
    logger.info("%d detections, %d with score >= %.2f, drawn to %s", len(detections), len(shown), args.thresh, out)


if __name__ == "__main__":
    main()
