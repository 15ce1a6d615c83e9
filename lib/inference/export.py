"""A deployable test graph: ``PREFIX-symbol.json`` + ``PREFIX-0000.params`` that a stock MXNet 1.9.1 loads
with ``mx.model.load_checkpoint`` and binds with ``mx.mod.Module``, without this repository.

The in-repo test graph has two parts stock MXNet lacks: the reference's proposal layer (a Python
CustomOp, ``TEST.PROPOSAL_LAYER: reference``) and, on CPU contexts, lib/ops' compiled deformable
operators (``network.CPU_DEFORMABLE_OPS: compiled``). The export builds the graph with MXNet's own
operators instead: MultiProposal (``TEST.PROPOSAL_LAYER: stock``, whose proposals differ slightly from
the reference's: docs/reference_differences.md) and the stock deformable convolution and PS-ROI pooling
(same parameters, same results). ``PREFIX-model.json`` describes the inputs and the classes, and names its
source by the run's name, the checkpoint's file name and SHA-256 (no path of the machine it was made on). A network
trained with masks (TRAIN.WITH_MASK) also gets its mask graph (symbols.sniper.mask_inference_symbol, the
masks of given boxes): ``PREFIX-mask-symbol.json`` + ``PREFIX-mask-0000.params``.
"""
import hashlib
import logging
import os

import mxnet as mx

from lib.atomic import atomic_path, write_bytes, write_json
from lib.config import with_overrides
from lib.inference.mxnet_network import DATA_NAMES, check_params, mask_shapes
from lib.run.folder import checkpoint_classes, read_model_info
from lib.run.checkpoint import checkpoint_file, load_params
from symbols import inference_symbol
from symbols.backbones import feature_stride
from symbols.mask import MASK_SIZE
from symbols.sniper import mask_inference_symbol

logger = logging.getLogger(__name__)

EXPORT_EPOCH = 0
# The keys the exported graph is built with: stock MXNet operators only.
STOCK_OPERATORS = {"TEST.PROPOSAL_LAYER": "stock", "network.CPU_DEFORMABLE_OPS": "stock"}


def export_test_graph(cfg, prefix):
    """Write the stock test graph of the checkpoint ``TEST.MODEL`` (or epoch ``TEST.TEST_EPOCH`` of the
    run of ``cfg``) to ``prefix``; ``cfg`` as lib.run.folder gives it (a run's config.yaml) or a config
    file with the checkpoint's network. Returns the paths written ``(symbol, params, description)``."""
    params = checkpoint_file(cfg)
    arg_params, aux_params = load_params(params)
    info = read_model_info(params) or {}
    rpn_only = bool(info.get("rpn_only", cfg.TRAIN.ONLY_PROPOSAL))
    classes = None if rpn_only else checkpoint_classes(params, cfg)
    cfg = with_overrides(cfg, STOCK_OPERATORS)
    symbol = inference_symbol(cfg, None if rpn_only else len(classes), rpn_only=rpn_only, compiled_deformable=False)
    check_params(symbol, arg_params, aux_params, params, feature_stride(cfg))
    paths = _save_graph(symbol, arg_params, aux_params, prefix)
    description = {"source": checkpoint_identity(cfg, params), "epoch": EXPORT_EPOCH, "symbol": cfg.symbol,
                   "rpn_only": rpn_only, "classes": classes, "category_ids": info.get("category_ids"),
                   **describe(cfg, symbol)}
    if cfg.TRAIN.WITH_MASK and not rpn_only:
        mask_symbol = mask_inference_symbol(cfg, len(classes), compiled_deformable=False)
        paths += _save_graph(mask_symbol, arg_params, aux_params, f"{prefix}-mask")
        description["masks"] = describe_masks(mask_symbol)
    paths += (f"{prefix}-model.json",)
    write_json(description, paths[-1])
    return paths


def checkpoint_identity(cfg, params):
    """What the exported files were made from, without a path of this machine: the run's name, the checkpoint's
    file name and the SHA-256 of its bytes (the same file wherever it is copied)."""
    digest = hashlib.sha256()
    with open(params, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"run": cfg.name, "checkpoint": os.path.basename(params), "sha256": digest.hexdigest()}


