"""The compiled MultiProposalTarget operator against its NumPy reference and hand-worked cases."""
import math
import os

import mxnet as mx
import numpy as np
import pytest

import lib.ops
from lib.boxes import base_anchors, grid_anchors
from lib.config import load_config
from lib.ops.reference import multi_proposal_target

# The published settings, as the training graph passes them (every attribute, from the config).
PUBLISHED = lib.ops.proposal_target_attrs(load_config(None))
NUM_ANCHORS = len(PUBLISHED["scales"]) * len(PUBLISHED["ratios"])


def run_operator(inputs, **attrs):
    attrs = {**PUBLISHED, **attrs}
    return tuple(out.asnumpy() for out in mx.nd.MultiProposalTarget(*(mx.nd.array(x) for x in inputs), **attrs))


def run_reference(inputs, **attrs):
    return multi_proposal_target(*inputs, **{**PUBLISHED, **attrs})


def assert_matches_reference(inputs, **attrs):
    """Labels and weights exactly, boxes and targets up to float32 exp/log rounding (NumPy vs libm)."""
    rois, labels, targets, weights = run_operator(inputs, **attrs)
    ref_rois, ref_labels, ref_targets, ref_weights = run_reference(inputs, **attrs)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(weights, ref_weights)
    np.testing.assert_array_equal(rois[:, 0], ref_rois[:, 0])
    np.testing.assert_allclose(rois, ref_rois, rtol=0, atol=1e-3)
    np.testing.assert_allclose(targets, ref_targets, rtol=0, atol=1e-4)
    return rois, labels, targets, weights


def assert_library_error(excinfo, message):
    """The newest library message (lib_api keeps every earlier one in the same report) has ``message``."""
    lines = [line for line in str(excinfo.value).splitlines() if "multi_proposal_target_op.cc" in line]
    assert lines and message in lines[-1], str(excinfo.value)


def random_inputs(rng, valid_ranges, feat=16, im_size=(256, 256), max_gts=12, score_levels=None):
    """RPN outputs as a softmax over bg/fg, random deltas, gts with -1 padding rows mixed in."""
    batch = len(valid_ranges)
    logits = rng.normal(0, 2, (batch, 2, NUM_ANCHORS, feat, feat))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    if score_levels:  # coarse scores: many exact ties, which the operator must break by anchor index
        probs = np.round(probs * score_levels) / score_levels
    cls_prob = probs.reshape(batch, 2 * NUM_ANCHORS, feat, feat).astype(np.float32)
    bbox_pred = rng.normal(0, 0.3, (batch, 4 * NUM_ANCHORS, feat, feat)).astype(np.float32)
    height, width = im_size
    im_info = np.tile(np.float32([height, width, 1.0]), (batch, 1))
    gt_boxes = np.full((batch, max_gts, 5), -1, np.float32)
    for b in range(batch):
        num = rng.integers(1, max_gts + 1)
        rows = rng.choice(max_gts, num, replace=False)  # padding rows are not only at the end
        corner = rng.uniform(0, [width - 8, height - 8], (num, 2))
        size = rng.uniform(4, 160, (num, 2))
        gt_boxes[b, rows, :2] = corner
        gt_boxes[b, rows, 2:4] = np.minimum(corner + size, [width - 1, height - 1])
        gt_boxes[b, rows, 4] = rng.integers(1, 81, num)
    return cls_prob, bbox_pred, im_info, gt_boxes, np.float32(valid_ranges)


def test_random_batch_matches_reference():
    rng = np.random.default_rng(0)
    inputs = random_inputs(rng, [[-1, -1], [32, 150], [-1, 80], [60, -1]])
    rois, labels, _, weights = assert_matches_reference(inputs)
    assert (labels > 0).sum() > len(inputs[0])  # positives beyond the appended gts themselves
    assert (labels == -1).sum() == 0
    assert np.array_equal(weights[:, 0], (labels > 0).astype(np.float32))


def test_score_ties_break_by_anchor_index():
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, [[-1, -1], [16, 200]], score_levels=8)
    assert_matches_reference(inputs, rpn_pre_nms_top_n=500, rpn_post_nms_top_n=120, threshold=0.5)


