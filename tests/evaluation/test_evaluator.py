"""COCO and VOC evaluation against hand-worked cases and pycocotools run directly on the same files."""
import contextlib
import io
import json
import os

import numpy as np
import pytest
from pycocotools.cocoeval import COCOeval

from lib.atomic import write_json
from lib.bootstrap import ROOT
from lib.evaluation.coco_summary import defined
from lib.evaluation.metrics import coco_results, evaluate_coco, evaluate_voc, voc_ap, voc_class_ap
from dataset_helpers import indexed_coco

# Contiguous label l is COCO category CATEGORY_IDS[l]: non-contiguous ids as in COCO itself.
CATEGORY_IDS = [0, 3, 7]
# Small boxes, so an off-by-one in the width conversion visibly costs IoU (and AP at 0.95).
GT = {  # image id -> [(x1, y1, x2, y2 inclusive), contiguous label]
    11: [((10, 10, 19, 19), 1), ((40, 40, 51, 49), 2)],
    12: [((5, 8, 14, 21), 1)],
}


def make_coco_gt():
    images = [{"id": i, "width": 64, "height": 64, "file_name": f"{i}.jpg"} for i in GT]
    annotations = []
    for image_id, objects in GT.items():
        for (x1, y1, x2, y2), label in objects:
            w, h = x2 - x1 + 1, y2 - y1 + 1
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": CATEGORY_IDS[label],
                                "bbox": [x1, y1, w, h], "area": w * h, "iscrowd": 0})
    return indexed_coco(images, annotations, CATEGORY_IDS)


def perfect_detections():
    return [np.array([[*box, 0.9, label] for box, label in GT[i]], np.float32) for i in GT]


def run(tmp_path, detections):
    path = os.path.join(tmp_path, "results.json")
    write_json(coco_results(detections, list(GT), CATEGORY_IDS), path)
    return path, evaluate_coco(make_coco_gt(), path, str(tmp_path), image_ids=list(GT))


def test_results_entries_are_coco_format():
    dets = [np.array([[10, 20, 19, 39, 0.5, 2]], np.float32), np.zeros((0, 6), np.float32)]
    assert coco_results(dets, [5, 6], CATEGORY_IDS) == [
        {"image_id": 5, "category_id": 7, "bbox": [10.0, 20.0, 10.0, 20.0], "score": 0.5}]


def test_results_precision_is_the_reference_s():
    # scores with 8 decimals, boxes with 1 (the reference's coco.py); 0.25 and 100.75 are exact binary ties:
    # Python 2's round sends them away from zero, Python 3's round to the even digit
    dets = [np.array([[10.25, 20.75, 19.04, 39.06, 0.123456789, 2], [-0.25, 0, 5, 5, 0.001953125, 2]])]
    entries = coco_results(dets, [5], CATEGORY_IDS)
    assert [e["bbox"] for e in entries] == [[10.3, 20.8, 9.8, 19.3], [-0.3, 0.0, 6.3, 6.0]]
    # 0.001953125 = 1/512, a tie at 8 decimals; 0.123456789 is not one
    assert [e["score"] for e in entries] == [0.12345679, 0.00195313]
    assert round(0.25, 1) == 0.2 and round(0.001953125, 8) == 0.00195312  # what Python 3 alone would write


def test_reference_round_agrees_with_decimal_half_up_on_random_values():
    from decimal import ROUND_HALF_UP, Decimal

    from lib.evaluation.metrics import reference_round

    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-1000, 1000, 2000), rng.integers(-4000, 4000, 500) / 4.0,
                             rng.integers(0, 512, 200) / 512.0])
    for digits in (1, 8):
        expected = [float(Decimal(v).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP)) for v in values.tolist()]
        assert reference_round(values, digits) == expected


def test_label_outside_categories_is_rejected():
    with pytest.raises(ValueError, match="image 5: label 3"):
        coco_results([np.array([[0, 0, 1, 1, 0.5, 3]], np.float32)], [5], CATEGORY_IDS)


