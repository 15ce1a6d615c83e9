"""The SNIPER network (symbols/): parameter manifest of the published network, graph wiring (the fp16 casts
are in test_fp16.py), batch-norm modes, loss scales, and tiny CPU forward/backward passes checked against hand-derived values."""
import json
import os

import mxnet as mx
import numpy as np
import pytest

from network_helpers import bind_random, graph_nodes, inference_shapes, parameter_shapes, train_shapes

from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from symbols import get_fixed_param_names, inference_symbol, training_symbol
from symbols.backbones import backbone_of

MANIFEST = os.path.join(ROOT, "tests", "data", backbone_of("resnet101").manifest)
A = 21  # anchors per cell with the default ANCHOR_SCALES x ANCHOR_RATIOS
TEST_INPUTS = ("data", "im_info", "im_ids", "chip_ids")
TRAIN_INPUTS = ("data", "im_info", "valid_ranges", "gt_boxes", "label", "bbox_target", "bbox_weight")


def network_cfg(symbol="resnet_tiny", fp16=False):
    return load_config(None, {"symbol": symbol, "TRAIN.fp16": fp16, "TEST.fp16": fp16})


def network(cfg, is_train, rpn_only=False, num_classes=5, chips=2):
    """The training graph (``chips`` per device) or the test graph of ``cfg`` for ``num_classes``."""
    if is_train:
        return training_symbol(cfg, num_classes, chips, rpn_only=rpn_only)
    return inference_symbol(cfg, num_classes, rpn_only=rpn_only)


@pytest.fixture(scope="module")
def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def test_resnet101_test_symbol_matches_published_manifest(manifest):
    symbol = network(network_cfg("resnet101"), is_train=False, num_classes=81)
    args, aux, outs = parameter_shapes(symbol, inference_shapes(1, 512))
    assert len(args) == 330 and len(aux) == 202
    assert args == manifest["args"]
    assert aux == manifest["aux"]
    assert outs == manifest["outputs"]
    assert symbol.list_outputs() == ["rois_output", "cls_prob_reshape_output", "bbox_pred_reshape_output",
                                     "im_ids", "chip_ids", "im_info"]
    assert [n for n in symbol.list_arguments() if n in TEST_INPUTS] == list(TEST_INPUTS)


def test_resnet101_training_symbol_has_the_test_parameters(manifest):
    import lib.ops  # noqa: F401
    cfg = network_cfg("resnet101", fp16=True)
    symbol = network(cfg, is_train=True, num_classes=81)
    args, aux, outs = parameter_shapes(symbol, train_shapes(2, 512))
    assert args == manifest["args"] and aux == manifest["aux"]
    assert outs == {"rpn_cls_prob_output": [2, 2, A * 32, 32], "rpn_bbox_loss_output": [2, 4 * A, 32, 32],
                    "cls_prob_output": [600, 81], "bbox_loss_output": [600, 4], "rcnn_label_output": [600]}


@pytest.mark.parametrize("size", [128, 256, 384, 512])
def test_tiny_training_symbol_shapes(size):
    import lib.ops  # noqa: F401
    cfg = network_cfg()
    symbol = network(cfg, is_train=True)
    args, aux, outs = parameter_shapes(symbol, train_shapes(2, size))
    feat = size // 16
    assert outs == {"rpn_cls_prob_output": [2, 2, A * feat, feat], "rpn_bbox_loss_output": [2, 4 * A, feat, feat],
                    "cls_prob_output": [600, 5], "bbox_loss_output": [600, 4], "rcnn_label_output": [600]}
    test_args, test_aux, _ = parameter_shapes(network(cfg, is_train=False), inference_shapes(2, size))
    assert args == test_args and aux == test_aux
    assert sorted(n for n in symbol.list_arguments() if n in TRAIN_INPUTS) == sorted(TRAIN_INPUTS)
    # res4 (128) + res5 (256) channels of the tiny body feed both heads
    assert args["rpn_conv_3x3_weight"][1] == args["conv_new_1_weight"][1] == 128 + 256
    assert args["cls_score_weight"] == [5, 128] and args["bbox_pred_weight"] == [4, 128]


