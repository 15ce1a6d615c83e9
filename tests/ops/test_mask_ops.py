"""The compiled mask operators (MultiProposalTargetMask, MaskRcnnTarget) against dev/oracles/mask_target.py
(a Python transcription of the reference fork's GPU kernels) on random chips, against pycocotools (COCO's
own rasteriser), and on hand-worked cases; and the reference's own mask-symbol calls built on them."""
import functools

import mxnet as mx
import numpy as np
import pycocotools.mask as coco_mask
import pytest

import lib.ops
from dev.oracles import mask_target

FORK_DEFAULTS = dict(rpn_pre_nms_top_n=6000, rpn_post_nms_top_n=300, threshold=0.7, feature_stride=16,
                     scales=(2, 4, 7, 10, 13, 16, 24), ratios=(0.5, 1, 2), max_gts=100, max_masks=50)
NUM_ANCHORS = 21
ONE_ANCHOR = dict(scales=(1,), ratios=(1,))  # one 16 x 16 anchor [0, 0, 15, 15] per cell


def run_proposal_op(inputs, **attrs):
    return [out.asnumpy() for out in mx.nd.MultiProposalTargetMask(*(mx.nd.array(x) for x in inputs), **attrs)]


def run_mask_op(rois, polys, ids, **attrs):
    return [out.asnumpy() for out in mx.nd.MaskRcnnTarget(mx.nd.array(rois), mx.nd.array(polys), mx.nd.array(ids),
                                                          **attrs)]


def random_chips(rng, valid_ranges, feat=17, size=272, num_gts=10, score_levels=None):
    """RPN outputs (softmax), deltas, gts in the first rows (the loader's layout) with -1 padding."""
    batch = len(valid_ranges)
    logits = rng.normal(0, 2, (batch, 2, NUM_ANCHORS, feat, feat))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    if score_levels:  # coarse scores: thousands of exact ties, which only the fork's sort order breaks
        probs = np.round(probs * score_levels) / score_levels
    cls_prob = probs.reshape(batch, 2 * NUM_ANCHORS, feat, feat).astype(np.float32)
    bbox_pred = rng.normal(0, 0.3, (batch, 4 * NUM_ANCHORS, feat, feat)).astype(np.float32)
    im_info = np.tile(np.float32([size, size, 1.0]), (batch, 1))
    gt_boxes = np.full((batch, 100, 5), -1, np.float32)
    for b in range(batch):
        corner = rng.uniform(0, size - 40, (num_gts, 2))
        gt_boxes[b, :num_gts, :2] = corner
        gt_boxes[b, :num_gts, 2:4] = np.minimum(corner + rng.uniform(12, 150, (num_gts, 2)), size - 1)
        gt_boxes[b, :num_gts, 4] = rng.integers(1, 81, num_gts)
    return cls_prob, bbox_pred, im_info, gt_boxes, np.float32(valid_ranges)


def assert_proposal_outputs_equal(outputs, expected):
    names = ["rois", "label", "bbox_target", "bbox_weight", "mask_rois", "mask_ids"]
    for name, got, want in zip(names, outputs, expected):
        assert got.shape == want.shape, name
        if name == "bbox_target":  # log: the C library's in the operator, NumPy's in the transcription
            np.testing.assert_array_max_ulp(got, want, maxulp=1)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


# ---- the reference's mask symbol ------------------------------------------------------------------