def test_perfect_detections_give_ap_one(tmp_path):
    _, stats = run(tmp_path, perfect_detections())
    assert stats["AP"] == pytest.approx(1.0)
    assert stats["AP50"] == pytest.approx(1.0)
    lines = open(tmp_path / "coco_summary.txt").read().rstrip().splitlines()
    assert len(lines) == 12 and lines[0].startswith(" Average Precision  (AP) @[ IoU=0.50:0.95")
    assert json.load(open(tmp_path / "coco_stats.json")) == stats


def test_wrong_category_mapping_scores_zero(tmp_path):
    swapped = [np.hstack([d[:, :5], 3 - d[:, 5:]]) for d in perfect_detections()]
    assert run(tmp_path, swapped)[1]["AP"] == pytest.approx(0.0)


def test_half_wrong_gives_hand_computed_ap(tmp_path):
    # Category 3 (label 1): image 11's gt found (score 0.9), image 12's missed by a box elsewhere (0.8):
    # precision 1 up to recall 0.5, nothing beyond: 51 of COCO's 101 recall points -> AP 51/101.
    # Category 7 (label 2): found perfectly -> AP 1. The mean over categories is (51/101 + 1) / 2.
    dets = [np.array([[10, 10, 19, 19, 0.9, 1], [40, 40, 51, 49, 0.9, 2]], np.float32),
            np.array([[40, 40, 49, 53, 0.8, 1]], np.float32)]
    _, stats = run(tmp_path, dets)
    assert stats["AP"] == pytest.approx((51 / 101 + 1) / 2)
    assert stats["AR100"] == pytest.approx((0.5 + 1) / 2)
    per_class = json.load(open(tmp_path / "per_class_ap.json"))
    assert per_class["c3"]["AP"] == pytest.approx(51 / 101) and per_class["c3"]["AP50"] == pytest.approx(51 / 101)
    assert per_class["c7"] == {"AP": pytest.approx(1.0), "AP50": pytest.approx(1.0)}


def test_matches_pycocotools_on_the_same_file(tmp_path):
    rng = np.random.default_rng(0)
    dets = []
    for objects in GT.values():
        rows = []
        for (x1, y1, x2, y2), label in objects:
            for _ in range(4):  # jittered copies: a mix of hits at various IoUs and misses
                jitter = rng.uniform(-3, 3, 4)
                rows.append([x1 + jitter[0], y1 + jitter[1], x2 + jitter[2], y2 + jitter[3], rng.uniform(), label])
        dets.append(np.array(rows, np.float32))
    path, stats = run(tmp_path, dets)
    gt = make_coco_gt()
    with contextlib.redirect_stdout(io.StringIO()):
        reference = COCOeval(gt, gt.loadRes(path), "bbox")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    np.testing.assert_allclose(list(stats.values()), reference.stats)
    assert 0 < stats["AP"] < 1
    per_class = json.load(open(tmp_path / "per_class_ap.json"))  # COCO's AP is the mean over categories
    assert np.mean([v["AP"] for v in per_class.values()]) == pytest.approx(stats["AP"])
    assert np.mean([v["AP50"] for v in per_class.values()]) == pytest.approx(stats["AP50"])


def test_no_detections_gives_zero_and_a_summary(tmp_path):
    _, stats = run(tmp_path, [np.zeros((0, 6), np.float32)] * 2)
    assert stats["AP"] == 0.0 and os.path.exists(tmp_path / "coco_summary.txt")


