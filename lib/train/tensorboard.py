"""TensorBoard event files of a training run, beside metrics.jsonl (TRAIN.TENSORBOARD).

Written through tensorboardX (PyPI ``tensorboardX``): a maintained writer of TensorBoard's event format that
needs neither TensorFlow nor PyTorch, only protobuf; MXNet's own MXBoard has not been released since 2018.
It is optional: without it (it is pinned for Python >= 3.10) one log line says so, with the command that
installs it into the Python training runs in, and training goes on. The viewer (PyPI ``tensorboard``) is not
part of the project's environment: the log line that names the event folder says how to get it when it is
not on the PATH.
Scalars: ``loss/{metric}`` and ``lr``, ``speed/chips_per_s`` at every periodic log line, ``eval/{stat}``
after each evaluation while training, all against the update count; files in ``{run folder}/tensorboard/``
(``tensorboard --logdir output``).
"""
import logging
import os
import shutil
import sys

from lib.bootstrap import ROOT
from lib.paths import shown_path

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 10


class TensorBoardLog:
    """``scalars(step, {tag: value})``; a no-op when disabled or without tensorboardX. ``close()`` flushes."""

    def __init__(self, folder, enabled=True):
        self.writer = None
        if not enabled:
            return
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            logger.info("TensorBoard event files are off: tensorboardX is not installed in %s (the Python training "
                        "runs in); to have them: %s -m pip install -c %s tensorboardX", shown_path(sys.prefix),
                        shown_path(sys.executable), shown_path(os.path.join(ROOT, "constraints.txt")))
            return
        self.writer = SummaryWriter(folder, flush_secs=FLUSH_SECONDS)
        logger.info("TensorBoard event files in %s: %s", shown_path(folder), viewer_hint(os.path.dirname(folder)))

    def scalars(self, step, values):
        if self.writer is None:
            return
        for tag, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, step)

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def viewer_hint(run_folder):
    """How to look at the event files of ``run_folder`` (and its neighbours): the viewer's command, and where
    to install it from when it is not on the PATH."""
    command = f"tensorboard --logdir {shown_path(os.path.dirname(os.path.abspath(run_folder)))}"
    if shutil.which("tensorboard"):
        return f"view them with {command}"
    return (f"view them with {command} after installing the viewer, which the project's environment does not "
            f"hold, into any Python 3 (python3 -m pip install tensorboard)")
