"""A stalled worker is warned about once after a short silence (TRAIN.STALL_WARN / TEST.STALL_WARN, the
launcher's heartbeat) and the run stops only at the timeout, as before."""
import logging
import os
import signal
import time
from types import SimpleNamespace

import pytest

from lib.config import ConfigError, load_config
from lib.data.worker_pool import ProcessPool, WorkerStalledError
from lib.launcher.launch import Job
from stall_helpers import assert_each_stopped_worker_warned_once


class StoppingHandler:
    """Stops its own process (SIGSTOP) on its task, as a hung NFS read would leave it."""

    def __call__(self, task):
        os.kill(os.getpid(), signal.SIGSTOP)

    def describe(self, task):
        return f"reading image {task}"


def test_a_stopped_worker_is_warned_about_once_then_stops_the_run_at_the_timeout(caplog):
    pool = ProcessPool(StoppingHandler(), 1, name="chip-loader", timeout=4, timeout_key="TRAIN.LOADER_TIMEOUT",
                       warn_after=1)
    started = time.monotonic()
    try:
        pool.submit("/data/7.jpg")
        with caplog.at_level(logging.WARNING, logger="lib.data.worker_pool"), \
                pytest.raises(WorkerStalledError, match="TRAIN.LOADER_TIMEOUT is 4 s"):
            while time.monotonic() - started < 30:
                pool.get()
        pid = pool.pids[0]
    finally:
        pool.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "lib.data.worker_pool"]
    assert len(warnings) == 1, warnings  # once per silence, not at every check
    assert warnings[0].startswith(f"data loader worker chip-loader-0 (pid {pid}) has shown no sign of life for ")
    seconds = int(warnings[0].split("for ")[1].split(" s")[0])
    assert 1 <= seconds < 4  # warned after the short silence, before the timeout
    assert "while reading image /data/7.jpg; the process is stopped (SIGSTOP" in warnings[0]
    assert warnings[0].endswith("stopping at TRAIN.LOADER_TIMEOUT (4 s) if it stays silent")
    assert time.monotonic() - started >= 4  # the stop comes at the timeout, not at the warning


def test_stall_warn_is_a_checked_config_key():
    assert load_config(None).TRAIN.STALL_WARN == load_config(None).TEST.STALL_WARN == 60.0
    with pytest.raises(ConfigError, match="TEST.STALL_WARN = -1.0: must be a number of seconds >= 0"):
        load_config(None, [("TEST.STALL_WARN", "-1")])


def test_the_launcher_warns_once_about_a_quiet_process_before_its_heartbeat_timeout(capsys):
    running = SimpleNamespace(poll=lambda: None)
    quiet = SimpleNamespace(name="worker 1", described="worker 1 (rank 1, pid 42)", process=running,
                            heard=time.monotonic() - 30)
    talking = SimpleNamespace(name="worker 0", described="worker 0", process=running, heard=time.monotonic())
    job = Job([quiet, talking], heartbeat_timeout=300, stall_warn=20)
    job._warn_quiet_nodes()
    job._warn_quiet_nodes()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch.py: warning: worker 1 (rank 1, pid 42) has sent no "
                                                   "heartbeat for 30 s")
    assert lines[0].endswith("the job stops at --heartbeat-timeout 300 s")
    assert job._silent_node() is None  # still well within the timeout
    quiet.heard = time.monotonic()  # it beats again: a later silence is warned about again
    job._warn_quiet_nodes()
    quiet.heard = time.monotonic() - 25
    job._warn_quiet_nodes()
    assert len(capsys.readouterr().err.splitlines()) == 1
