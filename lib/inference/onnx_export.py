"""ONNX export of a trained test network: two graphs and a description that lib/inference/onnx_network.py
(NumPy, OpenCV and ONNX Runtime only) runs the whole test protocol with.

The test graph is cut at its proposal layer, which stays NumPy (the reference's rules,
lib/boxes/proposals.py), so the exported detections are those of ``TEST.PROPOSAL_LAYER: reference``:

- ``body.onnx``: ``data`` (B, 3, H, W) -> ``rpn_cls_prob`` (B, 2A, h, w), ``rpn_bbox_pred`` (B, 4A, h, w),
  ``features`` (B, C, h, w) (the R-CNN head's reduced features) and, with network.AUTO_FOCUS, ``scale_prob``
  (B, 2, h, w);
- ``head.onnx``: ``features`` and ``rois`` (B, R, 4) (each image's proposals, scaled pixels) ->
  ``cls_prob`` (B * R, K) and ``bbox_pred`` (B * R, 4) (class-agnostic deltas, the stds folded in);
- ``mask.onnx`` (TRAIN.WITH_MASK networks, ``export_mask_graph``): ``features`` and ``rois`` (B, R, 4) (the
  final detections in a region's canvas pixels) -> ``mask_prob`` (B * R, K - 1, 28, 28), the mask graph of
  symbols.sniper.mask_inference_symbol on the body's features;
- ``model.json``: classes, pixel means and channel order, the TEST section (scales, valid ranges, NMS and
  caps), the anchors and the stride.

Every MXNet operator of the graph is translated node by node (``TRANSLATORS``) at opset ``OPSET``; one
without a translator, or a setting the translation does not cover, is refused in one line naming it
(``ExportError``). The deformable convolution becomes ONNX ``DeformConv``, with its offsets moved at the
border so that ONNX's sampling (bilinear with zero padding) gives MXNet's (a point outside [0, H) x [0, W)
is 0, one in the last row or column takes that row or column): ``_mxnet_border_offsets``. The deformable
PS-ROI pooling (group_size 1 only: deformable RoI pooling) becomes ONNX ``RoiAlign`` with one box per
(roi, bin) and one output cell per sample, and the operator's validity mask and mean as a small MatMul
(``_deformable_roi_pool``), the sampling rules of lib/ops. The head records its poolings (inputs, output,
settings) in its metadata (``POOLINGS_KEY``), so that a runtime with lib/ops' compiled pooling can cut the graph
at them and pool between the pieces (lib/inference/compiled_pooling.py); other runtimes run the whole graph.
"""
import ast
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from lib.errors import UserError

OPSET = 19  # DeformConv's first opset
FORMAT_VERSION = 1
BODY_OUTPUTS = ("rpn_cls_prob", "rpn_bbox_pred", "features")
HEAD_OUTPUTS = ("cls_prob", "bbox_pred")
MASK_OUTPUT = "mask_prob"
MASK_ROIS = "mask_rois"  # the mask graph's rois input (symbols.sniper.mask_inference_symbol)
POOLINGS_KEY = "sniper.deformable_roi_poolings"  # metadata: JSON list of GraphBuilder.poolings


class ExportError(UserError, ValueError):
    """A network or setting the ONNX export does not cover (one line naming it)."""


