"""Anchor generation and order, IoU labelling (incl. ties and invalid boxes), minibatch subsampling."""
import numpy as np
import pytest

from lib.boxes import base_anchors, bbox_overlaps, grid_anchors, ignore_near_invalid, match, subsample

RATIOS = (0.5, 1, 2)
SCALES = (2, 4, 7, 10, 13, 16, 24)


# ---------------------------------------------------------------- anchors


def test_base_anchors_hand_checked():
    anchors = base_anchors(16, RATIOS, SCALES)
    assert anchors.shape == (21, 4) and anchors.dtype == np.float32
    # ratio 1: 16 x 16 cell centred at 7.5; scale 2 -> 32 x 32
    np.testing.assert_array_equal(anchors[1 * 7 + 0], [-8, -8, 23, 23])
    # ratio 0.5: w = round(sqrt(256 / 0.5)) = 23, h = round(11.5) = 12 (half to even); scale 2 -> 46 x 24
    np.testing.assert_array_equal(anchors[0], [-15, -4, 30, 19])
    # ratio 2: w = round(sqrt(128)) = 11, h = 22; scale 24 -> 264 x 528
    np.testing.assert_array_equal(anchors[2 * 7 + 6], [7.5 - 131.5, 7.5 - 263.5, 7.5 + 131.5, 7.5 + 263.5])
    # ratio 0.5, scale 7: 161 x 84, an odd width gives half-pixel corners
    np.testing.assert_array_equal(anchors[0 * 7 + 2], [7.5 - 80, 7.5 - 41.5, 7.5 + 80, 7.5 + 41.5])


def test_base_anchors_are_ratio_major_and_centred():
    anchors = base_anchors(16, RATIOS, SCALES)
    widths = anchors[:, 2] - anchors[:, 0] + 1
    heights = anchors[:, 3] - anchors[:, 1] + 1
    np.testing.assert_allclose((anchors[:, 0] + anchors[:, 2]) / 2, 7.5)
    np.testing.assert_allclose((anchors[:, 1] + anchors[:, 3]) / 2, 7.5)
    for r, (base_w, base_h) in enumerate([(23, 12), (16, 16), (11, 22)]):
        for s, scale in enumerate(SCALES):
            assert (widths[r * 7 + s], heights[r * 7 + s]) == (base_w * scale, base_h * scale)


def test_base_anchors_reject_bad_parameters():
    with pytest.raises(ValueError, match="ratios"):
        base_anchors(16, (0.5, -1), SCALES)
    with pytest.raises(ValueError, match="stride"):
        base_anchors(0, RATIOS, SCALES)


def test_grid_anchors_order_is_h_w_a():
    base = base_anchors(16, RATIOS, (2, 4))
    height, width, stride = 3, 5, 16
    grid = grid_anchors(base, height, width, stride)
    assert grid.shape == (height * width * len(base), 4) and grid.dtype == np.float32
    row = 0
    for h in range(height):
        for w in range(width):
            for a in range(len(base)):
                np.testing.assert_array_equal(grid[row], base[a] + [w * stride, h * stride, w * stride, h * stride])
                row += 1
    assert grid_anchors(base, 0, 4, stride).shape == (0, 4)


# ---------------------------------------------------------------- matcher


