"""The scripted ONNX Runtime GPU measurement (tools/onnx_gpu_prep.sh, tools/onnx_gpu_model.py,
tools/onnx_gpu/device_run.py) rehearsed on the CPU provider: the weightless float32 and float16 models, the
device side making their weights from a seed and timing both precisions end to end and in the network alone,
without MXNet; the ResNet-101 models small enough for one device call (slow)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from detector_helpers import WITHOUT_MXNET  # noqa: E402

from lib.bootstrap import ROOT  # noqa: E402
CALL_BYTES = 64 * 2 ** 20  # what one device call carries


def weightless_models(cfg, out, *overrides):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "onnx_gpu_model.py"), "--cfg", cfg, "--set",
                             "dataset.NUM_CLASSES", "81", *overrides, "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["float16", "float32"]
    for precision in ("float16", "float32"):
        assert sorted(os.listdir(out / precision)) == ["body.onnx", "head.onnx", "model.json", "weights.json"]
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(out) for name in names)


def test_the_device_run_rehearses_on_the_cpu_without_mxnet(tmp_path):
    model = tmp_path / "model"
    weightless_models(os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml"), model,
                      "TEST.SCALES", "[[96, 128], [64, 96], [32, 48]]")  # three small scales: seconds
    with open(model / "float16" / "weights.json") as f:
        places = json.load(f)
    assert {entry["dtype"] for entry in places["body"]} == {"float16"}  # the layers' float16 copies
    out = tmp_path / "onnx_gpu.json"
    script = WITHOUT_MXNET + f"""
import runpy
sys.argv = ["device_run.py", "--model", {str(model)!r}, "--provider", "cpu", "--images", "1", "--image_size", "64",
            "96", "--runs", "1", "--seconds", "300", "--out", {str(out)!r}]
runpy.run_path("tools/onnx_gpu/device_run.py", run_name="__main__")
assert not [name for name in sys.modules if name.split(".")[0] == "mxnet"]
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out) as f:
        found = json.load(f)
    assert found["provider"] == "cpu" and [p["precision"] for p in found["precisions"]] == ["float32", "float16"]
    for precision in found["precisions"]:
        assert precision["session_providers"] == ["CPUExecutionProvider"] and len(precision["scales"]) == 3
        assert precision["images_per_s"] > 0 and precision["network_images_per_s"] >= precision["images_per_s"]
        assert precision["runs"][0]["detections"] > 0
    assert os.path.getsize(model / "float32" / "body-weights.bin") == 2 * os.path.getsize(
        model / "float16" / "body-weights.bin")  # made on the device, each of its precision


@pytest.mark.slow
def test_the_resnet101_models_fit_one_device_call(tmp_path):
    """Both precisions of ResNet-101 without their weights: measured 0.42 MiB (the weights, ~240 MB in float32,
    are made on the device)."""
    assert weightless_models(os.path.join(ROOT, "configs", "faster", "sniper_res101_e2e.yml"),
                             tmp_path / "model") < CALL_BYTES
