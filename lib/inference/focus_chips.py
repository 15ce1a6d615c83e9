"""AutoFocus FocusChips: the regions of the next (finer) test scale worth processing, from one scale's
FocusPixel map; and the rule that drops detections cut by a chip's border.

Reference rules (lib/chips/chips_inference.py ``gmask`` / ``add_chips`` and the ``check_valid`` of
lib/inference.py's Tester), matched exactly, for one processed region (the whole image at the coarsest
scale, a FocusChip later) at image scale ``scale``:

* FocusPixels: cells whose probability (channel 1 of ``scale_prob``) is >= the threshold, dilated by a
  d x d square (``cv2.dilate``).
* Rectangles: the bounding box of every contour (``cv2.findContours`` with RETR_LIST, so a hole's border
  gives a rectangle too; it is swallowed by its outer rectangle in the next round). Each grows to at
  least ``min_size`` cells a side around its centre (integer halves, as the reference's Python 2
  arithmetic) and is pushed inside the region's ceil(extent / stride) cells where it overhangs; the grown
  rectangles are painted into the map and the contours found again, until their number stops changing:
  overlapping rectangles merge into their union's bounding box.
* To pixels: cells x stride in the region's scaled pixels; a chip overhanging the region's right (bottom)
  edge ends at it and starts no later than min_size cells before it (and not before 0). Then / ``scale``
  and shifted by the region's origin: FocusChips are (x1, y1, x2, y2), half-open, in original pixels,
  which the next scale crops (int-truncated) and resizes by its own image scale.
* Merging (``border_keep_mask``): a detection of a FocusChip, in original pixels, is dropped when one of
  its edges lies within 10 px of an edge of the chip that is not on the image border.

Generalised: the reference hard-codes the stride 16 of its ResNet; here it is the backbone's (symbols/backbones.py).
"""
from dataclasses import dataclass

import cv2
import numpy as np


BORDER_MARGIN = 10.0  # original pixels: a detection edge this close to an inner chip edge was cut by it
BORDER_TOLERANCE = 0.5  # a chip edge within half a pixel of the image border is on it


@dataclass(frozen=True)
class FocusChipParams:
    dilation: int
    threshold: float
    min_size: int  # feature cells per side
    stride: int

    @classmethod
    def from_config(cls, cfg, scale_index, stride=None):
        """The parameters that turn the maps of TEST scale ``scale_index`` into the chips of the next one
        (TEST.CHIP_HYPERPARAMS[scale_index]; lib/config/validation.py checks them where the next scale is pruned);
        ``stride`` the network's (default: the backbone table's, which imports MXNet; an ONNX export's comes
        from its model.json)."""
        if stride is None:
            from symbols.backbones import feature_stride

            stride = feature_stride(cfg)
        dilation, threshold, min_size = cfg.TEST.CHIP_HYPERPARAMS[scale_index]
        return cls(dilation=int(dilation), threshold=float(threshold), min_size=int(min_size), stride=int(stride))


def focus_chips(focus_map, region, scale, params):
    """FocusChips (K, 4) float64 in original pixels from the FocusPixel probabilities ``focus_map`` (H, W)
    of ``region`` (x1, y1, x2, y2, half-open, original pixels) processed at image ``scale``.

    The map may extend past the region (the batch's padding): rectangles are kept inside the region.
    """
    width, height = (region[2] - region[0]) * scale, (region[3] - region[1]) * scale
    cells = (int(np.ceil(width / params.stride)), int(np.ceil(height / params.stride)))
    mask = (np.asarray(focus_map) >= params.threshold).astype(np.uint8)
    mask = cv2.dilate(mask, np.ones((params.dilation, params.dilation), np.uint8)) * np.uint8(255)
    chips = []
    for x, y, w, h in _merged_rectangles(mask, params.min_size, cells):
        x1, x2 = _to_pixels(x, w, width, params)
        y1, y2 = _to_pixels(y, h, height, params)
        chips.append([x1 / scale + region[0], y1 / scale + region[1], x2 / scale + region[0], y2 / scale + region[1]])
    return np.array(chips, np.float64).reshape(-1, 4)


def focus_pixel_boxes(focus_map, region, scale, stride, threshold):
    """The FocusPixels of a region's map as boxes: ``(boxes (K, 4) half-open original pixels, probabilities
    (K,))`` of the cells inside the region with probability >= ``threshold`` (drawing, inspection)."""
    width, height = (region[2] - region[0]) * scale, (region[3] - region[1]) * scale
    rows, cols = np.nonzero(np.asarray(focus_map)[:int(np.ceil(height / stride)), :int(np.ceil(width / stride))]
                            >= threshold)
    corners = np.stack([cols, rows, cols + 1, rows + 1], axis=1).astype(np.float64) * stride
    boxes = np.minimum(corners, [width, height, width, height]) / scale + np.array([*region[:2], *region[:2]])
    return boxes.reshape(-1, 4), np.asarray(focus_map)[rows, cols]


def border_keep_mask(boxes, chip, image_width, image_height):
    """(N,) bool: True for the detections ``boxes`` (N, 4+, original pixels) of ``chip`` that no inner chip
    edge cuts, i.e. none of their edges is within BORDER_MARGIN of a chip edge off the image border."""
    boxes = np.asarray(boxes, np.float64)
    x1, y1, x2, y2 = (float(v) for v in chip[:4])
    inner_edges = ((0, x1, x1 >= BORDER_TOLERANCE), (1, y1, y1 >= BORDER_TOLERANCE),
                   (2, x2, x2 < image_width - BORDER_TOLERANCE), (3, y2, y2 < image_height - BORDER_TOLERANCE))
    keep = np.ones(len(boxes), bool)
    for column, edge, inner in inner_edges:
        if inner:
            keep &= np.abs(boxes[:, column] - edge) >= BORDER_MARGIN
    return keep


def _contours(mask):
    return cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)[-2]  # OpenCV 3 and 4 signatures


def _grown(rectangle, min_size, cells):
    """A contour's bounding rectangle (x, y, w, h) in cells, grown to ``min_size`` and kept inside ``cells``."""
    x, y, w, h = rectangle
    x, w = _grown_span(x, w, min_size, cells[0])
    y, h = _grown_span(y, h, min_size, cells[1])
    return x, y, w, h


def _grown_span(start, length, min_size, limit):
    centre = (2 * start + length) // 2
    length = max(min_size, length)
    if centre + length // 2 >= limit:
        start = max(limit - length, 0)
    elif centre - length // 2 < 0:
        start = 0
    else:
        start = centre - length // 2
    return start, length


def _merged_rectangles(mask, min_size, cells):
    """Grown rectangles, painted and re-found until their number is stable (the reference's loop)."""
    contours, rectangles, previous = _contours(mask), [], -1
    while previous != len(rectangles):
        previous = len(rectangles)
        for contour in contours:
            x, y, w, h = _grown(cv2.boundingRect(contour), min_size, cells)
            mask[y:y + h, x:x + w] = 255
        contours = _contours(mask)
        rectangles = [_grown(cv2.boundingRect(contour), min_size, cells) for contour in contours]
    return rectangles


def _to_pixels(start, length, extent, params):
    """A span of cells -> (start, end) in the region's scaled pixels, ending at most at ``extent``."""
    first, last = start * params.stride, (start + length) * params.stride
    if last > extent:
        last = extent
        first = max(min(first, last - params.min_size * params.stride), 0)
    return first, last
