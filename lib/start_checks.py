"""Checks that make a doomed run fail in seconds, before data loading, roidb building or proposal extraction.

Each check is a small function of the config raising a ``ConfigError`` (or ``MachineError``, or a data
error naming the file) that names the key, the value and what to do. They look at the machine or the disk and
run at an entry point's start (``check_training_start``, ``check_test_start``), before it writes anything: a
refused start leaves no log, lock or run folder behind. A training start also reads what is cheap to read of
its data (the class list, the proposal file's index), so a contradiction stops it before the roidb is built.
What a config alone decides is checked when it is loaded (lib.config.validation.validate).
"""
import os

from lib.errors import ConfigError, MachineError


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


def check_devices(cfg, fp16_sections=()):
    """The contexts of ``gpus`` exist on this machine and can run the float16 networks of ``fp16_sections``
    ("TRAIN", "TEST"). A config for GPUs on a machine without one names every key to change in one line (gpus
    and each fp16 that the CPU contexts it falls back to cannot run), not one per restart."""
    import mxnet as mx
    from lib.contexts import NO_CPU_FP16, MissingGPUError, parse_contexts

    problems, fixes = [], []
    try:
        on_cpu = any(ctx.device_type == "cpu" for ctx in parse_contexts(cfg.gpus))
    except MissingGPUError:
        if mx.context.num_gpus():  # GPUs, other ids: the float16 networks run once gpus names them
            raise
        problems.append(f"gpus {cfg.gpus!r} (this MXNet sees no GPU)")
        fixes.append("gpus ''")
        on_cpu = True
    except ValueError as err:
        raise ConfigError(str(err)) from None
    fp16 = [section for section in fp16_sections if on_cpu and cfg[section].fp16]
    if fp16:
        problems.append(f"{', '.join(f'{section}.fp16 true' for section in fp16)} ({NO_CPU_FP16})")
        fixes += [f"{section}.fp16 false" for section in fp16]
    if problems:
        raise MachineError(f"this machine cannot run {', '.join(problems)}: change {'them' if len(fixes) > 1 else 'it'}"
                           f" with --set {' '.join(fixes)} (or run on a machine with GPUs)")


def check_run_folder(cfg, resume, overwrite):
    """Before the log file is made: a run folder held by another run, holding later epochs that a fresh
    start would overwrite, or whose checkpoints a resume would continue with other settings
    (lib.run.folder.check_run_record), is refused as the trainer would refuse it (the trainer checks again
    under its lock: this check only makes the refusal leave nothing behind)."""
    from lib.run.checkpoint import checkpoint_prefix, output_dir
    from lib.run.folder import check_run_record
    from lib.run.lock import clear_later_epochs, run_lock

    folder = output_dir(cfg)
    if not os.path.isdir(folder):
        return
    with run_lock(folder):  # RunFolderError when another run holds it
        pass
    if not (resume or cfg.TRAIN.resume or overwrite):
        clear_later_epochs(checkpoint_prefix(cfg), cfg.TRAIN.begin_epoch, overwrite=False)
    if resume or cfg.TRAIN.resume or cfg.TRAIN.begin_epoch > 0:
        check_run_record(cfg)  # continued checkpoints were trained with these settings


def check_class_count(cfg, image_set=None):
    """A ``dataset.NUM_CLASSES`` that contradicts the class list of ``image_set`` (default: the training set;
    for COCO its annotation file's categories, found by a scan: lib.dataset.coco.read_categories), before the
    roidb is built."""
    from lib.dataset.roidb import DATASETS, check_num_classes

    if cfg.dataset.NUM_CLASSES:
        kind, image_set = cfg.dataset.dataset, image_set or cfg.dataset.image_set
        check_num_classes(cfg, DATASETS[kind].class_count(cfg, image_set),
                          f"{kind} image set {image_set!r} in {os.path.abspath(cfg.dataset.dataset_path)}")


def check_proposals(cfg):
    """With negative chips on, the proposal file is there and is a proposal .npz (its index read, not its
    boxes), before the roidb is built."""
    from lib.dataset.proposals import check_proposal_file
    from chip_generator.mining import neg_chip_proposals

    path = neg_chip_proposals(cfg)
    if path:
        check_proposal_file(path)


def check_training_start(cfg, resume=False, overwrite=False, evaluates=False):
    """A training start; ``evaluates``: it also tests (``--eval``), so TEST.fp16 must fit the contexts too
    (TRAIN.EVAL_EVERY makes it test anyway)."""
    check_output_path(cfg)
    check_devices(cfg, ("TRAIN", "TEST") if evaluates or cfg.TRAIN.EVAL_EVERY else ("TRAIN",))
    check_run_folder(cfg, resume, overwrite)
    check_class_count(cfg)
    check_proposals(cfg)


def check_test_start(cfg, image_set=None):
    """A test's start; ``image_set``: the dataset image set it reads (none for a folder of images), whose
    class count must be the network's."""
    check_output_path(cfg)
    check_devices(cfg, ("TEST",))
    if image_set:
        check_class_count(cfg, image_set)