def _attr(value):
    """An MXNet attribute string as a Python value ("(3, 3)" -> (3, 3), "True" -> True, "relu" -> "relu")."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False}.get(value.lower(), value)


def _pair(attrs, key, default):
    value = attrs.get(key, default)
    return list(value) if isinstance(value, (tuple, list)) else [value, value]


class GraphBuilder:
    """ONNX nodes and initializers of one graph, translated from MXNet symbol JSON nodes."""

    def __init__(self, params):
        self.params = params  # name -> NumPy array (arguments and auxiliary states)
        self.nodes, self.initializers, self.names = [], [], set()
        self.count = 0
        self.poolings = []  # per deformable RoI pooling: its tensors' names and settings (POOLINGS_KEY)

    def fresh(self, hint):
        self.count += 1
        return f"{hint}__{self.count}"

    def const(self, value, dtype=np.float32, hint="const"):
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def param(self, name, value=None):
        """The initializer of parameter ``name`` (its stored value, or ``value``)."""
        if name not in self.names:
            array = self.params.get(name) if value is None else value
            if array is None:
                raise ExportError(f"the checkpoint lacks parameter {name} of the exported graph")
            self.initializers.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
            self.names.add(name)
        return name

    def op(self, op_type, inputs, hint=None, outputs=1, **attrs):
        """Add one node; its output name (or names, ``outputs`` > 1)."""
        names = [self.fresh(hint or op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def model(self, inputs, outputs, name):
        used = {name for node in self.nodes for name in node.input}
        initializers = [tensor for tensor in self.initializers if tensor.name in used]
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="SNIPER lib/inference/onnx_export.py")
        model.ir_version = 9
        onnx.checker.check_model(model, full_check=True)
        return model


# -- translators: (builder, node name, input names, attributes) -> output names ---------------------

def _convolution(g, name, inputs, attrs):
    kernel = list(attrs["kernel"])
    conv = dict(kernel_shape=kernel, strides=_pair(attrs, "stride", 1), dilations=_pair(attrs, "dilate", 1),
                pads=_pair(attrs, "pad", 0) * 2, group=int(attrs.get("num_group", 1)))
    return [g.op("Conv", inputs, name, **conv)]


def _batch_norm(g, name, inputs, attrs):
    if int(attrs.get("axis", 1)) != 1:
        raise ExportError(f"{name}: BatchNorm over axis {attrs['axis']} (only channels, axis 1, is exported)")
    data, gamma, beta, mean, var = inputs
    if attrs.get("fix_gamma", True):  # MXNet then scales by 1 whatever gamma holds
        gamma = g.param(f"{gamma}__ones", np.ones_like(g.params[gamma]))
    return [g.op("BatchNormalization", [data, gamma, beta, mean, var], name, epsilon=float(attrs.get("eps", 1e-3)))]


ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus"}


def _activation(g, name, inputs, attrs):
    kind = attrs["act_type"]
    if kind not in ACTIVATIONS:
        raise ExportError(f"{name}: activation {kind!r} is not exported (supported: {', '.join(ACTIVATIONS)})")
    return [g.op(ACTIVATIONS[kind], inputs, name)]


def _clip(g, name, inputs, attrs):
    return [g.op("Clip", [inputs[0], g.const(float(attrs["a_min"])), g.const(float(attrs["a_max"]))], name)]


def _pooling(g, name, inputs, attrs):
    kind = attrs.get("pool_type", "max")
    if attrs.get("global_pool", False):
        return [g.op({"max": "GlobalMaxPool", "avg": "GlobalAveragePool"}[kind], inputs, name)]
    if kind != "max" or attrs.get("pooling_convention", "valid") != "valid":
        raise ExportError(f"{name}: Pooling {kind} / {attrs.get('pooling_convention')} is not exported "
                          f"(max pooling with the 'valid' convention is)")
    return [g.op("MaxPool", inputs, name, kernel_shape=list(attrs["kernel"]), strides=_pair(attrs, "stride", 1),
                 pads=_pair(attrs, "pad", 0) * 2)]


def _reshape(g, name, inputs, attrs):
    shape = list(attrs["shape"])
    if any(v < -1 for v in shape) or attrs.get("reverse", False):
        raise ExportError(f"{name}: Reshape {tuple(shape)} uses MXNet's special codes below -1 (not exported)")
    return [g.op("Reshape", [inputs[0], g.const(shape, np.int64)], name)]


def _softmax_activation(g, name, inputs, attrs):
    return [g.op("Softmax", inputs, name, axis=1 if attrs.get("mode", "instance") == "channel" else -1)]


def _softmax(g, name, inputs, attrs):
    return [g.op("Softmax", inputs, name, axis=int(attrs.get("axis", -1)))]


def _fully_connected(g, name, inputs, attrs):
    if not attrs.get("flatten", True):
        raise ExportError(f"{name}: FullyConnected with flatten=False is not exported")
    flat = g.op("Flatten", inputs[:1], f"{name}_flatten", axis=1)
    bias = [] if attrs.get("no_bias", False) else inputs[2:3]
    return [g.op("Gemm", [flat, inputs[1]] + bias, name, transB=1)]


def _cast(g, name, inputs, attrs):
    if attrs["dtype"] != "float32":
        raise ExportError(f"{name}: a {attrs['dtype']} graph (TEST.fp16) is not exported; export float32 "
                          f"(the export sets TEST.fp16 false)")
    return [inputs[0]]


def _deformable_convolution(g, name, inputs, attrs):
    data, offset, weight = inputs[:3]
    bias = [] if attrs.get("no_bias", False) else inputs[3:4]
    kernel = list(attrs["kernel"])
    strides, dilations, pads = _pair(attrs, "stride", 1), _pair(attrs, "dilate", 1), _pair(attrs, "pad", 0)
    groups = int(attrs.get("num_deformable_group", 1))
    offset = _mxnet_border_offsets(g, name, data, offset, kernel, strides, dilations, pads, groups)
    return [g.op("DeformConv", [data, weight, offset] + bias, name, kernel_shape=kernel, strides=strides,
                 dilations=dilations, pads=pads * 2, group=int(attrs.get("num_group", 1)), offset_group=groups)]


def _mxnet_border_offsets(g, name, data, offset, kernel, strides, dilations, pads, groups):
    """``offset`` moved so that ONNX DeformConv samples as MXNet's DeformableConvolution: a sampling
    position h in (-1, 0) (MXNet: 0, ONNX: part of row 0) goes to -1 (0 in both), one in [H - 1, H) (MXNet:
    row H - 1, ONNX: part of it) to H - 1; the same for w. Other offsets pass unchanged (bit for bit)."""
    kh, kw = kernel
    # (B, G * kh * kw * 2, Ho, Wo) -> (B, G, kh, kw, 2, Ho, Wo)
    out_shape = g.op("Shape", [offset], f"{name}_offset_shape")
    split_shape = g.op("Concat", [g.op("Shape", [offset], end=1), g.const([groups, kh, kw, 2], np.int64),
                                  g.op("Shape", [offset], start=2)], axis=0)
    split = g.op("Reshape", [offset, split_shape], f"{name}_offset_split")
    in_shape = g.op("Shape", [data], f"{name}_data_shape")
    coords = []
    for axis, (k, stride, dilate, pad) in enumerate(zip(kernel, strides, dilations, pads)):
        size = g.op("Cast", [g.op("Gather", [in_shape, g.const(2 + axis, np.int64)])], to=TensorProto.FLOAT)
        count = g.op("Gather", [out_shape, g.const(2 + axis, np.int64)])
        cells = g.op("Cast", [g.op("Range", [g.const(0, np.int64), count, g.const(1, np.int64)])],
                     to=TensorProto.FLOAT)
        # base position of tap t at output cell y: y * stride - pad + t * dilate, shaped to broadcast
        grid = g.op("Sub", [g.op("Mul", [cells, g.const(float(stride))]), g.const(float(pad))])
        taps = np.arange(k, dtype=np.float32) * dilate
        shape = [1, 1, k, 1, 1, 1, 1] if axis == 0 else [1, 1, 1, k, 1, 1, 1]
        grid_shape = [1, 1, 1, 1, 1, -1, 1] if axis == 0 else [1, 1, 1, 1, 1, 1, -1]
        base = g.op("Add", [g.op("Reshape", [grid, g.const(grid_shape, np.int64)]), g.const(taps.reshape(shape))])
        delta = g.op("Gather", [split, g.const(axis, np.int64)], axis=4)  # (B, G, kh, kw, Ho, Wo)
        base = g.op("Squeeze", [base, g.const([4], np.int64)])
        position = g.op("Add", [base, delta])
        last = g.op("Sub", [size, g.const(1.0)])
        before = g.op("And", [g.op("Greater", [position, g.const(-1.0)]), g.op("Less", [position, g.const(0.0)])])
        on_last = g.op("And", [g.op("GreaterOrEqual", [position, last]), g.op("Less", [position, size])])
        moved = g.op("Where", [on_last, g.op("Sub", [last, base]), delta])
        moved = g.op("Where", [before, g.op("Sub", [g.const(-1.0), base]), moved])
        coords.append(g.op("Unsqueeze", [moved, g.const([4], np.int64)]))
    joined = g.op("Concat", coords, f"{name}_offset_joined", axis=4)
    return g.op("Reshape", [joined, out_shape], f"{name}_offset_mxnet")


def _deformable_psroi_pooling(g, name, inputs, attrs):
    if int(attrs.get("group_size", 1)) != 1:
        raise ExportError(f"{name}: DeformablePSROIPooling with group_size {attrs['group_size']} (position-"
                          f"sensitive pooling) is not exported; group_size 1 (deformable RoI pooling) is")
    pooled, part = int(attrs["pooled_size"]), int(attrs.get("part_size", 0) or attrs["pooled_size"])
    if part != pooled:
        raise ExportError(f"{name}: DeformablePSROIPooling with part_size {part} != pooled_size {pooled}")
    trans = None if attrs.get("no_trans", False) else inputs[2]
    return [_deformable_roi_pool(g, name, inputs[0], g.rois, trans, pooled, int(attrs.get("sample_per_part", 1)),
                                 float(attrs["spatial_scale"]), float(attrs.get("trans_std", 0.0)))]


def _deformable_roi_pool(g, name, data, rois, trans, pooled, samples, spatial_scale, trans_std):
    """lib/ops' deformable RoI pooling (group_size 1) of ``data`` (B, C, H, W) over ``rois`` (B, R, 4) ->
    (B * R, C, pooled, pooled) as ONNX ``RoiAlign`` (a compiled kernel in ONNX Runtime, TensorRT, OpenVINO).

    The operator: per roi the rounded corners span ``round(x1) * scale - 0.5 .. (round(x2) + 1) * scale - 0.5``
    (at least 0.1), bin (ph, pw) starts at ``pw * bin_w + start_w + trans_x * trans_std * roi_w`` and takes
    ``samples`` x ``samples`` bilinear samples ``iw * bin_w / samples`` apart; a sample more than half a cell
    outside the map is dropped, the others clamped onto it; the bin is the mean of the kept ones (0 with none).

    Here every (roi, bin) is one RoiAlign box of ``samples`` x ``samples`` output cells with sampling_ratio 1,
    so that each cell is one bilinear sample: RoiAlign samples cell centres, so the box starts half a sub-bin
    before the bin (and +0.5 for half_pixel's -0.5 shift, which unlike output_half_pixel keeps boxes narrower
    than a cell). Inside [-0.5, H - 0.5] RoiAlign's sample (clamped onto [0, H - 1], bilinear) is the
    operator's; the operator's dropping of the others and its mean over the kept ones are a mask computed from
    the same sample coordinates, applied as each sample's share of its bin (mask / kept count)."""
    P, S = pooled, samples
    shape = g.op("Shape", [data], f"{name}_shape")
    # rounded corners (the coordinates are >= 0: round half away from zero = floor(x + 0.5))
    corners = g.op("Floor", [g.op("Add", [rois, g.const(0.5)])])
    roi_shape = g.op("Shape", [rois], start=0, end=2)
    boxes_shape = g.op("Concat", [roi_shape, g.const([P, P], np.int64)], axis=0)  # (B, R, P_h, P_w)
    per_axis = []
    for is_x, column in ((True, 0), (False, 1)):  # x: roi columns 0 and 2, the map's width; y: 1, 3, height
        size = g.op("Cast", [g.op("Gather", [shape, g.const(3 - column, np.int64)])], to=TensorProto.FLOAT)
        lo = g.op("Gather", [corners, g.const(column, np.int64)], axis=2)  # (B, R)
        hi = g.op("Gather", [corners, g.const(column + 2, np.int64)], axis=2)
        start = g.op("Sub", [g.op("Mul", [lo, g.const(spatial_scale)]), g.const(0.5)])
        end = g.op("Sub", [g.op("Mul", [g.op("Add", [hi, g.const(1.0)]), g.const(spatial_scale)]), g.const(0.5)])
        extent = g.op("Max", [g.op("Sub", [end, start]), g.const(0.1)])
        bin_size = g.op("Div", [extent, g.const(float(P))])
        sub_bin = g.op("Div", [bin_size, g.const(float(S))])
        to_bins = g.const([0, 0, 1, 1], np.int64)  # (B, R) -> (B, R, 1, 1)
        start, extent, bin_size, sub_bin = (g.op("Reshape", [t, to_bins]) for t in (start, extent, bin_size, sub_bin))
        bins = np.arange(P, dtype=np.float32).reshape([1, 1, 1, P] if is_x else [1, 1, P, 1])
        bin_start = g.op("Add", [g.op("Mul", [g.const(bins), bin_size]), start])
        if trans is not None:  # trans (B * R, 2, P, P): channel 0 moves x, 1 moves y, in roi extents
            moved = g.op("Gather", [trans, g.const(column, np.int64)], axis=1)  # (B * R, P, P)
            moved = g.op("Reshape", [g.op("Mul", [moved, g.const(trans_std)]), boxes_shape])
            bin_start = g.op("Add", [bin_start, g.op("Mul", [moved, extent])])
        bin_start = g.op("Expand", [bin_start, boxes_shape])
        # the samples (B, R, P_h, P_w, S_h, S_w): x varies along the last axis, y along the one before
        steps = np.arange(S, dtype=np.float32).reshape([1, 1, 1, 1, 1, S] if is_x else [1, 1, 1, 1, S, 1])
        to_samples = g.const([0, 0, 0, 0, 1, 1], np.int64)
        point = g.op("Add", [g.op("Reshape", [bin_start, to_samples]),
                             g.op("Mul", [g.const(steps), g.op("Reshape", [sub_bin, to_samples])])])
        valid = g.op("And", [g.op("GreaterOrEqual", [point, g.const(-0.5)]),
                             g.op("LessOrEqual", [point, g.op("Sub", [size, g.const(0.5)])])])
        box_start = g.op("Add", [g.op("Sub", [bin_start, g.op("Mul", [sub_bin, g.const(0.5)])]), g.const(0.5)])
        per_axis.append((box_start, g.op("Add", [box_start, bin_size]), valid))
    (x1, x2, x_valid), (y1, y2, y_valid) = per_axis
    boxes = g.op("Concat", [g.op("Unsqueeze", [c, g.const([4], np.int64)]) for c in (x1, y1, x2, y2)], axis=4)
    boxes = g.op("Reshape", [boxes, g.const([-1, 4], np.int64)], f"{name}_boxes")  # (B * R * P * P, 4)
    batch = g.op("Gather", [shape, g.const(0, np.int64)])
    images = g.op("Reshape", [g.op("Range", [g.const(0, np.int64), batch, g.const(1, np.int64)]),
                              g.const([-1, 1, 1, 1], np.int64)])
    images = g.op("Reshape", [g.op("Expand", [images, boxes_shape]), g.const([-1], np.int64)])
    samples_out = g.op("RoiAlign", [data, boxes, images], f"{name}_samples", mode="avg", output_height=S,
                       output_width=S, sampling_ratio=1, spatial_scale=1.0,
                       coordinate_transformation_mode="half_pixel")  # (B * R * P * P, C, S, S)
    # each sample's share of its bin: 1 / (the bin's kept samples), 0 when dropped
    mask = g.op("Cast", [g.op("And", [x_valid, y_valid])], to=TensorProto.FLOAT)  # (B, R, P, P, S, S)
    count = g.op("ReduceSum", [mask, g.const([4, 5], np.int64)], keepdims=1)
    share = g.op("Div", [mask, g.op("Max", [count, g.const(1.0)])])
    channels = g.op("Shape", [data], start=1, end=2)
    by_sample = g.op("Concat", [g.const([-1], np.int64), channels, g.const([S * S], np.int64)], axis=0)
    pooled_bins = g.op("MatMul", [g.op("Reshape", [samples_out, by_sample]),
                                  g.op("Reshape", [share, g.const([-1, S * S, 1], np.int64)])])  # (N, C, 1)
    per_roi = g.op("Concat", [g.const([-1, P, P], np.int64), channels], axis=0)
    pooled_rois = g.op("Reshape", [pooled_bins, per_roi])  # (B * R, P, P, C)
    output = g.op("Transpose", [pooled_rois], f"{name}_pooled", perm=[0, 3, 1, 2])
    g.poolings.append({"data": data, "rois": rois, "trans": trans, "output": output, "pooled_size": P,
                       "sample_per_part": S, "spatial_scale": spatial_scale, "trans_std": trans_std})
    return output


