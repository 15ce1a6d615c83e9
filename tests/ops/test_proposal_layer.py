"""The test-time proposal layer with the reference's rules, against MXNet's stock MultiProposal where the
two agree and hand-worked cases where they do not."""
import json

import mxnet as mx
import numpy as np
import pytest

from lib.config import load_config
from lib.boxes.proposals import proposals
from symbols import inference_symbol

SCALES, RATIOS = (2, 4, 7, 10, 13, 16, 24), (0.5, 1, 2)
A = len(SCALES) * len(RATIOS)


def random_rpn(rng, batch, height, width):
    """Softmax-like (B, 2A, H, W) scores (background, then foreground channels) and small deltas."""
    fg = rng.uniform(0, 1, (batch, A, height, width)).astype(np.float32)
    deltas = rng.normal(0, 0.2, (batch, 4 * A, height, width)).astype(np.float32)
    return np.concatenate([1 - fg, fg], axis=1), deltas


def stock(cls_prob, bbox_pred, im_info, scales=SCALES, ratios=RATIOS, pre=12000, post=300, min_size=3):
    out = mx.nd.contrib.MultiProposal(mx.nd.array(cls_prob), mx.nd.array(bbox_pred), mx.nd.array(im_info),
                                      feature_stride=16, scales=scales, ratios=ratios, rpn_pre_nms_top_n=pre,
                                      rpn_post_nms_top_n=post, threshold=0.7, rpn_min_size=min_size,
                                      output_score=True)
    return out[0].asnumpy(), out[1].asnumpy()


def test_same_proposals_as_the_stock_operator_where_it_masks_nothing():
    # images filling canvases of whole feature cells: the stock operator's masking of cells beyond the
    # image does not apply, and both follow the same rules
    rng = np.random.default_rng(0)
    cls_prob, bbox_pred = random_rpn(rng, 2, 4, 5)
    im_info = np.array([[64, 80, 1.0], [64, 80, 1.0]], np.float32)
    rois, scores = proposals(cls_prob, bbox_pred, im_info, 16, SCALES, RATIOS, 12000, 50, 0.7, 3)
    expected_rois, expected_scores = stock(cls_prob, bbox_pred, im_info, post=50)
    np.testing.assert_array_equal(rois, expected_rois)
    np.testing.assert_array_equal(scores, expected_scores)


def test_anchors_of_the_last_partial_feature_row_are_candidates():
    # a 70 x 90 image: feature map 5 x 6, of which the stock operator keeps int(70/16) = 4 rows and
    # int(90/16) = 5 columns. One anchor in the last row (h = 4, w = 1) scores best, deltas are zero.
    cls_prob = np.full((1, 2 * A, 5, 6), 0.1, np.float32)
    anchor = 1 * len(SCALES) + 0  # ratio-major: ratio 1 (index 1), scale 2 (index 0)
    cls_prob[0, A + anchor, 4, 1] = 0.9
    bbox_pred = np.zeros((1, 4 * A, 5, 6), np.float32)
    im_info = np.array([[70, 90, 1.0]], np.float32)
    rois, scores = proposals(cls_prob, bbox_pred, im_info, 16, SCALES, RATIOS, 12000, 10, 0.7, 3)
    # base anchor ratio 1, scale 2: 32 x 32 centred on (7.5, 7.5) -> [-8, -8, 23, 23]; shifted by
    # (16, 64): [8, 56, 39, 87], clipped to the 90 x 70 image: [8, 56, 39, 69]
    np.testing.assert_array_equal(rois[0], [0, 8, 56, 39, 69])
    assert scores[0, 0] == np.float32(0.9)
    stock_rois, _ = stock(cls_prob, bbox_pred, im_info, post=10)
    assert not np.any(np.all(stock_rois[:, 1:] == [8, 56, 39, 69], axis=1))


def test_minimum_size_is_in_scaled_pixels_whatever_the_image_scale():
    # one 16 x 16 anchor (ratio 1, scale 1) on a 1 x 1 map, centred on 7.5: a width exp(dw) * 16 of
    # 3.2 px ([6.4, 8.6]) is kept, 2.5 px is dropped; im_info's scale (2 here) plays no part
    cls_prob = np.array([0.2, 0.8], np.float32).reshape(1, 2, 1, 1)
    for width, kept in ((3.2, True), (2.5, False)):
        bbox_pred = np.array([0, 0, np.log(width / 16), 0], np.float32).reshape(1, 4, 1, 1)
        rois, scores = proposals(cls_prob, bbox_pred, np.array([[16, 16, 2.0]], np.float32), 16, (1,), (1,),
                                 12000, 2, 0.7, 3)
        if kept:
            np.testing.assert_allclose(rois[0], [0, 6.4, 0, 8.6, 15], atol=1e-5)
            assert scores[0, 0] == np.float32(0.8)
        else:  # nothing survives: the whole image stands in, with score 0
            np.testing.assert_array_equal(rois, [[0, 0, 0, 15, 15]] * 2)
            assert not scores.any()


