"""Multi-scale detection merging (spec section 8), with the reference's rules.

Each test scale is trusted only for objects whose size suits it: a detection survives at a scale when
its area ``(x2 - x1) * (y2 - y1)`` in original pixels (no +1, as the reference computes it) is above
``lo**2`` and at most ``hi**2`` of that scale's valid range (a bound <= 0, e.g. -1, is open). The
survivors of all scales are pooled and suppressed per class (Gaussian soft-NMS or NMS), then capped per
image: the ``TEST.MAX_PER_IMAGE``-th best score is the threshold and every detection scoring at least
that much stays, so ties at the threshold may keep a few more. Rows are ``[x1, y1, x2, y2, score,
label]`` throughout.

A scale's detections above ``TEST.SCORE_THRESH`` before its valid range are ``Candidates`` (what the
reference's tester keeps per scale, and what lib.inference.scale_cache stores): ``merge_candidates`` applies
the ranges, the suppression and the cap, the settings that can change without the network.
"""
from typing import NamedTuple

import numpy as np

from lib.boxes import nms, soft_nms


def in_test_range(boxes, valid_range):
    """Mask of ``boxes`` (N, 4) whose no-+1 area lies in ``(lo**2, hi**2]``; a bound <= 0 is open."""
    boxes = np.asarray(boxes).reshape(-1, 4)
    lo, hi = valid_range
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    mask = np.ones(len(boxes), dtype=bool)
    if lo > 0:
        mask &= area > lo * lo
    if hi > 0:
        mask &= area <= hi * hi
    return mask


class Candidates(NamedTuple):
    """A scale's detections above the score threshold, before its valid range: ``boxes`` (N, 4) in original
    pixels at the precision they were computed in (the range is tested on them), ``scores`` float32 (N,),
    ``labels`` int32 (N,) (1..C-1); roi by roi, classes in order within a roi."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


def thresholded(boxes, scores, score_thresh):
    """Candidates of class-agnostic ``boxes`` (R, 4) x ``scores`` (R, C): per foreground class, the scores
    above ``score_thresh``."""
    boxes = np.asarray(boxes).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float32)
    if scores.ndim != 2 or len(scores) != len(boxes):
        raise ValueError(f"scores must be (R, C) for {len(boxes)} boxes, got shape {scores.shape}")
    rows, classes = np.nonzero(scores[:, 1:] > score_thresh)
    return Candidates(boxes[rows], scores[rows, classes + 1], (classes + 1).astype(np.int32))


def thresholded_levels(per_level, score_thresh):
    """``[(boxes, scores), ...]`` of an image's levels -> their Candidates (a pipeline combiner)."""
    return [thresholded(boxes, scores, score_thresh) for boxes, scores in per_level]


def concat_candidates(parts):
    """One Candidates of ``parts`` in order (an image's regions at a level); none: an empty one."""
    if not parts:
        return Candidates(np.zeros((0, 4)), np.zeros(0, np.float32), np.zeros(0, np.int32))
    return Candidates(*(np.concatenate(column) for column in zip(*parts)))


def candidate_rows(candidates, valid_range):
    """float32 rows ``[x1, y1, x2, y2, score, label]`` of the Candidates inside ``valid_range``."""
    keep = in_test_range(candidates.boxes, valid_range)
    return np.hstack([np.asarray(candidates.boxes)[keep].astype(np.float32), candidates.scores[keep, None],
                      candidates.labels[keep, None].astype(np.float32)]).astype(np.float32)


def scale_candidates(boxes, scores, valid_range, score_thresh):
    """Detections of one scale: class-agnostic ``boxes`` (R,4, original pixels) x ``scores`` (R,C).

    Keeps boxes inside ``valid_range`` (tested at the boxes' own precision) and, per foreground class,
    scores above ``score_thresh``; rows come roi by roi, classes in order within a roi.
    """
    return candidate_rows(thresholded(boxes, scores, score_thresh), valid_range)


def cap_per_image(detections, max_per_image):
    """Detections scoring at least the ``max_per_image``-th best score (all when there are no more, or
    ``max_per_image`` <= 0), sorted by score."""
    if 0 < max_per_image < len(detections):
        threshold = np.sort(detections[:, 4])[-max_per_image]
        detections = detections[detections[:, 4] >= threshold]
    return detections[np.argsort(-detections[:, 4], kind="stable")]


def suppress(candidates, test_cfg):
    """Per-class soft-NMS (``TEST.SOFT_NMS``, Gaussian with ``SOFT_NMS_SIGMA``) or NMS at ``TEST.NMS``,
    then the per-image cap ``TEST.MAX_PER_IMAGE`` over all classes."""
    candidates = np.asarray(candidates, dtype=np.float32).reshape(-1, 6)
    kept = []
    for label in np.unique(candidates[:, 5]):
        dets = candidates[candidates[:, 5] == label, :5]
        if test_cfg.SOFT_NMS:
            dets = soft_nms(dets, sigma=test_cfg.SOFT_NMS_SIGMA, score_thresh=test_cfg.SCORE_THRESH,
                            method="gaussian")
        else:
            dets = dets[nms(dets, test_cfg.NMS)]
        kept.append(np.hstack([dets, np.full((len(dets), 1), label, dtype=np.float32)]))
    merged = np.concatenate(kept).astype(np.float32) if kept else np.zeros((0, 6), np.float32)
    return cap_per_image(merged, test_cfg.MAX_PER_IMAGE)


def merge_candidates(per_level, valid_ranges, test_cfg):
    """Merge an image's Candidates, one per parsed ``(lo, hi)`` of ``valid_ranges``: each level's inside its
    range, pooled level after level, suppressed and capped (``suppress``)."""
    if len(per_level) != len(valid_ranges):
        raise ValueError(f"{len(per_level)} scales of detections for {len(valid_ranges)} valid ranges")
    rows = [candidate_rows(candidates, valid_range) for candidates, valid_range in zip(per_level, valid_ranges)]
    return suppress(np.concatenate(rows) if rows else np.zeros((0, 6), np.float32), test_cfg)


def merge_scales(per_scale, valid_ranges, test_cfg):
    """Merge ``[(boxes (R,4), scores (R,C)), ...]``, one pair per parsed ``(lo, hi)`` of ``valid_ranges``
    (the test pyramid's); ``test_cfg`` (the TEST section) gives the score threshold, the suppression and
    the cap."""
    if len(per_scale) != len(valid_ranges):
        raise ValueError(f"{len(per_scale)} scales of detections for {len(valid_ranges)} valid ranges")
    return merge_candidates(thresholded_levels(per_scale, test_cfg.SCORE_THRESH), valid_ranges, test_cfg)
