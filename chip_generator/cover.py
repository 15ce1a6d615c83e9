"""Positive-chip generation: the greedy cover of spec section 2 (candidate windows, validation, the
compiled core).

Two sets of candidate windows (config key TRAIN.CHIP_WINDOWS):

* ``reference`` (the reference's cchips.cpp): the three corner windows (top-right, bottom-left,
  bottom-right), the stride grid ``0, stride, .. < extent - chip`` in both directions, a column of
  windows along the right edge and a row along the bottom edge. The top-right corner is ``chip + 1``
  px tall, the bottom-left corner ``chip + 1`` px wide, the right-edge windows ``chip + 1`` px wide and
  the bottom-edge ones ``chip + 1`` px tall (when the image is larger than a chip that way): the
  network input keeps the first ``chip`` of them.
* ``clipped``: the stride grid plus the window flush with the far edge, along each axis, all windows
  ``min(chip, extent)`` px (never larger than the network input).
"""
import functools
import math
import numbers

import numpy as np

from chip_generator import _chips

WINDOW_RULES = ("reference", "clipped")


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


def _check_rule(windows):
    if windows not in WINDOW_RULES:
        raise ValueError(f"config key TRAIN.CHIP_WINDOWS: expected one of {WINDOW_RULES}, got {windows!r}")


def _distinct(lo, hi, extent):
    """The distinct intervals [lo, hi] (int64 arrays) sorted by (lo, hi), and each input's index among them."""
    keys, inverse = np.unique(lo * (extent + 1) + hi, return_inverse=True)
    return keys // (extent + 1), keys % (extent + 1), inverse.reshape(-1)


def _axis(extent, chip, stride, windows):
    """The window intervals along one axis: (lo, hi) of the distinct ones, and the index among them of the
    stride grid's intervals and of the rule's special ones (reference: flush, lead, edge; clipped: the
    grid already ends with the flush window)."""
    if windows == "clipped":
        grid = np.zeros(1, np.int64) if extent <= chip else \
            np.append(np.arange(0, extent - chip, stride, dtype=np.int64), extent - chip)
        lo, hi, index = _distinct(grid, grid + min(chip, extent) - 1, extent)
        return lo, hi, index, ()
    grid = np.arange(0, extent - chip, stride, dtype=np.int64)  # empty when the extent is not above a chip
    special_lo = np.array([max(extent - chip, 0), 0, max(extent - chip - 1, 0)], np.int64)
    special_hi = np.array([extent - 1, min(chip, extent - 1), extent - 1], np.int64)
    lo, hi, index = _distinct(np.concatenate([grid, special_lo]), np.concatenate([grid + chip - 1, special_hi]),
                              extent)
    return lo, hi, index[:len(grid)], index[len(grid):]


@functools.lru_cache(maxsize=4096)  # images of a dataset come in few sizes; the arrays are read-only
def _candidates(width, height, chip_size, stride, windows):
    """(x_lo, x_hi, y_lo, y_hi, cells): the distinct intervals along each axis (sorted, both ends
    non-decreasing: no interval lies strictly inside one that starts earlier, for either rule) and the
    candidate windows as cells ``ix * len(y_lo) + iy`` in enumeration order, each once."""
    x_lo, x_hi, gx, special_x = _axis(width, chip_size, stride, windows)
    y_lo, y_hi, gy, special_y = _axis(height, chip_size, stride, windows)
    ny = len(y_lo)
    grid = (gx[:, None] * ny + gy[None, :]).reshape(-1)
    if windows == "clipped":
        cells = grid
    else:
        (flush_x, lead_x, edge_x), (flush_y, lead_y, edge_y) = special_x, special_y
        corners = np.array([flush_x * ny + lead_y, lead_x * ny + flush_y, flush_x * ny + flush_y], np.int64)
        cells = np.concatenate([corners, grid, edge_x * ny + gy, gx * ny + edge_y])
        _, first = np.unique(cells, return_index=True)
        cells = cells[np.sort(first)]
    arrays = (x_lo, x_hi, y_lo, y_hi, cells.astype(np.int64))
    for array in arrays:
        array.setflags(write=False)
    return arrays


def _windows_of(x_lo, x_hi, y_lo, y_hi, cells):
    ix, iy = cells // len(y_lo), cells % len(y_lo)
    return np.stack([x_lo[ix], y_lo[iy], x_hi[ix], y_hi[iy]], axis=1)


def candidate_windows(width, height, chip_size, stride, windows):
    """The candidate windows (int64 (K, 4), inclusive pixels) of rule ``windows`` for an image of
    ``width`` x ``height`` px, in enumeration order (the order ``generate``'s shuffle permutes), each
    window once (its first occurrence)."""
    _check_rule(windows)
    return _windows_of(*_candidates(int(width), int(height), int(chip_size), int(stride), windows))


def generate(boxes, width, height, chip_size, stride, rng=None, windows="reference", order=None):
    """Chips (float32 (K, 4), inclusive pixels, pick order) covering every box that fits in a candidate
    window of rule ``windows`` (module docstring).

    `rng` (a seed or np.random.Generator) shuffles the candidates so ties break randomly; a fixed
    seed gives the same chips. ``order``, a permutation of the ``candidate_windows`` positions, replaces
    the shuffle (dev.parity replays the reference's ``rand()`` shuffle with it). Boxes with
    w, h <= chip_size - stride inside the image always fit.
    """
    boxes, width, height, chip_size, stride = validate_inputs(boxes, width, height, chip_size, stride)
    _check_rule(windows)
    if len(boxes) == 0:
        return np.zeros((0, 4), dtype=np.float32)
    x_lo, x_hi, y_lo, y_hi, cells = _candidates(width, height, chip_size, stride, windows)  # validated ints
    if order is None:
        order = np.random.default_rng(rng).permutation(len(cells)).astype(np.int64, copy=False)
    else:
        order = np.asarray(order, np.int64)
        if order.shape != (len(cells),) or not np.array_equal(np.sort(order), np.arange(len(cells))):
            raise ValueError(f"chip generator: order must be a permutation of the {len(cells)} candidate windows")
    picked = _chips.cover(boxes, x_lo, x_hi, y_lo, y_hi, np.ascontiguousarray(cells[order]))
    return _windows_of(x_lo, x_hi, y_lo, y_hi, cells[order[picked]]).astype(np.float32)