def test_reference_symbol_calls_build_and_infer_shapes():
    """The two calls of symbols/faster/resnet_mx_101_e2e_mask.py as written there (inputs by keyword,
    the same attributes), then its use of the outputs, infer the fork's shapes."""
    batch_images = 2
    rpn_cls_prob, rpn_bbox_pred, im_info, gt_boxes, valid_ranges, gt_masks, mask_pred = (
        mx.sym.var(name) for name in ("rpn_cls_prob", "rpn_bbox_pred", "im_info", "gt_boxes", "valid_ranges",
                                      "gt_masks", "mask_pred"))
    rois, label, bbox_target, bbox_weight, mask_rois, mask_ids = mx.sym.MultiProposalTargetMask(
        cls_prob=rpn_cls_prob, bbox_pred=rpn_bbox_pred, im_info=im_info,
        gt_boxes=gt_boxes, valid_ranges=valid_ranges, batch_size=batch_images, name='multi_proposal_target_mask')
    label = mx.symbol.Reshape(data=label, shape=(-1,), name='label_reshape')
    mask_targets, mask_ncls_ids = mx.sym.MaskRcnnTarget(
        rois=mask_rois, mask_polys=gt_masks, mask_ids=mask_ids,
        batch_size=batch_images, mask_size=28, num_proposals=50, max_polygon_len=500, max_num_gts=100,
        num_classes=80)
    pmask_pred = mx.sym.pick(mask_pred, index=mask_ncls_ids + 80, axis=1, keepdims=True)
    nmask_pred = mx.sym.pick(mask_pred, index=mask_ncls_ids, axis=1, keepdims=True)
    mask_prob = mx.sym.SoftmaxOutput(data=mx.sym.Concat(nmask_pred, pmask_pred), label=mask_targets,
                                     multi_output=True, normalization='valid', use_ignore=True, ignore_label=-1)
    group = mx.sym.Group([rois, label, bbox_target, bbox_weight, mask_rois, mask_ids, mask_targets, mask_prob])
    _, shapes, _ = group.infer_shape(rpn_cls_prob=(2, 42, 32, 32), rpn_bbox_pred=(2, 84, 32, 32), im_info=(2, 3),
                                     gt_boxes=(2, 100, 5), valid_ranges=(2, 2), gt_masks=(2, 100, 500),
                                     mask_pred=(100, 160, 28, 28))
    assert shapes == [(600, 5), (600,), (600, 4), (600, 4), (100, 5), (100, 1), (100, 28, 28), (100, 2, 28, 28)]
    # the reference feeds the softmax's (B, 2, A*H, W) view of the scores: the same shapes out
    _, shapes_as_fed, _ = group.infer_shape(rpn_cls_prob=(2, 2, 21 * 32, 32), rpn_bbox_pred=(2, 84, 32, 32),
                                            im_info=(2, 3), gt_boxes=(2, 100, 5), valid_ranges=(2, 2),
                                            gt_masks=(2, 100, 500), mask_pred=(100, 160, 28, 28))
    assert shapes_as_fed == shapes


@pytest.mark.parametrize("op_name", ["MultiProposalTargetMask", "MultiProposalTarget"])
def test_scores_in_the_two_channel_view_give_the_same_outputs(op_name):
    """(B, 2, A*H, W) is the memory of (B, 2A, H, W): identical outputs, the map size read from bbox_pred."""
    rng = np.random.default_rng(4)
    inputs = list(random_chips(rng, [[0, 272], [16, 200]]))
    op = getattr(mx.nd, op_name)
    from lib.config import load_config

    attrs = {"batch_size": 2} if op_name == "MultiProposalTargetMask" else \
        lib.ops.proposal_target_attrs(load_config(None), 16)
    stacked = [out.asnumpy() for out in op(*(mx.nd.array(x) for x in inputs), **attrs)]
    inputs[0] = inputs[0].reshape(2, 2, -1, inputs[0].shape[3])
    viewed = [out.asnumpy() for out in op(*(mx.nd.array(x) for x in inputs), **attrs)]
    for got, want in zip(viewed, stacked):
        np.testing.assert_array_equal(got, want)


def test_inputs_by_position_or_keyword_not_both():
    data = [mx.sym.var(name) for name in "abcde"]
    positional = mx.sym.MultiProposalTargetMask(*data)
    mixed = mx.sym.MultiProposalTargetMask(data[0], data[1], im_info=data[2], gt_boxes=data[3], valid_ranges=data[4])
    assert positional.list_arguments() == mixed.list_arguments() == list("abcde")
    with pytest.raises(TypeError, match="input cls_prob given both by position and by name"):
        mx.sym.MultiProposalTargetMask(*data, cls_prob=data[0])
    with pytest.raises(TypeError, match="takes the 3 inputs rois, mask_polys, mask_ids"):
        mx.sym.MaskRcnnTarget(rois=data[0], mask_ids=data[1])


