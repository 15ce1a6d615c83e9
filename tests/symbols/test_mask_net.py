"""The mask network (TRAIN.WITH_MASK, symbols/mask.py): parameter manifest of the reference's mask training
graph, the mask loss's gradients against NumPy, the test-time mask probabilities, the MaskLogLoss metric,
and a tiny mask training graph run forward and backward.

tests/data/sniper_res101_mask_train_params.json was written from the reference's own symbol
(symbols/faster/resnet_mx_101_e2e_mask.py, get_symbol_rcnn, is_train=True, fp16, 2 chips of 512): its
graph was built with stock MXNet, the fork's two mask operators replaced by shape-only stand-ins with the
fork's InferShape (mask_rois (B*50, 5), mask_ids (B*50, 1), targets and class ids (B*50, 28, 28)), and
its arguments, auxiliary states and outputs recorded.
"""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from network_helpers import bind_random, inference_shapes, node_attrs, parameter_shapes, train_shapes

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.train.metrics import MaskLogLoss, make_metrics
from symbols import inference_symbol, training_symbol
from symbols.mask import mask_loss, mask_probabilities
from symbols.sniper import mask_inference_symbol

MANIFEST = os.path.join(ROOT, "tests", "data", "sniper_res101_mask_train_params.json")
TRAIN_MASK_OUTPUTS = ("mask_prob_output", "mask_targets_output")


def _has_mask_operators():
    import lib.ops  # noqa: F401
    return hasattr(mx.sym, "MultiProposalTargetMask") and hasattr(mx.sym, "MaskRcnnTarget")


needs_mask_operators = pytest.mark.skipif(not _has_mask_operators(),
                                          reason="lib/ops without MultiProposalTargetMask / MaskRcnnTarget")


def mask_cfg(symbol="resnet_tiny", fp16=False, **overrides):
    return load_config(None, {"symbol": symbol, "TRAIN.fp16": fp16, "TEST.fp16": fp16, "TRAIN.WITH_MASK": True,
                      **overrides})


@pytest.fixture(scope="module")
def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def test_resnet101_mask_test_graphs_hold_the_reference_mask_parameters(manifest):
    """The detection test graph and the mask graph together hold exactly the parameters of the reference's
    mask training graph, with its shapes: the RPN reads res4 alone (1024 channels, not res4 + res5)."""
    cfg = mask_cfg("resnet101")
    test_args, test_aux, _ = parameter_shapes(inference_symbol(cfg, 81), inference_shapes(1, 512))
    mask_args, mask_aux, mask_outs = parameter_shapes(mask_inference_symbol(cfg, 81),
                                                      dict(data=(1, 3, 512, 512), mask_rois=(7, 5)))
    assert {**test_args, **mask_args} == manifest["args"]
    assert test_aux == mask_aux == manifest["aux"]
    assert test_args["rpn_conv_3x3_weight"] == [512, 1024, 3, 3]
    assert mask_args["mask_out_weight"] == [160, 256, 1, 1] and "mask_deconv_bias" not in mask_args
    assert mask_outs == {"mask_prob_output": [7, 80, 28, 28]}
    # without masks nothing changes: the RPN reads both stages
    plain_args, _, _ = parameter_shapes(inference_symbol(load_config(None, {"symbol": "resnet101"}), 81),
                                        inference_shapes(1, 512))
    assert plain_args["rpn_conv_3x3_weight"] == [512, 3072, 3, 3]


@needs_mask_operators
def test_resnet101_mask_training_graph_matches_the_reference_manifest(manifest):
    cfg = mask_cfg("resnet101", fp16=True)
    symbol = training_symbol(cfg, 81, 2)
    shapes = dict(train_shapes(2, 512), gt_masks=(2, 100, 500))
    args, aux, outs = parameter_shapes(symbol, shapes)
    assert args == manifest["args"] and aux == manifest["aux"]
    reference = manifest["outputs"]
    assert outs["mask_prob_output"] == reference["mask_cls_prob_output"]
    assert outs["mask_targets_output"] == reference["blockgrad1_output"]
    assert outs["rcnn_label_output"] == reference["blockgrad0_output"]
    assert list(symbol.list_outputs())[-2:] == list(TRAIN_MASK_OUTPUTS)
    attrs = node_attrs(symbol)
    # the reference's casts: the four mask convolutions in float16, the deconvolution in float32
    assert attrs["mask_pool_fp16"]["dtype"] == "float16" and attrs["mask_convs_fp32"]["dtype"] == "float32"
    assert float(attrs["mask_prob"]["grad_scale"]) == 100.0 and attrs["mask_prob"]["normalization"] == "valid"
    assert attrs["mask_offset_weight"]["__lr_mult__"] == attrs["mask_offset_bias"]["__lr_mult__"] == "0.01"
    assert attrs["mask_deformable_roi_pool"]["trans_std"] == "0.1"
    assert attrs["mask_deformable_roi_pool"]["pooled_size"] == "14"


def _softmax_pair(background, foreground):
    top = np.maximum(background, foreground)
    eb, ef = np.exp(background - top), np.exp(foreground - top)
    return eb / (eb + ef), ef / (eb + ef)


