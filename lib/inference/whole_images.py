"""The whole-image test and proposal extraction: the run strategies of a plain SNIPER test.

A run strategy (``WholeImages`` here, ``Tiles`` in lib.inference.tiling, ``AutoFocus`` in
lib.inference.autofocus, ``Proposals`` here; lib.inference.strategy picks one from ``TEST``) owns a test
run: it gets the network (lib.inference.mxnet_network states the interface), the BatchPlanner
(lib.inference.batching) and the config, and gives

- ``run(source, num_workers, plan)``: ``(index, result or IOError)`` per image of ``source``
  (lib.inference.streaming: RoidbImages or ArrayImages), as images complete: the final detections, float32
  (N, 6) ``[x1, y1, x2, y2, score, label]`` in original pixels, or proposals (``Proposals``); ``plan``, a
  RegionPlan (lib.inference.regions), receives the regions and batches of the run for the mask pass;
- ``run_levels(source, num_workers, cache, plan)``: an image's Candidates per level before the valid ranges
  (lib.inference.merge), with the levels the ScaleCache ``cache`` holds read back, and ``merge_levels``;
- ``run_at(source, levels, combine, num_workers)``: whole images at any ``levels``, their per-level results
  handed to ``combine`` (default: merged as the test merges them).

Whole images: at every level, batches of ``TEST.BATCH_IMAGES`` images per device share one canvas
(lib.inference.batching); a box is decoded in the scaled image, clipped to it, then divided by the scale
(``detection_result``). Proposals: the RPN-only network's rois of every level, planned as the reference
extracted them, the best ``TEST.NUM_PROPOSALS`` of each level pooled (``pool_proposals``).
"""
import functools
import logging

import numpy as np

from lib.boxes import clip_boxes, decode
from lib.inference.merge import merge_candidates, merge_scales, thresholded_levels
from lib.inference.regions import region_plan
from lib.inference.scale_cache import cached_levels
from lib.inference.streaming import NetworkPass, run_pipeline

logger = logging.getLogger(__name__)


def unique_rows(rois):
    """Indices of the first occurrence of each distinct row, in order (the proposal layer pads its
    output to a fixed count by repeating boxes; a repeat would be a duplicate detection)."""
    _, first = np.unique(rois, axis=0, return_index=True)
    return np.sort(first)


def to_original(boxes, scale, resized):
    """Boxes in scaled-image pixels -> original pixels as the reference maps them: clipped to the
    ``resized`` (height, width) scaled image, then divided by the scale (float64, as it computes)."""
    return clip_boxes(np.asarray(boxes, np.float64), *resized) / np.float32(scale)


def pool_proposals(per_level, num_proposals):
    """The first ``num_proposals`` of every level's ``(boxes, scores)`` (the proposal layer's order, best
    first), stacked level after level as the reference stacks them, float32 (P, 5) ``[x1, y1, x2, y2,
    score]``."""
    return np.concatenate([np.hstack([boxes[:num_proposals], scores[:num_proposals, None]])
                           for boxes, scores in per_level]).astype(np.float32)


def detection_result(outputs, batch_size, slot, scale, resized, size):
    """One image's result at one scale, from its ``slot`` of a forward pass: ``(boxes (R, 4) original
    pixels, class scores (R, C))`` over its distinct rois. ``resized`` is the image's scaled (height,
    width); checkpoints hold the regressor multiplied by the target stds: decoded with stds 1, in float64 and
    without a cap on dw/dh, as the reference."""
    rois = outputs["rois_output"].reshape(batch_size, -1, 5)[slot, :, 1:]
    keep = unique_rows(rois)
    deltas = outputs["bbox_pred_reshape_output"][slot, keep]
    boxes = decode(rois[keep].astype(np.float64), deltas.astype(np.float64), max_log_scale=None)
    return to_original(boxes, scale, resized), outputs["cls_prob_reshape_output"][slot, keep]


def proposal_result(outputs, batch_size, slot, scale, resized, size, clip=False):
    """One image's proposals at one scale: ``(boxes (R, 4) original pixels, scores (R,))`` over its distinct
    rois; with ``clip`` (TEST.CLIP_PROPOSALS) also clipped to the original ``size`` (a scaled pixel is a
    fraction of an original one: the last may end beyond it)."""
    rois = outputs["rois_output"].reshape(batch_size, -1, 5)[slot, :, 1:]
    keep = unique_rows(rois)
    boxes = to_original(rois[keep], scale, resized)
    if clip:
        boxes = clip_boxes(boxes, *size)
    return boxes, outputs["rois_score"].reshape(batch_size, -1)[slot, keep]


