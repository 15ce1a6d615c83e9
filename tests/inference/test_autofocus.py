"""AutoFocus: the FocusPixel branch of the network (manifest of the reference's test network, wiring, loss
normalisation), its config keys, the FocusPixel labels of a chip and the FocusChips of a scale, against
hand-worked cases of the reference's rules."""
import json
import os

import mxnet as mx
import numpy as np
import pytest

from focus_helpers import IMAGE, TWO_LEVELS, FocusOracle, focus_detector, two_level_oracle
from network_helpers import bind_random, graph_nodes, inference_shapes, node_attrs, parameter_shapes, train_shapes

from lib.bootstrap import ROOT
from lib.config import ConfigError, load_config
from lib.data.focus_labels import FocusLabelParams, focus_labels, label_map
from lib.inference.focus_chips import FocusChipParams, border_keep_mask, focus_chips
from symbols import inference_symbol, training_symbol

MANIFEST = os.path.join(ROOT, "tests", "data", "sniper_res101_autofocus_test_params.json")
CONFIG = os.path.join(ROOT, "configs", "faster", "sniper_res101_e2e_autofocus.yml")
TEST_INPUTS = inference_shapes(1, 512)


# ---------------------------------------------------------------- network

def test_autofocus_test_network_matches_the_reference_manifest():
    with open(MANIFEST) as f:
        manifest = json.load(f)
    symbol = inference_symbol(load_config(CONFIG), 81)
    args, aux, outs = parameter_shapes(symbol, TEST_INPUTS)
    assert len(args) == 336 and len(aux) == 202
    assert args == manifest["args"] and aux == manifest["aux"] and outs == manifest["outputs"]
    assert symbol.list_outputs() == ["rois_output", "cls_prob_reshape_output", "bbox_pred_reshape_output",
                                     "im_ids", "chip_ids", "im_info", "scale_prob_output"]
    plain, _, _ = parameter_shapes(inference_symbol(load_config(None, {"symbol": "resnet101"}), 81), TEST_INPUTS)
    assert sorted(set(args) - set(plain)) == ["conv_new_2_bias", "conv_new_2_weight", "conv_new_3_bias",
                                              "conv_new_3_weight", "conv_new_out_bias", "conv_new_out_weight"]


@pytest.mark.parametrize("is_train", [False, True])
def test_focus_branch_reads_the_head_features(is_train):
    import lib.ops  # noqa: F401
    cfg = load_config(None, {"symbol": "resnet_tiny", "network.AUTO_FOCUS": True, "TRAIN.fp16": is_train,
                             "TEST.fp16": False})
    symbol = training_symbol(cfg, 5, 2) if is_train else inference_symbol(cfg, 5)
    nodes = graph_nodes(symbol)
    by_name = {n["name"]: n for n in nodes}
    source = {name: nodes[by_name[name]["inputs"][0][0]]["name"] for name in
              ("conv_new_1", "conv_new_2", "rpn_conv_3x3", "conv_new_3", "conv_new_out")}
    features = "features_fp32" if is_train else "res4_res5"  # float32 features, after the fp16 cast back
    assert source["conv_new_2"] == source["conv_new_1"] == source["rpn_conv_3x3"] == features
    assert source["conv_new_3"] == "conv_new_2_relu" and source["conv_new_out"] == "conv_new_3_relu"
    attrs = {name: by_name[name]["attrs"] for name in ("conv_new_2", "conv_new_3", "conv_new_out")}
    assert (attrs["conv_new_2"]["kernel"], attrs["conv_new_2"]["pad"], attrs["conv_new_2"]["num_filter"]) == \
        ("(3, 3)", "(1, 1)", "256")
    assert (attrs["conv_new_3"]["kernel"], attrs["conv_new_3"]["num_filter"]) == ("(1, 1)", "256")
    assert (attrs["conv_new_out"]["kernel"], attrs["conv_new_out"]["num_filter"]) == ("(1, 1)", "2")


@pytest.mark.parametrize("fp16", [False, True])
def test_training_graph_adds_the_focus_loss_last(fp16):
    import lib.ops  # noqa: F401
    cfg = load_config(None, {"symbol": "resnet_tiny", "network.AUTO_FOCUS": True, "TRAIN.fp16": fp16})
    symbol = training_symbol(cfg, 5, 2)
    _, _, outs = parameter_shapes(symbol, train_shapes(2, 256, focus=True))
    assert list(outs) == ["rpn_cls_prob_output", "rpn_bbox_loss_output", "cls_prob_output", "bbox_loss_output",
                          "rcnn_label_output", "scale_prob_output"]
    assert outs["scale_prob_output"] == [2, 2, 16 * 16]
    attrs = node_attrs(symbol)["scale_prob"]
    assert attrs["normalization"] == "valid" and attrs["multi_output"] == "True" and attrs["use_ignore"] == "True"
    assert float(attrs["ignore_label"]) == -1 and float(attrs["grad_scale"]) == (100.0 if fp16 else 1.0)
    plain = training_symbol(load_config(None, {"symbol": "resnet_tiny"}), 5, 2)
    assert "scale_label" not in plain.list_arguments() and "scale_label" in symbol.list_arguments()
    rpn_only = training_symbol(cfg, 5, 2, rpn_only=True)  # proposal extraction has no focus branch
    assert not any(n.startswith("conv_new") or n == "scale_label" for n in rpn_only.list_arguments())


