"""Instance masks at test time (lib/inference/masks.py): pasting against hand-worked cases, RLE from the boxes'
pixels against pycocotools', the region a detection's mask is computed on, COCO segm evaluation next to bbox,
the mask pass on the detection run's plan against the whole-image masks, its canvases within the tile, a
Detector of a mask network returning and drawing masks, the exported mask graph and the viewer."""
import json
import os
import re
from types import SimpleNamespace

import cv2
import mxnet as mx
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from network_helpers import mask_network_params
from dataset_helpers import indexed_coco

from lib.atomic import write_json
from lib.config import load_config
from lib.drawing import draw_detections
from lib.inference.detector import Detector
from lib.evaluation.metrics import coco_results, evaluate_coco
from lib.inference.masks import encode_pasted, mask_regions, paste_masks
from lib.inference.streaming import ArrayImages, prepare_image
from lib.inference.regions import Region, RegionPlan
from lib.scales import pyramid
from symbols.backbones import feature_stride
from symbols.sniper import mask_inference_symbol


def test_paste_hand_worked():
    """A map whose left 14 columns are 1 on the box x 10..24, y 20..34 (14 px each way): pixel x samples
    the map at cell (x + 0.5 - 10) * 2 - 0.5, so x 10..16 (cells 0.5 .. 12.5) are inside, x 17 (cell 14.5)
    is not, and pixels whose centre is outside the box (x 9, x 24, y 34) are never set."""
    prob = np.zeros((28, 28))
    prob[:, :14] = 1
    mask = paste_masks(prob[None], [[10, 20, 24, 34]], 40, 30)[0]
    expected = np.zeros((40, 30), bool)
    expected[20:34, 10:17] = True
    np.testing.assert_array_equal(mask, expected)


def test_paste_interpolates_and_clips_to_the_image():
    """A map rising linearly along x, 0 at cell 0 to 1 at cell 27, on a 28-px box: pixel i samples cell i,
    so the threshold 0.5 falls between cells 13 (13/27) and 14 (14/27); the box runs off the image."""
    prob = np.tile(np.arange(28) / 27.0, (28, 1))
    mask = paste_masks(prob[None], [[-14, 0, 14, 28]], 28, 20)[0]
    expected = np.zeros((28, 20), bool)
    expected[:, 0:14] = True  # cells 14..27 are columns 0..13 of the image
    np.testing.assert_array_equal(mask, expected)
    empty = paste_masks(np.ones((1, 28, 28)), [[30, 30, 40, 40]], 28, 20)[0]  # wholly outside
    assert not empty.any()
    with pytest.raises(ValueError, match="2 mask maps for 1 boxes"):
        paste_masks(np.ones((2, 28, 28)), [[0, 0, 5, 5]], 10, 10)


def _rles(masks):
    """pycocotools' RLEs of boolean (N, h, w) masks, JSON-ready as lib.inference.masks gives them."""
    rles = mask_utils.encode(np.asfortranarray(np.asarray(masks, np.uint8).transpose(1, 2, 0)))
    return [{"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")} for rle in rles]


def test_rles_from_the_boxes_pixels_are_pycocotools_rles_of_the_pasted_masks():
    """encode_pasted never builds a whole-image mask; its RLEs are those of the pasted masks: random maps on
    boxes inside the image, across its edges, spanning its whole height (runs of ones joined across
    columns), the whole image, and wholly outside it (an empty mask)."""
    rng = np.random.RandomState(0)
    boxes = [[3, 4, 17, 20], [-5, -6, 8, 9], [20, 25, 40, 50], [4.3, -2, 11.6, 40], [0, 0, 30, 36],
             [31, 2, 40, 9], [10.5, 10.5, 11, 11]]
    maps = rng.uniform(0, 1, (len(boxes), 28, 28))
    maps[4] = 1  # the whole image: one run of ones
    rles = encode_pasted(maps, boxes, 36, 30)
    assert rles == _rles(paste_masks(maps, boxes, 36, 30))
    assert rles[4]["counts"] == _rles(np.ones((1, 36, 30), bool))[0]["counts"]
    assert rles[5] == _rles(np.zeros((1, 36, 30), bool))[0]  # wholly outside: empty
    json.dumps(rles)  # JSON-ready
    assert encode_pasted(np.zeros((0, 28, 28)), np.zeros((0, 4)), 36, 30) == []


def _levels(*ranges):
    return [SimpleNamespace(valid_range=r) for r in ranges]


