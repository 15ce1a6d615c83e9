"""The MobileNetV2 SNIPER (symbols/mobilenetv2.py with the SNIPER heads): the reference's test-network
manifest, the body's layers against the MobileNetV2 table, batch-norm settings, fp16 casts, fixed
parameters, the R-CNN loss normalisation, its configs, the stride-32 anchor targets and pretrained loading."""
import json
import os

import mxnet as mx
import numpy as np
import pytest

from network_helpers import bind_random, graph_nodes, inference_shapes, node_attrs, parameter_shapes, train_shapes

from lib.bootstrap import ROOT
from lib.config import ConfigError, load_config
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.run.checkpoint import params_path
from lib.train.pretrained import PretrainedError, initial_params
from symbols import get_fixed_param_names, inference_symbol, is_imagenet_parameter, training_symbol
from symbols.backbones import BACKBONES, backbone_of, feature_stride

MANIFEST = os.path.join(ROOT, "tests", "data", backbone_of("mobilenetv2").manifest)
CONFIG = os.path.join(ROOT, "configs", "faster", "sniper_mobilenetv2_e2e.yml")
SYNTHETIC = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_mobilenetv2.yml")
A = 15
TEST_INPUTS = inference_shapes(1, 512)
# MobileNetV2 (Sandler et al. 2018, table 2), written out: (expansion, channels, blocks, first stride)
TABLE = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_cfg(symbol="mobilenetv2", **overrides):
    return load_config(CONFIG, [("symbol", symbol), ("TRAIN.fp16", False), ("TEST.fp16", False)] +
                       list(overrides.items()))


@pytest.fixture(scope="module")
def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def test_test_network_matches_the_reference_manifest(manifest):
    symbol = inference_symbol(load_config(CONFIG), 81)
    args, aux, outs = parameter_shapes(symbol, TEST_INPUTS)
    assert len(args) == 177 and len(aux) == 106
    assert args == manifest["args"] and aux == manifest["aux"] and outs == manifest["outputs"]
    assert symbol.list_outputs() == ["rois_output", "cls_prob_reshape_output", "bbox_pred_reshape_output",
                                     "im_ids", "chip_ids", "im_info"]
    attrs = node_attrs(symbol)
    for name in ("offset_t", "deformable_roi_pool"):
        assert float(attrs[name]["spatial_scale"]) == 1 / 32 and attrs[name]["sample_per_part"] == "4"
    assert attrs["rois"]["feature_stride"] == "32" and attrs["rois"]["scales"] == "(1, 2, 4, 8, 12)"


def test_training_network_has_the_test_parameters(manifest):
    import lib.ops  # noqa: F401
    cfg = load_config(CONFIG)  # fp16, as published
    symbol = training_symbol(cfg, 81, 2)
    args, aux, outs = parameter_shapes(symbol, train_shapes(2, 512, stride=32, anchors=A))
    assert args == manifest["args"] and aux == manifest["aux"]
    assert outs == {"rpn_cls_prob_output": [2, 2, A * 16, 16], "rpn_bbox_loss_output": [2, 4 * A, 16, 16],
                    "cls_prob_output": [600, 81], "bbox_loss_output": [600, 4], "rcnn_label_output": [600]}
    attrs = node_attrs(symbol)
    assert attrs["proposal_target"]["feature_stride"] == "32"
    assert attrs["proposal_target"]["scales"] == "(1, 2, 4, 8, 12)"


