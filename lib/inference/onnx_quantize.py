"""Int8 static quantisation of an ONNX export's body (``tools/export_model.py --format onnx --quantize int8``).

ONNX Runtime's quantiser (onnxruntime.quantization, QDQ format) rewrites ``body.onnx`` in place: after its
pre-processing (batch normalisations folded into the convolutions before them), the batch normalisations
left (the pre-activation ResNets' after each residual addition, those after DeformConv) become a per-channel
Mul and Add, and every convolution, with the ReLUs, additions, multiplications and max pooling between them,
computes on uint8 activations and per-channel int8 weights, which ONNX Runtime's CPU kernels run as integer
operators (VNNI where the CPU has it): a float BatchNormalization between them costs a dequantisation, a
quantisation and two layout transposes each (ResNet-101's body at 800x1067: 5.1 s with them, 4.4 s without).
The activation ranges are calibrated (MinMax) on the body inputs of a few images, pre-processed exactly as
the test does: the float export's Detector runs them and each canvas batch it feeds the body is kept.

What stays float32: ``DeformConv`` and the convolutions computing its offsets (a quantised offset moves a
sample by a fraction of a cell), the head graph (``head.onnx``, the deformable RoI pooling and the fully
connected layers), and the graphs' inputs and outputs (the body's are dequantised). ``model.json`` records the
quantisation under ``quantization``.
onnx and onnxruntime are imported where used: the export tool imports this module on any interpreter.
"""
import logging
import os
import tempfile

import numpy as np

from lib.atomic import write_json
from lib.errors import UserError

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "int8")
QUANTIZED_OPS = ("Conv", "Relu", "Add", "Mul", "MaxPool")
FLOAT_OPS = ("DeformConv",)  # with the convolutions computing their offsets (``offset_convolutions``)


class QuantizationError(UserError, ValueError):
    """A quantisation setting or an export that cannot be quantised (one line naming it)."""


def check_quantization(quantize, calibration):
    """``quantize`` (QUANTIZATIONS) with ``calibration`` images, or a one-line QuantizationError."""
    if quantize not in QUANTIZATIONS:
        raise QuantizationError(f"quantization {quantize!r} is not supported (one of {', '.join(QUANTIZATIONS)})")
    if quantize == "int8" and calibration < 1:
        raise QuantizationError(f"int8 quantization needs at least 1 calibration image (got {calibration})")


def calibration_images(cfg, count):
    """The first ``count`` images (BGR uint8) of the config's test set (``dataset.test_image_set``), the
    calibration set of ``--quantize int8``: images like those the network will see, none it was trained on."""
    from lib.dataset import load_roidb
    from lib.dataset.image_io import read_roidb_image

    roidb, _ = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    if len(roidb) < count:
        logger.warning("calibrating on the %d images of %s (%d asked for)", len(roidb), cfg.dataset.test_image_set,
                       count)
    return [read_roidb_image(entry) for entry in roidb[:count]]


def calibration_batches(detector, images):
    """The body inputs (B, 3, H, W) float32 that ``detector`` (an ONNX export's, lib.inference.onnx_network)
    feeds its network while detecting ``images`` (BGR uint8) at every test scale."""
    network, batches = detector.network, []
    forward = network.forward

    def recording(data, im_info):
        batches.append(np.array(data, np.float32))
        return forward(data, im_info)

    network.forward = recording
    try:
        detector.detect(list(images))
    finally:
        del network.forward  # the class's method again
    return batches