def test_mask_regions_of_whole_images_are_the_finest_level_whose_range_holds_the_box():
    """Whole images at the tiny config's ranges [-1, 90], [32, 180], [75, -1] (sqrt of the no-+1 area in
    (lo, hi]) at scales 3, 1.667 and 0.4: 20 and 90 px boxes go to scale 3, 100 px to 1.667, 200 px to 0.4;
    with only the first level's range, a 200 px box goes to the coarsest level. In AutoFocus order
    (coarsest first) the same boxes go to the same scales."""
    plan = RegionPlan()
    for level, scale in enumerate((3.0, 1.667, 0.4)):
        plan.add_level(level, [Region(0, (0.0, 0.0, 300.0, 250.0))], [scale], [])
    boxes = [[0, 0, 20, 20], [0, 0, 90, 90], [0, 0, 100, 100], [0, 0, 200, 200]]
    ranges = ([-1, 90], [32, 180], [75, -1])
    np.testing.assert_array_equal(mask_regions(boxes, (250, 300), plan, [0, 1, 2], _levels(*ranges)), [0, 0, 1, 2])
    only_small = _levels([-1, 90], [-1, 90], [-1, 90])
    np.testing.assert_array_equal(mask_regions([[0, 0, 200, 200]], (250, 300), plan, [0, 1, 2], only_small), [2])
    coarse_first = RegionPlan()
    for level, scale in enumerate((0.4, 1.667, 3.0)):
        coarse_first.add_level(level, [Region(0, (0.0, 0.0, 300.0, 250.0))], [scale], [])
    np.testing.assert_array_equal(mask_regions(boxes, (250, 300), coarse_first, [0, 1, 2], _levels(*ranges[::-1])),
                                  [2, 2, 1, 0])


def test_mask_regions_prefer_a_region_holding_the_box_then_the_tile_owning_its_centre():
    """Level 0 (scale 2) in two tiles x 0..60 and 40..100 of a 100 x 50 image (cores split at x 50), plus a
    FocusChip 60..90 x 10..40 on level 1 (scale 3); level 2 (scale 1) the whole image. Ranges open."""
    plan = RegionPlan()
    plan.add_level(0, [Region(0, (0.0, 0.0, 60.0, 50.0), core=(-np.inf, -np.inf, 50.0, np.inf)),
                       Region(0, (40.0, 0.0, 100.0, 50.0), core=(50.0, -np.inf, np.inf, np.inf))], [2.0, 2.0], [])
    plan.add_level(1, [Region(0, (60.0, 10.0, 90.0, 40.0))], [3.0], [])
    plan.add_level(2, [Region(0, (0.0, 0.0, 100.0, 50.0))], [1.0], [])
    levels = _levels([-1, -1], [-1, -1], [-1, -1])
    boxes = [[42, 5, 56, 20],  # in both tiles, centre 49 in the first's core
             [44, 5, 58, 20],  # in both tiles, centre 51 in the second's core
             [62, 12, 80, 30],  # in the chip (finest) and in the second tile
             [30, 5, 70, 20],  # in neither tile nor the chip: the whole image
             [-10, 5, 20, 60]]  # beyond the image: held as clipped, by the first tile
    np.testing.assert_array_equal(mask_regions(boxes, (50, 100), plan, [0, 1, 2, 3], levels), [0, 1, 2, 3, 0])
    # the chip's level out of range for the third box: the tile that holds it
    ranges = _levels([-1, -1], [-1, 10], [-1, -1])
    np.testing.assert_array_equal(mask_regions(boxes[2:3], (50, 100), plan, [0, 1, 2, 3], ranges), [1])
    # nothing holds a box: the region at its preferred level that owns its centre, then the largest overlap
    small = RegionPlan()
    small.add_level(0, plan.regions[:2], [2.0, 2.0], [])
    np.testing.assert_array_equal(mask_regions([[10, 0, 80, 50], [20, 0, 100, 50]], (50, 100), small, [0, 1],
                                               levels[:1]), [0, 1])
    chips = RegionPlan()  # FocusChips have no cores: x 10..50 overlaps the first by 20 px, the second by 25
    chips.add_level(0, [Region(0, (0.0, 0.0, 30.0, 20.0)), Region(0, (25.0, 0.0, 60.0, 20.0))], [2.0, 2.0], [])
    np.testing.assert_array_equal(mask_regions([[10, 0, 50, 20]], (50, 100), chips, [0, 1], levels[:1]), [1])


SQUARES = {21: [((4, 6, 15, 17), 1)], 22: [((10, 2, 29, 11), 2), ((2, 20, 9, 27), 1)]}
CATEGORY_IDS = [0, 5, 9]


