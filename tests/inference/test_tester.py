"""Multi-scale merging, and the tester end to end: an oracle network for exact AP, a tiny random network
for the checkpoint round trip, multi-context batching and proposal extraction."""
import json
import logging
import os
import re
import signal
import time

import cv2
import numpy as np
import pytest
from tqdm import tqdm

from detector_helpers import CATEGORY_IDS, IMAGES, OracleDetector, StandInNetwork, write_tiny_coco
from stall_helpers import assert_each_stopped_worker_warned_once

from lib.boxes import bbox_overlaps
from lib.config import load_config, with_overrides
from lib.boxes import flip_boxes
from lib.dataset import load_roidb
from lib.dataset.proposals import read_proposals
from lib.scales import ScaleSpec, pyramid
from lib.inference import tester
from lib.inference.batching import extraction_order, part_bounds, plan_level, reference_order
from lib.inference.detector import Detector
from lib.inference.whole_images import to_original, unique_rows
from lib.inference.streaming import RoidbImages, prepare_image
from lib.inference.merge import in_test_range, merge_scales, scale_candidates, suppress
from lib.run.checkpoint import checkpoint_file, checkpoint_prefix, save_checkpoint
from lib.dataset.base import numbered_classes

CLASSES = ["__background__", "class 1", "class 2"]


def square(x, y, side):
    return [x, y, x + side - 1, y + side - 1]


def settings_of_test(**overrides):
    """The TEST section of the default config with ``overrides`` (its keys without the section)."""
    return load_config(None, [(f"TEST.{key}", value) for key, value in overrides.items()]).TEST


DEFAULT_RANGES = [level.valid_range for level in pyramid(settings_of_test(), "TEST")]


def test_candidates_keep_boxes_in_the_scale_range_and_above_threshold():
    boxes = np.array([square(0, 0, 20), square(0, 0, 50), square(0, 0, 100)], np.float32)
    scores = np.array([[0.1, 0.9, 0.0005], [0.1, 0.002, 0.7], [0.2, 0.3, 0.5]], np.float32)
    small = scale_candidates(boxes, scores, (-1, 32), 0.001)
    np.testing.assert_allclose(small, [[*square(0, 0, 20), 0.9, 1]])
    large = scale_candidates(boxes, scores, (32, -1), 0.001)
    np.testing.assert_allclose(large, [[*square(0, 0, 50), 0.002, 1], [*square(0, 0, 50), 0.7, 2],
                                       [*square(0, 0, 100), 0.3, 1], [*square(0, 0, 100), 0.5, 2]], rtol=1e-6)
    # a score exactly at the threshold is dropped (> 1e-3, as the reference)
    assert len(scale_candidates(boxes[:1], np.array([[0, 0.001, 0.0011]], np.float32), (-1, -1), 0.001)) == 1


def test_valid_range_is_the_no_plus_one_area_above_lo_squared_and_at_most_hi_squared():
    # areas (x2 - x1) * (y2 - y1): 32*32 = 1024, 32*33 = 1056, 50*50 = 2500, 50*51 = 2550
    boxes = np.array([[0, 0, 32, 32], [0, 0, 32, 33], [5, 5, 55, 55], [5, 5, 55, 56]], np.float64)
    np.testing.assert_array_equal(in_test_range(boxes, (32, 50)), [False, True, True, False])
    np.testing.assert_array_equal(in_test_range(boxes, (-1, 50)), [True, True, True, False])
    np.testing.assert_array_equal(in_test_range(boxes, (32, -1)), [False, True, True, True])
    np.testing.assert_array_equal(in_test_range(boxes, (0, 0)), [True] * 4)  # <= 0 is open, as -1
    # the +1 sqrt-area rule would take [0, 0, 32, 32] (33 px a side) at lo 32: this one does not
    one_pixel_more = np.array([[0, 0, 31.5, 32.5]])  # 31.5 * 32.5 = 1023.75 <= 1024
    assert not in_test_range(one_pixel_more, (32, -1))[0]