def test_body_layers_follow_the_mobilenetv2_table():
    nodes = {n["name"]: n for n in graph_nodes(inference_symbol(mobilenet_cfg(), 81))}

    def conv(name):
        attrs = nodes[f"{name}-conv2d"]["attrs"]
        return int(attrs["num_filter"]), attrs["kernel"], attrs.get("stride", "(1, 1)"), int(attrs.get("num_group", 1))

    assert conv("first-3x3-conv") == (32, "(3, 3)", "(2, 2)", 1)
    channels, shortcuts = 32, set()
    for i, (t, c, n, s) in enumerate(TABLE):
        for j in range(n):
            prefix = f"seq-{i}-block{j}"
            stride = f"({s}, {s})" if j == 0 else "(1, 1)"
            assert conv(f"{prefix}-exp") == (channels * t, "(1, 1)", "(1, 1)", 1)
            assert conv(f"{prefix}-depthwise") == (channels * t, "(3, 3)", stride, channels * t)
            assert conv(f"{prefix}-linear") == (c, "(1, 1)", "(1, 1)", 1)
            if j > 0:
                shortcuts.add(f"{prefix}-shortcut")
            channels = c
    assert conv("last-1x1-conv") == (1280, "(1, 1)", "(1, 1)", 1)
    assert {name for name, node in nodes.items() if node["op"] == "elemwise_add"} == shortcuts
    assert len(shortcuts) == sum(n - 1 for _, _, n, _ in TABLE)
    assert "last-1x1-conv-relu6" in nodes and nodes["seq-0-block0-linear-batchnorm"]["op"] == "BatchNorm"
    assert not any(name.startswith("seq-") and name.endswith("linear-relu6") for name in nodes)  # linear projection
    # the heads read the last 1x1 conv's ReLU6 (1280 channels at stride 32): no concatenation
    consumers = {name for name, node in nodes.items()
                 if any(graph_input[0] == list(nodes).index("last-1x1-conv-relu6") for graph_input in node["inputs"])}
    assert consumers == {"rpn_conv_3x3", "conv_new_1"}


def test_tiny_variant_has_the_same_layers_narrower():
    full, _, _ = parameter_shapes(inference_symbol(mobilenet_cfg(), 6), TEST_INPUTS)
    tiny, _, _ = parameter_shapes(inference_symbol(mobilenet_cfg("mobilenetv2_tiny"), 6), TEST_INPUTS)
    assert list(full) == list(tiny)
    body = [n for n in full if n.startswith(("first-", "seq-", "last-"))]
    assert all(np.prod(tiny[n]) < np.prod(full[n]) for n in body)
    assert tiny["first-3x3-conv-conv2d_weight"] == [8, 3, 3, 3]
    assert tiny["last-1x1-conv-conv2d_weight"] == [256, 80, 1, 1]


def test_batch_norms_and_fixed_parameters():
    cfg = mobilenet_cfg()
    train = training_symbol(cfg, 6, 2, rpn_only=True)
    batch_norms = [n for n in graph_nodes(train) if n["op"] == "BatchNorm"]
    assert len(batch_norms) == 2 + 3 * sum(n for _, _, n, _ in TABLE)
    for node in batch_norms:
        attrs = node["attrs"]
        assert (float(attrs["eps"]), float(attrs["momentum"]), attrs["fix_gamma"], attrs["use_global_stats"]) == \
            (1e-5, 0.995, "False", "False")  # batch statistics in training, gamma learnt (but fixed, below)
    test = inference_symbol(cfg, 6)
    assert all(n["attrs"]["use_global_stats"] == "True" for n in graph_nodes(test) if n["op"] == "BatchNorm")

    fixed = get_fixed_param_names(train, cfg)  # FIXED_BN_AFFINE: every gamma and beta, no convolution
    assert sorted(fixed) == sorted(n for n in train.list_arguments() if n.endswith(("_gamma", "_beta")))
    assert len(fixed) == 2 * len(batch_norms)
    assert get_fixed_param_names(train, mobilenet_cfg(**{"network.FIXED_BN_AFFINE": False})) == []


def test_fp16_body_runs_after_the_first_convolution():
    import lib.ops  # noqa: F401
    symbol = training_symbol(load_config(CONFIG), 6, 2)
    nodes = graph_nodes(symbol)
    casts = [(n["attrs"]["dtype"], nodes[n["inputs"][0][0]]["name"],
              sorted(m["name"] for m in nodes if any(e[0] == i for e in m["inputs"])))
             for i, n in enumerate(nodes) if n["op"] == "Cast"]
    assert casts == [("float16", "first-3x3-conv-relu6", ["seq-0-block0-exp-conv2d"]),
                     ("float32", "last-1x1-conv-relu6", ["conv_new_1", "rpn_conv_3x3"])]
    assert inference_symbol(load_config(CONFIG), 6).tojson().count('"op": "Cast"') == 2  # TEST.fp16, as published
    assert inference_symbol(mobilenet_cfg(), 6).tojson().count('"op": "Cast"') == 0


