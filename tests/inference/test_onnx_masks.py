"""A TRAIN.WITH_MASK network's ONNX export (its third graph, mask.onnx) on ONNX Runtime: the same detections and
the same masks as MXNet's, pasted and RLE-encoded by the project's one implementation (lib/inference/masks.py),
and without MXNet in the process."""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from detector_helpers import WITHOUT_MXNET  # noqa: E402
from network_helpers import mask_network_params  # noqa: E402
from pycocotools import mask as mask_utils  # noqa: E402

from lib.boxes import bbox_overlaps  # noqa: E402
from lib.config import load_config  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.export import export_onnx_params  # noqa: E402
from lib.inference.masks import image_segmentations  # noqa: E402
from lib.inference.regions import RegionPlan  # noqa: E402
from lib.inference.streaming import ArrayImages  # noqa: E402

from lib.bootstrap import ROOT  # noqa: E402
CLASSES = ["__background__", "a", "b", "c"]


@pytest.fixture(scope="module")
def mask_export(tmp_path_factory):
    """(cfg, (args, aux), export folder) of the tiny mask network with random parameters (two overlapping
    levels, so that detections take their masks from either)."""
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.WITH_MASK": True, "TEST.fp16": False, "gpus": "",
                             "TEST.SCALES": [1.0, 0.5], "TEST.VALID_RANGES": [[-1, 32], [20, -1]],
                             "TEST.BATCH_IMAGES": 1})
    params = mask_network_params(cfg)
    folder = str(tmp_path_factory.mktemp("onnx_masks") / "export")
    export_onnx_params(cfg, CLASSES, *params, folder)
    return cfg, params, folder


def images(seed=4, shapes=((48, 64), (70, 30))):
    rng = np.random.RandomState(seed)
    return [rng.randint(0, 255, (h, w, 3)).astype(np.uint8) for h, w in shapes]


def test_the_export_of_a_mask_network_has_its_mask_graph(mask_export):
    _, _, folder = mask_export
    assert sorted(os.listdir(folder)) == ["body.onnx", "head.onnx", "mask.onnx", "model.json"]
    model = onnx.load(os.path.join(folder, "mask.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["features", "rois"]
    assert [o.name for o in model.graph.output] == ["mask_prob"]
    assert {"ConvTranspose", "Gather", "MatMul"} <= {node.op_type for node in model.graph.node}


def _matched(expected, found):
    """Per row of ``expected`` Detections the index of its partner in ``found``: same label, IoU >= 0.99, score
    within 1e-3 (the box test's criteria); every row has one and the counts agree."""
    assert len(expected) == len(found) > 0
    partners = []
    for box, score, label in zip(expected.boxes, expected.scores, expected.labels):
        overlaps = bbox_overlaps(box[None].astype(np.float32), found.boxes.astype(np.float32))[0]
        close = np.flatnonzero((overlaps >= 0.99) & (found.labels == label) & (np.abs(found.scores - score) <= 1e-3))
        assert len(close), (box, score, label)
        partners.append(close[np.argmax(overlaps[close])])
    return partners


def mask_iou(a, b):
    union = (a | b).sum()
    return 1.0 if union == 0 else (a & b).sum() / union


def test_onnx_runtime_gives_mxnets_masks(mask_export):
    """The Python API's masks (det(image)): every detection matched as in the box test, its mask IoU with
    MXNet's >= 0.99 (measured: 1.0 on these images, the maps agree to ~1e-6), masks informative."""
    cfg, (args, aux), folder = mask_export
    on_mxnet = Detector.from_params(cfg, CLASSES, args, aux, contexts=[mx.cpu()])
    on_onnx = Detector.from_onnx(folder)
    assert on_onnx.mask_head is not None
    assert type(on_onnx.network.sessions["mask"]).__name__ == "CompiledPoolingGraph"  # the pooling of lib/ops
    ious = []
    for image in images():
        expected, found = on_mxnet(image), on_onnx(image)
        assert found.masks.shape == expected.masks.shape == (len(expected),) + image.shape[:2]
        for row, partner in enumerate(_matched(expected, found)):
            ious.append(mask_iou(expected.masks[row], found.masks[partner]))
        assert 0.05 < expected.masks.mean() < 0.95  # informative masks, not all or nothing
    assert min(ious) >= 0.99, sorted(ious)[:5]


def test_the_rles_of_the_tester_agree(mask_export):
    """The tester's path (lib.inference.masks.image_segmentations: the mask pass on the run's plan, RLEs from
    the boxes' pixels): on the same detections, the two back ends' RLEs overlap at IoU >= 0.99 each."""
    cfg, (args, aux), folder = mask_export
    batch = images(seed=5, shapes=((60, 50), (40, 72)))
    rles = []
    for detector in (Detector.from_params(cfg, CLASSES, args, aux, contexts=[mx.cpu()]), Detector.from_onnx(folder)):
        plan = RegionPlan()
        rows = detector.detect(batch, plan=plan)
        rles.append((rows, dict(image_segmentations(detector.mask_head, ArrayImages(batch), dict(enumerate(rows)),
                                                    plan))))
    (rows_mxnet, rles_mxnet), (rows_onnx, rles_onnx) = rles
    for index in range(len(batch)):
        assert len(rows_mxnet[index]) == len(rows_onnx[index]) == len(rles_mxnet[index]) > 0
        order_mxnet = np.lexsort(rows_mxnet[index][:, [3, 2, 1, 0, 5]].T)
        order_onnx = np.lexsort(rows_onnx[index][:, [3, 2, 1, 0, 5]].T)
        np.testing.assert_allclose(rows_mxnet[index][order_mxnet], rows_onnx[index][order_onnx], atol=1e-3)
        encoded = [[{**rle, "counts": rle["counts"].encode("ascii")} for rle in found[index]]
                   for found in (rles_mxnet, rles_onnx)]
        pairs = [[found[i] for i in order] for found, order in zip(encoded, (order_mxnet, order_onnx))]
        ious = np.diag(mask_utils.iou(*pairs, [0] * len(order_onnx)))
        empty = (mask_utils.area(pairs[0]) == 0) & (mask_utils.area(pairs[1]) == 0)  # pycocotools' IoU: 0
        assert np.where(empty, 1.0, ious).min() >= 0.99 and empty.mean() < 0.5


def test_masks_on_onnx_runtime_need_no_mxnet(mask_export, tmp_path):
    """The mask pass of the ONNX export in a child process in which importing mxnet fails."""
    _, _, folder = mask_export
    image = images()[0]
    np.save(tmp_path / "image.npy", image)
    script = WITHOUT_MXNET + f"""
import numpy as np
from lib.inference import Detector
found = Detector.from_onnx({folder!r})(np.load({str(tmp_path / "image.npy")!r}))
np.save({str(tmp_path / "masks.npy")!r}, found.masks)
assert not [name for name in sys.modules if name.split(".")[0] == "mxnet"]
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "masks.npy"), Detector.from_onnx(folder)(image).masks)