def test_merge_drops_out_of_range_scales_and_suppresses_duplicates():
    # default ranges: [-1, 90], [32, 180], [75, -1]; 3 classes (background + 2)
    test_cfg = settings_of_test(SOFT_NMS=False)
    medium, shifted, large = square(10, 10, 50), square(12, 10, 50), square(100, 100, 120)
    per_scale = [
        (np.array([medium, large]), np.array([[0, 0.8, 0], [0, 0.95, 0]])),  # large is too big here
        (np.array([shifted]), np.array([[0, 0.6, 0.3]])),
        (np.array([medium, large]), np.array([[0, 0.99, 0], [0, 0.4, 0]])),  # medium too small here
    ]
    merged = merge_scales(per_scale, DEFAULT_RANGES, test_cfg)
    # class 1: medium (0.8) suppresses shifted (IoU 48/52 > 0.45); class 2 keeps shifted; large from scale 2
    np.testing.assert_allclose(merged, [[*medium, 0.8, 1], [*large, 0.4, 1], [*shifted, 0.3, 2]], rtol=1e-6)


def test_soft_nms_decays_overlapping_scores_with_a_gaussian():
    test_cfg = settings_of_test()
    medium, shifted = square(10, 10, 50), square(12, 10, 50)
    iou = (48 * 50) / (2 * 50 * 50 - 48 * 50)
    per_scale = [(np.array([medium]), np.array([[0, 0.8]])), (np.array([shifted]), np.array([[0, 0.6]])),
                 (np.zeros((0, 4)), np.zeros((0, 2)))]
    merged = merge_scales(per_scale, DEFAULT_RANGES, test_cfg)
    np.testing.assert_allclose(merged[:, 4], [0.8, 0.6 * np.exp(-iou ** 2 / test_cfg.SOFT_NMS_SIGMA)], rtol=1e-5)


def test_suppress_caps_detections_per_image_by_score():
    test_cfg = settings_of_test(MAX_PER_IMAGE=3)
    rng = np.random.default_rng(1)
    scores = rng.uniform(0.01, 1, 10)
    candidates = np.array([[*square(100 * i, 0, 20), s, 1 + i % 2] for i, s in enumerate(scores)], np.float32)
    kept = suppress(candidates, test_cfg)  # disjoint boxes: nothing decays
    np.testing.assert_allclose(kept[:, 4], np.sort(scores)[::-1][:3], rtol=1e-6)
    assert suppress(np.zeros((0, 6)), test_cfg).shape == (0, 6)


def test_cap_keeps_every_detection_scoring_at_least_the_cap_th_best():
    scores = [0.9, 0.5, 0.1, 0.5, 0.5]  # disjoint boxes, so nothing decays
    candidates = np.array([[*square(100 * i, 0, 20), s, 1] for i, s in enumerate(scores)], np.float32)
    for cap, kept in ((1, [0.9]), (2, [0.9, 0.5, 0.5, 0.5]), (4, [0.9, 0.5, 0.5, 0.5]), (5, scores), (-1, scores)):
        result = suppress(candidates, settings_of_test(MAX_PER_IMAGE=cap))
        np.testing.assert_allclose(result[:, 4], sorted(kept, reverse=True))
    # the three tied 0.5 rows stay in their original order
    np.testing.assert_array_equal(suppress(candidates, settings_of_test(MAX_PER_IMAGE=2))[1:, 0], [100, 300, 400])


def test_scale_count_must_match_valid_ranges():
    with pytest.raises(ValueError, match="2 scales of detections for 3 valid ranges"):
        merge_scales([(np.zeros((0, 4)), np.zeros((0, 2)))] * 2, DEFAULT_RANGES, settings_of_test())


# ---------------------------------------------------------------------------------------------------
# Batches, canvases, resizing and the mapping back to original pixels, as the reference does them.

def test_images_are_ordered_by_area_landscape_first_and_groups_padded_with_their_last_entries():
    # (height, width): index 3 (250 px) < 2 (300) < 0 (400) < 1 (600) < 4 (800); 2 and 4 are portrait
    sizes = [(10, 40), (20, 30), (30, 10), (5, 50), (40, 20)]
    widths, heights = [w for _, w in sizes], [h for h, _ in sizes]
    np.testing.assert_array_equal(reference_order(widths, heights, 2), [3, 0, 1, 1, 2, 4])
    np.testing.assert_array_equal(reference_order(widths, heights, 4), [3, 0, 1, 1, 2, 4, 2, 4])
    np.testing.assert_array_equal(reference_order(widths, heights, 1), [3, 0, 1, 2, 4])
    spec = ScaleSpec(factor=1.0)
    assert [b.images for b in plan_level(sizes, spec, 2, parts=1)] == [(3, 0), (1,), (2, 4)]
    assert [b.images for b in plan_level(sizes, spec, 4, parts=1)] == [(3, 0, 1), (2, 4)]
    # two parts (the reference's CONCURRENT_JOBS): [0, 1, 2] and [3, 4], each ordered on its own
    assert part_bounds(5, 2) == [(0, 3), (3, 5)] and part_bounds(1, 2) == [(0, 1)]
    assert [b.images for b in plan_level(sizes, spec, 2, parts=2)] == [(0, 1), (2,), (3,), (4,)]


