"""IoU, containment, box coding, clipping, NMS and soft-NMS against hand-worked and reference values."""
import math

import numpy as np
import pytest

from lib.boxes import bbox_overlaps, clip_boxes, decode, encode, ignore_overlaps, nms, soft_nms

SQUARE = [0, 0, 9, 9]  # 10 x 10 pixels, inclusive


def random_boxes(rng, n, size=200.0, max_side=60.0):
    x1y1 = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(0, max_side, (n, 2))
    return np.hstack([x1y1, x1y1 + wh]).astype(np.float32)


def numpy_iou(a, b):
    """Independent reference: broadcast inclusive IoU in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]) + 1, 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]) + 1, 0, None)
    area = lambda x: (x[:, 2] - x[:, 0] + 1) * (x[:, 3] - x[:, 1] + 1)
    inter = iw * ih
    return inter / (area(a)[:, None] + area(b)[None, :] - inter), inter / area(a)[:, None]


def python_nms(dets, thresh):
    """Plain-Python greedy NMS: highest score first, lower index first on ties."""
    def iou(p, q):
        iw = min(p[2], q[2]) - max(p[0], q[0]) + 1
        ih = min(p[3], q[3]) - max(p[1], q[1]) + 1
        if iw <= 0 or ih <= 0:
            return 0.0
        inter = iw * ih
        return inter / ((p[2] - p[0] + 1) * (p[3] - p[1] + 1) + (q[2] - q[0] + 1) * (q[3] - q[1] + 1) - inter)

    rows = [tuple(float(v) for v in row) for row in dets]
    order = sorted(range(len(rows)), key=lambda i: (-rows[i][4], i))
    keep = []
    for i in order:
        if all(iou(rows[i], rows[k]) <= thresh for k in keep):
            keep.append(i)
    return keep


# ---------------------------------------------------------------- overlaps and containment


@pytest.mark.parametrize(
    "box, expected_iou",
    [
        (SQUARE, 1.0),
        ([5, 5, 14, 14], 25 / 175),  # 5 x 5 corner overlap of two 10 x 10 boxes
        ([9, 0, 18, 9], 10 / 190),  # sharing one pixel column: 1 x 10 with the +1 convention
        ([10, 0, 19, 9], 0.0),  # adjacent, no shared pixel
        ([2, 2, 5, 5], 16 / 100),  # 4 x 4 box inside
        ([3, 3, 3, 3], 1 / 100),  # a single pixel inside
        ([-5, 2, 14, 7], 60 / 160),  # 20 x 6 bar across the square: 10 x 6 inside
    ],
)
def test_bbox_overlaps_hand_cases(box, expected_iou):
    got = bbox_overlaps(np.array([SQUARE], np.float32), np.array([box], np.float32))
    assert got.shape == (1, 1) and got.dtype == np.float32
    assert got[0, 0] == pytest.approx(expected_iou, rel=1e-6)
    assert bbox_overlaps([box], [SQUARE])[0, 0] == pytest.approx(expected_iou, rel=1e-6)  # symmetric


def test_ignore_overlaps_is_fraction_of_the_first_box_inside():
    inner, bar = [2, 2, 5, 5], [-5, 2, 14, 7]
    got = ignore_overlaps(np.array([inner, SQUARE, bar]), np.array([SQUARE, inner, [50, 50, 60, 60]]))
    expected = [[1.0, 1.0, 0.0], [1.0, 16 / 100, 0.0], [60 / 120, 16 / 120, 0.0]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_overlaps_match_numpy_reference_on_random_boxes():
    rng = np.random.default_rng(0)
    boxes, query = random_boxes(rng, 300), random_boxes(rng, 40)
    iou, containment = numpy_iou(boxes, query)
    assert (iou > 0).mean() > 0.05  # the draw really has overlaps
    np.testing.assert_allclose(bbox_overlaps(boxes, query), iou, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ignore_overlaps(boxes, query), containment, rtol=1e-5, atol=1e-7)


def test_overlaps_empty_inputs_keep_shape():
    some = random_boxes(np.random.default_rng(1), 3)
    assert bbox_overlaps(np.zeros((0, 4)), some).shape == (0, 3)
    assert bbox_overlaps(some, np.zeros((0, 4), np.float32)).shape == (3, 0)
    assert ignore_overlaps([], some).shape == (0, 3)
    assert bbox_overlaps(some, []).dtype == np.float32


def test_overlaps_accept_float64_int_and_strided_input():
    rng = np.random.default_rng(2)
    dets = np.hstack([random_boxes(rng, 20), rng.random((20, 1), np.float32)]).astype(np.float64)
    boxes = dets[:, :4]  # non-contiguous float64 view
    expected = bbox_overlaps(boxes.astype(np.float32), boxes.astype(np.float32))
    np.testing.assert_array_equal(bbox_overlaps(boxes, boxes), expected)
    np.testing.assert_array_equal(bbox_overlaps(np.asfortranarray(boxes), boxes), expected)
    rounded = np.round(boxes).astype(np.int64)
    np.testing.assert_allclose(bbox_overlaps(rounded, rounded), numpy_iou(rounded, rounded)[0], rtol=1e-6)


def test_bad_shapes_and_dtypes_are_named():
    with pytest.raises(ValueError, match=r"bbox_overlaps: query must have shape \(N, 4\), got \(2, 5\)"):
        bbox_overlaps(np.zeros((3, 4)), np.zeros((2, 5)))
    with pytest.raises(ValueError, match="nms: dets"):
        nms(np.zeros((3, 4)), 0.5)
    with pytest.raises(TypeError, match="real numbers"):
        ignore_overlaps(np.array([["a", "b", "c", "d"]]), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="method"):
        soft_nms(np.zeros((1, 5)), method="cubic")


# ---------------------------------------------------------------- box coding


def test_encode_hand_case_and_stds():
    roi = np.array([[0, 0, 9, 9]], np.float32)  # centre (4.5, 4.5), 10 x 10
    gt = np.array([[5, 0, 14, 19]], np.float32)  # centre (9.5, 9.5), 10 x 20
    np.testing.assert_allclose(encode(roi, gt), [[0.5, 0.5, 0.0, math.log(2)]], rtol=1e-6)
    np.testing.assert_allclose(
        encode(roi, gt, stds=(0.1, 0.1, 0.2, 0.2)), [[5.0, 5.0, 0.0, math.log(2) / 0.2]], rtol=1e-6
    )
    assert encode(roi, gt).dtype == np.float32
    assert encode(roi.astype(np.float64), gt).dtype == np.float64


def test_decode_hand_case_per_class_and_clamp():
    box = np.array([[0, 0, 9, 9]], np.float32)
    deltas = np.array([[0, 0, 0, 0, 0.5, 0.5, 0.0, math.log(2), 0, 0, 100.0, 0]], np.float32)
    got = decode(box, deltas)
    assert got.shape == (1, 12) and got.dtype == np.float32
    np.testing.assert_allclose(got[0, :4], [0, 0, 9, 9], atol=1e-5)  # zero deltas: the box itself
    np.testing.assert_allclose(got[0, 4:8], [5, 0, 14, 19], atol=1e-5)
    clamped_width = 10 * 1000 / 16  # dw clamped at log(1000/16)
    np.testing.assert_allclose(got[0, 8:], [4.5 - (clamped_width - 1) / 2, 0, 4.5 + (clamped_width - 1) / 2, 9], rtol=1e-5)
    assert np.all(np.isfinite(decode(box, np.full((1, 4), 1e4, np.float32))))
    wide = decode(box, np.float32([[0, 0, math.log(100), 0]]), max_log_scale=np.inf)  # no clamp: 10 px x 100
    np.testing.assert_allclose(wide[0], [4.5 - 999 / 2, 0, 4.5 + 999 / 2, 9], rtol=1e-5)
    # no cap: dw = 100 in float64 scales the width by e**100 (the reference's test decoding)
    wide = decode(box.astype(np.float64), deltas[:, 8:].astype(np.float64), max_log_scale=None)
    np.testing.assert_allclose(wide[0, [0, 2]], [4.5 - (10 * math.exp(100) - 1) / 2, 4.5 + (10 * math.exp(100) - 1) / 2])


def test_encode_decode_round_trip_with_stds():
    rng = np.random.default_rng(3)
    rois, gts = random_boxes(rng, 500).astype(np.float64), random_boxes(rng, 500).astype(np.float64)
    stds = (0.1, 0.1, 0.2, 0.2)
    np.testing.assert_allclose(decode(rois, encode(rois, gts, stds), stds), gts, atol=1e-8)
    assert np.all(np.isfinite(encode(rois, gts)))


def test_coding_empty_and_mismatched_inputs():
    assert encode(np.zeros((0, 4)), np.zeros((0, 4))).shape == (0, 4)
    assert decode(np.zeros((0, 4)), np.zeros((0, 8))).shape == (0, 8)
    with pytest.raises(ValueError, match="same number of rows"):
        encode(np.zeros((2, 4)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"decode: deltas must have shape \(N, 4k\)"):
        decode(np.zeros((2, 4)), np.zeros((2, 6)))
    with pytest.raises(ValueError, match="stds"):
        encode(np.zeros((1, 4)), np.zeros((1, 4)), stds=(1, 1, 1))


def test_clip_boxes_multi_class():
    boxes = np.array([[-5, -3, 120, 50, 10, 20, 30, 90]], np.float32)
    got = clip_boxes(boxes, height=60, width=100)
    np.testing.assert_array_equal(got, [[0, 0, 99, 50, 10, 20, 30, 59]])
    assert boxes[0, 0] == -5  # input untouched
    with pytest.raises(ValueError, match="height and width"):
        clip_boxes(boxes, 0, 100)


# ---------------------------------------------------------------- NMS


def test_nms_hand_case():
    dets = np.array(
        [
            [0, 0, 9, 9, 0.6],
            [1, 1, 10, 10, 0.9],  # IoU 81/119 = 0.68 with row 0
            [20, 20, 29, 29, 0.7],
            [5, 1, 14, 10, 0.8],  # IoU 45/155 = 0.29 with row 0, 60/140 = 0.43 with row 1
        ],
        np.float32,
    )
    np.testing.assert_array_equal(nms(dets, 0.5), [1, 3, 2])
    np.testing.assert_array_equal(nms(dets, 0.4), [1, 2])
    np.testing.assert_array_equal(nms(dets, 0.7), [1, 3, 2, 0])
    assert nms(dets, 0.5).dtype == np.int64
    # max_kept stops the scan: the first two kept of the full run, suppression of later rows unchanged
    np.testing.assert_array_equal(nms(dets, 0.7, max_kept=2), [1, 3])
    np.testing.assert_array_equal(nms(dets, 0.4, max_kept=0), np.zeros(0, np.int64))


def test_nms_ties_keep_lower_index_and_identical_boxes_suppress():
    dets = np.array([[0, 0, 9, 9, 0.5], [0, 0, 9, 9, 0.5], [0, 0, 9, 9, 0.5]], np.float64)
    np.testing.assert_array_equal(nms(dets, 0.99), [0])
    np.testing.assert_array_equal(nms(dets, 1.0), [0, 1, 2])  # IoU 1 is not above 1


@pytest.mark.parametrize("thresh", [0.3, 0.5, 0.7])
def test_nms_matches_python_reference(thresh):
    rng = np.random.default_rng(int(thresh * 10))
    centres = rng.uniform(0, 300, (15, 2))  # clusters, so suppression really happens
    xy = centres[rng.integers(0, 15, 400)] + rng.normal(0, 6, (400, 2))
    wh = rng.uniform(20, 40, (400, 2))
    dets = np.hstack([xy, xy + wh, rng.random((400, 1))]).astype(np.float32)
    keep = nms(dets, thresh)
    assert 15 <= len(keep) < 400
    assert keep.tolist() == python_nms(dets, thresh)


def test_nms_empty_input():
    keep = nms(np.zeros((0, 5), np.float32), 0.5)
    assert keep.shape == (0,) and keep.dtype == np.int64
    assert nms([], 0.5).shape == (0,)


# ---------------------------------------------------------------- soft-NMS


def iou_of(a, b):
    return float(numpy_iou([a[:4]], [b[:4]])[0][0, 0])


def test_soft_nms_gaussian_decay_by_hand():
    a, b, c = [0, 0, 9, 9, 0.9], [1, 1, 10, 10, 0.8], [5, 0, 14, 9, 0.75]
    dets = np.array([b, a, c, [100, 100, 120, 120, 0.3]], np.float64)
    got = soft_nms(dets, sigma=0.5, score_thresh=0.001, method="gaussian")
    # a is kept first and decays b and c; the higher of them is kept next and decays the other.
    b_score = 0.8 * math.exp(-iou_of(a, b) ** 2 / 0.5)  # IoU 81/119
    c_score = 0.75 * math.exp(-iou_of(a, c) ** 2 / 0.5)  # IoU 50/150
    assert c_score > b_score
    b_score *= math.exp(-iou_of(c, b) ** 2 / 0.5)
    assert got.shape == (4, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got[:, :4], [a[:4], c[:4], [100, 100, 120, 120], b[:4]])
    np.testing.assert_allclose(got[:, 4], [0.9, c_score, 0.3, b_score], rtol=1e-6)
    assert np.all(np.diff(got[:, 4]) <= 0)


def test_soft_nms_linear_and_score_threshold():
    a, b, far = [0, 0, 9, 9, 0.9], [1, 1, 10, 10, 0.8], [50, 50, 59, 59, 0.0005]
    overlap = 81 / 119
    got = soft_nms(np.array([a, b, far]), method="linear", iou_thresh=0.3, score_thresh=0.001)
    np.testing.assert_allclose(got[:, 4], [0.9, 0.8 * (1 - overlap)], rtol=1e-6)  # far is below 0.001
    untouched = soft_nms(np.array([a, b]), method="linear", iou_thresh=0.7)
    np.testing.assert_allclose(untouched[:, 4], [0.9, 0.8], rtol=1e-6)  # IoU 0.68 is not above 0.7
    dropped = soft_nms(np.array([a, b]), method="gaussian", score_thresh=0.5)
    assert dropped.shape == (1, 5)  # 0.8 * exp(-0.68**2 / 0.5) = 0.32 < 0.5


def test_soft_nms_hard_equals_nms():
    rng = np.random.default_rng(7)
    xy = rng.uniform(0, 100, (300, 2))
    dets = np.hstack([xy, xy + rng.uniform(10, 40, (300, 2)), rng.uniform(0.01, 1, (300, 1))]).astype(np.float32)
    got = soft_nms(dets, method="hard", iou_thresh=0.5, score_thresh=0.001)
    np.testing.assert_array_equal(got, dets[nms(dets, 0.5)])


def test_soft_nms_empty_input():
    assert soft_nms(np.zeros((0, 5))).shape == (0, 5)
    assert soft_nms([]).dtype == np.float32
