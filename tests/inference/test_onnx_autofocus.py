"""AutoFocus end to end on ONNX Runtime (TEST.AUTO_FOCUS with TEST.BACKEND onnxruntime, main_test.py --backend
onnxruntime): the export carries the FocusPixel map (body output scale_prob), the FocusChips the runtime picks
are MXNet's, level by level, and the tester's COCO evaluation is MXNet's."""
import json
import os

import mxnet as mx
import pytest

pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from detector_helpers import random_tiny_params  # noqa: E402
from lib.config import with_overrides  # noqa: E402
from lib.dataset.roidb import load_roidb  # noqa: E402
from lib.inference import tester  # noqa: E402
from lib.inference.autofocus import AutoFocus, AutoFocusStats  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.streaming import RoidbImages  # noqa: E402

AUTO_FOCUS = {"network.AUTO_FOCUS": True, "TEST.AUTO_FOCUS": True, "TEST.BATCH_IMAGES": 1,
              "TEST.SCALES": [[48, 64], [96, 128], [160, 224]],  # coarsest first
              "TEST.VALID_RANGES": [[20, -1], [10, 60], [-1, 30]], "TEST.DO_PRUNING": [False, True, True],
              "TEST.CHIP_HYPERPARAMS": [[1, 0.5, 2], [1, 0.5, 2], [-1, -1, -1]], "TEST.SCORE_THRESH": 0.0}


@pytest.fixture(scope="module")
def focus_checkpoint(tiny, tmp_path_factory):
    """The tiny AutoFocus network with random parameters saved as the checkpoint TEST.MODEL of the tiny set."""
    cfg = with_overrides(tiny[0], AUTO_FOCUS)
    arg_params, aux_params = random_tiny_params(cfg)
    params = str(tmp_path_factory.mktemp("focus") / "focus-0001.params")
    mx.nd.save(params, {**{f"arg:{k}": v for k, v in arg_params.items()},
                        **{f"aux:{k}": v for k, v in aux_params.items()}})
    return with_overrides(cfg, {"TEST.MODEL": params})


def test_the_focus_chips_on_onnx_runtime_are_mxnets(focus_checkpoint):
    cfg = focus_checkpoint
    classes = ["__background__", "cat4", "cat9"]
    roidb, _ = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    roidb = [entry for entry in roidb if not entry["image"].endswith("broken.jpg")]
    found = {}
    for backend in ("mxnet", "onnxruntime"):
        detector = Detector.from_config(with_overrides(cfg, {"TEST.BACKEND": backend}), cfg.TEST.MODEL, classes)
        assert isinstance(detector.strategy, AutoFocus) and (backend == "mxnet") == (detector.module is not None)
        stats, chips = AutoFocusStats(), []
        detections = dict(detector.strategy.run(RoidbImages(roidb), stats=stats,
                                                on_region=lambda level, region, result, picked: chips.append(
                                                    (level, region.image, [tuple(c) for c in picked]))))
        found[backend] = (stats.levels, chips, detections)
    (mx_levels, mx_chips, _), (ort_levels, ort_chips, _) = found["mxnet"], found["onnxruntime"]
    assert ort_levels == mx_levels and ort_chips == mx_chips
    pruned = [level for level in mx_levels[1:] if level.pixels < level.full_pixels]
    assert pruned and all(level.regions > 0 for level in mx_levels[1:])  # chips picked, not whole images


def test_the_tester_with_autofocus_on_onnx_runtime_scores_as_on_mxnet(focus_checkpoint, tmp_path):
    on_mxnet = tester.test(focus_checkpoint, out_dir=str(tmp_path / "mxnet"))
    on_onnx = tester.test(with_overrides(focus_checkpoint, {"TEST.BACKEND": "onnxruntime"}),
                          out_dir=str(tmp_path / "onnx"))
    assert on_mxnet["tested"] == on_onnx["tested"] == 3
    rounded = [{key: round(value, 3) for key, value in summary["stats"].items()} for summary in (on_mxnet, on_onnx)]
    assert rounded[0] == rounded[1] and on_mxnet["stats"]["AR100"] > 0
    with open(on_mxnet["results"]) as f, open(on_onnx["results"]) as g:
        assert len(json.load(f)) == len(json.load(g)) > 0
    assert os.path.isfile(os.path.join(os.path.dirname(focus_checkpoint.TEST.MODEL), "onnx", "focus-0001",
                                       "model.json"))
