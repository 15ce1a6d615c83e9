"""Mixed precision on the CPU (spec section 7): where the float16 body starts and ends in the training and
test graphs of ResNet-101 and resnet_tiny (type inference and simple_bind, nothing runs in float16), the
SGD step on float16 weights with float32 master copies against NumPy, and checkpoints of float32 masters."""
import json

import mxnet as mx
import numpy as np
import pytest

from fp16_helpers import BATCH, W16, W32, mixed_precision_module, numpy_sgd

from lib.config import load_config
from lib.run import checkpoint
from lib.train.optimizer import master_params
from lib.run.optimizer_states import state_arrays
from symbols import inference_symbol, training_symbol

A = 21  # anchors per cell with the default ANCHOR_SCALES x ANCHOR_RATIOS
NUM_CLASSES = 5
FIRST_FP16, LAST_FP16 = "conv0_fp16", "res4_res5"  # the cast after conv0; the features cast back after it


def train_shapes(batch, size):
    feat = size // 16
    return dict(data=(batch, 3, size, size), im_info=(batch, 3), valid_ranges=(batch, 2),
                gt_boxes=(batch, 100, 5), label=(batch, A * feat * feat), bbox_target=(batch, 4 * A, feat, feat),
                bbox_weight=(batch, 4 * A, feat, feat))


def inference_shapes(batch, size):
    return dict(data=(batch, 3, size, size), im_info=(batch, 3), im_ids=(batch,), chip_ids=(batch,))


def fp16_graph(symbol_name, is_train):
    """(symbol, input shapes) of the float16 training or test graph of ``symbol_name``."""
    import lib.ops  # noqa: F401  (registers MultiProposalTarget)
    if is_train:
        cfg = load_config(None, {"symbol": symbol_name, "TRAIN.fp16": True})
        return training_symbol(cfg, NUM_CLASSES, 2), train_shapes(2, 128)
    cfg = load_config(None, {"symbol": symbol_name, "TEST.fp16": True})
    return inference_symbol(cfg, NUM_CLASSES), inference_shapes(1, 128)


def cast_nodes(symbol):
    """(dtype, producer, sorted consumers) of every Cast node."""
    nodes = json.loads(symbol.tojson())["nodes"]
    casts = [i for i, n in enumerate(nodes) if n["op"] == "Cast"]
    consumers = {i: sorted(nodes[j]["name"] for j, n in enumerate(nodes) if any(e[0] == i for e in n["inputs"]))
                 for i in casts}
    return [(nodes[i]["attrs"]["dtype"], nodes[nodes[i]["inputs"][0][0]]["name"], consumers[i]) for i in casts]


def float16_region(symbol):
    """Names of the operators between the two casts (both ends included), from the graph's edges alone:
    descendants of conv0's cast that are ancestors of the res4/res5 concatenation."""
    nodes = json.loads(symbol.tojson())["nodes"]
    names = [n["name"] for n in nodes]
    start, end = names.index(FIRST_FP16), names.index(LAST_FP16)
    below = {start}
    for index in range(start + 1, len(nodes)):  # nodes are in topological order
        if any(edge[0] in below for edge in nodes[index]["inputs"]):
            below.add(index)
    above, stack = set(), [end]
    while stack:
        index = stack.pop()
        if index not in above:
            above.add(index)
            stack.extend(edge[0] for edge in nodes[index]["inputs"])
    return {names[i] for i in below & above}, nodes


def expected_types(symbol, inputs):
    """Per argument, auxiliary state and operator output of ``symbol``, the dtype spec section 7 asks for:
    float16 for the operators between the casts and the weights they own, except that BatchNorm keeps its
    parameters and statistics in float32 (MXNet's rule for float16 data); float32 everywhere else."""
    region, nodes = float16_region(symbol)
    owners = {}  # variable -> operators reading it
    for node in nodes:
        for edge in node["inputs"]:
            owners.setdefault(nodes[edge[0]]["name"], []).append(node)
    expected = {}
    for node in nodes:
        if node["op"] == "null":
            readers = owners.get(node["name"], [])
            half = node["name"] not in inputs and bool(readers) and all(
                r["name"] in region and r["op"] != "BatchNorm" for r in readers)
        else:
            half = node["name"] in region
        expected[node["name"]] = np.float16 if half else np.float32
    return expected