def test_an_image_repeated_by_the_padding_takes_its_last_batch_whose_canvas_counts_every_member():
    # five landscape images of growing area, four per batch: [0, 1, 2, 3] then [4, 2, 3, 4]
    sizes = [(10, 20), (10, 30), (20, 24), (12, 60), (11, 70)]  # areas 200, 300, 480, 720, 770
    batches = plan_level(sizes, ScaleSpec(factor=1.0), 4, parts=1)
    assert [b.images for b in batches] == [(0, 1), (4, 2, 3)]
    assert [b.canvas for b in batches] == [(20, 60), (20, 70)]  # image 2's height in both


def test_proposal_extraction_batches_in_set_order_on_full_resolution_canvases():
    # landscape 0, 2, 4 padded with their first (0), then portrait 1, 3; canvases 480 x 512 (landscape)
    # and 512 x 480 (portrait) whatever the images; image 0 takes its second, last batch
    sizes = [(10, 40), (30, 10), (20, 30), (40, 20), (5, 50)]
    np.testing.assert_array_equal(extraction_order([w for _, w in sizes], [h for h, _ in sizes], 2), [0, 2, 4, 0, 1, 3])
    batches = plan_level(sizes, ScaleSpec(short=480, long=512), 2, parts=1, extraction=True)
    assert [(b.images, b.canvas) for b in batches] == [((2,), (480, 512)), ((4, 0), (480, 512)), ((1, 3), (512, 480))]
    # factor scales have no full resolution: the detection canvas
    (first, *_) = plan_level(sizes, ScaleSpec(factor=2.0), 2, parts=1, extraction=True)
    assert first.canvas == (40, 80)  # images 0 (10 x 40 -> 20 x 80) and 2 (20 x 30 -> 40 x 60)


def test_canvas_is_the_largest_ceiled_scaled_image_of_the_batch():
    # factor 1.5: (10, 21) -> 15 x 31.5, (11, 20) -> 16.5 x 30; cv2 makes them 15 x 32 and 16 x 30
    # (round half to even), the canvas is ceil(16.5) x ceil(31.5) = 17 x 32, one row more than either
    sizes = [(10, 21), (11, 20)]
    (batch,) = plan_level(sizes, ScaleSpec(factor=1.5), 2, parts=1)
    assert batch.canvas == (17, 32) and batch.scales == (1.5, 1.5)
    assert plan_level(sizes, ScaleSpec(factor=1.5), 2, parts=1, canvas_multiple=16)[0].canvas == (32, 32)
    resized = [cv2.resize(np.zeros(size, np.uint8), None, fx=1.5, fy=1.5).shape for size in sizes]
    assert resized == [(15, 32), (16, 30)]


def test_images_are_resized_with_the_scale_factors_not_an_explicit_size():
    image = np.random.default_rng(4).integers(0, 255, (5, 7, 3), dtype=np.uint8)
    out = np.full((3, 9, 12), 7.0, np.float32)
    means = (103.939, 116.779, 123.68)
    assert prepare_image(image, 1.5, means, "RGB", out) == (8, 10)  # round(7.5) = 8, round(10.5) = 10
    by_factor = cv2.resize(image, None, fx=1.5, fy=1.5, interpolation=cv2.INTER_LINEAR).astype(np.float64)
    by_size = cv2.resize(image, (10, 8), interpolation=cv2.INTER_LINEAR).astype(np.float64)
    assert not np.array_equal(by_factor, by_size)  # the two sample differently
    for channel in range(3):  # RGB: channel c is BGR channel 2 - c minus its mean, in double as the reference
        expected = (by_factor[:, :, 2 - channel] - means[2 - channel]).astype(np.float32)
        np.testing.assert_array_equal(out[channel, :8, :10], expected)
    in_float32 = by_factor[:, :, 2].astype(np.float32) - np.float32(means[2])
    assert not np.array_equal(in_float32, out[0, :8, :10])  # float32 arithmetic is an ulp off somewhere
    assert not out[:, 8:, :].any() and not out[:, :, 10:].any()  # the rest of the canvas is zero


