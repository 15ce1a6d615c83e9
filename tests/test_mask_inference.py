"""Instance masks at test time (lib/inference/masks.py): pasting against hand-worked cases, RLE, the level
a detection's mask is computed at, COCO segm evaluation next to bbox, the mask graph run by MaskHead, a
Detector of a mask network returning and drawing masks."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from pycocotools import mask as mask_utils
from network_helpers import inference_shapes
from dataset_helpers import indexed_coco

from lib.atomic import write_json
from lib.config import load_config
from lib.drawing import draw_detections
from lib.inference.detector import Detector
from lib.evaluation.metrics import coco_results, evaluate_coco
from lib.inference.masks import MaskHead, encode_masks, mask_levels, paste_masks
from lib.scales import pyramid
from symbols import inference_symbol
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


def test_rle_round_trip():
    masks = np.zeros((2, 9, 7), bool)
    masks[0, 2:5, 1:4] = True
    masks[1, 0, :] = True
    rles = encode_masks(masks)
    assert [r["size"] for r in rles] == [[9, 7], [9, 7]] and all(isinstance(r["counts"], str) for r in rles)
    json.dumps(rles)  # JSON-ready
    decoded = mask_utils.decode([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])
    np.testing.assert_array_equal(decoded.transpose(2, 0, 1), masks)
    assert list(mask_utils.area([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])) == [9, 7]
    assert encode_masks(np.zeros((0, 9, 7), bool)) == []


def test_mask_levels_finest_valid_range_first():
    """The tiny config's test ranges [-1, 90], [32, 180], [75, -1] (no +1 sqrt(area) in (lo, hi])."""
    levels = pyramid(load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "faster",
                                              "sniper_synthetic_tiny_mask.yml")).TEST, "TEST")
    boxes = [[0, 0, 20, 20], [0, 0, 90, 90], [0, 0, 100, 100], [0, 0, 200, 200]]
    np.testing.assert_array_equal(mask_levels(boxes, levels), [0, 0, 1, 2])
    only_small = [levels[0]]  # outside every range: the coarsest level (here the only one)
    np.testing.assert_array_equal(mask_levels([[0, 0, 200, 200]], only_small), [0])


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
    segmentations = [encode_masks(_square_masks(SQUARES[i], shift)) for i in SQUARES]
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


def _random_params(symbols_and_shapes, seed=0):
    """N(0, 0.05) weights (offsets zero), unit gammas and variances, for every parameter of the symbols."""
    rng = np.random.RandomState(seed)
    args, aux = {}, {}
    for symbol, shapes in symbols_and_shapes:
        arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
        for name, shape in zip(symbol.list_arguments(), arg_shapes):
            if name not in shapes and name not in args:
                value = rng.normal(0, 0.05, shape) if name.endswith("weight") and "offset" not in name else \
                    np.full(shape, float(name.endswith("gamma")))
                args[name] = mx.nd.array(value)
        for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes):
            aux[name] = mx.nd.array(np.full(shape, float(name.endswith("var"))))
    return args, aux


@pytest.fixture(scope="module")
def tiny_mask_network():
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.WITH_MASK": True, "TEST.fp16": False,
                     "TEST.SCALES": [1.0, 0.5], "TEST.VALID_RANGES": [[-1, 40], [40, -1]],
                     "TEST.BATCH_IMAGES": 1})
    params = _random_params([(inference_symbol(cfg, 4), inference_shapes(1, 64)),
                             (mask_inference_symbol(cfg, 4), dict(data=(1, 3, 64, 64), mask_rois=(1, 5)))])
    return cfg, params