def _save_graph(symbol, arg_params, aux_params, prefix):
    """``prefix``-symbol.json and -0000.params holding only what ``symbol`` uses (no training-only values),
    in MXNet's own arg:/aux: layout; returns their paths."""
    blob = {f"arg:{name}": arg_params[name] for name in symbol.list_arguments() if name in arg_params}
    blob.update({f"aux:{name}": aux_params[name] for name in symbol.list_auxiliary_states()})
    paths = (f"{prefix}-symbol.json", f"{prefix}-{EXPORT_EPOCH:04d}.params")
    with atomic_path(paths[0]) as tmp:
        symbol.save(tmp)
    with atomic_path(paths[1]) as tmp:
        mx.nd.save(tmp, blob)
    return paths


def describe_masks(symbol):
    """How the exported mask graph is fed and read (lib/inference/masks.py does it in the repository)."""
    return {
        "graph": "PREFIX-mask (mx.model.load_checkpoint(PREFIX + '-mask', 0)), data names data, mask_rois",
        "data": "as the test graph's data: the image at the test scale chosen for the boxes",
        "mask_rois": "float32 (R, 5): [0, x1, y1, x2, y2] final detection boxes multiplied by that scale",
        "outputs": symbol.list_outputs(),
        "mask_prob": "(R, C, 28, 28): per foreground class (label - 1) the object probability on a 28x28 grid "
                     "spanning x1..x2, y1..y2; pasted into the image and thresholded at 0.5",
    }


def describe(cfg, symbol):
    """What a user of the exported graph needs to feed it and read it."""
    network = cfg.network
    return {
        "inputs": {
            "data_names": list(DATA_NAMES),
            "data": "float32 (B, 3, H, W): the image resized by a test scale, minus PIXEL_MEANS (BGR order), "
                    "channels in CHANNEL_ORDER, placed top-left on the canvas (H, W rounded up to IMAGE_STRIDE "
                    "when > 0)",
            "im_info": "float32 (B, 3): scaled height, scaled width, 1",
            "im_ids": "float32 (B,): any ids, passed through",
            "chip_ids": "float32 (B,): zeros",
        },
        "outputs": symbol.list_outputs(),
        "PIXEL_MEANS": list(network.PIXEL_MEANS), "CHANNEL_ORDER": network.CHANNEL_ORDER,
        "IMAGE_STRIDE": network.IMAGE_STRIDE, "TEST.SCALES": list(cfg.TEST.SCALES),
        "TEST.VALID_RANGES": [list(r) for r in cfg.TEST.VALID_RANGES],
        "boxes": "rois_output rows [batch index, x1, y1, x2, y2] in scaled pixels; bbox_pred_reshape_output "
                 "the class-agnostic deltas (stds folded in) to decode on the rois, then divide by the scale",
        "operators": dict(STOCK_OPERATORS),
    }


# The keys an ONNX export is built and run with: float32 (ONNX Runtime on the CPU), the MXNet graph's own
# deformable operators (translated node by node), and the reference's proposal rules, which the runtime
# applies in NumPy between the two graphs.
ONNX_EXPORT_KEYS = {"TEST.fp16": False, "network.CPU_DEFORMABLE_OPS": "stock", "TEST.PROPOSAL_LAYER": "stock"}
ONNX_RUN_KEYS = {"TEST.fp16": False, "TEST.PROPOSAL_LAYER": "reference"}
ONNX_FILES = {"body": "body.onnx", "head": "head.onnx", "mask": "mask.onnx", "description": "model.json"}


def exported_onnx(cfg, params):
    """The ONNX export folder of checkpoint ``params`` (``onnx/<its name>/`` beside it), exported now when
    it is missing or older than the checkpoint (TEST.BACKEND onnxruntime)."""
    directory = os.path.join(os.path.dirname(os.path.abspath(params)), "onnx",
                             os.path.splitext(os.path.basename(params))[0])
    description = os.path.join(directory, ONNX_FILES["description"])
    if not (os.path.isfile(description) and os.path.getmtime(description) >= os.path.getmtime(params)):
        logger.info("exporting %s to ONNX in %s", params, directory)
        export_onnx(cfg, directory, params)
    return directory