def test_boxes_are_clipped_in_the_scaled_image_then_divided_by_the_scale():
    # a 60 x 80 image at scale 1.6 is 96 x 128: x2 = 130 clips to 127, i.e. 79.375 original pixels
    # (clipping after the division would give 79)
    boxes = to_original(np.array([[-5, 2, 130, 50]], np.float32), 1.6, (96, 128))
    np.testing.assert_allclose(boxes, [[0, 1.25, 79.375, 31.25]])


# ---------------------------------------------------------------------------------------------------
# The tester end to end on tiny COCO- and VOC-format datasets written here.

def tiny_images():
    rng = np.random.default_rng(3)
    return [rng.integers(0, 255, shape, dtype=np.uint8) for shape in [(40, 70, 3), (90, 30, 3), (12, 9, 3)]]


def test_unique_rows_keeps_first_occurrences_in_order():
    rois = np.array([[3, 3, 5, 5], [1, 1, 2, 2], [3, 3, 5, 5], [0, 0, 1, 1], [1, 1, 2, 2]], np.float32)
    np.testing.assert_array_equal(unique_rows(rois), [0, 1, 3])


def test_oracle_network_scores_ap_one_and_skips_the_unreadable_image(tiny):
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False})
    summary = tester.test(cfg, detector=OracleDetector(cfg))
    assert summary["stats"]["AP"] == pytest.approx(1.0)
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 3, 1)
    assert summary["skipped_images"][0].endswith("broken.jpg")
    out_dir = tester.results_dir(cfg)
    assert json.load(open(os.path.join(out_dir, "test_summary.json")))["skipped"] == 1
    results = json.load(open(summary["results"]))
    # NMS leaves exactly one detection per object although every object is proposed repeatedly at 3 scales
    assert sorted((r["image_id"], r["category_id"], tuple(r["bbox"])) for r in results) == sorted(
        (image_id, CATEGORY_IDS[label], (x1, y1, x2 - x1 + 1, y2 - y1 + 1))
        for _, image_id, _, _, objects in IMAGES["val"][:3] for (x1, y1, x2, y2), label in objects)


def test_test_dev_results_are_written_and_evaluation_is_skipped(tiny, tmp_path, caplog):
    """COCO test-dev: an image_info file (no annotations), images in COCO's test2015 folder."""
    images = {"test-dev2015": [("d.png", 21, 50, 60, [((5, 6, 30, 40), 2)]),
                               ("e.png", 22, 70, 30, [((1, 1, 20, 50), 1), ((3, 55, 12, 66), 2)])]}
    root = tmp_path / "data"
    os.makedirs(root / "images" / "test2015")
    os.makedirs(root / "annotations")
    for name, _, height, width, _ in images["test-dev2015"]:
        cv2.imwrite(str(root / "images" / "test2015" / name), np.zeros((height, width, 3), np.uint8))
    with open(root / "annotations" / "image_info_test-dev2015.json", "w") as f:
        json.dump({"images": [{"id": i, "file_name": n, "height": h, "width": w}
                              for n, i, h, w, _ in images["test-dev2015"]],
                   "categories": [{"id": c, "name": f"cat{c}"} for c in CATEGORY_IDS[1:]]}, f)
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "output_path": str(tmp_path / "out"),
                                   "dataset.root_path": str(tmp_path), "dataset.dataset_path": str(root),
                                   "dataset.test_image_set": "test-dev2015"})
    with caplog.at_level(logging.INFO, logger="lib.dataset.coco"):
        summary = tester.test(cfg, detector=OracleDetector(cfg, images=images))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (2, 2, 0)
    assert "stats" not in summary
    assert "test-dev2015 has no annotations (e.g. test-dev): results written for submission, not evaluated" \
        in caplog.text
    results = json.load(open(summary["results"]))
    assert os.path.basename(summary["results"]) == "detections_test-dev2015_results.json"
    assert sorted((r["image_id"], r["category_id"], tuple(r["bbox"])) for r in results) == sorted(
        (image_id, CATEGORY_IDS[label], (x1, y1, x2 - x1 + 1, y2 - y1 + 1))
        for _, image_id, _, _, objects in images["test-dev2015"] for (x1, y1, x2, y2), label in objects)
    out_dir = tester.results_dir(cfg)
    assert sorted(os.listdir(out_dir)) == ["detections_test-dev2015_results.json", "test_summary.json"]


