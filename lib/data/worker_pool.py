"""Worker processes for the data loader, and an in-process stand-in with the same interface.

Why not multiprocessing.Pool: a Pool silently replaces a worker that dies (the task is lost and the
caller waits forever) and pickles whole results. Here a dead worker is noticed and reported by
``get``, results are small messages (the arrays go through a BatchRing), and ``close`` always reaps
every process. Workers are forked so they share the roidb and the ring with the parent; they ignore
Ctrl-C (the parent handles it and closes the pool) and exit on their own if the parent disappears.
"""
import multiprocessing
import os
import queue
import signal
import time
import traceback
from collections import deque

# How often the main process checks that its workers are alive (an idle worker checks its parent
# every 5 times that), in seconds.
_POLL_SECONDS = 0.2
_JOIN_SECONDS = 3.0


class WorkerDiedError(RuntimeError):
    """A worker process ended without being asked to (killed, out of memory, crashed)."""


class WorkerError(RuntimeError):
    """A task raised an unexpected exception inside a worker; the message has its traceback."""


def _worker_loop(handler, initializer, tasks, results, parent_pid):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer()
    while True:
        try:
            task = tasks.get(timeout=_POLL_SECONDS * 5)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return
            continue
        if task is None:
            return
        try:
            message = handler(task)
        except Exception:  # reported to the parent, which raises it with the worker's traceback
            message = ("error", traceback.format_exc())
        results.put(message)


class ProcessPool:
    """``num_workers`` forked processes running ``handler(task) -> message`` (tasks and messages are small).

    ``initializer()`` runs once in each worker before its first task. Tasks go to whichever worker is
    free, or with ``routed`` to one queue per worker: a task submitted with a ``key`` then always runs
    in worker ``key % num_workers`` (so a worker's cache sees every task of that key), the others in
    turn.
    """

    def __init__(self, handler, num_workers, initializer=None, name="data-worker", routed=False):
        context = multiprocessing.get_context("fork")
        self._queues = [context.Queue() for _ in range(num_workers if routed else 1)]
        self._turn = 0
        self._results = context.Queue()
        self._closed = False
        self._last_check = time.monotonic()
        self.processes = [
            context.Process(target=_worker_loop, name=f"{name}-{index}", daemon=True,
                            args=(handler, initializer, self._queues[index % len(self._queues)], self._results,
                                  os.getpid()))
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
        self._queues[key % len(self._queues)].put(task)

    def get(self, timeout=_POLL_SECONDS):
        """The next message, or None after ``timeout`` s; raises if a worker died or a task failed.

        Workers are checked at least every _POLL_SECONDS, so a death is reported even while the
        others keep the results flowing (their work would end up waiting for the dead one's).
        """
        now = time.monotonic()
        if now - self._last_check > _POLL_SECONDS:
            self._last_check = now
            self.check_alive()
        try:
            message = self._results.get(timeout=timeout)
        except queue.Empty:
            self.check_alive()
            return None
        if message[0] == "error":
            raise WorkerError(f"a data loader worker failed:\n{message[1]}")
        return message

    def check_alive(self):
        for process in self.processes:
            code = process.exitcode
            if code is not None:
                how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                raise WorkerDiedError(
                    f"data loader worker {process.name} (pid {process.pid}) {how}; its chips are lost, so the "
                    f"epoch cannot complete (out of memory? check dmesg). Close the loader and restart.")

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