def test_focus_loss_is_averaged_over_the_labelled_cells_of_the_batch():
    """d loss / d conv_new_out_bias = sum over labelled cells (p - onehot) / (number of labelled cells)."""
    import lib.ops  # noqa: F401
    chips, size = 2, 128
    cfg = load_config(None, {"symbol": "resnet_tiny", "network.AUTO_FOCUS": True, "TRAIN.fp16": False})
    inputs = train_shapes(chips, size, focus=True)
    executor, rng = bind_random(training_symbol(cfg, 5, chips), inputs, seed=0, grad_req="write")
    executor.arg_dict["conv_new_out_weight"][:] = rng.normal(0, 1, executor.arg_dict["conv_new_out_weight"].shape)
    executor.arg_dict["im_info"][:] = [[size, size, 1.0]] * chips
    executor.arg_dict["valid_ranges"][:] = -1
    executor.arg_dict["gt_boxes"][:] = -1
    executor.arg_dict["label"][:] = -1
    scale_label = -np.ones(inputs["scale_label"])
    scale_label[0, [0, 5, 9]] = [1, 0, 0]
    scale_label[1, [3, 15]] = [1, 1]
    executor.arg_dict["scale_label"][:] = scale_label
    prob = executor.forward(is_train=True)[5].asnumpy()  # (chips, 2, cells)
    executor.backward()
    onehot = np.stack([scale_label == 0, scale_label == 1], axis=1)
    labelled = (scale_label >= 0)[:, None, :]
    expected = ((prob - onehot) * labelled).sum(axis=(0, 2)) / labelled.sum()
    np.testing.assert_allclose(executor.grad_dict["conv_new_out_bias"].asnumpy(), expected, rtol=1e-4, atol=1e-7)


def test_test_network_scale_prob_is_a_channel_softmax():
    cfg = load_config(None, {"symbol": "resnet_tiny", "network.AUTO_FOCUS": True, "TEST.fp16": False})
    internals = inference_symbol(cfg, 5).get_internals()
    probe = mx.sym.Group([internals["conv_new_out_output"], internals["scale_prob_output"]])
    executor, _ = bind_random(probe, dict(data=(1, 3, 64, 64)), seed=1)
    score, prob = [o.asnumpy() for o in executor.forward()]
    assert prob.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(prob[:, 1], 1 / (1 + np.exp(score[:, 0] - score[:, 1])), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- config

def test_autofocus_config_has_the_reference_settings():
    cfg = load_config(CONFIG)
    assert cfg.symbol == "resnet101" and cfg.network.AUTO_FOCUS and cfg.TEST.AUTO_FOCUS
    assert (cfg.TRAIN.AUTO_FOCUS_SMALL_THRESH, cfg.TRAIN.AUTO_FOCUS_DC_LOW, cfg.TRAIN.AUTO_FOCUS_DC_HIGH) == (64, 5, 90)
    assert cfg.TEST.SCALES == ((480, 512), (800, 1280), (1400, 2000))  # coarsest first
    assert (cfg.TEST.BATCH_IMAGES, cfg.TEST.BATCH_PARTS) == ((8, 8, 2), 2)
    assert cfg.TRAIN.SCALES == (3.0, 1.667, 512.0)  # what the reference's main_train.py forces for 81-class COCO
    assert cfg.TEST.VALID_RANGES == ((75, -1), (32, 180), (-1, 75))
    assert cfg.TEST.DO_PRUNING == (False, True, True)
    assert cfg.TEST.CHIP_HYPERPARAMS == ((3, 0.02, 16), (3, 0.2, 20), (-1, -1, -1))
    assert FocusChipParams.from_config(cfg, 0) == FocusChipParams(dilation=3, threshold=0.02, min_size=16, stride=16)
    assert FocusChipParams.from_config(cfg, 1) == FocusChipParams(dilation=3, threshold=0.2, min_size=20, stride=16)
    assert FocusLabelParams.from_config(cfg) == FocusLabelParams(64.0, 5.0, 90.0, stride=16, chip_size=512)
    assert cfg.dataset.image_set == "train2014+valminusminival2014" and cfg.dataset.test_image_set == "minival2014"


@pytest.mark.parametrize("overrides, message", [
    ({"network.AUTO_FOCUS": False}, r"TEST\.AUTO_FOCUS.*network\.AUTO_FOCUS"),
    ({"TEST.DO_PRUNING": [False, True]}, r"TEST\.DO_PRUNING.*one entry per test scale \(3\)"),
    ({"TEST.DO_PRUNING": [True, True, True]}, r"TEST\.DO_PRUNING.*first"),
    ({"TEST.DO_PRUNING": [False, 1, True]}, r"TEST\.DO_PRUNING.*true/false"),
    ({"TEST.CHIP_HYPERPARAMS": [[3, 0.02, 16], [3, 0.2]]}, r"TEST\.CHIP_HYPERPARAMS.*one entry"),
    ({"TEST.CHIP_HYPERPARAMS": [[3, 0.02, 16], [3, "x", 20], [-1, -1, -1]]}, r"CHIP_HYPERPARAMS\[1\].*three numbers"),
    ({"TEST.CHIP_HYPERPARAMS": [[0, 0.02, 16], [3, 0.2, 20], [-1, -1, -1]]}, r"CHIP_HYPERPARAMS\[0\].*dilation"),
    ({"TEST.CHIP_HYPERPARAMS": [[3, 0.02, 16], [3, 1.5, 20], [-1, -1, -1]]}, r"CHIP_HYPERPARAMS\[1\].*threshold"),
    ({"TEST.CHIP_HYPERPARAMS": [[3, 0.02, 2.5], [3, 0.2, 20], [-1, -1, -1]]}, r"CHIP_HYPERPARAMS\[0\].*minimum"),
    ({"TRAIN.AUTO_FOCUS_DC_LOW": 70}, r"TRAIN\.AUTO_FOCUS_SMALL_THRESH"),
    ({"TRAIN.AUTO_FOCUS_DC_HIGH": 50}, r"TRAIN\.AUTO_FOCUS_SMALL_THRESH"),
])
def test_autofocus_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, list(overrides.items()))