VOC_IMAGES = {  # name -> (height, width, [(x1, y1, x2, y2) 1-based inclusive, class, difficult])
    "000001": (50, 60, [((5, 5, 24, 30), "dog", False), ((30, 10, 55, 45), "cat", True)]),
    "000002": (70, 45, [((10, 10, 40, 60), "cat", False)]),
}


def write_tiny_voc(root):
    year = os.path.join(root, "VOC2007")
    for folder in ("ImageSets/Main", "Annotations", "JPEGImages"):
        os.makedirs(os.path.join(year, folder))
    with open(os.path.join(year, "ImageSets", "Main", "test.txt"), "w") as f:
        f.write("\n".join(VOC_IMAGES) + "\n")
    for name, (height, width, objects) in VOC_IMAGES.items():
        cv2.imwrite(os.path.join(year, "JPEGImages", f"{name}.jpg"), np.full((height, width, 3), 128, np.uint8))
        xml = "".join(
            f"<object><name>{cls}</name><difficult>{int(difficult)}</difficult><bndbox><xmin>{x1}</xmin>"
            f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
            for (x1, y1, x2, y2), cls, difficult in objects)
        with open(os.path.join(year, "Annotations", f"{name}.xml"), "w") as f:
            f.write(f"<annotation><size><width>{width}</width><height>{height}</height></size>{xml}</annotation>")


def test_voc_set_is_scored_with_the_07_metric_and_difficult_objects_ignored(tmp_path, tiny):
    from lib.dataset.pascal_voc import VOC_CLASSES

    write_tiny_voc(str(tmp_path / "voc"))
    cfg = with_overrides(tiny[0], {"output_path": str(tmp_path / "out"), "dataset.dataset": "pascal_voc",
                                   "dataset.dataset_path": str(tmp_path / "voc"), "dataset.root_path": str(tmp_path),
                                   "dataset.test_image_set": "2007_test", "dataset.NUM_CLASSES": 21,
                                   "TEST.SOFT_NMS": False})
    # the oracle finds the non-difficult objects only (0-based pixels, contiguous labels)
    found = {"voc": [(name, 0, h, w, [((x1 - 1, y1 - 1, x2 - 1, y2 - 1), VOC_CLASSES.index(cls) + 1)
                                      for (x1, y1, x2, y2), cls, difficult in objects if not difficult])
                     for name, (h, w, objects) in VOC_IMAGES.items()]}
    summary = tester.test(cfg, detector=OracleDetector(cfg, images=found))
    stats = summary["stats"]
    assert stats["metric"] == "VOC07 11-point"
    assert stats["AP"]["dog"] == pytest.approx(1.0) and stats["AP"]["cat"] == pytest.approx(1.0)
    assert np.isnan(stats["AP"]["person"]) and stats["mAP"] == pytest.approx(1.0)
    assert os.path.isfile(os.path.join(tester.results_dir(cfg), "voc_ap.json"))


def test_gpu_contexts_this_mxnet_cannot_see_are_a_clear_error(tiny):
    cfg, arg_params, aux_params = tiny
    with pytest.raises(ValueError, match="config key gpus = '99' names gpu\\(99\\)"):
        Detector.from_params(with_overrides(cfg, {"gpus": "99"}), CLASSES, arg_params, aux_params)


def test_oracle_boxes_survive_only_at_scales_whose_range_fits(tiny):
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False,
                                   "TEST.VALID_RANGES": [[-1, 20], [20, 30], [30, -1]]})  # 20x24, 36x46 boxes of a
    detector = OracleDetector(cfg)
    image = np.zeros((60, 80, 3), np.uint8)
    per_scale = detector.scale_results([image])[0]
    small, large = [10, 12, 29, 35], [40, 5, 75, 50]
    assert len(per_scale) == 3
    for boxes, _ in per_scale:  # every scale decodes both gts exactly, in original pixels
        assert bbox_overlaps(boxes, np.array([small, large], np.float32)).max(axis=0) == pytest.approx(1, abs=1e-5)
    merged = detector.detect([image])[0]
    np.testing.assert_allclose(merged[:, :4], [small, large], atol=1e-3)
    detector = OracleDetector(with_overrides(cfg, {"TEST.VALID_RANGES": [[-1, 20], [-1, 20], [-1, 20]]}))
    assert len(detector.detect([image])[0]) == 0


