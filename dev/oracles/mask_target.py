"""Python transcription of the reference fork's mask operators, the test oracle of the compiled
``MultiProposalTargetMask`` and ``MaskRcnnTarget`` (lib/ops/__init__.py states their semantics).

Written from the fork's GPU sources (multi_proposal_target_mask.cu, mask_rcnn_target.cu; their CPU
forwards are empty), step for step where the compiled operator takes another route: the host's
``std::sort`` as libstdc++'s introsort runs (its order of equal scores is the fork's), the NMS kernel's
forward suppression over the sorted positions, COCO's ``rleFrPoly`` building run lengths and decoding
them. Float32 steps are NumPy float32 operations in the fork's order; ``exp`` is the C library's
``expf`` (the compiled operator's; NumPy's float32 exp is another approximation), so the compiled
operator and this agree to the bit except for the regression targets' logarithm (NumPy's float64 log
here, the C library's there: at most one float32 ulp apart).
"""
import ctypes
import ctypes.util
import math

import numpy as np

from dev.oracles.proposal_target import inflated_overlaps, reference_targets

F32 = np.float32
DROPPED = -1.0  # the fork's score of a filtered or suppressed box
FORK_STDS = (0.1, 0.1, 0.2, 0.2)  # its literals 10, 10, 5, 5

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype = ctypes.c_float
_libm.expf.argtypes = [ctypes.c_float]


def c_expf(values):
    """The C library's float32 exp, element by element."""
    flat = np.asarray(values, F32).reshape(-1)
    return np.array([_libm.expf(float(v)) for v in flat], F32).reshape(np.shape(values))


# ---- libstdc++ std::sort --------------------------------------------------------------------------

