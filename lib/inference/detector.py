"""A test network bound for inference: whole images in, detections or proposals in original pixels out.

Images are tested as the reference tested them (spec section 8): at every scale of the pyramid, batches
of ``TEST.BATCH_IMAGES[scale]`` images per device share one canvas, exactly as large as the batch's
largest scaled image (lib.inference.batching); each image is resized with ``cv2.resize``'s factors,
mean subtracted in the network's channel order and placed in the top-left corner, ``im_info`` giving the
proposal layer its extent (and scale 1, so that the minimum proposal size is in scaled pixels). A box is
decoded in the scaled image, clipped to it, then divided by the scale. The Module reshapes itself
whenever a batch's canvas differs from the previous one. Preparing images and merging run in worker
processes around the network (lib.inference.streaming) when ``num_workers`` > 0.
"""
import dataclasses
import functools
import logging

import numpy as np

from lib.boxes import clip_boxes, decode
from lib.config import ConfigError
from lib.config.validation import images_per_device
from lib.drawing import draw_detections
from lib.inference.autofocus import run_autofocus
from lib.inference.batching import plan
from lib.inference.detections import Detections
from lib.inference.merge import merge_candidates, merge_scales, thresholded_levels
from lib.inference.streaming import ArrayImages, run_pipeline
from lib.inference.regions import RegionPlan
from lib.inference.scale_cache import cached_levels
from lib.inference.tiling import Tiling, region_plan, run_tiled
from lib.run.checkpoint import checkpoint_prefix, params_path
from lib.run.folder import load_run
from lib.scales import pyramid

logger = logging.getLogger(__name__)

DATA_NAMES = ("data", "im_info", "im_ids", "chip_ids")


def checkpoint_file(cfg):
    """``TEST.MODEL`` when set, else epoch ``TEST.TEST_EPOCH`` of the training run of ``cfg``."""
    if cfg.TEST.MODEL:
        return cfg.TEST.MODEL
    return params_path(checkpoint_prefix(cfg), cfg.TEST.TEST_EPOCH)


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