def _deconvolution(g, name, inputs, attrs):
    if any(_pair(attrs, "adj", 0)) or attrs.get("target_shape", ()):
        raise ExportError(f"{name}: Deconvolution with adj or target_shape is not exported")
    bias = [] if attrs.get("no_bias", False) else inputs[2:3]
    return [g.op("ConvTranspose", inputs[:2] + bias, name, kernel_shape=list(attrs["kernel"]),
                 strides=_pair(attrs, "stride", 1), dilations=_pair(attrs, "dilate", 1),
                 pads=_pair(attrs, "pad", 0) * 2, group=int(attrs.get("num_group", 1)))]


def _slice_axis(g, name, inputs, attrs):
    end = attrs.get("end")
    end = np.iinfo(np.int64).max if end in (None, "None") else int(end)
    return [g.op("Slice", [inputs[0], g.const([int(attrs["begin"])], np.int64), g.const([end], np.int64),
                           g.const([int(attrs["axis"])], np.int64)], name)]


def _concat(g, name, inputs, attrs):
    return [g.op("Concat", inputs, name, axis=int(attrs.get("dim", 1)))]


def _add(g, name, inputs, attrs):
    return [g.op("Add", inputs, name)]


TRANSLATORS = {
    "Convolution": _convolution, "BatchNorm": _batch_norm, "Activation": _activation, "clip": _clip,
    "Pooling": _pooling, "elemwise_add": _add, "_Plus": _add, "Concat": _concat, "Reshape": _reshape,
    "SoftmaxActivation": _softmax_activation, "softmax": _softmax, "FullyConnected": _fully_connected,
    "Cast": _cast, "_contrib_DeformableConvolution": _deformable_convolution,
    "_contrib_DeformablePSROIPooling": _deformable_psroi_pooling, "Deconvolution": _deconvolution,
    "slice_axis": _slice_axis,
}
PROPOSAL_OPS = ("_contrib_MultiProposal", "_contrib_Proposal", "Custom")
POOLING_OP = "_contrib_DeformablePSROIPooling"


