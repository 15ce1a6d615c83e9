"""Measuring for the benchmark tools (tools/benchmark_*.py, tools/bench_dataset.py), whose tables
BENCHMARKS.md records: repeated timing after a warm-up, the peak memory of this process and of worker
processes, and the Markdown table they print; for the comparing tools (tools/compare_deformable_ops.py, the
parity harness) agreement counts, detections matched within tolerances and the CPU operators' thread count;
the smooth random images the comparing tools and device runs test on.
(Tests assert no timings: speed figures come from these.)
"""
import numbers
import os
import resource
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil


@dataclass(frozen=True)
class Timing:
    """Seconds per call of each timed round, wall clock and this process's CPU time (all threads), and
    the value the last call returned."""
    seconds: tuple
    cpu_seconds: tuple
    result: object = None

    @property
    def median(self):
        return statistics.median(self.seconds)

    @property
    def best(self):
        return min(self.seconds)

    @property
    def cpu_fraction(self):
        """Cores busy on average: CPU time over wall time."""
        return sum(self.cpu_seconds) / sum(self.seconds)


def measure(function, repeat=3, warmup=1, min_seconds=0.0, setup=None, clock=time.perf_counter,
            cpu_clock=time.process_time):
    """Call ``function()`` ``warmup`` times untimed (first calls pay for initialisation), then time
    ``repeat`` rounds.

    A round is one call, or, with ``min_seconds``, as many calls as fill that time judged by the last
    warm-up call (a sub-millisecond call is timed poorly on its own); each round gives seconds per call.
    ``setup()``, when given, runs untimed before every round and its value is the argument of the
    round's calls (fresh random generators, for instance).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")

    def run(calls):
        argument = () if setup is None else (setup(),)
        start, cpu_start = clock(), cpu_clock()
        for _ in range(calls):
            result = function(*argument)
        return (clock() - start) / calls, (cpu_clock() - cpu_start) / calls, result

    calls = 1
    for _ in range(warmup):
        seconds = run(1)[0]
        if min_seconds:
            calls = max(1, int(min_seconds / max(seconds, 1e-9)))
    rounds = [run(calls) for _ in range(repeat)]
    return Timing(tuple(r[0] for r in rounds), tuple(r[1] for r in rounds), rounds[-1][2])


def peak_rss_bytes():
    """The most resident memory this process has held since it started: the kernel's high-water mark of
    its own address space (``VmHWM``). Not ``getrusage``'s ``ru_maxrss``: Linux carries that across
    fork and exec, so a child started by a large process (a test suite) reports the parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no procfs: kB on Linux and BSDs


class PeakMemory:
    """Peak memory while a ``with`` block runs: a thread samples, at the start, every ``interval``
    seconds and at the end, the resident set size of this process (``.rss``) and the summed
    proportional set size of the processes ``pids`` (``.pss``: their share of the pages they touch,
    shared memory included), in bytes.

    Reading a process's PSS walks its page tables, so sample workers rarely (about once a second).
    """

    def __init__(self, pids=(), interval=0.02):
        self.pids, self.interval = list(pids), interval
        self.rss = self.pss = 0
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory sampler", daemon=True)

    def _sample(self):
        total = 0
        for pid in self.pids:
            try:
                total += psutil.Process(pid).memory_full_info().pss
            except psutil.Error:  # ended, or not ours to read
                pass
        self.pss = max(self.pss, total)
        self.rss = max(self.rss, self._process.memory_info().rss)

    def _run(self):
        self._sample()
        while not self._stop.wait(self.interval):
            self._sample()
        self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def markdown_table(header, rows, formats=None):
    """``rows`` of cells under ``header`` as a Markdown table, columns padded to their widths.

    ``formats[i]`` is the format spec of the numbers of column ``i`` (``".2f"``; ``None`` or ``""``:
    ``str``); a ``None`` cell prints as ``-``. Columns holding only numbers are right-aligned.
    """
    formats = list(formats or [None] * len(header))
    if len(formats) != len(header) or any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row and the formats need {len(header)} cells, as the header")

    def is_number(value):
        return isinstance(value, numbers.Number) and not isinstance(value, bool)

    def cell(value, spec):
        if value is None:
            return "-"
        return format(value, spec) if spec and is_number(value) else str(value)

    cells = [[cell(value, spec) for value, spec in zip(row, formats)] for row in rows]
    right = [bool(rows) and all(is_number(row[i]) or row[i] is None for row in rows) for i in range(len(header))]
    widths = [max([len(title)] + [len(row[i]) for row in cells]) for i, title in enumerate(header)]

    def line(texts):
        return "| " + " | ".join(text.rjust(w) if r else text.ljust(w)
                                 for text, w, r in zip(texts, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1)) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(header), rule] + [line(row) for row in cells])


def percent(hits, total):
    """``hits`` of ``total`` as "12.5% (1 / 8)" ("-" for none)."""
    return f"{100.0 * hits / total:.1f}% ({hits} / {total})" if total else "-"


def matched_detections(theirs, mine, box_tol=0.01, score_tol=1e-4):
    """How many detections ``theirs`` ((label, box, score) rows) have a counterpart in ``mine`` ((N, 6)
    [x1, y1, x2, y2, score, label]; same label, box within ``box_tol`` px, score within ``score_tol``), each
    used once."""
    used, hits = np.zeros(len(mine), bool), 0
    for label, box, score in theirs:
        close = (~used & (mine[:, 5] == label) & (np.abs(mine[:, :4] - box).max(1) <= box_tol) &
                 (np.abs(mine[:, 4] - score) <= score_tol))
        if close.any():
            used[np.flatnonzero(close)[0]] = True
            hits += 1
    return hits


def thread_count():
    """The CPU operators' thread count in words: compiled kernels and BLAS split their sums by it, so the last
    bits of their results (and the figures measured on them) may depend on it."""
    threads = os.environ.get("OMP_NUM_THREADS")
    cores = os.cpu_count()
    return f"OMP_NUM_THREADS {threads}" if threads else f"OMP_NUM_THREADS unset (MXNet's default on {cores} cores)"


def smooth_images(count, height, width, seed=0):
    """``count`` BGR images of smooth random content (upsampled noise, like photographs at a coarse scale): a
    random network then gives proposals of many sizes and few equal scores."""
    import cv2

    rng = np.random.default_rng(seed)
    return [cv2.resize(rng.integers(0, 255, (height // 16, width // 16, 3), dtype=np.uint8), (width, height),
                       interpolation=cv2.INTER_CUBIC) for _ in range(count)]
