"""Pretrained backbone loading (lib/train/pretrained.py) and the GluonCV ResNet v2 conversion
(lib/gluoncv_resnet.py, tools/convert_gluoncv_resnet.py), the latter checked by running GluonCV and the
converted backbone on the same image (GluonCV models built without downloaded weights, with randomised
statistics)."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import get_model

from network_helpers import REFERENCE_AUTO_FOCUS_NORMAL_001, REFERENCE_MASK_NORMAL_001, REFERENCE_NORMAL_001

from lib import gluoncv_resnet
from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from lib.run.checkpoint import params_path
from lib.train.pretrained import PretrainedError, initial_params
from symbols import is_imagenet_parameter, training_symbol
from symbols.batch_norm import BatchNormPolicy
from symbols.resnet import BN_EPS, RESNETS, resnet_body

MANIFEST = os.path.join(ROOT, "tests", "data", "sniper_res101_test_params.json")
HEAD_PREFIXES = ("rpn_", "conv_new_1_", "offset_", "fc_new_", "cls_score_", "bbox_pred_")  # the detection heads
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])  # GluonCV's RGB preprocessing, written out independently
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def randomised_gluon_resnet(name, seed):
    """A GluonCV model with random weights and non-trivial batch-norm parameters and statistics."""
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    net = get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    net(mx.nd.zeros((1, 3, 32, 32)))
    for param_name, param in net.collect_params().items():
        shape = param.shape
        if param_name.endswith("gamma"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
        elif param_name.endswith(("beta", "running_mean")):
            param.set_data(mx.nd.array(rng.normal(0, 0.2, shape)))
        elif param_name.endswith("running_var"):
            param.set_data(mx.nd.array(rng.uniform(0.5, 2.0, shape)))
    return net


@pytest.fixture(scope="module")
def gluon_resnet50():
    return randomised_gluon_resnet("resnet50_v2", seed=0)


def pixel_means():
    return np.array(load_config(None).network.PIXEL_MEANS)


def backbone_params(names):
    return [n for n in names if not n.startswith(HEAD_PREFIXES) and "_offset_" not in n]


def test_resnet101_v2_maps_one_to_one_onto_the_published_backbone():
    with open(MANIFEST) as f:
        manifest = json.load(f)
    net = randomised_gluon_resnet("resnet101_v2", seed=1)
    args, aux = gluoncv_resnet.convert(net, pixel_means(), "RGB")
    assert {n: list(v.shape) for n, v in args.items()} == \
        {n: manifest["args"][n] for n in backbone_params(manifest["args"])}
    assert {n: list(v.shape) for n, v in aux.items()} == manifest["aux"]
    assert set(args) == {n for n in manifest["args"] if is_imagenet_parameter(n)}
    assert all(v.dtype == np.float32 for v in list(args.values()) + list(aux.values()))


@pytest.fixture(scope="module")
def dilated_gluon_resnet50(gluon_resnet50):
    """GluonCV's stage 4 switched to stride 1 / dilation 2 (what zero deformable offsets compute)."""
    net = gluon_resnet50
    for unit in net.features[8]:
        unit.conv2._kwargs.update(stride=(1, 1), dilate=(2, 2), pad=(2, 2))
        if unit.downsample is not None:
            unit.downsample._kwargs.update(stride=(1, 1))
    return net


