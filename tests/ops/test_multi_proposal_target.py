"""The compiled MultiProposalTarget operator against its NumPy reference and hand-worked cases, in both
rule sets: "reference" (the published SNIPER's GPU operator, the default) and "exact"."""
import math

import numpy as np
import pytest

from lib.boxes import base_anchors, grid_anchors
from proposal_target_helpers import NUM_ANCHORS, ONE_ANCHOR, RULES, assert_matches_reference, one_anchor_chips, \
    padding_box, random_inputs, run_operator


@pytest.mark.parametrize("rules", RULES)
def test_random_batch_matches_reference(rules):
    rng = np.random.default_rng(0)
    # Open ends both ways: -1 (open) and the reference loader's 0 / 512 (plain numbers).
    inputs = random_inputs(rng, [[-1, -1], [32, 150], [-1, 80], [60, -1], [0, 512]])
    inputs[2][4, :2] = [200, 170]  # a coarsest-scale chip whose image is smaller than the canvas
    rois, labels, _, weights = assert_matches_reference(inputs, rules=rules)
    assert (labels > 0).sum() > len(inputs[0])  # positives beyond the appended gts themselves
    assert (labels == -1).sum() == 0
    assert np.array_equal(weights[:, 0], (labels > 0).astype(np.float32))
    # Proposals are clipped to im_info (h, w); gts and the reference's padding boxes are not.
    chip4 = rois.reshape(5, -1, 5)[4, :, 1:]
    gts = {tuple(gt[:4]) for gt in inputs[3][4]}
    proposals = [roi for roi in chip4 if tuple(roi) not in gts and not (roi[2] - roi[0] == 200 and roi[0] == roi[1])]
    assert len(proposals) > 250 and np.max(np.float32(proposals)[:, [0, 2]]) <= 169
    assert np.max(np.float32(proposals)[:, [1, 3]]) <= 199


@pytest.mark.parametrize("rules", RULES)
def test_score_ties_match_reference(rules):
    """Coarse scores: thousands of exact ties, broken by anchor index (exact) or by the reference NMS
    kernel's positional rule, which dev/oracles/proposal_target.py runs slot by slot and the operator emulates."""
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, [[-1, -1], [16, 200], [0, 512]], score_levels=8)
    # NMS at 0.3 empties the best score levels early, so later levels' ties involve elements that
    # earlier selections moved.
    assert_matches_reference(inputs, rules=rules, threshold=0.3)
    assert_matches_reference(inputs, rules=rules, rpn_pre_nms_top_n=500, rpn_post_nms_top_n=120)


@pytest.mark.parametrize("rules", RULES)
def test_empty_and_all_out_of_range_gt_lists(rules):
    rng = np.random.default_rng(2)
    inputs = random_inputs(rng, [[-1, -1], [100, 140], [-1, -1]])
    gt_boxes = inputs[3]
    gt_boxes[0] = -1  # no gts: everything background
    gt_boxes[1, :, 4] = -1
    gt_boxes[1, :2] = [[10, 10, 19, 19, 3], [50, 50, 199, 199, 7]]  # sizes 10 and 150: outside [100, 140]
    rois, labels, targets, weights = assert_matches_reference(inputs, rules=rules)
    per_chip = labels.reshape(3, -1)
    assert np.all(per_chip[0] == 0) and not weights.reshape(3, -1, 4)[0].any()
    # Out-of-range gts are not appended as rois, but proposals covering one still take its class.
    chip1_rois = rois.reshape(3, -1, 5)[1, :, 1:]
    assert not any(np.array_equal(roi, gt[:4]) for roi in chip1_rois for gt in gt_boxes[1, :2])
    assert 7 in per_chip[1] and set(np.unique(per_chip[1])) <= {-1.0, 0.0, 7.0}


# ---- reference rules, hand-worked -------------------------------------------------------------------

