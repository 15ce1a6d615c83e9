"""The float16 ONNX export (tools/export_model.py --format onnx --fp16, onnx_export.float16_model): the layers in
float16 with float32 inputs and outputs and the deformable operators' sampling coordinates in float32; its outputs
within the tolerance measured against the float32 export's, and the whole test running on it."""
import os

import cv2
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
ort = pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from detector_helpers import random_tiny_params  # noqa: E402
from lib.boxes import bbox_overlaps  # noqa: E402
from lib.config import load_config  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.export import export_onnx_params  # noqa: E402
from lib.inference.onnx_network import OnnxNetwork  # noqa: E402

from lib.bootstrap import ROOT  # noqa: E402
CLASSES = ["__background__", "a", "b"]
FLOAT, HALF = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{False: float32 folder, True: float16 folder} of the tiny network's random parameters."""
    cfg = load_config(os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml"),
                      [("TEST.fp16", "false"), ("gpus", ""), ("dataset.NUM_CLASSES", "3")])
    params = random_tiny_params(cfg)
    folders = {}
    for fp16 in (False, True):
        folders[fp16] = str(tmp_path_factory.mktemp("fp16" if fp16 else "fp32"))
        export_onnx_params(cfg, CLASSES, *params, folders[fp16], fp16=fp16)
    return folders


def test_the_layers_are_float16_the_inputs_outputs_and_sampling_coordinates_float32(exports):
    for name in ("body", "head"):
        model = onnx.shape_inference.infer_shapes(onnx.load(os.path.join(exports[True], f"{name}.onnx")))
        onnx.checker.check_model(model, full_check=True)
        assert {t.type.tensor_type.elem_type for t in (*model.graph.input, *model.graph.output)} == {FLOAT}
        weights = {t.name: t.data_type for t in model.graph.initializer}
        types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
        layers = [node for node in model.graph.node if node.op_type in ("Conv", "DeformConv", "Gemm")]
        assert layers and all(weights[node.input[1]] == HALF for node in layers)
        coordinates = [out for node in model.graph.node if node.op_type in ("Floor", "Ceil", "Where", "Range")
                       for out in node.output]
        assert coordinates and {types[name] for name in coordinates if name in types} <= {FLOAT, onnx.TensorProto.INT64}
    with open(os.path.join(exports[True], "model.json")) as f:
        assert '"precision": "float16"' in f.read()


def smooth_image(seed, height, width):
    rng = np.random.default_rng(seed)
    return cv2.GaussianBlur(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), (5, 5), 2)


def test_the_float16_outputs_agree_with_float32_within_the_measured_tolerance(exports):
    """Body outputs on one image, head outputs on the float32 body's features and proposals: measured here
    (largest difference / largest float32 value) 0.05% (rpn_cls_prob), 0.06% (rpn_bbox_pred), 0.05% (features),
    0.001% (cls_prob), 0.12% (bbox_pred); allowed 1% of the largest."""
    image = smooth_image(0, 96, 128).astype(np.float32) - 128
    data, im_info = np.ascontiguousarray(image.transpose(2, 0, 1)[None]), np.array([[96, 128, 1]], np.float32)
    networks = {fp16: OnnxNetwork(folder) for fp16, folder in exports.items()}
    body = {fp16: dict(zip((o.name for o in network.sessions["body"].get_outputs()),
                           network.sessions["body"].run(None, {"data": data}))) for fp16, network in networks.items()}
    rois = networks[False].forward(data, im_info)["rois_output"][:, 1:].reshape(1, -1, 4)
    head = {fp16: dict(zip(("cls_prob", "bbox_pred"), network.sessions["head"].run(
        None, {"features": body[False]["features"], "rois": rois}))) for fp16, network in networks.items()}
    for outputs in (body, head):
        for name, expected in outputs[False].items():
            found = outputs[True][name]
            assert found.dtype == np.float32 and found.shape == expected.shape
            difference = np.abs(found - expected).max() / np.abs(expected).max()
            assert 0 < difference <= 0.01, (name, difference)  # float16 indeed, and close


def test_the_pooled_rows_stay_exact_on_large_maps(exports):
    """The deformable RoI pooling gathers rows b * H * W + y * W + x of the feature map: float32 indices, also
    beyond 2048 (float16's last exact integer), here 2 x 96 x 96 rows with rois reaching the last ones."""
    features = np.random.default_rng(1).normal(size=(2, 16, 96, 96)).astype(np.float32)
    rois = np.tile(np.array([[0, 0, 1535, 1535], [1500, 1490, 1535, 1535], [3, 4, 50, 60]], np.float32), (2, 1, 1))
    expected, found = (OnnxNetwork(exports[fp16]).sessions["head"].run(None, {"features": features, "rois": rois})
                       for fp16 in (False, True))
    for a, b in zip(expected, found):
        assert np.abs(a - b).max() <= 0.01 * np.abs(a).max()


def test_the_whole_test_runs_on_the_float16_export(exports, caplog):
    """Detector.from_onnx on the float16 export: as many detections as float32's, and each image's best one
    is float32's best (IoU >= 0.9, score within 0.01; measured: IoU 0.9997, 1e-5). On the CPU provider one
    line warns that float16 is no faster there."""
    images = [smooth_image(seed, h, w) for seed, (h, w) in enumerate(((60, 80), (90, 50)))]
    expected = Detector.from_onnx(exports[False]).detect(images)
    assert "float16" not in caplog.text
    found = Detector.from_onnx(exports[True]).detect(images)
    assert "a float16 export on ONNX Runtime's CPU provider" in caplog.text
    for rows, half in zip(expected, found):
        assert len(rows) == len(half) > 0
        best, best_half = rows[np.argmax(rows[:, 4])], half[np.argmax(half[:, 4])]
        assert best[5] == best_half[5] and abs(best[4] - best_half[4]) <= 0.01
        assert bbox_overlaps(best[None, :4].astype(np.float32), best_half[None, :4].astype(np.float32))[0, 0] >= 0.9