def test_unpruned_scales_need_no_chip_parameters():
    cfg = load_config(CONFIG, [("TEST.DO_PRUNING", [False, True, False]),
                               ("TEST.CHIP_HYPERPARAMS", [[3, 0.02, 16], [-1, -1, -1], [-1, -1, -1]])])
    assert cfg.TEST.DO_PRUNING == (False, True, False)


# ---------------------------------------------------------------- FocusPixel labels

LABELS = FocusLabelParams(small_thresh=64, dontcare_low=5, dontcare_high=90, stride=16, chip_size=512)
WHOLE = (0, 0, 512, 512)


def marked(labels):
    """{value: set of (row, col)} of the non-zero cells."""
    return {value: {tuple(c) for c in np.argwhere(labels == value)} for value in (1, -1) if (labels == value).any()}


def cells(rows, cols):
    return {(r, c) for r in rows for c in cols}


def test_small_object_cells_are_positive_with_inclusive_rounded_out_extents():
    labels = focus_labels([[20, 40, 60, 70]], 1.0, WHOLE, LABELS)  # sqrt(40 * 30) = 34.6
    assert labels.shape == (32, 32) and labels.dtype == np.float32
    # columns floor(20/16)=1 .. ceil(60/16)=4, rows floor(40/16)=2 .. ceil(70/16)=5, ends included
    assert marked(labels) == {1: cells(range(2, 6), range(1, 5))}


@pytest.mark.parametrize("side, expected", [
    (4, -1),    # at most DC_LOW: ignored
    (5, -1),    # sqrt(area) == DC_LOW: still ignored
    (6, 1),
    (63, 1),
    (64, -1),   # SMALL_THRESH <= s < DC_HIGH: ignored
    (89, -1),
    (90, 0),    # large: no mark
    (200, 0),
])
def test_size_bands(side, expected):
    labels = label_map([[100, 100, 100 + side, 100 + side]], LABELS)
    first, last = 100 // 16, int(np.ceil((100 + side) / 16))
    block = labels[first:last + 1, first:last + 1]
    assert (block == expected).all() and (labels != 0).sum() == (block.size if expected else 0)


def test_later_boxes_overwrite_and_large_ones_leave_cells_alone():
    small, ambiguous, large = [32, 32, 60, 60], [20, 20, 95, 95], [0, 0, 300, 300]
    assert marked(label_map([small, ambiguous], LABELS)) == {-1: cells(range(1, 7), range(1, 7))}
    assert marked(label_map([ambiguous, small], LABELS)) == {
        -1: cells(range(1, 7), range(1, 7)) - cells(range(2, 5), range(2, 5)), 1: cells(range(2, 5), range(2, 5))}
    assert marked(label_map([small, large], LABELS)) == {1: cells(range(2, 5), range(2, 5))}