def _entry(item):
    return (item[0], item[1])


def translate_graph(nodes, params, outputs, inputs, name, rois=None):
    """The ONNX model computing ``outputs`` ({name: ((node id, output index), rank)}) of the MXNet JSON
    ``nodes`` from ``inputs`` ({(node id, output index): (input name, shape)}), parameters from ``params``."""
    needed, stack = set(), [entry for entry, _ in outputs.values()]
    while stack:
        node_id = stack.pop()[0]
        if node_id in needed:
            continue
        needed.add(node_id)
        stack += [_entry(i) for i in nodes[node_id]["inputs"] if _entry(i) not in inputs]
    g = GraphBuilder(params)
    g.rois = rois
    names = {entry: input_name for entry, (input_name, _) in inputs.items()}
    for node_id in sorted(needed):
        node = nodes[node_id]
        if node["op"] == "null":
            if (node_id, 0) not in names:
                names[(node_id, 0)] = g.param(node["name"])
            continue
        translator = TRANSLATORS.get(node["op"])
        if translator is None:
            raise ExportError(f"operator {node['op']} (node {node['name']}) has no ONNX translation (supported: "
                              f"{', '.join(sorted(TRANSLATORS))})")
        attrs = {key: _attr(value) for key, value in node.get("attrs", {}).items()}
        results = translator(g, node["name"], [names[_entry(i)] for i in node["inputs"]], attrs)
        names.update({(node_id, index): result for index, result in enumerate(results)})
    for output_name, (entry, _) in outputs.items():
        g.nodes.append(helper.make_node("Identity", [names[entry]], [output_name]))
    graph_inputs = [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, shape)
                    for input_name, shape in inputs.values()]
    graph_outputs = [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [None] * rank)
                     for output_name, (_, rank) in outputs.items()]
    model = g.model(graph_inputs, graph_outputs, name)
    if g.poolings:
        helper.set_model_props(model, {POOLINGS_KEY: json.dumps(g.poolings)})
    return model


