"""The tiled test (TEST.TILE = [size, overlap], network pixels): large images at every scale in tiles.

A scaled image (or AutoFocus chip) larger than ``size`` on a side is cut into tiles of at most ``size`` x
``size`` network pixels that overlap by at least ``overlap``; one that fits stays whole. Tiles are whole
original pixels: ``floor(size / s)`` a side at scale ``s``, stepping by that minus ``ceil(overlap / s)``,
the last one ending at the image's edge. Each tile is a region (lib.inference.regions) batched on shared
canvases like whole images (``TEST.BATCH_IMAGES`` tiles per device, canvases of the largest), an image's
tiles one after the other, while the images that fit keep the reference's batches (``batching.plan_level``);
so the network never sees a canvas larger than ``size``.

A tile's detections are shifted back to the image; a detection with an edge within
``focus_chips.BORDER_MARGIN`` (10 original pixels) of an inner tile edge was cut by it and is dropped,
in favour of the tile that holds it whole, the rule AutoFocus applies at chip borders
(``focus_chips.border_keep_mask``; image borders are not inner edges). An object whole in two
overlapping tiles would be found twice: each tile keeps only the detections centred in its core (the
tile less half of each overlap with a neighbour), so every object is found once, by the tile that owns
its centre, and it is whole there, away from the edges, when its side is at most
``overlap / s - 2 * BORDER_MARGIN``: ``overlap >= s * (hi + 2 * BORDER_MARGIN)`` covers the scale's valid
range (``check_overlap`` warns otherwise). Then, per scale, the valid range and score threshold, and per
image the usual suppression and cap (lib.inference.merge), as for whole images.

Where every image fits in one tile the plan, the canvases and the detections are those of the whole-image
test. A tile's pixels are only the tile's (windows of a large file, lib.dataset.large_images), so memory
is bounded by the tile size and the batch, not by the image.
"""
import logging
import math
from dataclasses import dataclass

import numpy as np

from lib.inference.focus_chips import BORDER_MARGIN, border_keep_mask
from lib.inference.merge import concat_candidates, merge_candidates, thresholded
from lib.inference.regions import Region, region_plan, run_regions
from lib.inference.whole_images import WholeImages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tiling:
    size: int  # network pixels a side, at most
    overlap: int  # network pixels, at least

    @classmethod
    def from_config(cls, test_cfg):
        """TEST.TILE as a Tiling, or None when it is empty (whole images; lib/config/validation.py checks it)."""
        return cls(int(test_cfg.TILE[0]), int(test_cfg.TILE[1])) if test_cfg.TILE else None

    def spans(self, start, stop, scale):
        """[(a, b), ...] original-pixel spans covering [start, stop) at ``scale``: one when it fits."""
        if (stop - start) * scale <= self.size:
            return [(start, stop)]
        width = math.floor(self.size / scale)
        step = max(width - math.ceil(self.overlap / scale), 1)
        count = math.ceil((stop - start - width) / step) + 1
        starts = [start + i * step for i in range(count - 1)] + [stop - width]
        return [(a, a + width) for a in starts]

    def split(self, region, scale):
        """The tiles (Regions, same image and shrink, with their cores) of ``region`` at ``scale``, row
        after row; a region that fits is returned as it is."""
        x1, y1, x2, y2 = region.box
        rows, cols = self.spans(y1, y2, scale), self.spans(x1, x2, scale)
        if len(rows) == len(cols) == 1:
            return [region]
        row_cores, col_cores = _cores(rows), _cores(cols)
        return [Region(region.image, (a, b, c, d), region.shrink, (ca, cb, cc, cd))
                for (b, d), (cb, cd) in zip(rows, row_cores) for (a, c), (ca, cc) in zip(cols, col_cores)]

    def check_overlap(self, levels):
        """Warn for each level whose valid objects may be cut in every tile that holds them."""
        for number, level in enumerate(levels):
            hi = level.valid_range[1]
            scale = level.spec.factor
            if scale > 0 and hi > 0 and self.overlap < scale * (hi + 2 * BORDER_MARGIN):
                logger.warning("TEST.TILE overlap %d < %.0f network pixels at scale %s: objects near the upper end "
                               "of its valid range (%s px) may be dropped at tile borders", self.overlap,
                               scale * (hi + 2 * BORDER_MARGIN), scale, hi)


