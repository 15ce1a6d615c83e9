"""RPN anchor targets (lib/data/anchor_target.py) against a plain-loop NumPy reference and hand-worked cases."""
import dataclasses

import numpy as np
import pytest

from lib.config import load_config
from lib.boxes import base_anchors, grid_anchors
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams

NO_SAMPLING = 10**9  # an RPN batch larger than the anchor count keeps every label
PUBLISHED = AnchorTargetParams.from_config(load_config(None))


def params_with(**changes):
    """The published RPN-target settings with ``changes``."""
    return dataclasses.replace(PUBLISHED, **changes)


def iou(a, b):
    """IoU of two inclusive-pixel boxes, in double like the compiled kernel, rounded to float32."""
    iw = min(a[2], b[2]) - max(a[0], b[0]) + 1.0
    ih = min(a[3], b[3]) - max(a[1], b[1]) + 1.0
    if iw <= 0 or ih <= 0:
        return np.float32(0)
    inter = iw * ih
    area_a = (a[2] - a[0] + 1.0) * (a[3] - a[1] + 1.0)
    area_b = (b[2] - b[0] + 1.0) * (b[3] - b[1] + 1.0)
    return np.float32(inter / (area_a + area_b - inter))


def reference_targets(anchors, valid, invalid, height, width, p):
    """Labels (N,), deltas (N, 4) and weights (N, 4) in anchor order, written from the spec with loops."""
    n = len(anchors)
    a = [tuple(float(v) for v in row) for row in anchors]
    v = [tuple(float(x) for x in row) for row in valid]
    inv = [tuple(float(x) for x in row) for row in invalid]
    b = p.allowed_border
    inside = [x1 >= -b and y1 >= -b and x2 < width + b and y2 < height + b for x1, y1, x2, y2 in a]
    labels = [-1] * n
    ious = [[iou(a[i], g) for g in v] for i in range(n)]
    for i in range(n):
        if inside[i] and (max(ious[i]) if v else 0.0) < p.negative_overlap:
            labels[i] = 0
    for g in range(len(v)):
        best = max((ious[i][g] for i in range(n) if inside[i]), default=0.0)
        if best > 0:
            for i in range(n):
                if inside[i] and ious[i][g] == best:
                    labels[i] = 1
    for i in range(n):
        if inside[i] and v and max(ious[i]) >= p.positive_overlap:
            labels[i] = 1
    for i in range(n):
        if inside[i] and any(iou(a[i], box) > p.invalid_overlap for box in inv):
            labels[i] = -1
    deltas = np.zeros((n, 4))
    weights = np.zeros((n, 4))
    for i in range(n):
        if labels[i] == 1:
            g = v[int(np.argmax(ious[i]))]
            aw, ah = a[i][2] - a[i][0] + 1, a[i][3] - a[i][1] + 1
            gw, gh = g[2] - g[0] + 1, g[3] - g[1] + 1
            acx, acy = a[i][0] + 0.5 * (aw - 1), a[i][1] + 0.5 * (ah - 1)
            gcx, gcy = g[0] + 0.5 * (gw - 1), g[1] + 0.5 * (gh - 1)
            deltas[i] = [(gcx - acx) / aw, (gcy - acy) / ah, np.log(gw / aw), np.log(gh / ah)]
            weights[i] = 1
    return np.array(labels), deltas, weights


def to_anchor_order(targeter, label, bbox_target, bbox_weight):
    """Undo the network layout: (A*H*W,) and (4A, H, W) back to rows in (h, w, a) anchor order."""
    a, s = targeter.num_anchors, targeter.feat_size
    labels = label.reshape(a, s, s).transpose(1, 2, 0).reshape(-1)
    deltas = bbox_target.reshape(a, 4, s, s).transpose(2, 3, 0, 1).reshape(-1, 4)
    weights = bbox_weight.reshape(a, 4, s, s).transpose(2, 3, 0, 1).reshape(-1, 4)
    return labels, deltas, weights


