"""Atomic checkpoints in MXNet's ``prefix-symbol.json`` / ``prefix-%04d.params`` layout.

A run's files live in ``output_dir(cfg)`` = ``{output_path}/{name}`` and its checkpoints under
``checkpoint_prefix(cfg)`` = ``{output_dir}/{TRAIN.model_prefix}``.

A checkpoint's ``.params`` is what the test network loads: the class-agnostic box regressor is stored
de-normalised (multiplied back by the target stds, spec section 7). Multiplying and dividing by the
stds in float32 is not exact, and a resumed run must continue bit for bit, so the training values of
the regressor are also kept, under ``train:`` keys that MXNet's own loaders ignore. The optimizer
state goes beside it as ``prefix-%04d.states`` (pickle-free: lib.run.optimizer_states), and
``prefix-%04d.progress.json`` holds the iteration counts a resume needs and, under ``model``, what
inference needs without the config or dataset (lib.run.folder: class names, network, test scales, pixel
means); an epoch counts as complete only when both files exist, and each is written to a temporary name
and renamed (``lib.atomic``), so a run killed mid-write never leaves a checkpoint that looks complete. A
file damaged afterwards (a truncated copy, a bad disk) is found by ``last_readable_epoch``, which resume
uses.
"""
import errno
import glob
import json
import logging
import os
import re
import shutil

import numpy as np

from lib.atomic import atomic_path, write_json
from lib.errors import UserError, reason
from lib.paths import shown_path

logger = logging.getLogger(__name__)

BBOX_PRED_WEIGHT = "bbox_pred_weight"
BBOX_PRED_BIAS = "bbox_pred_bias"
TRAIN_KIND = "train"  # key prefix of the regressor's exact training values
REFERENCE_TEST_SUFFIX = "_test"  # the reference's checkpoints: arg:NAME_test is the test-ready value of arg:NAME


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not fit the network asked of it."""


def output_dir(cfg):
    """``{output_path}/{name}``: the run's checkpoints, logs and results."""
    return os.path.join(cfg.output_path, cfg.name)


def checkpoint_prefix(cfg):
    """``{output_path}/{name}/{TRAIN.model_prefix}``: the prefix of the run's checkpoint files."""
    return os.path.join(output_dir(cfg), cfg.TRAIN.model_prefix)


def params_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.params"


def checkpoint_file(cfg):
    """The checkpoint a test of ``cfg`` loads: ``TEST.MODEL`` when set, else epoch ``TEST.TEST_EPOCH`` of the
    training run of ``cfg``."""
    if cfg.TEST.MODEL:
        return cfg.TEST.MODEL
    return params_path(checkpoint_prefix(cfg), cfg.TEST.TEST_EPOCH)


def states_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.states"


def progress_path(prefix, epoch):
    return f"{prefix}-{epoch:04d}.progress.json"


def _scale_regressor(arg_params, stds, means, forward):
    """De-normalise (forward=True) or normalise the box regressor in a copy of ``arg_params``."""
    import mxnet as mx  # here, not at the top: reading run folders (the ONNX back end) needs no MXNet

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


def save_ndarrays(path, arrays):
    """``mx.nd.save(path, arrays)`` atomically. A full disk is an OSError naming the file and the bytes
    its arrays need (checked first; MXNet's own error on a failed write does not say why)."""
    import mxnet as mx  # here, not at the top: reading run folders (the ONNX back end) needs no MXNet

    size = sum(value.size * np.dtype(value.dtype).itemsize for value in arrays.values())
    with atomic_path(path, size=size) as tmp:
        try:
            mx.nd.save(tmp, arrays)
        except mx.base.MXNetError as err:
            written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            if shutil.disk_usage(os.path.dirname(tmp)).free >= size - written:
                raise
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from err


