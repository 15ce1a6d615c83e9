"""Worker processes for the data loader, and an in-process stand-in with the same interface.

Why not multiprocessing.Pool: a Pool silently replaces a worker that dies (the task is lost and the
caller waits forever) and pickles whole results. Here a dead worker is noticed and reported by
``get``, results are small messages (the arrays go through a BatchRing), and ``close`` always reaps
every process. Workers are forked so they share the roidb and the ring with the parent; they ignore
Ctrl-C (the parent handles it and closes the pool) and exit on their own if the parent disappears.

A worker that stops without dying (SIGSTOP, a deadlock, an NFS stall) would hang the caller forever:
each worker stamps a shared clock when it takes a task and, while idle, every second or so; one that has
shown no sign of life for ``timeout`` seconds is reported by ``get`` with its pid, what it was doing and
its process state, and ``close`` kills it. Long before that (``warn_after`` seconds, TRAIN.STALL_WARN), one
warning with the same facts says that it has gone quiet, once per silence.
"""
import logging
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections import deque
from multiprocessing.sharedctypes import RawArray

from lib.errors import MachineError

logger = logging.getLogger(__name__)

# How often the main process checks that its workers are alive (an idle worker checks its parent
# every 5 times that), in seconds.
_POLL_SECONDS = 0.2
_JOIN_SECONDS = 3.0


class WorkerDiedError(MachineError):
    """A worker process ended without being asked to (killed, out of memory, crashed)."""


class WorkerError(RuntimeError):
    """A task raised an unexpected exception inside a worker; the message has its traceback."""


class WorkerStalledError(MachineError):
    """A worker showed no sign of life for longer than the pool's timeout (stopped, deadlocked, stalled I/O)."""


_STATES = {"T": "stopped (SIGSTOP or Ctrl-Z?)", "t": "stopped by a debugger", "D": "waiting on I/O (a stalled disk or "
           "network filesystem?)", "Z": "a zombie", "R": "running", "S": "sleeping"}


def _process_state(pid):
    """The kernel's word for what a process is doing (Linux /proc), or '' when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return f"; the process is {_STATES.get(state, 'in state ' + state)}"


def _worker_loop(handler, initializer, tasks, results, parent_pid, clock, index):
    """``clock[2 * index]``: when this worker last showed a sign of life; ``clock[2 * index + 1]``: the
    serial number of the task it runs (-1: none)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer()
    while True:
        clock[2 * index + 1], clock[2 * index] = -1, time.monotonic()
        try:
            item = tasks.get(timeout=_POLL_SECONDS * 5)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return
            continue
        if item is None:
            return
        serial, task = item
        clock[2 * index], clock[2 * index + 1] = time.monotonic(), serial
        try:
            message = handler(task)
        except Exception:  # reported to the parent, which raises it with the worker's traceback
            message = ("error", traceback.format_exc())
        results.put((serial, message))