def test_saved_checkpoint_gives_the_same_detections(tiny):
    cfg, arg_params, aux_params = tiny
    save_checkpoint(checkpoint_prefix(cfg), cfg.TEST.TEST_EPOCH, None, arg_params, aux_params,
                    stds=(1, 1, 1, 1), means=(0, 0, 0, 0))
    assert os.path.isfile(checkpoint_file(cfg))
    images = tiny_images()
    expected = Detector.from_params(cfg, CLASSES, arg_params, aux_params).detect(images)
    loaded = Detector.from_config(cfg, checkpoint_file(cfg), CLASSES).detect(images)
    assert all(len(e) > 0 for e in expected)
    for e, got in zip(expected, loaded):
        np.testing.assert_array_equal(e, got)
    for dets, image in zip(expected, images):  # original pixels, valid labels, inside the image: clipped
        # to (w_s - 1, h_s - 1) in the scaled image and divided by s, below (w, h) as round(w s) < w s + 1
        assert np.all(dets[:, :4] >= 0) and np.all(dets[:, [2, 3]] < [image.shape[1], image.shape[0]])
        assert set(np.unique(dets[:, 5])) <= {1, 2}
        assert len(dets) <= cfg.TEST.MAX_PER_IMAGE


def test_two_cpu_contexts_give_the_same_detections_as_one(tiny):
    cfg, arg_params, aux_params = tiny
    # one size, so that batching does not change the canvas (and with it the proposals); 3 images: the
    # batch of the two contexts gets a padding slot
    images = [image[:9, :9] for image in tiny_images()]
    single = Detector.from_params(cfg, CLASSES, arg_params, aux_params).detect(images)
    detector = Detector.from_params(with_overrides(cfg, {"gpus": "cpu:2"}), CLASSES, arg_params, aux_params)
    # TEST.BATCH_PARTS 2 cuts the set into [0, 1] and [2]; TEST.BATCH_IMAGES (2, 2, 4) per device would
    # take 4 to 8 images a batch: each part is one batch at every scale, padded to an even count so that
    # each context gets an image
    batches = detector.planner.plan([image.shape[:2] for image in images])
    assert [b.images for b in batches] == [(0, 1)] * 3 + [(2,)] * 3
    assert {detector.planner.forward_shape(b)[0] for b in batches} == {2}
    for s, m in zip(single, detector.detect(images)):
        np.testing.assert_allclose(s, m, rtol=1e-4, atol=1e-3)


def test_checkpoint_missing_or_misshapen_parameters_are_clear_errors(tiny):
    cfg, arg_params, aux_params = tiny
    partial = {k: v for k, v in arg_params.items() if k != "cls_score_weight"}
    with pytest.raises(ValueError, match="source.params lacks 1 parameters .* cls_score_weight"):
        Detector.from_params(cfg, CLASSES, partial, aux_params, source="source.params")
    with pytest.raises(ValueError, match=r"cls_score_weight has shape \(3, 128\), .* needs \(81, 128\)"):
        Detector.from_params(cfg, numbered_classes(81), arg_params, aux_params)


def test_each_constructor_takes_the_class_names_of_a_detection_network(tiny, tmp_path):
    cfg, arg_params, aux_params = tiny
    with pytest.raises(TypeError, match="classes"):  # no default to fall back on
        Detector.from_config(cfg, str(tmp_path / "absent.params"))
    with pytest.raises(ValueError, match="needs its class names"):  # named before anything is bound
        Detector.from_params(cfg, None, arg_params, aux_params)
    assert Detector(cfg, None, StandInNetwork(None), rpn_only=True).classes is None  # the RPN-only network has none


