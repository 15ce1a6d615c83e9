"""AutoFocus inference (Najibi, Singh, Davis, ICCV 2019): the finer test scales process only FocusChips.

``TEST.SCALES`` run coarsest first, one level after the other. The coarsest level processes whole
images; a level ``i > 0`` with ``TEST.DO_PRUNING[i]`` processes only the FocusChips that the FocusPixel
maps (``scale_prob``) of level ``i - 1`` give (lib.inference.focus_chips, ``TEST.CHIP_HYPERPARAMS[i - 1]``),
for every region level ``i - 1`` processed, so chips are found in chips recursively; a level without
pruning processes whole images again. Each processed region (a whole image or a chip, in original pixels)
is a test "image" of the test pipeline (lib.inference.streaming): ``RegionImages`` crops it as the
reference does (whole pixels, ``int()`` of its corners) and it is resized by its image's factor at the
level; regions are batched as the reference's AutoFocus iterator batches them (``batching.plan_level`` on
their fractional extents: by area, landscape first, canvases of the largest ``ceil(extent * s)``, the
resized crop cut to its canvas), ``TEST.BATCH_IMAGES[i]`` per device, within each of the ``TEST.BATCH_PARTS``
contiguous parts of the set its driver splits the images (and their chips) into (``level_batches``).

Detections of a region are shifted by its (fractional) origin, those cut by an inner chip edge are
dropped (``focus_chips.border_keep_mask``), and every level's are kept in the level's valid range above
``TEST.SCORE_THRESH`` (lib.inference.merge); an image's candidates of all levels (level after level, its
regions in order, as the reference's ``aggregate`` pools its chips) are then suppressed and capped as for
whole images (``merge.suppress``: soft-NMS or NMS, ``TEST.MAX_PER_IMAGE``). With TEST.USE_CACHE a level's
candidates and FocusPixel maps come from its cache when it was made for the same regions
(lib.inference.scale_cache), and the next level's FocusChips are made again from the cached maps.

With ``TEST.TILE`` (lib.inference.tiling), every region larger than a tile at its level runs in tiles,
under the same border rule: on a large image the coarsest scale is tiled (or, when it fits, read reduced
from the file) and the finer scales process only the FocusChips' tiles.
"""
import logging
from dataclasses import dataclass, field

import numpy as np

from lib.inference.batching import part_bounds
from lib.inference.focus_chips import FocusChipParams, focus_chips
from lib.inference.merge import concat_candidates, merge_candidates
from lib.inference.regions import Region, plan_regions, run_regions, whole_region
from lib.inference.scale_cache import LevelResult
from lib.inference.tiling import Tiling, region_thresholded
from lib.inference.whole_images import WholeImages, detection_result

logger = logging.getLogger(__name__)


def focus_result(outputs, batch_size, slot, scale, resized, size):
    """A region's detection result (lib.inference.whole_images.detection_result) with its FocusPixel map
    (channel 1 of ``scale_prob``, the whole canvas: lib.inference.focus_chips keeps chips inside the region)
    and the scale of the map."""
    boxes, scores = detection_result(outputs, batch_size, slot, scale, resized, size)
    return boxes, scores, np.array(outputs["scale_prob_output"][slot, 1]), scale


@dataclass
class LevelStats:
    """What a level processed: regions, and pixels at the level's resolution (the regions' fractional
    extents times the scale squared, as the reference counts them) against the whole images'."""

    regions: int = 0
    pixels: float = 0.0
    full_pixels: float = 0.0


@dataclass
class AutoFocusStats:
    levels: list = field(default_factory=list)

    @property
    def pixels(self):
        return sum(level.pixels for level in self.levels)

    @property
    def full_pixels(self):
        return sum(level.full_pixels for level in self.levels)