def test_match_thresholds_and_low_quality():
    overlaps = np.array(
        [
            [0.70, 0.10],  # >= 0.5: positive for gt 0
            [0.45, 0.20],  # between 0.4 and 0.5: ignored
            [0.30, 0.35],  # < 0.4, but the best row for gt 1: positive only with low-quality matching
            [0.10, 0.05],  # negative
            [0.50, 0.00],  # exactly 0.5: positive
            [0.40, 0.00],  # exactly 0.4: not below 0.4, ignored
        ]
    )
    matched, labels = match(overlaps, 0.5, 0.4)
    np.testing.assert_array_equal(matched, [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(labels, [1, -1, 1, 0, 1, -1])
    assert matched.dtype == np.int64 and labels.dtype == np.int32
    _, labels = match(overlaps, 0.5, 0.4, allow_low_quality=False)
    np.testing.assert_array_equal(labels, [1, -1, 0, 0, 1, -1])


def test_match_strict_comparisons():
    overlaps = np.array([[0.5], [0.51], [0.2]])
    _, labels = match(overlaps, 0.5, 0.5, allow_low_quality=False, strict=True)
    np.testing.assert_array_equal(labels, [0, 1, 0])


def test_match_ties_make_every_best_row_positive():
    overlaps = np.array(
        [
            [0.30, 0.0, 0.1],
            [0.10, 0.0, 0.1],
            [0.30, 0.0, 0.2],  # ties with row 0 for gt 0
            [0.05, 0.0, 0.2],  # ties with row 2 for gt 2, and gt 2's IoU beats gt 0's here
        ]
    )
    matched, labels = match(overlaps, 0.5, 0.4)
    np.testing.assert_array_equal(labels, [1, 0, 1, 1])  # gt 1 has max 0: gives no positive
    np.testing.assert_array_equal(matched, [0, 0, 0, 2])  # argmax, first column on ties


def test_match_without_gts_or_rows():
    matched, labels = match(np.zeros((4, 0)), 0.5, 0.4)
    np.testing.assert_array_equal(labels, [0, 0, 0, 0])
    np.testing.assert_array_equal(matched, [-1, -1, -1, -1])
    matched, labels = match(np.zeros((0, 3)), 0.5, 0.4)
    assert matched.shape == labels.shape == (0,)
    with pytest.raises(ValueError, match="neg_thresh"):
        match(np.zeros((1, 1)), 0.3, 0.4)


def test_match_on_real_anchors_finds_each_gts_best_anchor():
    anchors = grid_anchors(base_anchors(16, RATIOS, SCALES), 8, 8, 16)
    gts = np.array([[40, 40, 49, 47], [10, 60, 100, 90]], np.float32)  # a small gt no anchor reaches 0.5 for
    overlaps = bbox_overlaps(anchors, gts)
    matched, labels = match(overlaps, 0.5, 0.4)
    assert overlaps[:, 0].max() < 0.5
    assert labels[overlaps[:, 0].argmax()] == 1
    assert np.all(labels[overlaps.max(axis=1) >= 0.5] == 1)
    assert np.all(labels[(overlaps.max(axis=1) < 0.4) & (labels != 1)] == 0)


def test_ignore_near_invalid():
    labels = np.array([1, 0, 1, 0, -1], np.int32)
    invalid = np.array([[0.31, 0.0], [0.0, 0.30], [0.1, 0.9], [0.0, 0.0], [0.5, 0.0]])
    got = ignore_near_invalid(labels, invalid, 0.3)
    np.testing.assert_array_equal(got, [-1, 0, -1, 0, -1])  # positives are not spared, 0.30 is not above
    np.testing.assert_array_equal(labels, [1, 0, 1, 0, -1])  # input untouched
    np.testing.assert_array_equal(ignore_near_invalid(labels, np.zeros((5, 0)), 0.3), labels)
    with pytest.raises(ValueError, match="rows"):
        ignore_near_invalid(labels, np.zeros((4, 1)), 0.3)


# ---------------------------------------------------------------- sampler


@pytest.mark.parametrize("make_rng", [np.random.default_rng, np.random.RandomState])
def test_subsample_bounds_over_many_seeds(make_rng):
    draw = np.random.default_rng(123)
    batch_size, fg_fraction = 256, 0.5
    kept_positive_sets = set()
    for seed in range(200):
        n = int(draw.integers(0, 2000))
        labels = draw.choice(np.array([-1, 0, 1], np.int32), n, p=draw.dirichlet([1, 1, 1]))
        got = subsample(labels, batch_size, fg_fraction, make_rng(seed))
        positives, negatives = int((labels == 1).sum()), int((labels == 0).sum())
        kept_pos, kept_neg = int((got == 1).sum()), int((got == 0).sum())
        assert kept_pos == min(positives, int(fg_fraction * batch_size))
        assert kept_neg == min(negatives, batch_size - kept_pos)
        assert kept_pos + kept_neg <= batch_size
        assert np.all((got == labels) | (got == -1))  # only ever drops labels
        assert got.dtype == labels.dtype and got is not labels
        if positives > 128:
            kept_positive_sets.add(tuple(np.flatnonzero(got == 1)[:5]))
    assert len(kept_positive_sets) > 10  # the choice really is random, not "the first ones"


def test_subsample_is_reproducible_and_validates():
    labels = np.random.default_rng(5).integers(-1, 2, 5000)
    first = subsample(labels, 256, 0.25, np.random.default_rng(9))
    np.testing.assert_array_equal(first, subsample(labels, 256, 0.25, np.random.default_rng(9)))
    assert (first == 1).sum() == 64 and (first == 0).sum() == 192
    with pytest.raises(ValueError, match="fg_fraction"):
        subsample(labels, 256, 1.5, np.random.default_rng(0))