def test_extracted_proposals_load_back_for_chip_mining(tiny):
    cfg, arg_params, aux_params = tiny
    detector = Detector.from_params(cfg, None, arg_params, aux_params, rpn_only=True)
    path = tester.extract_proposals(cfg, detector=detector)
    assert path == tester.proposal_file(cfg) == os.path.join(cfg.output_path, "proposals", "train.npz")
    in_folder = with_overrides(cfg, {"TEST.PROPOSAL_SAVE_PATH": os.path.dirname(path)})  # an existing folder
    assert tester.proposal_file(in_folder) == path
    assert tester.proposal_file(with_overrides(cfg, {"TEST.PROPOSAL_SAVE_PATH": "/elsewhere/rpn.pkl"})) \
        == "/elsewhere/rpn.pkl"
    proposals = read_proposals(path)
    assert sorted(proposals) == [1, 2]  # image 3 cannot be read
    sizes = {image_id: (h, w) for _, image_id, h, w, _ in IMAGES["train"]}
    for image_id, boxes in proposals.items():
        height, width = sizes[image_id]
        assert boxes.dtype == np.float32 and boxes.shape[1] == 5
        assert 0 < len(boxes) <= 3 * cfg.TEST.NUM_PROPOSALS
        # clipped to the scaled image, then divided by the scale: inside [0, w) x [0, h), not [0, w - 1]
        assert np.all(boxes[:, :2] >= 0) and np.all(boxes[:, 2] < width) and np.all(boxes[:, 3] < height)
        assert np.any(boxes[:, 2] > width - 1)
        assert np.sum(np.diff(boxes[:, 4]) > 0) <= 2  # best first within each of the 3 scales, stacked
        assert len(np.unique(boxes, axis=0)) == len(boxes)
    clip = with_overrides(cfg, {"TEST.CLIP_PROPOSALS": True, "TEST.PROPOSAL_SAVE_PATH": path + ".clipped"})
    clipper = Detector.from_params(clip, None, arg_params, aux_params, rpn_only=True)
    clipped = read_proposals(tester.extract_proposals(clip, detector=clipper))
    for image_id, boxes in clipped.items():
        height, width = sizes[image_id]
        np.testing.assert_array_equal(boxes[:, :4], np.minimum(proposals[image_id][:, :4], [width - 1, height - 1] * 2))
    # what negative chip mining reads: flipped entries get the mirrored proposals (without the load-time NMS,
    # tested with the roidb, the file's proposals themselves)
    roidb, _ = load_roidb(with_overrides(cfg, {"dataset.proposal": path, "TRAIN.FLIP": True,
                                               "dataset.PROPOSAL_NMS": 0}), "train", training=True)
    for entry in roidb:
        boxes = proposals.get(entry["id"], np.zeros((0, 5), np.float32))[:, :4]
        expected = flip_boxes(boxes, entry["width"]) if entry["flipped"] else boxes
        np.testing.assert_allclose(entry["proposals"], expected)


def test_worker_processes_give_exactly_the_in_process_detections(tiny):
    cfg, arg_params, aux_params = tiny
    detector = Detector.from_params(cfg, CLASSES, arg_params, aux_params)
    roidb, _ = load_roidb(cfg, "val", training=False)
    in_process, skipped = tester.run_images(roidb, detector, 0, "in process")
    pipelined, skipped_too = tester.run_images(roidb, detector, 2, "pipelined")
    assert sorted(in_process) == sorted(pipelined) == [0, 1, 2]
    assert [e["image"] for e in skipped] == [e["image"] for e in skipped_too] == [roidb[3]["image"]]
    assert all(len(dets) for dets in in_process.values())
    for index, dets in in_process.items():
        np.testing.assert_array_equal(dets, pipelined[index])
    # the same as detecting the decoded images directly, given the same companions: the unreadable
    # image still takes a place in the test set's batches (its canvas counts), so the direct call is
    # compared with the tester over the readable images alone, whose batches are the direct call's
    # (asserted): equal batches and canvases run the same kernels in the same order, bit for bit
    readable = roidb[:3]
    images = [cv2.imread(entry["image"]) for entry in readable]
    assert detector.planner.plan([image.shape[:2] for image in images]) == \
        detector.planner.plan([(entry["height"], entry["width"]) for entry in readable])
    alone, _ = tester.run_images(readable, detector, 0, "readable only")
    for index, dets in enumerate(detector.detect(images)):
        np.testing.assert_array_equal(dets, alone[index])


def test_an_image_whose_file_is_not_its_annotated_size_is_refused(tiny, tmp_path):
    path = str(tmp_path / "x.png")
    cv2.imwrite(path, np.zeros((20, 30, 3), np.uint8))
    with pytest.raises(IOError, match="x.png is 30x20 pixels, but its annotations say 31x20"):
        RoidbImages([{"image": path, "height": 20, "width": 31}]).read(0)