def test_rpn_only_graphs_hold_only_the_rpn():
    cfg = network_cfg()
    train = network(cfg, is_train=True, rpn_only=True)
    args, _, outs = parameter_shapes(train, train_shapes(2, 256, rpn_only=True))
    assert outs == {"rpn_cls_prob_output": [2, 2, A * 16, 16], "rpn_bbox_loss_output": [2, 4 * A, 16, 16]}
    assert sorted(n for n in train.list_arguments() if n in TRAIN_INPUTS) == ["bbox_target", "bbox_weight", "data", "label"]
    head = [n for n in args if not n.startswith(("bn_data", "conv0", "bn0", "stage"))]
    assert sorted(head) == ["rpn_bbox_pred_bias", "rpn_bbox_pred_weight", "rpn_cls_score_bias",
                            "rpn_cls_score_weight", "rpn_conv_3x3_bias", "rpn_conv_3x3_weight"]
    assert not any(n["op"] in ("MultiProposalTarget", "_contrib_DeformablePSROIPooling") for n in graph_nodes(train))

    test = network(cfg, is_train=False, rpn_only=True)
    _, _, outs = parameter_shapes(test, inference_shapes(2, 256))
    assert outs == {"rois_output": [600, 5], "rois_score": [600, 1], "im_ids": [2], "chip_ids": [2], "im_info": [2, 3]}


@pytest.mark.parametrize("fp16", [False, True])
def test_loss_gradient_scales(fp16):
    import lib.ops  # noqa: F401
    cfg = network_cfg(fp16=fp16)
    loss_scale = 100.0 if fp16 else 1.0
    attrs = {n["name"]: n.get("attrs", {}) for n in graph_nodes(network(cfg, is_train=True, chips=4))}
    assert float(attrs["rpn_cls_prob"]["grad_scale"]) == loss_scale
    assert float(attrs["cls_prob"]["grad_scale"]) == loss_scale
    assert float(attrs["rpn_bbox_loss"]["grad_scale"]) == pytest.approx(3.0 / (4 * 256) * loss_scale)
    # the reference's R-CNN box-loss normaliser is for 16 chips whatever the batch (TRAIN.RCNN_BBOX_LOSS_CHIPS)
    assert float(attrs["bbox_loss"]["grad_scale"]) == pytest.approx(1.0 / (188 * 16) * loss_scale)
    per_device = with_overrides(cfg, {"TRAIN.RCNN_BBOX_LOSS_CHIPS": 0})
    attrs_per_device = {n["name"]: n.get("attrs", {}) for n in graph_nodes(network(per_device, is_train=True, chips=4))}
    assert float(attrs_per_device["bbox_loss"]["grad_scale"]) == pytest.approx(1.0 / (188 * 4) * loss_scale)
    for name in ("rpn_cls_prob", "cls_prob"):
        assert attrs[name]["normalization"] == "valid" and attrs[name]["use_ignore"] == "True"
        assert float(attrs[name]["ignore_label"]) == -1
    assert attrs["offset_weight"]["__lr_mult__"] == attrs["offset_bias"]["__lr_mult__"] == "0.01"
    assert attrs["deformable_roi_pool"]["trans_std"] == "0.1"
    assert attrs["proposal_target"]["scales"] == "(2, 4, 7, 10, 13, 16, 24)"
    assert attrs["proposal_target"]["bbox_stds"] == "(0.1, 0.1, 0.2, 0.2)"


