"""The MultiProposalTarget operator's interface: the symbol graph (shapes, forward, zero gradient), its
attributes (each required, bad ones named), shapes and dtypes checked, the config's published settings, and
the message when the compiled library is missing."""
import os

import mxnet as mx
import numpy as np
import pytest

import lib.ops
from lib.config import load_config
from proposal_target_helpers import PUBLISHED, assert_library_error, config_attrs, random_inputs, run_operator, \
    run_reference


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
        ({"rpn_pre_nms_top_n": -1}, "rpn_pre_nms_top_n='-1' must be an integer >= 0 (0: no cap)"),
        ({"bbox_stds": (0.1, 0.2)}, "bbox_stds='(0.1, 0.2)' must hold 4 numbers"),
        ({"rules": "gpu"}, "rules='gpu' must be reference or exact"),
        ({"fg_tresh": 0.5}, "unknown attribute fg_tresh"),
    ],
)
def test_bad_attributes_are_named(attrs, message):
    rng = np.random.default_rng(6)
    with pytest.raises(mx.MXNetError) as excinfo:
        run_operator(random_inputs(rng, [[-1, -1]], feat=2), **attrs)
    assert_library_error(excinfo, message)


@pytest.mark.parametrize("missing", sorted(PUBLISHED))
def test_every_attribute_is_required(missing):
    """No silent C++ default: the config is the one source of every attribute."""
    rng = np.random.default_rng(6)
    attrs = {k: v for k, v in PUBLISHED.items() if k != missing}
    with pytest.raises(mx.MXNetError) as excinfo:
        mx.nd.MultiProposalTarget(*(mx.nd.array(x) for x in random_inputs(rng, [[-1, -1]], feat=2)), **attrs)
    assert_library_error(excinfo, f"attribute {missing} is missing")


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
        mx.nd.MultiProposalTarget(*args, **PUBLISHED)[0].wait_to_read()
    assert_library_error(excinfo, "cls_prob must be float32")


def test_config_attributes_are_the_published_settings():
    assert PUBLISHED == {"rules": "reference", "feature_stride": 16, "scales": (2, 4, 7, 10, 13, 16, 24),
                         "ratios": (0.5, 1, 2), "rpn_pre_nms_top_n": 0, "rpn_post_nms_top_n": 300, "threshold": 0.7,
                         "rpn_min_size": 3, "fg_thresh": 0.5, "bbox_stds": (0.1, 0.1, 0.2, 0.2)}
    exact = config_attrs(load_config(None, [("TRAIN.PROPOSAL_TARGET_RULES", "exact"),
                                            ("TRAIN.RPN_PRE_NMS_TOP_N", "6000")]))
    assert exact == {**PUBLISHED, "rules": "exact", "rpn_pre_nms_top_n": 6000}


@pytest.mark.parametrize("key, value, message", [
    ("TRAIN.PROPOSAL_TARGET_RULES", "gpu", "TRAIN.PROPOSAL_TARGET_RULES = 'gpu': must be one of reference, exact"),
    ("TRAIN.RPN_PRE_NMS_TOP_N", "-5", "TRAIN.RPN_PRE_NMS_TOP_N = -5: must be >= 0"),
])
def test_bad_config_values_are_named(key, value, message):
    with pytest.raises(ValueError) as excinfo:
        config_attrs(load_config(None, [(key, value)]))
    assert message in str(excinfo.value)


def test_training_graph_refuses_box_means_it_cannot_train():
    from symbols import training_symbol

    cfg = load_config(None, [("TRAIN.BBOX_MEANS", "[0.0, 0.1, 0.0, 0.0]"), ("symbol", "resnet_tiny")])
    with pytest.raises(ValueError, match=r"TRAIN\.BBOX_MEANS"):
        training_symbol(cfg, num_classes=5, chips_per_device=2)


def test_missing_library_tells_to_run_make(tmp_path):
    with pytest.raises(ImportError, match="run `make`"):
        lib.ops.load_library(os.path.join(tmp_path, "libsniper_ops.so"))
