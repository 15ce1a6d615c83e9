"""The compiled deformable operators of lib/ops against MXNet's stock CPU operators they replace.

Every comparison is relative in the max norm: ``max|compiled - stock| <= 1e-4 * max|stock|`` per tensor
(an all-zero stock tensor must be matched by zeros). Forward outputs and every gradient (data, offsets,
trans, weights) are compared on random inputs and on the border cases of the bilinear sampling. In the
whole-network test a gradient's scale is at least 1e-2 of the network's largest gradient: smaller ones
are the round-off of gradients that are zero in exact arithmetic (a batch-norm shift feeding a
training-mode batch norm).
"""
import mxnet as mx
import numpy as np
import pytest

import lib.ops  # noqa: F401  (registers the compiled operators)
from lib.config import load_config
from symbols import inference_symbol, training_symbol, use_compiled_deformable
from symbols.deformable import deformable_convolution, deformable_psroi_pooling
from network_helpers import graph_nodes, inference_shapes, parameter_shapes, train_shapes

RTOL = 1e-4
VARIANTS = (False, True)  # compiled?


def assert_close(actual, expected, name="", floor=0.0):
    scale = max(np.max(np.abs(expected)), floor)
    error = np.max(np.abs(actual - expected))
    assert error <= RTOL * scale, f"{name}: max |difference| {error:g} vs max |stock| {scale:g}"


def bind_and_run(symbol, inputs, grad_names):
    """Forward and backward (random head gradients, seeded) of `symbol` on `inputs`; outputs and the
    gradients of `grad_names`."""
    grad_req = {name: "write" if name in grad_names else "null" for name in symbol.list_arguments()}
    executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **{k: v.shape for k, v in inputs.items()})
    for name, value in inputs.items():
        executor.arg_dict[name][:] = value
    outputs = [out.asnumpy() for out in executor.forward(is_train=True)]
    rng = np.random.default_rng(7)
    executor.backward([mx.nd.array(rng.normal(size=out.shape)) for out in outputs])
    return outputs, {name: executor.grad_dict[name].asnumpy() for name in grad_names}


def compare_variants(build, inputs, grad_names):
    """The graph from `build(compiled)` run both ways: outputs and gradients must agree."""
    (stock_out, stock_grads), (ours_out, ours_grads) = (bind_and_run(build(c), inputs, grad_names) for c in VARIANTS)
    for index, (ours, stock) in enumerate(zip(ours_out, stock_out)):
        assert ours.shape == stock.shape
        assert_close(ours, stock, f"output {index}")
    for name in grad_names:
        assert_close(ours_grads[name], stock_grads[name], f"gradient of {name}")
    return stock_out, stock_grads


# ---------------------------------------------------------------- deformable PS-ROI pooling

