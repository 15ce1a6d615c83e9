"""Initial parameters for training: the ImageNet backbone from a checkpoint, new layers initialised.

The checkpoint is MXNet's ``{prefix}-{epoch:04d}.params`` (``arg:``/``aux:`` keys) with the classic
symbolic ResNet naming of symbols/resnet.py; only names the training symbol has are used (an ImageNet
classifier's final ``bn1``/``fc1`` are ignored). GluonCV ``resnet{50,101}_v2`` weights are converted
to that naming by tools/convert_gluoncv_resnet.py.

New layers (everything the checkpoint does not provide), TRAIN.NEW_LAYER_INIT:

* deformable offsets (``*offset*``): zeros, so deformable layers start as their regular counterparts;
* ``reference`` (as the reference's ``init_weight_rcnn`` / ``init_weight_mask``): every other new layer (RPN,
  R-CNN reduction ``conv_new_1``, the AutoFocus FocusPixels layers ``conv_new_2``, ``conv_new_3``,
  ``conv_new_out``, FC layers, classifier, box regressor, the mask branch's convolutions and deconvolution)
  has weights N(0, 0.01);
* ``msra``: RPN layers, R-CNN reduction and classifier N(0, 0.01), the box regressor N(0, 0.001)
  (targets are divided by stds 0.1/0.2, so small outputs), the R-CNN FC layers and the FocusPixels layers
  MSRA/He Gaussian;
* anything else (the whole backbone with TRAIN.FROM_SCRATCH): MSRA/He Gaussian (Xavier, fan-in,
  magnitude 2), suited to ReLU layers;
* biases and batch-norm beta/moving means zero, gammas and moving variances one (MXNet's rules).
"""
import logging
import os

import mxnet as mx

from lib.errors import UserError
from lib.run.checkpoint import load_params, params_path
from symbols import is_imagenet_parameter

logger = logging.getLogger(__name__)

_MSRA = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)
NEW_LAYER_INITS = {
    "reference": mx.init.Mixed([r".*offset", r"rpn_|conv_new_|fc_new_|cls_score_|bbox_pred_|mask_", r".*"],
                               [mx.init.Zero(), mx.init.Normal(0.01), _MSRA]),
    "msra": mx.init.Mixed([r".*offset", r"rpn_|conv_new_1_|cls_score_", r"bbox_pred_", r".*"],
                          [mx.init.Zero(), mx.init.Normal(0.01), mx.init.Normal(0.001), _MSRA]),
}


class PretrainedError(UserError, RuntimeError):
    """The pretrained checkpoint is missing or does not fit the network."""


def initial_params(cfg, symbol, input_shapes):
    """(arg_params, aux_params): float32 NDArrays for every parameter of `symbol`.

    `input_shapes` maps the symbol's data and label names to shapes (they are not parameters).
    Backbone parameters come from cfg.network.pretrained / pretrained_epoch unless TRAIN.FROM_SCRATCH.
    """
    arg_shapes, _, aux_shapes = symbol.infer_shape(**dict(input_shapes))
    if arg_shapes is None:
        raise PretrainedError(f"cannot infer the parameter shapes of the network from inputs {dict(input_shapes)}")
    wanted_args = {n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n not in input_shapes}
    wanted_aux = dict(zip(symbol.list_auxiliary_states(), aux_shapes))
    if cfg.TRAIN.FROM_SCRATCH:
        stored_args, stored_aux, path = {}, {}, None
        logger.info("TRAIN.FROM_SCRATCH: every parameter is initialised, no pretrained weights")
        if cfg.network.FIXED_PARAMS:
            logger.warning("TRAIN.FROM_SCRATCH with network.FIXED_PARAMS %s: those layers stay at their random "
                           "initialisation", list(cfg.network.FIXED_PARAMS))
    else:
        path = params_path(cfg.network.pretrained, cfg.network.pretrained_epoch)
        stored_args, stored_aux = _load_checkpoint(path)
        _check_backbone_present(wanted_args, wanted_aux, stored_args, stored_aux, path)
    attrs = symbol.attr_dict()
    init = NEW_LAYER_INITS[cfg.TRAIN.NEW_LAYER_INIT]
    arg_params = _fill(wanted_args, stored_args, attrs, path, init)
    aux_params = _fill(wanted_aux, stored_aux, attrs, path, init)
    if path is not None:
        unused = sorted(set(stored_args) - set(wanted_args)) + sorted(set(stored_aux) - set(wanted_aux))
        logger.info("loaded %d parameters from %s; initialised %d new ones; ignored %d unused (%s)",
                    sum(n in stored_args for n in wanted_args) + sum(n in stored_aux for n in wanted_aux), path,
                    sum(n not in stored_args for n in wanted_args) + sum(n not in stored_aux for n in wanted_aux),
                    len(unused), ", ".join(unused[:8]) + (" ..." if len(unused) > 8 else ""))
    return arg_params, aux_params


def _load_checkpoint(path):
    if not os.path.isfile(path):
        raise PretrainedError(
            f"pretrained weights {path} not found (config keys network.pretrained / network.pretrained_epoch). "
            f"Convert GluonCV ImageNet weights with `python tools/convert_gluoncv_resnet.py --model resnet101_v2 "
            f"--prefix <prefix>` (downloads them once; or pass --params with a GluonCV .params file), "
            f"use an MXNet resnet checkpoint with the classic naming, or set TRAIN.FROM_SCRATCH true.")
    try:
        arg_params, aux_params, training_values = load_params(path, with_training_values=True, plain_names=False)
    except ValueError as err:
        raise PretrainedError(f"{err} (GluonCV files need tools/convert_gluoncv_resnet.py)") from None
    # a checkpoint of this project (fine-tuning, e.g. adding the AutoFocus branch to a trained detector) keeps
    # its box regressor test-ready under arg: and as trained under train:; training continues from the latter
    arg_params.update(training_values)
    return arg_params, aux_params


def _check_backbone_present(wanted_args, wanted_aux, stored_args, stored_aux, path):
    """A pretrained file must provide the whole backbone; a partial match means the wrong file or naming."""
    missing = [n for n in wanted_args if is_imagenet_parameter(n) and n not in stored_args]
    missing += [n for n in wanted_aux if n not in stored_aux]
    if missing:
        raise PretrainedError(f"{path} lacks {len(missing)} backbone parameters of the network, e.g. "
                              f"{', '.join(sorted(missing)[:5])}; is it a ResNet of the configured depth (config key "
                              f"symbol) with the classic MXNet naming?")


def _fill(wanted, stored, attrs, path, init):
    params = {}
    for name, shape in wanted.items():
        if name in stored:
            if stored[name].shape != tuple(shape):
                raise PretrainedError(f"{path}: parameter {name} has shape {stored[name].shape}, the network "
                                      f"needs {tuple(shape)}")
            params[name] = stored[name].astype("float32")
        else:
            params[name] = mx.nd.zeros(shape, dtype="float32")
            # attrs carry the operators' own rules (batch-norm moving statistics), as in Module
            init(mx.init.InitDesc(name, attrs.get(name, {})), params[name])
    return params