def _coco_with_polygons():
    images = [{"id": i, "width": 32, "height": 32, "file_name": f"{i}.png"} for i in SQUARES]
    annotations = []
    for image_id, objects in SQUARES.items():
        for (x1, y1, x2, y2), label in objects:
            polygon = [x1, y1, x2 + 1, y1, x2 + 1, y2 + 1, x1, y2 + 1]  # the pixel area of the inclusive box
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": CATEGORY_IDS[label],
                                "bbox": [x1, y1, x2 - x1 + 1, y2 - y1 + 1], "area": (x2 - x1 + 1) * (y2 - y1 + 1),
                                "segmentation": [polygon], "iscrowd": 0})
    return indexed_coco(images, annotations, CATEGORY_IDS)


def _square_masks(objects, shift=0):
    masks = np.zeros((len(objects), 32, 32), bool)
    for mask, ((x1, y1, x2, y2), _) in zip(masks, objects):
        mask[y1:y2 + 1, x1 + shift:x2 + 1 + shift] = True
    return masks


@pytest.mark.parametrize("shift, segm_ap", [(0, 1.0), (4, None)])
def test_segm_ap_next_to_bbox_ap(tmp_path, shift, segm_ap):
    """Perfect boxes; masks exact (segm AP 1) or shifted by 4 px (IoU 8/16 .. 4/12 against the squares:
    segm AP well below the bbox AP of 1). Both tables go to coco_stats.json and coco_summary.txt."""
    detections = [np.array([[*box, 0.9, label] for box, label in SQUARES[i]], np.float32) for i in SQUARES]
    segmentations = [_rles(_square_masks(SQUARES[i], shift)) for i in SQUARES]
    path = os.path.join(tmp_path, "results.json")
    results = coco_results(detections, list(SQUARES), CATEGORY_IDS, segmentations)
    assert all("segmentation" in r for r in results) and len(results) == 3
    write_json(results, path)
    stats = evaluate_coco(_coco_with_polygons(), path, str(tmp_path), image_ids=list(SQUARES))
    assert stats["AP"] == pytest.approx(1.0)
    if segm_ap is not None:
        assert stats["segm"]["AP"] == pytest.approx(segm_ap)
    else:
        assert 0 <= stats["segm"]["AP"] < 0.5 and stats["segm"]["AP50"] < 1
    assert json.load(open(tmp_path / "coco_stats.json")) == stats
    summary = open(tmp_path / "coco_summary.txt").read()
    assert summary.count("Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all") == 2 and "segm:" in summary
    assert os.path.exists(tmp_path / "per_class_segm_ap.json")


def test_segmentations_must_match_the_detections():
    with pytest.raises(ValueError, match="image 21: 0 segmentations for 1 detections"):
        coco_results([np.array([[0, 0, 3, 3, 0.5, 1]], np.float32)], [21], CATEGORY_IDS, [[]])


@pytest.fixture(scope="module")
def tiny_mask_network():
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.WITH_MASK": True, "TEST.fp16": False,
                     "TEST.SCALES": [1.0, 0.5], "TEST.VALID_RANGES": [[-1, 32], [20, -1]],  # overlapping
                     "TEST.BATCH_IMAGES": 1})
    return cfg, mask_network_params(cfg)


def _maps_on(cfg, params, image, crop, scale, boxes, labels):
    """The mask graph's maps (of each box's class) of ``boxes`` (original pixels) on the ``crop`` (x1, y1, x2,
    y2 whole pixels) of ``image`` resized by ``scale`` onto a canvas of exactly its size, one image."""
    args, aux = params
    x1, y1, x2, y2 = crop
    part = image[y1:y2, x1:x2]
    canvas = np.zeros((1, 3, int(np.ceil(part.shape[0] * scale)), int(np.ceil(part.shape[1] * scale))), np.float32)
    prepare_image(part, scale, cfg.network.PIXEL_MEANS, cfg.network.CHANNEL_ORDER, canvas[0])
    rois = np.hstack([np.zeros((len(boxes), 1)), (np.asarray(boxes) - [x1, y1, x1, y1]) * scale])
    executor = mask_inference_symbol(cfg, 4, compiled_deformable=True).bind(
        mx.cpu(), {**args, "data": mx.nd.array(canvas), "mask_rois": mx.nd.array(rois)}, aux_states=aux)
    return executor.forward()[0].asnumpy()[np.arange(len(boxes)), np.asarray(labels, np.int64) - 1]


