"""RPN training targets of one chip (spec section 4), built on lib.boxes anchors/matcher/sampler.

Valid boxes (inside this scale's range) make positives and negatives; anchors that overlap an
invalid box are ignored so that objects of the wrong size are neither. The outputs use the layout of
lib/boxes/anchors.py: labels (A, H, W) flattened, targets and weights (4A, H, W) with channel 4a + c.
"""
from dataclasses import dataclass

import numpy as np

from lib.boxes import base_anchors, bbox_overlaps, encode, grid_anchors, ignore_near_invalid, match, subsample


@dataclass(frozen=True)
class AnchorTargetParams:
    """The config numbers the RPN targets depend on (cfg.network / cfg.TRAIN keys): the config is
    their only source, ``from_config`` the only way in."""

    chip_size: int
    feat_stride: int
    ratios: tuple
    scales: tuple
    allowed_border: float
    positive_overlap: float
    negative_overlap: float
    invalid_overlap: float
    batch_size: int
    fg_fraction: float

    @classmethod
    def from_config(cls, cfg):
        from symbols.backbones import feature_stride  # imports MXNet; the test pipeline's workers need none

        train, network = cfg.TRAIN, cfg.network
        return cls(
            chip_size=int(train.CHIP_SIZE),
            feat_stride=int(feature_stride(cfg)),
            ratios=tuple(network.ANCHOR_RATIOS),
            scales=tuple(network.ANCHOR_SCALES),
            allowed_border=float(train.RPN_ALLOWED_BORDER),
            positive_overlap=float(train.RPN_POSITIVE_OVERLAP),
            negative_overlap=float(train.RPN_NEGATIVE_OVERLAP),
            invalid_overlap=float(train.RPN_INVALID_OVERLAP),
            batch_size=int(train.RPN_BATCH_SIZE),
            fg_fraction=float(train.RPN_FG_FRACTION),
        )


class AnchorTargeter:
    """Labels the fixed anchor grid of a chip against its boxes; anchors are built once per loader."""

    def __init__(self, params):
        self.params = params
        self.feat_size = params.chip_size // params.feat_stride
        base = base_anchors(params.feat_stride, params.ratios, params.scales)
        self.num_anchors = len(base)
        self.anchors = grid_anchors(base, self.feat_size, self.feat_size, params.feat_stride)

    @property
    def label_shape(self):
        return (self.num_anchors * self.feat_size * self.feat_size,)

    @property
    def target_shape(self):
        return (4 * self.num_anchors, self.feat_size, self.feat_size)

    def inside_anchors(self, height, width):
        """Indices of anchors at most ``allowed_border`` px outside the top-left height x width px."""
        border, a = self.params.allowed_border, self.anchors
        keep = (a[:, 0] >= -border) & (a[:, 1] >= -border) & (a[:, 2] < width + border) & (a[:, 3] < height + border)
        return np.flatnonzero(keep)

    def __call__(self, valid_boxes, invalid_boxes, height, width, rng, out=None):
        """Targets for a chip; anchors are kept within ``allowed_border`` of its top-left ``height`` x
        ``width`` px (the whole input as the reference has it, or the chip's content: TRAIN.RPN_ANCHOR_BORDER).

        ``valid_boxes`` / ``invalid_boxes``: float32 (N, 4) in chip pixels, already filtered by size.
        ``rng`` draws the 256-anchor sample. ``out``: optional (label, bbox_target, bbox_weight) arrays
        of the shapes above to fill in place (shared-memory batch slots). Returns that triple.
        """
        p = self.params
        if out is None:
            out = (np.empty(self.label_shape, np.float32), np.empty(self.target_shape, np.float32),
                   np.empty(self.target_shape, np.float32))
        label_out, target_out, weight_out = out
        valid_boxes = np.asarray(valid_boxes, np.float32).reshape(-1, 4)
        invalid_boxes = np.asarray(invalid_boxes, np.float32).reshape(-1, 4)

        inside = self.inside_anchors(height, width)
        anchors = self.anchors[inside]
        # Computed as (boxes, anchors) and viewed transposed: the matcher's per-box reductions then run
        # over contiguous memory (3x faster than on a C-ordered (anchors, boxes) array).
        overlaps = bbox_overlaps(np.concatenate([valid_boxes, invalid_boxes]), anchors).T
        num_valid = len(valid_boxes)
        matched, labels = match(overlaps[:, :num_valid], p.positive_overlap, p.negative_overlap)
        labels = ignore_near_invalid(labels, overlaps[:, num_valid:], p.invalid_overlap)
        labels = subsample(labels, p.batch_size, p.fg_fraction, rng)

        size, num_anchors = self.feat_size, self.num_anchors
        all_labels = np.full(len(self.anchors), -1, np.float32)
        all_labels[inside] = labels
        label_out[...] = all_labels.reshape(size, size, num_anchors).transpose(2, 0, 1).reshape(-1)

        target_out[...] = 0
        weight_out[...] = 0
        positive = np.flatnonzero(labels == 1)
        if len(positive):
            deltas = encode(anchors[positive], valid_boxes[matched[positive]])
            index = inside[positive]  # (h, w, a) order
            a, w, h = index % num_anchors, (index // num_anchors) % size, index // (num_anchors * size)
            channels = 4 * a[:, None] + np.arange(4)
            target_out[channels, h[:, None], w[:, None]] = deltas
            weight_out[channels, h[:, None], w[:, None]] = 1.0
        return out
