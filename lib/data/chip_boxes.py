"""The ground-truth boxes a chip shows, in chip pixels, and its valid range in chip pixels.

Every box of the image is moved into the chip (``(box - chip origin) * scale``, the origin in original
pixels, in float32 as the reference computes it), optionally rounded to whole pixels
(TRAIN.RPN_ROUND_GT) and clipped to the network input; boxes outside the chip, or narrower or shorter
than RPN_MIN_GT_SIZE px (spec section 4: 10 px, +1 widths) after clipping, are dropped, both from the
RPN targets and from ``gt_boxes``. A box is valid when the miner says so (chip_generator.mining: the
boxes the chip is assigned); the others are kept as invalid boxes: the RPN ignores anchors around them
and the network sees them among ``gt_boxes``, in image order, without a flag.
"""
from typing import NamedTuple

import numpy as np


def chip_origin(im_scale, chip):
    """The top-left corner of ``chip`` (scaled-image pixels) in original pixels, float32 (x, y)."""
    return np.array([chip[0] / im_scale, chip[1] / im_scale], np.float32)


def boxes_in_chip(boxes, im_scale, chip, round_boxes):
    """Boxes (N, 4) in original pixels -> float32 (N, 4) in the pixels of ``chip`` (scaled-image
    pixels), unclipped, rounded to whole pixels (half to even) with ``round_boxes``."""
    origin = np.tile(chip_origin(im_scale, chip), 2)
    moved = (np.asarray(boxes, np.float32).reshape(-1, 4) - origin) * np.float32(im_scale)
    return np.round(moved) if round_boxes else moved


class ChipBoxes(NamedTuple):
    """The boxes a chip shows: ``rows`` (K,) their indices in the entry, ``boxes`` (K, 4) in chip pixels,
    ``classes`` (K,), ``valid`` (K,) bool."""

    rows: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    valid: np.ndarray


def chip_gt_boxes(boxes, gt_classes, valid, im_scale, chip, min_size, input_size, round_boxes):
    """``(boxes (K, 4) chip pixels, classes (K,), valid (K,) bool)`` of the boxes the chip shows
    (``select_chip_boxes`` without the rows)."""
    return tuple(select_chip_boxes(boxes, gt_classes, valid, im_scale, chip, min_size, input_size, round_boxes)[1:])


def select_chip_boxes(boxes, gt_classes, valid, im_scale, chip, min_size, input_size, round_boxes):
    """``ChipBoxes`` of the boxes the chip shows.

    ``valid``: (N,) mask over the image's boxes, the miner's decision for this chip. Boxes are clipped
    to the ``input_size`` square of the network input; kept boxes overlap the chip and have a clipped
    width and height of at least ``max(min_size, 1)`` px (inclusive), and stay in image order. A kept
    box identical to a kept valid one is valid too (a duplicate annotation must not cancel the anchors
    of the box it duplicates).
    """
    moved = boxes_in_chip(boxes, im_scale, chip, round_boxes)
    chip_w, chip_h = chip[2] - chip[0] + 1, chip[3] - chip[1] + 1
    limit = np.float32(input_size - 1)
    inside = (moved[:, 2] >= 0) & (moved[:, 3] >= 0) & (moved[:, 0] <= min(chip_w, input_size) - 1) & \
        (moved[:, 1] <= min(chip_h, input_size) - 1)
    clipped = np.clip(moved, 0, limit)
    min_extent = max(float(min_size), 1.0)
    keep = inside & (clipped[:, 2] - clipped[:, 0] + 1 >= min_extent) & \
        (clipped[:, 3] - clipped[:, 1] + 1 >= min_extent)
    kept, kept_valid = clipped[keep], np.asarray(valid, bool).reshape(-1)[keep]
    if kept_valid.any() and not kept_valid.all():
        kept_valid = kept_valid | (kept[:, None, :] == kept[kept_valid][None, :, :]).all(axis=2).any(axis=1)
    return ChipBoxes(np.flatnonzero(keep), kept, np.asarray(gt_classes).reshape(-1)[keep], kept_valid)


def chip_valid_range(valid_range, im_scale, input_size):
    """(lo, hi) in original pixels, -1 open -> chip pixels with the open ends 0 and ``input_size``, as the
    reference hands them to the network."""
    lo, hi = valid_range
    return (0.0 if lo == -1 else float(lo) * im_scale, float(input_size) if hi == -1 else float(hi) * im_scale)


def pack_gt_boxes(boxes, classes, out):
    """Fill ``out`` (max_gt, 5) with rows (x1, y1, x2, y2, class) in the given order, -1 padding.

    Returns the number of boxes that did not fit (0 normally; MAX_GT_PER_CHIP is 100).
    """
    count = min(len(boxes), len(out))
    out[...] = -1
    out[:count, :4] = boxes[:count]
    out[:count, 4] = np.asarray(classes)[:count]
    return len(boxes) - count
