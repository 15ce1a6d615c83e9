"""Turning raw annotation boxes into clean roidb entries, shared by the COCO and VOC readers.

Real annotation files hold a few broken boxes (NaN, negative size, outside the image). Each one is
skipped or clipped, never silently: a ``BoxReport`` counts them per reason with example ids and logs
one summary per dataset, so a bad file shows up in the log instead of in the training loss.
"""
import logging
import os
from collections import defaultdict

import numpy as np

from lib.errors import DataError


logger = logging.getLogger(__name__)

# How many example ids a log line names per reason.
MAX_EXAMPLES = 5


class BoxReport:
    """Per-reason counts of skipped and fixed boxes of one dataset, with the first few ids of each."""

    def __init__(self, source):
        self.source = source
        self.skipped = defaultdict(int)
        self.fixed = defaultdict(int)
        self._examples = defaultdict(list)

    def _add(self, tally, reason, refs):
        refs = list(refs)
        if refs:
            tally[reason] += len(refs)
            examples = self._examples[reason]
            examples.extend(refs[: MAX_EXAMPLES - len(examples)])

    def skip(self, reason, refs):
        """Record boxes left out of the roidb (``refs``: the annotation ids or names)."""
        self._add(self.skipped, reason, refs)

    def fix(self, reason, refs):
        """Record boxes kept after a correction."""
        self._add(self.fixed, reason, refs)

    def log(self):
        for verb, tally in (("skipped", self.skipped), ("fixed", self.fixed)):
            for reason, count in sorted(tally.items()):
                examples = ", ".join(str(r) for r in self._examples[reason])
                logger.warning("%s: %s %d boxes: %s (e.g. %s)", self.source, verb, count, reason, examples)

    def counts(self):
        """``{reason: count}`` over skipped and fixed boxes, for callers and tests."""
        return {**self.skipped, **self.fixed}


def clean_boxes(corners, height, width, refs, report):
    """Validate inclusive ``(x1, y1, x2, y2)`` boxes; clip the ones that stick out of their image.

    ``height``/``width`` are one image's size or per-row arrays. Returns ``(keep, boxes)``: a bool
    mask over the input rows and the kept rows as float32, clipped to the image. NaN/inf, reversed
    corners and boxes entirely outside the image are skipped.
    """
    corners = np.asarray(corners, dtype=np.float64).reshape(-1, 4)
    refs = np.asarray(refs, dtype=object)
    # per-row inclusive upper bounds (W - 1, H - 1, W - 1, H - 1)
    upper = np.broadcast_to(np.stack(np.broadcast_arrays(width - 1.0, height - 1.0), axis=-1), (len(corners), 2))
    upper = np.tile(upper, 2)
    finite = np.isfinite(corners).all(axis=1)
    report.skip("non-finite coordinates", refs[~finite])
    safe = np.where(finite[:, None], corners, 0.0)
    ordered = (safe[:, 2] >= safe[:, 0]) & (safe[:, 3] >= safe[:, 1])
    report.skip("x2 < x1 or y2 < y1", refs[finite & ~ordered])
    keep = finite & ordered
    outside = (safe[:, :2] > upper[:, :2]).any(axis=1) | (safe[:, 2:] < 0).any(axis=1)
    report.skip("entirely outside the image", refs[keep & outside])
    keep &= ~outside
    kept = corners[keep]
    clipped = np.clip(kept, 0, upper[keep])
    report.fix("clipped to the image", refs[keep][(clipped != kept).any(axis=1)])
    return keep, clipped.astype(np.float32)


def escapes_folder(name):
    """Whether an image name from an annotation file (``file_name``, a list-file entry) would resolve
    outside the folder it is joined to: absolute, or climbing out with ``..``. The rule is lexical, on
    the name alone: a symlink inside the folder that points elsewhere (the COCO minival layout links its
    images from ``val2014``) stays allowed, since the user put it there; a name an annotation file chose
    cannot reach files the user did not put beside the data."""
    normal = os.path.normpath(name)
    return os.path.isabs(name) or normal == os.pardir or normal.startswith(os.pardir + os.sep)


def make_entry(image_path, image_id, height, width, boxes, gt_classes, crowd_boxes, difficult=None):
    """One roidb entry (ARCHITECTURE.md) with the dtypes the rest of the pipeline expects.

    ``difficult`` marks VOC boxes that evaluation must ignore; readers always set it, training drops it.
    """
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    return {
        "image": image_path,
        "id": int(image_id),
        "height": int(height),
        "width": int(width),
        "boxes": boxes,
        "gt_classes": np.asarray(gt_classes, dtype=np.int32).reshape(-1),
        "flipped": False,
        "crowd_boxes": np.asarray(crowd_boxes, dtype=np.float32).reshape(-1, 4),
        "difficult": np.zeros(len(boxes), bool) if difficult is None else np.asarray(difficult, bool).reshape(-1),
    }


def split_image_sets(image_set):
    """``"a+b"`` -> ``["a", "b"]``; an empty part is an error naming the whole string."""
    parts = [part.strip() for part in str(image_set).split("+")]
    if not all(parts):
        raise DataError(f"image set {image_set!r}: expected names joined with '+', found an empty name")
    return parts
