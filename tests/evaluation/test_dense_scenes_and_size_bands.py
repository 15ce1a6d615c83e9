"""COCO evaluation of dense and small-object scenes: pycocotools' summary reproduced, every kept detection
scored, the cut warned about, and the size bands with their per-class table."""
import contextlib
import io
import json
import logging

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from lib.config import load_config
from lib.dataset import load_roidb
from lib.evaluation.coco_summary import dense_scene_warning, max_dets_for, parse_bands
from lib.evaluation.metrics import COCO_STAT_NAMES, evaluate_coco
from lib.train.evaluation import metric_names
from dataset_helpers import ann, coco_gt, dataset_cfg, image_record, write_coco, write_results


def grid(count, side, step, category=1):
    return [(step * (i % 20), step * (i // 20), side, category) for i in range(count)]


def test_default_setting_reproduces_pycocotools_summarize(tmp_path):
    rng = np.random.default_rng(0)
    objects = grid(30, 12, 30) + [(x + 300, y, 50, 2) for x, y, _, _ in grid(10, 0, 60)] + [(0, 400, 200, 1)]
    detections = [(x + rng.integers(-3, 4), y + rng.integers(-3, 4), s + rng.integers(-4, 5), c, rng.random())
                  for x, y, s, c in objects] + [(500, 500, 40, 1, 0.95), (100, 100, 20, 2, 0.4)]
    path = write_results(tmp_path, detections)
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path))
    gt = coco_gt(objects)
    reference = COCOeval(gt, gt.loadRes(path), "bbox")
    with contextlib.redirect_stdout(io.StringIO()):
        reference.evaluate(), reference.accumulate()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        reference.summarize()
    # the same reductions over the same arrays: equal to rounding (1e-12 leaves room for summation order)
    assert list(stats) == list(COCO_STAT_NAMES)
    np.testing.assert_allclose([stats[n] for n in COCO_STAT_NAMES], reference.stats, rtol=0, atol=1e-12)
    assert 0 < stats["AP"] < 1 and stats["APs"] != stats["APm"]
    assert open(tmp_path / "coco_summary.txt").read() == printed.getvalue()


def test_a_dense_scene_is_scored_at_every_detection_kept(tmp_path):
    # 150 objects, 150 perfect detections. At maxDets 100 only the 100 best count: precision 1 up to recall
    # 100/150, nothing beyond, so AP = (recall points 0, 0.01, .. 0.66: 67 of 101) = 67/101.
    objects = grid(150, 20, 30)
    path = write_results(tmp_path, [(x, y, s, c, 1 - i / 1000) for i, (x, y, s, c) in enumerate(objects)])
    assert evaluate_coco(coco_gt(objects), path, str(tmp_path))["AP"] == pytest.approx(67 / 101)
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path), max_dets=200)
    assert stats["AP"] == pytest.approx(1.0) and stats["AR200"] == pytest.approx(1.0)
    assert max_dets_for(50) == [1, 10, 100] and max_dets_for(300) == [1, 10, 300]


