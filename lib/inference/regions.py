"""Parts of test images processed as images of their own: AutoFocus's FocusChips and the tiles of the
tiled test (lib.inference.tiling).

A ``Region`` is a box of one image in original pixels (half-open, fractional for a FocusChip); it is
cropped as the reference crops chips (whole pixels, ``int()`` of its corners, inside the image) and
resized by its image's factor at its level. A region of a large image (lib.dataset.large_images) is read
from the file by windows, reduced by ``shrink`` while it is read when the level's scale is below 1/2;
the pipeline then sees an image ``shrink`` times smaller, planned and resized at ``shrink`` times the
scale, and ``to_image`` maps its detections back.

A ``RegionPlan`` records what a test run processed as regions, level after level, with the batches that
ran them: the instance-mask pass (lib.inference.masks) runs the same regions on the same canvases.
"""
from dataclasses import dataclass, field, replace

import numpy as np

from lib.inference.streaming import run_pipeline


@dataclass(frozen=True)
class Region:
    """A part of image ``image`` processed at a level: ``box`` (x1, y1, x2, y2), half-open, original pixels,
    read reduced by the integer ``shrink``; a tile also has the ``core`` (x1, y1, x2, y2, infinite at the
    image's sides) that owns the detections centred in it (lib.inference.tiling)."""

    image: int
    box: tuple
    shrink: int = 1
    core: tuple = None

    @property
    def extent(self):
        """(height, width) in original pixels, fractional for a FocusChip."""
        return self.box[3] - self.box[1], self.box[2] - self.box[0]

    @property
    def read_extent(self):
        """(height, width) of the pixels the pipeline gets: the extent reduced by ``shrink``."""
        return tuple(side / self.shrink for side in self.extent)

    def to_image(self, boxes):
        """Boxes (N, 4) in the region's read pixels -> float64 (N, 4) in the image's original pixels."""
        return np.asarray(boxes, np.float64).reshape(-1, 4) * self.shrink + np.array(self.box[:2] * 2, np.float64)


@dataclass
class RegionPlan:
    """Regions processed by a test run: ``regions`` (Region), each one's pyramid ``levels`` (index into the
    Detector's levels) and ``scales`` (its image's resize factor there), and the ``batches`` (TestBatch,
    pipeline level 0, ``images`` positions into ``regions``) that ran them, level after level."""

    regions: list = field(default_factory=list)
    levels: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    batches: list = field(default_factory=list)

    def add_level(self, level, regions, scales, batches):
        """Append a level's ``regions`` and ``scales`` and its ``batches`` (positions into ``regions``)."""
        self.extend(RegionPlan(list(regions), [level] * len(regions), list(scales), list(batches)))

    def extend(self, other):
        """Append the regions and batches of the RegionPlan ``other``."""
        offset = len(self.regions)
        self.regions += other.regions
        self.levels += other.levels
        self.scales += other.scales
        self.batches += [replace(b, images=tuple(i + offset for i in b.images)) for b in other.batches]

    def in_image_order(self, batches=None):
        """``batches`` (default: the plan's) by the last image they serve, then by level: an image's
        regions run close together, so that its results complete early and its pixels are read once."""
        batches = self.batches if batches is None else batches
        return sorted(batches, key=lambda b: (max(self.regions[i].image for i in b.images),
                                              self.levels[b.images[0]]))


def windowed(source, index):
    """The opened large image of ``source``'s image ``index`` when it is read by windows, else None."""
    opener = getattr(source, "windowed", None)
    return opener(index) if opener is not None else None


class RegionImages:
    """Regions as pipeline images: each read is the crop of its image (``int()`` of the corners, inside
    the image); ``sizes()`` are the fractional read extents the canvases are planned from, so a crop
    resized may overhang its canvas and is cut."""

    cut_to_canvas = True

    def __init__(self, source, regions):
        self.source, self.regions = source, regions
        self._last = (None, None)  # the image of the last read: an image's regions come one after another

    def sizes(self):
        return [region.read_extent for region in self.regions]

    def describe(self, index):
        region = self.regions[index]
        return f"{self.source.describe(region.image)} (region {tuple(round(v, 1) for v in region.box)})"

    def read(self, index):
        region = self.regions[index]
        x1, y1, x2, y2 = (int(v) for v in region.box)
        large = windowed(self.source, region.image)
        if large is not None:
            return large.window(x1, y1, x2, y2, region.shrink)
        if self._last[0] != region.image:
            self._last = (region.image, self.source.read(region.image))
        image = self._last[1]
        return image[max(y1, 0):min(y2, image.shape[0]), max(x1, 0):min(x2, image.shape[1])]


def run_regions(network, source, regions, batches, cfg, num_workers, alive):
    """Yield ``(position, result)`` per region of ``regions`` run through the pipeline (lib.inference.streaming,
    ``batches`` planned on them) whose image is still in ``alive`` (a dict by image index): a result is the
    region's ``[per-level result]``, or the IOError of an unreadable image, yielded once; the image is then
    removed from ``alive`` and its other regions are skipped."""
    if not regions:
        return
    for position, result in run_pipeline(network, RegionImages(source, regions), batches, 1, list,
                                         cfg.network.PIXEL_MEANS, cfg.network.CHANNEL_ORDER, num_workers,
                                         timeout=cfg.TEST.LOADER_TIMEOUT, warn_after=cfg.TEST.STALL_WARN):
        image = regions[position].image
        if image not in alive:  # unreadable: already reported
            continue
        if isinstance(result, Exception):
            del alive[image]
        yield position, result