def test_empty_and_all_invalid_gt_lists():
    rng = np.random.default_rng(2)
    inputs = random_inputs(rng, [[-1, -1], [100, 140], [-1, -1]])
    gt_boxes = inputs[3]
    gt_boxes[0] = -1  # no gts: everything background
    gt_boxes[1, :, 4] = -1
    gt_boxes[1, :2] = [[10, 10, 19, 19, 3], [50, 50, 199, 199, 7]]  # sqrt(area) 10 and 150: both invalid
    rois, labels, _, _ = assert_matches_reference(inputs)
    per_chip = labels.reshape(3, -1)
    assert np.all(per_chip[0] == 0)
    # Invalid gts are not appended as rois, but proposals covering one still take its class.
    chip1_rois = rois.reshape(3, -1, 5)[1, :, 1:]
    assert not any(np.array_equal(roi, gt[:4]) for roi in chip1_rois for gt in gt_boxes[1, :2])
    assert 7 in per_chip[1] and set(np.unique(per_chip[1])) <= {-1.0, 0.0, 7.0}


def test_few_survivors_are_padded():
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, [[40, 44], [-1, -1]], im_size=(96, 128))
    rois, labels, targets, weights = assert_matches_reference(inputs, rpn_pre_nms_top_n=40)
    rois, labels = rois.reshape(2, 300, 5), labels.reshape(2, 300)
    for b in range(2):
        padding = labels[b] == -1
        num_real = 300 - padding.sum()
        assert 0 < num_real < 300 and np.all(padding[num_real:])  # padding fills the tail
        np.testing.assert_array_equal(rois[b, padding], np.tile(np.float32([b, 0, 0, 15, 15]), (padding.sum(), 1)))
    pad_rows = labels.reshape(-1) == -1
    assert not targets[pad_rows].any() and not weights[pad_rows].any()


def test_more_valid_gts_than_rois_keeps_the_first():
    rng = np.random.default_rng(4)
    inputs = random_inputs(rng, [[-1, -1]], max_gts=12)
    gt_boxes = inputs[3]
    gt_boxes[0] = [[8 * i, 8 * i, 8 * i + 30, 8 * i + 40, i + 1] for i in range(12)]
    rois, labels, _, _ = assert_matches_reference(inputs, rpn_post_nms_top_n=5)
    np.testing.assert_array_equal(rois[:, 1:], gt_boxes[0, :5, :4])
    np.testing.assert_array_equal(labels, gt_boxes[0, :5, 4])


def test_rois_are_the_anchors_in_hwa_order_without_regression():
    """Zero deltas, scores falling with the anchor index, nothing suppressed: rois == grid_anchors."""
    feat, stride = 3, 16
    scales, ratios = (2, 4, 7, 10, 13, 16, 24), (0.5, 1, 2)
    anchors = grid_anchors(base_anchors(stride, ratios, scales), feat, feat, stride)
    rank = np.arange(len(anchors), 0, -1, dtype=np.float32) / len(anchors)
    cls_prob = np.zeros((1, 2 * NUM_ANCHORS, feat, feat), np.float32)
    cls_prob[0, NUM_ANCHORS:] = rank.reshape(feat, feat, NUM_ANCHORS).transpose(2, 0, 1)
    bbox_pred = np.zeros((1, 4 * NUM_ANCHORS, feat, feat), np.float32)
    big = 10000.0  # nothing is clipped
    no_gts = np.full((1, 1, 5), -1, np.float32)
    inputs = (cls_prob, bbox_pred, np.float32([[big, big, 1]]), no_gts, np.float32([[-1, -1]]))
    rois, labels, _, _ = run_operator(
        inputs, scales=scales, ratios=ratios, threshold=1.0, rpn_min_size=0, rpn_post_nms_top_n=len(anchors)
    )
    np.testing.assert_array_equal(rois[:, 1:], np.maximum(anchors, 0))  # clipped at the chip's top-left
    assert np.all(labels == 0)