def test_boxes_are_scaled_shifted_rounded_half_to_even_and_clipped_to_the_chip():
    # image box (10, 10, 28.25, 40) at scale 2 in the chip starting at (8, 8): (12, 12, 48.5, 72);
    # 48.5 rounds to 48 (half to even), so the last column is ceil(48/16) = 3, not 4
    labels = focus_labels([[10, 10, 28.25, 40]], 2.0, (8, 8, 520, 520), LABELS)
    assert marked(labels) == {1: cells(range(0, 6), range(0, 4))}
    # right of the chip: clipped to the line x = 511 (s = 0), which ignores the border cells beside it
    labels = focus_labels([[600, 100, 700, 200]], 1.0, WHOLE, LABELS)
    assert marked(labels) == {-1: cells(range(6, 14), [31])}
    # a box reaching the chip's last pixel: ceil(511/16) = 32 is cut at the map's last column 31
    assert marked(focus_labels([[470, 0, 530, 30]], 1.0, WHOLE, LABELS)) == {1: cells(range(0, 3), range(29, 32))}


def test_label_map_size_follows_the_stride():
    params = FocusLabelParams(small_thresh=64, dontcare_low=5, dontcare_high=90, stride=32, chip_size=512)
    labels = focus_labels([[40, 40, 80, 80]], 1.0, WHOLE, params)
    assert labels.shape == (16, 16) and marked(labels) == {1: cells(range(1, 4), range(1, 4))}
    assert focus_labels(np.zeros((0, 4)), 1.0, WHOLE, params).shape == (16, 16)


# ---------------------------------------------------------------- FocusChips

def one_chip(focus_map, region, scale, params):
    chips = focus_chips(focus_map, region, scale, params)
    assert chips.shape == (1, 4)
    return chips[0].tolist()


def test_a_focus_pixel_grows_to_the_minimum_chip_around_its_centre():
    focus_map = np.zeros((10, 10))
    focus_map[4, 3] = 0.9
    # cell (row 4, col 3), no dilation: 2x2 cells centred at (3, 4) with integer halves -> cols 2-3, rows 3-4
    assert one_chip(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.5, 2, 16)) == [32, 48, 64, 80]
    # a 3x3 dilation makes it cols 2-4, rows 3-5: already above the minimum size
    assert one_chip(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(3, 0.5, 2, 16)) == [32, 48, 80, 96]
    # the threshold is inclusive
    assert one_chip(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.9, 2, 16)) == [32, 48, 64, 80]
    assert focus_chips(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.91, 2, 16)).shape == (0, 4)


def test_overlapping_grown_rectangles_merge_into_one_chip():
    focus_map = np.zeros((10, 10))
    focus_map[2, 2] = focus_map[2, 5] = 1
    # 4x4 rectangles: cols 0-3 (pushed off the left edge) and 3-6 overlap -> their union, cols 0-6, rows 0-3
    assert one_chip(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.5, 4, 16)) == [0, 0, 112, 64]
    focus_map[2, 5], focus_map[8, 8] = 0, 1  # far apart: two chips
    chips = focus_chips(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.5, 4, 16))
    assert sorted(chips.tolist()) == [[0, 0, 64, 64], [96, 96, 160, 160]]


def test_a_ring_gives_one_chip():
    focus_map = np.zeros((10, 10))
    focus_map[2:7, 2:7] = 1
    focus_map[3:6, 3:6] = 0  # the hole's own contour is painted over by the ring's rectangle
    assert one_chip(focus_map, (0, 0, 160, 160), 1.0, FocusChipParams(1, 0.5, 1, 16)) == [32, 32, 112, 112]


def test_chips_stay_in_the_region_and_map_to_original_pixels():
    focus_map = np.zeros((10, 10))  # the map covers padding: the region is 100 x 160 scaled pixels
    focus_map[5, 6] = 1
    # cells: region 7 x 10; cols 4-7 would overhang -> pushed to 3-6 = 48..112 px, cut at 100 and started
    # min_size cells before it (36); rows 3-6 = 48..112. Then / scale 2 + region origin (200, 300).
    assert one_chip(focus_map, (200, 300, 250, 380), 2.0, FocusChipParams(1, 0.5, 4, 16)) == [218, 324, 250, 356]


def test_every_focus_pixel_is_inside_a_chip_and_chips_inside_the_region():
    rng = np.random.RandomState(4)
    params = FocusChipParams(dilation=3, threshold=0.8, min_size=5, stride=16)
    for _ in range(20):
        focus_map = rng.uniform(0, 1, (20, 24)) ** 4
        region = (rng.uniform(0, 100), rng.uniform(0, 100))
        scale = rng.uniform(0.5, 2.0)
        width, height = rng.uniform(100, 24 * 16), rng.uniform(100, 20 * 16)
        region = (*region, region[0] + width / scale, region[1] + height / scale)
        chips = focus_chips(focus_map, region, scale, params)
        cols, rows = int(np.ceil(width / 16)), int(np.ceil(height / 16))
        for r, c in np.argwhere(focus_map[:rows, :cols] >= params.threshold):
            x, y = region[0] + c * 16 / scale, region[1] + r * 16 / scale
            assert ((chips[:, 0] <= x + 1e-9) & (x < chips[:, 2]) & (chips[:, 1] <= y + 1e-9) & (y < chips[:, 3])).any()
        assert (chips[:, :2] >= np.array(region[:2]) - 1e-9).all()
        assert (chips[:, 2:] <= np.array(region[2:]) + 1e-9).all()
        sides = chips[:, 2:] - chips[:, :2]
        assert (sides >= np.minimum(params.min_size * 16, [width, height]) / scale - 1e-6).all()