class Detector:
    """The test (or RPN-only) network of ``cfg`` with trained parameters, on the configured contexts.

    ``classes`` (background first) names the labels of the detection network; the class count is its
    length (the RPN-only network has none). One constructor per source of the parameters:
    ``from_checkpoint(MODEL)`` (a described run), ``from_config(cfg, params, classes)`` (a checkpoint file
    with a config) and ``from_params(cfg, classes, arg_params, aux_params)`` (arrays). The constructor
    itself takes the ``network`` (lib.inference.mxnet_network states the interface: an MXNet Module, or
    an ONNX export on ONNX Runtime, ``from_onnx(DIR)``, which imports no MXNet); a stand-in network (tests,
    benchmarks) is a subclass that passes None and gives ``forward``. The Python API::

        det = Detector.from_checkpoint("output/sniper_synthetic_tiny/SNIPER-0004.params")
        dets = det(image_bgr)                      # Detections: boxes, scores, labels, names (, masks)
        cv2.imwrite("out.png", det.draw(image_bgr, dets))
    """

    def __init__(self, cfg, classes, network=None, contexts=None, rpn_only=False, source="parameters"):
        if classes is None and not rpn_only:
            raise ValueError("a detection network needs its class names (background first): pass the dataset's, "
                             "lib.run.folder.checkpoint_classes(params, cfg), or use Detector.from_checkpoint(MODEL)")
        self.cfg = cfg
        self.rpn_only = rpn_only
        self.source = source
        self.classes = None if rpn_only else list(classes)
        self.levels = pyramid(cfg.TEST, "TEST")
        self.images_per_device = images_per_device(cfg.TEST, len(self.levels))
        self.network = network
        if contexts is None and network is not None:
            contexts = network.contexts
        if contexts is None:
            from lib.contexts import parse_contexts  # MXNet contexts

            contexts = parse_contexts(cfg.gpus)
        self.contexts = contexts
        self.fp16 = False  # the body only: inputs and outputs stay float32
        if cfg.TEST.fp16 and network is None:  # a network given here is an ONNX export: float32
            from lib.contexts import fp16_enabled

            self.fp16 = fp16_enabled(cfg, "TEST", self.contexts)
        if rpn_only and cfg.TEST.NUM_PROPOSALS > cfg.TEST.RPN_POST_NMS_TOP_N:
            logger.warning("TEST.NUM_PROPOSALS %d > TEST.RPN_POST_NMS_TOP_N %d: at most %d proposals per scale",
                           cfg.TEST.NUM_PROPOSALS, cfg.TEST.RPN_POST_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N)
        self.mask_head = None  # lib.inference.masks on the final detections (TRAIN.WITH_MASK networks)

    @property
    def module(self):
        """The bound MXNet Module of an MXNet network (None for another back end or a stand-in)."""
        return getattr(self.network, "module", None)

    @classmethod
    def from_params(cls, cfg, classes, arg_params, aux_params, contexts=None, rpn_only=False, source="parameters"):
        """The network of ``cfg`` for ``classes`` (None for ``rpn_only``) bound with the given parameters on
        MXNet; a CheckpointError names a missing or ill-shaped one."""
        from lib.inference.mxnet_network import MxnetMaskNetwork, MxnetNetwork

        detector = cls(cfg, classes, contexts=contexts, rpn_only=rpn_only, source=source)
        detector.network = MxnetNetwork(cfg, None if rpn_only else len(detector.classes), arg_params, aux_params,
                                        detector.contexts, rpn_only=rpn_only, source=source)
        if cfg.TRAIN.WITH_MASK and not rpn_only:
            from lib.inference.masks import MaskHead
            from symbols import use_compiled_deformable

            detector.mask_head = MaskHead(detector, MxnetMaskNetwork(
                cfg, len(detector.classes), arg_params, aux_params, detector.contexts,
                use_compiled_deformable(cfg, detector.contexts)))
        return detector

    @classmethod
    def from_config(cls, cfg, params, classes, contexts=None, rpn_only=False):
        """Checkpoint file ``params`` with the network of ``cfg`` for ``classes``, which the caller resolves
        (the dataset's, or ``lib.run.folder.checkpoint_classes``); None for an ``rpn_only`` network."""
        if cfg.TEST.BACKEND == "onnxruntime":
            from lib.inference.export import exported_onnx

            if rpn_only:
                raise ConfigError("TEST.BACKEND onnxruntime: RPN-only networks (proposal extraction) run on mxnet")
            return cls.from_onnx(exported_onnx(cfg, params), cfg, classes)
        from lib.run.checkpoint import load_params

        arg_params, aux_params = load_params(params)
        logger.info("loaded %s", params)
        return cls.from_params(cfg, classes, arg_params, aux_params, contexts=contexts, rpn_only=rpn_only,
                               source=params)

    @classmethod
    def from_onnx(cls, directory, cfg=None, classes=None, threads=0, providers=("CPUExecutionProvider",)):
        """An ONNX export folder (tools/export_model.py --format onnx) on ONNX Runtime, without MXNet: the
        exported config and classes, or ``cfg`` (its TEST section: scales, proposal, merge and tile
        settings) and ``classes`` with the exported graphs; ``threads`` as ONNX Runtime's intra-op threads
        (0: its default), ``providers`` its execution providers (e.g. ``("CUDAExecutionProvider",)``). A mask
        network's export (with mask.onnx) gives masks as on MXNet."""
        from lib.inference.onnx_network import OnnxMaskNetwork, OnnxNetwork

        network = OnnxNetwork(directory, None if cfg is None else cfg.TEST, threads, providers=providers)
        detector = cls(network.cfg if cfg is None else cfg, classes or network.description["classes"],
                       network=network, source=directory)
        if network.has_masks:
            from lib.inference.masks import MaskHead

            detector.mask_head = MaskHead(detector, OnnxMaskNetwork(network))
        return detector

    @classmethod
    def from_checkpoint(cls, model, overrides=(), contexts=None):
        """A run folder (its newest checkpoint) or a ``.params`` file of one: the config (the run's
        config.yaml, then ``overrides``, e.g. ``{"gpus": "cpu"}``), class names and RPN-only or not come
        from the run record (lib.run.folder.load_run)."""
        run = load_run(model, overrides)
        rpn_only = bool(run.info.get("rpn_only"))
        return cls.from_config(run.cfg, run.params, None if rpn_only else run.info["classes"], contexts=contexts,
                               rpn_only=rpn_only)

    def __call__(self, images):
        """Detections (lib.inference.detections) of one BGR uint8 (H, W, 3) image, or a list of them
        for a list of images (batched together, see ``detect``)."""
        single = not isinstance(images, (list, tuple))
        batch = [images] if single else list(images)
        for image in batch:
            if not (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 3 and image.size):
                raise ValueError(f"expected a BGR image array (H, W, 3), got "
                                 f"{getattr(image, 'shape', type(image).__name__)}")
        plan = RegionPlan() if self.mask_head is not None else None
        found = [Detections.from_array(d, self.classes) for d in self.detect(batch, plan=plan)]
        if self.mask_head is not None:  # on the regions of the detection run (lib.inference.masks)
            masks = self.mask_head.masks(ArrayImages(batch), {i: (d.boxes, d.labels) for i, d in enumerate(found)},
                                         plan)
            found = [dataclasses.replace(dets, masks=masks[index]) for index, dets in enumerate(found)]
        return found[0] if single else found

    def draw(self, image, detections, thresh=0.5):
        """Copy of ``image`` with ``detections`` (Detections or (N, 6) rows) scoring at least ``thresh``."""
        if isinstance(detections, Detections):
            return draw_detections(image, detections.to_array(), self.classes, thresh, masks=detections.masks)
        return draw_detections(image, detections, self.classes, thresh)

    def _batch_counts(self, levels):
        """Images per device of each of ``levels``: the config's count of the same scale, else 1."""
        counts = dict(zip((level.spec for level in self.levels), self.images_per_device))
        return [counts.get(level.spec, 1) * len(self.contexts) for level in levels]

    def plan(self, sizes, levels=None):
        """The TestBatches for images of ``sizes`` ((height, width) each) at ``levels`` (default: the
        config's test pyramid), in running order; the RPN-only network plans as the reference extracted
        proposals (full-resolution canvases, set order)."""
        levels = self.levels if levels is None else levels
        return plan(sizes, levels, self._batch_counts(levels), self.cfg.TEST.BATCH_PARTS,
                    self.cfg.network.IMAGE_STRIDE, extraction=self.rpn_only)

    def release_buffers(self):
        """Free the memory the network's last canvases took: the mask pass runs its own graph after the
        detections."""
        if self.network is not None:
            self.network.release_buffers()

    # -- the network, as the pipeline drives it ------------------------------------------------------
    def forward_shape(self, batch):
        """(images, height, width) of the forward pass of a TestBatch: every device gets images."""
        devices = len(self.contexts)
        return (-(-len(batch.images) // devices) * devices,) + tuple(batch.canvas)

    def forward(self, data, im_info):
        """Outputs by name (NumPy) of one forward pass on ``data`` (B, 3, h, w) float32, ``im_info`` (B, 3)."""
        return self.network.forward(data, im_info)

    def image_result(self, outputs, batch_size, slot, scale, resized, size):
        """One image's result at one scale, from its ``slot`` of a forward pass: ``(boxes (R, 4) original
        pixels, class scores (R, C))``, or for the RPN-only network ``(boxes, scores (R,))``, over its
        distinct rois. ``resized`` and ``size`` are the image's scaled and original (height, width);
        with ``TEST.CLIP_PROPOSALS`` proposals are also clipped to the original image (a scaled pixel is a
        fraction of an original one: the last may end beyond it)."""
        rois = outputs["rois_output"].reshape(batch_size, -1, 5)[slot, :, 1:]
        keep = unique_rows(rois)
        if self.rpn_only:
            boxes = to_original(rois[keep], scale, resized)
            if self.cfg.TEST.CLIP_PROPOSALS:
                boxes = clip_boxes(boxes, *size)
            return boxes, outputs["rois_score"].reshape(batch_size, -1)[slot, keep]
        # checkpoints hold the regressor multiplied by the target stds: decode with stds 1, in float64 and
        # without a cap on dw/dh, as the reference
        deltas = outputs["bbox_pred_reshape_output"][slot, keep]
        boxes = decode(rois[keep].astype(np.float64), deltas.astype(np.float64), max_log_scale=None)
        return to_original(boxes, scale, resized), outputs["cls_prob_reshape_output"][slot, keep]

    def combiner(self, levels):
        """What combines an image's per-level results (a pure NumPy function, run in the workers)."""
        if self.rpn_only:
            return functools.partial(pool_proposals, num_proposals=self.cfg.TEST.NUM_PROPOSALS)
        return functools.partial(merge_scales, valid_ranges=[level.valid_range for level in levels],
                                 test_cfg=self.cfg.TEST)

    # -- whole images ------------------------------------------------------------------------------
    @property
    def autofocus(self):
        """Whether ``run`` and ``detect`` on the config's pyramid use AutoFocus (TEST.AUTO_FOCUS)."""
        return bool(self.cfg.TEST.AUTO_FOCUS) and not self.rpn_only

    def run(self, source, levels=None, num_workers=0, combine=None, plan=None):
        """Yield ``(index, result)`` per image of ``source`` (lib.inference.streaming: RoidbImages or
        ArrayImages) as it completes, or ``(index, IOError)`` for an unreadable one; results are
        detections (see ``detect``) or, for the RPN-only network, proposals (see ``propose``), or what
        ``combine`` makes of an image's per-level results. With TEST.AUTO_FOCUS, detections on the
        config's pyramid come from lib.inference.autofocus (whole images at the coarsest level only); with
        TEST.TILE, from lib.inference.tiling (every scale in tiles). ``plan``, a RegionPlan
        (lib.inference.regions), receives the regions and batches of a detection run on the config's
        pyramid (whole images, tiles or FocusChips per level), on which the mask pass runs
        (lib.inference.masks)."""
        pyramid = levels is None and combine is None and not self.rpn_only
        if plan is not None and not pyramid:
            raise ValueError("a RegionPlan records detection runs on the config's test pyramid only")
        if self.autofocus and pyramid:
            yield from run_autofocus(self, source, num_workers, plan=plan)
            return
        if self.cfg.TEST.TILE and pyramid:
            yield from run_tiled(self, source, num_workers, plan=plan)  # lib.inference.tiling
            return
        if plan is not None:  # whole images at every level: the regions of batching.plan's batches
            plan.extend(region_plan(self, source))
        levels = self.levels if levels is None else levels
        network = self.cfg.network
        yield from run_pipeline(self, source, self.plan(source.sizes(), levels), len(levels),
                                combine or self.combiner(levels), network.PIXEL_MEANS, network.CHANNEL_ORDER,
                                num_workers, timeout=self.cfg.TEST.LOADER_TIMEOUT, warn_after=self.cfg.TEST.STALL_WARN)

    def fresh_levels(self, source, numbers, num_workers=0):
        """Yield ``(index, [Candidates of each level in numbers] or IOError)`` per image of ``source``, from
        the network: what ``run`` merges, before the valid ranges (lib.inference.merge); whole images, or
        TEST.TILE tiles (AutoFocus's levels depend on each other: ``run_levels``)."""
        if self.cfg.TEST.TILE:
            yield from run_tiled(self, source, num_workers, numbers=numbers, merge=False)
            return
        yield from self.run(source, [self.levels[number] for number in numbers], num_workers,
                            combine=functools.partial(thresholded_levels, score_thresh=self.cfg.TEST.SCORE_THRESH))

    def run_levels(self, source, num_workers=0, cache=None, plan=None):
        """Yield ``(index, [Candidates per level of the config's pyramid] or IOError)`` per image of
        ``source``: what ``run`` yields before merging (``merge_levels`` merges), with the levels ``cache``
        (lib.inference.scale_cache.ScaleCache, TEST.USE_CACHE) holds read back instead of run, the others
        cached. Images come in set order once the last level is done. ``plan`` (a RegionPlan) receives the
        regions of every level, read back or run, as in ``run``."""
        if self.rpn_only:
            raise RuntimeError("this Detector holds the RPN-only network; it gives proposals, not detections")
        if self.autofocus:
            yield from run_autofocus(self, source, num_workers, cache=cache, merge=False, plan=plan)
            return
        if plan is not None:  # whole images or tiles: the regions follow from the image sizes alone
            plan.extend(region_plan(self, source, Tiling.from_config(self.cfg.TEST)))
        yield from cached_levels(self, source, num_workers, cache)

    def merge_levels(self, per_level):
        """An image's final detections (N, 6) from its Candidates per level (``run_levels``): the valid
        ranges, suppression and cap of the config."""
        return merge_candidates(per_level, [level.valid_range for level in self.levels], self.cfg.TEST)

    def _results(self, images, levels=None, combine=None, plan=None):
        found = dict(self.run(ArrayImages(images), levels, combine=combine, plan=plan))
        return [found[index] for index in range(len(images))]

    def scale_results(self, images, levels=None):
        """Per image, its results at each of ``levels`` before they are combined (``image_result``)."""
        return self._results(images, levels, combine=list)

    def detect(self, images, levels=None, plan=None):
        """Merged detections per image (BGR uint8 arrays) at ``levels`` (default: the config's test
        pyramid), float32 (N, 6) ``[x1, y1, x2, y2, score, label]``. The images are batched together as
        the reference batches a test set, so the result of an image can depend on its companions.
        ``plan`` as for ``run``."""
        if self.rpn_only:
            raise RuntimeError("this Detector holds the RPN-only network; it gives proposals, not detections")
        return self._results(images, levels, plan=plan)

    def propose(self, images):
        """RPN proposals per image, float32 (P, 5) ``[x1, y1, x2, y2, score]`` in original pixels:
        the best ``TEST.NUM_PROPOSALS`` of every scale of ``TEST.SCALES``, scale after scale."""
        if not self.rpn_only:
            raise RuntimeError("proposal extraction needs a Detector built with rpn_only=True")
        return self._results(images)