def scene_gt(images):
    """A pycocotools COCO of images 1..N; ``images``: per image [(category id, objects, crowd)]."""
    coco = COCO()
    annotations = []
    for image_id, groups in enumerate(images, start=1):
        for category, count, crowd in groups:
            annotations += [{"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                             "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": int(crowd)} for _ in range(count)]
    coco.dataset = {"images": [{"id": i, "width": 640, "height": 640} for i in range(1, len(images) + 1)],
                    "annotations": annotations, "categories": [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def test_dense_scenes_cut_by_the_scored_detections_are_warned_about_once_with_the_count():
    # image 1: 150 objects of category 1 (more than 100); image 2: 60 + 60 objects (100 or fewer per category:
    # pycocotools caps per image and category) and 150 detections of category 1 (dense: 60 >= 100 / 2);
    # image 3: 10 objects, 150 detections (not dense); image 4: 120 crowd regions (not objects)
    gt = scene_gt([[(1, 150, False)], [(1, 60, False), (2, 60, False)], [(1, 10, False)], [(2, 120, True)]])
    results = [{"image_id": image, "category_id": 1} for image in (2, 3) for _ in range(150)]
    test = load_config(None).TEST
    assert (test.EVAL_MAX_DETS, test.MAX_PER_IMAGE) == (100, 200)
    assert dense_scene_warning(gt, results, [1, 2, 3, 4], test) == (
        "COCO evaluation scores at most 100 detections per image and category, so the AP and AR of dense scenes "
        "are capped: 1 of 4 scored images have more objects of one category (up to 150), 1 more keep more "
        "detections for a category of at least 50 objects; set TEST.EVAL_MAX_DETS 0 to score every detection "
        "the test keeps")
    assert dense_scene_warning(gt, results, [2, 3, 4], test).endswith(  # the scored images only
        "capped: 1 of 3 scored images keep more detections for a category of at least 50 objects; set "
        "TEST.EVAL_MAX_DETS 0 to score every detection the test keeps")
    assert dense_scene_warning(gt, results, [3, 4], test) is None
    follows = load_config(None, [("TEST.EVAL_MAX_DETS", "0")]).TEST  # scores the test's 200: nothing cut
    assert dense_scene_warning(gt, results, [1, 2, 3, 4], follows) is None
    fewer = load_config(None, [("TEST.EVAL_MAX_DETS", "0"), ("TEST.MAX_PER_IMAGE", "100")]).TEST
    assert dense_scene_warning(gt, results, [1, 2], fewer).endswith(
        "up to 150), 1 more keep more detections for a category of at least 50 objects; raise TEST.MAX_PER_IMAGE "
        "(100) above 150")


def test_the_test_of_a_dense_set_warns_and_eval_max_dets_0_scores_it_whole(tmp_path, caplog):
    # 120 objects of category 2 (label 1), all found, ranked: at maxDets 100 precision 1 up to recall
    # 100/120, nothing beyond: AP = recall points 0, 0.01, .. 0.83 (84 of 101); scored whole: 1
    write_coco(str(tmp_path / "data"), "val", [image_record(1, 400, 400)],
               [ann(i + 1, 1, [20 * (i % 20), 20 * (i // 20), 12, 12]) for i in range(120)])
    _, dataset = load_roidb(dataset_cfg(tmp_path), "val", training=False)
    detections = [np.array([[20 * (i % 20), 20 * (i // 20), 20 * (i % 20) + 11, 20 * (i // 20) + 11, 1 - i / 1000, 1]
                            for i in range(120)], np.float32)]
    for eval_max_dets, warnings, ap in (("100", 1, 84 / 101), ("0", 0, 1.0)):
        caplog.clear()
        scoring = load_config(None, [("TEST.EVAL_MAX_DETS", eval_max_dets)]).TEST
        with caplog.at_level(logging.WARNING):
            stats = dataset.evaluate([{"id": 1}], detections, str(tmp_path / eval_max_dets), scoring=scoring)["stats"]
        messages = [r.getMessage() for r in caplog.records if "dense scenes" in r.getMessage()]
        assert len(messages) == warnings and stats["AP"] == pytest.approx(ap)
        assert all("1 of 1 scored images have more objects of one category (up to 120)" in m for m in messages)


def test_size_bands_and_the_per_class_size_table(tmp_path):
    # class 1: ten 10 px objects (tiny) found, ten 40 px ones (medium) missed; class 2: ten 40 px found
    objects = grid(10, 10, 30) + [(x, y + 200, 40, 1) for x, y, _, _ in grid(10, 0, 60)] + \
        [(x, y + 400, 40, 2) for x, y, _, _ in grid(10, 0, 60)]
    found = [o for o in objects if not (o[2] == 40 and o[3] == 1)]
    path = write_results(tmp_path, [(*o, 0.9) for o in found])
    bands = parse_bands([["tiny", 0, 16], ["small", 16, 32], ["medium", 32, 96], ["large", 96, -1]])
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path), bands=bands)
    assert list(stats)[:7] == ["AP", "AP50", "AP75", "AP_tiny", "APs", "APm", "APl"]
    assert stats["AP_tiny"] == pytest.approx(1.0)  # only class 1 has tiny objects, all found
    assert stats["APm"] == pytest.approx(0.5)  # class 1 medium 0, class 2 medium 1
    assert stats["APs"] == stats["APl"] == -1  # no objects in those bands
    table = json.load(open(tmp_path / "per_class_size_ap.json"))
    assert table["one"]["AP_tiny"] == pytest.approx(1.0) and table["one"]["APm"] == pytest.approx(0.0)
    assert table["two"]["APm"] == pytest.approx(1.0) and np.isnan(table["two"]["AP_tiny"])
    assert table["one"]["AP"] == pytest.approx(0.5, abs=0.01)  # half its objects, all ranked first
    cfg = load_config(None, [("TEST.SIZE_BANDS", "[[tiny, 0, 16], [rest, 16, -1]]"), ("TEST.EVAL_MAX_DETS", "0")])
    assert {"AP_tiny", "AP_rest", "AR200", "mAP"} <= set(metric_names(cfg))


def test_bad_size_bands_are_named():
    for bad in ([["all", 0, 16]], [["a", 16, 8]], [["a", 0]], [["a", 0, 8], ["a", 8, -1]]):
        with pytest.raises(ValueError, match="TEST.SIZE_BANDS"):
            parse_bands(bad)