def test_only_the_pre_nms_best_take_part_and_the_output_repeats_the_kept():
    rng = np.random.default_rng(1)
    cls_prob, bbox_pred = random_rpn(rng, 1, 3, 3)
    im_info = np.array([[48, 48, 1.0]], np.float32)
    rois, scores = proposals(cls_prob, bbox_pred, im_info, 16, SCALES, RATIOS, 1, 4, 0.7, 3)
    best = np.unravel_index(np.argmax(cls_prob[0, A:]), (A, 3, 3))
    assert scores[0, 0] == cls_prob[0, A + best[0], best[1], best[2]]
    np.testing.assert_array_equal(rois, np.repeat(rois[:1], 4, axis=0))


def test_test_graph_uses_the_configured_layer_with_the_same_outputs():
    for layer, op in (("reference", "Custom"), ("stock", "_contrib_MultiProposal")):
        cfg = load_config(None, [("symbol", "resnet_tiny"), ("TEST.PROPOSAL_LAYER", layer)])
        symbol = inference_symbol(cfg, 3)
        ops = {node["op"] for node in json.loads(symbol.tojson())["nodes"]}
        assert op in ops
        assert symbol.list_outputs()[0] == "rois_output"
        assert inference_symbol(cfg, None, rpn_only=True).list_outputs()[:2] == ["rois_output", "rois_score"]


def introsort_model(scores):
    """An independent model of libstdc++'s std::sort (median-of-three Hoare partitions down to
    16-element runs, then one insertion sort) on indices by descending score; it refuses inputs that
    would reach the heapsort fallback, which the cases below do not."""
    order, higher = list(range(len(scores))), lambda a, b: scores[a] > scores[b]

    def partition_loop(first, last, depth):
        while last - first > 16:
            assert depth > 0, "would fall back to heapsort"
            depth -= 1
            a, b, c = first + 1, first + (last - first) // 2, last - 1  # median of three to the front
            x, y, z = order[a], order[b], order[c]
            if higher(x, y):
                pick = b if higher(y, z) else (c if higher(x, z) else a)
            else:
                pick = a if higher(x, z) else (c if higher(y, z) else b)
            order[first], order[pick] = order[pick], order[first]
            lo, hi, pivot = first + 1, last, order[first]
            while True:
                while higher(order[lo], pivot):
                    lo += 1
                hi -= 1
                while higher(pivot, order[hi]):
                    hi -= 1
                if not lo < hi:
                    break
                order[lo], order[hi] = order[hi], order[lo]
                lo += 1
            partition_loop(lo, last, depth)
            last = lo

    partition_loop(0, len(order), 2 * (len(order).bit_length() - 1))
    for i in range(1, len(order)):  # insertion sort (the guarded and unguarded variants agree)
        value, j = order[i], i
        while j > 0 and higher(value, order[j - 1]):
            order[j] = order[j - 1]
            j -= 1
        order[j] = value
    return order


def test_anchors_are_ranked_in_std_sort_order_ties_included():
    from lib.boxes._proposal_host import std_sort_descending

    rng = np.random.default_rng(5)
    for size, levels in ((10, 3), (40, 4), (300, 7), (2000, 50)):
        scores = rng.integers(0, levels, size).astype(np.float32) / levels  # many equal scores
        order = std_sort_descending(scores)
        assert sorted(order) == list(range(size)) and np.all(np.diff(scores[order]) <= 0)
        assert order.tolist() == introsort_model(scores)
    ties = std_sort_descending(np.zeros(40, np.float32))
    assert ties.tolist() != list(range(40))  # not a stable sort: equal scores move


def _libm_expf():
    import ctypes
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return libm.expf


def test_deltas_are_exponentiated_with_the_c_library_s_expf():
    # the reference's `exp(dw)` on a float is the C library's expf, which for a few values in ten thousand
    # is not the correctly rounded exp that float32(exp(double)) gives; the layer follows expf
    from lib.boxes._proposal_host import c_expf

    expf = _libm_expf()
    values = np.random.default_rng(7).normal(0, 0.5, 20000).astype(np.float32)
    by_libm = np.array([expf(float(v)) for v in values], np.float32)
    np.testing.assert_array_equal(c_expf(values.reshape(100, 200)), by_libm.reshape(100, 200))
    # one 16 x 16 anchor centred on (7.5, 7.5) on a 1 x 1 map, width 16 exp(dw) < 16:
    # x1 = 7.5 - 0.5 * (16 exp(dw) - 1), small, so a last-bit change of exp(dw) shows in it
    def x1(exp_dw):
        return np.float32(np.float32(7.5) - 0.5 * (np.float64(np.float32(exp_dw) * np.float32(16)) - 1.0))

    shown = [v for v, e in zip(values, by_libm) if v < 0 and x1(e) != x1(np.exp(np.float64(v)))]
    if not shown:
        pytest.skip("this C library's expf is correctly rounded on the sample")
    cls_prob = np.array([0.2, 0.8], np.float32).reshape(1, 2, 1, 1)
    bbox_pred = np.array([0, 0, shown[0], 0], np.float32).reshape(1, 4, 1, 1)
    rois, _ = proposals(cls_prob, bbox_pred, np.array([[100, 100, 1.0]], np.float32), 16, (1,), (1,),
                        12000, 1, 0.7, 3)
    assert rois[0, 1] == x1(expf(float(shown[0])))


