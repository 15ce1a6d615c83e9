"""GluonCV ImageNet ResNet v2 weights (resnet50_v2, resnet101_v2) in this project's backbone naming.

GluonCV's ResNet v2 is the pre-activation bottleneck network of symbols/resnet.py under other names
(its v1/v1b/v1d models are post-activation and do not map). tools/convert_gluoncv_resnet.py writes
the result as the MXNet checkpoint that network.pretrained / network.pretrained_epoch name.

GluonCV models take RGB images scaled to [0, 1] and standardised by the ImageNet mean/std; this project
feeds 0-255 images minus network.PIXEL_MEANS in network.CHANNEL_ORDER (RGB by default, as the reference;
or BGR). The conversion folds that difference into the input normaliser ``bn_data`` (statistics) and
``conv0`` (input channels reordered for BGR), so the converted backbone computes exactly what GluonCV
computes on the correspondingly preprocessed image. Batch-norm variances absorb the difference between
GluonCV's epsilon and symbols/resnet.BN_EPS.
"""
import mxnet as mx
import numpy as np
from gluoncv.model_zoo.resnet import BottleneckV2
from mxnet.gluon import nn

from lib.data.pixels import channel_sources
from symbols.backbones import BACKBONES
from symbols.resnet import BN_EPS

# The GluonCV models the backbone records name as the source of their ImageNet weights.
MODELS = tuple(backbone.gluoncv_model for backbone in BACKBONES.values() if backbone.gluoncv_model)
GLUON_MEAN = np.array([0.485, 0.456, 0.406])  # RGB, of images scaled to [0, 1] (GluonCV ImageNet preset)
GLUON_STD = np.array([0.229, 0.224, 0.225])
GLUON_BN_EPS = 1e-5  # mxnet.gluon.nn.BatchNorm's default, used by GluonCV's ResNets


def convert(net, pixel_means, channel_order):
    """(arg_params, aux_params) in symbols/resnet.py naming from an initialised GluonCV ResNetV2, for a
    network fed ``channel_order`` ("RGB" or "BGR", network.CHANNEL_ORDER) images.

    `pixel_means` are the BGR-listed means the project subtracts from 0-255 images (network.PIXEL_MEANS).
    """
    layers = list(net.features)
    stages = [layer for layer in layers if isinstance(layer, nn.HybridSequential)]
    if not (isinstance(layers[0], nn.BatchNorm) and isinstance(layers[1], nn.Conv2D)
            and isinstance(layers[2], nn.BatchNorm) and stages
            and all(isinstance(unit, BottleneckV2) for stage in stages for unit in stage)):
        raise ValueError(f"{type(net).__name__} is not a GluonCV bottleneck ResNet v2 (expected e.g. "
                         f"{' or '.join(MODELS)})")
    args, aux = {}, {}
    _input_normaliser(layers[0], layers[1], np.asarray(pixel_means, dtype=np.float64), channel_order, args, aux)
    _batch_norm(layers[2], "bn0", args, aux)
    for stage_index, stage in enumerate(stages, start=1):
        for unit_index, unit in enumerate(stage, start=1):
            name = f"stage{stage_index}_unit{unit_index}"
            for part in ("1", "2", "3"):
                _batch_norm(getattr(unit, f"bn{part}"), f"{name}_bn{part}", args, aux)
                args[f"{name}_conv{part}_weight"] = _value(getattr(unit, f"conv{part}").weight)
            if unit.downsample is not None:
                args[f"{name}_sc_weight"] = _value(unit.downsample.weight)
    arg_params = {k: mx.nd.array(v, dtype="float32") for k, v in args.items()}
    aux_params = {k: mx.nd.array(v, dtype="float32") for k, v in aux.items()}
    return arg_params, aux_params


def _input_normaliser(data_bn, conv0, pixel_means, channel_order, args, aux):
    """GluonCV: y = (x_rgb / 255 - mean) / std, then a BN with fixed gamma 1, statistics (mu, var) and
    beta (0 in GluonCV's models). Project: x = x_c - pixel_mean_c per network input channel, then
    bn_data (fixed gamma 1). Matching per RGB channel c (BGR-listed mean 2 - c): M = 255 std (mu + mean
    / std) - pixel_mean, V = (255 std)^2 (var + gluon eps) - eps, same beta; then put in the network's
    channel order."""
    scale = 255.0 * GLUON_STD
    mu = _value(data_bn.running_mean).astype(np.float64)
    var = _value(data_bn.running_var).astype(np.float64)
    mean_rgb = scale * mu + 255.0 * GLUON_MEAN - pixel_means[::-1]
    var_rgb = scale ** 2 * (var + GLUON_BN_EPS) - BN_EPS
    rgb_of_input = [2 - bgr for bgr in channel_sources(channel_order)]  # RGB channel of each input channel
    aux["bn_data_moving_mean"] = mean_rgb[rgb_of_input]
    aux["bn_data_moving_var"] = var_rgb[rgb_of_input]
    args["bn_data_gamma"] = np.ones(3)
    args["bn_data_beta"] = _value(data_bn.beta)[rgb_of_input]
    args["conv0_weight"] = _value(conv0.weight)[:, rgb_of_input]


def _batch_norm(block, name, args, aux):
    args[f"{name}_gamma"] = _value(block.gamma)
    args[f"{name}_beta"] = _value(block.beta)
    aux[f"{name}_moving_mean"] = _value(block.running_mean)
    aux[f"{name}_moving_var"] = np.maximum(_value(block.running_var) + GLUON_BN_EPS - BN_EPS, 0.0)


def _value(parameter):
    return parameter.data().asnumpy()
