"""Atomic checkpoints in MXNet's ``prefix-symbol.json`` / ``prefix-%04d.params`` layout.

A checkpoint's ``.params`` is what the test network loads: the class-agnostic box regressor is stored
de-normalised (multiplied back by the target stds, spec section 7), so training normalises it again on
resume. The optimizer state goes beside it as ``prefix-%04d.states``; an epoch counts as complete only
when both files exist, and each is written to a temporary name and renamed, so a run killed mid-write
never leaves a checkpoint that looks complete.
"""
import glob
import logging
import os
import re

import mxnet as mx
import numpy as np

logger = logging.getLogger(__name__)

BBOX_PRED_WEIGHT = "bbox_pred_weight"
BBOX_PRED_BIAS = "bbox_pred_bias"


def params_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.params"


def states_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.states"


def _replace_atomically(write, path):
    """Call ``write(tmp_path)`` then rename onto ``path``; the tmp file keeps the suffix MXNet expects."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _scale_regressor(arg_params, stds, means, forward):
    """De-normalise (forward=True) or normalise the box regressor in a copy of ``arg_params``."""
    if BBOX_PRED_WEIGHT not in arg_params:
        return dict(arg_params)
    stds = np.asarray(stds, dtype=np.float32)
    means = np.asarray(means, dtype=np.float32)
    weight = arg_params[BBOX_PRED_WEIGHT].asnumpy()
    bias = arg_params[BBOX_PRED_BIAS].asnumpy()
    repeat = weight.shape[0] // len(stds)
    stds, means = np.tile(stds, repeat), np.tile(means, repeat)
    if forward:
        weight, bias = weight * stds[:, None], bias * stds + means
    else:
        weight, bias = weight / stds[:, None], (bias - means) / stds
    scaled = dict(arg_params)
    scaled[BBOX_PRED_WEIGHT] = mx.nd.array(weight, dtype=arg_params[BBOX_PRED_WEIGHT].dtype)
    scaled[BBOX_PRED_BIAS] = mx.nd.array(bias, dtype=arg_params[BBOX_PRED_BIAS].dtype)
    return scaled


def save_checkpoint(prefix, epoch, symbol, arg_params, aux_params, stds, means, save_states=None):
    """Write symbol, test-ready params and (via ``save_states(path)``) optimizer states for ``epoch``."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    if symbol is not None:
        _replace_atomically(symbol.save, f"{prefix}-symbol.json")
    test_args = _scale_regressor(arg_params, stds, means, forward=True)
    blob = {f"arg:{k}": v for k, v in test_args.items()}
    blob.update({f"aux:{k}": v for k, v in aux_params.items()})
    if save_states is not None:
        _replace_atomically(save_states, states_path(prefix, epoch))
    # params last: its presence marks the epoch complete
    _replace_atomically(lambda tmp: mx.nd.save(tmp, blob), params_path(prefix, epoch))
    logger.info("saved checkpoint %s", params_path(prefix, epoch))


def load_params(path):
    """Load ``arg:``/``aux:`` dicts from a ``.params`` file, with a clear error for a bad file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        blob = mx.nd.load(path)
    except mx.base.MXNetError as err:
        raise ValueError(f"checkpoint {path} cannot be read (truncated or not an MXNet .params file): "
                         f"{str(err).splitlines()[0]}") from None
    if not isinstance(blob, dict):
        raise ValueError(f"checkpoint {path} holds a list, not named parameters")
    arg_params, aux_params = {}, {}
    for key, value in blob.items():
        kind, _, name = key.partition(":")
        if kind == "arg":
            arg_params[name] = value
        elif kind == "aux":
            aux_params[name] = value
        else:  # plain names (e.g. Gluon save_parameters): treat as arguments
            arg_params[key] = value
    return arg_params, aux_params


def load_training_checkpoint(prefix, epoch, stds, means):
    """Params of ``epoch`` with the box regressor normalised again for training."""
    arg_params, aux_params = load_params(params_path(prefix, epoch))
    return _scale_regressor(arg_params, stds, means, forward=False), aux_params


def last_complete_epoch(prefix):
    """The highest epoch with both params and optimizer states on disk, or 0 when none."""
    epochs = []
    for path in glob.glob(glob.escape(prefix) + "-*.params"):
        match = re.fullmatch(re.escape(prefix) + r"-(\d{4})\.params", path)
        if match and os.path.isfile(states_path(prefix, int(match.group(1)))):
            epochs.append(int(match.group(1)))
    return max(epochs, default=0)
