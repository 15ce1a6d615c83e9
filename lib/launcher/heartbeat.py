"""Heartbeats of the processes of a distributed job, which tools/launch.py watches in their output.

ps-lite waits forever for a node that stops without closing its connections (SIGSTOP, a hung host, a
network that silently drops), so one stalled worker hangs the whole job. ps-lite's own heartbeat
(``PS_HEARTBEAT_INTERVAL`` / ``PS_HEARTBEAT_TIMEOUT``) does not help: in MXNet 1.9.1 the scheduler only
uses it to let a newly registering node replace a dead one, and tells no one. So each process of a job
started with ``SNIPER_HEARTBEAT_SECONDS`` set writes a heartbeat line to its standard output that often,
from a thread of its own (a busy or waiting main thread does not delay it; a stopped process stops it),
and the launcher, which reads that output anyway (also over ssh), stops the job when a process falls
silent for too long, naming it. Standard library only: the scheduler and servers import it before MXNet.
"""
import os
import re
import threading
import time

ENV = "SNIPER_HEARTBEAT_SECONDS"
_LINE = b"@@sniper-heartbeat pid=%d rank=%d@@\n"
# What the launcher finds (anywhere in a line: another thread may be half-way through writing one).
PATTERN = re.compile(rb"@@sniper-heartbeat pid=(\d+) rank=(-?\d+)@@\n?")

_state = {"thread": None, "rank": -1}


def set_rank(rank):
    """Name this process's rank in its heartbeats from now on (workers learn it when joining the job)."""
    _state["rank"] = int(rank)


def start_heartbeat():
    """Start beating when the launcher asked for it (``SNIPER_HEARTBEAT_SECONDS``); idempotent."""
    interval = float(os.environ.get(ENV) or 0)
    if interval <= 0 or _state["thread"] is not None:
        return
    _state["thread"] = threading.Thread(target=_beat, args=(interval,), name="heartbeat", daemon=True)
    _state["thread"].start()


def _beat(interval):
    while True:
        try:
            os.write(1, _LINE % (os.getpid(), _state["rank"]))  # one write: whole on a pipe
        except OSError:  # the launcher is gone; the process ends on its own
            return
        time.sleep(interval)