class AutoFocus(WholeImages):
    """AutoFocus as a run strategy (lib.inference.whole_images states the interface; the module docstring)."""

    def run(self, source, num_workers=0, plan=None, stats=None, on_region=None):
        """``WholeImages.run`` with AutoFocus; ``stats`` and ``on_region`` as for ``focus``."""
        yield from self.focus(source, num_workers, stats, on_region, plan=plan)

    def run_levels(self, source, num_workers=0, cache=None, plan=None):
        yield from self.focus(source, num_workers, cache=cache, merge=False, plan=plan)

    def focus(self, source, num_workers=0, stats=None, on_region=None, cache=None, merge=True, plan=None):
        """Yield ``(index, detections (N, 6) or IOError)`` per image of ``source`` once its last level is done
        (see the module docstring). ``stats`` (an AutoFocusStats) receives a LevelStats per level; ``plan`` (a
        lib.inference.regions.RegionPlan) each level's regions and batches, cached levels' too (the mask
        pass's); ``on_region(level, region, result, chips)`` sees every processed region
        (tools/visualize_focus.py): ``result`` is ``(candidates, focus_map, scale)``, its Candidates
        (lib.inference.merge) in the image's original pixels before the level's range, its FocusPixel map and
        the map's scale, ``chips`` the FocusChips it gave for the next level. ``cache`` (a
        lib.inference.scale_cache.ScaleCache) gives the levels it holds for the regions they process and
        stores the others; with ``merge`` false an image's result is its Candidates per level (its regions' in
        region order), before the ranges."""
        cfg, levels = self.cfg, self.levels
        test, network = cfg.TEST, cfg.network
        sizes = source.sizes()
        tiling = Tiling.from_config(test)
        found = {index: [] for index in range(len(sizes))}  # per image, its Candidates of each level so far
        chips = {index: [] for index in found}  # FocusChips found at the current level, for the next
        for number, level in enumerate(levels):
            if number > 0 and test.DO_PRUNING[number]:
                regions = [Region(index, tuple(chip)) for index in found for chip in chips[index]]
            else:
                regions = [whole_region(source, index, sizes[index], level.spec.image_scale(*sizes[index]))
                           for index in found]
            if tiling is not None:  # TEST.TILE: every region larger than a tile in tiles (lib.inference.tiling)
                regions = [tile for region in regions
                           for tile in tiling.split(region, level.spec.image_scale(*sizes[region.image]))]
            chip_params = (FocusChipParams.from_config(cfg, number, getattr(self.network, "stride", None))
                           if number + 1 < len(levels) and test.DO_PRUNING[number + 1] else None)
            scales = [level.spec.image_scale(*sizes[region.image]) for region in regions]
            whole = sum(h * w * level.spec.image_scale(h, w) ** 2 for h, w in (sizes[i] for i in found))
            level_stats = LevelStats(len(regions),
                                     sum(r.extent[0] * r.extent[1] * s * s for r, s in zip(regions, scales)), whole)
            batches = level_batches(regions, scales, len(sizes), level.spec, self.planner.batch_counts([level])[0],
                                    test.BATCH_PARTS, network.IMAGE_STRIDE)
            if plan is not None:
                plan.add_level(number, regions, scales, batches)
            result = cache.load(number, regions) if cache is not None else None
            if result is None:
                result = self.run_level(source, regions, batches, num_workers, found)
                if cache is not None:
                    cache.save(number, result, regions)
            for index, message in result.unreadable.items():
                if found.pop(index, None) is not None:
                    yield index, IOError(message)
            level_parts = {index: [] for index in found}
            chips = {index: [] for index in found}
            for region, image, candidates, focus_map, scale in zip(regions, result.units, result.candidates,
                                                                    result.maps, result.map_scales):
                if image not in found:
                    continue
                level_parts[image].append(candidates)
                region_chips = (focus_chips(focus_map, region.box, scale, chip_params) if chip_params
                                else np.zeros((0, 4)))
                chips[image].extend(tuple(float(v) for v in chip) for chip in region_chips)
                if on_region is not None:
                    on_region(number, region, (candidates, focus_map, scale), region_chips)
            for index, parts in level_parts.items():
                found[index].append(concat_candidates(parts))
            if stats is not None:
                stats.levels.append(level_stats)
            logger.info("AutoFocus level %d (scale %s): %d regions, %.1f%% of the pixels of whole images", number,
                        test.SCALES[number], level_stats.regions,
                        100.0 * level_stats.pixels / max(level_stats.full_pixels, 1e-9))
        ranges = [level.valid_range for level in levels]
        for index, per_level in found.items():
            yield index, merge_candidates(per_level, ranges, test) if merge else per_level

    def run_level(self, source, regions, batches, num_workers, alive):
        """The LevelResult of a level's ``regions`` (of the images in ``alive``) run through the network: one
        unit per region, in order, with its Candidates in the image (shifted, not cut by an inner chip edge,
        above the score threshold), its FocusPixel map and the map's scale (the batch's scale is the read
        pixels'); the regions of an unreadable image get nothing."""
        sizes, score_thresh = source.sizes(), self.cfg.TEST.SCORE_THRESH
        outcomes, result = {}, LevelResult()
        for position, found in run_regions(self.network_pass(focus_result), source, regions, batches, self.cfg,
                                           num_workers, dict(alive)):
            region = regions[position]
            if isinstance(found, Exception):
                result.unreadable[region.image] = str(found)
                continue
            boxes, scores, focus_map, scale = found[0]
            outcomes[position] = (region_thresholded(region, (boxes, scores), sizes[region.image], score_thresh),
                                  focus_map, scale / region.shrink)
        nothing = (concat_candidates([]), np.zeros((0, 0), np.float32), 0.0)
        for position, region in enumerate(regions):
            result.add(region.image, *outcomes.get(position, nothing))
        return result


def level_batches(regions, scales, image_count, spec, batch_size, parts, canvas_multiple=0):
    """The TestBatches of a level's ``regions`` (image by image, as AutoFocus.focus makes them; positions into
    the list) as the reference's driver makes them: the set's ``image_count`` images split into ``parts``
    contiguous parts (its CONCURRENT_JOBS, an image with all its regions), each part's regions batched on
    their own (one pipeline run per level: the batches are its level 0)."""
    images = [region.image for region in regions]
    if images != sorted(images):
        raise ValueError("level_batches: regions must come image by image")
    batches = []
    for start, stop in part_bounds(image_count, parts):
        first, last = np.searchsorted(images, [start, stop])
        batches += plan_regions(regions[first:last], scales[first:last], spec, batch_size, 1, canvas_multiple,
                                offset=int(first))
    return batches
