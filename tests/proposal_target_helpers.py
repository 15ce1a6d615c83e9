"""The MultiProposalTarget operator for tests: run with the published settings (``PUBLISHED``, from the
config) or others, its NumPy reference (dev/oracles), random and one-anchor chips, and the library's errors."""
import mxnet as mx
import numpy as np

import lib.ops
from lib.config import load_config
from dev.oracles.proposal_target import multi_proposal_target
from symbols.backbones import feature_stride


def config_attrs(cfg):
    """The operator's attributes as the training graph passes them: the config's and its backbone's stride."""
    return lib.ops.proposal_target_attrs(cfg, feature_stride(cfg))


# The published settings, as the training graph passes them (every attribute, from the config).
PUBLISHED = config_attrs(load_config(None))
NUM_ANCHORS = len(PUBLISHED["scales"]) * len(PUBLISHED["ratios"])
RULES = ["reference", "exact"]
ONE_ANCHOR = dict(scales=(1,), ratios=(1,))  # one 16 x 16 anchor [0, 0, 15, 15] per cell


def run_operator(inputs, **attrs):
    attrs = {**PUBLISHED, **attrs}
    return tuple(out.asnumpy() for out in mx.nd.MultiProposalTarget(*(mx.nd.array(x) for x in inputs), **attrs))


def run_reference(inputs, **attrs):
    return multi_proposal_target(*inputs, **{**PUBLISHED, **attrs})


def assert_matches_reference(inputs, **attrs):
    """Labels and weights exactly, boxes and targets up to float32 exp/log rounding (NumPy vs libm)."""
    rois, labels, targets, weights = run_operator(inputs, **attrs)
    ref_rois, ref_labels, ref_targets, ref_weights = run_reference(inputs, **attrs)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(weights, ref_weights)
    np.testing.assert_array_equal(rois[:, 0], ref_rois[:, 0])
    np.testing.assert_allclose(rois, ref_rois, rtol=0, atol=1e-3)
    np.testing.assert_allclose(targets, ref_targets, rtol=0, atol=1e-4)
    return rois, labels, targets, weights


def assert_library_error(excinfo, message):
    """The newest library message (lib_api keeps every earlier one in the same report) has ``message``."""
    lines = [line for line in str(excinfo.value).splitlines() if "lib/ops/src/" in line]
    assert lines and message in lines[-1], str(excinfo.value)


def random_inputs(rng, valid_ranges, feat=16, im_size=(256, 256), max_gts=12, score_levels=None):
    """RPN outputs as a softmax over bg/fg, random deltas, gts with -1 padding rows mixed in."""
    batch = len(valid_ranges)
    logits = rng.normal(0, 2, (batch, 2, NUM_ANCHORS, feat, feat))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    if score_levels:  # coarse scores: many exact ties, which each rule set breaks its own way
        probs = np.round(probs * score_levels) / score_levels
    cls_prob = probs.reshape(batch, 2 * NUM_ANCHORS, feat, feat).astype(np.float32)
    bbox_pred = rng.normal(0, 0.3, (batch, 4 * NUM_ANCHORS, feat, feat)).astype(np.float32)
    height, width = im_size
    im_info = np.tile(np.float32([height, width, 1.0]), (batch, 1))
    gt_boxes = np.full((batch, max_gts, 5), -1, np.float32)
    for b in range(batch):
        num = rng.integers(1, max_gts + 1)
        rows = rng.choice(max_gts, num, replace=False)  # padding rows are not only at the end
        corner = rng.uniform(0, [width - 8, height - 8], (num, 2))
        size = rng.uniform(4, 160, (num, 2))
        gt_boxes[b, rows, :2] = corner
        gt_boxes[b, rows, 2:4] = np.minimum(corner + size, [width - 1, height - 1])
        gt_boxes[b, rows, 4] = rng.integers(1, 81, num)
    return cls_prob, bbox_pred, im_info, gt_boxes, np.float32(valid_ranges)


def one_anchor_chips(deltas, scores=None, im_info=(64, 64, 1), valid_range=(-1, -1), gt_boxes=None, feat=(1, 1)):
    """Chips with ONE_ANCHOR anchors on a feat = (H, W) map: deltas (B, H, W, 4) or (B, 4) (1x1 map),
    scores (B, H, W), no gts unless given as (B, G, 5)."""
    deltas = np.float32(deltas).reshape(-1, feat[0], feat[1], 4)
    batch = len(deltas)
    scores = np.full((batch,) + tuple(feat), 0.5, np.float32) if scores is None else np.float32(scores)
    cls_prob = np.stack([1 - scores, scores], axis=1).astype(np.float32)
    bbox_pred = deltas.transpose(0, 3, 1, 2).copy()
    gts = np.full((batch, 1, 5), -1, np.float32) if gt_boxes is None else np.float32(gt_boxes)
    return (cls_prob, bbox_pred, np.tile(np.float32(im_info), (batch, 1)), gts,
            np.tile(np.float32(valid_range), (batch, 1)))


def padding_box(m):
    return [m, m, m + 200, m + 200]
