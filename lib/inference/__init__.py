"""Inference and evaluation: multi-scale testing, merging, COCO/VOC metrics, proposal extraction; the
Python API ``Detector.from_checkpoint(MODEL)(image_bgr)`` (lib.inference.detector)."""
from lib.inference.detections import Detections
from lib.inference.detector import Detector

__all__ = ["Detector", "Detections"]