def test_reference_drops_a_box_only_when_both_sides_are_small():
    """Boxes made by clipping one 16 px anchor at the chip's top-left corner (1x1 map, chip b = box b):
    dx = -0.875 moves the centre to -6.5, so x1 = -14 -> 0 and x2 = 1; dx = -0.78125 gives x2 = 2.5."""
    deltas = [[-0.875, 0, 0, 0],           # [0, 0, 1, 15]: x2 - x1 = 1 < 3, y2 - y1 = 15
              [-0.875, -0.875, 0, 0],      # [0, 0, 1, 1]: both sides 1
              [-0.78125, -0.78125, 0, 0],  # [0, 0, 2.5, 2.5]: both sides 2.5 (3.5 with the +1)
              [-0.75, -0.75, 0, 0]]        # [0, 0, 3, 3]: 3 is not under 3
    inputs = one_anchor_chips(deltas)
    boxes = [[0, 0, 1, 15], [0, 0, 1, 1], [0, 0, 2.5, 2.5], [0, 0, 3, 3]]
    rois, labels, _, _ = run_operator(inputs, rpn_post_nms_top_n=1, **ONE_ANCHOR)
    kept = [True, False, False, True]  # reference: dropped only when both (x2 - x1) and (y2 - y1) < 3
    # Chip b holds anchor b * 1 of the batch: a dropped box leaves padding m = b % 100.
    np.testing.assert_array_equal(rois[:, 1:], [box if keep else padding_box(b)
                                                for b, (box, keep) in enumerate(zip(boxes, kept))])
    np.testing.assert_array_equal(labels, 0)
    rois, labels, _, _ = run_operator(inputs, rules="exact", rpn_post_nms_top_n=1, **ONE_ANCHOR)
    kept = [False, False, True, True]  # exact: dropped when either x2 - x1 + 1 or y2 - y1 + 1 < 3
    np.testing.assert_array_equal(labels, [0 if keep else -1 for keep in kept])
    np.testing.assert_array_equal(rois[[2, 3], 1:], [boxes[2], boxes[3]])


@pytest.mark.parametrize("valid_range, kept", [
    ((15, -1), True),       # area (x2 - x1)(y2 - y1) = 225 is not < 15^2
    ((15.01, -1), False),   # 225 < 15.01^2
    ((-1, 15), False),      # 225 >= 15^2: the upper end is exclusive
    ((-1, 15.01), True),
    ((0, 512), True),       # the reference loader's open ends, as plain numbers
    ((16, 16), False),      # the exact rules' sqrt(+1 area) = 16 would pass this one
])
def test_reference_valid_range_uses_the_area_without_plus_one(valid_range, kept):
    inputs = one_anchor_chips([[0, 0, 0, 0]], valid_range=valid_range)  # the box [0, 0, 15, 15]
    rois, _, _, _ = run_operator(inputs, rpn_post_nms_top_n=1, **ONE_ANCHOR)
    np.testing.assert_array_equal(rois[0, 1:], [0, 0, 15, 15] if kept else padding_box(0))
    assert_matches_reference(inputs, rpn_post_nms_top_n=1, **ONE_ANCHOR)


def test_reference_open_end_minus_one_differs_from_512():
    """On a 600 px chip a box [0, 0, 599, 599] (area 599^2 >= 512^2) is dropped by hi = 512, kept by -1."""
    grow = math.log(80.0)  # 16 px x 80 (no dw cap: capped at 1000 / 16 it would end at 507): the whole chip
    for valid_range, kept in (((0, 512), False), ((-1, -1), True), ((0, -1), True)):
        inputs = one_anchor_chips([[0, 0, grow, grow]], im_info=(600, 600, 1), valid_range=valid_range)
        rois, _, _, _ = run_operator(inputs, rpn_post_nms_top_n=1, **ONE_ANCHOR)
        np.testing.assert_array_equal(rois[0, 1:], [0, 0, 599, 599] if kept else padding_box(0))