def test_an_image_not_of_its_annotated_size_is_skipped_counted_and_named_as_in_training(tiny, tmp_path, caplog):
    from lib.data.chip_worker import ChipWorker
    from lib.data.epoch_plan import ChipRef

    root = tmp_path / "data"
    write_tiny_coco(str(root))
    resized = str(root / "images" / "val" / "c.png")
    cv2.imwrite(resized, np.zeros((40, 41, 3), np.uint8))  # annotated 40x40
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "output_path": str(tmp_path / "out"),
                                   "dataset.root_path": str(tmp_path), "dataset.dataset_path": str(root)})
    with caplog.at_level(logging.INFO, logger="lib.inference.tester"):
        summary = tester.test(cfg, detector=OracleDetector(cfg))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 2, 2)
    assert sorted(os.path.basename(path) for path in summary["skipped_images"]) == ["broken.jpg", "c.png"]
    with open(os.path.join(tester.results_dir(cfg), "test_summary.json")) as f:
        assert json.load(f)["skipped"] == 2
    message = f"image {resized} is 41x40 pixels, but its annotations say 40x40"
    assert f"skipping image id 9: {message}" in caplog.text
    # training's loader refuses the same file with the same words
    roidb, _ = load_roidb(with_overrides(cfg, {"TRAIN.FLIP": False}), "val", training=True)
    index = next(i for i, entry in enumerate(roidb) if entry["image"] == resized)
    reply = ChipWorker(roidb, cfg, None, False).make_chip(0, 0, "tag", ChipRef(index, 0, 1.0, (0, 0, 9, 9), ()), 0)
    assert reply == ("bad_image", "tag", 0, resized, message)


def test_a_stopped_test_worker_is_warned_about_then_named_with_its_image_instead_of_hanging(tiny, monkeypatch,
                                                                                              caplog):
    """TEST.STALL_WARN and TEST.LOADER_TIMEOUT reach the test pipeline's workers: a warning, then the stop."""
    from lib.data.worker_pool import WorkerStalledError
    from lib.dataset import image_io
    from lib.inference import streaming

    cfg, arg_params, aux_params = tiny
    detector = Detector.from_params(with_overrides(cfg, {"TEST.LOADER_TIMEOUT": 2, "TEST.STALL_WARN": 0.5}),
                                    CLASSES, arg_params, aux_params)
    roidb, _ = load_roidb(cfg, "val", training=False)
    stopped = roidb[1]["image"]

    def read(entry):  # the forked workers stop themselves (SIGSTOP) on this image
        if entry["image"] == stopped:
            os.kill(os.getpid(), signal.SIGSTOP)
        return image_io.read_roidb_image(entry)

    monkeypatch.setattr(streaming, "read_roidb_image", read)
    with pytest.raises(WorkerStalledError, match=rf"worker test-pipeline-\d \(pid \d+\) has shown no sign of life "
                                                 rf"for \d+ s \(TEST.LOADER_TIMEOUT is 2 s\) while preparing image "
                                                 rf"{re.escape(stopped)}; the process is stopped"), \
            caplog.at_level(logging.WARNING, logger="lib.data.worker_pool"):
        tester.run_images(roidb, detector, 2, "pipelined")
    # (the image's levels may go to both workers, each stopping on it)
    assert_each_stopped_worker_warned_once(caplog.records, "test-pipeline", f"preparing image {stopped}",
                                           "TEST.LOADER_TIMEOUT", 2)


class SlowOracle(OracleDetector):
    """The oracle network taking a known 50 ms per forward pass."""

    def __init__(self, cfg):
        super().__init__(cfg)
        forward = self.network.forward

        def slow(data, im_info):
            time.sleep(0.05)
            return forward(data, im_info)

        self.network.forward = slow


def test_every_test_run_stores_images_per_second_end_to_end_and_network_only(tiny, monkeypatch):
    bars = []

    class RecordingBar(tqdm):
        def close(self):
            bars.append((self.total, self.n, self.unit))
            super().close()

    monkeypatch.setattr(tester, "tqdm", RecordingBar)
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False})
    detector = SlowOracle(cfg)
    summary = tester.test(cfg, detector=detector)
    passes = len(detector.canvases)
    speed = summary["speed"]
    assert json.load(open(os.path.join(tester.results_dir(cfg), "test_summary.json")))["speed"] == speed
    # network time: the sleeps (50 ms each) and little else; end to end: more than that
    assert 0.05 * passes <= speed["network_seconds"] < 0.05 * passes + 0.5 * passes
    assert speed["seconds"] >= speed["network_seconds"]
    assert speed["images_per_s"] == pytest.approx(summary["tested"] / speed["seconds"], rel=0.01)
    assert speed["network_images_per_s"] == pytest.approx(summary["tested"] / speed["network_seconds"], rel=0.01)
    # the bar counted network passes, all of them planned from the start (its ETA extrapolates the work)
    assert set(bars) == {(passes, passes, "pass")} and passes > summary["images"]  # (tqdm may close twice)