def inferred_types(symbol, inputs):
    """dtype of every argument, auxiliary state and operator of ``symbol`` by MXNet's type inference from
    float32 inputs, keyed by node name (an operator with several outputs has one dtype for all here)."""
    internals = symbol.get_internals()
    _, out_types, _ = internals.infer_type(**{name: "float32" for name in inputs})
    types = {}
    for index, dtype in enumerate(out_types):
        types.setdefault(internals[index].name, set()).add(dtype)  # the node's name, for every output of it
    assert all(len(dtypes) == 1 for dtypes in types.values())
    return {name: dtypes.pop() for name, dtypes in types.items()}


@pytest.mark.parametrize("symbol_name", ["resnet_tiny", "resnet101"])
@pytest.mark.parametrize("is_train", [True, False], ids=["train", "test"])
def test_float16_body_between_conv0_and_the_heads(symbol_name, is_train):
    symbol, inputs = fp16_graph(symbol_name, is_train)
    assert cast_nodes(symbol) == [("float16", "conv0", ["bn0"]),
                                  ("float32", "res4_res5", ["conv_new_1", "rpn_conv_3x3"])]
    expected = expected_types(symbol, inputs)
    inferred = inferred_types(symbol, inputs)
    assert set(inferred) == set(expected)
    assert {name: dtype for name, dtype in inferred.items() if dtype != expected[name]} == {}
    # the spec's fixed points, spelled out
    for name in ("data", "bn_data", "bn_data_gamma", "conv0_weight", "conv0", "bn0_gamma", "bn0_moving_var",
                 "features_fp32", "rpn_conv_3x3_weight", "conv_new_1_weight", "rpn_cls_score", "rpn_bbox_pred"):
        assert inferred[name] == np.float32, name
    for name in ("bn0", "stage1_unit1_conv1_weight", "stage3_unit1_sc_weight", "stage4_unit1_offset_weight",
                 "stage4_unit1_offset_bias", "stage4_unit1_conv2_weight", "res4_res5"):
        assert inferred[name] == np.float16, name
    body_weights = [n for n in symbol.list_arguments() if n.startswith("stage") and n.endswith(("weight", "bias"))]
    assert body_weights and all(inferred[n] == np.float16 for n in body_weights)
    head_weights = [n for n in symbol.list_arguments() if n.endswith(("weight", "bias")) and
                    not n.startswith(("stage", "conv0", "bn"))]
    assert head_weights and all(inferred[n] == np.float32 for n in head_weights)
    arg_types, out_types, aux_types = symbol.infer_type(**{name: "float32" for name in inputs})
    assert all(t == np.float32 for t in out_types) and all(t == np.float32 for t in aux_types)
    if is_train:
        assert "proposal_target" not in float16_region(symbol)[0]


@pytest.mark.parametrize("symbol_name", ["resnet_tiny", "resnet101"])
@pytest.mark.parametrize("is_train", [True, False], ids=["train", "test"])
def test_float16_graph_binds_on_the_cpu(symbol_name, is_train):
    """simple_bind allocates every array with its inferred dtype (no forward: the CPU has no float16
    convolutions); the data and outputs stay float32, so the loader and the detector feed and read float32."""
    symbol, inputs = fp16_graph(symbol_name, is_train)
    executor = symbol.simple_bind(mx.cpu(), grad_req="write" if is_train else "null",
                                  type_dict={name: "float32" for name in inputs}, **inputs)
    expected = expected_types(symbol, inputs)
    for name, array in executor.arg_dict.items():
        assert array.dtype == expected[name], name
        if is_train and name not in inputs:
            assert executor.grad_dict[name].dtype == expected[name], name
    assert all(array.dtype == np.float32 for array in executor.aux_dict.values())
    assert all(output.dtype == np.float32 for output in executor.outputs)
    assert sum(array.dtype == np.float16 for array in executor.arg_dict.values()) > 10