def test_mask_loss_gradients_match_numpy():
    """3 rois, 2 classes, 4x4 masks: the loss takes the roi's class's logit pair (channels c and C + c);
    its gradient there is (p - onehot(target)) * grad_scale / labelled pixels, zero on ignored pixels and
    on the other classes' channels."""
    rois, classes, size, grad_scale = 3, 2, 4, 7.0
    rng = np.random.RandomState(0)
    logits = rng.normal(0, 2, (rois, 2 * classes, size, size))
    targets = rng.randint(0, 2, (rois, size, size)).astype(np.float32)
    targets[1] = -1  # a roi without a mask
    targets[2, 0] = -1  # an ignored row
    roi_class = np.array([1, 0, 0])
    class_ids = np.broadcast_to(roi_class[:, None, None], (rois, size, size)).astype(np.float32)

    symbol = mask_loss(mx.sym.var("logits"), mx.sym.var("targets"), mx.sym.var("class_ids"), classes, grad_scale)
    executor = symbol.simple_bind(mx.cpu(), logits=logits.shape, targets=targets.shape, class_ids=class_ids.shape,
                                  grad_req={"logits": "write", "targets": "null", "class_ids": "null"})
    executor.arg_dict["logits"][:] = logits
    executor.arg_dict["targets"][:] = targets
    executor.arg_dict["class_ids"][:] = class_ids
    prob = executor.forward(is_train=True)[0].asnumpy()
    executor.backward()
    grad = executor.grad_dict["logits"].asnumpy()

    expected_prob = np.zeros((rois, 2, size, size))
    expected_grad = np.zeros_like(logits)
    labelled = (targets != -1).sum()
    for r, c in enumerate(roi_class):
        p0, p1 = _softmax_pair(logits[r, c], logits[r, classes + c])
        expected_prob[r] = p0, p1
        keep = targets[r] != -1
        expected_grad[r, c] = np.where(keep, p0 - (targets[r] == 0), 0) * grad_scale / labelled
        expected_grad[r, classes + c] = np.where(keep, p1 - (targets[r] == 1), 0) * grad_scale / labelled
    # float32 softmax of logits of size ~2: 1e-6 absolute on probabilities and gradients of size ~0.1
    np.testing.assert_allclose(prob, expected_prob, atol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, atol=1e-6)
    assert (grad[1] == 0).all() and (grad[0, 0] == 0).all() and (grad[0, 2] == 0).all()


def test_mask_probabilities_pair_each_class_logits():
    classes, size = 3, 28
    rng = np.random.RandomState(1)
    logits = rng.normal(0, 3, (2, 2 * classes, size, size))
    prob = mask_probabilities(mx.sym.var("logits"), classes).eval(logits=mx.nd.array(logits))[0].asnumpy()
    _, expected = _softmax_pair(logits[:, :classes], logits[:, classes:])
    np.testing.assert_allclose(prob, expected, atol=1e-6)  # float32 softmax


def test_mask_log_loss_metric_hand_worked():
    """Two rois of 2x2 pixels: labelled pixels with p(target) 0.5, 0.25, 0.8 (ignored pixels left out)."""
    prob = np.zeros((2, 2, 2, 2), np.float32)
    target = -np.ones((2, 2, 2), np.float32)
    prob[0, :, 0, 0] = [0.5, 0.5]
    target[0, 0, 0] = 1
    prob[0, :, 1, 1] = [0.25, 0.75]
    target[0, 1, 1] = 0
    prob[1, :, 0, 1] = [0.2, 0.8]
    target[1, 0, 1] = 1
    prob[1, :, 1, 0] = [0.999, 0.001]  # ignored: would dominate the mean
    metric = MaskLogLoss(["a", "mask_prob_output", "mask_targets_output"], [])
    metric.update([], [mx.nd.zeros(1), mx.nd.array(prob), mx.nd.array(target)])
    name, value = metric.get()
    assert name == "MaskLogLoss"
    assert value == pytest.approx(-(np.log(0.5) + np.log(0.25) + np.log(0.8)) / 3, rel=1e-6)
    names = make_metrics(["rpn_cls_prob_output", "rpn_bbox_loss_output", "cls_prob_output", "bbox_loss_output",
                          "rcnn_label_output", *TRAIN_MASK_OUTPUTS], ["label"]).get()[0]
    assert names[-1] == "MaskLogLoss"


def test_mask_training_refuses_a_body_without_res4():
    with pytest.raises(ValueError, match="TRAIN.WITH_MASK.*mobilenetv2"):
        inference_symbol(load_config(None, {"symbol": "mobilenetv2", "TRAIN.WITH_MASK": True}), 5)


def _square_polygon_row(category, x1, y1, x2, y2, length=500):
    """The iterator's polygon encoding of one gt: [category, 1 polygon, its length, x1, y1, ...], -1 padded."""
    row = -np.ones(length, np.float32)
    polygon = [x1, y1, x2, y1, x2, y2, x1, y2]
    row[:3 + len(polygon)] = [category, 1, len(polygon)] + polygon
    return row