def test_mask_head_runs_the_mask_graph_at_each_detections_level(tiny_mask_network):
    """MaskHead's maps are the mask graph's output for the box scaled to its level, at the detection's
    class; a box of sqrt(area) 20 goes to scale 1, one of 50 to scale 0.5."""
    cfg, (args, aux) = tiny_mask_network
    head = MaskHead(cfg, 4, args, aux, mx.cpu(), pyramid(cfg.TEST, "TEST"), compiled_deformable=True)
    image = np.random.RandomState(1).randint(0, 255, (60, 80, 3)).astype(np.uint8)
    boxes = np.array([[5, 6, 25, 26], [10, 4, 60, 54]], np.float64)
    labels = np.array([3, 1])
    maps = head.probabilities(image, boxes, labels)
    assert maps.shape == (2, 28, 28) and ((maps > 0) & (maps < 1)).all()

    from lib.inference.pipeline import prepare_image

    symbol = mask_inference_symbol(cfg, 4, compiled_deformable=True)
    for row, (scale, label) in enumerate(((1.0, 3), (0.5, 1))):
        canvas = np.zeros((1, 3, int(np.ceil(60 * scale)), int(np.ceil(80 * scale))), np.float32)
        prepare_image(image, scale, cfg.network.PIXEL_MEANS, cfg.network.CHANNEL_ORDER, canvas[0])
        rois = np.array([[0, *(boxes[row] * scale)]], np.float32)
        executor = symbol.bind(mx.cpu(), {**args, "data": mx.nd.array(canvas), "mask_rois": mx.nd.array(rois)},
                               aux_states=aux)
        expected = executor.forward()[0].asnumpy()[0, label - 1]
        np.testing.assert_allclose(maps[row], expected, rtol=1e-5, atol=1e-6)  # same graph, other batch shapes
    masks = head.masks(image, boxes, labels)
    assert masks.shape == (2, 60, 80) and not masks[:, :, 61:].any()  # nothing beyond the boxes
    assert head.masks(image, np.zeros((0, 4)), np.zeros(0)).shape == (0, 60, 80)


def test_detector_of_a_mask_network_returns_and_draws_masks(tiny_mask_network):
    cfg, (args, aux) = tiny_mask_network
    detector = Detector.from_params(cfg, ["background", "a", "b", "c"], args, aux, contexts=[mx.cpu()])
    image = np.random.RandomState(2).randint(0, 255, (48, 64, 3)).astype(np.uint8)
    found = detector(image)
    assert len(found) > 0 and found.masks.shape == (len(found), 48, 64) and found.masks.dtype == bool
    expected = detector.mask_head.masks(image, found.boxes, found.labels)
    np.testing.assert_array_equal(found.masks, expected)
    kept = found.above(float(np.median(found.scores)))
    assert kept.masks.shape == (len(kept), 48, 64)
    # a mask tints its pixels in the detection's colour: drawing with masks differs from drawing without
    # exactly where some shown mask is (or a box outline / tag is drawn)
    strongest = found.above(found.scores[0])
    with_masks = detector.draw(image, strongest, thresh=0)
    plain = draw_detections(image, strongest.to_array(), detector.classes, 0)
    changed = (with_masks != plain).any(axis=2)
    assert not (changed & ~strongest.masks.any(axis=0)).any()
    assert strongest.masks.any() and changed.any()  # seeded weights: this mask covers 648 px


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
    is its left half; the picture (640 px wide: x3.2, under a 24-px legend) is tinted there only."""
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
                "segmentation": encode_masks(mask)[0]}]
    (tmp_path / "results.json").write_text(json.dumps(results))
    tool = [sys.executable, os.path.join(ROOT, "tools", "visualize_detections.py"), "--folder", str(folder),
            "--out", str(tmp_path / "out")]
    done = subprocess.run(tool + ["--results", str(tmp_path / "results.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    sheet = cv2.imread(str(tmp_path / "out" / "detections_000.png")).astype(int)

    def pixel(x, y):
        return sheet[24 + int(y * 3.2), int(x * 3.2)]

    assert np.abs(pixel(45, 40) - 128).max() > 20  # inside the mask: tinted
    assert (pixel(95, 40) == 128).all() and (pixel(150, 40) == 128).all()  # in the box beyond the mask; outside
    results[0]["segmentation"] = {"size": [100, 200], "counts": 5}
    (tmp_path / "broken.json").write_text(json.dumps(results))
    failed = subprocess.run(tool + ["--results", str(tmp_path / "broken.json")], capture_output=True, text=True)
    assert failed.returncode == 1 and "not a COCO RLE" in failed.stderr and "Traceback" not in failed.stderr