def save_checkpoint(prefix, epoch, symbol, arg_params, aux_params, stds, means, states=None, progress=None):
    """Write symbol, test-ready params, optimizer ``states`` (the arrays of
    ``lib.run.optimizer_states.state_arrays``) and the training ``progress`` dict (iteration counts a
    resumed run needs to keep the same schedule)."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    if symbol is not None:
        with atomic_path(f"{prefix}-symbol.json") as tmp:
            symbol.save(tmp)
    test_args = _scale_regressor(arg_params, stds, means, forward=True)
    blob = {f"arg:{k}": v for k, v in test_args.items()}
    blob.update({f"aux:{k}": v for k, v in aux_params.items()})
    blob.update({f"{TRAIN_KIND}:{k}": arg_params[k] for k in (BBOX_PRED_WEIGHT, BBOX_PRED_BIAS) if k in arg_params})
    if states is not None:
        save_ndarrays(states_path(prefix, epoch), states)
    if progress is not None:
        write_json(progress, progress_path(prefix, epoch))
    # params last: its presence marks the epoch complete
    save_ndarrays(params_path(prefix, epoch), blob)
    logger.info("saved checkpoint %s", shown_path(params_path(prefix, epoch)))


def prune_checkpoints(prefix, keep, also=()):
    """Delete the epoch files (params first, so a half-deleted epoch is never taken as complete) of every
    epoch but the newest ``keep`` and those in ``also``; ``keep`` 0 keeps everything. Returns the epochs
    removed."""
    if keep <= 0:
        return []
    epochs = params_epochs(prefix)
    removed = [epoch for epoch in epochs[:-keep] if epoch not in set(also)]
    for epoch in removed:
        for path in (params_path(prefix, epoch), states_path(prefix, epoch), progress_path(prefix, epoch)):
            if os.path.exists(path):
                os.remove(path)
    if removed:
        logger.info("TRAIN.KEEP_CHECKPOINTS %d: removed the checkpoints of epochs %s", keep,
                    ", ".join(map(str, removed)))
    return removed


def load_params(path, with_training_values=False, plain_names=True):
    """Load ``arg:``/``aux:`` dicts from a ``.params`` file, with a clear error for a bad file.

    ``with_training_values`` also returns the dict of exact training values saved under ``train:``.
    Keys without a kind (e.g. Gluon ``save_parameters``) count as arguments, or are an error naming the
    key when ``plain_names`` is false. A checkpoint of the reference, whose training callback saves the
    test-ready box regressor as ``arg:bbox_pred_weight_test`` beside the training ``arg:bbox_pred_weight``
    (its ``load_param(process=True)`` swaps them), reads as this project's: the ``_test`` value under
    ``arg:``, the training one under ``train:``.
    """
    import mxnet as mx  # here, not at the top: reading run folders (the ONNX back end) needs no MXNet

    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}{_what_exists(path)}")
    try:
        blob = mx.nd.load(path)
    except mx.base.MXNetError as err:
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated or not an MXNet .params file): "
                              f"{reason(err)}") from None
    if not isinstance(blob, dict):
        raise CheckpointError(f"checkpoint {path} holds a list, not named parameters")
    arg_params, aux_params, training_values = {}, {}, {}
    for key in [k for k in blob if k.startswith("arg:") and k.endswith(REFERENCE_TEST_SUFFIX)]:
        name = key[len("arg:"):-len(REFERENCE_TEST_SUFFIX)]
        if f"arg:{name}" in blob:
            blob[f"{TRAIN_KIND}:{name}"] = blob.pop(f"arg:{name}")
        blob[f"arg:{name}"] = blob.pop(key)
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


def _what_exists(path):
    """For a missing ``PREFIX-NNNN.params``: the epochs of PREFIX that exist, and how to pick one."""
    match = re.fullmatch(r"(.+)-\d{4}\.params", path)
    epochs = params_epochs(match.group(1)) if match else []
    if not epochs:
        return "; no checkpoint of that run exists (trained yet? another output_path or name?)"
    folder = os.path.dirname(path) or "."
    return (f"; the run has epochs {', '.join(map(str, epochs))}: --set TEST.TEST_EPOCH {epochs[-1]}, or "
            f"--model {folder} (its newest checkpoint)")


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
        progress = json.load(f)
    if not isinstance(progress, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(progress).__name__}")
    return progress


def params_epochs(prefix):
    """The epochs with a ``{prefix}-NNNN.params`` on disk, in increasing order."""
    epochs = []
    for path in glob.glob(glob.escape(prefix) + "-*.params"):
        match = re.fullmatch(re.escape(prefix) + r"-(\d{4})\.params", path)
        if match:
            epochs.append(int(match.group(1)))
    return sorted(epochs)


def complete_epochs(prefix):
    """The epochs with both params and optimizer states on disk, in increasing order."""
    return [epoch for epoch in params_epochs(prefix) if os.path.isfile(states_path(prefix, epoch))]


def last_complete_epoch(prefix):
    """The highest epoch with both params and optimizer states on disk, or 0 when none."""
    return max(complete_epochs(prefix), default=0)


def last_readable_epoch(prefix):
    """The highest complete epoch whose params, optimizer states and progress all read back, or 0 when
    there is no complete epoch. Damaged later epochs are skipped with one warning naming their files
    (they are left on disk: training overwrites them when it reaches them again). Every complete
    epoch damaged is an error: silently starting over would discard them."""
    damaged = []
    for epoch in reversed(complete_epochs(prefix)):
        problems = _unreadable_files(prefix, epoch)
        if not problems:
            if damaged:
                logger.warning("resuming from epoch %d, the newest readable checkpoint: skipped damaged %s",
                               epoch, "; ".join(damaged))
            return epoch
        damaged.extend(problems)
    if damaged:
        raise CheckpointError(f"no readable checkpoint of {prefix} to resume from: {'; '.join(damaged)}; start "
                              f"over with --overwrite")
    return 0


def _unreadable_files(prefix, epoch):
    """``'path (reason)'`` for each file of ``epoch`` that cannot be read back."""
    from lib.run.optimizer_states import read_optimizer_states  # imports MXNet

    problems = []
    for path, read in ((params_path(prefix, epoch), load_params), (states_path(prefix, epoch), read_optimizer_states),
                       (progress_path(prefix, epoch), lambda _: load_progress(prefix, epoch))):
        try:
            read(path)
        except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
            problems.append(f"{path} ({reason(err)})")
    return problems