def test_rcnn_classification_loss_is_averaged_over_all_rois():
    """The reference MobileNetV2 divides the R-CNN softmax loss by 300 rois x chips, ignored rois included:
    d loss / d cls_score_bias = sum over labelled rois (p - onehot) / (RPN_POST_NMS_TOP_N * chips)."""
    import lib.ops  # noqa: F401
    chips, size, rois = 2, 128, 64
    # the exact rules label the padding rois -1 (the reference rules label every roi): ignored rois count too
    cfg = mobilenet_cfg("mobilenetv2_tiny", **{"TRAIN.RPN_POST_NMS_TOP_N": rois, "TRAIN.PROPOSAL_TARGET_RULES": "exact"})
    symbol = training_symbol(cfg, 4, chips)
    attrs = node_attrs(symbol)["cls_prob"]
    assert attrs["normalization"] == "null" and float(attrs["grad_scale"]) == pytest.approx(1 / (rois * chips))
    inputs = train_shapes(chips, size, stride=32, anchors=A)
    executor, _ = bind_random(symbol, inputs, seed=0, grad_req="write", weight_std=0.1)
    executor.arg_dict["im_info"][:] = [[size, size, 1.0]] * chips
    executor.arg_dict["valid_ranges"][:] = -1
    gt = -np.ones(inputs["gt_boxes"])
    gt[:, 0] = [10, 20, 60, 90, 2]
    gt[:, 1] = [70, 64, 120, 110, 3]
    executor.arg_dict["gt_boxes"][:] = gt
    executor.arg_dict["label"][:] = -1
    outputs = [o.asnumpy() for o in executor.forward(is_train=True)]
    executor.backward()
    prob, label = outputs[2], outputs[4]
    assert (label == -1).any() and (label >= 0).sum() > 2  # padded rois are ignored, but still counted
    onehot = np.eye(4)[np.where(label >= 0, label, 0).astype(int)]
    expected = ((prob - onehot) * (label >= 0)[:, None]).sum(axis=0) / (rois * chips)
    np.testing.assert_allclose(executor.grad_dict["cls_score_bias"].asnumpy(), expected, rtol=1e-4, atol=1e-7)
    resnet = training_symbol(load_config(None, {"symbol": "resnet_tiny"}), 4, chips)
    assert node_attrs(resnet)["cls_prob"]["normalization"] == "valid"


def test_configs_have_the_reference_settings():
    cfg = load_config(CONFIG)
    network, train = cfg.network, cfg.TRAIN
    assert (cfg.symbol, feature_stride(cfg), network.NUM_ANCHORS) == ("mobilenetv2", 32, 15)
    assert network.ANCHOR_SCALES == (1, 2, 4, 8, 12) and network.ANCHOR_RATIOS == (0.5, 1.0, 2.0)
    assert network.FIXED_BN_AFFINE and network.FIXED_PARAMS == ()
    assert (train.lr, train.warmup_step, train.BATCH_IMAGES, train.end_epoch, train.lr_step) == \
        (0.025, 9000, 42, 7, "5.33")
    assert train.SCALES == (3.0, 1.667, 512.0)  # what the reference's main_train.py forces for 81-class COCO
    assert (cfg.TEST.BATCH_IMAGES, cfg.TEST.BATCH_PARTS) == ((2, 2, 4), 2)
    assert cfg.TEST.SCALES == ((1400, 2000), (800, 1280), (480, 512))
    assert cfg.dataset.image_set == "train2014+val2014" and cfg.dataset.test_image_set == "test-dev2015"
    synthetic = load_config(SYNTHETIC)
    assert (synthetic.symbol, feature_stride(synthetic), synthetic.network.NUM_ANCHORS) == ("mobilenetv2_tiny", 32, 15)


def test_every_backbone_record_names_its_stride_head_and_weights():
    assert {name: backbone.stride for name, backbone in BACKBONES.items()} == {
        "resnet101": 16, "resnet50": 16, "resnet_tiny": 16, "mobilenetv2": 32, "mobilenetv2_tiny": 32}
    assert all(backbone.name == name and backbone.head.rpn_channels > 0 for name, backbone in BACKBONES.items())
    assert {name: backbone.gluoncv_model for name, backbone in BACKBONES.items() if backbone.gluoncv_model} == {
        "resnet101": "resnet101_v2", "resnet50": "resnet50_v2"}
    manifests = [backbone.manifest for backbone in BACKBONES.values() if backbone.manifest]
    assert manifests and all(os.path.isfile(os.path.join(ROOT, "tests", "data", m)) for m in manifests)


