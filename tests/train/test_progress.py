"""Training progress: the ETAs on a fake clock, the metrics log, and tools/plot_metrics.py."""
import json
import os
import subprocess
import sys

import pytest

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.train.progress import RunProgress, format_duration, schedule_warnings

PLOT = os.path.join(ROOT, "tools", "plot_metrics.py")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_durations_read_naturally():
    assert [format_duration(s) for s in (0, 12.4, 65, 3600 + 125, -3)] == ["0s", "12s", "1m05s", "1h02m", "0s"]


def test_etas_extrapolate_this_epoch_over_the_rest_of_the_run(tmp_path):
    clock = FakeClock()
    path = str(tmp_path / "run" / "metrics.jsonl")
    progress = RunProgress(path, begin_epoch=1, end_epoch=4, num_update=40, clock=clock)
    progress.start_epoch(1, num_batches=10)
    clock.now += 5.0  # 2 batches in 5 s: 2.5 s a batch
    text = progress.record(2, lr=0.01, losses={"RPNLogLoss": 0.5}, speed=3.2)
    # 8 batches left here (20 s) and two more epochs (0-based 2 and 3) of 10 batches (25 s each)
    assert text == "ETA epoch 20s run 1m10s"
    progress.end_epoch_updates(10)
    progress.start_epoch(2, num_batches=10)
    clock.now += 1.0
    progress.record(1, lr=0.02, losses={"RPNLogLoss": 0.4}, speed=4.0)
    records = [json.loads(line) for line in open(path)]
    assert records == [
        {"iteration": 42, "epoch": 2, "batch": 2, "batches": 10, "lr": 0.01, "RPNLogLoss": 0.5, "chips_per_s": 3.2,
         "seconds": 5.0},
        {"iteration": 51, "epoch": 3, "batch": 1, "batches": 10, "lr": 0.02, "RPNLogLoss": 0.4, "chips_per_s": 4.0,
         "seconds": 6.0}]
    silent = RunProgress(None, 0, 1, 0, clock=clock)  # workers other than rank 0 write nothing
    silent.start_epoch(0, 4)
    assert silent.record(4, 0.1, {}, 1.0) == "ETA epoch 0s run 0s"


def run_plot(*argv):
    return subprocess.run([sys.executable, PLOT, *argv], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def test_plot_draws_a_png_and_counts_broken_lines(tmp_path):
    lines = [json.dumps({"iteration": i, "epoch": 1, "batch": i, "batches": 9, "lr": 0.001 * i, "RPNAcc": 0.5 + i / 20,
                         "RPNLogLoss": 1 / i, "chips_per_s": 5.0, "seconds": float(i)}) for i in range(1, 9)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines + ['{"iteration": 9, "lr"']) + "\n")
    result = run_plot(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "8 records" in result.stdout and "1 unreadable lines skipped" in result.stdout
    png = (tmp_path / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000


@pytest.mark.parametrize("content, message", [(None, "no metrics file"), ("not json\n", "holds no metrics records")])
def test_plot_of_a_missing_or_empty_log_is_one_line(tmp_path, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    result = run_plot(str(tmp_path))
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_log_lines_go_above_a_running_progress_bar():
    import io
    import logging

    from tqdm import tqdm

    from lib.logger import TqdmSafeHandler

    stream = io.StringIO()
    logger = logging.getLogger("test_progress.bar")
    handler = TqdmSafeHandler(stream)
    logger.addHandler(handler)
    try:
        with tqdm(total=2, file=stream, ncols=40, disable=False) as bar:
            bar.update(1)
            logger.warning("a log line")
        text = stream.getvalue()
        drawn, cleared, line = text.find("0/2"), text.find("\r" + " " * 40 + "\r"), text.find("a log line\n")
        assert 0 <= drawn < cleared < line  # the bar is wiped before the line is printed...
        assert "1/2" in text[line:]  # ...and drawn again below it
    finally:
        logger.removeHandler(handler)


def test_a_resumed_run_drops_the_interrupted_epochs_lines_so_none_appears_twice(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    first = RunProgress(path, begin_epoch=0, end_epoch=3, num_update=0)
    for epoch in (0, 1):  # epoch 1 complete, epoch 2 interrupted after 2 of its 5 batches
        first.start_epoch(epoch, 5)
        for batch in range(1, 6 if epoch == 0 else 3):
            first.record(batch, 0.1, {"loss": 1.0}, 10.0)
    with open(path, "a") as f:
        f.write('{"iteration": 8, "epo')  # a line cut by the kill
    resumed = RunProgress(path, begin_epoch=1, end_epoch=3, num_update=5)
    resumed.start_epoch(1, 5)
    for batch in range(1, 6):
        resumed.record(batch, 0.1, {"loss": 0.5}, 10.0)
    with open(path) as f:
        records = [json.loads(line) for line in f]
    keys = [(r["epoch"], r["batch"]) for r in records]
    assert keys == [(1, b) for b in range(1, 6)] + [(2, b) for b in range(1, 6)]  # each once, in order
    assert [r["loss"] for r in records if r["epoch"] == 2] == [0.5] * 5  # the resumed run's lines


@pytest.mark.parametrize("overrides, iters, warned", [
    ({"TRAIN.end_epoch": 2, "TRAIN.warmup_step": 100, "TRAIN.lr_step": "1.5"}, 40, True),  # 80 updates < 100
    ({"TRAIN.end_epoch": 3, "TRAIN.warmup_step": 100, "TRAIN.lr_step": ""}, 40, False),  # 120 updates
    ({"TRAIN.end_epoch": 2, "TRAIN.warmup": False, "TRAIN.warmup_step": 1000, "TRAIN.lr_step": ""}, 40, False),
])
def test_a_run_ending_inside_the_warm_up_is_warned_about_at_start(overrides, iters, warned):
    warnings = schedule_warnings(load_config(None, overrides), iters, num_update=0)
    assert len(warnings) == warned
    if warned:
        assert "after 80 updates (2 epochs of 40 batches), inside the warm-up (TRAIN.warmup_step 100)" in warnings[0]
    assert schedule_warnings(load_config(None, overrides), iters, num_update=10 ** 6) == []  # resumed past it
