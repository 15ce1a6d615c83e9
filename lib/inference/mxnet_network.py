"""The test network on MXNet behind the Detector's network seam (lib.inference.detector): a bound Module
of symbols.inference_symbol on the configured contexts. The ONNX Runtime network
(lib.inference.onnx_network) has the same interface, so the strategies (whole images, tiles, AutoFocus)
and the pipeline do not depend on which runs.

A network has ``contexts`` (the devices a forward pass splits its images over: its batch is a multiple of
their count), ``forward(data (B, 3, h, w) float32, im_info (B, 3)) -> {output name: NumPy array}`` with the
MXNet test graph's output names, and ``release_buffers()``. ``MxnetMaskNetwork`` runs a mask network's mask
graph for lib.inference.masks.MaskHead (lib.inference.onnx_network.OnnxMaskNetwork on ONNX Runtime).
"""
import mxnet as mx
import numpy as np

from lib.run.checkpoint import CheckpointError
from symbols import inference_symbol, use_compiled_deformable
from symbols.backbones import feature_stride
from symbols.mask import MASK_SIZE
from symbols.sniper import mask_inference_symbol

DATA_NAMES = ("data", "im_info", "im_ids", "chip_ids")  # the test graph's inputs (symbols.inference_symbol)


def data_shapes(batch, height, width):
    """The test graph's inputs for ``batch`` images on a (height, width) canvas."""
    return [mx.io.DataDesc("data", (batch, 3, height, width)), mx.io.DataDesc("im_info", (batch, 3)),
            mx.io.DataDesc("im_ids", (batch,)), mx.io.DataDesc("chip_ids", (batch,))]


def check_params(symbol, arg_params, aux_params, source, stride, shapes=None):
    """Every parameter of the test network ``symbol`` (or of another graph with inputs of ``shapes``, e.g.
    ``mask_shapes``) present with the right shape, or a CheckpointError naming it."""
    shapes = shapes or {d.name: d.shape for d in data_shapes(1, stride, stride)}
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    needed = dict(zip(symbol.list_arguments(), arg_shapes))
    needed.update(zip(symbol.list_auxiliary_states(), aux_shapes))
    given = {**arg_params, **aux_params}
    missing = [name for name in needed if name not in shapes and name not in given]
    if missing:
        raise CheckpointError(f"{source} lacks {len(missing)} parameters of the test network (wrong symbol or "
                              f"NUM_CLASSES?), e.g. {', '.join(missing[:5])}")
    for name, shape in needed.items():
        if name not in shapes and tuple(given[name].shape) != tuple(shape):
            raise CheckpointError(f"{source}: parameter {name} has shape {tuple(given[name].shape)}, the test "
                                  f"network of this config needs {tuple(shape)} (symbol, dataset.NUM_CLASSES?)")


class MxnetNetwork:
    """The test (or RPN-only) network of ``cfg`` for ``num_classes`` (None: RPN-only) bound on ``contexts``
    with the given parameters; a CheckpointError names a missing or ill-shaped one (``source``: their file)."""

    def __init__(self, cfg, num_classes, arg_params, aux_params, contexts, rpn_only=False, source="parameters"):
        self.contexts = contexts
        self.stride = feature_stride(cfg)
        symbol = inference_symbol(cfg, num_classes, rpn_only=rpn_only,
                                  compiled_deformable=use_compiled_deformable(cfg, contexts))
        check_params(symbol, arg_params, aux_params, source, self.stride)
        self.module = mx.mod.Module(symbol, data_names=DATA_NAMES, label_names=None, context=contexts)
        self.module.bind(data_shapes(len(contexts), self.stride, self.stride), for_training=False)
        self.module.set_params(arg_params, aux_params, allow_missing=False, allow_extra=True)

    def forward(self, data, im_info):
        """Outputs by name (NumPy) of one forward pass on ``data`` (B, 3, h, w) float32, ``im_info`` (B, 3)."""
        size, _, height, width = data.shape
        ids = np.arange(size, dtype=np.float32)
        batch = mx.io.DataBatch(
            data=[mx.nd.from_numpy(data, zero_copy=True), mx.nd.array(im_info), mx.nd.array(ids),
                  mx.nd.zeros(size)],
            provide_data=data_shapes(size, height, width))
        self.module.forward(batch, is_train=False)
        return dict(zip(self.module.output_names, (o.asnumpy() for o in self.module.get_outputs())))

    def release_buffers(self):
        """Free the memory the last canvases took (bound again at its smallest input; the next run grows it)."""
        if self.module.binded:
            self.module.bind(data_shapes(len(self.contexts), self.stride, self.stride), for_training=False,
                             force_rebind=True)


def mask_shapes(stride):
    """The smallest inputs of the mask graph (symbols.sniper.mask_inference_symbol)."""
    return {"data": (1, 3, stride, stride), "mask_rois": (1, 5)}


class MxnetMaskNetwork:
    """The mask graph (symbols.sniper.mask_inference_symbol) of the network of ``cfg`` for ``num_classes``
    bound on every one of ``contexts`` with the given parameters, for lib.inference.masks.MaskHead."""

    map_size = MASK_SIZE

    def __init__(self, cfg, num_classes, arg_params, aux_params, contexts, compiled_deformable):
        symbol = mask_inference_symbol(cfg, num_classes, compiled_deformable=compiled_deformable)
        shapes = mask_shapes(feature_stride(cfg))
        # executors reshaped per call (the rois are not a batch axis, as a Module would split them); the
        # inputs float32, the parameters' types inferred (float16 in the float16 body and mask convolutions)
        self.executors = []
        for context in contexts:
            executor = symbol.simple_bind(context, grad_req="null", type_dict=dict.fromkeys(shapes, "float32"),
                                          **shapes)
            executor.copy_params_from(arg_params, aux_params, allow_extra_params=True)
            self.executors.append(executor)

    def forward(self, parts):
        """Per part ``(device, data, rows (n, 5), labels (n,))`` the (n, 28, 28) maps of each row's class; the
        devices' passes are all started before the first is waited for."""
        running = []
        for device, data, rows, labels in parts:
            executor = self.executors[device]
            context = executor.arg_dict["data"].context
            bound = executor.reshape(allow_up_sizing=True, data=data.shape, mask_rois=rows.shape)
            bound.forward(is_train=False, data=mx.nd.array(data, context), mask_rois=mx.nd.array(rows, context))
            # each roi's map of its own class (label - 1: the maps are of the foreground classes)
            running.append(mx.nd.gather_nd(bound.outputs[0], mx.nd.array(np.stack([np.arange(len(rows)), labels - 1]),
                                                                          context)))
        return [picked.asnumpy() for picked in running]