def _whole_image_maps(cfg, params, image, boxes, labels):
    """The maps as the whole-image mask path computed them: each box at the finest level (this pyramid is
    finest first) whose range holds its no-+1 sqrt(area), else the coarsest, on the whole image resized."""
    levels = pyramid(cfg.TEST, "TEST")
    sides = np.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
    holds = [[(lo <= 0 or side > lo) and (hi <= 0 or side <= hi) for lo, hi in (l.valid_range for l in levels)]
             for side in sides]
    chosen = np.array([row.index(True) if any(row) else len(levels) - 1 for row in holds])
    height, width = image.shape[:2]
    maps = np.zeros((len(boxes), 28, 28), np.float32)
    for level in np.unique(chosen):
        members = chosen == level
        maps[members] = _maps_on(cfg, params, image, (0, 0, width, height),
                                 levels[level].spec.image_scale(height, width), boxes[members], labels[members])
    return maps, chosen


def _detect_and_map(detector, images):
    """(detection rows per image, {index: maps} of the mask pass on the detection run's plan, the plan)."""
    plan = RegionPlan()
    rows = detector.detect(images, plan=plan)
    maps = dict(detector.mask_head.run(ArrayImages(images), {i: (r[:, :4], r[:, 5]) for i, r in enumerate(rows)},
                                       plan))
    return rows, maps, plan


def _recorded_canvases(monkeypatch):
    """The (height, width) of every canvas batch MaskHead.forward gets, from now on."""
    from lib.inference.masks import MaskHead

    canvases, forward = [], MaskHead.forward

    def recording(head, data, rois):
        canvases.append(data.shape[2:])
        return forward(head, data, rois)

    monkeypatch.setattr(MaskHead, "forward", recording)
    return canvases


@pytest.mark.parametrize("overrides, contexts, shapes", [
    ({}, 1, [(48, 64), (70, 30), (20, 20)]),  # whole images, one per canvas
    ({"TEST.TILE": [256, 32]}, 2, [(48, 64)] * 3),  # tiled test where every image fits one tile; 2 contexts
])
def test_mask_pass_where_images_fit_one_tile_gives_the_whole_image_masks(tiny_mask_network, overrides, contexts,
                                                                          shapes):
    """Where every image fits one tile and every canvas is exactly its scaled image (one image per canvas,
    or images of one size), the mask pass computes what the whole-image path computed: the same graph on the
    same canvas and rois, each detection at the finest level whose range holds it. The maps agree to float32
    rounding (other executors and contexts may sum in another order: 1e-5, where a wrong level, canvas or
    roi moves them by 1e-2 and more; probabilities spread over 0.4 .. 0.6 and beyond)."""
    from lib.config import with_overrides

    cfg, params = tiny_mask_network
    cfg = with_overrides(cfg, overrides)
    detector = Detector.from_params(cfg, ["background", "a", "b", "c"], *params,
                                    contexts=[mx.cpu(i) for i in range(contexts)])
    rng = np.random.RandomState(4)
    images = [rng.randint(0, 255, (h, w, 3)).astype(np.uint8) for h, w in shapes]
    rows, maps, _ = _detect_and_map(detector, images)
    levels_used = set()
    for index, image in enumerate(images):
        assert len(rows[index]) > 0
        expected, chosen = _whole_image_maps(cfg, params, image, rows[index][:, :4].astype(np.float64),
                                             rows[index][:, 5].astype(np.int64))
        levels_used.update(chosen)
        np.testing.assert_allclose(maps[index], expected, rtol=0, atol=1e-5)
        assert 0.05 < (expected > 0.5).mean() < 0.95 and expected.std() > 0.02  # informative maps
    assert levels_used == {0, 1}
    # the mask pass freed the detection network's canvases (bound again at its smallest input) ...
    stride = feature_stride(cfg)
    assert detector.module.data_shapes[0].shape == (contexts, 3, stride, stride)
    found = detector(images)  # ... which grows them again, with its parameters
    for index, dets in enumerate(found):  # the API's masks: the maps pasted, in the API's (score) order
        order = np.argsort(-rows[index][:, 4], kind="stable")
        np.testing.assert_array_equal(dets.to_array(), rows[index][order])
        np.testing.assert_array_equal(dets.masks, paste_masks(maps[index][order], rows[index][order, :4],
                                                              *shapes[index]))


