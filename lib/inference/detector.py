"""The Python API of a trained network, as Detectron2's DefaultPredictor: ``Detector`` loads a network
(lib.inference.mxnet_network on MXNet, lib.inference.onnx_network on ONNX Runtime), plans its batches once
(lib.inference.batching.BatchPlanner) and picks its run strategy once from ``TEST`` (lib.inference.strategy:
whole images, tiles, AutoFocus or, for an RPN-only network, proposals), then calls it: on images in memory
(``__call__``, ``detect``, ``propose``), on a test set (``run``, ``run_levels``: lib.inference.tester),
and draws (``draw``). Images are tested as the reference tested them (spec section 8; the strategies'
modules say how); preparing images and merging run in worker processes around the network
(lib.inference.streaming) when ``num_workers`` > 0.
"""
import dataclasses
import logging

import numpy as np

from lib.config import ConfigError
from lib.drawing import draw_detections
from lib.inference.batching import BatchPlanner
from lib.inference.detections import Detections
from lib.inference.regions import RegionPlan
from lib.inference.strategy import strategy_for
from lib.inference.streaming import ArrayImages
from lib.run.folder import load_run

logger = logging.getLogger(__name__)

def check_classes(classes, rpn_only):
    """A detection network's class names are given (the RPN-only network has none), or a one-line error."""
    if classes is None and not rpn_only:
        raise ValueError("a detection network needs its class names (background first): pass the dataset's, "
                         "lib.run.folder.checkpoint_classes(params, cfg), or use Detector.from_checkpoint(MODEL)")


