"""Convert GluonCV ImageNet ResNet v2 weights (resnet50_v2, resnet101_v2) to this project's backbone.

Writes the MXNet checkpoint ``{prefix}-{epoch:04d}.params`` for config keys network.pretrained /
network.pretrained_epoch (the conversion: lib/gluoncv_resnet.py).

    python tools/convert_gluoncv_resnet.py --model resnet101_v2 --prefix model/resnet101_v2
        [--params resnet101_v2.params]  # a GluonCV parameter file; without it GluonCV downloads one
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import os

import mxnet as mx
from gluoncv.model_zoo import get_model

from configs.default import DEFAULTS
from lib.atomic import atomic_path
from lib.gluoncv_resnet import MODELS, convert
from lib.logger import report_user_errors
from lib.run.checkpoint import params_path

logger = logging.getLogger("convert_gluoncv_resnet")


def save(prefix, epoch, arg_params, aux_params):
    """The checkpoint file ``{prefix}-{epoch:04d}.params`` (``arg:``/``aux:`` keys), written atomically."""
    path = params_path(prefix, epoch)
    stored = {f"arg:{k}": v for k, v in arg_params.items()}
    stored.update({f"aux:{k}": v for k, v in aux_params.items()})
    with atomic_path(path) as tmp:
        mx.nd.save(tmp, stored)
    return path


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--prefix", required=True, help="output checkpoint prefix (network.pretrained)")
    parser.add_argument("--epoch", type=int, default=0, help="output checkpoint epoch (network.pretrained_epoch)")
    parser.add_argument("--params", help="GluonCV .params file; default: GluonCV's pretrained download")
    parser.add_argument("--pixel-means", type=float, nargs=3, default=DEFAULTS["network"]["PIXEL_MEANS"],
                        help="BGR-listed means the training pipeline subtracts (network.PIXEL_MEANS)")
    parser.add_argument("--channel-order", choices=("RGB", "BGR"), default=DEFAULTS["network"]["CHANNEL_ORDER"],
                        help="channel order the network is fed (network.CHANNEL_ORDER)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.params:
        if not os.path.isfile(args.params):
            parser.error(f"--params {args.params}: no such file")
        net = get_model(args.model, pretrained=False)
        net.load_parameters(args.params)
    else:
        net = get_model(args.model, pretrained=True)
    arg_params, aux_params = convert(net, args.pixel_means, args.channel_order)
    path = save(args.prefix, args.epoch, arg_params, aux_params)
    logger.info("wrote %d arguments and %d auxiliary states to %s (GluonCV's final batch-norm and classifier "
                "are not part of the detection backbone)", len(arg_params), len(aux_params), path)


if __name__ == "__main__":
    main()