def test_hand_worked_chip():
    """One anchor [0, 0, 15, 15], zero deltas, one gt [0, 0, 15, 23] of class 5, 3 rois."""
    cls_prob = np.float32([0.2, 0.8]).reshape(1, 2, 1, 1)
    bbox_pred = np.zeros((1, 4, 1, 1), np.float32)
    gt_boxes = np.float32([[[0, 0, 15, 23, 5], [-1, -1, -1, -1, -1]]])
    inputs = (cls_prob, bbox_pred, np.float32([[64, 64, 1]]), gt_boxes, np.float32([[-1, -1]]))
    rois, labels, targets, weights = run_operator(inputs, scales=(1,), ratios=(1,), rpn_post_nms_top_n=3)
    np.testing.assert_array_equal(rois, [[0, 0, 0, 15, 15], [0, 0, 0, 15, 23], [0, 0, 0, 15, 15]])
    np.testing.assert_array_equal(labels, [5, 5, -1])  # IoU 256 / 384 = 0.667 > 0.5
    # centre y moves from 7.5 to 11.5 on a height of 16; height grows 16 -> 24.
    np.testing.assert_allclose(targets[0], [0, 0.25 / 0.1, 0, math.log(1.5) / 0.2], rtol=1e-6)
    np.testing.assert_array_equal(targets[1:], 0)
    np.testing.assert_array_equal(weights, [[1] * 4, [1] * 4, [0] * 4])


def two_box_chip(gt_boxes):
    """Feature map 1x2, one 16x16 anchor per cell; the second is moved left by 12 px, so the two
    proposals are [0, 0, 15, 15] (score 0.9) and [4, 0, 19, 15] (score 0.8): IoU 192 / 320 = 0.6."""
    cls_prob = np.float32([[[[0.1, 0.2]], [[0.9, 0.8]]]])
    bbox_pred = np.zeros((1, 4, 1, 2), np.float32)
    bbox_pred[0, 0, 0, 1] = -0.75
    gts = np.float32(gt_boxes).reshape(1, -1, 5)
    # Every box here is 16 x 16: sqrt(area) 16 sits on both ends of the inclusive valid range.
    return cls_prob, bbox_pred, np.float32([[64, 64, 1]]), gts, np.float32([[16, 16]])


def test_thresholds_at_their_boundaries():
    attrs = dict(scales=(1,), ratios=(1,), rpn_min_size=16)
    no_gts = two_box_chip([[-1] * 5])
    rois, labels, _, _ = run_operator(no_gts, threshold=0.6, rpn_post_nms_top_n=3, **attrs)
    np.testing.assert_array_equal(rois[:2, 1:], [[0, 0, 15, 15], [4, 0, 19, 15]])  # IoU 0.6 is not > 0.6
    np.testing.assert_array_equal(labels, [0, 0, -1])
    rois, labels, _, _ = run_operator(no_gts, threshold=0.59, rpn_post_nms_top_n=3, **attrs)
    np.testing.assert_array_equal(labels, [0, -1, -1])

    # The second proposal has IoU 0.6 with both gts: background at fg_thresh 0.6, else the first gt.
    chip = two_box_chip([[8, 0, 23, 15, 2], [0, 0, 15, 15, 1]])
    rois, labels, targets, _ = run_operator(chip, threshold=0.7, fg_thresh=0.6, rpn_post_nms_top_n=4, **attrs)
    np.testing.assert_array_equal(rois[:, 1:], [[0, 0, 15, 15], [4, 0, 19, 15], [8, 0, 23, 15], [0, 0, 15, 15]])
    np.testing.assert_array_equal(labels, [1, 0, 2, 1])
    rois, labels, targets, _ = run_operator(chip, threshold=0.7, fg_thresh=0.5, rpn_post_nms_top_n=4, **attrs)
    np.testing.assert_array_equal(labels, [1, 2, 2, 1])
    np.testing.assert_allclose(targets[1], [0.25 / 0.1, 0, 0, 0], rtol=1e-6)  # centre 11.5 -> 15.5 on width 16
    for chip_inputs, attrs_used in ((no_gts, dict(threshold=0.6)), (chip, dict(threshold=0.7, fg_thresh=0.5))):
        assert_matches_reference(chip_inputs, rpn_post_nms_top_n=4, **attrs_used, **attrs)


