"""Image scales and valid ranges (spec section 1).

Scales come in two forms, both accepted everywhere:
- factors: ``[3.0, 1.667, 512]``: each entry <= 10 multiplies the image; an entry > 10 is a target
  for the image's longer side in pixels (the paper's coarsest scale, "longer side to 512");
- resolutions: ``[[1400, 2000], [800, 1280], [-1, 512]]``: (shorter side target, longer side cap),
  -1 meaning "no constraint".
"""
from dataclasses import dataclass

import numpy as np

from lib.errors import UserError

# Factor-form entries above this are longer-side targets in pixels, not multipliers.
MAX_SCALE_FACTOR = 10.0


class ScaleError(UserError, ValueError):
    """A scale or valid-range specification that cannot be used."""


@dataclass(frozen=True)
class ScaleSpec:
    """One scale of the pyramid; ``image_scale`` gives its resize factor for an image."""

    factor: float = 0.0  # > 0: fixed multiplier
    short: float = -1.0  # shorter-side target in pixels (-1: none)
    long: float = -1.0  # longer-side cap (or target when short is -1) in pixels (-1: none)

    def image_scale(self, height, width):
        """The resize factor; the longer-side cap applies when the ROUNDED scaled side exceeds it, as
        the reference decides it (a side that rounds to the cap keeps the shorter-side factor)."""
        if self.factor > 0:
            return float(self.factor)
        short_side, long_side = float(min(height, width)), float(max(height, width))
        scale = self.short / short_side if self.short > 0 else self.long / long_side
        if self.long > 0 and round(scale * long_side) > self.long:
            scale = self.long / long_side
        return scale


def parse_scales(spec, key="SCALES"):
    """Parse a scale list of either form into ScaleSpec objects, finest first."""
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ScaleError(f"{key}: expected a non-empty list of scales, got {spec!r}")
    scales = []
    for entry in spec:
        if isinstance(entry, (list, tuple)):
            if len(entry) != 2:
                raise ScaleError(f"{key}: a resolution scale is [shorter, longer], got {entry!r}")
            short, long = (float(v) for v in entry)
            if (short <= 0 and short != -1) or (long <= 0 and long != -1) or short == long == -1:
                raise ScaleError(f"{key}: sides must be positive or -1 (not both -1), got {entry!r}")
            scales.append(ScaleSpec(short=short, long=long))
        elif isinstance(entry, (int, float)) and not isinstance(entry, bool) and entry > 0:
            if entry > MAX_SCALE_FACTOR:
                scales.append(ScaleSpec(long=float(entry)))
            else:
                scales.append(ScaleSpec(factor=float(entry)))
        else:
            raise ScaleError(f"{key}: a scale is a positive number or [shorter, longer], got {entry!r}")
    return scales


def parse_valid_ranges(spec, key="VALID_RANGES"):
    """Parse ``[[lo, hi], ...]`` (sqrt(area) in original pixels, -1 open) into float tuples."""
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ScaleError(f"{key}: expected a list of [lo, hi] ranges, got {spec!r}")
    ranges = []
    for entry in spec:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ScaleError(f"{key}: a valid range is [lo, hi], got {entry!r}")
        lo, hi = (float(v) for v in entry)
        if lo != -1 and hi != -1 and lo > hi:
            raise ScaleError(f"{key}: range {entry!r} has lo > hi")
        ranges.append((lo, hi))
    return ranges


@dataclass(frozen=True)
class ScaleLevel:
    """One level of a pyramid: how to resize an image, and the sqrt(area) range (original pixels, -1
    open) of the objects this level is trusted with."""

    spec: ScaleSpec
    valid_range: tuple


def pyramid(section, name):
    """The parsed levels (finest first) of a config section holding SCALES and VALID_RANGES, e.g.
    ``pyramid(cfg.TRAIN, "TRAIN")``: parse once per run and pass the levels on."""
    scales = parse_scales(section.SCALES, f"{name}.SCALES")
    ranges = parse_valid_ranges(section.VALID_RANGES, f"{name}.VALID_RANGES")
    if len(scales) != len(ranges):
        raise ScaleError(f"{name}.SCALES has {len(scales)} scales but {name}.VALID_RANGES has {len(ranges)} ranges")
    return tuple(ScaleLevel(spec, valid_range) for spec, valid_range in zip(scales, ranges))


def scaled_image_size(height, width, im_scale, truncate):
    """(height, width) in pixels of an image resized by ``im_scale``: truncated (``int(W * s)``, as the
    reference sizes the image its chips are cut from) or rounded; at least 1 px."""
    to_int = int if truncate else round
    return max(int(to_int(height * im_scale)), 1), max(int(to_int(width * im_scale)), 1)


def box_sqrt_area(boxes):
    """sqrt(area) of inclusive-pixel boxes (N,4)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    widths = boxes[:, 2] - boxes[:, 0] + 1
    heights = boxes[:, 3] - boxes[:, 1] + 1
    return np.sqrt(np.maximum(widths * heights, 0))


def in_valid_range(boxes, valid_range):
    """Mask of boxes whose sqrt(area) lies in ``valid_range`` = (lo, hi), -1 meaning open."""
    lo, hi = valid_range
    size = box_sqrt_area(boxes)
    mask = np.ones(len(size), dtype=bool)
    if lo != -1:
        mask &= size >= lo
    if hi != -1:
        mask &= size <= hi
    return mask
