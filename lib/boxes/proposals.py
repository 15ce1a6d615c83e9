"""The test-time RPN proposal rules as the reference ran them (spec section 8), in NumPy: the MXNet operator of
lib/ops/proposal_layer.py and the ONNX Runtime back end (lib/inference/onnx_network.py) share them.

The reference tested with its fork's MultiProposal, which differs from MXNet's stock operator of the
same name in ways that change the proposals:

- every anchor of the canvas's feature map is a candidate; the stock operator gives score -1 to the
  feature cells at or beyond ``int(h / stride)`` / ``int(w / stride)`` of the image, i.e. it drops the
  last partial row and column of every image and everything beyond a smaller image of the batch;
- the minimum size (``TEST.RPN_MIN_SIZE``, 3) applies to the decoded box in scaled pixels (stock: times
  ``im_info``'s scale);
- the ``TEST.RPN_PRE_NMS_TOP_N`` best boxes (12000) go through greedy NMS (IoU with +1 sizes, suppressed
  above ``TEST.RPN_NMS_THRESH``), boxes under the minimum size never take part;
- anchors are enumerated in (a, h, w) order and ranked with std::sort, which decides the order of equal
  scores (common: the anchors of a canvas's padding or of a flat image region score alike), and with it
  which of two overlapping equal boxes NMS keeps;
- its host arithmetic: exp of the float32 deltas is the C library's ``expf``, and NMS compares a float32
  overlap with the threshold (lib/boxes/src/proposal_host.h); the outputs are bit-identical to the fork's
  operator compiled from its source (``dev/parity_compare.py --fork``).

Each image of a batch is treated on its own: every anchor of the shared canvas's feature map, boxes
clipped to the image's own ``im_info`` extent, its own ranking and NMS; a smaller image's canvas padding
only contributes candidates that end up clipped to its border.

The reference pads an image's output to ``TEST.RPN_POST_NMS_TOP_N`` rows with random boxes, which cannot
be reproduced; here the kept boxes are repeated, as the stock operator pads, and the detector drops the
repeats (docs/reference_differences.md). ``TEST.PROPOSAL_LAYER: stock`` selects MXNet's operator instead
(GPU-resident, but with the stock rules above).
"""
import numpy as np

from lib.boxes._proposal_host import c_expf, greedy_nms_float32, std_sort_descending
from lib.boxes.anchors import base_anchors


def decode_anchors(anchors, deltas, height, width):
    """Shifted anchors (N, 4) + deltas (N, 4) -> boxes clipped to ``[0, width - 1] x [0, height - 1]``,
    float32 with the reference kernel's float/double mix (+1 widths) and its float32 exp (``expf``)."""
    x1, y1, x2, y2 = (anchors[:, i] for i in range(4))
    w = (x2 - x1 + np.float32(1)).astype(np.float32)
    h = (y2 - y1 + np.float32(1)).astype(np.float32)
    ctr_x = (x1 + 0.5 * (w.astype(np.float64) - 1.0)).astype(np.float32)
    ctr_y = (y1 + 0.5 * (h.astype(np.float64) - 1.0)).astype(np.float32)
    dx, dy, dw, dh = (deltas[:, i] for i in range(4))
    pred_ctr_x = dx * w + ctr_x
    pred_ctr_y = dy * h + ctr_y
    with np.errstate(over="ignore"):  # a huge delta gives an infinite box, clipped to the image as there
        pred_w = c_expf(dw) * w
        pred_h = c_expf(dh) * h
    half_w = 0.5 * (pred_w.astype(np.float64) - 1.0)
    half_h = 0.5 * (pred_h.astype(np.float64) - 1.0)
    boxes = np.stack([pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h],
                     axis=1).astype(np.float32)
    upper = np.array([width - 1, height - 1, width - 1, height - 1], np.float32)
    return np.maximum(np.minimum(boxes, upper), np.float32(0))


def image_proposals(fg_scores, deltas, height, width, base, stride, pre_nms_top_n, post_nms_top_n, nms_thresh,
                    min_size):
    """One image: ``fg_scores`` (A, H, W), ``deltas`` (4A, H, W), the image's scaled ``height`` x ``width``
    -> kept ``(boxes (K, 4), scores (K,))``, K <= ``post_nms_top_n``, best first."""
    num_anchors, feat_h, feat_w = fg_scores.shape
    shift_y, shift_x = np.meshgrid(np.arange(feat_h, dtype=np.float32) * stride,
                                   np.arange(feat_w, dtype=np.float32) * stride, indexing="ij")
    shifts = np.stack([shift_x, shift_y, shift_x, shift_y], axis=-1).reshape(1, -1, 4)
    anchors = (base[:, None, :] + shifts).reshape(-1, 4)  # (a, h, w) order
    deltas = deltas.reshape(num_anchors, 4, feat_h * feat_w).transpose(0, 2, 1).reshape(-1, 4)
    boxes = decode_anchors(anchors, deltas, height, width)
    scores = fg_scores.reshape(-1)
    big_enough = ((boxes[:, 2] - boxes[:, 0] + 1 >= min_size) & (boxes[:, 3] - boxes[:, 1] + 1 >= min_size))
    ranked = std_sort_descending(np.where(big_enough, scores, np.float32(-1)))[:pre_nms_top_n]
    ranked = ranked[big_enough[ranked]]
    kept = ranked[greedy_nms_float32(boxes[ranked], nms_thresh, post_nms_top_n)]
    return boxes[kept], scores[kept]


def proposals(cls_prob, bbox_pred, im_info, stride, scales, ratios, pre_nms_top_n, post_nms_top_n, nms_thresh,
              min_size):
    """The layer on a batch: ``cls_prob`` (B, 2A, H, W) (background A, then foreground A channels),
    ``bbox_pred`` (B, 4A, H, W), ``im_info`` (B, 3) rows (scaled height, width, -) -> rois
    (B * post_nms_top_n, 5) ``[b, x1, y1, x2, y2]`` and scores (B * post_nms_top_n, 1). An image with
    fewer kept boxes repeats them; one with none gets its whole extent with score 0."""
    base = base_anchors(stride, ratios, scales)
    num_anchors = len(base)
    batch = cls_prob.shape[0]
    rois = np.zeros((batch, post_nms_top_n, 5), np.float32)
    out_scores = np.zeros((batch, post_nms_top_n, 1), np.float32)
    for b in range(batch):
        height, width = float(im_info[b, 0]), float(im_info[b, 1])
        boxes, scores = image_proposals(cls_prob[b, num_anchors:], bbox_pred[b], height, width, base, stride,
                                        pre_nms_top_n, post_nms_top_n, nms_thresh, min_size)
        if not len(boxes):
            boxes, scores = np.array([[0, 0, width - 1, height - 1]], np.float32), np.zeros(1, np.float32)
        rows = np.arange(post_nms_top_n) % len(boxes)
        rois[b, :, 0] = b
        rois[b, :, 1:] = boxes[rows]
        out_scores[b, :, 0] = scores[rows]
    return rois.reshape(-1, 5), out_scores.reshape(-1, 1)