def test_batch_norm_modes_and_fixed_parameters():
    cfg = network_cfg()
    train = network(cfg, is_train=True, rpn_only=True)
    batch_norms = [n for n in graph_nodes(train) if n["op"] == "BatchNorm"]
    frozen = sorted(n["name"] for n in batch_norms if n["attrs"]["use_global_stats"] == "True")
    assert frozen == ["bn0", "bn_data", "stage1_unit1_bn1", "stage1_unit1_bn2", "stage1_unit1_bn3"]
    assert all(float(n["attrs"]["momentum"]) == 0.995 for n in batch_norms)
    assert [n["name"] for n in batch_norms if n["attrs"]["fix_gamma"] == "True"] == ["bn_data"]
    test = network(cfg, is_train=False)
    assert all(n["attrs"]["use_global_stats"] == "True" for n in graph_nodes(test) if n["op"] == "BatchNorm")

    fixed = get_fixed_param_names(train, cfg)
    # the reference's rule: every argument whose name contains a FIXED_PARAMS entry (bn_data_beta trains)
    expected = [n for n in train.list_arguments() if any(p in n for p in cfg.network.FIXED_PARAMS)]
    assert sorted(fixed) == sorted(expected) and "conv0_weight" in fixed and "stage1_unit1_sc_weight" in fixed
    assert not any(n.startswith(("stage2", "rpn", "bn_data")) for n in fixed)
    frozen_input = get_fixed_param_names(train, with_overrides(cfg, {"network.FIXED_INPUT_NORMALISER": True}))
    assert sorted(frozen_input) == sorted(expected + ["bn_data_gamma", "bn_data_beta"])


def test_configuration_errors_name_the_key():
    with pytest.raises(ValueError, match="symbol.*resnet18"):
        network(network_cfg("resnet18"), is_train=False)
    with pytest.raises(ValueError, match="class count"):
        network(network_cfg(), is_train=False, num_classes=1)


def _bind_random(symbol, shapes, seed, grad_req="null"):
    executor, rng = bind_random(symbol, shapes, seed, grad_req)
    for name in ("stage4_unit1_offset_weight", "offset_weight"):
        if name in executor.arg_dict:
            executor.arg_dict[name][:] = rng.normal(0, 0.001, executor.arg_dict[name].shape)
    return executor


def test_tiny_test_network_forward():
    symbol = network(network_cfg(), is_train=False)
    shapes = inference_shapes(2, 192)
    executor = _bind_random(symbol, shapes, seed=0)
    executor.arg_dict["im_info"][:] = [[192, 160, 1.0], [120, 192, 2.0]]
    executor.arg_dict["im_ids"][:] = [11, 12]
    executor.arg_dict["chip_ids"][:] = [3, 4]
    rois, cls_prob, bbox_pred, im_ids, chip_ids, im_info = [o.asnumpy() for o in executor.forward()]
    assert rois.shape == (600, 5) and cls_prob.shape == (2, 300, 5) and bbox_pred.shape == (2, 300, 4)
    np.testing.assert_array_equal(rois[:, 0], np.repeat([0, 1], 300))
    for b, (height, width) in enumerate([(192, 160), (120, 192)]):  # proposals clipped to each image
        boxes = rois[b * 300:(b + 1) * 300, 1:]
        assert boxes.min() >= 0 and boxes[:, 2].max() <= width - 1 and boxes[:, 3].max() <= height - 1
    np.testing.assert_allclose(cls_prob.sum(axis=2), 1, rtol=1e-5)
    np.testing.assert_array_equal(im_ids, [11, 12])
    np.testing.assert_array_equal(chip_ids, [3, 4])
    np.testing.assert_array_equal(im_info, [[192, 160, 1], [120, 192, 2]])