def libstdcxx_sort(items, less):
    """Sorts the list ``items`` in place as libstdc++'s ``std::sort(first, last, less)`` does
    (introsort: median-of-three quicksort above 16 elements, heapsort past 2 log2(n) levels, a final
    insertion sort), so that elements ``less`` cannot order end where the C++ call puts them."""
    n = len(items)
    if n < 2:
        return

    def move_median_to_first(result, a, b, c):
        x, y, z = items[a], items[b], items[c]
        if less(x, y):
            pick = b if less(y, z) else (c if less(x, z) else a)
        elif less(x, z):
            pick = a
        elif less(y, z):
            pick = c
        else:
            pick = b
        items[result], items[pick] = items[pick], items[result]

    def unguarded_partition(first, last, pivot):
        while True:
            while less(items[first], items[pivot]):
                first += 1
            last -= 1
            while less(items[pivot], items[last]):
                last -= 1
            if not first < last:
                return first
            items[first], items[last] = items[last], items[first]
            first += 1

    def push_heap(first, hole, top, value):
        parent = (hole - 1) // 2
        while hole > top and less(items[first + parent], value):
            items[first + hole] = items[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        items[first + hole] = value

    def adjust_heap(first, hole, length, value):
        top = hole
        child = hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if less(items[first + child], items[first + child - 1]):
                child -= 1
            items[first + hole] = items[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            items[first + hole] = items[first + child - 1]
            hole = child - 1
        push_heap(first, hole, top, value)

    def heap_sort(first, last):
        length = last - first
        parent = (length - 2) // 2
        while True:  # make_heap
            adjust_heap(first, parent, length, items[first + parent])
            if parent == 0:
                break
            parent -= 1
        while last - first > 1:  # sort_heap
            last -= 1
            value = items[last]
            items[last] = items[first]
            adjust_heap(first, 0, last - first, value)

    def introsort_loop(first, last, depth):
        while last - first > 16:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            move_median_to_first(first, first + 1, first + (last - first) // 2, last - 1)
            cut = unguarded_partition(first + 1, last, first)
            introsort_loop(cut, last, depth)
            last = cut

    def linear_insert(position):  # unguarded: a smaller element lies before
        value = items[position]
        while less(value, items[position - 1]):
            items[position] = items[position - 1]
            position -= 1
        items[position] = value

    def insertion_sort(first, last):
        for i in range(first + 1, last):
            value = items[i]
            if less(value, items[first]):
                items[first + 1:i + 1] = items[first:i]
                items[first] = value
            else:
                linear_insert(i)

    introsort_loop(0, n, 2 * (n.bit_length() - 1))
    if n > 16:
        insertion_sort(0, 16)
        for i in range(16, n):
            linear_insert(i)
    else:
        insertion_sort(0, n)


# ---- MultiProposalTargetMask ----------------------------------------------------------------------

def fork_anchors(stride, ratios, scales):
    """GenerateAnchors on [0, 0, stride - 1, stride - 1] in the fork's float32 arithmetic (ratio-major)."""
    w = F32(stride)
    centre = F32(0.5 * (np.float64(w) - 1.0))
    size = w * w
    anchors = []
    for ratio in map(F32, ratios):
        for scale in map(F32, scales):
            new_w = np.floor(np.sqrt(np.floor(size / ratio)) + F32(0.5)) * scale
            new_h = np.floor(new_w / scale * ratio + F32(0.5)) * scale
            half_w, half_h = F32(0.5) * (new_w - F32(1)), F32(0.5) * (new_h - F32(1))
            anchors.append([centre - half_w, centre - half_h, centre + half_w, centre + half_h])
    return np.array(anchors, F32)


def fork_proposals(cls_prob, bbox_pred, im_info, valid_range, stride, ratios, scales):
    """getPropsCu for one chip: boxes (A*H*W, 4), scores (-1 when dropped) and no-+1 areas, element
    a * H * W + y * W + x."""
    anchors = fork_anchors(stride, ratios, scales)
    num_anchors, (feat_h, feat_w) = len(anchors), cls_prob.shape[1:]
    ys, xs = np.meshgrid(np.arange(feat_h), np.arange(feat_w), indexing="ij")
    shift_x = (xs * stride).astype(F32).reshape(1, -1)
    shift_y = (ys * stride).astype(F32).reshape(1, -1)
    x1, y1 = (anchors[:, 0:1] + shift_x).reshape(-1), (anchors[:, 1:2] + shift_y).reshape(-1)
    x2, y2 = (anchors[:, 2:3] + shift_x).reshape(-1), (anchors[:, 3:4] + shift_y).reshape(-1)
    deltas = bbox_pred.reshape(num_anchors, 4, -1)
    dx, dy, dw, dh = (deltas[:, k].reshape(-1).astype(F32) for k in range(4))
    width, height = x2 - x1 + F32(1), y2 - y1 + F32(1)
    ctr_x = (x1 + 0.5 * (width.astype(np.float64) - 1.0)).astype(F32)
    ctr_y = (y1 + 0.5 * (height.astype(np.float64) - 1.0)).astype(F32)
    pred_ctr_x, pred_ctr_y = dx * width + ctr_x, dy * height + ctr_y
    pred_w, pred_h = c_expf(dw) * width, c_expf(dh) * height
    half_w, half_h = 0.5 * (pred_w.astype(np.float64) - 1.0), 0.5 * (pred_h.astype(np.float64) - 1.0)
    max_x, max_y = F32(im_info[1]) - F32(1), F32(im_info[0]) - F32(1)
    boxes = np.stack([np.maximum(np.minimum((pred_ctr_x - half_w).astype(F32), max_x), F32(0)),
                      np.maximum(np.minimum((pred_ctr_y - half_h).astype(F32), max_y), F32(0)),
                      np.maximum(np.minimum((pred_ctr_x + half_w).astype(F32), max_x), F32(0)),
                      np.maximum(np.minimum((pred_ctr_y + half_h).astype(F32), max_y), F32(0))], axis=1)
    scores = cls_prob[num_anchors:].reshape(-1).astype(F32).copy()
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    small = (boxes[:, 3] - boxes[:, 1] < F32(3)) & (boxes[:, 2] - boxes[:, 0] < F32(3))
    lo, hi = F32(valid_range[0]), F32(valid_range[1])
    out_of_range = ((hi != -1) & (areas >= hi * hi)) | ((lo != -1) & (areas < lo * lo))
    scores[small | out_of_range | np.isnan(scores)] = DROPPED
    return boxes, scores, areas


def fork_nms(boxes, scores, areas, pre_nms_top_n, post_nms_top_n, threshold, sort=libstdcxx_sort):
    """The host sort (``sort(items, less)``), then NonMaximumSuppressionCu over the first pre_nms_top_n
    positions: each kept box marks every later box whose overlap with it is > threshold dropped.
    Kept element indices."""
    keys = scores.astype(np.float64).tolist()
    order = list(range(len(keys)))
    sort(order, lambda i, j: keys[i] > keys[j])
    order = np.array(order[:pre_nms_top_n] if pre_nms_top_n > 0 else order, np.int64)
    alive = scores[order] != DROPPED
    kept = []
    for position, element in enumerate(order):
        if len(kept) == post_nms_top_n:
            break
        if not alive[position]:
            continue
        kept.append(element)
        later = order[position + 1:]
        overlaps = inflated_overlaps(boxes[later], boxes[element], areas[element], areas[later])
        alive[position + 1:] &= ~(overlaps.astype(np.float64) > threshold)
    return np.array(kept, np.int64)


def fork_mask_chip(b, cls_prob, bbox_pred, im_info, gt_boxes, valid_range, params):
    """One chip's rois (R, 5), labels (R,), targets and weights (R, 4) and matched gt rows (R,; -1)."""
    num_rois, max_gts = params["rpn_post_nms_top_n"], params["max_gts"]
    boxes, scores, areas = fork_proposals(cls_prob, bbox_pred, im_info, valid_range, params["feature_stride"],
                                          params["ratios"], params["scales"])
    kept = fork_nms(boxes, scores, areas, params["rpn_pre_nms_top_n"], num_rois, params["threshold"])
    rois = np.zeros((num_rois, 4), F32)
    rois[:len(kept)] = boxes[kept]
    for t in range(len(kept), num_rois):
        m = t % 100
        rois[t] = [m, m, m + 200, m + 200]
    lo, hi = F32(valid_range[0]), F32(valid_range[1])
    for t in range(min(num_rois, max_gts)):  # thread t of the NMS block
        gt = gt_boxes[t]
        area = (gt[2] - gt[0]) * (gt[3] - gt[1])
        if gt[4] != -1 and (hi == -1 or area < hi * hi) and (lo == -1 or area >= lo * lo):
            rois[num_rois - t - 1] = gt[:4]

    labels = np.zeros(num_rois, F32)
    targets = np.ones((num_rois, 4), F32)
    weights = np.zeros((num_rois, 4), F32)
    matched = np.full(num_rois, -1, np.int64)
    best = np.zeros(num_rois, F32)
    roi_areas = (rois[:, 2] - rois[:, 0]) * (rois[:, 3] - rois[:, 1])
    for g in range(int(np.sum(gt_boxes[:max_gts, 4] != -1))):  # the first n rows
        gt = gt_boxes[g]
        overlaps = inflated_overlaps(rois, gt[:4], (gt[2] - gt[0]) * (gt[3] - gt[1]), roi_areas)
        better = (overlaps > best) & (overlaps.astype(np.float64) > 0.5)
        best[better], matched[better], labels[better] = overlaps[better], g, gt[4]
    positive = matched >= 0
    if positive.any():
        targets[positive] = reference_targets(rois[positive], gt_boxes[matched[positive], :4], FORK_STDS)
        weights[positive] = 1
    return np.hstack([np.full((num_rois, 1), b, F32), rois]), labels, targets, weights, matched


def multi_proposal_target_mask(cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges, **params):
    """Same inputs, attributes (all of them) and outputs as ``mx.nd.MultiProposalTargetMask``."""
    batch = len(cls_prob)
    chips = [fork_mask_chip(b, cls_prob[b], bbox_pred[b], im_info[b], gt_boxes[b], valid_ranges[b], params)
             for b in range(batch)]
    rois, labels, targets, weights, matched = (np.concatenate(parts) for parts in zip(*chips))
    capacity = batch * params["max_masks"]
    mask_rows = np.flatnonzero(labels > 0)[:capacity]
    mask_rois = np.zeros((capacity, 5), F32)
    mask_ids = np.full((capacity, 1), -1, F32)
    mask_rois[:len(mask_rows)] = rois[mask_rows]
    mask_ids[:len(mask_rows), 0] = matched[mask_rows]
    for i in range(len(mask_rows), capacity):
        m = i % 200
        mask_rois[i] = [i % batch, m, m, m + 100, m + 100]
    return rois, labels[:, None], targets, weights, mask_rois, mask_ids


# ---- MaskRcnnTarget -------------------------------------------------------------------------------

def coco_rle_from_polygon(xy, h, w):
    """COCO's rleFrPoly: run lengths (column-major, starting with zeros) of the polygon with points
    (xy[2i], xy[2i + 1]) on an h x w grid."""
    k = len(xy) // 2
    if k == 0:
        return [h * w]
    scale = 5.0
    x = [int(scale * xy[2 * j] + .5) for j in range(k)]
    y = [int(scale * xy[2 * j + 1] + .5) for j in range(k)]
    x.append(x[0])
    y.append(y[0])
    u, v = [], []
    for j in range(k):
        xs, xe, ys, ye = x[j], x[j + 1], y[j], y[j + 1]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        if dx >= dy:
            s = (ye - ys) / dx if dx else 0.0  # 0 / 0 in COCO, at a point whose y is never read
            for d in range(dx + 1):
                t = dx - d if flip else d
                u.append(t + xs)
                v.append(int(ys + s * t + .5))
        else:
            s = (xe - xs) / dy
            for d in range(dy + 1):
                t = dy - d if flip else d
                v.append(t + ys)
                u.append(int(xs + s * t + .5))
    starts = []
    for j in range(1, len(u)):
        if u[j] == u[j - 1]:
            continue
        xd = float(u[j] if u[j] < u[j - 1] else u[j] - 1)
        xd = (xd + .5) / scale - .5
        if math.floor(xd) != xd or xd < 0 or xd > w - 1:
            continue
        yd = float(v[j] if v[j] < v[j - 1] else v[j - 1])
        yd = (yd + .5) / scale - .5
        yd = 0.0 if yd < 0 else (float(h) if yd > h else yd)
        starts.append(int(xd) * h + int(math.ceil(yd)))
    starts = sorted(starts) + [h * w]
    runs = [b - a for a, b in zip([0] + starts[:-1], starts)]
    counts = [runs[0]]
    j = 1
    while j < len(runs):
        if runs[j] > 0:
            counts.append(runs[j])
            j += 1
        else:  # an empty run merges its neighbours
            j += 1
            if j < len(runs):
                counts[-1] += runs[j]
                j += 1
    return counts


def decode_rle(counts, h, w):
    """rleDecode: a (w, h) grid of 0/1 (COCO's column-major layout, index x * h + y)."""
    values = np.concatenate([np.full(c, i % 2, np.uint8) for i, c in enumerate(counts)])
    return values.reshape(w, h)


def roi_mask_target(roi, poly, mask_size):
    """convertPoly2Mask: the union of the encoded polygons on the roi's mask_size grid, row-major (y, x);
    None when the encoding does not fit its row."""
    if not (0 <= poly[1] <= len(poly)):
        return None
    num_segments = int(poly[1])
    lengths = poly[2:2 + num_segments]
    if len(lengths) < num_segments or np.any(~(lengths >= 0)) or 2 + num_segments + np.sum(lengths.astype(np.int64)) > len(poly):
        return None
    w = max(F32(1), F32(roi[3]) - F32(roi[1]))
    h = max(F32(1), F32(roi[4]) - F32(roi[2]))
    size = F32(mask_size)
    mask = np.zeros((mask_size, mask_size), np.uint8)
    offset = 2 + num_segments
    for length in lengths.astype(np.int64):
        coords = poly[offset:offset + length].astype(F32)
        points = length // 2
        xy = np.empty(2 * points, np.float64)
        xy[0::2] = (coords[1:2 * points:2] - F32(roi[2])) * size / h  # the fork passes (y, x)
        xy[1::2] = (coords[0:2 * points:2] - F32(roi[1])) * size / w
        mask |= decode_rle(coco_rle_from_polygon(xy.tolist(), mask_size, mask_size), mask_size, mask_size)
        offset += length
    return mask.astype(F32)


def mask_rcnn_target(rois, mask_polys, mask_ids, mask_size=28, ignore_label=-1, **unused):
    """Same inputs, attributes and outputs as ``mx.nd.MaskRcnnTarget``."""
    batch, max_num_gts = mask_polys.shape[:2]
    rows = len(rois)
    targets = np.full((rows, mask_size, mask_size), ignore_label, F32)
    classes = np.zeros((rows, mask_size, mask_size), F32)
    for i, (roi, mask_id) in enumerate(zip(rois, np.ravel(mask_ids))):
        if not (-1 < mask_id < max_num_gts and -1 < roi[0] < batch):
            continue
        poly = mask_polys[int(roi[0]), int(mask_id)]
        mask = roi_mask_target(roi, poly, mask_size)
        if mask is not None:
            targets[i], classes[i] = mask, poly[0]
    return targets, classes
