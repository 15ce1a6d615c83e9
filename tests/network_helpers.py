"""Helpers of the network tests (test_symbols, test_mobilenetv2, test_autofocus, test_pretrained, test_parity,
the mask and ONNX tests): input shapes, inferred parameter shapes, the graph's nodes, executors with small random
weights, a tiny mask network's random parameters, and the reference's new-layer initialisation rules."""
import json

import mxnet as mx
import numpy as np

from symbols import inference_symbol
from symbols.sniper import mask_inference_symbol

# The reference's new-layer rules, transcribed from its symbols/faster/resnet_mx_101_e2e.py `init_weight_rcnn`
# and resnet_mx_101_e2e_mask.py `init_weight_rcnn` / `init_weight_mask` (commit 66d7d5b): these weights
# mx.random.normal(0, 0.01), every listed bias and every offset layer mx.nd.zeros.
REFERENCE_NORMAL_001 = {"rpn_conv_3x3", "rpn_cls_score", "rpn_bbox_pred", "conv_new_1", "fc_new_1", "fc_new_2",
                        "cls_score", "bbox_pred"}
REFERENCE_AUTO_FOCUS_NORMAL_001 = {"conv_new_2", "conv_new_3", "conv_new_out"}  # `if cfg.TRAIN.AUTO_FOCUS:`
REFERENCE_MASK_NORMAL_001 = {"mask_conv_3x3_1", "mask_conv_3x3_2", "mask_conv_3x3_3", "mask_conv_3x3_4",
                             "mask_deconv", "mask_out"}


def inference_shapes(batch, size):
    return dict(data=(batch, 3, size, size), im_info=(batch, 3), im_ids=(batch,), chip_ids=(batch,))


def train_shapes(batch, size, stride=16, anchors=21, rpn_only=False, focus=False):
    """The training graph's inputs for ``batch`` chips of ``size``; ``focus`` adds AutoFocus's scale_label."""
    feat = size // stride
    shapes = dict(data=(batch, 3, size, size), im_info=(batch, 3), valid_ranges=(batch, 2), gt_boxes=(batch, 100, 5),
                  label=(batch, anchors * feat * feat), bbox_target=(batch, 4 * anchors, feat, feat),
                  bbox_weight=(batch, 4 * anchors, feat, feat))
    if rpn_only:
        for name in ("im_info", "valid_ranges", "gt_boxes"):
            del shapes[name]
    if focus:
        shapes["scale_label"] = (batch, feat * feat)
    return shapes


def parameter_shapes(symbol, input_shapes):
    """({argument: shape}, {auxiliary state: shape}, {output: shape}) with the inputs left out."""
    arg_shapes, out_shapes, aux_shapes = symbol.infer_shape(**input_shapes)
    args = {n: list(s) for n, s in zip(symbol.list_arguments(), arg_shapes) if n not in input_shapes}
    aux = {n: list(s) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)}
    outs = {n: list(s) for n, s in zip(symbol.list_outputs(), out_shapes)}
    return args, aux, outs


def graph_nodes(symbol):
    return json.loads(symbol.tojson())["nodes"]


def node_attrs(symbol):
    """{node name: its attributes}."""
    return {n["name"]: n.get("attrs", {}) for n in graph_nodes(symbol)}


def bind_random(symbol, shapes, seed, grad_req="null", weight_std=0.05):
    """An executor with N(0, weight_std) weights, unit gammas, zero biases/betas, unit-variance statistics
    and data uniform in [-100, 100]; the other inputs are left for the test to set."""
    rng = np.random.RandomState(seed)
    executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **shapes)
    for name, array in executor.arg_dict.items():
        if name not in shapes:
            array[:] = rng.normal(0, weight_std, array.shape) if name.endswith("weight") else name.endswith("gamma")
    for name, array in executor.aux_dict.items():
        array[:] = name.endswith("var")
    executor.arg_dict["data"][:] = rng.uniform(-100, 100, shapes["data"])
    return executor, rng


def random_params(symbols_and_shapes, seed=0):
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


def mask_network_params(cfg):
    """Random parameters of the tiny mask network of ``cfg`` (three classes), its masks informative."""
    args, aux = random_params([(inference_symbol(cfg, 4), inference_shapes(1, 64)),
                               (mask_inference_symbol(cfg, 4), dict(data=(1, 3, 64, 64), mask_rois=(1, 5)))])
    args["mask_out_weight"] *= 3000  # logits of a few units: probabilities across (0, 1), not all near 0.5
    return args, aux
