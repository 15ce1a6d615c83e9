"""IoU labelling of anchors or rois against ground-truth boxes.

One rule shared by the RPN targets (lib/data) and the NumPy reference of the proposal-target
operator, so both label the same way: 1 positive, 0 negative, -1 ignored.
"""
import numpy as np


def _check_overlaps(caller, overlaps):
    overlaps = np.asarray(overlaps)
    if overlaps.ndim != 2:
        raise ValueError(f"{caller}: overlaps must have shape (N, K), got {overlaps.shape}")
    return overlaps


def match(overlaps, pos_thresh, neg_thresh, allow_low_quality=True, strict=False):
    """Label each row of an (N, K) IoU matrix (rows: anchors/rois, columns: gt boxes).

    Returns ``(matched_gt_index (N,) int64, labels (N,) int32)``:

    * ``matched_gt_index[n]`` is the gt with the highest IoU for row n (first one on ties), for every
      row whatever its label; -1 for all rows when there are no gts (K == 0).
    * label 0 when the row's best IoU is ``< neg_thresh``, 1 when it is ``>= pos_thresh``,
      otherwise -1. With ``strict=True`` the comparisons become ``<= neg_thresh`` and ``> pos_thresh``
      (e.g. "foreground if IoU > 0.5, else background" is ``strict=True, pos=neg=0.5``).
    * ``allow_low_quality``: every gt's best rows also become positive (all rows tied at that
      gt's maximum, if the maximum is > 0), so a gt that no row reaches ``pos_thresh`` for still gets one.
    * With K == 0 every row is negative.
    """
    overlaps = _check_overlaps("match", overlaps)
    if neg_thresh > pos_thresh:
        raise ValueError(f"match: neg_thresh ({neg_thresh}) must not exceed pos_thresh ({pos_thresh})")
    num_rows, num_gts = overlaps.shape
    if num_gts == 0:
        return np.full(num_rows, -1, np.int64), np.zeros(num_rows, np.int32)
    matched = overlaps.argmax(axis=1).astype(np.int64)
    best = overlaps[np.arange(num_rows), matched]
    labels = np.full(num_rows, -1, np.int32)
    if strict:
        labels[best <= neg_thresh] = 0
    else:
        labels[best < neg_thresh] = 0
    if allow_low_quality and num_rows > 0:
        gt_best = overlaps.max(axis=0)
        is_gt_best = (overlaps == gt_best[None, :]) & (gt_best[None, :] > 0)
        labels[is_gt_best.any(axis=1)] = 1
    if strict:
        labels[best > pos_thresh] = 1
    else:
        labels[best >= pos_thresh] = 1
    return matched, labels


def ignore_near_invalid(labels, invalid_overlaps, thresh):
    """Copy of labels with -1 on rows whose IoU with any invalid box is above ``thresh``.

    ``invalid_overlaps`` is the (N, M) IoU of the rows with boxes outside the scale's valid range:
    such objects must be neither positives nor negatives, whatever ``match`` said.
    """
    labels = np.array(labels, copy=True)
    invalid_overlaps = _check_overlaps("ignore_near_invalid", invalid_overlaps)
    if invalid_overlaps.shape[0] != labels.shape[0]:
        raise ValueError(
            f"ignore_near_invalid: invalid_overlaps has {invalid_overlaps.shape[0]} rows for {labels.shape[0]} labels"
        )
    if invalid_overlaps.shape[1] > 0:
        labels[invalid_overlaps.max(axis=1) > thresh] = -1
    return labels