def test_detections_cut_by_an_inner_chip_border_are_dropped():
    width, height = 1000, 800
    chip = (100, 0, 500, 400)  # left, right and bottom edges inside the image, top edge on its border
    dets = np.array([
        [105, 50, 200, 100, 0.9],  # 5 px from the left edge: cut
        [110, 50, 200, 100, 0.9],  # 10 px: kept
        [150, 2, 300, 100, 0.9],   # at the top, which is the image border: kept
        [150, 50, 495, 100, 0.9],  # right edge: cut
        [150, 50, 300, 391, 0.9],  # bottom edge, 9 px: cut
        [150, 50, 300, 390, 0.9],  # 10 px: kept
    ])
    np.testing.assert_array_equal(border_keep_mask(dets, chip, width, height), [False, True, True, False, False, True])
    assert border_keep_mask(dets, (0, 0, width, height), width, height).all()
    assert border_keep_mask(dets, (0.4, 0, 999.6, 800), width, height).all()  # within half a pixel of the border
    assert border_keep_mask(np.zeros((0, 5)), chip, width, height).shape == (0,)


# ---------------------------------------------------------------- training wiring

def test_loader_gives_every_chip_the_focus_labels_of_its_image_boxes(synthetic_dataset, tmp_path):
    from lib.data import ChipLoader
    from lib.dataset import load_roidb

    cfg = load_config(None, {"dataset.dataset_path": synthetic_dataset(train=3, val=0), "dataset.image_set": "train",
                             "dataset.root_path": str(tmp_path), "network.AUTO_FOCUS": True})
    roidb = load_roidb(cfg, "train")[0]
    params = FocusLabelParams.from_config(cfg)
    with ChipLoader(roidb, cfg, 4, num_workers=0, seed=2) as loader:
        names = [d.name for d in loader.provide_label]
        assert names[-1] == "scale_label" and loader.provide_label[-1].shape == (4, 32 * 32)
        positives = 0
        for number, batch in enumerate(loader):
            labels = batch.label[-1].asnumpy()
            for position in range(4 - batch.pad):
                chip = loader.chip_ref(number, position)
                entry = roidb[chip.image_index]
                expected = focus_labels(entry["boxes"], chip.im_scale, chip.box, params)
                np.testing.assert_array_equal(labels[position], expected.ravel())
                positives += int((labels[position] == 1).any())
    assert positives > 0  # the synthetic shapes include small objects
    with ChipLoader(roidb, cfg, 4, num_workers=0, rpn_only=True) as loader:  # no branch: no labels
        assert "scale_label" not in [d.name for d in loader.provide_label]


def test_focus_metrics_hand_worked():
    from lib.train.metrics import make_metrics, loss_values

    outputs = ["rpn_cls_prob_output", "rpn_bbox_loss_output", "scale_prob_output"]
    metric = make_metrics(outputs, ["label", "bbox_target", "bbox_weight", "scale_label"], rpn_only=True)
    prob = np.zeros((1, 2, 3), np.float32)
    prob[0, 1] = [0.9, 0.2, 0.6]
    prob[0, 0] = 1 - prob[0, 1]
    rpn_prob = np.full((1, 2, 1, 1), 0.5, np.float32)
    labels = [mx.nd.array([[0]]), mx.nd.zeros((1, 4)), mx.nd.zeros((1, 4)), mx.nd.array([[1, -1, 0]])]
    metric.update(labels, [mx.nd.array(rpn_prob), mx.nd.zeros((1, 4)), mx.nd.array(prob)])
    values = loss_values(metric)
    # cell 0: label 1, p = 0.9 (right); cell 1 ignored; cell 2: label 0, p(0) = 0.4 (wrong)
    assert values["FocusAcc"] == pytest.approx(0.5)
    assert values["FocusLogLoss"] == pytest.approx(-(np.log(0.9) + np.log(0.4)) / 2, rel=1e-5)
    plain = make_metrics(outputs[:2], ["label", "bbox_target", "bbox_weight"], rpn_only=True)
    assert "FocusAcc" not in loss_values(plain)


def test_tiny_autofocus_network_trains_with_finite_falling_focus_loss(tmp_path):
    from lib.train.trainer import train

    cfg = load_config(os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml"), [
        ("dataset.dataset_path", str(tmp_path / "data")), ("dataset.synthetic_train", 2),
        ("dataset.synthetic_val", 1), ("dataset.root_path", str(tmp_path)), ("output_path", str(tmp_path)),
        ("TRAIN.NUM_PROCESS", 0), ("TRAIN.BATCH_IMAGES", 2), ("TRAIN.end_epoch", 3), ("TRAIN.warmup_step", 5),
        ("TRAIN.lr_step", ""), ("TRAIN.lr", 0.01), ("gpus", "cpu:1"), ("network.AUTO_FOCUS", True)])
    _, history = train(cfg)
    losses = [epoch["FocusLogLoss"] for epoch in history]
    assert all(np.isfinite(loss) for epoch in history for loss in epoch.values())
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------- AutoFocus inference

