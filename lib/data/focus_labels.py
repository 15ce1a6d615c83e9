"""AutoFocus FocusPixel labels of a training chip: which feature cells lie on a small object.

The FocusPixel branch (symbols/sniper.py, network.AUTO_FOCUS) is trained per chip on a map of
(CHIP_SIZE / stride)^2 cells, row-major in the ``scale_label`` input: 1 for cells on small objects,
0 elsewhere, -1 (ignored) around objects of ambiguous size. The rules are the reference's
(lib/data_utils/data_workers.py, the anchor worker's FocusPixel mask), rule for rule; the boxes are scaled in
float64 where the reference works in float32, so 0.004% of the coordinates round to the other whole pixel
(docs/reference_differences.md):

* Boxes: every gt box of the image (crowd regions are not gt boxes), in chip pixels: scaled by the
  chip's image scale, shifted to the chip, rounded to whole pixels (half to even, as ``np.round``) and
  clipped to the chip square [0, CHIP_SIZE - 1]. No size filter (the RPN's 10 px rule does not apply).
* Size s = sqrt((x2 - x1) * (y2 - y1)) of the clipped box, in chip pixels (no +1), so the thresholds
  TRAIN.AUTO_FOCUS_* are in pixels of the scale the chip was cut at, not original pixels.
* Mark: 1 if DC_LOW < s < SMALL_THRESH; -1 if s <= DC_LOW or SMALL_THRESH <= s < DC_HIGH; nothing if
  s >= DC_HIGH (large objects leave their cells as they are).
* Cells: columns floor(x1 / stride) .. ceil(x2 / stride) inclusive, rows alike, cut at the map edge.
  Boxes are taken in image order and a later mark replaces an earlier one.
* Unmarked cells are 0, also where the chip holds no image (padding).

A consequence kept for fidelity: a box outside the chip is clipped to a line on the chip's border
(s = 0), so it marks that border's cells beside it as ignored.
"""
from dataclasses import dataclass

import numpy as np

from symbols.backbones import feature_stride


@dataclass(frozen=True)
class FocusLabelParams:
    small_thresh: float
    dontcare_low: float
    dontcare_high: float
    stride: int  # of the features the branch reads (the backbone's, symbols/backbones.py)
    chip_size: int

    @classmethod
    def from_config(cls, cfg):
        train = cfg.TRAIN
        return cls(small_thresh=float(train.AUTO_FOCUS_SMALL_THRESH), dontcare_low=float(train.AUTO_FOCUS_DC_LOW),
                   dontcare_high=float(train.AUTO_FOCUS_DC_HIGH), stride=int(feature_stride(cfg)),
                   chip_size=int(train.CHIP_SIZE))

    @property
    def map_size(self):
        """Cells per side of the label map."""
        return self.chip_size // self.stride


def focus_labels(boxes, im_scale, chip, params):
    """The (map_size, map_size) float32 label map of ``chip`` (x1, y1, x2, y2 in scaled-image pixels) for
    the image's gt ``boxes`` (N, 4) in original pixels at ``im_scale``; flatten it for ``scale_label``."""
    return label_map(_in_chip_pixels(boxes, im_scale, chip, params.chip_size), params)


def label_map(chip_boxes, params):
    """The label map of boxes already in chip pixels (rounded and clipped as `focus_labels` does)."""
    size, stride = params.map_size, params.stride
    labels = np.zeros((size, size), np.float32)
    for x1, y1, x2, y2 in np.asarray(chip_boxes, np.float64).reshape(-1, 4):
        extent = np.sqrt((x2 - x1) * (y2 - y1))
        if params.dontcare_low < extent < params.small_thresh:
            mark = 1.0
        elif extent <= params.dontcare_low or params.small_thresh <= extent < params.dontcare_high:
            mark = -1.0
        else:
            continue
        labels[int(y1 // stride):int(np.ceil(y2 / stride)) + 1, int(x1 // stride):int(np.ceil(x2 / stride)) + 1] = mark
    return labels


def _in_chip_pixels(boxes, im_scale, chip, chip_size):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    origin = np.array([chip[0], chip[1], chip[0], chip[1]], np.float64)
    return np.clip(np.round(boxes * float(im_scale) - origin), 0, chip_size - 1)
