"""Inference and evaluation: multi-scale testing, merging, COCO/VOC metrics, proposal extraction; the
Python API ``Detector.from_checkpoint(MODEL)(image_bgr)`` (lib.inference.detector), on MXNet or, for an
exported model, ONNX Runtime (``Detector.from_onnx(DIR)``, lib.inference.onnx_network).

The package imports no MXNet by itself: its modules do where they run MXNet (the MXNet network, masks,
the exporter), so the ONNX Runtime back end runs without it. ``Detector`` and ``Detections`` are loaded
on first use."""
import importlib
import importlib.util

from lib.bootstrap import require_mxnet

if importlib.util.find_spec("onnxruntime") is None:
    require_mxnet("lib.inference")  # a plain interpreter without either back end: one line naming the one to use

__all__ = ["Detector", "Detections"]
_HOMES = {"Detector": "lib.inference.detector", "Detections": "lib.inference.detections"}


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'lib.inference' has no attribute {name!r}")