def test_rpn_probability_map_layout_matches_multiproposal():
    """MultiProposal reads background scores from channels 0..A-1 and foreground from A..2A-1."""
    symbol = network(network_cfg(), is_train=False)
    internals = symbol.get_internals()
    probe = mx.sym.Group([internals["rpn_cls_score_output"], internals["rpn_cls_prob_reshape_output"]])
    executor = _bind_random(probe, dict(data=(1, 3, 64, 64)), seed=1)
    score, prob = [o.asnumpy() for o in executor.forward()]
    foreground = 1 / (1 + np.exp(score[:, :A] - score[:, A:]))
    np.testing.assert_allclose(prob[:, A:], foreground, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(prob[:, :A], 1 - foreground, rtol=1e-4, atol=1e-6)


def test_tiny_training_forward_backward_wiring():
    """One labelled anchor and one weighted box delta: the RPN gradients land on exactly the channels of
    that anchor, with the configured loss scale; the proposal target sees the gts and valid ranges."""
    import lib.ops  # noqa: F401
    chips, size, anchor, cell = 2, 128, 5, (3, 6)
    feat = size // 16
    cfg = network_cfg()
    symbol = network(cfg, is_train=True, chips=chips)
    rois = mx.sym.BlockGrad(symbol.get_internals()["proposal_target_output0"])
    shapes = train_shapes(chips, size)
    executor = _bind_random(mx.sym.Group([symbol, rois]), shapes, seed=2, grad_req="write")
    executor.arg_dict["im_info"][:] = [[size, size, 1.0]] * chips
    executor.arg_dict["valid_ranges"][:] = [[-1, -1], [0, 50]]
    gt = -np.ones((chips, 100, 5))
    gt[:, 0] = [10, 20, 60, 90, 2]  # sqrt(area) ~ 60: valid in chip 0 only
    gt[:, 1] = [70, 70, 100, 95, 4]  # ~ 28: valid in both
    executor.arg_dict["gt_boxes"][:] = gt
    label = -np.ones((chips, A, feat, feat))
    label[1, anchor, cell[0], cell[1]] = 1
    executor.arg_dict["label"][:] = label.reshape(chips, -1)
    weight = np.zeros((chips, 4 * A, feat, feat))
    weight[0, 4 * anchor + 2, cell[0], cell[1]] = 1
    executor.arg_dict["bbox_weight"][:] = weight
    executor.arg_dict["bbox_target"][:] = -1000.0  # |pred - target| > 1: smooth-L1 gradient is exactly 1
    outputs = [o.asnumpy() for o in executor.forward(is_train=True)]
    executor.backward()

    cls_grad = executor.grad_dict["rpn_cls_score_bias"].asnumpy()
    assert set(np.flatnonzero(cls_grad)) == {anchor, A + anchor}
    assert cls_grad[anchor] == pytest.approx(-cls_grad[A + anchor])
    bbox_grad = executor.grad_dict["rpn_bbox_pred_bias"].asnumpy()
    expected = np.zeros(4 * A)
    expected[4 * anchor + 2] = 3.0 / (chips * 256)
    np.testing.assert_allclose(bbox_grad, expected, rtol=1e-5)

    rcnn_label = outputs[4].reshape(chips, 300)
    assert set(np.unique(rcnn_label)) <= {-1, 0, 2, 4}
    rois = outputs[5].reshape(chips, 300, 5)
    assert (rois[:, :, 0] == np.arange(chips)[:, None]).all()
    for chip, valid_gts in ((0, [0, 1]), (1, [1])):  # the valid gts are appended as rois, with their labels
        appended = [(tuple(box), label) for box, label in zip(rois[chip, :, 1:], rcnn_label[chip])
                    if any((box == gt[chip, g, :4]).all() for g in (0, 1))]
        assert sorted(appended) == sorted((tuple(gt[chip, g, :4]), gt[chip, g, 4]) for g in valid_gts)
    np.testing.assert_allclose(outputs[2].sum(axis=1), 1, rtol=1e-5)
    assert np.abs(executor.grad_dict["fc_new_1_weight"].asnumpy()).sum() > 0  # R-CNN losses train the head
    assert np.abs(executor.grad_dict["stage4_unit1_offset_weight"].asnumpy()).sum() > 0