def run_regions(detector, images, num_workers=0):
    from lib.inference.autofocus import AutoFocusStats
    from lib.inference.streaming import ArrayImages

    regions, stats = [], AutoFocusStats()
    found = dict(detector.strategy.run(ArrayImages(images), num_workers, stats=stats,
                                       on_region=lambda level, region, result, chips: regions.append(
                                           (level, region.image, tuple(region.box), [tuple(c) for c in chips]))))
    return [found[i] for i in range(len(images))], sorted(regions), stats


def test_autofocus_processes_the_focus_chip_at_the_next_scale_and_merges_hand_worked():
    from lib.inference.streaming import prepare_image

    oracle = two_level_oracle()
    detector = focus_detector(oracle, pruning=[False, True], **TWO_LEVELS)
    (dets,), regions, stats = run_regions(detector, [IMAGE])
    assert regions == [(0, 0, (0, 0, 200, 160), [(48, 32, 112, 96)]), (1, 0, (48, 32, 112, 96), [])]
    assert [data.shape for data, _ in oracle.calls] == [(1, 3, 160, 200), (1, 3, 128, 128)]
    np.testing.assert_allclose(oracle.calls[1][1], [[128, 128, 1]])
    expected = np.zeros((3, 128, 128), np.float32)  # the chip's pixels, cropped from the original image
    prepare_image(IMAGE[32:96, 48:112], 2.0, detector.cfg.network.PIXEL_MEANS, "RGB", expected)
    np.testing.assert_array_equal(oracle.calls[1][0][0], expected)
    # level 0 keeps the large box (area 2500 > 20^2), not the small one; level 1 keeps the box inside the chip
    # (area 225 <= 20^2) and drops the one its left edge cut
    np.testing.assert_allclose(dets, [[100, 100, 150, 150, 0.9, 1], [68, 52, 83, 67, 0.8, 1]], rtol=1e-6)
    assert [(s.regions, s.pixels, s.full_pixels) for s in stats.levels] == [(1, 32000, 32000), (1, 16384, 128000)]


def test_without_pruning_the_next_scale_processes_the_whole_image():
    oracle = two_level_oracle()
    (dets,), regions, stats = run_regions(focus_detector(oracle, pruning=[False, False], **TWO_LEVELS), [IMAGE])
    assert [region[:3] for region in regions] == [(0, 0, (0, 0, 200, 160)), (1, 0, (0, 0, 200, 160))]
    assert regions[0][3] == []  # no chips are made for a level that is not pruned
    assert [data.shape for data, _ in oracle.calls] == [(1, 3, 160, 200), (1, 3, 320, 400)]
    assert stats.pixels == stats.full_pixels == 32000 + 128000


def test_chips_are_found_in_chips_recursively_and_an_image_without_focus_pixels_stops():
    oracle = two_level_oracle()
    # level 1 (scale 2) also finds a FocusPixel at row 1, column 6 of its 8 x 8 cells: 2 x 2 cells, columns 5-6
    # and rows 0-1 = (80..112, 0..32) scaled, / 2 + the chip's origin (48, 32) = (88, 32, 104, 48)
    oracle.outputs[(128, 128)] = oracle.outputs[(128, 128)][:2] + ([(1, 6)],)
    blank = np.zeros((100, 100, 3), np.uint8)  # no FocusPixels: processed at the coarsest scale only
    detector = focus_detector(oracle, scales=[1.0, 2.0, 4.0], ranges=[[20, -1], [-1, 20], [-1, 10]],
                              pruning=[False, True, True], chip_params=[[1, 0.5, 4], [1, 0.5, 2], [-1, -1, -1]])
    _, regions, stats = run_regions(detector, [IMAGE, blank])
    assert regions == [(0, 0, (0, 0, 200, 160), [(48, 32, 112, 96)]), (0, 1, (0, 0, 100, 100), []),
                       (1, 0, (48, 32, 112, 96), [(88, 32, 104, 48)]), (2, 0, (88, 32, 104, 48), [])]
    assert [data.shape for data, _ in oracle.calls][-1] == (1, 3, 64, 64)  # 16 x 16 at scale 4
    assert [s.regions for s in stats.levels] == [2, 1, 1]