def test_reference_nms_uses_the_area_without_plus_one():
    """Two 16 px boxes 3 px apart: true IoU 13*16 / (2*256 - 13*16) = 0.684 keeps both under NMS 0.7,
    the reference's 13*16 / (2*225 - 13*16) = 0.860 suppresses the second; 5 px apart (0.524 / 0.642)
    both rule sets keep both."""
    for shift, reference_keeps in ((3, False), (5, True)):
        deltas = np.zeros((1, 1, 2, 4), np.float32)
        deltas[0, 0, 1, 0] = (shift - 16) / 16  # second anchor [16, 0, 31, 15] moved to x1 = shift
        inputs = one_anchor_chips(deltas, scores=[[[0.9, 0.8]]], feat=(1, 2))
        second = [shift, 0, shift + 15, 15]
        rois, _, _, _ = run_operator(inputs, rpn_post_nms_top_n=3, **ONE_ANCHOR)
        np.testing.assert_array_equal(rois[:2, 1:], [[0, 0, 15, 15], second if reference_keeps else padding_box(1)])
        rois, labels, _, _ = run_operator(inputs, rules="exact", rpn_post_nms_top_n=3, **ONE_ANCHOR)
        np.testing.assert_array_equal(rois[:2, 1:], [[0, 0, 15, 15], second])


def test_reference_padding_boxes_are_labelled_like_rois():
    """Nothing survives (range far above the box): every slot holds [m, m, m+200, m+200] with
    m = (b * A*H*W + slot) % 100 (A*H*W = 1 here). A gt [40, 40, 240, 240] labels the padding box
    d px away foreground while (201 - d)^2 / (2 * 200^2 - (201 - d)^2) > 0.5, i.e. for d <= 37."""
    gts = np.float32([[[40, 40, 240, 240, 9]]] * 2)
    inputs = one_anchor_chips([[0, 0, 0, 0]] * 2, valid_range=(100, -1), gt_boxes=gts)
    rois, labels, targets, weights = run_operator(inputs, rpn_post_nms_top_n=120, **ONE_ANCHOR)
    rois, labels = rois.reshape(2, 120, 5), labels.reshape(2, 120)
    for b in range(2):
        m = (b + np.arange(120)) % 100
        expected = np.float32(np.stack([m, m, m + 200, m + 200], axis=1))
        expected[119] = gts[b, 0, :4]  # the gt overwrites the last slot
        np.testing.assert_array_equal(rois[b, :, 1:], expected)
        np.testing.assert_array_equal(rois[b, :, 0], b)
        fg = np.abs(m - 40) <= 37
        fg[119] = True
        np.testing.assert_array_equal(labels[b], np.where(fg, 9, 0))
    assert np.all(weights[labels.reshape(-1) > 0] == 1) and np.all(weights[labels.reshape(-1) == 0] == 0)
    np.testing.assert_array_equal(targets[labels.reshape(-1) == 0], 1.0)  # non-positives keep 1.0
    assert_matches_reference(inputs, rpn_post_nms_top_n=120, **ONE_ANCHOR)


def test_reference_appends_in_range_gts_over_the_last_slots():
    """R = 6 rois, range (20, 100) in chip px, real gts g0..g2 (then a padding row): gt j goes to slot
    6 - 3 + j when lo^2 <= (x2 - x1)(y2 - y1) <= hi^2 (inclusive here), else the slot keeps its box."""
    gts = np.float32([[[0, 0, 49, 49, 1],       # area 49^2: in range -> slot 3
                       [0, 0, 9, 9, 2],         # area 81 < 400: slot 4 keeps its padding box
                       [200, 200, 300, 300, 3],  # area 100^2 = hi^2: in range -> slot 5
                       [-1, -1, -1, -1, -1]]])
    # One anchor of scale 2: [-8, -8, 23, 23] clipped to the proposal [0, 0, 23, 23] (area 529).
    inputs = one_anchor_chips([[0, 0, 0, 0]], valid_range=(20, 100), gt_boxes=gts)
    attrs = dict(scales=(2,), ratios=(1,), rpn_post_nms_top_n=6)
    rois, labels, _, _ = run_operator(inputs, **attrs)
    np.testing.assert_array_equal(rois[:, 1:], [[0, 0, 23, 23], padding_box(1), padding_box(2),
                                                gts[0, 0, :4], padding_box(4), gts[0, 2, :4]])
    # The proposal's best overlap is 24^2 / (49^2 + 23^2 - 24^2) = 0.245 (g0): background. g1 is not
    # a roi but still labels: padding_box(4) vs g0..g2 is below 0.5.
    np.testing.assert_array_equal(labels, [0, 0, 0, 1, 0, 3])
    assert_matches_reference(inputs, **attrs)
    # The exact rules append in-range gts right after the proposal; g2's sqrt(+1 area) 101 > 100.
    rois, labels, _, _ = run_operator(inputs, rules="exact", **attrs)
    np.testing.assert_array_equal(rois[:2, 1:], [[0, 0, 23, 23], gts[0, 0, :4]])
    np.testing.assert_array_equal(labels, [0, 1, -1, -1, -1, -1])
    # More gts than rois: R = 2, three in range: slot 2 - 3 + j exists for j = 1, 2 only.
    gts[0, 1] = [10, 10, 60, 60, 2]
    rois, labels, _, _ = run_operator(one_anchor_chips([[0, 0, 0, 0]], valid_range=(20, 100), gt_boxes=gts),
                                      scales=(2,), ratios=(1,), rpn_post_nms_top_n=2)
    np.testing.assert_array_equal(rois[:, 1:], gts[0, 1:3, :4])
    np.testing.assert_array_equal(labels, [2, 3])