class ProcessPool:
    """``num_workers`` forked processes running ``handler(task) -> message`` (tasks and messages are small).

    ``initializer()`` runs once in each worker before its first task. Tasks go to whichever worker is
    free, or with ``routed`` to one queue per worker: a task submitted with a ``key`` then always runs
    in worker ``key % num_workers`` (so a worker's cache sees every task of that key), the others in
    turn. A worker silent for more than ``timeout`` seconds (0: no limit; ``timeout_key`` is the config
    key that set it, for the message) is a WorkerStalledError, and one silent for ``warn_after`` seconds
    (0: no warning) is warned about once; ``handler.describe(task)``, when the handler has it, says what
    it was doing.
    """

    def __init__(self, handler, num_workers, initializer=None, name="data-worker", timeout=0, timeout_key="timeout",
                 routed=False, warn_after=0):
        context = multiprocessing.get_context("fork")
        self._queues = [context.Queue() for _ in range(num_workers if routed else 1)]
        self._turn = 0
        self._results = context.Queue()
        self._closed = False
        self._last_check = time.monotonic()
        self._timeout, self._timeout_key = timeout, timeout_key
        self._warn_after = warn_after if not timeout or warn_after < timeout else 0
        self._warned = set()  # workers warned about in their current silence
        self._describe = getattr(handler, "describe", repr)
        self._serial = 0
        self._running = {}  # serial -> task, until its message arrives
        self._clock = RawArray("d", [self._last_check, -1] * num_workers)
        self.processes = [
            context.Process(target=_worker_loop, name=f"{name}-{index}", daemon=True,
                            args=(handler, initializer, self._queues[index % len(self._queues)], self._results,
                                  os.getpid(), self._clock, index))
            for index in range(num_workers)
        ]
        for process in self.processes:
            process.start()

    @property
    def pids(self):
        return [process.pid for process in self.processes]

    def submit(self, task, key=None):
        if key is None:
            key, self._turn = self._turn, self._turn + 1
        self._serial += 1
        self._running[self._serial] = task
        self._queues[key % len(self._queues)].put((self._serial, task))

    def get(self, timeout=_POLL_SECONDS):
        """The next message, or None after ``timeout`` s; raises if a worker died or stalled, or a task failed.

        Workers are checked at least every _POLL_SECONDS, so a death is reported even while the
        others keep the results flowing (their work would end up waiting for the dead one's).
        """
        now = time.monotonic()
        if now - self._last_check > _POLL_SECONDS:
            self._last_check = now
            self.check_alive()
        try:
            serial, message = self._results.get(timeout=timeout)
        except queue.Empty:
            self.check_alive()
            return None
        del self._running[serial]
        if message[0] == "error":
            raise WorkerError(f"a data loader worker failed:\n{message[1]}")
        return message

    def check_alive(self):
        """Raise WorkerDiedError for a worker that ended, WorkerStalledError for one silent too long."""
        for process in self.processes:
            code = process.exitcode
            if code is not None:
                how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                raise WorkerDiedError(
                    f"data loader worker {process.name} (pid {process.pid}) {how}; its chips are lost, so the "
                    f"epoch cannot complete (out of memory? check dmesg). Close the loader and restart.")
        if not (self._timeout or self._warn_after):
            return
        now = time.monotonic()
        for index, process in enumerate(self.processes):
            silent = now - self._clock[2 * index]
            if self._timeout and silent > self._timeout:
                limit = f" ({self._timeout_key} is {self._timeout:g} s)"
                raise WorkerStalledError(f"{self._silence(index, silent, limit)}; stopping rather than waiting forever")
            if not self._warn_after or silent <= self._warn_after:
                self._warned.discard(index)
            elif index not in self._warned:
                self._warned.add(index)
                later = f"stopping at {self._timeout_key} ({self._timeout:g} s)" if self._timeout else "waiting"
                logger.warning("%s; %s if it stays silent", self._silence(index, silent), later)

    def _silence(self, index, silent, limit=""):
        """What worker ``index``, silent for ``silent`` s, is and was doing."""
        process = self.processes[index]
        task = self._running.get(int(self._clock[2 * index + 1]))
        doing = "waiting for a task" if task is None else self._describe(task)
        return (f"data loader worker {process.name} (pid {process.pid}) has shown no sign of life for {silent:.0f} s"
                f"{limit} while {doing}{_process_state(process.pid)}")

    def close(self):
        """Stop every worker: ask politely, then terminate, then kill. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if all(process.is_alive() for process in self.processes):
            # a dead worker may have died holding the task queue's lock: then only terminate works
            for index, _ in enumerate(self.processes):
                self._queues[index % len(self._queues)].put(None)
            deadline = time.monotonic() + _JOIN_SECONDS
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                try:
                    os.kill(process.pid, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
                except OSError:
                    pass
                process.join(_JOIN_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
        for channel in (*self._queues, self._results):
            channel.cancel_join_thread()
            channel.close()


class InlinePool:
    """Runs each task at submission in the calling process (NUM_PROCESS = 0: debugging, tests)."""

    pids = []

    def __init__(self, handler):
        self._handler = handler
        self._done = deque()

    def submit(self, task, key=None):
        self._done.append(self._handler(task))  # an exception propagates with its own traceback

    def get(self, timeout=None):
        return self._done.popleft() if self._done else None

    def check_alive(self):
        pass

    def close(self):
        self._done.clear()