def test_regions_are_batched_within_the_reference_parts_of_the_set_with_each_scale_count():
    # four landscape images: by area over the whole set 0, 2, 1, 3 would pair 0 with 2; the reference's
    # driver (CONCURRENT_JOBS 2) splits the set into images {0, 1} and {2, 3} and batches each part alone
    images = [np.zeros((side, side, 3), np.uint8) for side in (100, 200, 110, 210)]
    oracle = FocusOracle({})
    # TEST.BATCH_IMAGES [2, 1]: level 1 runs one image per batch
    detector = focus_detector(oracle, pruning=[False, False], overrides={"TEST.BATCH_IMAGES": [2, 1],
                                                                         "TEST.BATCH_PARTS": 2}, **TWO_LEVELS)
    run_regions(detector, images)
    shapes = sorted(data.shape for data, _ in oracle.calls)
    assert shapes == sorted([(2, 3, 200, 200), (2, 3, 210, 210)]  # level 0: parts {0, 1} and {2, 3}
                            + [(1, 3, 2 * side, 2 * side) for side in (100, 200, 110, 210)])


def test_level_batches_without_parts_batch_the_whole_set_by_area():
    from lib.inference.autofocus import level_batches
    from lib.inference.regions import Region
    from lib.scales import ScaleSpec

    # regions image by image; image 1 has a second region (a chip), which stays in its image's part {0, 1}
    sides = ((0, 100), (1, 200), (1, 50), (2, 110), (3, 210))
    regions = [Region(image, (0.0, 0.0, float(side), float(side))) for image, side in sides]
    whole = level_batches(regions, [1.0] * 5, 4, ScaleSpec(factor=1.0), 2, 1)
    split = level_batches(regions, [1.0] * 5, 4, ScaleSpec(factor=1.0), 2, 2)
    # areas 2500 (2), 10000 (0), 12100 (3), 40000 (1), 44100 (4); an odd group is padded by its last entry
    assert [b.images for b in whole] == [(2, 0), (3, 1), (4,)]
    assert [b.images for b in split] == [(2, 0), (1,), (3, 4)]
    assert [b.canvas for b in split] == [(100, 100), (200, 200), (210, 210)]
    with pytest.raises(ValueError, match="image by image"):
        level_batches(regions[::-1], [1.0] * 5, 4, ScaleSpec(factor=1.0), 2, 2)


def test_autofocus_runs_through_the_detector_and_its_worker_processes(tmp_path):
    from lib.inference.autofocus import AutoFocus
    from lib.inference.streaming import ArrayImages

    detector = focus_detector(two_level_oracle(), pruning=[False, True], **TWO_LEVELS)
    assert isinstance(detector.strategy, AutoFocus)
    inline = detector.detect([IMAGE, IMAGE[:, ::-1].copy()])
    forked = dict(detector.run(ArrayImages([IMAGE, IMAGE[:, ::-1].copy()]), num_workers=2))
    np.testing.assert_allclose(inline[0], [[100, 100, 150, 150, 0.9, 1], [68, 52, 83, 67, 0.8, 1]], rtol=1e-6)
    for index in range(2):
        np.testing.assert_array_equal(forked[index], inline[index])
    # the whole pyramid on request, without AutoFocus: both scales on the whole image
    full = detector.results([IMAGE], detector.levels)[0]
    assert len(full) == 1  # only the large box: at scale 2 the oracle knows no 320 x 400 input



def test_an_unreadable_image_is_reported_once_and_the_others_complete():
    from lib.inference.streaming import ArrayImages

    class Broken(ArrayImages):
        def read(self, index):
            if index == 1:
                raise IOError("cannot decode image 1")
            return super().read(index)

    detector = focus_detector(two_level_oracle(), pruning=[False, True], **TWO_LEVELS)
    results = list(detector.strategy.run(Broken([IMAGE, IMAGE, IMAGE])))
    assert sorted(index for index, _ in results) == [0, 1, 2]
    found = dict(results)
    assert isinstance(found[1], IOError) and "image 1" in str(found[1])
    np.testing.assert_allclose(found[2], found[0])
    assert len(found[0]) == 2

def test_region_crops_are_whole_pixels_and_may_overhang_their_canvas():
    from lib.inference.regions import Region, RegionImages
    from lib.inference.batching import plan_level
    from lib.inference.streaming import ArrayImages
    from lib.scales import ScaleSpec

    regions = [Region(0, (10.7, 20.2, 40.9, 30.1)), Region(0, (150.5, 0.0, 200.0, 160.0))]
    source = RegionImages(ArrayImages([IMAGE]), regions)
    np.testing.assert_array_equal(source.read(0), IMAGE[20:30, 10:40])  # int() of the corners
    np.testing.assert_array_equal(source.read(1), IMAGE[0:160, 150:200])
    assert source.sizes() == [pytest.approx((9.9, 30.2)), (160.0, 49.5)]
    # canvases from the fractional extents: ceil(9.9 * 2) = 20 rows, ceil(30.2 * 2) = 61 columns; the crop
    # of 10 x 30 px resizes to 20 x 60
    batch, = plan_level(source.sizes()[:1], ScaleSpec(factor=2.0), 1, 1, scales=[2.0])
    assert batch.canvas == (20, 61)
    from lib.inference.streaming import prepare_image
    out = np.zeros((3, 19, 61), np.float32)  # one row short: the crop is cut, as the reference cuts it
    assert prepare_image(source.read(0), 2.0, (0, 0, 0), "BGR", out, cut=True) == (20, 60)
    with pytest.raises(ValueError, match="does not fit"):
        prepare_image(source.read(0), 2.0, (0, 0, 0), "BGR", out)


