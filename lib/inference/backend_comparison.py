"""MXNet against ONNX Runtime on the same parameters (tools/compare_backends.py, tests/inference/test_onnx*.py): random
weights of any backbone, final detections matched box by box, and the exported graphs' outputs layer by layer
against the MXNet graph's internal outputs at the same cut (lib.inference.onnx_export.graph_cut), the head on
MXNet's own rois."""
import json

import mxnet as mx
import numpy as np

from lib.boxes import bbox_overlaps
from lib.config import with_overrides
from lib.inference.mxnet_network import DATA_NAMES
from lib.inference.export import ONNX_EXPORT_KEYS
from lib.inference.onnx_export import HEAD_OUTPUTS, graph_cut
from symbols import inference_symbol
from symbols.resnet import INPUT_NORMALISER

PIXEL_VARIANCE = 3600.0  # the ResNets' input normaliser: pixels of standard deviation ~60 to ~1


def random_weights(cfg, num_classes, init="xavier"):
    """``(arg_params, aux_params)`` of the test network of ``cfg`` for ``num_classes`` from MXNet's seed 0:
    ``init`` "xavier" (Gaussians of variance 1 / fan-in, the input normaliser scaled to the pixels, so that deep
    bodies neither explode nor tie) or "normal" (N(0, 0.05)); speed and agreement need no trained weights."""
    module = mx.mod.Module(inference_symbol(cfg, num_classes), data_names=DATA_NAMES, label_names=None)
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Xavier("gaussian", "in", 1) if init == "xavier" else mx.init.Normal(0.05))
    arg_params, aux_params = module.get_params()
    for name in aux_params:
        if name.startswith(INPUT_NORMALISER) and name.endswith("moving_var"):
            aux_params[name][:] = PIXEL_VARIANCE
    return arg_params, aux_params


def match_detections(expected, found, min_iou=0.99):
    """How ``found`` (N, 6) reproduces ``expected`` (M, 6) ``[x1, y1, x2, y2, score, label]``: per expected row
    the same-label found rows at IoU >= ``min_iou``, the closest score among them. Returns counts of both,
    ``matched`` (rows with such a partner), ``worst_iou`` (the lowest best IoU) and ``max_score_diff`` (over
    matched rows)."""
    matched, worst_iou, score_diff = 0, 1.0, 0.0
    for row in expected:
        same = found[found[:, 5] == row[5]]
        if not len(same):
            worst_iou = 0.0
            continue
        overlaps = bbox_overlaps(row[None, :4].astype(np.float32), same[:, :4].astype(np.float32))[0]
        worst_iou = min(worst_iou, float(overlaps.max()))
        close = overlaps >= min_iou
        if close.any():
            matched += 1
            score_diff = max(score_diff, float(np.abs(same[close, 4] - row[4]).min()))
    return {"expected": len(expected), "found": len(found), "matched": matched, "worst_iou": worst_iou,
            "max_score_diff": score_diff}


def layer_differences(cfg, num_classes, arg_params, aux_params, onnx_network, data, im_info):
    """{output: (max |ONNX - MXNet|, max |MXNet|)} of the body outputs (rpn_cls_prob, rpn_bbox_pred, features)
    on ``data`` (B, 3, H, W) and of the head outputs (cls_prob, bbox_pred) on MXNet's features and rois,
    the MXNet graph being the exported one (stock deformable operators, stock proposal layer)."""
    symbol = inference_symbol(with_overrides(cfg, ONNX_EXPORT_KEYS), num_classes)
    nodes = json.loads(symbol.tojson())["nodes"]
    body_entries, _, rois_entry = graph_cut(nodes)
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    entries = {**body_entries, "rois": rois_entry, **{name: (by_name[name], 0) for name in HEAD_OUTPUTS}}
    internals = symbol.get_internals()
    names = internals.list_outputs()
    picked = {}
    for key, (node, index) in entries.items():
        prefix = f"{nodes[node]['name']}_output"
        picked[key] = prefix if index == 0 and prefix in names else f"{prefix}{index}"
    group = mx.sym.Group([internals[picked[key]] for key in entries])
    executor = group.simple_bind(mx.cpu(), data=data.shape, im_info=im_info.shape, grad_req="null")
    for name, value in {**arg_params, **aux_params}.items():
        for target in (executor.arg_dict, executor.aux_dict):
            if name in target:
                value.copyto(target[name])
    executor.forward(is_train=False, data=mx.nd.array(data), im_info=mx.nd.array(im_info))
    expected = {key: output.asnumpy() for key, output in zip(entries, executor.outputs)}
    sessions = onnx_network.sessions
    body = dict(zip((o.name for o in sessions["body"].get_outputs()), sessions["body"].run(None, {"data": data})))
    rois = expected["rois"][:, 1:].reshape(len(data), -1, 4)
    head = dict(zip(HEAD_OUTPUTS, sessions["head"].run(None, {"features": expected["features"], "rois": rois})))
    return {key: (float(np.abs(value - expected[key]).max()), float(np.abs(expected[key]).max()))
            for key, value in {**body, **head}.items()}