def test_reference_targets_put_the_gt_centre_half_a_pixel_off():
    """A roi equal to its gt [10, 20, 41, 83] (w 32, h 64): the reference's gt centre x1 + 0.5 w is
    0.5 px right of / below the roi centre x1 + 0.5 (w - 1), so dx = 10 * 0.5 / (32 + 1e-7),
    dy = 10 * 0.5 / (64 + 1e-7), dw = 5 log(32 / (32 + 1e-7)), dh = 5 log(64 / (64 + 1e-7))."""
    gts = np.float32([[[10, 20, 41, 83, 4]]])
    inputs = one_anchor_chips([[0, 0, 0, 0]], im_info=(128, 128, 1), gt_boxes=gts)
    rois, labels, targets, weights = run_operator(inputs, rpn_post_nms_top_n=2, **ONE_ANCHOR)
    np.testing.assert_array_equal(rois[1, 1:], gts[0, 0, :4])
    np.testing.assert_array_equal(labels, [0, 4])
    expected = [5 / (32 + 1e-7), 5 / (64 + 1e-7), 5 * math.log(32 / (32 + 1e-7)), 5 * math.log(64 / (64 + 1e-7))]
    np.testing.assert_allclose(targets[1], expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_array_equal(targets[0], 1.0)
    np.testing.assert_array_equal(weights, [[0] * 4, [1] * 4])
    _, _, targets, _ = run_operator(inputs, rules="exact", rpn_post_nms_top_n=2, **ONE_ANCHOR)
    np.testing.assert_array_equal(targets, 0)  # exact: the appended gt's target is 0, the background 0


@pytest.mark.parametrize("scale, shift, reference_fg", [
    # roi of side s = 16 * scale (x2 - x1 = s - 1), gt shifted right by d: the reference's overlap
    # (s - d) s / (2 (s - 1)^2 - (s - d) s) passes 0.5 while 3 (s - d) s > 2 (s - 1)^2, i.e. for d below
    # 6.625 / 11.98 / 22.66, at true IoUs (s - d) / (s + d) down to 0.414 / 0.455 / 0.477.
    (1, 6.5, True),     # true IoU 9.5 / 22.5 = 0.422; reference 152 / 298 = 0.510
    (1, 6.625, False),  # reference 150 / 300 = 0.5 exactly: not above
    (2, 11.875, True),  # true 0.459; reference 644 / 1278 = 0.504
    (2, 12.0, False),   # true 0.455; reference 640 / 1282 = 0.499
    (4, 22.5, True),    # true 0.480; reference 2656 / 5282 = 0.503
    (4, 22.75, False),  # true 0.478; reference 2640 / 5298 = 0.498
])
def test_reference_effective_foreground_threshold(scale, shift, reference_fg):
    """The best of an 8x8 map (cell (4, 4), zero deltas) is the roi, the gt is appended after it."""
    half = 8 * scale
    roi = np.float32([72 - half, 72 - half, 71 + half, 71 + half])
    gts = np.float32([[[roi[0] + shift, roi[1], roi[2] + shift, roi[3], 5]]])
    scores = np.full((1, 8, 8), 0.1, np.float32)
    scores[0, 4, 4] = 0.9
    inputs = one_anchor_chips(np.zeros((1, 8, 8, 4)), scores=scores, im_info=(512, 512, 1), gt_boxes=gts,
                              feat=(8, 8))
    for rules, fg in (("reference", reference_fg), ("exact", False)):  # true IoUs are all below 0.5
        rois, labels, _, _ = run_operator(inputs, rules=rules, rpn_post_nms_top_n=2, scales=(scale,), ratios=(1,))
        np.testing.assert_array_equal(rois[0, 1:], roi)
        assert labels[0] == (5 if fg else 0)


def test_reference_nms_breaks_ties_by_the_kernels_positions():
    """One anchor per cell on a 2 x 32 map, index h * 32 + w, no overlaps; 0.1 where not listed.
    Chip 0: 0.9 at index 40; 0.5 at 0, 2, 33. Slot 0 takes 40 and swaps it with the element at
    position 0, which moves to position 40. Slot 1: candidates at positions 2, 33, 40, relative 1, 32,
    39; the kernel prefers the smallest (r mod 32, r mod 1024, r): 32 -> index 33 (its slot-1 element,
    index 1, moves to 33). Slot 2: index 2 at relative 0. Slot 3: index 0 (at position 40). Lowest
    index first (exact) gives 40, 0, 2, 33.
    Chip 1: 0.9 at 33; 0.5 at 0 and 5. Index 0 moves to position 33, relative 32 at slot 1, and beats
    index 5 (relative 4) only because it moved (at position 0 it would be relative -1: last)."""
    scores = np.full((2, 2, 32), 0.1, np.float32)
    for b, best, tied in ((0, 40, (0, 2, 33)), (1, 33, (0, 5))):
        scores[b, best // 32, best % 32] = 0.9
        for index in tied:
            scores[b, index // 32, index % 32] = 0.5
    inputs = one_anchor_chips(np.zeros((2, 2, 32, 4)), scores=scores, im_info=(512, 512, 1), feat=(2, 32))

    def box(index):
        y, x = divmod(index, 32)
        return [16 * x, 16 * y, 16 * x + 15, 16 * y + 15]

    # Slot 3 of chip 1 falls to the 0.1 ties: index 3 (relative 0) for the reference, 1 for exact.
    for rules, orders in (("reference", ([40, 33, 2, 0], [33, 0, 5, 3])), ("exact", ([40, 0, 2, 33], [33, 0, 5, 1]))):
        rois, _, _, _ = assert_matches_reference(inputs, rules=rules, rpn_post_nms_top_n=4, **ONE_ANCHOR)
        np.testing.assert_array_equal(rois[:, 1:], [box(i) for order in orders for i in order])


def test_reference_nms_ties_prefer_thread_zero_residues_over_lower_indices():
    """Equal scores at indices 1 and 1024 (1 x 1056 anchors): 1024 = 0 mod 32 comes first."""
    scores = np.full((1, 33, 32), 0.1, np.float32)
    scores[0, 0, 1] = scores[0, 32, 0] = 0.7
    inputs = one_anchor_chips(np.zeros((1, 33, 32, 4)), scores=scores, im_info=(1024, 1024, 1), feat=(33, 32))
    rois, _, _, _ = run_operator(inputs, rpn_post_nms_top_n=2, **ONE_ANCHOR)
    np.testing.assert_array_equal(rois[:, 1:], [[0, 512, 15, 527], [16, 0, 31, 15]])


def test_reference_anchor_order_is_a_h_w():
    """Zero deltas, all 18 scores equal, NMS threshold 1 (no overlap here exceeds it): slot j holds
    the element at relative position 0 (nothing needs a swap), so the rois come out in the reference's
    anchor order (a, h, w), all cells of anchor type 0 before those of type 1."""
    feat = 3
    anchors = grid_anchors(base_anchors(16, (1,), (1, 2)), feat, feat, 16)  # (h, w, a) order, A = 2
    cls_prob = np.full((1, 4, feat, feat), 0.5, np.float32)
    inputs = (cls_prob, np.zeros((1, 8, feat, feat), np.float32), np.float32([[1000, 1000, 1]]),
              np.full((1, 1, 5), -1, np.float32), np.float32([[-1, -1]]))
    rois, _, _, _ = assert_matches_reference(inputs, scales=(1, 2), ratios=(1,), threshold=1.0,
                                             rpn_post_nms_top_n=len(anchors))
    a_h_w = np.maximum(anchors, 0).reshape(feat, feat, 2, 4).transpose(2, 0, 1, 3).reshape(-1, 4)
    np.testing.assert_array_equal(rois[:, 1:], a_h_w)


# ---- exact rules, hand-worked -------------------------------------------------------------------------

def test_exact_few_survivors_are_padded():
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, [[40, 44], [-1, -1]], im_size=(96, 128))
    rois, labels, targets, weights = assert_matches_reference(inputs, rules="exact", rpn_pre_nms_top_n=40)
    rois, labels = rois.reshape(2, 300, 5), labels.reshape(2, 300)
    for b in range(2):
        padding = labels[b] == -1
        num_real = 300 - padding.sum()
        assert 0 < num_real < 300 and np.all(padding[num_real:])  # padding fills the tail
        np.testing.assert_array_equal(rois[b, padding], np.tile(np.float32([b, 0, 0, 15, 15]), (padding.sum(), 1)))
    pad_rows = labels.reshape(-1) == -1
    assert not targets[pad_rows].any() and not weights[pad_rows].any()


def test_exact_more_valid_gts_than_rois_keeps_the_first():
    rng = np.random.default_rng(4)
    inputs = random_inputs(rng, [[-1, -1]], max_gts=12)
    gt_boxes = inputs[3]
    gt_boxes[0] = [[8 * i, 8 * i, 8 * i + 30, 8 * i + 40, i + 1] for i in range(12)]
    rois, labels, _, _ = assert_matches_reference(inputs, rules="exact", rpn_post_nms_top_n=5)
    np.testing.assert_array_equal(rois[:, 1:], gt_boxes[0, :5, :4])
    np.testing.assert_array_equal(labels, gt_boxes[0, :5, 4])


def test_exact_rois_are_the_anchors_in_hwa_order_without_regression():
    """Zero deltas, scores falling with the anchor index, nothing suppressed: rois == grid_anchors."""
    feat, stride = 3, 16
    scales, ratios = (2, 4, 7, 10, 13, 16, 24), (0.5, 1, 2)
    anchors = grid_anchors(base_anchors(stride, ratios, scales), feat, feat, stride)
    rank = np.arange(len(anchors), 0, -1, dtype=np.float32) / len(anchors)
    cls_prob = np.zeros((1, 2 * NUM_ANCHORS, feat, feat), np.float32)
    cls_prob[0, NUM_ANCHORS:] = rank.reshape(feat, feat, NUM_ANCHORS).transpose(2, 0, 1)
    bbox_pred = np.zeros((1, 4 * NUM_ANCHORS, feat, feat), np.float32)
    big = 10000.0  # nothing is clipped
    no_gts = np.full((1, 1, 5), -1, np.float32)
    inputs = (cls_prob, bbox_pred, np.float32([[big, big, 1]]), no_gts, np.float32([[-1, -1]]))
    rois, labels, _, _ = run_operator(inputs, rules="exact", scales=scales, ratios=ratios, threshold=1.0,
                                      rpn_min_size=0, rpn_post_nms_top_n=len(anchors))
    np.testing.assert_array_equal(rois[:, 1:], np.maximum(anchors, 0))  # clipped at the chip's top-left
    assert np.all(labels == 0)


def test_exact_hand_worked_chip():
    """One anchor [0, 0, 15, 15], zero deltas, one gt [0, 0, 15, 23] of class 5, 3 rois."""
    cls_prob = np.float32([0.2, 0.8]).reshape(1, 2, 1, 1)
    bbox_pred = np.zeros((1, 4, 1, 1), np.float32)
    gt_boxes = np.float32([[[0, 0, 15, 23, 5], [-1, -1, -1, -1, -1]]])
    inputs = (cls_prob, bbox_pred, np.float32([[64, 64, 1]]), gt_boxes, np.float32([[-1, -1]]))
    rois, labels, targets, weights = run_operator(inputs, rules="exact", rpn_post_nms_top_n=3, **ONE_ANCHOR)
    np.testing.assert_array_equal(rois, [[0, 0, 0, 15, 15], [0, 0, 0, 15, 23], [0, 0, 0, 15, 15]])
    np.testing.assert_array_equal(labels, [5, 5, -1])  # IoU 256 / 384 = 0.667 > 0.5
    # centre y moves from 7.5 to 11.5 on a height of 16; height grows 16 -> 24.
    np.testing.assert_allclose(targets[0], [0, 0.25 / 0.1, 0, math.log(1.5) / 0.2], rtol=1e-6)
    np.testing.assert_array_equal(targets[1:], 0)
    np.testing.assert_array_equal(weights, [[1] * 4, [1] * 4, [0] * 4])


def two_box_chip(gt_boxes):
    """Feature map 1x2, one 16x16 anchor per cell; the second is moved left by 12 px, so the two
    proposals are [0, 0, 15, 15] (score 0.9) and [4, 0, 19, 15] (score 0.8): IoU 192 / 320 = 0.6."""
    deltas = np.zeros((1, 1, 2, 4), np.float32)
    deltas[0, 0, 1, 0] = -0.75
    # Every box here is 16 x 16: sqrt(area) 16 sits on both ends of the inclusive valid range.
    return one_anchor_chips(deltas, scores=[[[0.9, 0.8]]], valid_range=(16, 16), gt_boxes=np.reshape(gt_boxes, (1, -1, 5)),
                            feat=(1, 2))


def test_exact_thresholds_at_their_boundaries():
    attrs = dict(rules="exact", rpn_min_size=16, **ONE_ANCHOR)
    no_gts = two_box_chip([[-1] * 5])
    rois, labels, _, _ = run_operator(no_gts, threshold=0.6, rpn_post_nms_top_n=3, **attrs)
    np.testing.assert_array_equal(rois[:2, 1:], [[0, 0, 15, 15], [4, 0, 19, 15]])  # IoU 0.6 is not > 0.6
    np.testing.assert_array_equal(labels, [0, 0, -1])
    rois, labels, _, _ = run_operator(no_gts, threshold=0.59, rpn_post_nms_top_n=3, **attrs)
    np.testing.assert_array_equal(labels, [0, -1, -1])

    # The second proposal has IoU 0.6 with both gts: background at fg_thresh 0.6, else the first gt.
    chip = two_box_chip([[8, 0, 23, 15, 2], [0, 0, 15, 15, 1]])
    rois, labels, targets, _ = run_operator(chip, threshold=0.7, fg_thresh=0.6, rpn_post_nms_top_n=4, **attrs)
    np.testing.assert_array_equal(rois[:, 1:], [[0, 0, 15, 15], [4, 0, 19, 15], [8, 0, 23, 15], [0, 0, 15, 15]])
    np.testing.assert_array_equal(labels, [1, 0, 2, 1])
    rois, labels, targets, _ = run_operator(chip, threshold=0.7, fg_thresh=0.5, rpn_post_nms_top_n=4, **attrs)
    np.testing.assert_array_equal(labels, [1, 2, 2, 1])
    np.testing.assert_allclose(targets[1], [0.25 / 0.1, 0, 0, 0], rtol=1e-6)  # centre 11.5 -> 15.5 on width 16
    for chip_inputs, attrs_used in ((no_gts, dict(threshold=0.6)), (chip, dict(threshold=0.7, fg_thresh=0.5))):
        assert_matches_reference(chip_inputs, rpn_post_nms_top_n=4, **attrs_used, **attrs)
