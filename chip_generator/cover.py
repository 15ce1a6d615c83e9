"""Positive-chip generation: the greedy cover of spec section 2 (validation + the compiled core)."""
import math
import numbers

import numpy as np

from chip_generator import _chips


def _positive_int(name, value):
    """An integral value > 0 as int (image sizes, chip size and stride are whole pixels)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"chip generator: {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0 or int(value) != value:
        raise ValueError(f"chip generator: {name} must be a whole number of pixels > 0, got {value!r}")
    return int(value)


def validate_inputs(boxes, width, height, chip_size, stride):
    """Checks the arguments of `generate`; returns (boxes as C-contiguous float32, width, height,
    chip_size, stride as ints). Raises ValueError naming the bad argument."""
    if not isinstance(boxes, np.ndarray) or boxes.dtype != np.float32:
        raise ValueError(f"chip generator: boxes must be a float32 numpy array, got "
                         f"{getattr(boxes, 'dtype', type(boxes).__name__)}")
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"chip generator: boxes must have shape (N, 4), got {boxes.shape}")
    if not np.isfinite(boxes).all():
        raise ValueError("chip generator: boxes contain NaN or infinite coordinates")
    negative = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if negative.any():
        first = int(np.flatnonzero(negative)[0])
        raise ValueError(f"chip generator: box {first} {boxes[first].tolist()} has negative size (x2 < x1 or y2 < y1)")
    sizes = [_positive_int(name, value) for name, value in
             (("width", width), ("height", height), ("chip_size", chip_size), ("stride", stride))]
    return (np.ascontiguousarray(boxes), *sizes)


def candidate_grid(width, height, chip_size, stride):
    """Candidate windows as (xs, ys, window width, window height); candidate k is
    (xs[k // len(ys)], ys[k % len(ys)]), clipped to the image when the image is smaller than a chip."""
    xs = _chips.candidate_offsets(width, chip_size, stride)
    ys = _chips.candidate_offsets(height, chip_size, stride)
    return xs, ys, min(chip_size, width), min(chip_size, height)


def generate(boxes, width, height, chip_size, stride, rng=None):
    """Chips (float32 (K, 4), inclusive pixels, pick order) covering every box that fits in a candidate.

    `rng` (a seed or np.random.Generator) shuffles the candidates so ties break randomly; a fixed
    seed gives the same chips. Boxes with w, h <= chip_size - stride inside the image always fit.
    """
    boxes, width, height, chip_size, stride = validate_inputs(boxes, width, height, chip_size, stride)
    if len(boxes) == 0:
        return np.zeros((0, 4), dtype=np.float32)
    xs, ys, win_w, win_h = candidate_grid(width, height, chip_size, stride)
    order = np.random.default_rng(rng).permutation(len(xs) * len(ys)).astype(np.int64, copy=False)
    picked = _chips.cover(boxes, xs, ys, win_w, win_h, order)
    x1 = xs[picked // len(ys)]
    y1 = ys[picked % len(ys)]
    return np.stack([x1, y1, x1 + win_w - 1, y1 + win_h - 1], axis=1).astype(np.float32)
