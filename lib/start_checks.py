"""Checks that make a doomed run fail in seconds, before data loading, roidb building or proposal extraction.

Each check is a small function of the config raising a ``ConfigError`` (or ``MachineError``) that names
the key, the value and what to do. The pure ones (``CONFIG_CHECKS``: the dataset kind, a chip size no
valid box fits) run whenever a config is loaded (lib.config.validate, beside the sections' own parsing of
the lr steps and pyramids); the ones that look at the machine or the disk run at an entry point's start
(``check_training_start``, ``check_test_start``), before it writes anything: a refused start leaves
no log, lock or run folder behind.
"""
import os

from lib.config import ConfigError
from lib.errors import MachineError


def check_dataset_kind(cfg):
    from lib.dataset.roidb import DATASETS

    kind = cfg.dataset.dataset
    if kind not in DATASETS:
        raise ConfigError(f"config key dataset.dataset = {kind!r}: unknown dataset; expected one of "
                          f"{', '.join(sorted(DATASETS))}")


def check_chip_fits(cfg):
    """Some training scale must let a box of its valid range fit in a chip: a box of sqrt(area) ``lo``
    (original pixels) is ``lo * factor`` pixels at a factor scale. A scale given in pixels (a side target)
    can shrink any box to fit, so only an all-factor pyramid is checked."""
    from lib.scales import pyramid

    size = cfg.TRAIN.CHIP_SIZE
    levels = pyramid(cfg.TRAIN, "TRAIN")
    if not all(level.spec.factor > 0 for level in levels):
        return
    smallest = [max(level.valid_range[0], 0) * level.spec.factor for level in levels]
    if min(smallest) > size:
        raise ConfigError(f"config key TRAIN.CHIP_SIZE = {size}: no valid box fits in a chip at any training scale "
                          f"(the smallest valid boxes are {', '.join(f'{s:g}' for s in smallest)} pixels at "
                          f"TRAIN.SCALES {list(cfg.TRAIN.SCALES)}): raise CHIP_SIZE or lower TRAIN.VALID_RANGES")


# Run by lib.config.validate on every loaded config (beside its sections' own parsing: lr steps, pyramids).
CONFIG_CHECKS = (check_dataset_kind, check_chip_fits)


def check_output_path(cfg):
    """``output_path`` must be a folder, or creatable as one (no file on its way)."""
    path = os.path.abspath(cfg.output_path)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"config key output_path = {cfg.output_path!r}: {existing} is a file, not a folder; "
                          f"give a folder for the run folders")
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"config key output_path = {cfg.output_path!r}: {existing} is not writable")


def check_devices(cfg):
    """The contexts of ``gpus`` exist on this machine (a GPU id without a GPU: one line, nothing written)."""
    from lib.contexts import parse_contexts

    try:
        parse_contexts(cfg.gpus)
    except ValueError as err:
        raise MachineError(str(err)) from None


def check_run_folder(cfg, resume, overwrite):
    """Before the log file is made: a run folder held by another run, or holding later epochs that a
    fresh start would overwrite, is refused as the trainer would refuse it (the trainer checks again
    under its lock: this check only makes the refusal leave nothing behind)."""
    from lib.run.checkpoint import checkpoint_prefix, output_dir
    from lib.run.lock import clear_later_epochs, run_lock

    folder = output_dir(cfg)
    if not os.path.isdir(folder):
        return
    with run_lock(folder):  # RunFolderError when another run holds it
        pass
    if not (resume or cfg.TRAIN.resume or overwrite):
        clear_later_epochs(checkpoint_prefix(cfg), cfg.TRAIN.begin_epoch, overwrite=False)


def check_training_start(cfg, resume=False, overwrite=False):
    check_output_path(cfg)
    check_devices(cfg)
    check_run_folder(cfg, resume, overwrite)


def check_test_start(cfg):
    check_output_path(cfg)
    check_devices(cfg)