@pytest.mark.parametrize("call, message", [
    (lambda s: mx.sym.MultiProposalTargetMask(*s[:5], max_gts=50),
     "input gt_boxes must have shape (B, max_gts, 5) with max_gts = 50, got (2, 100, 5)"),
    (lambda s: mx.sym.MultiProposalTargetMask(*s[:5], rpn_nms_top_n=5), "unknown attribute rpn_nms_top_n='5'"),
    (lambda s: mx.sym.MaskRcnnTarget(s[5], s[6], s[7], num_proposals=40),
     "input rois must have shape (B * num_proposals = B * 40, 5), got (100, 5)"),
    (lambda s: mx.sym.MaskRcnnTarget(s[5], s[6], s[7], max_polygon_len=400),
     "input mask_polys must have shape (B, max_num_gts, max_polygon_len) = (B, 100, 400), got (2, 100, 500)"),
])
def test_inconsistent_shapes_and_attributes_are_refused_by_name(call, message):
    names = ["cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges", "rois", "polys", "ids"]
    shapes = dict(zip(names, [(2, 42, 32, 32), (2, 84, 32, 32), (2, 3), (2, 100, 5), (2, 2), (100, 5),
                              (2, 100, 500), (100, 1)]))
    with pytest.raises(mx.base.MXNetError) as excinfo:
        symbol = call([mx.sym.var(name) for name in names])
        symbol.infer_shape(**{name: shapes[name] for name in symbol.list_arguments()})
    # lib_api repeats every earlier library message in the report: the newest is the last.
    lines = [line for line in str(excinfo.value).splitlines() if "lib/ops/src/" in line]
    assert lines and message in lines[-1], str(excinfo.value)


# ---- MultiProposalTargetMask against the transcription -----------------------------------------------

def test_random_chips_match_transcription_with_score_ties():
    """6069 anchors per chip (the 6000 cap cuts), coarse scores (ties everywhere, ordered by the fork's
    std::sort), -1 open range ends and the loader's 0 / 272; every output identical."""
    rng = np.random.default_rng(0)
    inputs = random_chips(rng, [[0, 272], [16, 200], [-1, 120], [40, -1]], score_levels=16)
    outputs = run_proposal_op(inputs, batch_size=4)
    expected = mask_target.multi_proposal_target_mask(*inputs, **FORK_DEFAULTS)
    assert_proposal_outputs_equal(outputs, expected)
    labels, mask_ids = outputs[1][:, 0], outputs[5][:, 0]
    assert (labels > 0).sum() > 4 * 10  # positives beyond the appended gts
    assert 0 < (mask_ids >= 0).sum() <= 200
    # Not vacuous: ordering equal scores another way (Python's stable sort) changes chip 0's rois.
    def stable_sort(items, less):
        items.sort(key=functools.cmp_to_key(lambda i, j: -1 if less(i, j) else int(less(j, i))))
    boxes, scores, areas = mask_target.fork_proposals(inputs[0][0], inputs[1][0], inputs[2][0], inputs[4][0],
                                                         16, FORK_DEFAULTS["ratios"], FORK_DEFAULTS["scales"])
    kept = mask_target.fork_nms(boxes, scores, areas, 6000, 300, 0.7, sort=stable_sort)
    assert not np.array_equal(outputs[0][:len(kept), 1:], boxes[kept])


def test_fine_scores_and_other_attributes_match_transcription():
    rng = np.random.default_rng(1)
    inputs = random_chips(rng, [[0, 272], [-1, -1], [24, 180]], num_gts=30)
    attrs = dict(rpn_pre_nms_top_n=2000, rpn_post_nms_top_n=120, threshold=0.5, max_masks=20)
    outputs = run_proposal_op(inputs, **attrs)
    assert_proposal_outputs_equal(outputs, mask_target.multi_proposal_target_mask(*inputs, **{**FORK_DEFAULTS,
                                                                                                 **attrs}))
    assert (outputs[5] >= 0).sum() == 60  # more positives than the cap: every mask slot taken


