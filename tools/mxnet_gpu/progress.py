"""Progress and ETA of a ninja build, read from ninja's "[finished/total]" status lines.

ninja prints one status line per finished edge. The ETA is the mean time per edge finished in this run
(so a resumed build does not count the edges an earlier run did) times the edges left: CUDA objects take
longer than C++ ones and are interleaved with them, so it is rough early and settles as the build goes.

    ninja ... | python tools/mxnet_gpu/progress.py [--every SECONDS]

passes every line through and, at most every SECONDS, adds "progress: N/M (P %), elapsed ..., ETA ...".
"""
import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lib.train.progress import format_duration  # noqa: E402  (no MXNet needed: any Python runs this)

STATUS = re.compile(r"^\[(\d+)/(\d+)\]")


def parse_status(line):
    """``(finished, total)`` of a ninja status line, or None for any other line."""
    match = STATUS.match(line)
    return (int(match.group(1)), int(match.group(2))) if match else None


class Progress:
    """Edges finished since the first status line of this run, and the ETA they imply."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.total = self.first = None
        self.start = clock()

    def update(self, finished, total):
        """The progress line for a status ``[finished/total]``. A new total starts a new count: ninja's
        "[0/1] Re-running CMake" precedes the build proper."""
        if total != self.total:
            if self.total is not None:
                self.start = self.clock()
            self.total = total
            self.first = finished - 1  # edges done before this run's first (a resumed build starts above 0)
        elapsed = self.clock() - self.start
        done = finished - self.first
        eta = elapsed / done * (total - finished) if done > 0 and elapsed > 0 else float("inf")
        eta_text = format_duration(eta) if eta != float("inf") else "?"
        return (f"progress: {finished}/{total} ({100.0 * finished / total:.1f} %), "
                f"elapsed {format_duration(elapsed)}, ETA {eta_text}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=60.0, help="seconds between progress lines")
    args = parser.parse_args()
    progress = Progress()
    last = None
    for line in sys.stdin:
        sys.stdout.write(line)
        status = parse_status(line)
        if status is not None:
            now = time.monotonic()
            if last is None or now - last >= args.every or status[0] == status[1]:
                sys.stdout.write(progress.update(*status) + "\n")
                last = now
        sys.stdout.flush()


if __name__ == "__main__":
    main()