def pooling_inputs(rng, batch=2, channels=8, size=(12, 14), rois=40, classes=1, part=7, trans_scale=1.0):
    """Rois of every kind: inside, partly and wholly outside the map, empty and inverted boxes."""
    height, width = size
    corner = rng.uniform(-80, [16 * width + 40, 16 * height + 40], (rois, 2))
    boxes = np.hstack([corner, corner + rng.uniform(0, 200, (rois, 2))])  # many cross the border
    boxes[rois // 4: rois // 4 + 3, 2:] = boxes[rois // 4: rois // 4 + 3, :2]  # empty: x2 = x1, y2 = y1
    boxes[-3:] = [[2000, 2000, 2100, 2100], [-500, -500, -300, -300], [100, 120, 40, 60]]  # outside, inverted
    return dict(data=rng.normal(size=(batch, channels, height, width)).astype(np.float32),
                rois=np.hstack([rng.integers(0, batch, (rois, 1)), boxes]).astype(np.float32),
                trans=(trans_scale * rng.normal(size=(rois, 2 * classes, part, part))).astype(np.float32))


def pooling_builder(offsets, **attrs):
    def build(compiled):
        trans = mx.sym.var("trans") if offsets else None
        return deformable_psroi_pooling(mx.sym.var("data"), mx.sym.var("rois"), "pool", trans=trans,
                                        compiled=compiled, **attrs)
    return build


@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("samples", [1, 2, 4])
def test_psroi_pooling_matches_stock(offsets, samples):
    rng = np.random.default_rng(samples)
    inputs = pooling_inputs(rng)
    attrs = dict(spatial_scale=1 / 16, output_dim=8, group_size=1, pooled_size=7, sample_per_part=samples)
    if offsets:
        attrs["trans_std"] = 0.1
    else:
        del inputs["trans"]
    out, grads = compare_variants(pooling_builder(offsets, **attrs), inputs, ["data"] + ["trans"] * offsets)
    assert 0.3 * out[0].size < np.count_nonzero(out[0]) < out[0].size  # most bins see the map, not all
    assert np.count_nonzero(grads["data"]) > 0


def test_psroi_pooling_general_layouts_match_stock():
    """Position-sensitive groups (group_size 2), two offset classes and a coarser part grid."""
    rng = np.random.default_rng(3)
    inputs = pooling_inputs(rng, channels=4 * 4 + 3, classes=2, part=4)
    attrs = dict(spatial_scale=1 / 16, output_dim=4, group_size=2, pooled_size=5, part_size=4, sample_per_part=3,
                 trans_std=0.2)
    compare_variants(pooling_builder(True, **attrs), inputs, ["data", "trans"])


def test_psroi_pooling_large_offsets_and_zero_trans_std():
    rng = np.random.default_rng(4)
    inputs = pooling_inputs(rng, trans_scale=8.0)  # parts pushed far outside the map
    attrs = dict(spatial_scale=1 / 16, output_dim=8, group_size=1, pooled_size=7, sample_per_part=2)
    compare_variants(pooling_builder(True, trans_std=1.0, **attrs), inputs, ["data", "trans"])
    _, grads = compare_variants(pooling_builder(True, trans_std=0.0, **attrs), inputs, ["data", "trans"])
    assert not grads["trans"].any()


def test_psroi_pooling_hand_worked_bin_and_top_count():
    """A 4x4 map, one 1x1 bin of 2x2 samples over x in [-4.5, 3.5], y in [-0.5, 3.5]: the samples at
    x = -4.5 fall off the map, those at x = -0.5 clamp to column 0, at rows 0 (y = -0.5) and 1.5."""
    data = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.float32([[0, -4, 0, 3, 3], [0, 40, 40, 50, 50]])
    attrs = dict(spatial_scale=1.0, output_dim=1, group_size=1, pooled_size=1, sample_per_part=2, no_trans=True)
    out, count = (x.asnumpy().ravel() for x in mx.nd.CompiledDeformablePSROIPooling(mx.nd.array(data),
                                                                                     mx.nd.array(rois), **attrs))
    expected = (data[0, 0, 0, 0] + (data[0, 0, 1, 0] + data[0, 0, 2, 0]) / 2) / 2
    np.testing.assert_allclose(out, [expected, 0], rtol=1e-6)
    np.testing.assert_array_equal(count, [2, 0])


def test_psroi_pooling_errors_name_the_problem():
    data, trans = mx.nd.zeros((1, 8, 6, 6)), mx.nd.zeros((2, 2, 7, 7))
    attrs = dict(spatial_scale=1 / 16, output_dim=8, group_size=1, pooled_size=7)
    with pytest.raises(mx.MXNetError, match="roi 1 has batch index 3"):
        mx.nd.CompiledDeformablePSROIPooling(data, mx.nd.array([[0, 0, 0, 9, 9], [3, 0, 0, 9, 9]]), trans,
                                             **attrs)[0].wait_to_read()
    with pytest.raises(mx.MXNetError, match="input trans must have shape"):
        mx.nd.CompiledDeformablePSROIPooling(data, mx.nd.zeros((2, 5)), mx.nd.zeros((2, 2, 5, 5)), **attrs)
    with pytest.raises(mx.MXNetError, match="input data must have shape"):
        mx.nd.CompiledDeformablePSROIPooling(mx.nd.zeros((1, 4, 6, 6)), mx.nd.zeros((2, 5)), trans, **attrs)
    with pytest.raises(mx.MXNetError, match="trans_std='2'"):
        mx.nd.CompiledDeformablePSROIPooling(data, mx.nd.zeros((2, 5)), trans, trans_std=2, **attrs)


# ---------------------------------------------------------------- deformable convolution

def conv_builder(in_channels, num_filter, **attrs):
    def build(compiled):
        return deformable_convolution(mx.sym.var("data"), mx.sym.var("offset"), "conv", in_channels=in_channels,
                                      num_filter=num_filter, compiled=compiled, **attrs)
    return build


def conv_output_size(size, kernel, stride, pad, dilate):
    return (size + 2 * pad - dilate * (kernel - 1) - 1) // stride + 1


CONV_CASES = [
    # the network's res5: dilation 2, 4 deformable groups
    dict(kernel=(3, 3), stride=(1, 1), pad=(2, 2), dilate=(2, 2), num_deformable_group=4),
    dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), dilate=(1, 1), num_deformable_group=1),
    dict(kernel=(3, 2), stride=(1, 2), pad=(0, 1), dilate=(1, 2), num_deformable_group=2),
    dict(kernel=(1, 1), stride=(1, 1), pad=(0, 0), dilate=(1, 1), num_deformable_group=2, num_group=2,
         no_bias=False),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("offset_kind", ["random", "large", "integer"])
