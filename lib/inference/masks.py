"""Instance masks for the final detections of a TRAIN.WITH_MASK network (beyond the reference, which
trains its mask branch only as a signal for the detector).

After the multi-scale merge, each detection goes back to one level of the test pyramid: the finest one
whose valid range holds its box (lib.inference.merge's rule; none: the coarsest level). The image is
resized to that level as the detector resizes it, the mask graph (symbols.sniper.mask_inference_symbol)
runs on the detections' boxes in the scaled pixels, and each detection keeps the 28x28 probability map
of its own class. ``paste_masks`` puts the maps into the image: the map spans the box exactly as the
training targets do (MaskRcnnTarget rasterises the gt polygon onto 28 cells across ``x1 .. x2``), so a
pixel whose centre ``(x + 0.5, y + 0.5)`` lies in the box samples the map bilinearly at cell coordinates
``(x + 0.5 - x1) * 28 / w - 0.5`` (w = ``x2 - x1``, at least 1; clamped to the map), and is part of the
object when that probability is above MASK_THRESH; pixels outside the box are not. ``encode_masks``
gives COCO's RLE (pycocotools.mask) for results files.
"""
import numpy as np

from lib.inference.merge import in_test_range
from lib.inference.pipeline import prepare_image
from symbols.backbones import feature_stride
from symbols.mask import MASK_SIZE

MASK_THRESH = 0.5


def mask_levels(boxes, levels):
    """Per box (N, 4) in original pixels, the index of the finest level whose valid range holds it (the
    coarsest when none does)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    chosen = np.full(len(boxes), len(levels) - 1)
    for index in reversed(range(len(levels))):
        chosen[in_test_range(boxes, levels[index].valid_range)] = index
    return chosen


def _sampling_weights(start, end, pixels):
    """(pixels, MASK_SIZE) bilinear weights of the map cells for the image pixels 0..pixels-1 along one
    axis of a box spanning ``start .. end``; rows of pixels whose centre is outside the box are zero."""
    extent = max(end - start, 1.0)
    centres = np.arange(pixels) + 0.5
    cells = np.clip((centres - start) * MASK_SIZE / extent - 0.5, 0, MASK_SIZE - 1)
    low = np.floor(cells).astype(np.int64)
    high = np.minimum(low + 1, MASK_SIZE - 1)
    frac = cells - low
    weights = np.zeros((pixels, MASK_SIZE))
    np.add.at(weights, (np.arange(pixels), low), 1 - frac)
    np.add.at(weights, (np.arange(pixels), high), frac)
    weights[(centres < start) | (centres > end)] = 0
    return weights


def paste_masks(probabilities, boxes, height, width, thresh=MASK_THRESH):
    """Boolean (N, height, width) masks of N (28, 28) probability maps on their boxes (N, 4)."""
    probabilities = np.asarray(probabilities, np.float64).reshape(-1, MASK_SIZE, MASK_SIZE)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if len(probabilities) != len(boxes):
        raise ValueError(f"{len(probabilities)} mask maps for {len(boxes)} boxes")
    masks = np.zeros((len(boxes), height, width), bool)
    for mask, prob, (x1, y1, x2, y2) in zip(masks, probabilities, boxes):
        # only the rows and columns the box covers: a box is small against a large image
        cols = slice(max(int(np.floor(x1)), 0), min(int(np.ceil(x2)) + 1, width))
        rows = slice(max(int(np.floor(y1)), 0), min(int(np.ceil(y2)) + 1, height))
        if cols.start >= cols.stop or rows.start >= rows.stop:
            continue
        wx = _sampling_weights(x1 - cols.start, x2 - cols.start, cols.stop - cols.start)
        wy = _sampling_weights(y1 - rows.start, y2 - rows.start, rows.stop - rows.start)
        inside = wy.any(axis=1)[:, None] & wx.any(axis=1)[None, :]
        mask[rows, cols] = inside & (wy @ prob @ wx.T > thresh)
    return masks


def encode_masks(masks):
    """COCO RLEs ``{"size": [h, w], "counts": str}`` (JSON-ready) of boolean (N, h, w) masks."""
    from pycocotools import mask as mask_utils

    masks = np.asarray(masks, bool)
    if not len(masks):
        return []
    rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8)))
    return [{"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")} for rle in rles]


class MaskHead:
    """The mask graph of a TRAIN.WITH_MASK network bound on one context, with the Detector's parameters:
    ``masks(image, boxes, labels)`` -> boolean (N, H, W) masks of an image's final detections."""

    def __init__(self, cfg, num_classes, arg_params, aux_params, context, levels, compiled_deformable):
        import mxnet as mx

        from symbols.sniper import mask_inference_symbol

        self.cfg, self.levels = cfg, levels
        symbol = mask_inference_symbol(cfg, num_classes, compiled_deformable=compiled_deformable)
        stride = feature_stride(cfg)
        # an executor, reshaped per call (the rois are not a batch axis, as a Module would need)
        self.executor = symbol.simple_bind(context, grad_req="null", data=(1, 3, stride, stride), mask_rois=(1, 5))
        self.executor.copy_params_from(arg_params, aux_params, allow_extra_params=True)

    def probabilities(self, image, boxes, labels):
        """(N, 28, 28): each detection's class map, from the level ``mask_levels`` picks for it."""
        import mxnet as mx

        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        labels = np.asarray(labels, np.int64).reshape(-1)
        result = np.zeros((len(boxes), MASK_SIZE, MASK_SIZE), np.float32)
        height, width = image.shape[:2]
        network = self.cfg.network
        chosen = mask_levels(boxes, self.levels)
        for index in np.unique(chosen):
            members = np.flatnonzero(chosen == index)
            scale = self.levels[index].spec.image_scale(height, width)
            canvas = np.zeros((1, 3, int(np.ceil(height * scale)), int(np.ceil(width * scale))), np.float32)
            prepare_image(image, scale, network.PIXEL_MEANS, network.CHANNEL_ORDER, canvas[0])
            rois = np.hstack([np.zeros((len(members), 1)), boxes[members] * scale]).astype(np.float32)
            executor = self.executor.reshape(allow_up_sizing=True, data=canvas.shape, mask_rois=rois.shape)
            maps = executor.forward(is_train=False, data=mx.nd.array(canvas), mask_rois=mx.nd.array(rois))[0]
            maps = maps.asnumpy()  # (n, C, 28, 28), C foreground classes
            result[members] = maps[np.arange(len(members)), labels[members] - 1]
        return result

    def masks(self, image, boxes, labels):
        """Boolean (N, H, W) masks of the detections ``boxes`` (N, 4, original pixels) of ``labels``."""
        if not len(boxes):
            return np.zeros((0,) + image.shape[:2], bool)
        return paste_masks(self.probabilities(image, boxes, labels), boxes, *image.shape[:2])


def image_segmentations(mask_head, source, results):
    """``{index: [RLE per detection row]}`` for ``results`` ``{index: (N, 6) rows}`` of the images of
    ``source`` (lib.inference.pipeline, read again: the detections come from the merged scales)."""
    segmentations = {}
    for index, rows in results.items():
        rows = np.asarray(rows, np.float32).reshape(-1, 6)
        segmentations[index] = encode_masks(mask_head.masks(source.read(index), rows[:, :4], rows[:, 5]))
    return segmentations