def graph_cut(nodes):
    """Where the exported graphs cut the MXNet test graph's JSON ``nodes``: ``(body outputs {name: (node id,
    output index)}, features entry, rois entry)``; an ExportError for a graph without the detection head."""
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    proposal = [i for i, node in enumerate(nodes) if node["op"] in PROPOSAL_OPS]
    pooling = [i for i, node in enumerate(nodes) if node["op"] == POOLING_OP]
    if len(proposal) != 1 or not pooling or "cls_prob" not in by_name or "bbox_pred" not in by_name:
        raise ExportError("the ONNX export takes the test graph of a detection network (one proposal layer, a "
                          "deformable R-CNN head with cls_prob and bbox_pred); RPN-only networks are not exported")
    rpn_cls, rpn_bbox = (_entry(i) for i in nodes[proposal[0]]["inputs"][:2])
    features = _entry(nodes[pooling[0]]["inputs"][0])
    body = dict(zip(BODY_OUTPUTS, (rpn_cls, rpn_bbox, features)))
    if "scale_prob" in by_name:
        body["scale_prob"] = (by_name["scale_prob"], 0)
    return body, features, (proposal[0], 0)


def export_graphs(symbol_json, params):
    """``(body, head, name of the features node)``: the ONNX models of the MXNet test graph ``symbol_json``
    (symbols.inference_symbol, float32, a detection network) with ``params`` ({name: NumPy array}, arguments and
    auxiliary states)."""
    nodes = json.loads(symbol_json)["nodes"]
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    body_entries, features, rois = graph_cut(nodes)
    body_outputs = {name: (entry, 4) for name, entry in body_entries.items()}
    data = (by_name["data"], 0)
    body = translate_graph(nodes, params, body_outputs, {data: ("data", ["batch", 3, "height", "width"])},
                           "sniper_body")
    head_inputs = {features: ("features", ["batch", "channels", "feature_height", "feature_width"]),
                   rois: ("rois", ["batch", "rois", 4])}
    head_outputs = {name: ((by_name[name], 0), 2) for name in HEAD_OUTPUTS}
    head = translate_graph(nodes, params, head_outputs, head_inputs, "sniper_head", rois="rois")
    return body, head, nodes[features[0]]["name"]