def test_deformable_convolution_matches_stock(case, offset_kind):
    """Random offsets; large ones (many samples off the map); whole-cell ones (samples exactly on grid
    points and on the last row and column, where the bilinear weights degenerate)."""
    attrs = CONV_CASES[case]
    rng = np.random.default_rng(10 * case + len(offset_kind))
    batch, channels, filters, height, width = 2, 8, 6, 9, 11
    out_h, out_w = (conv_output_size(s, k, st, p, d) for s, k, st, p, d in
                    zip((height, width), attrs["kernel"], attrs["stride"], attrs["pad"], attrs["dilate"]))
    taps = attrs["kernel"][0] * attrs["kernel"][1]
    offset_shape = (batch, 2 * taps * attrs["num_deformable_group"], out_h, out_w)
    offsets = {"random": rng.normal(0, 1.5, offset_shape), "large": rng.normal(0, 8, offset_shape),
               "integer": rng.integers(-2, 3, offset_shape)}[offset_kind]
    groups = attrs.get("num_group", 1)
    inputs = dict(data=rng.normal(size=(batch, channels, height, width)), offset=offsets,
                  conv_weight=rng.normal(size=(filters, channels // groups) + attrs["kernel"]))
    grad_names = ["data", "offset", "conv_weight"]
    if not attrs.get("no_bias", True):
        inputs["conv_bias"] = rng.normal(size=(filters,))
        grad_names.append("conv_bias")
    inputs = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    _, grads = compare_variants(conv_builder(channels, filters, **attrs), inputs, grad_names)
    on_map = {"random": 0.3, "large": 0.05, "integer": 0.3}[offset_kind]  # samples whose offsets get gradients
    assert np.count_nonzero(grads["offset"]) > on_map * grads["offset"].size


def test_deformable_im2col_errors_name_the_problem():
    data = mx.nd.zeros((1, 8, 6, 6))
    with pytest.raises(mx.MXNetError, match="input offset must have shape"):
        mx.nd.DeformableIm2Col(data, mx.nd.zeros((1, 18, 6, 6)), kernel=(3, 3), pad=(1, 1), num_deformable_group=2)
    with pytest.raises(mx.MXNetError, match="not a multiple of num_deformable_group"):
        mx.nd.DeformableIm2Col(data, mx.nd.zeros((1, 54, 6, 6)), kernel=(3, 3), pad=(1, 1), num_deformable_group=3)
    with pytest.raises(mx.MXNetError, match="attribute kernel='3, x'"):
        mx.nd.DeformableIm2Col(data, mx.nd.zeros((1, 18, 6, 6)), kernel="3, x")
    with pytest.raises(ValueError, match="not a multiple of num_group"):
        deformable_convolution(mx.sym.var("d"), mx.sym.var("o"), "c", in_channels=6, num_filter=4, kernel=(3, 3),
                               num_group=4, compiled=True)


# ---------------------------------------------------------------- the network

COMPILED_COUNTERPARTS = {"_contrib_DeformableConvolution": "DeformableIm2Col",
                         "_contrib_DeformablePSROIPooling": "CompiledDeformablePSROIPooling"}


@pytest.mark.parametrize("symbol_name", ["resnet101", "resnet_tiny", "mobilenetv2_tiny"])
@pytest.mark.parametrize("is_train", [False, True])
def test_network_parameters_do_not_depend_on_the_operators(symbol_name, is_train):
    stride = 32 if symbol_name.startswith("mobilenet") else 16
    cfg = load_config(None, {"symbol": symbol_name, "TRAIN.fp16": False, "TEST.fp16": False})
    shapes = train_shapes(2, 256, stride=stride) if is_train else inference_shapes(1, 512)
    stock, compiled = (network(cfg, is_train, num_classes=81, compiled=c) for c in VARIANTS)
    assert compiled.list_arguments() == stock.list_arguments()
    assert compiled.list_auxiliary_states() == stock.list_auxiliary_states()
    assert compiled.list_outputs() == stock.list_outputs()
    assert parameter_shapes(compiled, shapes) == parameter_shapes(stock, shapes)
    stock_ops = {node["op"] for node in graph_nodes(stock)} & set(COMPILED_COUNTERPARTS)
    compiled_ops = {node["op"] for node in graph_nodes(compiled)}
    assert "_contrib_DeformablePSROIPooling" in stock_ops
    assert not compiled_ops & set(COMPILED_COUNTERPARTS)
    assert {COMPILED_COUNTERPARTS[op] for op in stock_ops} <= compiled_ops


def network(cfg, is_train, num_classes, compiled, chips=2):
    if is_train:
        return training_symbol(cfg, num_classes, chips, compiled_deformable=compiled)
    return inference_symbol(cfg, num_classes, compiled_deformable=compiled)


def tiny_network_inputs(symbol, shapes, seed):
    """Random weights and inputs, with the RPN classifier and regressor zeroed: all anchors then score
    alike (ties go to the lower anchor index), so both variants get the same proposals, bit for bit."""
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape in zip(symbol.list_arguments(), arg_shapes):
        scale = 0.001 if "offset" in name else 0.1
        inputs[name] = rng.normal(0, scale, shape) if name.endswith("weight") else rng.normal(0, 0.1, shape)
        if name.startswith(("rpn_cls_score", "rpn_bbox_pred")):
            inputs[name] = np.zeros(shape)
    inputs["data"] = rng.uniform(-100, 100, shapes["data"])
    inputs["im_info"] = np.tile([shapes["data"][2], shapes["data"][3], 1.0], (shapes["data"][0], 1))
    return {name: np.asarray(value, np.float32) for name, value in inputs.items()}, aux_shapes


@pytest.mark.parametrize("is_train", [False, True])
def test_tiny_network_outputs_and_gradients_match_stock(is_train):
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.fp16": False, "TEST.fp16": False,
                             "TRAIN.RPN_POST_NMS_TOP_N": 64, "TEST.RPN_POST_NMS_TOP_N": 64})
    shapes = train_shapes(2, 128) if is_train else inference_shapes(2, 128)
    symbols = [network(cfg, is_train, num_classes=5, compiled=c) for c in VARIANTS]
    inputs, aux_shapes = tiny_network_inputs(symbols[0], shapes, seed=5)
    if is_train:
        inputs["valid_ranges"][:] = -1
        gt = -np.ones(shapes["gt_boxes"], np.float32)
        gt[:, :3] = [[10, 10, 60, 70, 1], [40, 50, 120, 100, 2], [70, 5, 100, 40, 3]]
        inputs["gt_boxes"] = gt
        inputs["label"] = np.random.default_rng(1).integers(-1, 2, shapes["label"]).astype(np.float32)
        inputs["bbox_weight"][:] = 1
    grad_names = [n for n in symbols[0].list_arguments() if n not in shapes] if is_train else []
    results = []
    for symbol in symbols:
        grad_req = {n: "write" if n in grad_names else "null" for n in symbol.list_arguments()}
        executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **shapes)
        for name, value in inputs.items():
            executor.arg_dict[name][:] = value
        for name, array in executor.aux_dict.items():
            array[:] = 1 if name.endswith("var") else 0
        outputs = [o.asnumpy() for o in executor.forward(is_train=is_train)]
        if is_train:
            executor.backward()
        results.append((outputs, {n: executor.grad_dict[n].asnumpy() for n in grad_names}))
    (stock_out, stock_grads), (ours_out, ours_grads) = results
    for name, ours, stock in zip(symbols[0].list_outputs(), ours_out, stock_out):
        assert_close(ours, stock, name)
    largest = max([np.max(np.abs(g)) for g in stock_grads.values()], default=0.0)
    for name in grad_names:
        assert_close(ours_grads[name], stock_grads[name], f"gradient of {name}", floor=1e-2 * largest)
    if is_train:
        assert np.abs(stock_grads["stage4_unit1_offset_weight"]).max() > 0
        assert np.abs(stock_grads["offset_weight"]).max() > 0


def test_compiled_operators_on_cpu_contexts_only():
    cfg = load_config(None)
    assert use_compiled_deformable(cfg, [mx.cpu(0), mx.cpu(1)])
    assert not use_compiled_deformable(cfg, [mx.gpu(0)])
    assert not use_compiled_deformable(load_config(None, {"network.CPU_DEFORMABLE_OPS": "stock"}), [mx.cpu(0)])
    with pytest.raises(ValueError, match="network.CPU_DEFORMABLE_OPS = 'fast'"):
        use_compiled_deformable(load_config(None, {"network.CPU_DEFORMABLE_OPS": "fast"}), [mx.cpu(0)])