def test_symbol_graph_infer_shape_forward_and_zero_gradient():
    rng = np.random.default_rng(5)
    inputs = random_inputs(rng, [[-1, -1], [32, 150]], feat=8, im_size=(128, 128))
    names = ["cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges"]
    variables = [mx.sym.Variable(name) for name in names]
    group = mx.sym.contrib.MultiProposalTarget(*variables, name="proposal_target",
                                               **{**PUBLISHED, "rpn_post_nms_top_n": 64})
    # A downstream use so the graph has a gradient path back to cls_prob / bbox_pred.
    loss = mx.sym.MakeLoss(mx.sym.sum(group[0]) + mx.sym.sum(group[2]) + mx.sym.sum(variables[0]))
    net = mx.sym.Group([loss, mx.sym.BlockGrad(group[1])])
    net = mx.sym.load_json(net.tojson())
    shapes = dict(zip(names, (x.shape for x in inputs)))
    _, out_shapes, _ = group.infer_shape(**shapes)
    assert out_shapes == [(128, 5), (128,), (128, 4), (128, 4)]
    executor = net.simple_bind(mx.cpu(), grad_req={"cls_prob": "write", "bbox_pred": "write"}, **shapes)
    outputs = executor.forward(is_train=True, **{n: mx.nd.array(x) for n, x in zip(names, inputs)})
    executor.backward()
    ref_rois, ref_labels, ref_targets, _ = run_reference(inputs, rpn_post_nms_top_n=64)
    np.testing.assert_array_equal(outputs[1].asnumpy(), ref_labels)
    np.testing.assert_allclose(outputs[0].asnumpy()[0], ref_rois.sum() + ref_targets.sum() + inputs[0].sum(), rtol=1e-5)
    np.testing.assert_array_equal(executor.grad_dict["cls_prob"].asnumpy(), 1)  # only the direct term
    np.testing.assert_array_equal(executor.grad_dict["bbox_pred"].asnumpy(), 0)


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"scales": "(2, x)"}, "scales='(2, x)' is not a list of numbers"),
        ({"rpn_post_nms_top_n": 0}, "rpn_post_nms_top_n='0' must be a positive integer"),
        ({"bbox_stds": (0.1, 0.2)}, "bbox_stds='(0.1, 0.2)' must hold 4 numbers"),
        ({"fg_tresh": 0.5}, "unknown attribute fg_tresh"),
    ],
)
def test_bad_attributes_are_named(attrs, message):
    rng = np.random.default_rng(6)
    with pytest.raises(mx.MXNetError) as excinfo:
        run_operator(random_inputs(rng, [[-1, -1]], feat=2), **attrs)
    assert_library_error(excinfo, message)


def test_bad_shapes_and_dtypes_are_named():
    rng = np.random.default_rng(7)
    cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges = random_inputs(rng, [[-1, -1]], feat=2)
    with pytest.raises(mx.MXNetError) as excinfo:
        run_operator((cls_prob, bbox_pred[:, :8], im_info, gt_boxes, valid_ranges))
    assert_library_error(excinfo, "bbox_pred must have shape (B, 4A, H, W) like cls_prob, got (1, 8, 2, 2)")
    with pytest.raises(mx.MXNetError) as excinfo:
        run_operator((cls_prob, bbox_pred, im_info, gt_boxes[..., :4], valid_ranges))
    assert_library_error(excinfo, "gt_boxes must have shape (B, G, 5)")
    args = [mx.nd.array(x) for x in (cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges)]
    args[0] = args[0].astype("float16")
    with pytest.raises(mx.MXNetError) as excinfo:
        mx.nd.MultiProposalTarget(*args)[0].wait_to_read()
    assert_library_error(excinfo, "cls_prob must be float32")


def test_config_attributes_are_the_published_settings():
    assert PUBLISHED == {"feature_stride": 16, "scales": (2, 4, 7, 10, 13, 16, 24), "ratios": (0.5, 1, 2),
                         "rpn_pre_nms_top_n": 6000, "rpn_post_nms_top_n": 300, "threshold": 0.7, "rpn_min_size": 3,
                         "fg_thresh": 0.5, "bbox_stds": (0.1, 0.1, 0.2, 0.2)}


def test_training_graph_refuses_box_means_it_cannot_train():
    from symbols import training_symbol

    cfg = load_config(None, [("TRAIN.BBOX_MEANS", "[0.0, 0.1, 0.0, 0.0]"), ("symbol", "resnet_tiny")])
    with pytest.raises(ValueError, match=r"TRAIN\.BBOX_MEANS"):
        training_symbol(cfg, num_classes=5, chips_per_device=2)


def test_missing_library_tells_to_run_make(tmp_path):
    with pytest.raises(ImportError, match="run `make`"):
        lib.ops.load_library(os.path.join(tmp_path, "libsniper_ops.so"))
