"""NumPy reference of the MultiProposalTarget operator in both rule sets (see lib/ops/__init__.py).

It states the operator's semantics in readable NumPy; the tests check the compiled operator against
it and tools/benchmark_proposal_target.py times both. The "exact" rules are built from the shared
lib.boxes pieces. The "reference" rules (the published SNIPER's GPU operator) are written out here in
the float32 / float64 mix that operator computes in, and its NMS as the kernel runs it: slot by slot,
a selection among all remaining array positions with the kernel's tie rule and swaps, rather than
the compiled operator's sort-once greedy scan, so the two are independent statements of one rule.
"""
import numpy as np

from lib.boxes import base_anchors, bbox_overlaps, clip_boxes, decode, encode, grid_anchors, match, nms
from lib.boxes.coder import MAX_LOG_SCALE
from lib.scales import in_valid_range

F32 = np.float32


def anchor_proposals(cls_prob, bbox_pred, im_info, stride, params, max_log_scale=MAX_LOG_SCALE):
    """Every anchor's clipped proposal (float32 (N, 4)) and score (N,), in (h, w, a) order."""
    anchors = base_anchors(stride, params["ratios"], params["scales"])
    num_anchors, (feat_h, feat_w) = len(anchors), cls_prob.shape[1:]
    scores = cls_prob[num_anchors:].transpose(1, 2, 0).reshape(-1)
    deltas = bbox_pred.reshape(num_anchors, 4, feat_h, feat_w).transpose(2, 3, 0, 1).reshape(-1, 4)
    boxes = decode(grid_anchors(anchors, feat_h, feat_w, stride), deltas, max_log_scale=max_log_scale)
    return clip_boxes(boxes, im_info[0], im_info[1]), scores


# ---- exact rules ----------------------------------------------------------------------------------

def exact_chip_proposals(cls_prob, bbox_pred, im_info, valid_range, params, limit):
    """At most ``limit`` proposals (float32 (P, 4), best first) of one chip's RPN outputs."""
    boxes, scores = anchor_proposals(cls_prob, bbox_pred, im_info, params["feature_stride"], params)
    widths, heights = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    min_size = F32(params["rpn_min_size"])
    survivors = np.flatnonzero((widths >= min_size) & (heights >= min_size) & in_valid_range(boxes, valid_range))
    order = survivors[np.argsort(-scores[survivors], kind="stable")]
    if params["rpn_pre_nms_top_n"] > 0:
        order = order[: params["rpn_pre_nms_top_n"]]
    kept = order[nms(np.hstack([boxes[order], scores[order, None]]), params["threshold"])]
    return boxes[kept[:limit]]


def exact_chip_targets(rois, gt_boxes, params):
    """Labels (R,) and float32 targets/weights (R, 4) of one chip's rois against all its real gts."""
    labels = np.zeros(len(rois), F32)
    targets = np.zeros((len(rois), 4), F32)
    gts = gt_boxes[gt_boxes[:, 4] >= 0]
    if len(gts) == 0:
        return labels, targets, targets.copy()
    fg_thresh = params["fg_thresh"]
    matched, fg = match(bbox_overlaps(rois, gts[:, :4]), fg_thresh, fg_thresh, allow_low_quality=False, strict=True)
    positive = fg == 1
    labels[positive] = gts[matched[positive], 4]
    targets[positive] = encode(rois[positive], gts[matched[positive], :4], params["bbox_stds"])
    return labels, targets, np.repeat(positive[:, None], 4, axis=1).astype(F32)


def exact_chip(b, cls_prob, bbox_pred, im_info, gt_boxes, valid_range, params):
    """Rois [proposals, in-range gts, padding [0, 0, stride - 1, stride - 1] labelled -1]."""
    num_rois, stride = params["rpn_post_nms_top_n"], params["feature_stride"]
    real = gt_boxes[gt_boxes[:, 4] >= 0]
    valid_gts = real[in_valid_range(real[:, :4], valid_range)][:num_rois, :4]
    proposals = exact_chip_proposals(cls_prob, bbox_pred, im_info, valid_range, params, num_rois - len(valid_gts))
    rois = np.vstack([proposals, valid_gts]).astype(F32)
    labels, targets, weights = exact_chip_targets(rois, gt_boxes, params)
    padding = num_rois - len(rois)
    rois = np.vstack([rois, np.tile(F32([0, 0, stride - 1, stride - 1]), (padding, 1))])
    return (np.hstack([np.full((num_rois, 1), b, F32), rois]),
            np.concatenate([labels, np.full(padding, -1, F32)]),
            np.vstack([targets, np.zeros((padding, 4), F32)]),
            np.vstack([weights, np.zeros((padding, 4), F32)]))


