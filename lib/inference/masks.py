"""Instance masks for the final detections of a TRAIN.WITH_MASK network (beyond the reference, which
trains its mask branch only as a signal for the detector), on either back end: this module is NumPy only, the
mask graph runs behind ``MaskHead``'s network (MXNet's or the ONNX export's mask.onnx).

The mask pass follows the detection test's own plan (a lib.inference.regions.RegionPlan: the whole images,
TEST.TILE tiles or AutoFocus FocusChips each level processed, with the batches and canvases that ran them),
so it is bounded as the detection pass is: no canvas larger than the detection's, the pixels of a region
read as the detection read them (windows of a large file), images prepared in the ``TEST.NUM_PROCESS``
workers, every context of the detection network used, the graph in float16 with TEST.fp16. After the multi-scale
merge each detection goes back to one region of the plan (``mask_regions``), preferably one that holds its
box whole; among those, one at a level whose valid range holds the box, the finest such (largest image
scale) or, if none holds it, the coarsest; then a tile whose core holds the box's centre (the tile that
owns it), then the largest overlap. Where every level processes whole images this is the finest level
whose valid range holds the box (none: the coarsest). Only the regions holding detections run again, on
their batches' canvases, with the rest of a batch left out, after the detection network has freed its own
canvases' memory (its ``release_buffers``: the two passes' peaks do not add up). Their pixels are read
again (an image's regions close together in the batches' order, as in the tiled test; images without
detections not at all; images in memory, the Python API's, are not decoded twice); the mask graph
(symbols.sniper.mask_inference_symbol) runs on the detections' boxes in the region's canvas pixels and each
detection keeps the 28x28 probability map of its own class.

``paste_masks`` puts the maps into the image: the map spans the box exactly as the training targets do
(MaskRcnnTarget rasterises the gt polygon onto 28 cells across ``x1 .. x2``), so a pixel whose centre
``(x + 0.5, y + 0.5)`` lies in the box samples the map bilinearly at cell coordinates ``(x + 0.5 - x1) * 28
/ w - 0.5`` (w = ``x2 - x1``, at least 1; clamped to the map), and is part of the object when that
probability is above MASK_THRESH; pixels outside the box are not. ``encode_pasted`` gives the same masks as
COCO's RLE (pycocotools' compressed counts) from each box's pixels alone, never a whole-image mask.
"""
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np

from lib.inference.merge import in_test_range
from lib.inference.regions import run_regions
from lib.inference.tiling import in_core

MASK_THRESH = 0.5