def test_libstdcxx_sort_transcription_sorts_and_keeps_ties_deterministic():
    rng = np.random.default_rng(2)
    for n in (5, 17, 300, 5000):
        keys = rng.integers(0, 7, n).tolist()
        items = list(range(n))
        mask_target.libstdcxx_sort(items, lambda i, j: keys[i] > keys[j])
        assert sorted(items) == list(range(n))
        assert all(keys[a] >= keys[b] for a, b in zip(items, items[1:]))


# ---- MultiProposalTargetMask by hand ----------------------------------------------------------------

def one_anchor_chips(batch, scores, gt_rows, max_gts):
    """A 1 x W map of ONE_ANCHOR anchors, zero deltas (proposal x = cell x's [16x, 0, 16x + 15, 15]) on
    a 16 x 16W chip, the given gt rows first."""
    width = len(scores)
    fg = np.tile(np.float32(scores).reshape(1, 1, 1, width), (batch, 1, 1, 1))
    cls_prob = np.concatenate([1 - fg, fg], axis=1)
    bbox_pred = np.zeros((batch, 4, 1, width), np.float32)
    im_info = np.tile(np.float32([16, 16 * width, 1]), (batch, 1))
    gt_boxes = np.full((batch, max_gts, 5), -1, np.float32)
    gt_boxes[:, :len(gt_rows)] = gt_rows
    valid_ranges = np.tile(np.float32([0, 1000]), (batch, 1))
    return cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges


def cell_box(x):
    return [16 * x, 0, 16 * x + 15, 15]


