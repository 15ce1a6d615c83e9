"""Faster R-CNN box-delta parameterisation for inclusive-pixel boxes, clipping to an image and mirroring.

A box of width ``w = x2 - x1 + 1`` has its centre at ``x1 + 0.5 * (w - 1)``; deltas are
``dx = (gx - x) / w, dy = (gy - y) / h, dw = log(gw / w), dh = log(gh / h)``, divided by ``stds``.
``decode(rois, encode(rois, gts)) == gts`` up to float rounding.
"""
import numpy as np

# Largest dw/dh accepted by decode: exp() of it scales a box by 1000/16, so a wild regression output
# gives a huge box instead of an inf/overflow.
MAX_LOG_SCALE = np.log(1000.0 / 16.0)


def _check_boxes(caller, name, boxes, multiple_of_4=False):
    """``boxes`` as a 2-D real array of shape (N, 4) or (N, 4k); any empty input becomes (0, 4)."""
    boxes = np.asarray(boxes)
    if boxes.dtype.kind not in "fiu":
        raise TypeError(f"{caller}: {name} must hold real numbers, got dtype {boxes.dtype}")
    if boxes.size == 0 and boxes.ndim != 2:
        return boxes.reshape(0, 4)
    columns = boxes.shape[-1] if boxes.ndim == 2 else -1
    if not (columns == 4 or (multiple_of_4 and columns > 0 and columns % 4 == 0)):
        expected = "(N, 4k)" if multiple_of_4 else "(N, 4)"
        raise ValueError(f"{caller}: {name} must have shape {expected}, got {boxes.shape}")
    return boxes


def _check_stds(caller, stds, dtype):
    stds = np.asarray(stds, dtype=dtype)
    if stds.shape != (4,) or not np.all(stds > 0):
        raise ValueError(f"{caller}: stds must be 4 positive numbers, got {stds.tolist()}")
    return stds


def _float_type(*arrays):
    """float32 when every input is float32 (the project's box dtype), else float64."""
    return np.result_type(np.float32, *arrays)


def _widths_heights_centres(boxes):
    widths = boxes[:, 2] - boxes[:, 0] + 1.0
    heights = boxes[:, 3] - boxes[:, 1] + 1.0
    return widths, heights, boxes[:, 0] + 0.5 * (widths - 1.0), boxes[:, 1] + 0.5 * (heights - 1.0)


def encode(rois, gts, stds=(1.0, 1.0, 1.0, 1.0)):
    """Regression targets (N, 4) ``(dx, dy, dw, dh) / stds`` that move each roi onto its gt."""
    rois = _check_boxes("encode", "rois", rois)
    gts = _check_boxes("encode", "gts", gts)
    if rois.shape[0] != gts.shape[0]:
        raise ValueError(f"encode: rois and gts must have the same number of rows, got {rois.shape} and {gts.shape}")
    dtype = _float_type(rois, gts)
    rois, gts = rois.astype(dtype, copy=False), gts.astype(dtype, copy=False)
    w, h, cx, cy = _widths_heights_centres(rois)
    gw, gh, gcx, gcy = _widths_heights_centres(gts)
    deltas = np.stack([(gcx - cx) / w, (gcy - cy) / h, np.log(gw / w), np.log(gh / h)], axis=1)
    return (deltas / _check_stds("encode", stds, dtype)).astype(dtype, copy=False)


def decode(boxes, deltas, stds=(1.0, 1.0, 1.0, 1.0), max_log_scale=MAX_LOG_SCALE):
    """Apply (N, 4k) deltas (k classes, or k=1 class-agnostic) to (N, 4) boxes: (N, 4k) boxes.

    ``max_log_scale`` caps dw/dh; None (or ``np.inf``) applies them as they are (the reference's proposal
    target and test decoding: in float64, a wild delta gives a huge box that clipping turns into an
    image-wide one)."""
    boxes = _check_boxes("decode", "boxes", boxes)
    deltas = _check_boxes("decode", "deltas", deltas, multiple_of_4=True)
    if boxes.shape[0] != deltas.shape[0]:
        raise ValueError(f"decode: boxes and deltas must have the same number of rows, got {boxes.shape} and {deltas.shape}")
    dtype = _float_type(boxes, deltas)
    boxes = boxes.astype(dtype, copy=False)
    deltas = deltas.astype(dtype, copy=False) * np.tile(_check_stds("decode", stds, dtype), deltas.shape[1] // 4)
    w, h, cx, cy = (column[:, None] for column in _widths_heights_centres(boxes))
    centre_x = deltas[:, 0::4] * w + cx
    centre_y = deltas[:, 1::4] * h + cy
    limit = np.inf if max_log_scale is None else max_log_scale
    with np.errstate(over="ignore"):
        half_w = 0.5 * (np.exp(np.minimum(deltas[:, 2::4], limit)) * w - 1.0)
        half_h = 0.5 * (np.exp(np.minimum(deltas[:, 3::4], limit)) * h - 1.0)
    decoded = np.empty_like(deltas)
    decoded[:, 0::4] = centre_x - half_w
    decoded[:, 1::4] = centre_y - half_h
    decoded[:, 2::4] = centre_x + half_w
    decoded[:, 3::4] = centre_y + half_h
    return decoded


def clip_boxes(boxes, height, width):
    """Copy of (N, 4k) boxes with x clipped to [0, width - 1] and y to [0, height - 1]."""
    boxes = _check_boxes("clip_boxes", "boxes", boxes, multiple_of_4=True)
    if not (height > 0 and width > 0):
        raise ValueError(f"clip_boxes: height and width must be positive, got {height} x {width}")
    upper = np.tile(np.array([width - 1, height - 1, width - 1, height - 1], dtype=boxes.dtype), boxes.shape[1] // 4)
    return np.clip(boxes, 0, upper)


def flip_boxes(boxes, width):
    """Mirror inclusive boxes horizontally in an image ``width`` pixels wide."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    flipped = boxes.copy()
    flipped[:, 0] = width - 1 - boxes[:, 2]
    flipped[:, 2] = width - 1 - boxes[:, 0]
    return flipped
