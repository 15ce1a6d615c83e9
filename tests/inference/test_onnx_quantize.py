"""Int8 quantisation of an ONNX export's body (lib/inference/onnx_quantize.py, tools/export_model.py
--quantize int8): what is quantised and what stays float32, the calibration inputs, the outputs' error,
and the one-line refusals."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
ort = pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from lib.config import with_overrides  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.export import export_onnx  # noqa: E402
from lib.inference.onnx_quantize import (QuantizationError, calibration_batches, calibration_images,  # noqa: E402
                                         check_quantization, offset_convolutions, quantize_export)

from lib.bootstrap import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tools"))


def test_offset_convolutions_are_those_feeding_a_deformable_convolutions_offsets():
    """A hand-made graph: conv_a feeds DeformConv's data (and the offsets' reshape its shape only), conv_b its
    offsets through a Reshape and an Add of another conv's output (conv_c), conv_d feeds nothing deformable."""
    node = helper.make_node
    nodes = [node("Conv", ["x", "w"], ["a"], name="conv_a"), node("Conv", ["x", "w"], ["b"], name="conv_b"),
             node("Conv", ["x", "w"], ["c"], name="conv_c"), node("Shape", ["a"], ["s"], name="shape"),
             node("Reshape", ["b", "s"], ["b2"], name="reshape"),
             node("Add", ["b2", "c"], ["offsets"], name="add"),
             node("DeformConv", ["a", "w", "offsets"], ["y"], name="deform"),
             node("Conv", ["y", "w"], ["z"], name="conv_d")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    assert offset_convolutions(graph) == ["conv_b", "conv_c"]


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory):
    """(cfg, float export folder, int8 export folder calibrated on the tiny test set's first 2 images)."""
    from detector_helpers import save_test_params

    folder = tmp_path_factory.mktemp("quantize")
    cfg = with_overrides(tiny[0], {"TEST.MODEL": str(folder / "tiny-0001.params")})
    save_test_params(cfg.TEST.MODEL, *tiny[1:])
    export_onnx(cfg, str(folder / "float"))
    shutil.copytree(folder / "float", folder / "int8")
    quantize_export(str(folder / "int8"), calibration_images(cfg, 2))
    return cfg, str(folder / "float"), str(folder / "int8")