def test_tiled_mask_pass_stays_within_the_tile_on_the_regions_holding_the_boxes(tiny_mask_network, monkeypatch):
    """A 90 x 150 image in 64 px tiles at scale 1 (and 0.5): the mask pass runs on canvases of the detection
    run, none larger than a tile, and each detection's map is the mask graph's on the region mask_regions
    gives it, cropped and resized alone (float32 rounding as above)."""
    from lib.config import with_overrides

    cfg, params = tiny_mask_network
    cfg = with_overrides(cfg, {"TEST.TILE": [64, 24]})
    detector = Detector.from_params(cfg, ["background", "a", "b", "c"], *params, contexts=[mx.cpu()])
    canvases = _recorded_canvases(monkeypatch)
    image = np.random.RandomState(5).randint(0, 255, (90, 150, 3)).astype(np.uint8)
    (rows,), maps, plan = _detect_and_map(detector, [image])
    maps = maps[0]
    assert len(rows) > 0 and canvases and max(max(shape) for shape in canvases) <= 64
    assert set(canvases) <= {batch.canvas for batch in plan.batches}  # the detection run's canvases
    assert len(plan.regions) > 2  # tiles
    chosen = mask_regions(rows[:, :4], (90, 150), plan, list(range(len(plan.regions))), detector.levels)
    for position in np.unique(chosen):
        members = chosen == position
        crop = tuple(int(v) for v in plan.regions[position].box)
        expected = _maps_on(cfg, params, image, crop, plan.scales[position], rows[members, :4].astype(np.float64),
                            rows[members, 5])
        np.testing.assert_allclose(maps[members], expected, rtol=0, atol=1e-5)


def test_detector_of_a_mask_network_returns_and_draws_masks(tiny_mask_network):
    cfg, (args, aux) = tiny_mask_network
    detector = Detector.from_params(cfg, ["background", "a", "b", "c"], args, aux, contexts=[mx.cpu()])
    image = np.random.RandomState(2).randint(0, 255, (48, 64, 3)).astype(np.uint8)
    found = detector(image)
    assert len(found) > 0 and found.masks.shape == (len(found), 48, 64) and found.masks.dtype == bool
    kept = found.above(float(np.median(found.scores)))
    assert kept.masks.shape == (len(kept), 48, 64)
    # a mask tints its pixels in the detection's colour: drawing with masks differs from drawing without
    # exactly where some shown mask is (or a box outline / tag is drawn)
    strongest = found.above(found.scores[0])
    with_masks = detector.draw(image, strongest, thresh=0)
    plain = draw_detections(image, strongest.to_array(), detector.classes, 0)
    changed = (with_masks != plain).any(axis=2)
    assert not (changed & ~strongest.masks.any(axis=0)).any()
    assert strongest.masks.any() and changed.any()


def test_export_writes_the_mask_graph_stock_mxnet_runs(tiny_mask_network, tmp_path):
    """The exported mask graph (stock operators) gives the in-repo mask graph's maps (compiled operators:
    the same float32 sampling, different summation order, hence a tolerance)."""
    from lib.config import with_overrides
    from lib.inference.export import export_test_graph

    cfg, (args, aux) = tiny_mask_network
    model = str(tmp_path / "SNIPER-0001.params")
    mx.nd.save(model, {**{f"arg:{k}": v for k, v in args.items()}, **{f"aux:{k}": v for k, v in aux.items()}})
    cfg = with_overrides(cfg, {"TEST.MODEL": model, "dataset.NUM_CLASSES": 4})
    paths = export_test_graph(cfg, str(tmp_path / "export" / "tiny"))
    assert [os.path.basename(p) for p in paths] == ["tiny-symbol.json", "tiny-0000.params", "tiny-mask-symbol.json",
                                                    "tiny-mask-0000.params", "tiny-model.json"]
    with open(paths[-1]) as f:
        assert json.load(f)["masks"]["outputs"] == ["mask_prob_output"]
    symbol, exported_args, exported_aux = mx.model.load_checkpoint(str(tmp_path / "export" / "tiny-mask"), 0)
    assert not any(n["op"].startswith("Compiled") for n in json.loads(symbol.tojson())["nodes"])
    rng = np.random.RandomState(3)
    data = mx.nd.array(rng.uniform(-100, 100, (1, 3, 64, 96)))
    rois = mx.nd.array([[0, 4, 6, 40, 50], [0, 30, 10, 90, 60]])
    stock = symbol.bind(mx.cpu(), {**exported_args, "data": data, "mask_rois": rois}, aux_states=exported_aux)
    repo = mask_inference_symbol(cfg, 4, compiled_deformable=True).bind(
        mx.cpu(), {**args, "data": data, "mask_rois": rois}, aux_states=aux)
    np.testing.assert_allclose(stock.forward()[0].asnumpy(), repo.forward()[0].asnumpy(), rtol=1e-4, atol=1e-5)