def test_rois_labels_targets_and_the_batch_wide_mask_cap_by_hand():
    """R = 8 rois per chip: the 4 proposals in score order, padding [t % 100, t % 100, t % 100 + 200, ...],
    gt row t over slot R - 1 - t. Positives (overlap > 0.5): slots 0, 2, 6, 7. With max_masks = 3 the
    batch holds 2 * 3 mask rois, taken in row order: chip 0 gets 4, more than 3, and chip 1 the rest."""
    gts = [cell_box(0) + [3], cell_box(2) + [7]]
    inputs = one_anchor_chips(2, [0.9, 0.8, 0.7, 0.6], gts, max_gts=3)
    attrs = dict(ONE_ANCHOR, rpn_post_nms_top_n=8, max_gts=3, max_masks=3)
    rois, labels, targets, weights, mask_rois, mask_ids = run_proposal_op(inputs, **attrs)
    chip_rois = [cell_box(0), cell_box(1), cell_box(2), cell_box(3), [4, 4, 204, 204], [5, 5, 205, 205],
                 cell_box(2), cell_box(0)]
    np.testing.assert_array_equal(rois[:8], np.hstack([np.zeros((8, 1)), chip_rois]))
    np.testing.assert_array_equal(rois[8:, 0], np.ones(8))
    np.testing.assert_array_equal(labels[:8, 0], [3, 0, 7, 0, 0, 0, 7, 3])
    np.testing.assert_array_equal(weights[:8, 0], [1, 0, 1, 0, 0, 0, 1, 1])
    # A roi on its gt: gt centre x1 + 0.5 * 16 = 8 against the roi's 7.5, so 10 * 0.5 / 16 = 0.3125.
    np.testing.assert_allclose(targets[0], [0.3125, 0.3125, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(targets[1], [1, 1, 1, 1])  # non-positives keep 1
    np.testing.assert_array_equal(mask_rois, [[0] + cell_box(0), [0] + cell_box(2), [0] + cell_box(2),
                                              [0] + cell_box(0), [1] + cell_box(0), [1] + cell_box(2)])
    np.testing.assert_array_equal(mask_ids[:, 0], [0, 1, 1, 0, 0, 1])


def test_mask_roi_padding_and_gt_rules_by_hand():
    """Fewer positives than B * max_masks: row i pads as [i % B, i % 200, i % 200, i % 200 + 100, ...] with
    id -1. Gt row t goes to slot R - 1 - t if its class is not -1 and lo^2 <= area < hi^2 (strict: row 2's
    area is hi^2 = 400, its slot keeps the padding box). Labels come from the first n rows, n = the rows
    of class != -1 (here rows 0 and 1): row 2 would label cell 2's roi (overlap 0.69) but is not read."""
    gts = [cell_box(0) + [3], [-1] * 5, [32, 0, 52, 20, 5]]
    inputs = one_anchor_chips(1, [0.9, 0.8, 0.7], gts, max_gts=4)
    inputs[4][:] = [0, 20]
    rois, labels, _, _, mask_rois, mask_ids = run_proposal_op(inputs, **ONE_ANCHOR, rpn_post_nms_top_n=6, max_gts=4,
                                                              max_masks=4)
    np.testing.assert_array_equal(rois[:, 1:], [cell_box(0), cell_box(1), cell_box(2), [3, 3, 203, 203],
                                                [4, 4, 204, 204], cell_box(0)])
    np.testing.assert_array_equal(labels[:, 0], [3, 0, 0, 0, 0, 3])
    np.testing.assert_array_equal(mask_rois, [[0] + cell_box(0), [0] + cell_box(0), [0, 2, 2, 102, 102],
                                              [0, 3, 3, 103, 103]])
    np.testing.assert_array_equal(mask_ids[:, 0], [0, 0, -1, -1])


# ---- MaskRcnnTarget ---------------------------------------------------------------------------------

def encode(category, segments, length=500):
    """One gt's row in the loader's encoding: category, n, the n lengths, the coordinates; -1 after."""
    row = np.full(length, -1, np.float32)
    values = [category, len(segments)] + [len(s) for s in segments] + [v for s in segments for v in s]
    row[:len(values)] = values
    return row


def test_rasterisation_matches_pycocotools():
    """COCO's rleFrPoly as transcribed, against COCO's own C code, on random polygons with vertices off
    the grid, half-integer and repeated (zero-length edges)."""
    rng = np.random.default_rng(3)
    for trial in range(150):
        xy = rng.uniform(-6, 34, 2 * rng.integers(3, 12))
        if trial % 3 == 0:
            xy = np.round(xy * 2) / 2
        if trial % 4 == 0:
            xy[2:4] = xy[0:2]
        expected = coco_mask.decode(coco_mask.frPyObjects([xy.tolist()], 28, 28))[:, :, 0]
        counts = mask_target.coco_rle_from_polygon(xy.tolist(), 28, 28)
        np.testing.assert_array_equal(mask_target.decode_rle(counts, 28, 28).T, expected)


def test_square_polygon_rasterises_to_known_cells():
    """A 28 x 14 px rectangle in a 56 x 56 roi (2 px per cell): cells x 7..20, y 7..13 (COCO's rule: the
    cells whose square lies inside the polygon), category everywhere; a roi without an id is ignored."""
    polys = np.full((1, 100, 500), -1, np.float32)
    polys[0, 4] = encode(12, [[24, 34, 52, 34, 52, 48, 24, 48]])
    rois = np.float32([[0, 10, 20, 66, 76], [0, 10, 20, 66, 76]])
    targets, classes = run_mask_op(rois, polys, np.float32([[4], [-1]]), num_proposals=2)
    expected = np.zeros((28, 28), np.float32)
    expected[7:14, 7:21] = 1
    np.testing.assert_array_equal(targets[0], expected)
    np.testing.assert_array_equal(classes[0], np.full((28, 28), 12))
    np.testing.assert_array_equal(targets[1], np.full((28, 28), -1))
    np.testing.assert_array_equal(classes[1], np.zeros((28, 28)))
    targets, _ = run_mask_op(rois, polys, np.float32([[4], [-1]]), num_proposals=2, ignore_label=255, mask_size=14)
    assert targets.shape == (2, 14, 14) and (targets[1] == 255).all()


def test_segments_union_degenerate_rois_and_malformed_rows():
    """Two segments of one gt are united; a roi narrower than 1 px spans max(1, x2 - x1); an encoding
    without segments gives an all-0 target of its class; a row without an encoding (-1s) is ignored."""
    polys = np.full((2, 100, 500), -1, np.float32)
    polys[1, 0] = encode(3, [[0, 0, 4, 0, 4, 4, 0, 4], [10, 10, 14, 10, 14, 14, 10, 14]])
    polys[1, 1] = encode(9, [])
    rois = np.float32([[1, 0, 0, 14, 14], [1, 0, 0, 0.5, 0.25], [1, 0, 0, 14, 14], [0, 0, 0, 14, 14]])
    ids = np.float32([0, 0, 1, 0])[:, None]
    targets, classes = run_mask_op(rois, polys, ids, num_proposals=2, mask_size=14)
    expected = np.zeros((14, 14), np.float32)
    expected[0:4, 0:4] = expected[10:14, 10:14] = 1
    np.testing.assert_array_equal(targets[0], expected)
    # The 1-px roi stretches the first square's 4 px over 56 cells: the whole grid.
    np.testing.assert_array_equal(targets[1], np.ones((14, 14)))
    np.testing.assert_array_equal(targets[2], np.zeros((14, 14)))
    np.testing.assert_array_equal(classes[2], np.full((14, 14), 9))
    np.testing.assert_array_equal(targets[3], np.full((14, 14), -1))
    np.testing.assert_array_equal(classes[3], np.zeros((14, 14)))
    expected_all = mask_target.mask_rcnn_target(rois, polys, ids, mask_size=14)
    for got, want in zip((targets, classes), expected_all):
        np.testing.assert_array_equal(got, want)


def test_random_polygons_match_transcription():
    """Random rois (some far smaller than their polygons) and multi-segment polygons in float32 chip
    coordinates; ids -1 mixed in; both outputs identical."""
    rng = np.random.default_rng(4)
    batch = 2
    polys = np.full((batch, 100, 500), -1, np.float32)
    for b in range(batch):
        for g in range(12):
            segments = [rng.uniform(0, 300, 2 * rng.integers(3, 15)) for _ in range(rng.integers(1, 4))]
            polys[b, g] = encode(rng.integers(0, 80), segments)
    corners = rng.uniform(0, 250, (batch * 50, 2))
    sizes = rng.uniform(0.5, 200, (batch * 50, 2))
    rois = np.hstack([np.arange(batch * 50)[:, None] % batch, corners, corners + sizes]).astype(np.float32)
    ids = rng.integers(-1, 12, (batch * 50, 1)).astype(np.float32)
    outputs = run_mask_op(rois, polys, ids, batch_size=batch)
    expected = mask_target.mask_rcnn_target(rois, polys, ids)
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(got, want)
    assert (outputs[0] == 1).sum() > 1000 and (outputs[0] == 0).sum() > 1000 and (outputs[0] == -1).sum() > 0


def test_operators_chain_on_the_loader_layout():
    """MultiProposalTargetMask's mask rois and ids feed MaskRcnnTarget: every positive mask roi gets the
    polygon of the gt it matched (here each gt's polygon is its box, so a roi on its gt is all 1)."""
    gts = [cell_box(0) + [3], cell_box(2) + [7]]
    inputs = one_anchor_chips(1, [0.9, 0.8, 0.7, 0.6], gts, max_gts=100)
    _, _, _, _, mask_rois, mask_ids = run_proposal_op(inputs, **ONE_ANCHOR, rpn_post_nms_top_n=8)
    polys = np.full((1, 100, 500), -1, np.float32)
    for g, (x1, y1, x2, y2, label) in enumerate(gts):
        polys[0, g] = encode(label - 1, [[x1, y1, x2, y1, x2, y2, x1, y2]])
    targets, classes = run_mask_op(mask_rois, polys, mask_ids)
    assert targets.shape == (50, 28, 28)
    assert (mask_ids[:4, 0] >= 0).all() and (mask_ids[4:, 0] == -1).all()
    np.testing.assert_array_equal(targets[:4], np.ones((4, 28, 28)))  # roi = its gt's box
    np.testing.assert_array_equal(classes[:4, 0, 0], [2, 6, 6, 2])
    assert (targets[4:] == -1).all()


def test_backward_writes_zero_gradients():
    rois = mx.nd.array([[0, 0, 0, 10, 10]])
    polys, ids = mx.nd.full((1, 100, 500), -1), mx.nd.array([[-1]])
    for array in (rois, polys, ids):
        array.attach_grad()
    with mx.autograd.record():
        targets, classes = mx.nd.MaskRcnnTarget(rois, polys, ids, num_proposals=1)
        loss = (targets * 2 + classes).sum()
    loss.backward()
    for array in (rois, polys, ids):
        assert (array.grad.asnumpy() == 0).all()