@pytest.mark.parametrize("channel_order", ["RGB", "BGR"])
def test_converted_backbone_computes_the_gluoncv_forward(dilated_gluon_resnet50, channel_order):
    """res4 and res5 equal GluonCV's stage 3 and stage 4 outputs on the same image fed in the network's
    channel order (RGB as the reference, or BGR)."""
    net = dilated_gluon_resnet50
    image_rgb = np.random.RandomState(2).uniform(0, 255, (2, 3, 96, 80))
    gluon_input = (image_rgb / 255.0 - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None]
    x = mx.nd.array(gluon_input)
    for layer in list(net.features)[:8]:
        x = layer(x)
    gluon_res4 = x.asnumpy()
    gluon_res5 = net.features[8](x).asnumpy()

    arg_params, aux_params = gluoncv_resnet.convert(net, pixel_means(), channel_order)
    batch_norm = BatchNormPolicy(0.995, training=False, eps=BN_EPS)
    res4, res5 = resnet_body(mx.sym.var("data"), RESNETS["resnet50"], batch_norm)
    symbol = mx.sym.Group([res4, res5])
    image_bgr = image_rgb[:, ::-1]
    our_input = image_bgr - pixel_means()[:, None, None]  # BGR minus the BGR-listed means
    if channel_order == "RGB":
        our_input = our_input[:, ::-1]
    executor = symbol.simple_bind(mx.cpu(), grad_req="null", data=our_input.shape)
    for name, array in executor.arg_dict.items():
        if name == "data":
            array[:] = our_input
        elif "_offset_" in name:
            array[:] = 0
        else:
            array[:] = arg_params.pop(name)
    for name, array in executor.aux_dict.items():
        array[:] = aux_params.pop(name)
    assert not arg_params and not aux_params  # every converted parameter was used
    ours_res4, ours_res5 = [o.asnumpy() for o in executor.forward()]
    assert ours_res4.shape == gluon_res4.shape == (2, 1024, 6, 5)
    assert ours_res5.shape == gluon_res5.shape == (2, 2048, 6, 5)
    for ours, theirs in ((ours_res4, gluon_res4), (ours_res5, gluon_res5)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())


