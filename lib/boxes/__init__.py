"""Box primitives shared by chip generation, RPN targets, proposal targets and testing.

Boxes are inclusive-pixel ``(x1, y1, x2, y2)`` (width ``x2 - x1 + 1``), float32.
"""
from lib.boxes._cython_boxes import bbox_overlaps, ignore_overlaps, nms, soft_nms
from lib.boxes.anchors import base_anchors, grid_anchors
from lib.boxes.coder import clip_boxes, decode, encode, flip_boxes
from lib.boxes.matcher import ignore_near_invalid, match
from lib.boxes.sampler import subsample

__all__ = [
    "bbox_overlaps",
    "ignore_overlaps",
    "nms",
    "soft_nms",
    "base_anchors",
    "grid_anchors",
    "encode",
    "decode",
    "clip_boxes",
    "flip_boxes",
    "match",
    "ignore_near_invalid",
    "subsample",
]
