"""Which test images share a forward pass, as the reference's test iterator groups them (spec section 8).

Per scale, the reference orders a set's images by area (w * h), landscape (w >= h) before portrait, pads
each orientation group to whole batches by repeating its last entries, and cuts the order into batches of
``TEST.BATCH_IMAGES[scale] x devices`` images that share one canvas, exactly as large as the batch's
largest scaled image (``ceil(h * s) x ceil(w * s)``). ``TEST.BATCH_PARTS`` (the reference's
CONCURRENT_JOBS) first splits the set into that many contiguous parts, each ordered and batched on its
own. The canvas changes the network's output near the image borders, so who shares a batch changes the
detections; this module reproduces it.

An image repeated by the padding keeps the result of its last batch (the reference overwrites earlier
ones): a ``TestBatch`` lists only the images whose results it gives, while its canvas counts every
member, so no image is computed twice for nothing.
"""
import math
from dataclasses import dataclass

import numpy as np

from lib.config import test_pyramid


@dataclass(frozen=True)
class TestBatch:
    """One forward pass: ``images`` (indices into the set) at level ``level`` with resize factors
    ``scales``, on a ``canvas`` (height, width)."""

    level: int
    images: tuple
    scales: tuple
    canvas: tuple


def reference_order(widths, heights, batch_size):
    """Positions into the given images, in the reference's batch order with its padding repeats; the
    length is a multiple of ``batch_size``. Ordering uses NumPy's default (unstable) argsort of the areas,
    as the reference does."""
    widths, heights = np.asarray(widths), np.asarray(heights)
    by_area = np.argsort(widths * heights)
    landscape = np.flatnonzero(widths[by_area] >= heights[by_area])
    portrait = np.flatnonzero(widths[by_area] < heights[by_area])

    def padded(positions):
        if len(positions) % batch_size:
            positions = np.hstack((positions, positions[-(batch_size - len(positions) % batch_size):]))
        return positions

    order = padded(np.hstack((padded(landscape), padded(portrait))))
    return by_area[order]


def extraction_order(widths, heights, batch_size):
    """The order of the reference's proposal extraction (its other test iterator): landscape images,
    then portrait ones, each in set order and padded to whole batches by repeating its first image."""
    widths, heights = np.asarray(widths), np.asarray(heights)
    groups = [np.flatnonzero(widths >= heights), np.flatnonzero(widths < heights)]
    return np.hstack([np.hstack((g, np.repeat(g[:1], -len(g) % batch_size))) for g in groups]).astype(np.int64)


def part_bounds(count, parts):
    """``(start, stop)`` of the contiguous parts the reference splits a set of ``count`` images into."""
    per_part = math.ceil(count / parts) if count else 0
    return [(start, min(start + per_part, count)) for start in range(0, count, per_part or 1)][:parts]


def plan_level(sizes, spec, batch_size, parts, level=0, canvas_multiple=0, extraction=False, scales=None):
    """The TestBatches of one level for images of ``sizes`` ((height, width) each), in the reference's
    order; ``spec`` (a lib.scales.ScaleSpec) gives each image's resize factor, or ``scales`` gives them
    (AutoFocus chips: fractional sizes, resized by their image's factor). ``canvas_multiple`` > 0
    rounds canvases up to a multiple of it (``network.IMAGE_STRIDE``; the reference: 0).

    ``extraction`` plans as the reference extracted proposals: ``extraction_order``, and every canvas
    the scale's full resolution, ``short x long`` (``long x short`` for a portrait batch), whatever its
    images (a scale without both sides keeps the detection canvas)."""
    sizes = [(float(h), float(w)) for h, w in sizes]
    scales = [spec.image_scale(h, w) for h, w in sizes] if scales is None else [float(s) for s in scales]
    order_of = extraction_order if extraction else reference_order
    batches = []
    for start, stop in part_bounds(len(sizes), parts):
        order = start + order_of([w for _, w in sizes[start:stop]], [h for h, _ in sizes[start:stop]], batch_size)
        batches += [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    full_resolution = extraction and spec.short > 0 and spec.long > 0
    last = {index: b for b, members in enumerate(batches) for index in members}
    plan = []
    for b, members in enumerate(batches):
        kept = tuple(dict.fromkeys(i for i in members if last[i] == b))
        if full_resolution:
            height, width = sizes[members[0]]
            canvas = (int(spec.short), int(spec.long)) if width >= height else (int(spec.long), int(spec.short))
        else:
            canvas = tuple(_round_up(max(math.ceil(sizes[i][side] * scales[i]) for i in members), canvas_multiple)
                           for side in (0, 1))
        plan.append(TestBatch(level, kept, tuple(scales[i] for i in kept), canvas))
    return plan


def _round_up(value, multiple):
    return -(-value // multiple) * multiple if multiple > 0 else value


def plan(sizes, levels, batch_sizes, parts, canvas_multiple=0, extraction=False):
    """TestBatches of every level (see ``plan_level``), in an order in which images complete early: by
    the last position (in the unpadded order) of the images a batch gives, then by level. Results do not
    depend on this order; memory does, since an image is combined once all its levels are done."""
    order_of = extraction_order if extraction else reference_order
    rank = np.empty(len(sizes), np.int64)
    for start, stop in part_bounds(len(sizes), parts):
        order = start + order_of([w for _, w in sizes[start:stop]], [h for h, _ in sizes[start:stop]], 1)
        rank[order] = np.arange(start, stop)
    batches = [batch for index, (level, batch_size) in enumerate(zip(levels, batch_sizes))
               for batch in plan_level(sizes, level.spec, batch_size, parts, index, canvas_multiple, extraction)
               if batch.images]
    return sorted(batches, key=lambda b: (int(rank[list(b.images)].max()), b.level))


class BatchPlanner:
    """How a network's test batches are planned, fixed once from ``cfg`` and its ``devices`` (the contexts
    a forward pass splits its images over): the test pyramid (``levels``), ``TEST.BATCH_IMAGES`` per
    device and level, ``TEST.BATCH_PARTS`` and canvases rounded up to ``network.IMAGE_STRIDE``;
    ``extraction`` plans as the reference extracted proposals (see ``plan_level``)."""

    def __init__(self, cfg, devices, extraction=False):
        self.levels, batch_images = test_pyramid(cfg)
        self.devices = devices
        self.extraction = extraction
        self.parts = cfg.TEST.BATCH_PARTS
        self.canvas_multiple = cfg.network.IMAGE_STRIDE
        self.per_device = dict(zip((level.spec for level in self.levels), batch_images))

    def batch_counts(self, levels):
        """Images per forward pass at each of ``levels``: the config's count per device of the same scale
        (else 1) times the devices."""
        return [self.per_device.get(level.spec, 1) * self.devices for level in levels]

    def plan(self, sizes, levels=None):
        """The TestBatches for images of ``sizes`` ((height, width) each) at ``levels`` (default: the test
        pyramid), in running order (module function ``plan``)."""
        levels = self.levels if levels is None else levels
        return plan(sizes, levels, self.batch_counts(levels), self.parts, self.canvas_multiple,
                    extraction=self.extraction)

    def forward_shape(self, batch):
        """(images, height, width) of the forward pass of a TestBatch: every device gets images."""
        return (-(-len(batch.images) // self.devices) * self.devices,) + tuple(batch.canvas)
