"""The exported test network (lib/inference/export.py ``export_onnx``) on ONNX Runtime, behind the
Detector's network seam (lib/inference/mxnet_network.py states it): the strategies, the pipeline, the
proposal rules and the merge are the project's own code, shared with the MXNet back end; MXNet is never
imported (tests/inference/test_onnx.py checks it in a child process).

A forward pass runs ``body.onnx`` on the canvas batch, the reference's proposal rules in NumPy
(lib/boxes/proposals.py) on its RPN maps, and ``head.onnx`` on the proposals, and returns the MXNet test
graph's outputs by name (``rois_output``, ``cls_prob_reshape_output``, ``bbox_pred_reshape_output`` and,
with AutoFocus, ``scale_prob_output``), which the Detector reads as it reads MXNet's. A mask network's export
has a third graph, ``mask.onnx``, which ``OnnxMaskNetwork`` runs for lib.inference.masks.MaskHead as
lib.inference.mxnet_network.MxnetMaskNetwork runs the MXNet mask graph.

ONNX Runtime 1.31 (the first releases with DeformConv on the CPU are after 1.24) needs Python >= 3.11: an
older interpreter gets a one-line refusal of this back end, nothing else changes for it.
"""
import json
import logging
import os
import sys

import numpy as np

from configs.default import DEFAULTS
from lib.boxes.proposals import proposals
from lib.config.core import restore
from lib.errors import UserError

logger = logging.getLogger(__name__)

BACKENDS = ("mxnet", "onnxruntime")
MIN_PYTHON = (3, 11)
DESCRIPTION = "model.json"


class BackendError(UserError, RuntimeError):
    """The ONNX Runtime back end cannot run here (interpreter, package) or on this export."""


def add_backend_argument(parser):
    """``--backend mxnet|onnxruntime`` of main_test.py and demo.py: TEST.BACKEND for this run."""
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the test network's back end (TEST.BACKEND): onnxruntime runs the checkpoint's ONNX "
                             "export (made once, in onnx/ beside the checkpoint) on ONNX Runtime's CPU provider")


def with_backend(args):
    """``args`` with ``--backend`` appended to its ``--set`` words (the config key TEST.BACKEND)."""
    if args.backend:
        args.set = list(args.set or []) + ["TEST.BACKEND", args.backend]
    return args


def import_onnxruntime():
    """The onnxruntime module, or a one-line BackendError saying what is missing."""
    if sys.version_info < MIN_PYTHON:
        raise BackendError(f"the onnxruntime back end needs Python >= {'.'.join(map(str, MIN_PYTHON))} (ONNX Runtime "
                           f"1.31.1, the first with DeformConv), this is {sys.version.split()[0]}; use the mxnet one")
    try:
        import onnxruntime
    except ImportError:
        raise BackendError("the onnxruntime back end needs the onnxruntime package (pinned in requirements.txt: "
                           "pip install -r requirements.txt -c constraints.txt)") from None
    return onnxruntime


def read_description(directory):
    """The model.json of an ONNX export folder, or a one-line error naming what is missing or wrong."""
    path = os.path.join(directory, DESCRIPTION)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: export the model first (python tools/export_model.py --model "
                                f"RUN --format onnx --out {directory})")
    try:
        with open(path) as f:
            description = json.load(f)
    except (OSError, ValueError) as err:
        raise BackendError(f"{path} cannot be read: {err}") from None
    if description.get("format") != "sniper-onnx":
        raise BackendError(f"{path} does not describe a SNIPER ONNX export (format {description.get('format')!r})")
    return description


OPTIMIZATION_LEVELS = ("none", "basic", "extended", "all")
POOLED_GRAPHS = ("head", "mask")  # the graphs with deformable RoI poolings (in this order)


