"""TensorBoard event files of a training run, beside metrics.jsonl (TRAIN.TENSORBOARD).

Written through tensorboardX (PyPI ``tensorboardX``): a maintained writer of TensorBoard's event format that
needs neither TensorFlow nor PyTorch, only protobuf; MXNet's own MXBoard has not been released since 2018.
It is optional: without it (it is pinned for Python >= 3.10) one log line says so and training goes on.
Scalars: ``loss/{metric}`` and ``lr``, ``speed/chips_per_s`` at every periodic log line, ``eval/{stat}``
after each evaluation while training, all against the update count; files in ``{run folder}/tensorboard/``
(``tensorboard --logdir output``).
"""
import logging

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
            logger.info("TensorBoard event files are off: tensorboardX is not installed (pip install tensorboardX, "
                        "pinned in requirements.txt for Python >= 3.10)")
            return
        self.writer = SummaryWriter(folder, flush_secs=FLUSH_SECONDS)
        logger.info("TensorBoard event files in %s", folder)

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