def test_viewer_tints_the_masks_of_a_results_file(tmp_path):
    """tools/visualize_detections.py on a grey 200x100 image: a detection box 20..119 x 10..69 whose mask
    is its left half; the picture (640 px wide: x3.2, under a 24-px legend and its caption) is tinted there only."""
    import subprocess
    import sys

    import cv2

    from lib.bootstrap import ROOT

    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "000000000007.png"), np.full((100, 200, 3), 128, np.uint8))
    mask = np.zeros((1, 100, 200), bool)
    mask[0, 10:70, 20:70] = True
    results = [{"image_id": 7, "category_id": 3, "bbox": [20, 10, 100, 60], "score": 0.9,
                "segmentation": _rles(mask)[0]}]
    (tmp_path / "results.json").write_text(json.dumps(results))
    tool = [sys.executable, os.path.join(ROOT, "tools", "visualize_detections.py"), "--folder", str(folder),
            "--out", str(tmp_path / "out")]
    done = subprocess.run(tool + ["--results", str(tmp_path / "results.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    sheet = cv2.imread(str(tmp_path / "out" / "detections_000.png")).astype(int)

    from lib.drawing import title

    top = 24 + title(640, "image 7 (000000000007.png): 1 of 1 detections shown").shape[0]  # legend, caption

    def pixel(x, y):
        return sheet[top + int(y * 3.2), int(x * 3.2)]

    assert np.abs(pixel(45, 40) - 128).max() > 20  # inside the mask: tinted
    assert (pixel(95, 40) == 128).all() and (pixel(150, 40) == 128).all()  # in the box beyond the mask; outside
    results[0]["segmentation"] = {"size": [100, 200], "counts": 5}
    (tmp_path / "broken.json").write_text(json.dumps(results))
    failed = subprocess.run(tool + ["--results", str(tmp_path / "broken.json")], capture_output=True, text=True)
    assert failed.returncode == 1 and "not a COCO RLE" in failed.stderr and "Traceback" not in failed.stderr


def test_mask_head_binds_the_float16_graph_with_test_fp16(tiny_mask_network):
    """With TEST.fp16 the mask graph's body and four convolutions are float16 (the casts of symbols/mask.py),
    its inputs float32: bound with the types inferred from the inputs, the checkpoint's float32 values cast
    into them (MXNet 1.9 has no float16 convolution on the CPU: bound here, run on GPUs only)."""
    from lib.config import with_overrides
    from lib.inference.mxnet_network import MxnetMaskNetwork

    cfg, (args, aux) = tiny_mask_network
    network = MxnetMaskNetwork(with_overrides(cfg, {"TEST.fp16": True}), 4, args, aux, [mx.cpu()],
                               compiled_deformable=False)
    executor = network.executors[0]
    types = {name: array.dtype for name, array in executor.arg_dict.items()}
    assert types["data"] == types["mask_rois"] == types["mask_offset_weight"] == types["mask_out_weight"] == np.float32
    assert types["mask_conv_3x3_4_weight"] == types["stage1_unit1_conv1_weight"] == np.float16
    np.testing.assert_array_equal(executor.arg_dict["mask_conv_3x3_1_weight"].asnumpy(),
                                  args["mask_conv_3x3_1_weight"].asnumpy().astype(np.float16))


def test_autofocus_mask_pass_runs_on_the_focus_chips_of_the_run(monkeypatch):
    """AutoFocus (scale 0.5 whole, then 1.0 on FocusChips) with masks: the mask pass runs on the regions and
    canvases the detection run recorded; detections of the fine scale's range get their maps from a chip,
    the others from the coarse whole image, each the mask graph's on that region alone."""
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.WITH_MASK": True, "TEST.fp16": False,
                             "network.AUTO_FOCUS": True, "TEST.AUTO_FOCUS": True, "TEST.SCALES": [0.5, 1.0],
                             "TEST.VALID_RANGES": [[20, -1], [-1, 40]], "TEST.DO_PRUNING": [False, True],
                             "TEST.CHIP_HYPERPARAMS": [[1, 0.5, 2], [-1, -1, -1]], "TEST.BATCH_IMAGES": 1})
    params = mask_network_params(cfg)
    detector = Detector.from_params(cfg, ["background", "a", "b", "c"], *params, contexts=[mx.cpu()])
    canvases = _recorded_canvases(monkeypatch)
    image = np.random.RandomState(7).randint(0, 255, (120, 160, 3)).astype(np.uint8)
    (rows,), maps, plan = _detect_and_map(detector, [image])
    maps = maps[0]
    assert plan.levels[0] == 0 and plan.regions[0].box == (0, 0, 160, 120) and set(plan.levels) == {0, 1}
    assert set(canvases) <= {batch.canvas for batch in plan.batches}
    chosen = mask_regions(rows[:, :4], (120, 160), plan, list(range(len(plan.regions))), detector.levels)
    assert {plan.levels[p] for p in chosen} == {0, 1}
    for position in np.unique(chosen):
        members = chosen == position
        crop = plan.regions[position].box
        assert all(float(v).is_integer() for v in crop)  # this seed's chips: canvases exactly their crops
        expected = _maps_on(cfg, params, image, tuple(int(v) for v in crop), plan.scales[position],
                            rows[members, :4].astype(np.float64), rows[members, 5])
        np.testing.assert_allclose(maps[members], expected, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# End to end: the tester (main_test.py's test) and demo.py with a tiny mask network of random weights.

E2E_IMAGES = {7: (160, 120, [((20, 15, 75, 70), 1), ((85, 50, 150, 110), 2)]), 8: (80, 112, [((8, 20, 68, 100), 3)])}


def _write_coco_with_polygons(root):
    """A COCO-format set "val" of two random images with square objects and their polygons; the
    categories are the tiny network's three classes."""
    os.makedirs(os.path.join(root, "images", "val"))
    rng = np.random.RandomState(6)
    images, annotations = [], []
    for image_id, (width, height, objects) in E2E_IMAGES.items():
        cv2.imwrite(os.path.join(root, "images", "val", f"{image_id}.png"),
                    rng.randint(0, 255, (height, width, 3)).astype(np.uint8))
        images.append({"id": image_id, "file_name": f"{image_id}.png", "width": width, "height": height})
        for (x1, y1, x2, y2), label in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": label,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0,
                                "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]]})
    os.makedirs(os.path.join(root, "annotations"))
    with open(os.path.join(root, "annotations", "instances_val.json"), "w") as f:
        json.dump({"images": images, "annotations": annotations,
                   "categories": [{"id": c, "name": name} for c, name in ((1, "a"), (2, "b"), (3, "c"))]}, f)


@pytest.fixture(scope="module")
def mask_run(tiny_mask_network, tmp_path_factory):
    """(config, checkpoint file): the tiny mask network saved as a checkpoint, on the two-image set."""
    from lib.config import with_overrides

    root = tmp_path_factory.mktemp("mask_e2e")
    _write_coco_with_polygons(str(root / "data"))
    cfg, (args, aux) = tiny_mask_network
    model = str(root / "SNIPER-0001.params")
    mx.nd.save(model, {**{f"arg:{k}": v for k, v in args.items()}, **{f"aux:{k}": v for k, v in aux.items()}})
    cfg = with_overrides(cfg, {"dataset.dataset": "coco", "dataset.dataset_path": str(root / "data"),
                               "dataset.root_path": str(root), "dataset.test_image_set": "val",
                               "dataset.NUM_CLASSES": 4, "output_path": str(root / "output"), "gpus": "",
                               "TEST.MODEL": model, "TEST.NUM_PROCESS": 1})
    return cfg, model


def test_tester_of_a_mask_network_writes_segm_results_and_the_segm_table(mask_run):
    """tester.test (main_test.py) on two images, the pipeline in a worker process: every result has its
    segmentation (an RLE of the image's size), and coco_stats.json and coco_summary.txt have the segm table
    next to the bbox one; the mask pass is timed in test_summary.json."""
    from lib.inference import tester

    cfg, _ = mask_run
    summary = tester.test(cfg)
    out = tester.results_dir(cfg)
    assert summary["tested"] == 2 and summary["skipped"] == 0 and summary["speed"]["mask_seconds"] > 0
    with open(os.path.join(out, "detections_val_results.json")) as f:
        results = json.load(f)
    assert results and all(r["segmentation"]["size"] == [E2E_IMAGES[r["image_id"]][1], E2E_IMAGES[r["image_id"]][0]]
                           for r in results)
    # one RLE per call: pycocotools' area() of a list of 256 or more fails under NumPy 2 (a uint8 scratch array)
    areas = [mask_utils.area({**r["segmentation"], "counts": r["segmentation"]["counts"].encode()}) for r in results]
    assert max(areas) > 0  # masks, not all empty
    with open(os.path.join(out, "coco_stats.json")) as f:
        stats = json.load(f)
    assert {"AP", "AP50"} <= set(stats) and {"AP", "AP50"} <= set(stats["segm"])
    assert all(0 <= stats["segm"][key] <= 1 for key in ("AP", "AP50"))
    with open(os.path.join(out, "coco_summary.txt")) as f:
        assert "segm:" in f.read()


def test_masks_of_a_test_merged_from_scale_caches_are_the_masks_of_the_run_that_wrote_them(mask_run, tmp_path):
    """TEST.USE_CACHE with a mask network: the second test reads every scale back (the network runs for
    the masks alone), and its regions plan, made from the image sizes, gives the first run's masks."""
    from lib.config import with_overrides
    from lib.inference import tester

    cfg = with_overrides(mask_run[0], {"TEST.USE_CACHE": True})
    first = tester.test(cfg, out_dir=str(tmp_path))
    with open(tmp_path / "detections_val_results.json") as f:
        written = json.load(f)
    second = tester.test(cfg, out_dir=str(tmp_path))
    with open(tmp_path / "detections_val_results.json") as f:
        again = json.load(f)
    levels = len(cfg.TEST.SCALES)
    assert first["scale_cache"]["written"] == second["scale_cache"]["read"] == list(range(levels))
    assert written and all(r["segmentation"]["counts"] for r in written)
    assert again == written


def test_an_image_unreadable_in_the_mask_pass_is_skipped_and_counted(mask_run, monkeypatch, caplog, tmp_path):
    """An image read for its detections that cannot be read for its masks is logged and skipped, the other
    one evaluated with its masks."""
    from lib.config import with_overrides
    from lib.inference import streaming, tester

    cfg = with_overrides(mask_run[0], {"TEST.NUM_PROCESS": 0})
    detections = tester.run_images

    def then_unreadable(*args, **kwargs):
        found = detections(*args, **kwargs)
        read = streaming.read_roidb_image

        def failing(entry):
            if entry["id"] == 8:
                raise IOError(f"cannot read {entry['image']}")
            return read(entry)

        monkeypatch.setattr(streaming, "read_roidb_image", failing)
        return found

    monkeypatch.setattr(tester, "run_images", then_unreadable)
    summary = tester.test(cfg, out_dir=str(tmp_path))
    assert summary["tested"] == 1 and summary["skipped"] == 1 and summary["skipped_images"][0].endswith("8.png")
    assert "skipping image id 8: cannot read" in caplog.text
    with open(tmp_path / "detections_val_results.json") as f:
        assert {r["image_id"] for r in json.load(f)} == {7}


def test_demo_draws_the_masks_of_a_mask_network(mask_run, tmp_path):
    """demo.py on one image writes the Detector's drawing with its masks tinted (not the drawing without
    them) and logs each shown detection's mask area."""
    import subprocess
    import sys

    import yaml

    from lib.bootstrap import ROOT
    from lib.config.core import dump_config
    from lib.dataset.base import numbered_classes

    cfg, model = mask_run
    config = tmp_path / "mask.yml"
    config.write_text(dump_config(cfg))
    assert yaml.safe_load(config.read_text())["TEST"]["MODEL"] == model
    image_path = os.path.join(cfg.dataset.dataset_path, "images", "val", "7.png")
    image = cv2.imread(image_path)
    detector = Detector.from_config(cfg, model, numbered_classes(4))
    found = detector(image)
    thresh = float(found.scores[min(2, len(found) - 1)])  # random weights: the best three or so shown
    shown = found.above(thresh)
    assert len(shown) and shown.masks.any()
    out = tmp_path / "drawn.png"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "demo.py"), "--cfg", str(config), "--im_path",
                           image_path, "--out", str(out), "--thresh", repr(thresh)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"\] +mask \d+ px", done.stderr)) == len(shown)
    drawn = cv2.imread(str(out))
    np.testing.assert_array_equal(drawn, detector.draw(image, found, thresh))
    assert (drawn != draw_detections(image, shown.to_array(), detector.classes, thresh)).any()


@pytest.mark.slow
def test_mask_benchmark_reports_the_test_with_and_without_masks(tmp_path):
    """tools/benchmark_masks.py on one synthetic image at one small scale: both rows, in processes of their
    own, the masks row with its segm AP table."""
    import subprocess
    import sys

    from lib.bootstrap import ROOT

    settings = ["gpus=", "TEST.SCALES=[0.25]", "TEST.VALID_RANGES=[[-1,-1]]", "TEST.BATCH_IMAGES=1",
                "TEST.NUM_PROCESS=0"]
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "benchmark_masks.py"), "--images", "1",
                           "--out", str(tmp_path), "--set", *settings], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                              for line in done.stdout.splitlines() if line.startswith("| "))}
    assert rows["boxes"][0] == rows["masks"][0] == "1" and float(rows["masks"][2]) > 0
    assert (rows["boxes"][3], rows["masks"][3]) == ("no", "yes")
