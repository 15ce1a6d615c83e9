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
``region_plan`` plans whole images (read reduced when large) or their tiles at every level, as the
whole-image and tiled tests run them.
"""
from dataclasses import dataclass, field, replace

import numpy as np

from lib.dataset.large_images import is_large, shrink_factor
from lib.inference.batching import plan_level
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
    test pyramid's levels) and ``scales`` (its image's resize factor there), and the ``batches`` (TestBatch,
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


def whole_region(source, index, size, scale):
    """The region of a whole image at ``scale``: reduced while read when it is a large file (a source with
    window reads, lib.inference.regions) and the scale is below 1/2."""
    height, width = size  # decided without opening the file: the pipeline's workers open it, not their parent
    shrink = shrink_factor(scale) if is_large(height, width) and hasattr(source, "windowed") else 1
    return Region(index, (0.0, 0.0, float(width), float(height)), shrink)


def plan_regions(regions, scales, spec, batch_size, parts, canvas_multiple, offset=0):
    """TestBatches (pipeline level 0) of ``regions`` at their images' ``scales`` (multiplied by each
    region's shrink), indices shifted by ``offset``."""
    batches = plan_level([r.read_extent for r in regions], spec, batch_size, parts, 0, canvas_multiple,
                         scales=[s * r.shrink for r, s in zip(regions, scales)])
    return [replace(b, images=tuple(i + offset for i in b.images)) for b in batches if b.images]


def plan_tiles(tiles, scales, spec, batch_size, canvas_multiple, offset=0):
    """TestBatches of ``tiles`` (an image's tiles after another's) at ``scales``: consecutive tiles share a
    canvas, so that an image's tiles are read one after the other (the reference's ordering by area, kept
    for whole images, would scatter them over the set and decode each image once per tile)."""
    return [batch for start in range(0, len(tiles), batch_size)
            for batch in plan_regions(tiles[start:start + batch_size], scales[start:start + batch_size], spec,
                                      min(batch_size, len(tiles) - start), 1, canvas_multiple, offset + start)]


def region_plan(cfg, planner, source, tiling=None, numbers=None):
    """The RegionPlan of the test pyramid of ``planner`` (a lib.inference.batching.BatchPlanner; the levels
    ``numbers``, default all) on the images of
    ``source``: per level every image whole (read reduced when large), or in the tiles of ``tiling`` (a
    Tiling) where it is larger than one. The images that fit keep the reference's batches
    (``batching.plan_level``; without a tiling, those of ``batching.plan``), an image's tiles share canvases
    one after the other."""
    test, network = cfg.TEST, cfg.network
    plan, sizes = RegionPlan(), source.sizes()
    for number in range(len(planner.levels)) if numbers is None else numbers:
        level = planner.levels[number]
        wholes, tiles = ([], []), ([], [])  # (regions, scales) of the images that fit, of the tiles of the others
        for index, size in enumerate(sizes):
            scale = level.spec.image_scale(*size)
            region = whole_region(source, index, size, scale)
            parts = [region] if tiling is None else tiling.split(region, scale)
            kind = wholes if parts[0].core is None else tiles
            kind[0].extend(parts)
            kind[1].extend([scale] * len(parts))
        batch_size = planner.batch_counts([level])[0]
        batches = plan_regions(*wholes, level.spec, batch_size, test.BATCH_PARTS, network.IMAGE_STRIDE)
        batches += plan_tiles(*tiles, level.spec, batch_size, network.IMAGE_STRIDE, len(wholes[0]))
        plan.add_level(number, wholes[0] + tiles[0], wholes[1] + tiles[1], batches)
    return plan


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