def test_an_unknown_symbol_is_refused_at_load_listing_the_registered_backbones():
    with pytest.raises(ConfigError) as err:
        load_config(SYNTHETIC, [("symbol", "resnet999")])
    assert str(err.value) == ("config key symbol: unknown backbone 'resnet999' (registered: mobilenetv2, "
                              "mobilenetv2_tiny, resnet101, resnet50, resnet_tiny)")


def test_stride_32_anchor_targets_and_stride_errors():
    targeter = AnchorTargeter(AnchorTargetParams.from_config(load_config(SYNTHETIC)))
    assert targeter.label_shape == (A * 16 * 16,) and targeter.target_shape == (4 * A, 16, 16)
    x1, y1, x2, y2 = targeter.anchors.T
    sides = np.sqrt((x2 - x1 + 1) * (y2 - y1 + 1))
    assert sides.min() == pytest.approx(32, rel=0.05) and sides.max() == pytest.approx(384, rel=0.05)
    with pytest.raises(ConfigError, match=r"network\.RPN_FEAT_STRIDE is no longer set: it is the backbone's stride"):
        load_config(SYNTHETIC, [("network.RPN_FEAT_STRIDE", 32)])
    with pytest.raises(ValueError, match=r"CHIP_SIZE.*multiple"):
        load_config(SYNTHETIC, [("TRAIN.CHIP_SIZE", 496)])


def test_tiny_test_network_forward():
    cfg = load_config(SYNTHETIC)
    symbol = inference_symbol(cfg, 4)
    inputs = dict(inference_shapes(2, 160), data=(2, 3, 160, 192))
    executor, _ = bind_random(symbol, inputs, seed=3, weight_std=0.1)
    executor.arg_dict["im_info"][:] = [[160, 192, 1.0], [150, 100, 1.0]]
    rois, cls_prob, bbox_pred, _, _, _ = [o.asnumpy() for o in executor.forward()]
    assert rois.shape == (600, 5) and cls_prob.shape == (2, 300, 4) and bbox_pred.shape == (2, 300, 4)
    np.testing.assert_allclose(cls_prob.sum(axis=2), 1, rtol=1e-5)
    np.testing.assert_array_equal(rois[:, 0], np.repeat([0, 1], 300))
    assert np.isfinite(bbox_pred).all() and len(np.unique(rois[300:, 1:], axis=0)) > 10


def test_pretrained_mobilenetv2_checkpoint_loads_by_name(tmp_path):
    cfg = mobilenet_cfg("mobilenetv2_tiny", **{"network.pretrained": str(tmp_path / "mnv2")})
    symbol = training_symbol(cfg, None, 2, rpn_only=True)
    inputs = train_shapes(2, 64, stride=32, anchors=A, rpn_only=True)
    args, aux, _ = parameter_shapes(symbol, inputs)
    body = [n for n in args if is_imagenet_parameter(n)]
    assert body == [n for n in args if not n.startswith("rpn_")]  # every body parameter, no head one
    rng = np.random.RandomState(5)
    stored = {f"arg:{n}": mx.nd.array(rng.normal(0, 1, args[n])) for n in body}
    stored.update({f"aux:{n}": mx.nd.array(rng.uniform(0.5, 1, s)) for n, s in aux.items()})
    stored["arg:fc_weight"] = mx.nd.zeros((1000, 256))  # the ImageNet classifier is not used
    mx.nd.save(params_path(cfg.network.pretrained, 0), stored)
    arg_params, aux_params = initial_params(cfg, symbol, inputs)
    for name in body:
        np.testing.assert_array_equal(arg_params[name].asnumpy(), stored[f"arg:{name}"].asnumpy())
    for name in aux:
        np.testing.assert_array_equal(aux_params[name].asnumpy(), stored[f"aux:{name}"].asnumpy())
    del stored["arg:seq-3-block2-exp-conv2d_weight"]
    mx.nd.save(params_path(cfg.network.pretrained, 0), stored)
    with pytest.raises(PretrainedError, match="seq-3-block2-exp-conv2d_weight"):
        initial_params(cfg, symbol, inputs)
