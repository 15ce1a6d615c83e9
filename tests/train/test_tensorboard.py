"""TensorBoard event logs (lib.train.tensorboard): the progress records against the update count, the
scalars in the event files, nothing written (and nothing broken) without tensorboardX, and the viewer line."""
import json
import logging
import os
import shutil
import sys

import pytest

from lib.bootstrap import ROOT
from lib.paths import shown_path
from lib.train.progress import RunProgress
from lib.train.tensorboard import TensorBoardLog
from tensorboard_helpers import RecordedEvents, read_event_scalars


def test_progress_records_go_to_the_event_log_against_the_update_count(tmp_path):
    events = RecordedEvents()
    progress = RunProgress(str(tmp_path / "metrics.jsonl"), 0, 2, 100, events=events)
    progress.start_epoch(0, 10)
    progress.record(4, 0.01, {"RPNLogLoss": 0.5}, 12.0)
    progress.end_epoch_updates(10)
    progress.record_evaluation({"AP": 0.3, "AP50": 0.6, "APs": -1.0})  # -1: undefined, not drawn
    assert events.calls == [(104, {"lr": 0.01, "speed/chips_per_s": 12.0, "loss/RPNLogLoss": 0.5}),
                            (110, {"eval/AP": 0.3, "eval/AP50": 0.6})]
    assert json.loads(open(tmp_path / "metrics.jsonl").read().splitlines()[-1])["eval"]["APs"] == -1.0


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    log = TensorBoardLog(str(tmp_path / "tb"))
    log.scalars(3, {"loss/RPNLogLoss": 0.25, "lr": 0.5, "skipped": "text"})
    log.scalars(7, {"eval/AP": 0.125})
    log.close()
    assert read_event_scalars(str(tmp_path / "tb")) == [("loss/RPNLogLoss", 3, 0.25), ("lr", 3, 0.5),
                                                        ("eval/AP", 7, 0.125)]


def test_without_tensorboardx_nothing_is_written_and_nothing_breaks(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX raises ImportError
    with caplog.at_level(logging.INFO):
        log = TensorBoardLog(str(tmp_path / "tb"))
    # what to install, with which command, into which environment
    assert f"tensorboardX is not installed in {shown_path(sys.prefix)} (the Python training runs in)" in caplog.text
    assert f"{shown_path(sys.executable)} -m pip install -c {shown_path(os.path.join(ROOT, 'constraints.txt'))} " \
           f"tensorboardX" in caplog.text
    log.scalars(1, {"lr": 0.1})
    log.close()
    assert not os.path.exists(tmp_path / "tb")
    assert TensorBoardLog(str(tmp_path / "off"), enabled=False).writer is None


def test_the_event_folder_line_says_how_to_view_it_and_where_to_get_the_viewer(tmp_path, monkeypatch, caplog):
    pytest.importorskip("tensorboardX")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no viewer on the PATH
    with caplog.at_level(logging.INFO):
        TensorBoardLog(str(tmp_path / "out" / "run" / "tensorboard")).close()
    assert (f"TensorBoard event files in {os.path.join('out', 'run', 'tensorboard')}: view them with tensorboard "
            f"--logdir out after installing the viewer") in caplog.text
    assert "python3 -m pip install tensorboard" in caplog.text
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        TensorBoardLog(str(tmp_path / "out" / "run" / "tensorboard")).close()
    assert caplog.text.rstrip().endswith(": view them with tensorboard --logdir out")