def test_float32_graphs_have_no_casts():
    import lib.ops  # noqa: F401
    cfg = load_config(None, {"symbol": "resnet_tiny", "TRAIN.fp16": False, "TEST.fp16": False})
    assert cast_nodes(training_symbol(cfg, NUM_CLASSES, 2)) == []
    assert cast_nodes(inference_symbol(cfg, NUM_CLASSES)) == []


# --- the optimizer step: float16 weights, float32 masters, lr/S and wd*S (tests/fp16_helpers.py) -------------


@pytest.mark.parametrize("num_contexts", [1, 2], ids=["module-updater", "kvstore-updater"])
def test_float16_sgd_step_matches_float32_numpy(num_contexts):
    module = mixed_precision_module([mx.cpu(i) for i in range(num_contexts)])
    assert module._update_on_kvstore == (num_contexts > 1)  # both places MXNet keeps the optimizer state
    batch = mx.io.DataBatch([mx.nd.array(BATCH)])
    steps = 3
    for _ in range(steps):
        module.forward_backward(batch)
        module.update()
    mx.nd.waitall()
    rounded, _ = module.get_params()
    masters, _ = master_params(module)
    assert rounded["half_weight"].dtype == np.float16  # what Module alone would hand a checkpoint
    assert masters["half_weight"].dtype == np.float32 and masters["full_weight"].dtype == np.float32
    expected_half, expected_full = numpy_sgd(W16, steps), numpy_sgd(W32, steps)
    np.testing.assert_allclose(masters["half_weight"].asnumpy(), expected_half, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(masters["full_weight"].asnumpy(), expected_full, rtol=1e-6, atol=1e-7)
    # the float16 weight is its master rounded, and the master keeps what float16 cannot hold
    np.testing.assert_array_equal(rounded["half_weight"].asnumpy(), masters["half_weight"].asnumpy().astype(np.float16))
    assert np.any(masters["half_weight"].asnumpy() != rounded["half_weight"].asnumpy().astype(np.float32))


def test_master_params_before_the_first_update_are_the_weights_in_float32():
    module = mixed_precision_module([mx.cpu(0)])
    masters, _ = master_params(module)
    assert masters["half_weight"].dtype == np.float32
    np.testing.assert_array_equal(masters["half_weight"].asnumpy(), W16.astype(np.float32))


def test_checkpoint_of_a_float16_module_stores_float32_masters(tmp_path):
    module = mixed_precision_module([mx.cpu(0)])
    batch = mx.io.DataBatch([mx.nd.array(BATCH)])
    for _ in range(2):
        module.forward_backward(batch)
        module.update()
    mx.nd.waitall()
    masters, aux = master_params(module)
    prefix = str(tmp_path / "fp16")
    checkpoint.save_checkpoint(prefix, 1, module.symbol, masters, aux, stds=(0.1, 0.1, 0.2, 0.2),
                               means=(0, 0, 0, 0), states=state_arrays(module))
    loaded, _ = checkpoint.load_params(checkpoint.params_path(prefix, 1))  # what the test network loads
    assert {name: value.dtype for name, value in loaded.items()} == {"half_weight": np.float32,
                                                                     "full_weight": np.float32}
    np.testing.assert_array_equal(loaded["half_weight"].asnumpy(), masters["half_weight"].asnumpy())
    np.testing.assert_allclose(loaded["half_weight"].asnumpy(), numpy_sgd(W16, 2), rtol=1e-6, atol=1e-7)