def export_onnx(cfg, directory, params=None, fp16=False):
    """Write the ONNX export (lib/inference/onnx_export.py) of checkpoint ``params`` (default ``TEST.MODEL``,
    or epoch ``TEST.TEST_EPOCH`` of the run of ``cfg``) into ``directory``: body.onnx, head.onnx and
    model.json, and mask.onnx for a TRAIN.WITH_MASK network; ``fp16``: the graphs' layers in float16 (inputs and
    outputs float32: onnx_export.float16_model). Networks the export does not cover (RPN-only) are refused in one
    line. Returns the paths."""
    from lib.inference.onnx_export import ExportError

    params = params or checkpoint_file(cfg)
    arg_params, aux_params = load_params(params)
    info = read_model_info(params) or {}
    if info.get("rpn_only", cfg.TRAIN.ONLY_PROPOSAL):
        raise ExportError(f"{params}: an RPN-only network is not exported to ONNX (detection networks are)")
    return export_onnx_params(cfg, checkpoint_classes(params, cfg), arg_params, aux_params, directory, params,
                              info.get("category_ids"), fp16)


def export_onnx_params(cfg, classes, arg_params, aux_params, directory, source="parameters", category_ids=None,
                       fp16=False):
    """``export_onnx`` of parameter arrays (MXNet NDArrays) of the detection network of ``cfg`` for ``classes``."""
    from lib.config.core import plain
    from lib.inference.onnx_export import FORMAT_VERSION, OPSET, export_graphs, export_mask_graph, float16_model

    graph_cfg = with_overrides(cfg, ONNX_EXPORT_KEYS)
    symbol = inference_symbol(graph_cfg, len(classes), compiled_deformable=False)
    check_params(symbol, arg_params, aux_params, source, feature_stride(cfg))
    arrays = {name: value.asnumpy() for name, value in {**arg_params, **aux_params}.items()}
    body, head, features = export_graphs(symbol.tojson(), arrays)
    models = {"body": body, "head": head}
    if cfg.TRAIN.WITH_MASK:  # the mask graph on the body's features and the final detections' boxes
        mask_symbol = mask_inference_symbol(graph_cfg, len(classes), compiled_deformable=False)
        check_params(mask_symbol, arg_params, aux_params, source, feature_stride(cfg),
                     mask_shapes(feature_stride(cfg)))
        models["mask"] = export_mask_graph(mask_symbol.tojson(), arrays, features)
    if fp16:
        models = {key: float16_model(model) for key, model in models.items()}
    os.makedirs(directory, exist_ok=True)
    paths = {key: os.path.join(directory, ONNX_FILES[key]) for key in (*models, "description")}
    for key, model in models.items():
        write_bytes(model.SerializeToString(), paths[key])
    network = cfg.network
    description = {
        "format": "sniper-onnx", "version": FORMAT_VERSION, "opset": OPSET, "symbol": cfg.symbol,
        "source": checkpoint_identity(cfg, source) if os.path.isfile(str(source)) else source,
        "classes": list(classes), "category_ids": category_ids, "stride": feature_stride(cfg),
        "graphs": {key: ONNX_FILES[key] for key in models}, "precision": "float16" if fp16 else "float32",
        "anchors": {"scales": list(network.ANCHOR_SCALES), "ratios": list(network.ANCHOR_RATIOS)},
        "inputs": {"data": "float32 (B, 3, H, W): each image resized by a test scale, minus PIXEL_MEANS (BGR), "
                           "channels in CHANNEL_ORDER, top-left on a canvas shared by the batch",
                   "rois": "float32 (B, R, 4): per image its proposals (the reference's rules, "
                           "lib/boxes/proposals.py), x1, y1, x2, y2 in scaled pixels"},
        "outputs": {"body": list(body.graph.output[i].name for i in range(len(body.graph.output))),
                    "head": ["cls_prob (B * R, classes)", "bbox_pred (B * R, 4): class-agnostic deltas, stds "
                                                          "folded in, decoded on the rois with stds 1"],
                    **({"mask": [f"mask_prob (B * R, classes - 1, {MASK_SIZE}, {MASK_SIZE}): per foreground class "
                                 "(label - 1) the object probability on a grid spanning the roi, from features and "
                                 "rois (the final detections in the canvas's pixels)"]} if "mask" in models else {})},
        "PIXEL_MEANS": list(network.PIXEL_MEANS), "CHANNEL_ORDER": network.CHANNEL_ORDER,
        "TEST.SCALES": plain(cfg.TEST.SCALES), "TEST.VALID_RANGES": plain(cfg.TEST.VALID_RANGES),
        "config": plain(with_overrides(cfg, ONNX_RUN_KEYS)),
    }
    if "mask" in models:
        description["mask_size"] = MASK_SIZE
    write_json(description, paths["description"])
    return tuple(paths.values())
