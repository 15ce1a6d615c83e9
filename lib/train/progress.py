"""How far a training run is: the ETA of the epoch and of the run, and the machine-readable metrics log.

Every periodic log line of the trainer is also appended to ``{output_dir}/metrics.jsonl`` as one JSON
object (iteration, epoch, batch, lr, every loss, chips/s, seconds since the run started), so curves can be
drawn (tools/plot_metrics.py) or compared without parsing logs. A resumed run appends to the same file,
after dropping the lines of the epochs it trains again (those of an interrupted epoch), so every epoch's
lines appear once.
"""
import json
import logging
import math
import os
import time

from lib.atomic import write_bytes
from lib.evaluation.coco_summary import defined

logger = logging.getLogger(__name__)


def format_duration(seconds):
    """``1h02m`` / ``4m05s`` / ``12s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def record_every(frequent, num_batches):
    """Batches between two log lines (and metrics records): ``default.frequent``, but at least 4 records
    an epoch, so that a short epoch still draws a curve rather than one point."""
    return max(1, min(frequent, num_batches // 4))


class RunProgress:
    """Progress of the epochs ``begin_epoch + 1 .. end_epoch`` of a run; ``path`` (or None) is the
    metrics log. Call ``start_epoch`` before an epoch and ``record`` at each periodic log line."""

    def __init__(self, path, begin_epoch, end_epoch, num_update, clock=time.monotonic, events=None):
        self.path, self.end_epoch, self.clock = path, end_epoch, clock
        self.events = events  # lib.train.tensorboard.TensorBoardLog or None: the same records as scalars
        self.begin_epoch, self.num_update = begin_epoch, num_update
        self.run_start = clock()
        self.epoch = self.epoch_start = self.num_batches = None
        self.seconds_per_batch = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            _drop_epochs_after(path, begin_epoch)

    def start_epoch(self, epoch, num_batches):
        """``epoch`` is 0-based; its updates start at ``self.num_update``."""
        self.epoch, self.num_batches, self.epoch_start = epoch, num_batches, self.clock()

    def end_epoch_updates(self, updates):
        self.num_update += updates

    def etas(self, batches_done):
        """(seconds left in this epoch, seconds left in the run) at the speed of this epoch so far."""
        elapsed = self.clock() - self.epoch_start
        per_batch = elapsed / max(batches_done, 1)
        epoch_left = per_batch * (self.num_batches - batches_done)
        later_epochs = self.end_epoch - self.epoch - 1
        return epoch_left, epoch_left + later_epochs * per_batch * self.num_batches

    def record_evaluation(self, stats):
        """Append the evaluation after this epoch (``{"eval": stats}`` with its iteration and epoch; COCO's -1
        kept there as COCO writes it); TensorBoard gets the defined values only (no -1 drawn as a point)."""
        if self.path:
            record = {"iteration": self.num_update, "epoch": self.epoch + 1, "eval": stats,
                      "seconds": round(self.clock() - self.run_start, 3)}
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.events is not None:
            self.events.scalars(self.num_update, {f"eval/{name}": value for name, value in stats.items()
                                                  if defined(value)})

    def record(self, batches_done, lr, losses, speed, updates_done=None):
        """Append one metrics record; return the "ETA epoch .. run .." text for the log line. Its iteration
        counts optimizer updates (``updates_done`` of this epoch; default: one per batch)."""
        epoch_left, run_left = self.etas(batches_done)
        iteration = self.num_update + (batches_done if updates_done is None else updates_done)
        if self.path:
            record = {"iteration": iteration, "epoch": self.epoch + 1, "batch": batches_done,
                      "batches": self.num_batches, "lr": lr, **losses, "chips_per_s": speed,
                      "seconds": round(self.clock() - self.run_start, 3)}
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.events is not None:
            self.events.scalars(iteration, {"lr": lr, "speed/chips_per_s": speed,
                                            **{f"loss/{k}": v for k, v in losses.items()}})
        return f"ETA epoch {format_duration(epoch_left)} run {format_duration(run_left)}"


def _drop_epochs_after(path, epoch):
    """Remove the records of epochs after ``epoch`` (1-based in the file) from the metrics log."""
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    kept = [line for line in lines if _record_epoch(line) <= epoch]
    if len(kept) < len(lines):
        write_bytes(b"".join(kept), path)
        logger.info("%s: dropped %d lines of epochs after %d (trained again now)", path, len(lines) - len(kept), epoch)


def _record_epoch(line):
    try:
        return int(json.loads(line)["epoch"])
    except (ValueError, KeyError, TypeError):  # a line cut by a kill: dropped with the interrupted epoch
        return float("inf")


def schedule_warnings(cfg, iters_per_epoch, num_update):
    """What makes a short run end in a useless model, said at its start: it ends inside the warm-up
    (``num_update``: the updates done before this run's first epoch; an lr step after the run's end is
    refused at load, lib.config.validation.lr_step_epochs)."""
    train = cfg.TRAIN
    total = train.end_epoch * iters_per_epoch
    if not train.warmup or train.warmup_step < total or num_update >= total:
        return []
    return [f"the run ends after {total} updates ({train.end_epoch} epochs of {iters_per_epoch} batches), inside "
            f"the warm-up (TRAIN.warmup_step {train.warmup_step}): the learning rate never reaches TRAIN.lr, so "
            f"expect a model that detects little; train more epochs (docs/datasets.md#how-many-epochs) or lower "
            f"TRAIN.warmup_step"]


SCHEDULE_WARMUPS = 4  # the least schedule recommended: the warm-up, then three times as long at TRAIN.lr
LR_STEP_SHARE = 5.33 / 7  # where the published schedule steps the rate (TRAIN.lr_step 5.33 of 7 epochs)


def recommended_schedule(cfg, iters_per_epoch):
    """``(updates, end_epoch, lr_step)``: the least schedule recommended for a set of ``iters_per_epoch``
    updates an epoch, ``SCHEDULE_WARMUPS`` x TRAIN.warmup_step updates (at least 2 epochs) with the lr step at
    ``LR_STEP_SHARE`` of them. Counted in updates, so it holds whatever a scale fit does to the chips an epoch
    (docs/datasets.md#how-many-epochs)."""
    updates = SCHEDULE_WARMUPS * cfg.TRAIN.warmup_step
    epochs = max(2, math.ceil(updates / max(iters_per_epoch, 1)))
    return updates, epochs, round(epochs * LR_STEP_SHARE, 2)