def test_converter_cli_writes_a_checkpoint_the_trainer_loads(gluon_resnet50, tmp_path):
    gluon_file = str(tmp_path / "gluon.params")
    gluon_resnet50.save_parameters(gluon_file)
    tool = os.path.join(ROOT, "tools", "convert_gluoncv_resnet.py")
    result = subprocess.run([sys.executable, tool, "--model", "resnet50_v2", "--params", gluon_file, "--prefix",
                             str(tmp_path / "r50"), "--epoch", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["gluon.params", "r50-0002.params"]  # no temporary file left
    cfg = pretrained_cfg("resnet50", pretrained=str(tmp_path / "r50"), epoch=2)
    symbol = training_symbol(cfg, None, chips_per_device=2, rpn_only=True)
    args, aux = initial_params(cfg, symbol, rpn_only_shapes(64))
    expected_args, expected_aux = gluoncv_resnet.convert(gluon_resnet50, pixel_means(), "RGB")
    for name, value in list(expected_args.items()) + list(expected_aux.items()):
        loaded = args[name] if name in args else aux[name]
        np.testing.assert_array_equal(loaded.asnumpy(), value.asnumpy(), err_msg=name)


def pretrained_cfg(symbol="resnet_tiny", pretrained="", epoch=0, from_scratch=False):
    return load_config(None, {"symbol": symbol, "TRAIN.fp16": False, "TRAIN.FROM_SCRATCH": from_scratch,
                              "network.pretrained": pretrained, "network.pretrained_epoch": epoch})


def rpn_only_shapes(size, chips=2, anchors=21):
    feat = size // 16
    return dict(data=(chips, 3, size, size), label=(chips, anchors * feat * feat),
                bbox_target=(chips, 4 * anchors, feat, feat), bbox_weight=(chips, 4 * anchors, feat, feat))


def train_shapes(size, chips=2, anchors=21):
    return dict(rpn_only_shapes(size, chips, anchors), im_info=(chips, 3), valid_ranges=(chips, 2),
                gt_boxes=(chips, 100, 5))


@pytest.fixture(scope="module")
def tiny_network():
    """The tiny training symbol, its parameter shapes and a random ImageNet-style backbone checkpoint."""
    import lib.ops  # noqa: F401  (the training symbol's proposal-target operator)
    symbol = training_symbol(pretrained_cfg(), num_classes=5, chips_per_device=2)
    shapes = train_shapes(64)
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    args = {n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n not in shapes}
    aux = dict(zip(symbol.list_auxiliary_states(), aux_shapes))
    rng = np.random.RandomState(3)
    stored = {"arg:" + n: mx.nd.array(rng.normal(size=args[n])) for n in backbone_params(args)}
    stored.update({"aux:" + n: mx.nd.array(rng.uniform(0.5, 2, size=s)) for n, s in aux.items()})
    stored.update({"arg:fc1_weight": mx.nd.ones((10, 256)), "aux:bn1_moving_var": mx.nd.ones(256)})  # classifier
    return symbol, shapes, args, aux, stored


def write_checkpoint(directory, stored, epoch=3):
    prefix = str(directory / "backbone")
    mx.nd.save(params_path(prefix, epoch), stored)
    return prefix


@pytest.mark.parametrize("rule", ["reference", "msra"])
def test_backbone_is_loaded_and_new_layers_initialised_per_rule(tiny_network, tmp_path, rule):
    symbol, shapes, arg_shapes, aux_shapes, stored = tiny_network
    cfg = with_overrides(pretrained_cfg(pretrained=write_checkpoint(tmp_path, stored), epoch=3),
                         {"TRAIN.NEW_LAYER_INIT": rule})
    mx.random.seed(0)
    args, aux = initial_params(cfg, symbol, shapes)
    assert {n: v.shape for n, v in args.items()} == arg_shapes
    assert {n: v.shape for n, v in aux.items()} == aux_shapes
    for name in backbone_params(arg_shapes):
        np.testing.assert_array_equal(args[name].asnumpy(), stored["arg:" + name].asnumpy(), err_msg=name)
    for name in aux_shapes:
        np.testing.assert_array_equal(aux[name].asnumpy(), stored["aux:" + name].asnumpy(), err_msg=name)
    new = {n: v.asnumpy() for n, v in args.items() if n not in backbone_params(arg_shapes)}
    assert "stage4_unit1_offset_weight" in new and "offset_weight" in new
    for name, value in new.items():
        assert value.dtype == np.float32
        if "offset" in name or name.endswith("bias"):
            assert not value.any(), name
    weight_stds = {"rpn_conv_3x3_weight": 0.01, "rpn_cls_score_weight": 0.01, "rpn_bbox_pred_weight": 0.01,
                   "conv_new_1_weight": 0.01, "cls_score_weight": 0.01, "bbox_pred_weight": 0.01,
                   "fc_new_1_weight": 0.01, "fc_new_2_weight": 0.01}  # the reference: N(0, 0.01) for all
    if rule == "msra":
        weight_stds.update(bbox_pred_weight=0.001, fc_new_1_weight=np.sqrt(2.0 / (16 * 7 * 7)),
                           fc_new_2_weight=np.sqrt(2.0 / 128))
    assert sorted(weight_stds) == sorted(n for n in new if n.endswith("weight") and "offset" not in n)
    for name, std in weight_stds.items():
        assert abs(new[name].mean()) < 0.2 * std and new[name].std() == pytest.approx(std, rel=0.15), name


def test_training_from_scratch_needs_no_file(tiny_network):
    symbol, shapes, arg_shapes, aux_shapes, _ = tiny_network
    cfg = pretrained_cfg(pretrained="/nonexistent/prefix", from_scratch=True)
    args, aux = initial_params(cfg, symbol, shapes)
    assert set(args) == set(arg_shapes) and set(aux) == set(aux_shapes)
    conv0 = args["conv0_weight"].asnumpy()  # He initialisation: std sqrt(2 / fan_in)
    assert conv0.std() == pytest.approx(np.sqrt(2.0 / (3 * 7 * 7)), rel=0.15)
    assert (args["stage2_unit1_bn1_gamma"].asnumpy() == 1).all() and not args["stage2_unit1_bn1_beta"].asnumpy().any()
    assert not aux["bn0_moving_mean"].asnumpy().any() and (aux["bn0_moving_var"].asnumpy() == 1).all()


def test_missing_weights_file_explains_how_to_get_one(tiny_network, tmp_path):
    symbol, shapes, _, _, _ = tiny_network
    cfg = pretrained_cfg(pretrained=str(tmp_path / "resnet101_v2"), epoch=0)
    with pytest.raises(PretrainedError, match=r"resnet101_v2-0000\.params not found.*convert_gluoncv_resnet.*"
                                              r"FROM_SCRATCH"):
        initial_params(cfg, symbol, shapes)


@pytest.mark.parametrize("corruption, message", [
    ("shape", r"conv0_weight has shape \(8, 3, 7, 7\), the network needs \(16, 3, 7, 7\)"),
    ("missing", r"lacks 1 backbone parameters.*stage3_unit1_conv2_weight"),
    ("gluon_keys", r"key 'stage1_conv0_weight' is not 'arg:<name>'.*convert_gluoncv_resnet"),
])
def test_unfit_checkpoints_are_rejected_by_name(tiny_network, tmp_path, corruption, message):
    symbol, shapes, _, _, stored = tiny_network
    stored = dict(stored)
    if corruption == "shape":
        stored["arg:conv0_weight"] = mx.nd.zeros((8, 3, 7, 7))
    elif corruption == "missing":
        del stored["arg:stage3_unit1_conv2_weight"]
    else:
        stored["stage1_conv0_weight"] = mx.nd.zeros((1,))
    cfg = pretrained_cfg(pretrained=write_checkpoint(tmp_path, stored), epoch=3)
    with pytest.raises(PretrainedError, match=message):
        initial_params(cfg, symbol, shapes)


def test_a_project_checkpoint_continues_with_its_regressor_as_trained(tiny_network, tmp_path):
    """Fine-tuning from a checkpoint of this project (e.g. adding the AutoFocus branch): the test-ready
    regressor under arg: is the trained one times the stds; the trained values under train: are used."""
    symbol, shapes, arg_shapes, _, stored = tiny_network
    trained = {n: mx.nd.array(np.full(arg_shapes[n], 0.5)) for n in ("bbox_pred_weight", "bbox_pred_bias")}
    checkpoint = dict(stored)
    checkpoint.update({f"arg:{n}": v * 10 for n, v in trained.items()})
    checkpoint.update({f"train:{n}": v for n, v in trained.items()})
    args, _ = initial_params(pretrained_cfg(pretrained=write_checkpoint(tmp_path, checkpoint), epoch=3), symbol, shapes)
    for name in trained:
        assert (args[name].asnumpy() == 0.5).all(), name


@pytest.mark.parametrize("with_mask", [False, True])
def test_autofocus_layers_are_initialised_as_the_reference_does(with_mask):
    """FocusPixels layers (AutoFocus and mask AutoFocus) get N(0, 0.01) weights and zero biases, as every
    other new layer the reference's init_weight lists."""
    import lib.ops  # noqa: F401  (the training symbol's proposal-target operators)
    cfg = with_overrides(pretrained_cfg(from_scratch=True), {"network.AUTO_FOCUS": True, "TRAIN.WITH_MASK": with_mask,
                                                             "TRAIN.NEW_LAYER_INIT": "reference"})
    symbol = training_symbol(cfg, num_classes=5, chips_per_device=2)
    shapes = dict(train_shapes(64), scale_label=(2, 4 * 4))
    if with_mask:
        shapes["gt_masks"] = (2, 100, 500)
    mx.random.seed(0)
    args, _ = initial_params(cfg, symbol, {n: s for n, s in shapes.items() if n in symbol.list_arguments()})
    normal = REFERENCE_NORMAL_001 | REFERENCE_AUTO_FOCUS_NORMAL_001
    if with_mask:
        normal |= REFERENCE_MASK_NORMAL_001
    new = {n: v.asnumpy() for n, v in args.items() if not is_imagenet_parameter(n)}
    assert {n[:-len("_weight")] for n in new if n.endswith("_weight") and "offset" not in n} == normal
    for name, value in new.items():
        if "offset" in name or name.endswith("_bias"):
            assert not value.any(), name
        else:
            assert abs(value.mean()) < 0.002 and value.std() == pytest.approx(0.01, rel=0.1), name