def export_mask_graph(symbol_json, params, features):
    """The ONNX model of a mask network's mask graph ``symbol_json`` (symbols.sniper.mask_inference_symbol,
    float32): ``features`` (B, C, h, w), the body's (whose node is named ``features``, as in the test graph)
    and ``rois`` (B, R, 4) -> ``mask_prob`` (B * R, classes - 1, 28, 28)."""
    nodes = json.loads(symbol_json)["nodes"]
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    pooling = [node for node in nodes if node["op"] == POOLING_OP]
    if not pooling or MASK_OUTPUT not in by_name or MASK_ROIS not in by_name:
        raise ExportError(f"the mask graph needs {MASK_ROIS}, a deformable RoI pooling and {MASK_OUTPUT}")
    entry = _entry(pooling[0]["inputs"][0])
    if nodes[entry[0]]["name"] != features:
        raise ExportError(f"the mask graph pools {nodes[entry[0]]['name']}, the body exports {features}")
    inputs = {entry: ("features", ["batch", "channels", "feature_height", "feature_width"]),
              (by_name[MASK_ROIS], 0): ("rois", ["batch", "rois", 4])}
    return translate_graph(nodes, params, {MASK_OUTPUT: ((by_name[MASK_OUTPUT], 0), 4)}, inputs, "sniper_mask",
                           rois="rois")