def test_nms_overlap_is_float32_as_the_reference_computes_it():
    from lib.boxes._proposal_host import greedy_nms_float32

    def overlaps(a, b):  # the reference's steps: float32 sizes (+1), intersection, union; double for contrast
        f = np.float32
        area = lambda r: (r[2] - r[0] + f(1)) * (r[3] - r[1] + f(1))  # noqa: E731
        w = max(f(0), min(a[2], b[2]) - max(a[0], b[0]) + f(1))
        h = max(f(0), min(a[3], b[3]) - max(a[1], b[1]) + f(1))
        inter32 = w * h
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        inter64 = ((min(a64[2], b64[2]) - max(a64[0], b64[0]) + 1) * (min(a64[3], b64[3]) - max(a64[1], b64[1]) + 1))
        union64 = (a64[2] - a64[0] + 1) * (a64[3] - a64[1] + 1) + (b64[2] - b64[0] + 1) * (b64[3] - b64[1] + 1)
        return inter32 / (area(a) + area(b) - inter32), inter64 / (union64 - inter64)

    # two boxes of equal size shifted along x, their overlap within 1e-7 of the threshold 0.7
    above = np.array([[187.04692, 233.00493, 374.81787, 509.02127],
                      [220.35944, 233.00493, 408.1304, 509.02127]], np.float32)
    below = np.array([[98.91952, 236.52861, 196.84601, 378.043],
                      [116.37713, 236.52861, 214.30362, 378.043]], np.float32)
    single32, single64 = overlaps(*above)
    assert single32 > 0.7 >= single64  # float32: suppressed; exact: kept
    np.testing.assert_array_equal(greedy_nms_float32(above, 0.7, 10), [0])
    single32, single64 = overlaps(*below)
    assert single64 > 0.7 >= single32  # exact: suppressed; float32: kept
    np.testing.assert_array_equal(greedy_nms_float32(below, 0.7, 10), [0, 1])
    np.testing.assert_array_equal(greedy_nms_float32(np.concatenate([below, above + 1000]), 0.7, 2), [0, 1])


def test_an_image_s_proposals_on_a_shared_canvas_do_not_depend_on_its_companions():
    # The reference's operator treats every image of a batch on its own (its im_info extent, its ranking and
    # NMS); the network's maps of an image do not change with the other images of the canvas either. The
    # detector relies on it: a batch whose other member is a padding repeat runs without it.
    from network_helpers import bind_random, inference_shapes

    cfg = load_config(None, [("symbol", "resnet_tiny"), ("TEST.fp16", "false")])
    symbol = inference_symbol(cfg, None, rpn_only=True)
    rng = np.random.default_rng(0)
    large = rng.uniform(-100, 100, (3, 64, 96)).astype(np.float32)
    small = np.zeros((3, 64, 96), np.float32)
    small[:, :40, :50] = rng.uniform(-100, 100, (3, 40, 50))
    outputs = {}
    cases = (("alone", [small], [[40, 50, 1]]), ("second", [large, small], [[64, 96, 1], [40, 50, 1]]),
             ("first", [small, large], [[40, 50, 1], [64, 96, 1]]))
    for name, images, info in cases:
        executor, _ = bind_random(symbol, inference_shapes(len(images), 64) | {"data": (len(images), 3, 64, 96)}, 3)
        executor.arg_dict["data"][:] = np.stack(images)
        executor.arg_dict["im_info"][:] = np.array(info, np.float32)
        rois, scores = (o.asnumpy() for o in executor.forward(is_train=False)[:2])
        slot = 1 if name == "second" else 0
        outputs[name] = rois.reshape(len(images), -1, 5)[slot, :, 1:], scores.reshape(len(images), -1)[slot]
    for name in ("second", "first"):
        np.testing.assert_array_equal(outputs[name][0], outputs["alone"][0])
        np.testing.assert_array_equal(outputs[name][1], outputs["alone"][1])
    assert outputs["alone"][0][:, 2].max() <= 49 and outputs["alone"][0][:, 3].max() <= 39  # x2, y2: its own extent