class WholeImages:
    """Every level of the test pyramid on whole images (the module docstring)."""

    image_result = staticmethod(detection_result)
    tiling = None  # whole images (lib.inference.tiling.Tiles: its Tiling)

    def __init__(self, cfg, network, planner):
        self.cfg, self.network, self.planner = cfg, network, planner
        self.levels = planner.levels

    def network_pass(self, image_result=None):
        """The network as the pipeline drives it, giving ``image_result`` (default: this strategy's) per image."""
        return NetworkPass(self.network, self.planner, image_result or self.image_result)

    def combiner(self, levels):
        """What combines an image's per-level results at ``levels`` (a pure NumPy function, run in the workers)."""
        return functools.partial(merge_scales, valid_ranges=[level.valid_range for level in levels],
                                 test_cfg=self.cfg.TEST)

    def run(self, source, num_workers=0, plan=None):
        if plan is not None:  # whole images at every level: the regions of batching.plan's batches
            plan.extend(region_plan(self.cfg, self.planner, source))
        yield from self.run_at(source, self.levels, num_workers=num_workers)

    def run_at(self, source, levels, combine=None, num_workers=0):
        network, test = self.cfg.network, self.cfg.TEST
        yield from run_pipeline(self.network_pass(), source, self.planner.plan(source.sizes(), levels), len(levels),
                                combine or self.combiner(levels), network.PIXEL_MEANS, network.CHANNEL_ORDER,
                                num_workers, timeout=test.LOADER_TIMEOUT, warn_after=test.STALL_WARN)

    def fresh_levels(self, source, numbers, num_workers=0):
        """Yield ``(index, [Candidates of each level in numbers] or IOError)`` per image of ``source``, from
        the network: what ``run`` merges, before the valid ranges."""
        yield from self.run_at(source, [self.levels[number] for number in numbers],
                               functools.partial(thresholded_levels, score_thresh=self.cfg.TEST.SCORE_THRESH),
                               num_workers)

    def run_levels(self, source, num_workers=0, cache=None, plan=None):
        """Yield ``(index, [Candidates per level] or IOError)`` per image of ``source`` in set order once the
        last level is done, the levels ``cache`` (a ScaleCache, TEST.USE_CACHE) holds read back, the others run
        (``fresh_levels``) and cached; ``plan`` receives the regions of every level, as in ``run``."""
        if plan is not None:  # whole images or tiles: the regions follow from the image sizes alone
            plan.extend(region_plan(self.cfg, self.planner, source, self.tiling))
        yield from cached_levels(self.fresh_levels, len(self.levels), source, num_workers, cache)

    def merge_levels(self, per_level):
        """An image's final detections (N, 6) from its Candidates per level (``run_levels``): the valid
        ranges, suppression and cap of the config."""
        return merge_candidates(per_level, [level.valid_range for level in self.levels], self.cfg.TEST)


class Proposals(WholeImages):
    """The RPN-only network's proposals of every level, float32 (P, 5) ``[x1, y1, x2, y2, score]`` per image
    in original pixels: the best ``TEST.NUM_PROPOSALS`` of each scale of ``TEST.SCALES``, scale after scale
    (the planner plans as the reference extracted them)."""

    def __init__(self, cfg, network, planner):
        super().__init__(cfg, network, planner)
        self.image_result = functools.partial(proposal_result, clip=bool(cfg.TEST.CLIP_PROPOSALS))
        if cfg.TEST.NUM_PROPOSALS > cfg.TEST.RPN_POST_NMS_TOP_N:
            logger.warning("TEST.NUM_PROPOSALS %d > TEST.RPN_POST_NMS_TOP_N %d: at most %d proposals per scale",
                           cfg.TEST.NUM_PROPOSALS, cfg.TEST.RPN_POST_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N)

    def combiner(self, levels):
        return functools.partial(pool_proposals, num_proposals=self.cfg.TEST.NUM_PROPOSALS)

    def run(self, source, num_workers=0, plan=None):
        if plan is not None:
            raise ValueError("a RegionPlan records detection runs on the config's test pyramid only")
        yield from self.run_at(source, self.levels, num_workers=num_workers)

    def run_levels(self, source, num_workers=0, cache=None, plan=None):
        raise RuntimeError("this Detector holds the RPN-only network; it gives proposals, not detections")