def mask_regions(boxes, size, plan, positions, levels):
    """Per box (N, 4, original pixels) of an image of (height, width) ``size``, the one of ``positions`` (that
    image's regions in the RegionPlan ``plan``; ``levels`` the test pyramid's) whose features give its mask, by
    the preferences of the module docstring, the first position among equals."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    height, width = size
    clipped = np.clip(boxes, 0, [width, height, width, height])
    criteria = []  # per region, (N,) values of each preference, larger preferred
    for position in positions:
        region, scale = plan.regions[position], plan.scales[position]
        x1, y1, x2, y2 = region.box
        holds = (clipped[:, 0] >= x1) & (clipped[:, 1] >= y1) & (clipped[:, 2] <= x2) & (clipped[:, 3] <= y2)
        in_range = in_test_range(boxes, levels[plan.levels[position]].valid_range)
        owns = np.ones(len(boxes), bool) if region.core is None else in_core(boxes, region.core)
        overlap = (np.clip(np.minimum(clipped[:, 2], x2) - np.maximum(clipped[:, 0], x1), 0, None) *
                   np.clip(np.minimum(clipped[:, 3], y2) - np.maximum(clipped[:, 1], y1), 0, None))
        criteria.append([holds, in_range, np.where(in_range, scale, -scale), owns, overlap])
    keys = np.array(criteria, np.float64).transpose(1, 0, 2)  # (criterion, region, box)
    best = np.ones(keys.shape[1:], bool)
    for key in keys:
        candidates = np.where(best, key, -np.inf)
        best &= candidates == candidates.max(axis=0)
    return np.asarray(positions)[best.argmax(axis=0)]


def _sampling_weights(start, end, pixels, size):
    """(pixels, size) bilinear weights of the ``size`` map cells for the image pixels 0..pixels-1 along one
    axis of a box spanning ``start .. end``; rows of pixels whose centre is outside the box are zero."""
    extent = max(end - start, 1.0)
    centres = np.arange(pixels) + 0.5
    cells = np.clip((centres - start) * size / extent - 0.5, 0, size - 1)
    low = np.floor(cells).astype(np.int64)
    high = np.minimum(low + 1, size - 1)
    frac = cells - low
    weights = np.zeros((pixels, size))
    np.add.at(weights, (np.arange(pixels), low), 1 - frac)
    np.add.at(weights, (np.arange(pixels), high), frac)
    weights[(centres < start) | (centres > end)] = 0
    return weights


def _pasted(probabilities, boxes, height, width, thresh):
    """Per map (square, the mask graph's 28 x 28) and box: ``(top, left, crop)``, the boolean mask of the image
    pixels the box covers (a box is small against a large image), or None for a box wholly outside the image."""
    probabilities = np.asarray(probabilities, np.float64)
    size = probabilities.shape[-1]
    probabilities = probabilities.reshape(-1, size, size)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if len(probabilities) != len(boxes):
        raise ValueError(f"{len(probabilities)} mask maps for {len(boxes)} boxes")
    for prob, (x1, y1, x2, y2) in zip(probabilities, boxes):
        cols = slice(max(int(np.floor(x1)), 0), min(int(np.ceil(x2)) + 1, width))
        rows = slice(max(int(np.floor(y1)), 0), min(int(np.ceil(y2)) + 1, height))
        if cols.start >= cols.stop or rows.start >= rows.stop:
            yield None
            continue
        wx = _sampling_weights(x1 - cols.start, x2 - cols.start, cols.stop - cols.start, size)
        wy = _sampling_weights(y1 - rows.start, y2 - rows.start, rows.stop - rows.start, size)
        inside = wy.any(axis=1)[:, None] & wx.any(axis=1)[None, :]
        yield rows.start, cols.start, inside & (wy @ prob @ wx.T > thresh)


def paste_masks(probabilities, boxes, height, width, thresh=MASK_THRESH):
    """Boolean (N, height, width) masks of N (28, 28) probability maps on their boxes (N, 4)."""
    masks = np.zeros((len(boxes), height, width), bool)
    for mask, pasted in zip(masks, _pasted(probabilities, boxes, height, width, thresh)):
        if pasted is not None:
            top, left, crop = pasted
            mask[top:top + crop.shape[0], left:left + crop.shape[1]] = crop
    return masks


def _crop_rle(crop, top, left, height, width):
    """COCO's RLE ``{"size": [h, w], "counts": str}`` of a (height, width) mask that is ``crop`` at (top,
    left) and empty elsewhere: the runs of ones of each crop column, at their place in the column-major
    image (runs meeting across columns joined), between runs of zeros."""
    from pycocotools import mask as mask_utils

    steps = np.diff(np.asarray(crop, np.int8), axis=0, prepend=0, append=0).T  # (columns, rows + 1)
    starts, ends = (np.nonzero(steps == sign) for sign in (1, -1))  # column-major order
    starts, ends = ((left + col) * height + top + row for col, row in (starts, ends))
    joined = np.flatnonzero(ends[:-1] == starts[1:])
    starts, ends = np.delete(starts, joined + 1), np.delete(ends, joined)
    counts = np.diff(np.concatenate([[0], np.stack([starts, ends], axis=1).reshape(-1), [height * width]]))
    if len(counts) > 1 and counts[-1] == 0:
        counts = counts[:-1]
    rle = mask_utils.frPyObjects({"size": [height, width], "counts": [int(c) for c in counts]}, height, width)
    return {"size": [height, width], "counts": rle["counts"].decode("ascii")}


def encode_pasted(probabilities, boxes, height, width, thresh=MASK_THRESH):
    """COCO RLEs (JSON-ready) of ``paste_masks``' masks, computed from the boxes' pixels alone."""
    empty = np.zeros((0, 0), bool)
    return [_crop_rle(empty, 0, 0, height, width) if pasted is None else _crop_rle(pasted[2], *pasted[:2], height,
                                                                                     width)
            for pasted in _pasted(probabilities, boxes, height, width, thresh)]


class MaskHead:
    """The mask graph of a TRAIN.WITH_MASK network of ``cfg`` beside its ``detection`` network (whose buffers it
    frees first), its batches shared among devices as the BatchPlanner ``planner`` (lib.inference.batching)
    shares the detection's: ``run`` gives the maps of a test run's final detections on the regions of its
    plan, ``masks`` the pasted masks (the Python API). ``network`` runs the graph: lib.inference.mxnet_network.MxnetMaskNetwork (one
    executor per context of the detection network) or lib.inference.onnx_network.OnnxMaskNetwork (the export's
    mask.onnx), each with ``map_size`` (28) and ``forward(parts)``: per part ``(device, data (b, 3, h, w),
    rows (n, 5) [slot in data, x1, y1, x2, y2] canvas pixels, labels (n,))`` started on its device, the (n,
    map_size, map_size) maps of each row's own class, as NumPy arrays."""

    def __init__(self, cfg, detection, network, planner):
        self.cfg, self.detection, self.network, self.planner = cfg, detection, network, planner

    def forward(self, data, rois):
        """Per slot of a canvas batch ``data`` (B, 3, h, w) float32, the (n, 28, 28) maps of its ``rois``
        (one ``(boxes (n, 4) canvas pixels, labels (n,))`` per slot, fewer than B: the rest have none). The
        slots are shared among the devices as the detection shares a batch; a slot without rois is left out."""
        per_device = -(-len(data) // self.planner.devices)
        counts = [len(rois[slot][0]) if slot < len(rois) else 0 for slot in range(len(data))]
        parts, slots_of = [], []
        for device in range(self.planner.devices):
            slots = [s for s in range(device * per_device, min((device + 1) * per_device, len(data))) if counts[s]]
            if not slots:
                continue
            rows = np.concatenate([np.hstack([np.full((counts[s], 1), k), rois[s][0]]) for k, s in enumerate(slots)])
            parts.append((device, data[slots], rows, np.concatenate([rois[s][1] for s in slots])))
            slots_of.append(slots)
        size = self.network.map_size
        maps = [np.zeros((0, size, size), np.float32)] * len(data)
        for slots, picked in zip(slots_of, self.network.forward(parts)):
            for slot, values in zip(slots, np.split(picked, np.cumsum([counts[s] for s in slots])[:-1])):
                maps[slot] = values
        return maps

    def run(self, source, detections, plan, num_workers=0):
        """Yield ``(index, maps (N, 28, 28) float32, or the IOError of an unreadable image)`` per image of
        ``detections`` (``{index: (boxes (N, 4) original pixels, labels (N,))}`` of images of ``source``),
        computed on the regions of ``plan`` (the RegionPlan of the detection run, see the module docstring);
        ``num_workers`` prepare the regions (lib.inference.streaming)."""
        sizes, levels, side = source.sizes(), self.planner.levels, self.network.map_size
        regions_of = defaultdict(list)
        for position, region in enumerate(plan.regions):
            regions_of[region.image].append(position)
        members = {}  # region position -> the detections (indices into its image's) it computes
        for index, (boxes, _) in detections.items():
            if not len(boxes):
                yield index, np.zeros((0, side, side), np.float32)
                continue
            chosen = mask_regions(boxes, sizes[index], plan, regions_of[index], levels)
            members.update((position, np.flatnonzero(chosen == position)) for position in np.unique(chosen))
        batches, rois = [], []  # the batches of the regions holding detections, on their canvases
        for batch in plan.in_image_order():
            kept = [(position, scale) for position, scale in zip(batch.images, batch.scales) if position in members]
            if kept:
                batches.append(replace(batch, images=tuple(p for p, _ in kept), scales=tuple(s for _, s in kept)))
                rois.append([_region_rois(plan, position, *detections[plan.regions[position].image],
                                          members[position]) for position, _ in kept])
        if not batches:
            return
        self.detection.release_buffers()
        remaining = Counter(plan.regions[position].image for position in members)
        alive, maps = dict(remaining), {}  # images still to complete; the maps of those under way
        for position, result in run_regions(_MaskPass(self, rois), source, plan.regions, batches, self.cfg,
                                            num_workers, alive):
            image = plan.regions[position].image
            if isinstance(result, Exception):
                maps.pop(image, None)
                yield image, result
                continue
            if image not in maps:
                maps[image] = np.zeros((len(detections[image][0]), side, side), np.float32)
            maps[image][members[position]] = result[0]
            remaining[image] -= 1
            if not remaining[image]:
                yield image, maps.pop(image)

    def masks(self, source, detections, plan):
        """``{index: boolean (N, H, W) masks}`` of ``detections`` (as for ``run``) on images in memory."""
        sizes, masks = source.sizes(), {}
        for index, maps in self.run(source, detections, plan):
            if isinstance(maps, Exception):
                raise maps
            masks[index] = paste_masks(maps, detections[index][0], *sizes[index])
        return masks


def _region_rois(plan, position, boxes, labels, members):
    """(boxes (n, 4) in the canvas pixels of region ``position`` of ``plan``, labels (n,)) of the detections
    ``members`` (indices into an image's ``boxes`` and ``labels``): the inverse of ``Region.to_image``."""
    region = plan.regions[position]
    origin = np.array(region.box[:2] * 2, np.float64)
    return ((np.asarray(boxes, np.float64)[members] - origin) * plan.scales[position],
            np.asarray(labels, np.int64)[members])


class _MaskPass:
    """The mask graph as the pipeline's network: the pipeline runs the batches in their order
    (lib.inference.streaming.run_pipeline), each taking the next batch's rois."""

    def __init__(self, head, rois):
        self.head, self.rois = head, iter(rois)

    def forward_shape(self, batch):
        return self.head.planner.forward_shape(batch)

    def forward(self, data, im_info):
        return {"maps": self.head.forward(data, next(self.rois))}

    def image_result(self, outputs, batch_size, slot, scale, resized, size):
        return outputs["maps"][slot]


def image_segmentations(mask_head, source, results, plan, num_workers=0):
    """Yield ``(index, [RLE per detection row], or an IOError)`` per image of ``results`` (``{index: (N, 6)
    rows}`` of images of ``source``, from the run that recorded ``plan``)."""
    rows = {index: np.asarray(found, np.float32).reshape(-1, 6) for index, found in results.items()}
    sizes = source.sizes()
    for index, maps in mask_head.run(source, {i: (r[:, :4], r[:, 5]) for i, r in rows.items()}, plan, num_workers):
        yield index, maps if isinstance(maps, Exception) else encode_pasted(maps, rows[index][:, :4], *sizes[index])
