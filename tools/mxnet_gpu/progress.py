"""Progress and ETA of a ninja build, read from ninja's "[finished/total] description" status lines.

A CUDA unit takes several times as long as a C++ one (40-280 s against ~9 s of CPU here), and ninja
interleaves them as it likes, so "time per edge so far x edges left" misleads (it said 1h05m with 8 hours
to go). Given the build's plan (``ninja -n``: the edges this run will build) and its ``.ninja_log`` (how
long each edge built so far took), the ETA is instead, per kind of edge (CUDA object, other object,
link), the edges of that kind still to build times their mean duration, summed and divided by the jobs
running at once. A kind not built yet counts with a prior (``PRIOR_SECONDS``). Without a plan it falls
back to the mean time per edge finished in this run (a resumed build does not count earlier runs' edges).

    ninja -n ... > PLAN
    ninja ... | python tools/mxnet_gpu/progress.py [--every SECONDS] [--plan PLAN --log .ninja_log --jobs N]

passes every line through and, at most every SECONDS, adds "progress: N/M (P %), elapsed ..., ETA ...".
"""
import argparse
import collections
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lib.train.progress import format_duration  # noqa: E402  (no MXNet needed: any Python runs this)

STATUS = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
# Seconds per edge before any of the kind has been built (measured for MXNet 1.9.1 with CUDA 13 on the
# 2-core machine: BENCHMARKS.md, "MXNet 1.9.1 for Hopper").
PRIOR_SECONDS = {"cuda": 60.0, "object": 9.0, "link": 180.0}


def parse_status(line):
    """``(finished, total)`` of a ninja status line, or None for any other line."""
    match = STATUS.match(line)
    return (int(match.group(1)), int(match.group(2))) if match else None


def edge_kind(text):
    """The kind of an edge from its status description or its output path: "cuda", "link" or "object"."""
    if ".cu.o" in text:
        return "cuda"
    if text.startswith("Linking") or text.endswith((".so", ".a")):
        return "link"
    return "object"


def read_plan(lines):
    """Edges per kind in ``ninja -n`` output (its status lines; "no work to do" gives none)."""
    plan = collections.Counter()
    for line in lines:
        match = STATUS.match(line)
        if match:
            plan[edge_kind(match.group(3))] += 1
    return plan


def read_durations(path):
    """Seconds each edge took per kind, from a ``.ninja_log`` (v5+: start and end in ms, then the output);
    the latest entry of an output counts. Missing or unreadable: none."""
    latest = {}
    try:
        with open(path) as log:
            for line in log:
                fields = line.rstrip("\n").split("\t")
                if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
                    latest[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000.0
    except OSError:
        return {}
    durations = collections.defaultdict(list)
    for output, seconds in latest.items():
        durations[edge_kind(output)].append(seconds)
    return dict(durations)


class Progress:
    """Edges finished since the first status line of this run, and the ETA they imply.

    ``plan``: edges per kind this run builds (``read_plan``), ``durations``: a callable giving the seconds
    per edge of each kind built so far (``read_durations`` of the build's log), ``jobs``: edges built at once.
    """

    def __init__(self, clock=time.monotonic, plan=None, durations=None, jobs=1):
        self.clock = clock
        self.plan, self.durations, self.jobs = plan, durations, max(int(jobs), 1)
        self.done = collections.Counter()
        self.total = self.first = None
        self.start = clock()

    def finish(self, finished, total, description=""):
        """Count a status line ``[finished/total] description``. A new total starts a new count: ninja's
        "[0/1] Re-running CMake" precedes the build proper."""
        if total != self.total:
            if self.total is not None:
                self.start = self.clock()
                self.done.clear()
            self.total = total
            self.first = finished - 1  # edges done before this run's first (a resumed build starts above 0)
        if description:
            self.done[edge_kind(description)] += 1

    def line(self, finished):
        """The progress line after ``finished`` edges of the current total."""
        elapsed = self.clock() - self.start
        eta = self._eta(finished, self.total, elapsed)
        eta_text = format_duration(eta) if eta != float("inf") else "?"
        return (f"progress: {finished}/{self.total} ({100.0 * finished / self.total:.1f} %), "
                f"elapsed {format_duration(elapsed)}, ETA {eta_text}")

    def update(self, finished, total, description=""):
        """``finish`` then ``line``."""
        self.finish(finished, total, description)
        return self.line(finished)

    def _eta(self, finished, total, elapsed):
        if self.plan:
            durations = self.durations() if self.durations else {}
            seconds = 0.0
            for kind, planned in self.plan.items():
                taken = durations.get(kind)
                mean = sum(taken) / len(taken) if taken else PRIOR_SECONDS[kind]
                seconds += max(planned - self.done[kind], 0) * mean
            return seconds / self.jobs
        done = finished - self.first
        return elapsed / done * (total - finished) if done > 0 and elapsed > 0 else float("inf")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=60.0, help="seconds between progress lines")
    parser.add_argument("--plan", help="ninja -n output: the edges this run builds, for an ETA per kind of edge")
    parser.add_argument("--log", help="the build's .ninja_log: how long each kind of edge has taken")
    parser.add_argument("--jobs", type=int, default=1, help="edges ninja builds at once (-j)")
    args = parser.parse_args()
    plan = None
    if args.plan:
        with open(args.plan) as f:
            plan = read_plan(f)
    durations = (lambda: read_durations(args.log)) if args.log else None
    progress = Progress(plan=plan, durations=durations, jobs=args.jobs)
    last = None
    for line in sys.stdin:
        sys.stdout.write(line)
        match = STATUS.match(line)
        if match is not None:
            finished, total = int(match.group(1)), int(match.group(2))
            progress.finish(finished, total, match.group(3))
            now = time.monotonic()
            if last is None or now - last >= args.every or finished == total:
                sys.stdout.write(progress.line(finished) + "\n")
                last = now
        sys.stdout.flush()


if __name__ == "__main__":
    main()