def test_focus_pixel_boxes_are_the_cells_inside_the_region_in_original_pixels():
    from lib.inference.focus_chips import focus_pixel_boxes

    focus_map = np.zeros((4, 5))
    focus_map[1, 2], focus_map[2, 4], focus_map[3, 0] = 0.7, 0.9, 0.8  # (3, 0) lies in the map's padding
    # region 70 x 40 original pixels at scale 0.5: 35 x 20 scaled = 3 x 2 cells of 16 (the last ones cut at
    # 35 and 20); cell (1, 2) is x 32..35, y 16..20 scaled -> / 0.5 + (100, 200)
    boxes, probs = focus_pixel_boxes(focus_map, (100, 200, 170, 240), 0.5, 16, 0.5)
    np.testing.assert_allclose(boxes, [[164, 232, 170, 240]])
    np.testing.assert_allclose(probs, [0.7])


# ---------------------------------------------------------------- tools

@pytest.fixture(scope="module")
def focus_everywhere(synthetic_dataset, tmp_path_factory):
    """A random tiny AutoFocus checkpoint whose FocusPixel branch says "small object" everywhere, and the
    command-line settings of a 2-image synthetic test set at small scales."""
    folder, root = synthetic_dataset(train=1, val=2), tmp_path_factory.mktemp("focus_tools")
    config = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny_autofocus.yml")
    settings = ["--set", f"dataset.dataset_path={folder}", f"dataset.root_path={root}", f"output_path={root}",
                "gpus=cpu:1", "TEST.SCALES=[128.0, 0.25, 0.5]",
                "TEST.CHIP_HYPERPARAMS=[[1, 0.5, 2], [1, 0.5, 2], [-1, -1, -1]]"]
    cfg = load_config(config, [tuple(s.split("=", 1)) for s in settings[1:]])
    module = mx.mod.Module(inference_symbol(cfg, 6), data_names=("data", "im_info", "im_ids", "chip_ids"),
                           label_names=None, context=mx.cpu())
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Normal(0.01))
    args, aux = module.get_params()
    args["conv_new_out_weight"][:] = 0
    args["conv_new_out_bias"][:] = mx.nd.array([-10, 10])
    path = str(root / "focus-0001.params")
    mx.nd.save(path, {**{f"arg:{k}": v for k, v in args.items()}, **{f"aux:{k}": v for k, v in aux.items()}})
    return config, settings, path, root


def run_tool(name, *argv):
    import subprocess
    import sys

    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *argv], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_benchmark_tool_compares_autofocus_with_full_inference(focus_everywhere):
    config, settings, path, root = focus_everywhere
    result = run_tool("benchmark_autofocus.py", "--cfg", config, *settings, "--images", "2", "--checkpoint", path)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in result.stdout.splitlines() if line.startswith("| full") or line.startswith("| autofocus")}
    assert rows["full"][1] == "100.0"
    # FocusPixels everywhere: every finer scale processes (about) the whole image again
    assert float(rows["autofocus"][1]) == pytest.approx(100.0, abs=1.0)
    for mode in ("full", "autofocus"):
        assert os.path.isfile(os.path.join(root, "sniper_synthetic_tiny_autofocus", "autofocus_benchmark", mode,
                                           "detections.json"))


@pytest.mark.slow
def test_visualize_focus_draws_a_panel_per_scale(focus_everywhere, tmp_path):
    import cv2

    config, settings, path, _ = focus_everywhere
    out = tmp_path / "focus.png"
    result = run_tool("visualize_focus.py", "1000001", "--cfg", config, *settings, "--checkpoint", path,
                      "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    picture = cv2.imread(str(out))
    caption = picture.shape[0] - 24 - 540  # legend, captions (a line or two, wrapped to a panel), panels
    assert caption in (28, 50)
    assert (picture.shape[1] - 2 * 12) % 3 == 0 and (picture[24:, (picture.shape[1] - 24) // 3:][:, :12] == 255).all()
    panel = picture[24 + caption:, :(picture.shape[1] - 24) // 3]
    magenta = (np.abs(panel.astype(int) - [200, 0, 200]).max(axis=2) < 120).mean()
    assert magenta > 0.5  # FocusPixels everywhere, shaded
    missing = run_tool("visualize_focus.py", "999", "--cfg", config, *settings, "--checkpoint", path, "--out", str(out))
    assert missing.returncode != 0 and "image id 999 is not in val" in missing.stderr
