"""Pure-Python greedy cover (spec section 2), written as plainly as possible.

The single reference against which the compiled `chip_generator.generate` is tested and benchmarked;
not for production use (it is O(picks x candidates x boxes)).
"""
import numpy as np

from chip_generator.cover import validate_inputs


def reference_offsets(extent, chip_size, stride):
    """Window offsets along one axis of the clipped rule: 0, stride, 2*stride, ... then the window
    flush with the far edge."""
    if extent <= chip_size:
        return [0]
    offsets = []
    offset = 0
    while offset < extent - chip_size:
        offsets.append(offset)
        offset += stride
    offsets.append(extent - chip_size)
    return offsets


def reference_windows(width, height, chip_size, stride, windows):
    """The candidate windows in enumeration order, each once (first occurrence kept)."""
    cs = chip_size
    candidates = []
    if windows == "clipped":
        w, h = min(cs, width), min(cs, height)
        for x in reference_offsets(width, cs, stride):
            for y in reference_offsets(height, cs, stride):
                candidates.append((x, y, x + w - 1, y + h - 1))
    else:
        candidates.append((max(width - cs, 0), 0, width - 1, min(cs, height - 1)))  # top-right corner
        candidates.append((0, max(height - cs, 0), min(cs, width - 1), height - 1))  # bottom-left corner
        candidates.append((max(width - cs, 0), max(height - cs, 0), width - 1, height - 1))  # bottom-right
        for x in range(0, width - cs, stride):
            for y in range(0, height - cs, stride):
                candidates.append((x, y, x + cs - 1, y + cs - 1))
        for y in range(0, height - cs, stride):  # right edge
            candidates.append((max(width - cs - 1, 0), y, width - 1, y + cs - 1))
        for x in range(0, width - cs, stride):  # bottom edge
            candidates.append((x, max(height - cs - 1, 0), x + cs - 1, height - 1))
    unique, seen = [], set()
    for candidate in candidates:
        if candidate not in seen:
            unique.append(candidate)
            seen.add(candidate)
    return unique


def reference_generate(boxes, width, height, chip_size, stride, rng=None, windows="reference"):
    """Same contract as chip_generator.generate; the same seed gives the same candidate order."""
    boxes, width, height, chip_size, stride = validate_inputs(boxes, width, height, chip_size, stride)
    if len(boxes) == 0:
        return np.zeros((0, 4), dtype=np.float32)
    candidates = reference_windows(width, height, chip_size, stride, windows)
    order = np.random.default_rng(rng).permutation(len(candidates))
    boxes = boxes.tolist()
    uncovered = set(range(len(boxes)))
    chips = []
    while True:
        best, best_count = None, 0
        for k in order:
            cx1, cy1, cx2, cy2 = candidates[k]
            count = 0
            for b in uncovered:
                x1, y1, x2, y2 = boxes[b]
                if x1 >= cx1 and y1 >= cy1 and x2 <= cx2 and y2 <= cy2:
                    count += 1
            if count > best_count:
                best, best_count = k, count
        if best is None:
            break
        cx1, cy1, cx2, cy2 = candidates[best]
        chips.append(candidates[best])
        uncovered = {b for b in uncovered
                     if not (boxes[b][0] >= cx1 and boxes[b][1] >= cy1 and boxes[b][2] <= cx2 and boxes[b][3] <= cy2)}
    return np.array(chips, dtype=np.float32).reshape(-1, 4)
