"""NumPy reference of the MultiProposalTarget operator, built from the shared lib.boxes pieces.

It states the operator's semantics (see lib/ops/__init__.py) in a dozen readable lines per chip; the
tests check the compiled operator against it and tools/benchmark_proposal_target.py times both.
"""
import numpy as np

from lib.boxes import base_anchors, bbox_overlaps, clip_boxes, decode, encode, grid_anchors, match, nms
from lib.scales import in_valid_range

def chip_proposals(cls_prob, bbox_pred, im_info, valid_range, params, limit):
    """At most ``limit`` proposals (float32 (P, 4), best first) of one chip's RPN outputs."""
    stride = params["feature_stride"]
    anchors = base_anchors(stride, params["ratios"], params["scales"])
    num_anchors, (feat_h, feat_w) = len(anchors), cls_prob.shape[1:]
    scores = cls_prob[num_anchors:].transpose(1, 2, 0).reshape(-1)
    deltas = bbox_pred.reshape(num_anchors, 4, feat_h, feat_w).transpose(2, 3, 0, 1).reshape(-1, 4)
    boxes = decode(grid_anchors(anchors, feat_h, feat_w, stride), deltas)
    boxes = clip_boxes(boxes, im_info[0], im_info[1])
    widths, heights = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    min_size = np.float32(params["rpn_min_size"])
    survivors = np.flatnonzero((widths >= min_size) & (heights >= min_size) & in_valid_range(boxes, valid_range))
    order = survivors[np.argsort(-scores[survivors], kind="stable")][: params["rpn_pre_nms_top_n"]]
    kept = order[nms(np.hstack([boxes[order], scores[order, None]]), params["threshold"])]
    return boxes[kept[:limit]]


def chip_targets(rois, gt_boxes, params):
    """Labels (R,) and float32 targets/weights (R, 4) of one chip's rois against all its real gts."""
    labels = np.zeros(len(rois), np.float32)
    targets = np.zeros((len(rois), 4), np.float32)
    gts = gt_boxes[gt_boxes[:, 4] >= 0]
    if len(gts) == 0:
        return labels, targets, targets.copy()
    fg_thresh = params["fg_thresh"]
    matched, fg = match(bbox_overlaps(rois, gts[:, :4]), fg_thresh, fg_thresh, allow_low_quality=False, strict=True)
    positive = fg == 1
    labels[positive] = gts[matched[positive], 4]
    targets[positive] = encode(rois[positive], gts[matched[positive], :4], params["bbox_stds"])
    return labels, targets, np.repeat(positive[:, None], 4, axis=1).astype(np.float32)


def multi_proposal_target(cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges, **params):
    """Same inputs, attributes (all of them, e.g. ``lib.ops.proposal_target_attrs(cfg)``) and outputs as
    ``mx.nd.MultiProposalTarget``, as NumPy arrays."""
    num_rois, stride = params["rpn_post_nms_top_n"], params["feature_stride"]
    outputs = []
    for b in range(len(cls_prob)):
        real = gt_boxes[b][gt_boxes[b][:, 4] >= 0]
        valid_gts = real[in_valid_range(real[:, :4], valid_ranges[b])][:num_rois, :4]
        proposals = chip_proposals(cls_prob[b], bbox_pred[b], im_info[b], valid_ranges[b], params,
                                   num_rois - len(valid_gts))
        rois = np.vstack([proposals, valid_gts]).astype(np.float32)
        labels, targets, weights = chip_targets(rois, gt_boxes[b], params)
        padding = num_rois - len(rois)
        rois = np.vstack([rois, np.tile(np.float32([0, 0, stride - 1, stride - 1]), (padding, 1))])
        outputs.append((
            np.hstack([np.full((num_rois, 1), b, np.float32), rois]),
            np.concatenate([labels, np.full(padding, -1, np.float32)]),
            np.vstack([targets, np.zeros((padding, 4), np.float32)]),
            np.vstack([weights, np.zeros((padding, 4), np.float32)]),
        ))
    return tuple(np.concatenate(parts) for parts in zip(*outputs))
