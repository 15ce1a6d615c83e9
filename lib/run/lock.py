"""A training run's hold on its folder: one run at a time, and no silent overwrite of an earlier run.

Two runs writing into one folder would interleave their checkpoints and metrics, and a run started
from scratch over an earlier one would overwrite its first epochs and keep its later ones, so that a
later ``--resume`` continued the old run. So a run holds an exclusive lock on its folder for its whole
life (``fcntl.flock``: released by the kernel however the process ends, even by kill -9), and a start
that would write over existing epochs is refused unless asked to start over (``--overwrite``), which
first moves those epochs' files aside.
"""
import contextlib
import fcntl
import glob
import logging
import os
import time

from lib.errors import UserError
from lib.paths import shown_path

logger = logging.getLogger(__name__)

LOCK_NAME = "train.lock"
METRICS_NAME = "metrics.jsonl"
RESULTS_FOLDER = "results"  # tests of the run's checkpoints: results/{image set}/ (lib.inference.tester)
EVALUATIONS_FOLDER = "evaluations"  # evaluations while training: evaluations/epoch_NNNN/ (lib.train.evaluation)


class RunFolderError(UserError, RuntimeError):
    """The run folder is in use by another run, or holds epochs a fresh start would overwrite."""


@contextlib.contextmanager
def run_lock(folder):
    """Hold ``folder`` (created if needed) for the ``with`` block; RunFolderError naming the folder and
    the holder's pid when another process holds it. Forked data loader workers share the lock; it is
    released explicitly at the end of the block."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunFolderError(f"run folder {folder} is in use by another training run (pid {holder}, lock file "
                                 f"{path}): wait for it to end, or set another output_path") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def epoch_files(prefix):
    """``{epoch: [paths]}``: every ``{prefix}-NNNN.*`` file (params, optimizer states, progress, and any
    other companion of an epoch)."""
    found = {}
    for path in sorted(glob.glob(glob.escape(prefix) + "-[0-9][0-9][0-9][0-9].*")):
        found.setdefault(int(path[len(prefix) + 1:len(prefix) + 5]), []).append(path)
    return found


def clear_later_epochs(prefix, begin_epoch, overwrite):
    """Before a run that starts at ``begin_epoch`` without resuming: refuse (RunFolderError) when
    ``prefix`` has files of later epochs, which it would overwrite, or with ``overwrite`` move them into
    ``replaced_{time}/`` beside them, with what describes them: the evaluations of those epochs
    (``evaluations/epoch_NNNN/``), the tests' ``results/`` (of the checkpoints being replaced, or of ones
    that will be) and, for a start from scratch, the folder's metrics log. Returns that folder, or None when
    nothing was in the way."""
    later = {epoch: paths for epoch, paths in epoch_files(prefix).items() if epoch > begin_epoch}
    if not later:
        return None
    folder = os.path.dirname(os.path.abspath(prefix))
    name = os.path.basename(prefix)
    if not overwrite:
        raise RunFolderError(
            f"{folder} already holds epochs {', '.join(map(str, sorted(later)))} of {name} (e.g. {later[max(later)][0]}); "
            f"starting at epoch {begin_epoch + 1} would overwrite them: pass --resume to continue that run, or "
            f"--overwrite to move them to {os.path.join(folder, 'replaced_<time>')} and start over")
    moved = os.path.join(folder, f"replaced_{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(moved, exist_ok=True)
    paths = [path for epoch in sorted(later) for path in later[epoch]]
    metrics = os.path.join(folder, METRICS_NAME)
    if begin_epoch == 0 and os.path.isfile(metrics):
        paths.append(metrics)
    for path in paths:
        os.replace(path, os.path.join(moved, os.path.basename(path)))
    folders = [os.path.join(EVALUATIONS_FOLDER, f"epoch_{epoch:04d}") for epoch in sorted(later)] + [RESULTS_FOLDER]
    folders = [path for path in folders if os.path.isdir(os.path.join(folder, path))]
    for path in folders:
        os.makedirs(os.path.dirname(os.path.join(moved, path)), exist_ok=True)
        os.replace(os.path.join(folder, path), os.path.join(moved, path))
    evaluations = os.path.join(folder, EVALUATIONS_FOLDER)
    if os.path.isdir(evaluations) and not os.listdir(evaluations):
        os.rmdir(evaluations)
    also = f" and {', '.join(path + '/' for path in folders)}" if folders else ""
    logger.warning("--overwrite: moved %d files of epochs %s of %s%s to %s", len(paths),
                   ", ".join(map(str, sorted(later))), name, also, shown_path(moved))
    return moved