class Detector:
    """The test (or RPN-only) network of ``cfg`` with trained parameters, on the configured contexts.

    ``classes`` (background first) names the labels of the detection network; the class count is its
    length (the RPN-only network has none). One constructor per source of the parameters:
    ``from_checkpoint(MODEL)`` (a described run), ``from_config(cfg, params, classes)`` (a checkpoint file
    with a config) and ``from_params(cfg, classes, arg_params, aux_params)`` (arrays). The constructor
    itself takes the ``network`` (lib.inference.mxnet_network states the interface: an MXNet Module, or
    an ONNX export on ONNX Runtime, ``from_onnx(DIR)``, which imports no MXNet, or a stand-in of tests and
    benchmarks). The batches are planned by ``planner`` (lib.inference.batching.BatchPlanner) and run by
    ``strategy`` (lib.inference.strategy), both fixed here. The Python API::

        det = Detector.from_checkpoint("output/sniper_synthetic_tiny/SNIPER-0004.params")
        dets = det(image_bgr)                      # Detections: boxes, scores, labels, names (, masks)
        cv2.imwrite("out.png", det.draw(image_bgr, dets))
    """

    def __init__(self, cfg, classes, network, rpn_only=False, source="parameters"):
        check_classes(classes, rpn_only)
        self.cfg = cfg
        self.rpn_only = rpn_only
        self.source = source
        self.classes = None if rpn_only else list(classes)
        self.network = network
        self.contexts = network.contexts
        self.planner = BatchPlanner(cfg, len(self.contexts), extraction=rpn_only)
        self.levels = self.planner.levels
        self.strategy = strategy_for(cfg, network, self.planner, rpn_only)
        self.mask_head = None  # lib.inference.masks on the final detections (TRAIN.WITH_MASK networks)

    @property
    def module(self):
        """The bound MXNet Module of an MXNet network (None for another back end or a stand-in)."""
        return getattr(self.network, "module", None)

    @classmethod
    def from_params(cls, cfg, classes, arg_params, aux_params, contexts=None, rpn_only=False, source="parameters"):
        """The network of ``cfg`` for ``classes`` (None for ``rpn_only``) bound with the given parameters on
        MXNet; a CheckpointError names a missing or ill-shaped one."""
        from lib.contexts import fp16_enabled, parse_contexts
        from lib.inference.mxnet_network import MxnetMaskNetwork, MxnetNetwork

        check_classes(classes, rpn_only)  # before binding anything
        contexts = parse_contexts(cfg.gpus) if contexts is None else contexts
        fp16_enabled(cfg, "TEST", contexts)  # refuses TEST.fp16 on CPUs in one line
        network = MxnetNetwork(cfg, None if rpn_only else len(classes), arg_params, aux_params, contexts,
                               rpn_only=rpn_only, source=source)
        detector = cls(cfg, classes, network, rpn_only=rpn_only, source=source)
        if cfg.TRAIN.WITH_MASK and not rpn_only:
            from lib.inference.masks import MaskHead
            from symbols import use_compiled_deformable

            detector.mask_head = MaskHead(cfg, network, MxnetMaskNetwork(
                cfg, len(detector.classes), arg_params, aux_params, contexts, use_compiled_deformable(cfg, contexts)),
                detector.planner)
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
        detector = cls(network.cfg if cfg is None else cfg, classes or network.description["classes"], network,
                       source=directory)
        if network.has_masks:
            from lib.inference.masks import MaskHead

            detector.mask_head = MaskHead(detector.cfg, network, OnnxMaskNetwork(network), detector.planner)
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

    # -- the run strategy (lib.inference.strategy) -------------------------------------------------
    def run(self, source, levels=None, num_workers=0, combine=None, plan=None):
        """Yield ``(index, result)`` per image of ``source`` (lib.inference.streaming: RoidbImages or
        ArrayImages) as it completes, or ``(index, IOError)`` for an unreadable one: the strategy's run
        (detections, see ``detect``, or for the RPN-only network proposals, see ``propose``); with ``levels``
        or ``combine``, whole images at ``levels`` (default: the config's pyramid), an image's per-level
        results given to ``combine`` (default: merged). ``plan``, a RegionPlan (lib.inference.regions),
        receives the regions and batches of a run of the strategy, on which the mask pass runs
        (lib.inference.masks)."""
        if levels is None and combine is None:
            yield from self.strategy.run(source, num_workers, plan=plan)
            return
        if plan is not None:
            raise ValueError("a RegionPlan records detection runs on the config's test pyramid only")
        yield from self.strategy.run_at(source, self.levels if levels is None else levels, combine, num_workers)

    def run_levels(self, source, num_workers=0, cache=None, plan=None):
        """Yield ``(index, [Candidates per level of the config's pyramid] or IOError)`` per image of
        ``source``: what ``run`` yields before merging (``merge_levels`` merges), with the levels ``cache``
        (lib.inference.scale_cache.ScaleCache, TEST.USE_CACHE) holds read back instead of run, the others
        cached. ``plan`` (a RegionPlan) receives the regions of every level, read back or run, as in ``run``."""
        yield from self.strategy.run_levels(source, num_workers, cache, plan)

    def merge_levels(self, per_level):
        """An image's final detections (N, 6) from its Candidates per level (``run_levels``): the valid
        ranges, suppression and cap of the config."""
        return self.strategy.merge_levels(per_level)

    def results(self, images, levels=None, combine=None, plan=None):
        """Per image (BGR uint8 arrays, batched together), what ``run`` gives it."""
        found = dict(self.run(ArrayImages(images), levels, combine=combine, plan=plan))
        return [found[index] for index in range(len(images))]

    def scale_results(self, images, levels=None):
        """Per image, its results at each of ``levels`` before they are combined."""
        return self.results(images, levels, combine=list)

    def detect(self, images, levels=None, plan=None):
        """Merged detections per image (BGR uint8 arrays) at ``levels`` (default: the config's test
        pyramid, run by the strategy), float32 (N, 6) ``[x1, y1, x2, y2, score, label]``. The images are
        batched together as the reference batches a test set, so the result of an image can depend on its
        companions. ``plan`` as for ``run``."""
        if self.rpn_only:
            raise RuntimeError("this Detector holds the RPN-only network; it gives proposals, not detections")
        return self.results(images, levels, plan=plan)

    def propose(self, images):
        """RPN proposals per image, float32 (P, 5) ``[x1, y1, x2, y2, score]`` in original pixels:
        the best ``TEST.NUM_PROPOSALS`` of every scale of ``TEST.SCALES``, scale after scale."""
        if not self.rpn_only:
            raise RuntimeError("proposal extraction needs a Detector built with rpn_only=True")
        return self.results(images)
