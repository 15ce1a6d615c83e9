"""Atomic checkpoints in MXNet's ``prefix-symbol.json`` / ``prefix-%04d.params`` layout.

A run's files live in ``output_dir(cfg)`` = ``{output_path}/{name}`` and its checkpoints under
``checkpoint_prefix(cfg)`` = ``{output_dir}/{TRAIN.model_prefix}``.

A checkpoint's ``.params`` is what the test network loads: the class-agnostic box regressor is stored
de-normalised (multiplied back by the target stds, spec section 7). Multiplying and dividing by the
stds in float32 is not exact, and a resumed run must continue bit for bit, so the training values of
the regressor are also kept, under ``train:`` keys that MXNet's own loaders ignore. The optimizer
state goes beside it as ``prefix-%04d.states``, and ``prefix-%04d.progress.json`` holds the iteration
counts a resume needs and, under ``model``, what inference needs without the config or dataset
(lib.run_folder: class names, network, test scales, pixel means); an epoch counts as complete only when both files
exist, and each is written to a temporary name and renamed (``lib.atomic``), so a run killed
mid-write never leaves a checkpoint that looks complete.
"""
import glob
import json
import logging
import os
import re

import mxnet as mx
import numpy as np

from lib.atomic import atomic_path, write_json

logger = logging.getLogger(__name__)

BBOX_PRED_WEIGHT = "bbox_pred_weight"
BBOX_PRED_BIAS = "bbox_pred_bias"
TRAIN_KIND = "train"  # key prefix of the regressor's exact training values


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the network asked of it."""


def output_dir(cfg):
    """``{output_path}/{name}``: the run's checkpoints, logs and results."""
    return os.path.join(cfg.output_path, cfg.name)


def checkpoint_prefix(cfg):
    """``{output_path}/{name}/{TRAIN.model_prefix}``: the prefix of the run's checkpoint files."""
    return os.path.join(output_dir(cfg), cfg.TRAIN.model_prefix)


def params_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.params"


def states_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.states"


def progress_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.progress.json"


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


def save_checkpoint(prefix, epoch, symbol, arg_params, aux_params, stds, means, save_states=None, progress=None):
    """Write symbol, test-ready params, optimizer states (via ``save_states(path)``) and the
    training ``progress`` dict (iteration counts a resumed run needs to keep the same schedule)."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    if symbol is not None:
        with atomic_path(f"{prefix}-symbol.json") as tmp:
            symbol.save(tmp)
    test_args = _scale_regressor(arg_params, stds, means, forward=True)
    blob = {f"arg:{k}": v for k, v in test_args.items()}
    blob.update({f"aux:{k}": v for k, v in aux_params.items()})
    blob.update({f"{TRAIN_KIND}:{k}": arg_params[k] for k in (BBOX_PRED_WEIGHT, BBOX_PRED_BIAS) if k in arg_params})
    if save_states is not None:
        with atomic_path(states_path(prefix, epoch)) as tmp:
            save_states(tmp)
    if progress is not None:
        write_json(progress, progress_path(prefix, epoch))
    # params last: its presence marks the epoch complete
    with atomic_path(params_path(prefix, epoch)) as tmp:
        mx.nd.save(tmp, blob)
    logger.info("saved checkpoint %s", params_path(prefix, epoch))


def load_params(path, with_training_values=False, plain_names=True):
    """Load ``arg:``/``aux:`` dicts from a ``.params`` file, with a clear error for a bad file.

    ``with_training_values`` also returns the dict of exact training values saved under ``train:``.
    Keys without a kind (e.g. Gluon ``save_parameters``) count as arguments, or are an error naming the
    key when ``plain_names`` is false.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        blob = mx.nd.load(path)
    except mx.base.MXNetError as err:
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated or not an MXNet .params file): "
                         f"{str(err).splitlines()[0]}") from None
    if not isinstance(blob, dict):
        raise CheckpointError(f"checkpoint {path} holds a list, not named parameters")
    arg_params, aux_params, training_values = {}, {}, {}
    for key, value in blob.items():
        kind, _, name = key.partition(":")
        if kind == "arg":
            arg_params[name] = value
        elif kind == "aux":
            aux_params[name] = value
        elif kind == TRAIN_KIND:
            training_values[name] = value
        elif plain_names:
            arg_params[key] = value
        else:
            raise CheckpointError(f"{path}: key {key!r} is not 'arg:<name>' or 'aux:<name>'; not an MXNet checkpoint")
    if with_training_values:
        return arg_params, aux_params, training_values
    return arg_params, aux_params


def load_training_checkpoint(prefix, epoch, stds, means):
    """Params of ``epoch`` with the box regressor back in its training (normalised) form."""
    arg_params, aux_params, training_values = load_params(params_path(prefix, epoch), with_training_values=True)
    arg_params = _scale_regressor(arg_params, stds, means, forward=False)
    arg_params.update(training_values)  # exact values, where the checkpoint has them
    return arg_params, aux_params


def load_progress(prefix, epoch):
    """The progress dict saved with ``epoch`` ({} for checkpoints written without one)."""
    path = progress_path(prefix, epoch)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def last_complete_epoch(prefix):
    """The highest epoch with both params and optimizer states on disk, or 0 when none."""
    epochs = []
    for path in glob.glob(glob.escape(prefix) + "-*.params"):
        match = re.fullmatch(re.escape(prefix) + r"-(\d{4})\.params", path)
        if match and os.path.isfile(states_path(prefix, int(match.group(1)))):
            epochs.append(int(match.group(1)))
    return max(epochs, default=0)
