"""Draw a run's metrics.jsonl (written by the trainer at every periodic log line) to a PNG: the
losses, the accuracies, the learning rate and the speed against the iteration.

    python tools/plot_metrics.py RUN_FOLDER_OR_METRICS_JSONL [--out PNG]

The default PNG is ``metrics.png`` beside the metrics file. A line that is not JSON (a run killed
mid-write) is skipped and counted.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BOOKKEEPING = {"iteration", "epoch", "batch", "batches", "lr", "chips_per_s", "seconds"}


def read_metrics(path):
    """(training records, skipped lines) of a metrics.jsonl file; evaluation records (``eval``) are not
    training curves and are left out, uncounted."""
    records, skipped = [], 0
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and "eval" in record:
                continue
            if isinstance(record, dict) and "iteration" in record:
                records.append(record)
            else:
                skipped += 1
    return records, skipped


def plot(records, out):
    """Three panels: metrics (losses on the left axis; accuracies, named *Acc, on their own axis), lr, chips/s."""
    iterations = [r["iteration"] for r in records]
    names = sorted({k for r in records for k in r} - BOOKKEEPING)
    figure, (metrics_axis, lr_axis, speed_axis) = plt.subplots(3, 1, figsize=(9, 10), sharex=True,
                                                               gridspec_kw={"height_ratios": [3, 1, 1]})
    accuracy_axis = metrics_axis.twinx()
    for name in names:
        axis = accuracy_axis if name.endswith("Acc") else metrics_axis
        axis.plot(iterations, [r.get(name, float("nan")) for r in records], label=name,
                  linestyle="--" if axis is accuracy_axis else "-")
    metrics_axis.set_ylabel("loss")
    accuracy_axis.set_ylabel("accuracy (dashed)")
    handles = metrics_axis.get_legend_handles_labels()
    extra = accuracy_axis.get_legend_handles_labels()
    metrics_axis.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8, loc="upper right")
    lr_axis.plot(iterations, [r["lr"] for r in records])
    lr_axis.set_ylabel("lr")
    speed_axis.plot(iterations, [r["chips_per_s"] for r in records])
    speed_axis.set_ylabel("chips/s")
    speed_axis.set_xlabel("iteration")
    for axis in (metrics_axis, lr_axis, speed_axis):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run folder (output/NAME) or its metrics.jsonl")
    parser.add_argument("--out", help="PNG to write (default: metrics.png beside the metrics file)")
    args = parser.parse_args(argv)
    path = os.path.join(args.path, "metrics.jsonl") if os.path.isdir(args.path) else args.path
    if not os.path.isfile(path):
        sys.exit(f"no metrics file {path}: it is written by main_train.py into the run folder")
    records, skipped = read_metrics(path)
    if not records:
        sys.exit(f"{path} holds no metrics records ({skipped} unreadable lines)")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.png")
    plot(records, out)
    note = f", {skipped} unreadable lines skipped" if skipped else ""
    print(f"{len(records)} records of {path}{note} -> {out}")


if __name__ == "__main__":
    main()
