"""Multi-scale detection merging (spec section 8).

Each test scale is trusted only for objects whose size suits it: a detection survives at a scale when
its sqrt(area), in original pixels, lies in that scale's valid range. The survivors of all scales are
pooled and suppressed per class (Gaussian soft-NMS or NMS), then capped per image.
Rows are ``[x1, y1, x2, y2, score, label]`` throughout.
"""
import numpy as np

from lib.boxes import nms, soft_nms
from lib.scales import in_valid_range


def scale_candidates(boxes, scores, valid_range, score_thresh):
    """Detections of one scale: class-agnostic ``boxes`` (R,4, original pixels) x ``scores`` (R,C).

    Keeps boxes inside ``valid_range`` and, per foreground class, scores above ``score_thresh``.
    """
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float32)
    if scores.ndim != 2 or len(scores) != len(boxes):
        raise ValueError(f"scores must be (R, C) for {len(boxes)} boxes, got shape {scores.shape}")
    keep = in_valid_range(boxes, valid_range)
    boxes, scores = boxes[keep], scores[keep, 1:]
    rows, classes = np.nonzero(scores > score_thresh)
    return np.hstack([
        boxes[rows], scores[rows, classes][:, None], (classes + 1).astype(np.float32)[:, None]
    ]).astype(np.float32)


def suppress(candidates, test_cfg):
    """Per-class soft-NMS (``TEST.SOFT_NMS``, Gaussian with ``SOFT_NMS_SIGMA``) or NMS at ``TEST.NMS``,
    then the ``TEST.MAX_PER_IMAGE`` best detections over all classes, sorted by score."""
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
    order = np.argsort(-merged[:, 4], kind="stable")[: test_cfg.MAX_PER_IMAGE]
    return merged[order]


def merge_scales(per_scale, valid_ranges, test_cfg):
    """Merge ``[(boxes (R,4), scores (R,C)), ...]``, one pair per parsed ``(lo, hi)`` of ``valid_ranges``
    (the test pyramid's); ``test_cfg`` (the TEST section) gives the suppression and the cap."""
    if len(per_scale) != len(valid_ranges):
        raise ValueError(f"{len(per_scale)} scales of detections for {len(valid_ranges)} valid ranges")
    candidates = [scale_candidates(boxes, scores, valid_range, test_cfg.SCORE_THRESH)
                  for (boxes, scores), valid_range in zip(per_scale, valid_ranges)]
    return suppress(np.concatenate(candidates), test_cfg)
