"""tools/compare_lanes.py's judging: two lanes' dumps with the same content compare as 0 everywhere; a change
in one quantity shows in that quantity alone, as the size of the change (or inf where numbers cannot differ)."""
import json
import os
import sys

import numpy as np
import pytest

from lib.bootstrap import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import compare_lanes  # noqa: E402


def write_lane(folder, loss=0.5, box=(0.0, 0.0, 31.0, 31.0), weight=1.0, pixel=7, score=0.9, bbox_x=10.0):
    """A dump as --dump writes it, with the few values the tests change."""
    run = folder / "train" / "output" / "sniper_synthetic_tiny"
    (run / "results" / "val").mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for batch in range(3):
            f.write(json.dumps({"epoch": 1, "batch": batch, "RPNLogLoss": loss + batch, "seconds": batch * 1.7}) + "\n")
    detections = [{"image_id": 1, "category_id": 2, "bbox": [bbox_x, 5.0, 20.0, 30.0], "score": score}]
    for results in (run / "results" / "val", folder / "test_a" / "results" / "val"):
        results.mkdir(parents=True, exist_ok=True)
        (results / "detections_val_results.json").write_text(json.dumps(detections))
    (folder / "versions.json").write_text(json.dumps({"run": str(run)}))
    annotations = np.frombuffer(b'{"images": []}', np.uint8)
    np.savez(folder / "dataset.npz", **{"images/1.jpg": np.full((4, 4, 3), pixel, np.uint8),
                                       "annotations/instances_train.json": annotations})
    np.savez(folder / "chips.npz", image_index=[0, 1], box=[box, box], valid_boxes=np.array(["[0]", "[1, 2]"]))
    np.savez(folder / "batches.npz", **{"0/data": np.zeros((2, 3, 8, 8), np.float32),
                                       "0/label": np.array([[1, -1]], np.float32)})
    np.savez(folder / "weights.npz", conv0_weight=np.array([weight, -2.0], np.float32))


@pytest.mark.parametrize("change, quantity, expected", [
    ({}, None, 0.0),
    ({"loss": 0.5 * (1 + 1e-3)}, "training losses (relative)", 1e-3),
    ({"box": (0.0, 0.0, 31.0, 32.0)}, "chips of epoch 0", 1.0),
    ({"weight": 1.5}, "checkpoint weights (relative)", 0.25),  # 0.5 of the largest magnitude, 2
    ({"pixel": 9}, "dataset images (pixel values)", 2.0),
    ({"score": 0.8}, "detections of lane A's checkpoint (scores)", 0.1),
    ({"bbox_x": 10.5}, "detections of lane A's checkpoint (boxes, px)", 0.5),
])
def test_a_change_shows_in_its_quantity_alone(tmp_path, change, quantity, expected):
    write_lane(tmp_path / "a")
    write_lane(tmp_path / "b", **change)
    differences = compare_lanes.compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert set(differences) == set(compare_lanes.TOLERANCES)
    for name, difference in differences.items():
        assert difference == pytest.approx(expected if name == quantity else 0.0, rel=1e-4, abs=1e-9), name


def test_what_cannot_differ_in_size_is_infinitely_different(tmp_path):
    write_lane(tmp_path / "a")
    write_lane(tmp_path / "b")
    np.savez(tmp_path / "b" / "chips.npz", image_index=[0, 1, 2], box=[(0, 0, 1, 1)] * 3,
             valid_boxes=np.array(["[0]", "[1, 2]", "[]"]))  # another number of chips
    (tmp_path / "b" / "test_a" / "results" / "val" / "detections_val_results.json").write_text("[]")
    differences = compare_lanes.compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert differences["chips of epoch 0"] == float("inf")
    assert differences["detections of lane A's checkpoint (scores)"] == float("inf")
    assert differences["loader batches"] == 0.0