@needs_mask_operators
def test_tiny_mask_training_graph_forward_backward():
    """Two chips with one gt each: finite losses, mask targets only on mask rois, and the mask loss's
    gradient reaches the mask branch, the shared reduction and the body."""
    chips, size, classes = 2, 128, 5
    cfg = mask_cfg()
    symbol = training_symbol(cfg, classes, chips)
    shapes = dict(train_shapes(chips, size), gt_masks=(chips, 100, 500))
    executor, rng = bind_random(symbol, shapes, seed=3, grad_req="write")
    executor.arg_dict["im_info"][:] = [[size, size, 1.0]] * chips
    executor.arg_dict["valid_ranges"][:] = [[-1, -1]] * chips
    gt = -np.ones((chips, 100, 5))
    gt[0, 0] = [10, 20, 70, 90, 2]
    gt[1, 0] = [40, 30, 100, 110, 4]
    executor.arg_dict["gt_boxes"][:] = gt
    masks = -np.ones((chips, 100, 500), np.float32)
    masks[0, 0] = _square_polygon_row(1, 10, 20, 70, 90)
    masks[1, 0] = _square_polygon_row(3, 40, 30, 100, 110)
    executor.arg_dict["gt_masks"][:] = masks
    executor.arg_dict["label"][:] = -1
    executor.arg_dict["bbox_weight"][:] = 0
    outputs = dict(zip(symbol.list_outputs(), (o.asnumpy() for o in executor.forward(is_train=True))))
    executor.backward()
    prob, targets = outputs["mask_prob_output"], outputs["mask_targets_output"]
    assert prob.shape == (chips * 50, 2, 28, 28) and targets.shape == (chips * 50, 28, 28)
    assert all(np.isfinite(v).all() for v in outputs.values())
    labelled = targets != -1
    assert labelled.any() and set(np.unique(targets[labelled])) == {0, 1}
    metric = MaskLogLoss(list(symbol.list_outputs()), [])
    metric.update([], [mx.nd.array(outputs[n]) for n in symbol.list_outputs()])
    assert np.isfinite(metric.get()[1]) and metric.get()[1] > 0
    for name in ("mask_out_weight", "mask_deconv_weight", "mask_conv_3x3_1_weight", "conv_new_1_weight",
                 "stage4_unit1_conv3_weight"):
        grad = executor.grad_dict[name].asnumpy()
        assert np.isfinite(grad).all() and np.abs(grad).sum() > 0, name


def _flat(value, prefix=""):
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}


MASK_KEYS = {"TRAIN.WITH_MASK", "TRAIN.RPN_PRE_NMS_TOP_N"}


@pytest.mark.parametrize("detector, with_masks, differences", [
    ("sniper_res101_e2e", "sniper_res101_e2e_mask", MASK_KEYS | {"TRAIN.BATCH_IMAGES"}),
    ("sniper_res101_e2e_autofocus", "sniper_res101_e2e_mask_autofocus", MASK_KEYS | {"TRAIN.BATCH_IMAGES"}),
    ("sniper_synthetic_tiny", "sniper_synthetic_tiny_mask", MASK_KEYS),
])
def test_mask_configs_are_their_detectors_with_masks(detector, with_masks, differences):
    """As the reference's mask configs to their detection ones: masks on, 10 chips per GPU (the name, and
    the output folder derived from it, apart); and the proposals entering the training NMS capped at the
    6000 the reference's mask proposal-target kernel keeps whatever its attribute says."""
    from lib.config.core import plain

    folder = os.path.join(ROOT, "configs", "faster")
    base, masks = (_flat(plain(load_config(os.path.join(folder, f"{name}.yml")))) for name in (detector, with_masks))
    changed = {key for key in base if base[key] != masks[key]} - {"name"}
    assert changed == differences
    assert masks["TRAIN.WITH_MASK"] is True and masks["TRAIN.RPN_PRE_NMS_TOP_N"] == 6000 and masks["TRAIN.BATCH_IMAGES"] == (10 if "res101" in detector else 4)


def test_mask_proposal_target_attributes_come_from_the_config():
    from symbols.mask import proposal_target_mask_attrs

    attrs = proposal_target_mask_attrs(mask_cfg(**{"TRAIN.RPN_PRE_NMS_TOP_N": 6000, "TRAIN.RPN_POST_NMS_TOP_N": 128}), 3)
    assert attrs == {"feature_stride": 16, "scales": (2, 4, 7, 10, 13, 16, 24), "ratios": (0.5, 1.0, 2.0),
                     "rpn_pre_nms_top_n": 6000, "rpn_post_nms_top_n": 128, "threshold": 0.7, "rpn_min_size": 3,
                     "batch_size": 3, "max_masks": 50, "max_gts": 100}
    for key, value in (("FG_THRESH", 0.6), ("BBOX_STDS", [0.1, 0.1, 0.3, 0.3]), ("PROPOSAL_TARGET_RULES", "exact")):
        with pytest.raises(ValueError, match=f"TRAIN.{key}"):
            proposal_target_mask_attrs(mask_cfg(**{f"TRAIN.{key}": value}), 3)