# ---- reference rules ------------------------------------------------------------------------------

def area_no_plus_one(boxes):
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def inflated_overlaps(boxes, box, box_area, areas):
    """float32 overlaps of one box with many: +1 intersection, no-+1 areas."""
    iw = np.maximum(F32(0), np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]) + F32(1))
    ih = np.maximum(F32(0), np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]) + F32(1))
    inter = iw * ih
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (box_area + areas - inter)


def squared_bounds(valid_range):
    """(lo^2, hi^2) in float32 with -1 (open) as -inf / inf; 0 and 512 are plain numbers."""
    lo, hi = F32(valid_range[0]), F32(valid_range[1])
    return (F32(-np.inf) if lo == -1 else lo * lo), (F32(np.inf) if hi == -1 else hi * hi)


def kernel_preference(relative):
    """Sort keys of the NMS kernel's choice among equal scores at relative positions r: thread
    r % 1024 keeps its first maximum, the reduction prefers the smallest thread % 32, then thread."""
    return relative % 32, relative % 1024, relative


def kernel_nms(boxes, scores, areas, limit, threshold):
    """Element indices the reference NMS keeps, in slot order. Slot j takes, among the remaining
    array positions j.. holding unsuppressed candidates, the highest score (ties: ``kernel_preference``
    of the position relative to j), swaps it into position j, and suppresses every remaining box whose
    inflated overlap with it is > ``threshold``."""
    element_at = np.arange(len(boxes))
    alive = scores > -1  # dropped boxes carry the score -1 in the reference
    kept = []
    for slot in range(min(limit, len(boxes))):
        remaining = element_at[slot:]
        relative = np.flatnonzero(alive[remaining])
        if len(relative) == 0:
            break
        candidate_scores = scores[remaining[relative]]
        tied = relative[candidate_scores == candidate_scores.max()]
        pick = tied[np.lexsort(kernel_preference(tied)[::-1])[0]]
        chosen = remaining[pick]
        element_at[slot + pick], element_at[slot] = element_at[slot], chosen
        kept.append(chosen)
        alive[chosen] = False
        rest = element_at[slot + 1:]
        overlaps = inflated_overlaps(boxes[rest], boxes[chosen], areas[chosen], areas[rest])
        alive[rest[overlaps.astype(np.float64) > threshold]] = False
    return np.array(kept, np.int64)


def reference_targets(rois, gts, stds):
    """The reference's regression targets: gt centre x1 + 0.5 * w, roi centre x1 + 0.5 * (w - 1),
    1e-7 added to the roi size; float32 storage of float64 intermediates as in its C++."""
    scale = 1.0 / np.float64(stds)
    gw, gh = gts[:, 2] - gts[:, 0] + F32(1), gts[:, 3] - gts[:, 1] + F32(1)
    gcx = (gts[:, 0] + 0.5 * gw.astype(np.float64)).astype(F32)
    gcy = (gts[:, 1] + 0.5 * gh.astype(np.float64)).astype(F32)
    pw, ph = rois[:, 2] - rois[:, 0] + F32(1), rois[:, 3] - rois[:, 1] + F32(1)
    pcx = (rois[:, 0] + 0.5 * (pw - F32(1)).astype(np.float64)).astype(F32)
    pcy = (rois[:, 1] + 0.5 * (ph - F32(1)).astype(np.float64)).astype(F32)
    pw64, ph64 = pw.astype(np.float64) + 1e-7, ph.astype(np.float64) + 1e-7
    return np.stack([(F32(scale[0]) * (gcx - pcx)) / pw64, (F32(scale[1]) * (gcy - pcy)) / ph64,
                     scale[2] * np.log(gw / pw64), scale[3] * np.log(gh / ph64)], axis=1).astype(F32)