def random_boxes(rng, count, extent, min_size=8, max_size=120):
    xy = rng.uniform(-20, extent, (count, 2))
    wh = rng.uniform(min_size, max_size, (count, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference_without_sampling(seed):
    params = params_with(chip_size=128, batch_size=NO_SAMPLING)
    targeter = AnchorTargeter(params)
    rng = np.random.default_rng(seed)
    valid = random_boxes(rng, int(rng.integers(0, 5)), 128)
    invalid = random_boxes(rng, int(rng.integers(1, 4)), 128)
    height, width = (128, 128) if seed == 0 else (int(rng.integers(40, 128)), int(rng.integers(40, 128)))
    out = targeter(valid, invalid, height, width, np.random.default_rng(0))
    labels, deltas, weights = to_anchor_order(targeter, *out)
    ref_labels, ref_deltas, ref_weights = reference_targets(targeter.anchors, valid, invalid, height, width, params)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_allclose(deltas, ref_deltas, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(weights, ref_weights)


def test_anchor_equal_to_box_is_positive_at_its_network_position():
    targeter = AnchorTargeter(PUBLISHED)
    size, num_anchors = targeter.feat_size, targeter.num_anchors
    # ratio 1 (row 1), scale 4 (column 1): a 64 x 64 anchor centred on (7.5, 7.5) in cell (0, 0)
    anchor_index = 1 * 7 + 1
    base = base_anchors(16, (0.5, 1, 2), (2, 4, 7, 10, 13, 16, 24))
    np.testing.assert_array_equal(base[anchor_index], [-24, -24, 39, 39])
    h, w = 10, 13
    box = np.array([[-24 + 16 * w, -24 + 16 * h, 39 + 16 * w, 39 + 16 * h]], np.float32)
    label, bbox_target, bbox_weight = targeter(box, np.zeros((0, 4)), 512, 512, np.random.default_rng(0))
    assert label[anchor_index * size * size + h * size + w] == 1
    channels = slice(4 * anchor_index, 4 * anchor_index + 4)
    np.testing.assert_array_equal(bbox_target[channels, h, w], 0)
    np.testing.assert_array_equal(bbox_weight[channels, h, w], 1)
    # weights are exactly the positives, for every coordinate
    positive = label.reshape(num_anchors, size, size) == 1
    np.testing.assert_array_equal(bbox_weight.reshape(num_anchors, 4, size, size) == 1, positive[:, None].repeat(4, 1))


def test_box_shifted_half_a_cell_gets_hand_computed_deltas():
    targeter = AnchorTargeter(params_with(batch_size=NO_SAMPLING))
    size = targeter.feat_size
    anchor_index = 1 * 7 + 1  # 64 x 64 anchor
    h, w = 8, 8
    x1, y1 = -24 + 16 * w, -24 + 16 * h
    box = np.array([[x1 + 8, y1, x1 + 8 + 63, y1 + 63]], np.float32)  # 8 px to the right: dx = 8 / 64
    label, bbox_target, _ = targeter(box, np.zeros((0, 4)), 512, 512, np.random.default_rng(0))
    assert label[anchor_index * size * size + h * size + w] == 1
    np.testing.assert_allclose(bbox_target[4 * anchor_index:4 * anchor_index + 4, h, w], [0.125, 0, 0, 0], atol=1e-7)


def test_invalid_box_makes_its_anchors_ignored_not_negative():
    targeter = AnchorTargeter(params_with(batch_size=NO_SAMPLING))
    size = targeter.feat_size
    anchor_index, h, w = 8, 20, 6
    box = np.array([[-24 + 16 * w, -24 + 16 * h, 39 + 16 * w, 39 + 16 * h]], np.float32)
    label, _, bbox_weight = targeter(np.zeros((0, 4)), box, 512, 512, np.random.default_rng(0))
    assert label[anchor_index * size * size + h * size + w] == -1
    assert not (label == 1).any() and bbox_weight.sum() == 0
    # anchors far from the invalid box stay negative
    assert label[anchor_index * size * size + 2 * size + 25] == 0


def test_no_boxes_samples_256_negatives():
    targeter = AnchorTargeter(PUBLISHED)
    label, bbox_target, bbox_weight = targeter(np.zeros((0, 4)), np.zeros((0, 4)), 512, 512, np.random.default_rng(3))
    assert (label == 0).sum() == 256 and (label == 1).sum() == 0
    assert not bbox_target.any() and not bbox_weight.any()


def test_anchors_beyond_the_border_of_small_content_are_ignored():
    params = params_with(batch_size=NO_SAMPLING)
    targeter = AnchorTargeter(params)
    height, width = 100, 300
    label, _, _ = targeter(np.zeros((0, 4)), np.zeros((0, 4)), height, width, np.random.default_rng(0))
    anchors = grid_anchors(base_anchors(16, params.ratios, params.scales), 32, 32, 16)
    labels = label.reshape(21, 32, 32).transpose(1, 2, 0).reshape(-1)
    inside = (anchors[:, 0] >= -32) & (anchors[:, 1] >= -32) & (anchors[:, 2] < 332) & (anchors[:, 3] < 132)
    assert inside.sum() > 0
    np.testing.assert_array_equal(labels == 0, inside)
    np.testing.assert_array_equal(labels == -1, ~inside)


def test_sampling_caps_positives_at_half_and_is_a_subset():
    params = PUBLISHED
    targeter = AnchorTargeter(params)
    full = AnchorTargeter(params_with(batch_size=NO_SAMPLING))
    rng = np.random.default_rng(5)
    valid = random_boxes(rng, 30, 480, min_size=40, max_size=200)
    label, _, bbox_weight = targeter(valid, np.zeros((0, 4)), 512, 512, np.random.default_rng(1))
    all_label, _, _ = full(valid, np.zeros((0, 4)), 512, 512, np.random.default_rng(1))
    assert (all_label == 1).sum() > 128
    assert (label == 1).sum() == 128 and (label == 0).sum() == 128
    kept = label != -1
    np.testing.assert_array_equal(label[kept], all_label[kept])
    assert bbox_weight.sum() == 4 * 128
    again, _, _ = targeter(valid, np.zeros((0, 4)), 512, 512, np.random.default_rng(1))
    np.testing.assert_array_equal(label, again)
    other, _, _ = targeter(valid, np.zeros((0, 4)), 512, 512, np.random.default_rng(2))
    assert not np.array_equal(label, other)


def test_writes_into_given_buffers():
    targeter = AnchorTargeter(PUBLISHED)
    out = (np.full(targeter.label_shape, 7, np.float32), np.full(targeter.target_shape, 7, np.float32),
           np.full(targeter.target_shape, 7, np.float32))
    box = np.array([[10, 10, 90, 90]], np.float32)
    result = targeter(box, np.zeros((0, 4)), 512, 512, np.random.default_rng(0), out)
    assert all(r is o for r, o in zip(result, out))
    assert set(np.unique(out[0])) <= {-1, 0, 1} and not (out[1] == 7).any() and set(np.unique(out[2])) <= {0, 1}