def offset_convolutions(graph):
    """Names of the Conv nodes whose outputs reach a DeformConv's offset input through non-Conv nodes
    (not through a Shape: the export's border correction reads the data's shape, not its values)."""
    producers = {output: node for node in graph.node for output in node.output}
    found, stack, seen = set(), [node.input[2] for node in graph.node if node.op_type == "DeformConv"], set()
    while stack:
        node = producers.get(stack.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "Conv":
            found.add(node.name)
        elif node.op_type != "Shape":
            stack += list(node.input)
    return sorted(found)


def batch_norms_as_affine(model):
    """``model`` (a ModelProto) with each BatchNormalization (inference) replaced by Mul and Add with
    per-channel (1, C, 1, 1) constants: ``x * gamma / sqrt(var + eps) + (beta - mean * gamma / sqrt(var +
    eps))``, computed in float64 and stored as float32; the initializers no node reads any more are dropped."""
    from onnx import helper, numpy_helper

    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            nodes.append(node)
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(initializers[name]).astype(np.float64)
                                  for name in node.input[1:5])
        eps = next((attr.f for attr in node.attribute if attr.name == "epsilon"), 1e-5)
        scale = gamma / np.sqrt(var + eps)
        for suffix, value in (("scale", scale), ("shift", beta - mean * scale)):
            model.graph.initializer.append(numpy_helper.from_array(value.reshape(1, -1, 1, 1).astype(np.float32),
                                                                   f"{node.name}_{suffix}"))
        nodes += [helper.make_node("Mul", [node.input[0], f"{node.name}_scale"], [f"{node.name}_scaled"],
                                   name=f"{node.name}_mul"),
                  helper.make_node("Add", [f"{node.name}_scaled", f"{node.name}_shift"], [node.output[0]],
                                   name=f"{node.name}_add")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    kept = [tensor for tensor in model.graph.initializer if tensor.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


class _Batches:
    """onnxruntime.quantization's CalibrationDataReader over recorded body inputs."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def get_next(self):
        batch = next(self.batches, None)
        return None if batch is None else {"data": batch}


def quantize_body(directory, batches, images):
    """Rewrite ``directory``'s body.onnx as int8 QDQ calibrated on ``batches`` (``calibration_batches`` of
    ``images`` images) and record it in its model.json; returns the quantised body's path."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from lib.inference.onnx_network import DESCRIPTION, read_description

    description = read_description(directory)
    if description.get("quantization"):
        raise QuantizationError(f"{directory} is already quantized ({description['quantization']['body']})")
    if not batches:
        raise QuantizationError(f"no calibration input for {directory}: the calibration images gave no canvas")
    body = os.path.join(directory, description["graphs"]["body"])
    model = onnx.load(body)
    for index, node in enumerate(model.graph.node):  # the quantiser selects and excludes nodes by name
        node.name = node.name or f"{node.op_type}_{index}"
    with tempfile.TemporaryDirectory() as scratch:
        named, prepared = os.path.join(scratch, "named.onnx"), os.path.join(scratch, "prepared.onnx")
        onnx.save(model, named)
        ort.set_default_logger_severity(3)  # not a warning per folded BatchNorm's parameters
        try:
            quant_pre_process(named, prepared, skip_symbolic_shape=True)  # folds BatchNorm into Conv
        finally:
            ort.set_default_logger_severity(2)  # ONNX Runtime's default, warnings
        affine = batch_norms_as_affine(onnx.load(prepared))
        onnx.save(affine, prepared)
        excluded = offset_convolutions(affine.graph)
        quantize_static(prepared, body, _Batches(batches), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(QUANTIZED_OPS), per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=excluded, calibrate_method=CalibrationMethod.MinMax)
    description["quantization"] = {
        "body": "int8", "format": "QDQ (uint8 activations, per-channel int8 weights)",
        "quantized_ops": list(QUANTIZED_OPS), "float_ops": list(FLOAT_OPS) + ["the offset convolutions"],
        "float_nodes": excluded, "head": "float32", "calibration": f"MinMax on {len(batches)} canvas batches of "
                                                                    f"{images} images"}
    write_json(description, os.path.join(directory, DESCRIPTION))
    logger.info("quantized %s to int8 (%d offset convolutions kept float32)", body, len(excluded))
    return body


def quantize_export(directory, images):
    """Quantise the float32 export in ``directory`` to int8, calibrated on ``images`` (BGR uint8 arrays)."""
    from lib.inference.detector import Detector

    images = list(images)
    check_quantization("int8", len(images))
    return quantize_body(directory, calibration_batches(Detector.from_onnx(directory), images), len(images))
