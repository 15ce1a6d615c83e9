"""Inference and evaluation: multi-scale testing, merging, COCO/VOC metrics, proposal extraction; the
Python API ``Detector.from_checkpoint(MODEL)(image_bgr)`` (lib.inference.detector)."""
from lib.bootstrap import require_mxnet

require_mxnet("lib.inference")  # a plain interpreter without MXNet: one line naming the one to use

from lib.inference.detections import Detections  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402

__all__ = ["Detector", "Detections"]