def session_options(ort, threads=0, optimization="all"):
    """ONNX Runtime SessionOptions: ``threads`` intra-op threads (0: ONNX Runtime's default), graph
    optimisation level ``optimization`` (OPTIMIZATION_LEVELS, ONNX Runtime's DISABLE_ALL .. ENABLE_ALL)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    options.graph_optimization_level = dict(zip(OPTIMIZATION_LEVELS, (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)))[optimization]
    return options


class OnnxNetwork:
    """The two graphs of an ONNX export folder in ONNX Runtime sessions (``providers``: ONNX Runtime's execution
    providers, by default the CPU's; ``threads``: intra-op threads, 0 = ONNX Runtime's default);
    ``test_cfg`` (a config's TEST section) gives the proposal rules' settings and TEST.ONNX_POOLING (default: the
    exported config's): on the CPU provider the head's (and mask graph's) poolings run on lib/ops' compiled kernel
    between pieces of the graph (lib/inference/compiled_pooling.py) unless it says "graph"."""

    contexts = ("onnxruntime-cpu",)  # one device: a forward pass takes the whole batch

    def __init__(self, directory, test_cfg=None, threads=0, optimization="all", providers=("CPUExecutionProvider",)):
        ort = import_onnxruntime()
        self.description = read_description(directory)
        self.cfg = restore(self.description["config"])
        self.test = test_cfg if test_cfg is not None else self.cfg.TEST
        options = session_options(ort, threads, optimization)
        if self.description.get("precision") == "float16" and providers[0] == "CPUExecutionProvider":
            logger.warning("%s: a float16 export on ONNX Runtime's CPU provider, which casts its layers back to "
                           "float32: about as fast as the float32 export (ResNet-101 at 320x480 on 2 threads: 8.5 "
                           "against 9.3 s per image) and a little less exact; export without --fp16 for CPUs",
                           directory)
        graphs = self.description["graphs"]
        if self.cfg.TRAIN.WITH_MASK and "mask" not in graphs:
            raise BackendError(f"{directory}: the export of a TRAIN.WITH_MASK network lacks its mask graph "
                               f"(export it again: tools/export_model.py --format onnx)")
        if "head" not in graphs:
            raise BackendError(f"{directory}: {DESCRIPTION} names no head graph (export it again: "
                               f"tools/export_model.py --format onnx)")
        paths = {key: os.path.join(directory, name) for key, name in graphs.items()}
        for path in paths.values():
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path} not found (the export folder {directory} is incomplete)")
        self.stride = int(self.description["stride"])
        self.anchors = self.description["anchors"]
        self.has_masks = "mask" in graphs

        def session(model):
            return ort.InferenceSession(model, options, providers=list(providers))

        # the graphs with poolings run as compiled-pooling pieces where allowed, the rest (and those otherwise)
        # as whole sessions: each graph is loaded once
        self.sessions = self._pool_compiled(directory, paths, session, threads, providers)
        self.pooling = "compiled" if self.sessions else "graph"
        self.sessions.update({key: session(path) for key, path in paths.items() if key not in self.sessions})

    def _pool_compiled(self, directory, paths, session, threads, providers):
        """CompiledPoolingGraphs of the graphs with deformable RoI poolings (head, mask) where TEST.ONNX_POOLING
        and the library allow, by key (none: the graphs pool with their RoiAlign); logs which pooling runs."""
        from lib.inference.compiled_pooling import CompiledPoolingError, CompiledPoolingGraph, load_library

        mode = self.test.get("ONNX_POOLING", DEFAULTS["TEST"]["ONNX_POOLING"])
        if mode == "graph":
            logger.info("%s: deformable RoI pooling by the graphs' RoiAlign (TEST.ONNX_POOLING graph)", directory)
            return {}
        pooled = [key for key in POOLED_GRAPHS if key in paths]
        try:
            if providers[0] != "CPUExecutionProvider":
                raise CompiledPoolingError(f"the compiled pooling runs on the host, the graphs on {providers[0]}")
            library = load_library()
            compiled = {key: CompiledPoolingGraph(paths[key], session, library, threads) for key in pooled}
        except CompiledPoolingError as err:
            if mode == "compiled":
                raise BackendError(f"TEST.ONNX_POOLING compiled: {err}") from None
            logger.info("%s: deformable RoI pooling by the graphs' RoiAlign (%s)", directory, err)
            return {}
        logger.info("%s: deformable RoI pooling compiled (lib/ops/libsniper_pool.so) between pieces of %s", directory,
                    " and ".join(os.path.basename(paths[key]) for key in pooled))
        return compiled

    def forward(self, data, im_info):
        """Outputs by name (NumPy) of one forward pass on ``data`` (B, 3, h, w) float32, ``im_info`` (B, 3), as
        the MXNet test graph names them."""
        body = dict(zip((o.name for o in self.sessions["body"].get_outputs()),
                        self.sessions["body"].run(None, {"data": np.ascontiguousarray(data, np.float32)})))
        test = self.test
        rois, _ = proposals(body["rpn_cls_prob"], body["rpn_bbox_pred"], np.asarray(im_info, np.float32),
                            self.stride, tuple(self.anchors["scales"]), tuple(self.anchors["ratios"]),
                            test.RPN_PRE_NMS_TOP_N, test.RPN_POST_NMS_TOP_N, test.RPN_NMS_THRESH, test.RPN_MIN_SIZE)
        size, per_image = data.shape[0], test.RPN_POST_NMS_TOP_N
        cls_prob, bbox_pred = self.sessions["head"].run(
            None, {"features": body["features"], "rois": rois[:, 1:].reshape(size, per_image, 4)})
        outputs = {"rois_output": rois, "cls_prob_reshape_output": cls_prob.reshape(size, per_image, -1),
                   "bbox_pred_reshape_output": bbox_pred.reshape(size, per_image, 4)}
        if "scale_prob" in body:
            outputs["scale_prob_output"] = body["scale_prob"]
        return outputs

    def release_buffers(self):
        """Nothing to free: ONNX Runtime sizes its buffers per run."""


class OnnxMaskNetwork:
    """The mask graph (``mask.onnx``) of an OnnxNetwork's export for lib.inference.masks.MaskHead: per part the
    body's features of its canvases, then the masks of its rows (each image's padded to the batch's most)."""

    def __init__(self, network):
        self.sessions = network.sessions
        self.map_size = int(network.description["mask_size"])

    def forward(self, parts):
        """Per part ``(device, data (b, 3, h, w), rows (n, 5) [slot, x1, y1, x2, y2], labels (n,))`` the (n,
        28, 28) maps of each row's class (label - 1: the maps are of the foreground classes)."""
        found = []
        for _, data, rows, labels in parts:
            features = self.sessions["body"].run(["features"], {"data": np.ascontiguousarray(data, np.float32)})[0]
            slots = rows[:, 0].astype(np.int64)
            counts = np.bincount(slots, minlength=len(data))
            place = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)  # rows are slot by slot
            rois = np.zeros((len(data), counts.max(), 4), np.float32)
            rois[slots, place] = rows[:, 1:]
            maps = self.sessions["mask"].run(None, {"features": features, "rois": rois})[0]
            found.append(maps[slots * counts.max() + place, np.asarray(labels, np.int64) - 1])
        return found
