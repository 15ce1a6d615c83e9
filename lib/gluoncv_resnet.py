"""Convert GluonCV ImageNet ResNet v2 weights (resnet50_v2, resnet101_v2) to this project's backbone.

GluonCV's ResNet v2 is the pre-activation bottleneck network of symbols/resnet.py under other names
(its v1/v1b/v1d models are post-activation and do not map). The result is an MXNet checkpoint
``{prefix}-{epoch:04d}.params`` for config keys network.pretrained / network.pretrained_epoch.

GluonCV models take RGB images scaled to [0, 1] and standardised by the ImageNet mean/std; this project
feeds BGR 0-255 images minus network.PIXEL_MEANS. The converter folds that difference into the input
normaliser ``bn_data`` (statistics) and ``conv0`` (input channels reversed), so the converted backbone
computes exactly what GluonCV computes on the correspondingly preprocessed image. Batch-norm variances
absorb the difference between GluonCV's epsilon and symbols/resnet.BN_EPS.

    .venv/bin/python tools/convert_gluoncv_resnet.py --model resnet101_v2 --prefix model/resnet101_v2
        [--params resnet101_v2.params]  # a GluonCV parameter file; without it GluonCV downloads one
"""
import argparse
import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
from gluoncv.model_zoo import get_model  # noqa: E402
from gluoncv.model_zoo.resnet import BottleneckV2  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

from configs.default import DEFAULTS  # noqa: E402
from lib.train.pretrained import checkpoint_path  # noqa: E402
from symbols.resnet import BN_EPS  # noqa: E402

logger = logging.getLogger("convert_gluoncv_resnet")

MODELS = ("resnet50_v2", "resnet101_v2")
GLUON_MEAN = np.array([0.485, 0.456, 0.406])  # RGB, of images scaled to [0, 1] (GluonCV ImageNet preset)
GLUON_STD = np.array([0.229, 0.224, 0.225])
GLUON_BN_EPS = 1e-5  # mxnet.gluon.nn.BatchNorm's default, used by GluonCV's ResNets


def convert(net, pixel_means):
    """(arg_params, aux_params) in symbols/resnet.py naming from an initialised GluonCV ResNetV2.

    `pixel_means` are the BGR means the project subtracts from 0-255 images (network.PIXEL_MEANS).
    """
    layers = list(net.features)
    stages = [layer for layer in layers if isinstance(layer, nn.HybridSequential)]
    if not (isinstance(layers[0], nn.BatchNorm) and isinstance(layers[1], nn.Conv2D)
            and isinstance(layers[2], nn.BatchNorm) and stages
            and all(isinstance(unit, BottleneckV2) for stage in stages for unit in stage)):
        raise ValueError("%s is not a GluonCV bottleneck ResNet v2 (expected e.g. %s)"
                         % (type(net).__name__, " or ".join(MODELS)))
    args, aux = {}, {}
    _input_normaliser(layers[0], layers[1], np.asarray(pixel_means, dtype=np.float64), args, aux)
    _batch_norm(layers[2], "bn0", args, aux)
    for stage_index, stage in enumerate(stages, start=1):
        for unit_index, unit in enumerate(stage, start=1):
            name = "stage%d_unit%d" % (stage_index, unit_index)
            for part in ("1", "2", "3"):
                _batch_norm(getattr(unit, "bn" + part), "%s_bn%s" % (name, part), args, aux)
                args["%s_conv%s_weight" % (name, part)] = _value(getattr(unit, "conv" + part).weight)
            if unit.downsample is not None:
                args[name + "_sc_weight"] = _value(unit.downsample.weight)
    arg_params = {k: mx.nd.array(v, dtype="float32") for k, v in args.items()}
    aux_params = {k: mx.nd.array(v, dtype="float32") for k, v in aux.items()}
    return arg_params, aux_params


def _input_normaliser(data_bn, conv0, pixel_means, args, aux):
    """GluonCV: y = (x_rgb / 255 - mean) / std, then a BN with fixed gamma 1, statistics (mu, var) and
    beta (0 in GluonCV's models). Project: x = x_bgr - pixel_means, then bn_data (fixed gamma 1).
    Matching per RGB channel c (BGR channel 2 - c): M = 255 std (mu + mean / std) - pixel_mean,
    V = (255 std)^2 (var + gluon eps) - eps, same beta."""
    scale = 255.0 * GLUON_STD
    mu = _value(data_bn.running_mean).astype(np.float64)
    var = _value(data_bn.running_var).astype(np.float64)
    mean_rgb = scale * mu + 255.0 * GLUON_MEAN - pixel_means[::-1]
    var_rgb = scale ** 2 * (var + GLUON_BN_EPS) - BN_EPS
    aux["bn_data_moving_mean"] = mean_rgb[::-1]
    aux["bn_data_moving_var"] = var_rgb[::-1]
    args["bn_data_gamma"] = np.ones(3)
    args["bn_data_beta"] = _value(data_bn.beta)[::-1]
    args["conv0_weight"] = _value(conv0.weight)[:, ::-1]


def _batch_norm(block, name, args, aux):
    args[name + "_gamma"] = _value(block.gamma)
    args[name + "_beta"] = _value(block.beta)
    aux[name + "_moving_mean"] = _value(block.running_mean)
    aux[name + "_moving_var"] = np.maximum(_value(block.running_var) + GLUON_BN_EPS - BN_EPS, 0.0)


def _value(parameter):
    return parameter.data().asnumpy()


def save(prefix, epoch, arg_params, aux_params):
    path = checkpoint_path(prefix, epoch)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    stored = {"arg:" + k: v for k, v in arg_params.items()}
    stored.update({"aux:" + k: v for k, v in aux_params.items()})
    mx.nd.save(path, stored)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--prefix", required=True, help="output checkpoint prefix (network.pretrained)")
    parser.add_argument("--epoch", type=int, default=0, help="output checkpoint epoch (network.pretrained_epoch)")
    parser.add_argument("--params", help="GluonCV .params file; default: GluonCV's pretrained download")
    parser.add_argument("--pixel-means", type=float, nargs=3, default=DEFAULTS["network"]["PIXEL_MEANS"],
                        help="BGR means the training pipeline subtracts (network.PIXEL_MEANS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.params:
        if not os.path.isfile(args.params):
            parser.error("--params %s: no such file" % args.params)
        net = get_model(args.model, pretrained=False)
        net.load_parameters(args.params)
    else:
        net = get_model(args.model, pretrained=True)
    arg_params, aux_params = convert(net, args.pixel_means)
    path = save(args.prefix, args.epoch, arg_params, aux_params)
    logger.info("wrote %d arguments and %d auxiliary states to %s (GluonCV's final batch-norm and classifier "
                "are not part of the detection backbone)", len(arg_params), len(aux_params), path)


if __name__ == "__main__":
    main()