def test_voc_ap_on_a_hand_worked_curve():
    # Scores 0.9 TP, 0.8 duplicate (FP), 0.7 on a difficult gt (ignored), 0.6 TP; 2 non-difficult gts.
    gt_boxes = [np.array([[0, 0, 9, 9], [20, 20, 29, 29]], np.float32), np.array([[0, 0, 19, 19]], np.float32)]
    gt_difficult = [np.array([False, True]), np.array([False])]
    det_images = [0, 0, 0, 1]
    det_scores = [0.9, 0.8, 0.7, 0.6]
    det_boxes = [[0, 0, 9, 9], [0, 0, 9, 10], [20, 20, 29, 29], [1, 1, 19, 19]]
    recall, precision, ap = voc_class_ap(det_images, det_scores, det_boxes, gt_boxes, gt_difficult)
    np.testing.assert_allclose(recall, [0.5, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(precision, [1.0, 0.5, 0.5, 2 / 3])
    assert ap == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)  # area under the precision envelope
    assert voc_ap(recall, precision, use_07_metric=True) == pytest.approx((6 * 1.0 + 5 * 2 / 3) / 11)


def test_voc_iou_threshold_is_strict_and_inclusive():
    # 10x10 gt and 10x5 detection (inclusive pixels): IoU exactly 0.5, which VOC does not count.
    gt = [np.array([[0, 0, 9, 9]], np.float32)]
    _, _, ap = voc_class_ap([0], [1.0], [[0, 0, 9, 4]], gt, [np.array([False])])
    assert ap == 0.0
    _, _, ap = voc_class_ap([0], [1.0], [[0, 0, 9, 5]], gt, [np.array([False])])
    assert ap == pytest.approx(1.0)


def test_voc_reference_rules_score_the_devkit_file_s_rounded_values():
    gt = [np.array([[0, 0, 9, 9]], np.float32)]
    # a 10 x 5.04 px detection: IoU 0.504, a hit; written to 0.1 px (5.0) it is IoU 0.5, a miss
    assert voc_class_ap([0], [1.0], [[0, 0, 9, 4.04]], gt, [np.array([False])])[2] == pytest.approx(1.0)
    assert voc_class_ap([0], [1.0], [[0, 0, 9, 4.04]], gt, [np.array([False])], reference_rules=True)[2] == 0.0
    # a miss scored 0.1234 ranks above the hit scored 0.1231 (AP 1/2); both written as 0.123, the sort keeps
    # the hit (listed first) first: AP 1
    boxes = [[0, 0, 9, 9], [50, 50, 59, 59]]
    assert voc_class_ap([0, 0], [0.1231, 0.1234], boxes, gt, [np.array([False])])[2] == pytest.approx(0.5)
    assert voc_class_ap([0, 0], [0.1231, 0.1234], boxes, gt, [np.array([False])],
                        reference_rules=True)[2] == pytest.approx(1.0)


def test_evaluate_voc_reports_per_class_and_mean(tmp_path):
    classes = ["__background__", "cat", "dog", "cow"]
    gt_boxes = [np.array([[0, 0, 9, 9], [30, 30, 49, 49]], np.float32)]
    gt_classes = [np.array([1, 2])]
    detections = [np.array([[0, 0, 9, 9, 0.9, 1], [0, 0, 9, 9, 0.8, 2]], np.float32)]
    result = evaluate_voc(detections, gt_boxes, gt_classes, [np.array([False, False])], classes, str(tmp_path),
                          use_07_metric=False)
    assert result["AP"]["cat"] == pytest.approx(1.0) and result["AP"]["dog"] == 0.0
    assert np.isnan(result["AP"]["cow"])  # no gt: left out of the mean
    assert result["mAP"] == pytest.approx(0.5)
    assert json.load(open(tmp_path / "voc_ap.json"))["mAP"] == pytest.approx(0.5)
    per_class = json.load(open(tmp_path / "per_class_ap.json"))
    assert per_class["cat"] == {"AP": 1.0, "AP@0.70": 1.0} and per_class["dog"] == {"AP": 0.0, "AP@0.70": 0.0}
    assert np.isnan(per_class["cow"]["AP"])


def test_evaluate_voc_reports_map_at_0_7_beside_0_5(tmp_path):
    # a 10 x 10 gt and a detection shifted by 2 px: IoU (8 * 10) / (2 * 100 - 80) = 2 / 3, a hit at 0.5 only
    classes = ["__background__", "cat"]
    detections = [np.array([[2, 0, 11, 9, 0.9, 1]], np.float32)]
    result = evaluate_voc(detections, [np.array([[0, 0, 9, 9]], np.float32)], [np.array([1])],
                          [np.array([False])], classes, str(tmp_path), use_07_metric=False)
    assert result["mAP"] == pytest.approx(1.0) and result["mAP@0.70"] == 0.0
    assert json.load(open(tmp_path / "voc_ap.json"))["AP@0.70"] == {"cat": 0.0}


def test_proposal_recall_per_size_range_and_threshold_hand_worked():
    from lib.evaluation.metrics import proposal_recall

    gts = [np.array([[0, 0, 9, 9], [100, 100, 199, 199]], np.float32), np.array([[0, 0, 39, 39]], np.float32)]
    # image 0: the 10 px gt found exactly, the 100 px one at IoU 80 * 100 / (2 * 10000 - 8000) = 2 / 3;
    # image 1: no proposals (its 40 px gt is missed)
    proposals = [np.array([[0, 0, 9, 9, 0.9], [120, 100, 219, 199, 0.8]], np.float32), np.zeros((0, 5))]
    table = proposal_recall(gts, proposals, {"all": (-1, -1), "small": (-1, 32), "large": (96, -1),
                                             "none": (500, -1)})
    assert table["all"] == {"gts": 3, 0.5: pytest.approx(2 / 3), 0.7: pytest.approx(1 / 3)}
    assert table["small"] == {"gts": 1, 0.5: 1.0, 0.7: 1.0}
    assert table["large"] == {"gts": 1, 0.5: 1.0, 0.7: 0.0}
    assert table["none"]["gts"] == 0 and np.isnan(table["none"][0.5])


def test_proposal_recall_tool_prints_the_table(tmp_path, capsys, monkeypatch):
    import importlib.util

    import cv2

    from lib.dataset.proposals import write_proposals

    root = tmp_path / "data"
    (root / "annotations").mkdir(parents=True)
    (root / "images" / "train").mkdir(parents=True)
    cv2.imwrite(str(root / "images" / "train" / "1.jpg"), np.zeros((100, 120, 3), np.uint8))
    json.dump({"images": [{"id": 1, "file_name": "1.jpg", "width": 120, "height": 100}],
               "annotations": [{"id": 1, "image_id": 1, "bbox": [10, 10, 20, 20], "area": 400, "iscrowd": 0,
                                "category_id": 1}], "categories": [{"id": 1, "name": "thing"}]},
              open(root / "annotations" / "instances_train.json", "w"))
    write_proposals({1: np.array([[10, 10, 29, 29, 1.0]], np.float32)}, str(tmp_path / "p.npz"))
    tools = os.path.join(ROOT, "tools")
    monkeypatch.syspath_prepend(tools)
    spec = importlib.util.spec_from_file_location("proposal_recall_tool", os.path.join(tools, "proposal_recall.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    dataset = ["--set", "dataset.dataset", "coco", "dataset.dataset_path", str(root), "dataset.root_path",
               str(tmp_path), "dataset.image_set", "train"]
    tool.main(["--cfg", "configs/faster/sniper_synthetic_tiny.yml", "--proposals", str(tmp_path / "p.npz"), *dataset])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| all"))
    assert [cell.strip() for cell in row.split("|")[2:5]] == ["1", "1.000", "1.000"]
    with pytest.raises(SystemExit) as stopped:  # a user's mistake: one line naming the file, no traceback
        tool.main(["--cfg", "configs/faster/sniper_synthetic_tiny.yml", "--proposals", str(tmp_path / "none.npz"),
                   *dataset])
    error = capsys.readouterr().err
    assert stopped.value.code != 0 and "Traceback" not in error, error
    assert error.strip().splitlines()[-1].startswith("error: cannot read proposal file") and "none.npz" in error


@pytest.mark.parametrize("value, is_defined", [
    (0.0, True), (0.42, True), (1, True), (np.float32(0.5), True),  # numbers, NumPy's too
    (-1.0, False), (-1, False), (float("nan"), False), (float("inf"), False),  # COCO's undefined, NaN, inf
    (None, False), (True, False), ("0.5", False),  # absent, or what a damaged record holds
])
def test_a_metric_is_defined_only_as_a_finite_non_negative_number(value, is_defined):
    assert defined(value) is is_defined