def _cores(spans):
    """Each span's share of the axis: from the middle of its overlap with the previous span to the middle
    of its overlap with the next, unbounded at the ends."""
    middles = [(spans[i + 1][0] + spans[i][1]) / 2 for i in range(len(spans) - 1)]
    return list(zip([-math.inf] + middles, middles + [math.inf]))


def region_thresholded(region, result, image_size, score_thresh):
    """A region's (boxes in read pixels, scores) -> its Candidates (lib.inference.merge) in the image: shifted
    back, those cut by an inner region edge dropped, those of a tile centred outside its core left to the
    tile that owns them, above ``score_thresh``; the level's range is applied when merging."""
    boxes, scores = result[:2]
    boxes = region.to_image(boxes)
    keep = border_keep_mask(boxes, region.box, image_size[1], image_size[0])
    if region.core is not None:
        keep &= in_core(boxes, region.core)
    return thresholded(boxes[keep], np.asarray(scores)[keep], score_thresh)


def in_core(boxes, core):
    """(N,) bool: the boxes (N, 4) whose centre lies in ``core`` (x1, y1, x2, y2), lower edges included."""
    centre_x, centre_y = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    return (centre_x >= core[0]) & (centre_x < core[2]) & (centre_y >= core[1]) & (centre_y < core[3])


class Tiles(WholeImages):
    """The tiled test as a run strategy (lib.inference.whole_images states the interface): every level in
    tiles of TEST.TILE (the module docstring)."""

    def __init__(self, cfg, network, planner):
        super().__init__(cfg, network, planner)
        self.tiling = Tiling.from_config(cfg.TEST)

    def run(self, source, num_workers=0, plan=None, stats=None):
        """``WholeImages.run`` in tiles; ``stats``, a list, receives per level ``(regions, network pixels)``."""
        yield from self.run_tiled(source, num_workers, stats=stats, plan=plan)

    def fresh_levels(self, source, numbers, num_workers=0):
        yield from self.run_tiled(source, num_workers, numbers=numbers, merge=False)

    def run_tiled(self, source, num_workers=0, stats=None, numbers=None, merge=True, plan=None):
        """Yield ``(index, detections (N, 6) or IOError)`` per image of ``source``, the levels ``numbers``
        (default: all) in tiles; ``stats`` and ``plan`` as for ``run``; with ``merge`` false an image's result
        is its Candidates per level run (lib.inference.merge), before the ranges."""
        test = self.cfg.TEST
        numbers = list(range(len(self.levels))) if numbers is None else list(numbers)
        self.tiling.check_overlap([self.levels[number] for number in numbers])
        sizes = source.sizes()
        tiles = region_plan(self.cfg, self.planner, source, self.tiling, numbers)
        if plan is not None:
            plan.extend(tiles)
        if stats is not None:
            for number in numbers:
                members = [(r, s) for r, s, level in zip(tiles.regions, tiles.scales, tiles.levels)
                           if level == number]
                stats.append((len(members), sum(r.extent[0] * r.extent[1] * s * s for r, s in members)))
        remaining = np.bincount([r.image for r in tiles.regions], minlength=len(sizes))
        candidates = {index: [] for index in range(len(sizes))}
        ranges = [self.levels[number].valid_range for number in numbers]
        for position, result in run_regions(self.network_pass(), source, tiles.regions, tiles.in_image_order(),
                                            self.cfg, num_workers, candidates):
            region = tiles.regions[position]
            if isinstance(result, Exception):
                yield region.image, result
                continue
            candidates[region.image].append(
                (position, region_thresholded(region, result[0], sizes[region.image], test.SCORE_THRESH)))
            remaining[region.image] -= 1
            if not remaining[region.image]:
                # in region order (level after level, tiles in order): the whole-image test's candidate order
                found = sorted(candidates.pop(region.image), key=lambda pc: pc[0])
                per_level = [concat_candidates([c for p, c in found if tiles.levels[p] == number])
                             for number in numbers]
                yield region.image, merge_candidates(per_level, ranges, test) if merge else per_level
