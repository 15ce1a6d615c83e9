"""The detections of one image as the Python API returns them (``Detector.__call__``)."""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Detections:
    """Detections of one image, best first: ``boxes`` float32 (N, 4) ``x1, y1, x2, y2`` in original
    pixels, ``scores`` float32 (N,), ``labels`` int (N,) contiguous class labels (0 is background, never
    detected) and ``names`` their class names; ``masks`` boolean (N, H, W) instance masks in the image
    (networks trained with TRAIN.WITH_MASK, lib.inference.masks), else None."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: tuple
    masks: np.ndarray = None

    @classmethod
    def from_array(cls, detections, class_names):
        """From the Detector's float32 (N, 6) ``[x1, y1, x2, y2, score, label]`` rows."""
        detections = np.asarray(detections, np.float32).reshape(-1, 6)
        detections = detections[np.argsort(-detections[:, 4], kind="stable")]
        labels = detections[:, 5].astype(np.int64)
        return cls(detections[:, :4], detections[:, 4], labels, tuple(class_names[label] for label in labels))

    def __len__(self):
        return len(self.scores)

    def above(self, thresh):
        """The detections scoring at least ``thresh``."""
        keep = self.scores >= thresh
        return Detections(self.boxes[keep], self.scores[keep], self.labels[keep],
                          tuple(name for name, kept in zip(self.names, keep) if kept),
                          None if self.masks is None else self.masks[keep])

    def to_array(self):
        """Float32 (N, 6) ``[x1, y1, x2, y2, score, label]`` rows (lib.drawing, the evaluators)."""
        return np.hstack([self.boxes, self.scores[:, None], self.labels[:, None]]).astype(np.float32)
