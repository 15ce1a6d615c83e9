"""The head graph's deformable RoI poolings on lib/ops' compiled kernel, for the ONNX Runtime back end (no MXNet).

ONNX Runtime's CPU RoiAlign, which the portable head graph pools with (lib/inference/onnx_export.py
``_deformable_roi_pool``), takes 6-9x the time of lib/ops' pooling. ``lib/ops/libsniper_pool.so`` (``make``) is
that pooling's code (lib/ops/src/deformable_psroi_pooling.cc, the one MXNet's CompiledDeformablePSROIPooling runs)
behind a plain C ABI (lib/ops/src/c_api), loaded here with ctypes. ``CompiledPoolingGraph`` cuts ``head.onnx`` (or
``mask.onnx``) at the poolings its metadata records (``POOLINGS_KEY``) with onnx.utils.Extractor and runs the
pieces in ONNX Runtime sessions, the poolings between them; the files stay the whole, portable graphs.

TEST.ONNX_POOLING (lib/inference/onnx_network.py): "auto" pools compiled when the library loads and the export
records its poolings, else with the graph; "compiled" refuses to run without it; "graph" runs the whole graph.
"""
import ctypes
import json
import logging
import os

import numpy as np

from lib.errors import UserError

logger = logging.getLogger(__name__)

LIBRARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "libsniper_pool.so")
_FLOATS = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")


class CompiledPoolingError(UserError, RuntimeError):
    """The compiled pooling cannot run (library missing or unloadable, an export without pooling records)."""


def load_library(path=None):
    """The compiled pooling library at ``path`` (default ``LIBRARY``) via ctypes, or a one-line
    CompiledPoolingError saying why not."""
    path = path or LIBRARY
    if not os.path.isfile(path):
        raise CompiledPoolingError(f"{path} not found (build it: make)")
    try:
        library = ctypes.CDLL(path)
    except OSError as err:
        raise CompiledPoolingError(f"{path} cannot be loaded: {err}") from None
    function = library.sniper_deformable_roi_pool
    function.restype = ctypes.c_int
    function.argtypes = [_FLOATS, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _FLOATS, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int,
                         _FLOATS]
    return library


def deformable_roi_pool(library, data, rois, trans, pooled_size, sample_per_part, spatial_scale, trans_std,
                        threads=0):
    """lib/ops' deformable RoI pooling (MXNet's DeformablePSROIPooling with group_size 1, part_size = pooled_size)
    of ``data`` (B, C, H, W) over ``rois`` (N, 5) [batch index, x1, y1, x2, y2] with offsets ``trans`` (N, 2, P,
    P) or None -> (N, C, P, P) float32; ``threads`` > 0: OpenMP threads (0: its default)."""
    data = np.ascontiguousarray(data, np.float32)
    rois = np.ascontiguousarray(rois, np.float32).reshape(-1, 5)
    batch, channels, height, width = data.shape
    out = np.empty((len(rois), channels, pooled_size, pooled_size), np.float32)
    if trans is not None:
        trans = np.ascontiguousarray(trans, np.float32)
        if trans.shape != (len(rois), 2, pooled_size, pooled_size):
            raise ValueError(f"deformable RoI pooling: trans of shape {trans.shape}, expected "
                             f"{(len(rois), 2, pooled_size, pooled_size)}")
    status = library.sniper_deformable_roi_pool(
        data, batch, channels, height, width, rois, len(rois), None if trans is None else trans.ctypes.data,
        pooled_size, sample_per_part, spatial_scale, trans_std, int(threads), out)
    if status > 0:
        raise ValueError(f"deformable RoI pooling: roi {status - 1} has batch index {rois[status - 1, 0]}, "
                         f"outside [0, {batch})")
    if status < 0:
        raise ValueError(f"deformable RoI pooling: bad sizes (data {data.shape}, pooled_size {pooled_size}, "
                         f"sample_per_part {sample_per_part})")
    return out


class CompiledPoolingGraph:
    """The graph at ``path`` (head.onnx, mask.onnx) as ONNX Runtime pieces cut at its deformable RoI poolings,
    which run compiled in between; ``run(output_names, feeds)`` as an InferenceSession's. ``session(model
    bytes)`` makes a session; ``threads`` as OnnxNetwork's."""

    def __init__(self, path, session, library, threads=0):
        try:
            import onnx
            from onnx.utils import Extractor
        except ImportError:
            raise CompiledPoolingError("cutting the graph at its poolings needs the onnx package (pinned in "
                                       "requirements.txt)") from None
        from lib.inference.onnx_export import POOLINGS_KEY

        model = onnx.load(path)
        records = {prop.key: prop.value for prop in model.metadata_props}.get(POOLINGS_KEY)
        if records is None:
            raise CompiledPoolingError(f"{path} records no poolings (an export older than the compiled pooling, "
                                       f"or a float16 one)")
        self.poolings = json.loads(records)
        self.library, self.threads = library, threads
        graph = model.graph
        known = {v.name for v in (*graph.value_info, *graph.input, *graph.output)}
        # the cut needs the types of the tensors it cuts at, which shape inference leaves out behind RoiAlign
        cut_at = dict.fromkeys(name for p in self.poolings for name in (p["data"], p["trans"], p["output"]) if name)
        graph.value_info.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                for name in cut_at if name not in known)
        self.inputs = [i.name for i in model.graph.input]
        self.outputs = [o.name for o in model.graph.output]
        extractor = Extractor(model)
        available = list(self.inputs)
        self.pieces = []  # (session or None, its inputs) before each pooling, then the one for the outputs
        for wanted in [[p["data"]] + ([p["trans"]] if p["trans"] else []) for p in self.poolings] + [self.outputs]:
            missing = [name for name in wanted if name not in available]
            if not missing:
                self.pieces.append((None, []))
            else:
                piece = extractor.extract_model(available, missing)
                self.pieces.append((session(piece.SerializeToString()), [i.name for i in piece.graph.input]))
                available += missing
            if len(self.pieces) <= len(self.poolings):
                available.append(self.poolings[len(self.pieces) - 1]["output"])

    def run(self, output_names, feeds):
        """The graph's outputs ``output_names`` (None: all, in the graph's order) on ``feeds`` {features, rois}."""
        tensors = dict(feeds)
        for index, (session, names) in enumerate(self.pieces):
            if session is not None:
                wanted = [o.name for o in session.get_outputs()]
                tensors.update(zip(wanted, session.run(None, {name: tensors[name] for name in names})))
            if index < len(self.poolings):
                pooling = self.poolings[index]
                rois = tensors[pooling["rois"]]  # (B, R, 4): image b's rois in row b
                images = np.repeat(np.arange(rois.shape[0], dtype=np.float32), rois.shape[1])[:, None]
                tensors[pooling["output"]] = deformable_roi_pool(
                    self.library, tensors[pooling["data"]], np.hstack([images, rois.reshape(-1, 4)]),
                    tensors[pooling["trans"]] if pooling["trans"] else None, pooling["pooled_size"],
                    pooling["sample_per_part"], pooling["spatial_scale"], pooling["trans_std"], self.threads)
        return [tensors[name] for name in (output_names or self.outputs)]