# float16 exports (``float16_model``): the operators that compute in float16, and those that follow a float16
# first input in it (the tensors of the network's layers); the rest (shapes, the deformable operators' sampling
# coordinates and indices, whose float16 rounding would move samples and gathered rows) stays float32.
FLOAT16_OPS = ("Conv", "ConvTranspose", "DeformConv", "BatchNormalization", "Gemm", "MatMul")
FLOAT16_FOLLOWERS = ("Relu", "Clip", "Sigmoid", "Softmax", "MaxPool", "GlobalAveragePool", "GlobalMaxPool", "Add",
                     "Concat", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice")


def float16_model(model):
    """``model`` with its layers in float16 and its inputs and outputs float32: each float16 node (FLOAT16_OPS,
    FLOAT16_FOLLOWERS after a float16 first input; never one that writes a graph output) gets its float32 inputs
    through one Cast each (initializers as float16 copies), each float32 node its float16 inputs through one Cast.
    (ONNX Runtime's converter, onnxruntime.transformers.float16, passes every tensor between two nodes it is told
    to keep float32 through float16, which breaks the row indices of the deformable RoI pooling beyond 2048.)"""
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    initializers = {t.name: t for t in graph.initializer}
    types.update({name: t.data_type for name, t in initializers.items()})
    outputs = {o.name for o in graph.output}
    half_tensors, converted, nodes, copies = set(), {}, [], []

    def converted_name(name, to_half):
        if (name, to_half) not in converted:
            target = f"{name}__{'fp16' if to_half else 'fp32'}"
            if name in initializers:
                copies.append(numpy_helper.from_array(numpy_helper.to_array(initializers[name]).astype(np.float16),
                                                      target))
            else:
                nodes.append(helper.make_node("Cast", [name], [target], name=target,
                                              to=TensorProto.FLOAT16 if to_half else TensorProto.FLOAT))
            converted[(name, to_half)] = target
        return converted[(name, to_half)]

    for node in graph.node:  # in topological order (GraphBuilder's)
        half = (node.op_type in FLOAT16_OPS or (node.op_type in FLOAT16_FOLLOWERS and node.input[0] in half_tensors)) \
            and not outputs.intersection(node.output)
        inputs = []
        for name in node.input:
            if half and types.get(name) == TensorProto.FLOAT and name not in half_tensors:
                name = converted_name(name, True)
            elif not half and name in half_tensors:
                name = converted_name(name, False)
            inputs.append(name)
        if half:
            half_tensors.update(name for name in node.output if types.get(name) == TensorProto.FLOAT)
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        nodes.append(copy)
    used = {name for node in nodes for name in node.input}
    kept = [t for t in (*graph.initializer, *copies) if t.name in used]
    half_graph = helper.make_graph(nodes, graph.name, graph.input, graph.output, kept)
    half_model = helper.make_model(half_graph, opset_imports=model.opset_import, producer_name=model.producer_name)
    half_model.ir_version = model.ir_version
    onnx.checker.check_model(half_model, full_check=True)
    return half_model