def test_the_body_is_int8_but_the_deformable_parts_and_the_head_stay_float(exports):
    _, float_folder, int8_folder = exports
    body = onnx.load(os.path.join(int8_folder, "body.onnx"))
    onnx.checker.check_model(body, full_check=True)
    ops = [node.op_type for node in body.graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > ops.count("QuantizeLinear")
    int8_weights = [t.name for t in body.graph.initializer if t.data_type == TensorProto.INT8]
    assert len(int8_weights) >= 10  # the convolutions' weights, per channel
    producers = {output: node for node in body.graph.node for output in node.output}
    convs = [node for node in body.graph.node if node.op_type == "Conv"]
    quantized = [node for node in convs if producers.get(node.input[1]) is not None
                 and producers[node.input[1]].op_type == "DequantizeLinear"]
    floats = {node.name for node in convs} - {node.name for node in quantized}
    description = json.load(open(os.path.join(int8_folder, "model.json")))
    assert floats == set(offset_convolutions(body.graph)) == set(description["quantization"]["float_nodes"]) != set()
    deform = [node for node in body.graph.node if node.op_type == "DeformConv"]
    weights = {t.name: t.data_type for t in body.graph.initializer}
    assert deform and all(weights[node.input[1]] == TensorProto.FLOAT for node in deform)
    assert description["quantization"]["body"] == "int8" and description["quantization"]["head"] == "float32"
    for name in ("head.onnx",):
        assert open(os.path.join(int8_folder, name), "rb").read() == open(os.path.join(float_folder, name),
                                                                           "rb").read()


def test_the_int8_body_stays_close_to_the_float_one(exports):
    """On a test image the quantised body's features and RPN maps differ from float32's by a few percent
    of their range, and not by nothing (quantised)."""
    cfg, float_folder, int8_folder = exports
    image = calibration_images(cfg, 3)[2]  # not a calibration image
    batch = calibration_batches(Detector.from_onnx(float_folder), [image])[0]
    outputs = []
    for folder in (float_folder, int8_folder):
        session = ort.InferenceSession(os.path.join(folder, "body.onnx"), providers=["CPUExecutionProvider"])
        outputs.append(dict(zip([o.name for o in session.get_outputs()], session.run(None, {"data": batch}))))
    for name in ("features", "rpn_bbox_pred", "rpn_cls_prob"):
        reference, found = outputs[0][name], outputs[1][name]
        error = np.abs(found - reference).max() / np.abs(reference).max()
        assert 0 < error < 0.1, (name, error)


def test_calibration_records_the_canvases_of_every_scale_and_restores_the_network(exports):
    cfg, float_folder, _ = exports
    detector = Detector.from_onnx(float_folder)
    image = calibration_images(cfg, 1)[0]
    before = detector.detect([image])[0]
    batches = calibration_batches(detector, [image])
    assert "forward" not in vars(detector.network)  # the class's method again
    np.testing.assert_array_equal(detector.detect([image])[0], before)
    assert len(batches) == len(cfg.TEST.SCALES) and all(b.dtype == np.float32 and b.shape[:2] == (1, 3)
                                                        for b in batches)
    for batch, (short, long) in zip(sorted(batches, key=lambda b: -b.shape[3]), cfg.TEST.SCALES):
        assert max(batch.shape[2:]) <= long and min(batch.shape[2:]) <= short


def test_the_int8_export_runs_the_whole_test_and_finds_what_float_finds(exports):
    """The best 20 float32 detections of each test image: at least 3 in 4 have an int8 one of the same class at
    IoU >= 0.7 (random weights: many near-tied proposals, so this is a loose bound; 17-19 of 20 here)."""
    from lib.boxes import bbox_overlaps

    cfg, float_folder, int8_folder = exports
    images = calibration_images(cfg, 3)
    found, expected = Detector.from_onnx(int8_folder).detect(images), Detector.from_onnx(float_folder).detect(images)
    for image_found, image_expected in zip(found, expected):
        best = image_expected[np.argsort(-image_expected[:, 4])[:20]]
        overlaps = bbox_overlaps(best[:, :4].astype(np.float32), image_found[:, :4].astype(np.float32))
        matched = ((overlaps >= 0.7) & (best[:, 5:6] == image_found[None, :, 5])).any(axis=1)
        assert len(best) == 20 and matched.mean() >= 0.75, matched.mean()


def test_what_cannot_be_quantized_is_refused_in_one_line(exports, tmp_path):
    for quantize, calibration, message in (("fp16", 4, "quantization 'fp16' is not supported"),
                                           ("int8", 0, "needs at least 1 calibration image")):
        with pytest.raises(QuantizationError, match=message) as excinfo:
            check_quantization(quantize, calibration)
        assert "\n" not in str(excinfo.value)
    with pytest.raises(QuantizationError, match="is already quantized"):
        quantize_export(exports[2], calibration_images(exports[0], 1))
    import export_model  # tools/

    with pytest.raises(QuantizationError, match="only the ONNX export is quantized"):
        export_model.parse_args(["--cfg", "c.yml", "--out", "x", "--quantize", "int8"])
    with pytest.raises(QuantizationError, match="calibration images are for --quantize int8"):
        export_model.parse_args(["--cfg", "c.yml", "--out", "x", "--format", "onnx", "--calibration", "4"])
    assert export_model.parse_args(["--cfg", "c.yml", "--out", "x", "--format", "onnx", "--quantize",
                                    "int8"]).calibration == export_model.DEFAULT_CALIBRATION
    with pytest.raises(QuantizationError, match="--fp16 with --quantize int8: the quantiser takes the float32"):
        export_model.parse_args(["--cfg", "c.yml", "--out", "x", "--format", "onnx", "--fp16", "--quantize", "int8"])


def test_export_tool_quantizes_on_the_test_set(exports, tmp_path):
    from lib.config.core import dump_config

    cfg, _, int8_folder = exports
    config = tmp_path / "tiny.yml"
    config.write_text(dump_config(cfg))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--cfg", str(config),
                             "--model", cfg.TEST.MODEL, "--format", "onnx", "--out", str(tmp_path / "tool"),
                             "--quantize", "int8", "--calibration", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    described = json.load(open(tmp_path / "tool" / "model.json"))["quantization"]
    assert described == json.load(open(os.path.join(int8_folder, "model.json")))["quantization"]
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--cfg", str(config),
                          "--out", str(tmp_path / "bad"), "--quantize", "int8"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "only the ONNX export is quantized" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # four back ends in a subprocess: ~30 s (100 s loaded); the quantisation itself is tested above
def test_the_inference_benchmark_has_an_int8_row_beside_the_float_ones(tmp_path):
    """... and the float export's head run whole (onnxruntime-graph) beside its compiled pooling (onnxruntime)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "benchmark_inference.py"), "--cfg",
                             os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml"), "--set", "gpus", "",
                             "TEST.fp16", "false", "TEST.NUM_PROCESS", "0", "--no_gluoncv", "--images", "1", "--runs",
                             "1", "--image_size", "64", "96", "--backend", "mxnet", "onnxruntime", "onnxruntime-int8",
                             "onnxruntime-graph"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1:3] for line in result.stdout.splitlines() if line.startswith("| SNIPER")]
    assert [(model.strip(), test.strip()) for model, test in rows] == [
        (f"SNIPER resnet_tiny, {backend}", test) for test in ("single-scale", "multi-scale")
        for backend in ("mxnet", "onnxruntime", "onnxruntime-graph", "onnxruntime-int8")]


def test_the_profile_tool_shows_int8_convolutions_and_the_pooling_per_setting(exports, tmp_path):
    tool = [sys.executable, os.path.join(ROOT, "tools", "profile_onnx.py")]
    result = subprocess.run([*tool, "--model", exports[2], "--canvas", "64", "96", "--rois", "10", "--runs", "1",
                             "--optimization", "basic", "all", "--threads", "1", "--top", "30"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    settings = result.stdout.split("\noptimization ")[1:]
    assert [s.split(":")[0] for s in settings] == ["basic, 1 threads", "all, 1 threads"]
    rows = [[cell.strip() for cell in line.split("|")[1:3]] for line in settings[1].splitlines() if line[:3] == "| b"
            or line[:3] == "| h"]
    assert ["body", "QLinearConv"] in rows and ["body", "DeformConv"] in rows and ["head", "RoiAlign"] in rows
    assert "(body int8)" in result.stdout.splitlines()[0]
    missing = subprocess.run([*tool, "--model", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "model.json not found" in missing.stderr


def test_batch_norms_become_the_same_per_channel_affine_map():
    """A BatchNormalization (epsilon 1e-3) and its Mul + Add rewrite on ONNX Runtime, against NumPy's
    (x - mean) / sqrt(var + eps) * gamma + beta."""
    from lib.inference.onnx_quantize import batch_norms_as_affine

    rng = np.random.default_rng(4)
    gamma, beta, mean = (rng.normal(size=5).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.1, 3, 5).astype(np.float32)
    x = rng.normal(size=(2, 5, 3, 4)).astype(np.float32)
    tensors = [numpy_helper.from_array(v, n) for v, n in ((gamma, "g"), (beta, "b"), (mean, "m"), (var, "v"))]
    graph = helper.make_graph([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], name="bn",
                                                epsilon=1e-3)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 3, 4])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    affine = batch_norms_as_affine(model)
    assert [node.op_type for node in affine.graph.node] == ["Mul", "Add"]
    assert sorted(t.name for t in affine.graph.initializer) == ["bn_scale", "bn_shift"]
    found = ort.InferenceSession(affine.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    shape = (1, 5, 1, 1)
    expected = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * gamma.reshape(shape) + \
        beta.reshape(shape)
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)
