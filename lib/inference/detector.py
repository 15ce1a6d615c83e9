"""A test network bound for inference: whole images in, detections or proposals in original pixels out.

Every scale of the pyramid runs as its own batched forward pass (``TEST.BATCH_IMAGES`` images per
device). Images of any size and aspect share a batch: each is resized by its scale factor, mean
subtracted and placed in the top-left corner of a zero (mean colour) canvas as large as the batch's
largest image, rounded up to the feature stride; ``im_info`` tells the proposal layer the real extent.
The Module reshapes itself whenever a batch's canvas differs from the previous one.
"""
import logging

import cv2
import mxnet as mx
import numpy as np

from lib.boxes import clip_boxes, decode
from lib.contexts import fp16_enabled, parse_contexts
from lib.data.pixels import network_pixels
from lib.inference.merge import merge_scales
from lib.scales import pyramid
from lib.train.checkpoint import checkpoint_prefix, load_params, params_path
from symbols import inference_symbol, use_compiled_deformable

logger = logging.getLogger(__name__)

DATA_NAMES = ("data", "im_info", "im_ids", "chip_ids")


def checkpoint_file(cfg):
    """``TEST.MODEL`` when set, else epoch ``TEST.TEST_EPOCH`` of the training run of ``cfg``."""
    if cfg.TEST.MODEL:
        return cfg.TEST.MODEL
    return params_path(checkpoint_prefix(cfg), cfg.TEST.TEST_EPOCH)


def network_input(image, scale, pixel_means, channel_order):
    """BGR uint8 (H, W, 3) -> float32 (3, h, w) resized by ``scale``, in the network's channel order
    minus the means (lib.data.pixels)."""
    height, width = image.shape[:2]
    size = (max(1, int(round(width * scale))), max(1, int(round(height * scale))))
    resized = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
    return network_pixels(resized, pixel_means, channel_order, np.empty((3,) + resized.shape[:2], np.float32))


def unique_rows(rois):
    """Indices of the first occurrence of each distinct row, in order (the proposal layer pads its
    output to a fixed count by repeating boxes; a repeat would be a duplicate detection)."""
    _, first = np.unique(rois, axis=0, return_index=True)
    return np.sort(first)


def to_original(boxes, scale, height, width):
    """Boxes in scaled-image pixels -> original pixels (the training side multiplies by the scale),
    clipped to the ``height`` x ``width`` image."""
    return clip_boxes(np.asarray(boxes, np.float32) / np.float32(scale), height, width)