def reference_chip(b, cls_prob, bbox_pred, im_info, gt_boxes, valid_range, params):
    """Rois [kept proposals, boxes [m, m, m + 200, m + 200]] with in-range gts over the last slots;
    every roi labelled by its first best inflated overlap > fg_thresh; targets 1 where not positive."""
    num_rois, stride = params["rpn_post_nms_top_n"], params["feature_stride"]
    num_anchors = len(params["scales"]) * len(params["ratios"])
    feat_h, feat_w = cls_prob.shape[1:]
    boxes, scores = anchor_proposals(cls_prob, bbox_pred, im_info, stride, params, max_log_scale=np.inf)
    # From (h, w, a) to the reference's anchor order (a, h, w): element a * H * W + h * W + w.
    to_ahw = np.arange(len(boxes)).reshape(feat_h, feat_w, num_anchors).transpose(2, 0, 1).reshape(-1)
    boxes, scores = boxes[to_ahw], scores[to_ahw]
    areas = area_no_plus_one(boxes)
    lo2, hi2 = squared_bounds(valid_range)
    min_size = F32(params["rpn_min_size"])
    too_small = (boxes[:, 2] - boxes[:, 0] < min_size) & (boxes[:, 3] - boxes[:, 1] < min_size)
    scores[too_small | (areas < lo2) | (areas >= hi2)] = -1
    cap = params["rpn_pre_nms_top_n"]
    if cap > 0:  # not in the reference: the best `cap` candidates, ties by the kernel's slot-0 preference
        candidates = np.flatnonzero(scores > -1)
        rank = np.lexsort(kernel_preference(candidates)[::-1] + (-scores[candidates],))
        scores[candidates[rank[cap:]]] = -1
    kept = kernel_nms(boxes, scores, areas, num_rois, params["threshold"])

    slots = np.arange(len(kept), num_rois)
    m = ((b * len(boxes) + slots) % 100).astype(F32)
    rois = np.vstack([boxes[kept], np.stack([m, m, m + 200, m + 200], axis=1)]).astype(F32)
    gts = gt_boxes[gt_boxes[:, 4] >= 0]
    gt_areas = area_no_plus_one(gts[:, :4])
    appended = np.flatnonzero((gt_areas >= lo2) & (gt_areas <= hi2))  # here the upper bound is inclusive
    slot_of = num_rois - len(gts) + appended
    rois[slot_of[slot_of >= 0]] = gts[appended[slot_of >= 0], :4]

    labels = np.zeros(num_rois, F32)
    targets = np.ones((num_rois, 4), F32)
    weights = np.zeros((num_rois, 4), F32)
    if len(gts):
        overlaps = np.stack([inflated_overlaps(rois, gt, area, area_no_plus_one(rois))
                             for gt, area in zip(gts[:, :4], gt_areas)], axis=1)
        passing = overlaps.astype(np.float64) > params["fg_thresh"]
        matched = np.where(passing, overlaps, -np.inf).argmax(axis=1)
        positive = passing.any(axis=1)
        labels[positive] = gts[matched[positive], 4]
        targets[positive] = reference_targets(rois[positive], gts[matched[positive], :4], params["bbox_stds"])
        weights[positive] = 1
    return np.hstack([np.full((num_rois, 1), b, F32), rois]), labels, targets, weights


CHIP_RULES = {"exact": exact_chip, "reference": reference_chip}


def multi_proposal_target(cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges, **params):
    """Same inputs, attributes (all of them, e.g. ``lib.ops.proposal_target_attrs(cfg)``) and outputs as
    ``mx.nd.MultiProposalTarget``, as NumPy arrays."""
    chip = CHIP_RULES[params["rules"]]
    outputs = [chip(b, cls_prob[b], bbox_pred[b], im_info[b], gt_boxes[b], valid_ranges[b], params)
               for b in range(len(cls_prob))]
    return tuple(np.concatenate(parts) for parts in zip(*outputs))
