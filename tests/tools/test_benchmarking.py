"""The benchmark tools' helpers (lib/benchmarking.py): the Markdown table, timing rounds on a fake clock,
and the memory sampler seeing real allocations (this process's RSS, a child's PSS)."""
import subprocess
import sys
import time

import numpy as np
import pytest

from lib.benchmarking import PeakMemory, markdown_table, measure

MB = 1 << 20


def test_markdown_table_pads_formats_and_aligns():
    table = markdown_table(["implementation", "ms", "agree"],
                           [("compiled", 35.125, "yes"), ("NumPy reference", 1308.4, None), ("stock", 7, "-")],
                           [None, ".1f", None])
    assert table == (
        "| implementation  |     ms | agree |\n"
        "|:----------------|-------:|:------|\n"
        "| compiled        |   35.1 | yes   |\n"
        "| NumPy reference | 1308.4 | -     |\n"
        "| stock           |    7.0 | -     |")


def test_markdown_table_without_formats_and_rows():
    assert markdown_table(["a", "bb"], [(1, "x"), (None, True)]) == (
        "| a | bb   |\n"
        "|--:|:-----|\n"
        "| 1 | x    |\n"
        "| - | True |")
    assert markdown_table(["a"], []) == "| a |\n|:--|"
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["a", "b"], [(1,)])


class FakeClock:
    """Wall clock and CPU clock that only move when the timed function says so."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self.calls = 0

    def call(self, seconds, cpu_share=0.5):
        self.calls += 1
        self.wall += seconds
        self.cpu += seconds * cpu_share
        return self.calls


def test_measure_skips_the_warm_up_and_reports_median_and_best():
    clock = FakeClock()
    durations = iter([10.0, 3.0, 1.0, 2.0])  # a slow first call, then three rounds
    timing = measure(lambda: clock.call(next(durations)), repeat=3, warmup=1,
                     clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu)
    assert timing.seconds == (3.0, 1.0, 2.0)
    assert (timing.median, timing.best) == (2.0, 1.0)
    assert timing.cpu_seconds == (1.5, 0.5, 1.0) and timing.cpu_fraction == 0.5
    assert timing.result == 4  # the last call's value


def test_measure_fills_rounds_of_min_seconds_and_leaves_setup_untimed():
    clock = FakeClock()
    arguments = []

    def setup():
        clock.wall += 100.0  # untimed work
        return len(arguments)

    def function(argument):
        arguments.append(argument)
        return clock.call(0.25)

    timing = measure(function, repeat=2, warmup=1, min_seconds=1.0, setup=setup,
                     clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu)
    assert clock.calls == 1 + 2 * 4  # the warm-up call, then two rounds of four calls
    assert timing.seconds == (0.25, 0.25)  # per call, without the setup's 100 s
    assert arguments == [0, 1, 1, 1, 1, 5, 5, 5, 5]  # one setup value per round, the same for its calls
    with pytest.raises(ValueError, match="repeat"):
        measure(function, repeat=0)


def test_peak_memory_sees_an_allocation_of_this_process():
    with PeakMemory(interval=0.01) as before:
        pass
    with PeakMemory(interval=0.01) as memory:
        block = np.ones(200 * MB, np.uint8)  # touched: resident
        time.sleep(0.1)
        del block
    assert memory.rss - before.rss > 150 * MB
    assert memory.pss == 0  # no worker pids given


def test_peak_memory_sums_the_workers_proportional_memory():
    child = subprocess.Popen([sys.executable, "-c", "import sys, numpy; a = numpy.ones(100 << 20, numpy.uint8); "
                              "print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        with PeakMemory([child.pid], interval=0.05) as memory:
            time.sleep(0.2)
    finally:
        child.stdin.close()
        child.wait(30)
    assert memory.pss > 90 * MB


PEAK_SCRIPT = ("import sys, numpy; sys.path.insert(0, sys.argv[1]); from lib.benchmarking import peak_rss_bytes; "
               "before = peak_rss_bytes(); a = numpy.ones(int(sys.argv[2]) << 20, numpy.uint8); "
               "print(before, peak_rss_bytes())")


def test_peak_rss_is_this_processs_own_not_the_parents():
    """A child started by a process holding 400 MB reports its own peak (Linux's ru_maxrss would report the
    parent's 400 MB: it is carried across fork and exec), and sees its own 100 MB allocation."""
    from lib.bootstrap import ROOT

    held = np.ones(400 * MB, np.uint8)  # touched: resident in this process when the child forks
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, ROOT, "100"], capture_output=True, text=True,
                          timeout=60, check=True)
    del held
    before, after = (int(value) for value in done.stdout.split())
    assert before < 300 * MB  # an interpreter with NumPy and psutil, not the parent's 400 MB
    assert after - before > 90 * MB