class Detector:
    """The test (or RPN-only) symbol of ``cfg`` with trained parameters, on the configured contexts.

    ``num_classes`` (background included) is the dataset's; the RPN-only network does not need it.
    """

    def __init__(self, cfg, num_classes, arg_params, aux_params, contexts=None, rpn_only=False,
                 source="parameters"):
        self.cfg = cfg
        self.rpn_only = rpn_only
        self.source = source
        self.levels = pyramid(cfg.TEST, "TEST")
        self.contexts = contexts if contexts is not None else parse_contexts(cfg.gpus)
        self.fp16 = fp16_enabled(cfg, "TEST", self.contexts)  # the body only: inputs and outputs stay float32
        self.batch_size = cfg.TEST.BATCH_IMAGES * len(self.contexts)
        self.stride = max(cfg.network.IMAGE_STRIDE, cfg.network.RPN_FEAT_STRIDE)
        if rpn_only and cfg.TEST.NUM_PROPOSALS > cfg.TEST.RPN_POST_NMS_TOP_N:
            logger.warning("TEST.NUM_PROPOSALS %d > TEST.RPN_POST_NMS_TOP_N %d: at most %d proposals per scale",
                           cfg.TEST.NUM_PROPOSALS, cfg.TEST.RPN_POST_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N)
        symbol = inference_symbol(cfg, num_classes, rpn_only=rpn_only,
                                  compiled_deformable=use_compiled_deformable(cfg, self.contexts))
        self._check_params(symbol, arg_params, aux_params, source)
        self.module = mx.mod.Module(symbol, data_names=DATA_NAMES, label_names=None, context=self.contexts)
        self.module.bind(self._data_shapes(self.stride, self.stride), for_training=False)
        self.module.set_params(arg_params, aux_params, allow_missing=False, allow_extra=True)

    @classmethod
    def from_checkpoint(cls, cfg, num_classes, path=None, contexts=None, rpn_only=False):
        path = path or checkpoint_file(cfg)
        arg_params, aux_params = load_params(path)
        logger.info("loaded %s", path)
        return cls(cfg, num_classes, arg_params, aux_params, contexts=contexts, rpn_only=rpn_only, source=path)

    def _check_params(self, symbol, arg_params, aux_params, source):
        """Every parameter of the network present with the right shape, or an error naming it."""
        shapes = {d.name: d.shape for d in self._data_shapes(self.stride, self.stride)}
        arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
        needed = dict(zip(symbol.list_arguments(), arg_shapes))
        needed.update(zip(symbol.list_auxiliary_states(), aux_shapes))
        given = {**arg_params, **aux_params}
        missing = [name for name in needed if name not in shapes and name not in given]
        if missing:
            raise ValueError(f"{source} lacks {len(missing)} parameters of the test network (wrong symbol or "
                             f"NUM_CLASSES?), e.g. {', '.join(missing[:5])}")
        for name, shape in needed.items():
            if name not in shapes and tuple(given[name].shape) != tuple(shape):
                raise ValueError(f"{source}: parameter {name} has shape {tuple(given[name].shape)}, the test "
                                 f"network of this config needs {tuple(shape)} (symbol, dataset.NUM_CLASSES?)")

    def _data_shapes(self, height, width):
        b = self.batch_size
        return [mx.io.DataDesc("data", (b, 3, height, width)), mx.io.DataDesc("im_info", (b, 3)),
                mx.io.DataDesc("im_ids", (b,)), mx.io.DataDesc("chip_ids", (b,))]

    def _forward(self, images, scale_spec):
        """One batch (at most ``batch_size`` images) at one scale: ``(outputs by name, scales)``."""
        scales = [scale_spec.image_scale(*image.shape[:2]) for image in images]
        network = self.cfg.network
        inputs = [network_input(image, s, network.PIXEL_MEANS, network.CHANNEL_ORDER) for image, s in zip(images, scales)]
        height = -(-max(x.shape[1] for x in inputs) // self.stride) * self.stride
        width = -(-max(x.shape[2] for x in inputs) // self.stride) * self.stride
        data = np.zeros((self.batch_size, 3, height, width), np.float32)
        # padding slots (a short last batch) get an empty canvas of the full size
        im_info = np.tile(np.array([[height, width, 1.0]], np.float32), (self.batch_size, 1))
        for slot, (x, s) in enumerate(zip(inputs, scales)):
            data[slot, :, :x.shape[1], :x.shape[2]] = x
            im_info[slot] = (x.shape[1], x.shape[2], s)
        ids = np.arange(self.batch_size, dtype=np.float32)
        batch = mx.io.DataBatch(
            data=[mx.nd.array(data), mx.nd.array(im_info), mx.nd.array(ids), mx.nd.zeros(self.batch_size)],
            provide_data=self._data_shapes(height, width))
        self.module.forward(batch, is_train=False)
        outputs = dict(zip(self.module.output_names, (o.asnumpy() for o in self.module.get_outputs())))
        return outputs, scales

    def _per_image(self, images, scale_spec, names):
        """Run ``images`` at one scale, batch by batch; yield ``(image, scale, rois, outputs)`` per image:
        its distinct rois (R, 4) in scaled pixels and the ``names`` outputs of those rois."""
        for start in range(0, len(images), self.batch_size):
            chunk = images[start:start + self.batch_size]
            outputs, scales = self._forward(chunk, scale_spec)
            rois = outputs["rois_output"].reshape(self.batch_size, -1, 5)[:, :, 1:]
            per_roi = {name: outputs[name].reshape(self.batch_size, rois.shape[1], -1) for name in names}
            for slot, (image, scale) in enumerate(zip(chunk, scales)):
                keep = unique_rows(rois[slot])
                yield image, scale, rois[slot, keep], {name: value[slot, keep] for name, value in per_roi.items()}

    def scale_detections(self, images, scale_spec):
        """Per image ``(boxes (R,4) original pixels, scores (R,C))`` of one scale, before merging."""
        if self.rpn_only:
            raise RuntimeError("this Detector holds the RPN-only network; it gives proposals, not detections")
        results = []
        names = ("cls_prob_reshape_output", "bbox_pred_reshape_output")
        for image, scale, rois, outputs in self._per_image(images, scale_spec, names):
            # checkpoints hold the regressor multiplied by the target stds: decode with stds 1
            boxes = decode(rois, outputs["bbox_pred_reshape_output"])
            results.append((to_original(boxes, scale, *image.shape[:2]), outputs["cls_prob_reshape_output"]))
        return results

    def detect(self, images, levels=None):
        """Merged detections per image at ``levels`` (default: the config's test pyramid), float32 (N, 6)
        ``[x1, y1, x2, y2, score, label]``."""
        levels = self.levels if levels is None else levels
        per_scale = [self.scale_detections(images, level.spec) for level in levels]
        ranges = [level.valid_range for level in levels]
        return [merge_scales([scale[i] for scale in per_scale], ranges, self.cfg.TEST) for i in range(len(images))]

    def propose(self, images):
        """RPN proposals per image, float32 (P, 5) ``[x1, y1, x2, y2, score]`` in original pixels:
        the best ``TEST.NUM_PROPOSALS`` of every scale of ``TEST.SCALES``, pooled and sorted by score."""
        if not self.rpn_only:
            raise RuntimeError("proposal extraction needs a Detector built with rpn_only=True")
        pooled = [[] for _ in images]
        for level in self.levels:
            per_image = self._per_image(images, level.spec, ("rois_score",))
            for parts, (image, scale, rois, outputs) in zip(pooled, per_image):
                scores = outputs["rois_score"][:, 0]
                best = np.argsort(-scores, kind="stable")[: self.cfg.TEST.NUM_PROPOSALS]
                parts.append(np.hstack([to_original(rois[best], scale, *image.shape[:2]), scores[best, None]]))
        proposals = []
        for parts in pooled:
            merged = np.concatenate(parts).astype(np.float32)
            proposals.append(merged[np.argsort(-merged[:, 4], kind="stable")])
        return proposals
