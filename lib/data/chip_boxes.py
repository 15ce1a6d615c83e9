"""The ground-truth boxes a chip shows, in chip pixels, and its valid range in chip pixels.

Every box of the image that is visible in the chip is cropped to it; boxes whose visible part is
narrower or shorter than RPN_MIN_GT_SIZE scaled pixels (spec section 4: 10 px) are dropped, both
from the RPN targets and from ``gt_boxes``. A box is valid when the scale's valid range (and the
mining rule for that scale) accepts the whole box in original pixels; the others are kept as
invalid boxes: the RPN ignores anchors around them and the network sees them among ``gt_boxes``.
"""
import numpy as np


def crop_to_chip(boxes, im_scale, chip):
    """Boxes (N, 4) in original pixels -> (N, 4) scaled and cropped to ``chip``, in chip pixels.

    A box outside the chip gets x2 < x1 or y2 < y1 (visible extent below 1 px).
    """
    scaled = np.asarray(boxes, np.float32).reshape(-1, 4) * np.float32(im_scale)
    x1, y1, x2, y2 = (np.float32(v) for v in chip)
    cropped = np.empty_like(scaled)
    cropped[:, 0] = np.maximum(scaled[:, 0], x1) - x1
    cropped[:, 1] = np.maximum(scaled[:, 1], y1) - y1
    cropped[:, 2] = np.minimum(scaled[:, 2], x2) - x1
    cropped[:, 3] = np.minimum(scaled[:, 3], y2) - y1
    return cropped


def chip_gt_boxes(boxes, gt_classes, valid, im_scale, chip, min_size):
    """``(boxes (K, 4) chip pixels, classes (K,), valid (K,) bool)`` of the boxes the chip shows.

    ``valid``: (N,) mask over the image's boxes for this scale. Kept boxes have a visible width and
    height of at least ``max(min_size, 1)`` pixels (inclusive), and stay in image order.
    """
    cropped = crop_to_chip(boxes, im_scale, chip)
    min_extent = max(float(min_size), 1.0)
    keep = ((cropped[:, 2] - cropped[:, 0] + 1 >= min_extent) & (cropped[:, 3] - cropped[:, 1] + 1 >= min_extent))
    return cropped[keep], np.asarray(gt_classes).reshape(-1)[keep], np.asarray(valid, bool).reshape(-1)[keep]


def scaled_valid_range(valid_range, im_scale):
    """(lo, hi) in original pixels -> chip pixels; -1 (open end) stays -1."""
    return tuple(-1.0 if bound == -1 else float(bound) * im_scale for bound in valid_range)


def pack_gt_boxes(boxes, classes, valid, out):
    """Fill ``out`` (max_gt, 5) with rows (x1, y1, x2, y2, class), -1 padding; valid boxes first.

    Returns the number of boxes that did not fit (0 normally; MAX_GT_PER_CHIP is 100).
    """
    order = np.argsort(~np.asarray(valid, bool), kind="stable")
    count = min(len(order), len(out))
    out[...] = -1
    out[:count, :4] = boxes[order[:count]]
    out[:count, 4] = classes[order[:count]]
    return len(order) - count
