"""Draw a run's metrics.jsonl (written by the trainer at every periodic log line) to a PNG titled with the
run's name: one panel each for the losses (log axis), the accuracies, the learning rate and the speed
against the iteration, every curve its own colour, the legends beside the panels (never over a curve),
dotted lines at the epoch boundaries; with evaluations while training (TRAIN.EVAL_EVERY: the ``eval``
records) a last panel of their AP stats, a point per evaluation labelled with its epoch. An undefined stat
(COCO's -1, e.g. APs on a set without small objects; NaN) is no point, and the panel names it.

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

from lib.evaluation.coco_summary import defined  # noqa: E402
from lib.logger import report_user_errors  # noqa: E402
from lib.paths import shown_path  # noqa: E402

BOOKKEEPING = {"iteration", "epoch", "batch", "batches", "lr", "chips_per_s", "seconds"}


def read_metrics(path):
    """(training records, evaluation records, skipped lines) of a metrics.jsonl file (an evaluation record:
    ``{"iteration", "epoch", "eval": {stat: value}}``)."""
    records, evaluations, skipped = [], [], 0
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and isinstance(record.get("eval"), dict) and "iteration" in record:
                evaluations.append(record)
            elif isinstance(record, dict) and "iteration" in record:
                records.append(record)
            else:
                skipped += 1
    return records, evaluations, skipped


def ap_curves(evaluations):
    """({AP stat: [(iteration, epoch, value), ...]} of its defined values, [stats undefined at every
    evaluation]): the stats whose name says AP (AP, AP50, APs, mAP, segm_AP ...), not the ARs."""
    names = list(dict.fromkeys(name for record in evaluations for name in record["eval"] if "AP" in name))
    curves = {name: [(record["iteration"], record.get("epoch"), float(record["eval"][name]))
                     for record in evaluations if defined(record["eval"].get(name))] for name in names}
    return {name: points for name, points in curves.items() if points}, [name for name in names if not curves[name]]


def figure_of(records, run_name, evaluations=()):
    """The figure: losses (log axis), accuracies (named *Acc), lr, chips/s and the evaluations' AP stats
    (``ap_curves``), one panel each, sharing the iteration axis; every curve a colour of its own (tab10 hues
    first, over all panels); legends right of the panels."""
    iterations = [r["iteration"] for r in records]
    names = sorted({k for r in records for k in r} - BOOKKEEPING)
    accuracies = [n for n in names if n.endswith("Acc")]
    losses = [n for n in names if n not in accuracies]
    panels = [("loss (log)", losses), ("accuracy", accuracies), ("lr", ["lr"]), ("chips/s", ["chips_per_s"])]
    panels = [(label, curves) for label, curves in panels if curves]
    aps, undefined = ap_curves(evaluations)
    if aps or undefined:
        panels.append(("AP (evaluations)", list(aps)))
    colours = plt.get_cmap("tab10").colors + plt.get_cmap("tab20").colors[1::2] + plt.get_cmap("tab20b").colors
    figure, axes = plt.subplots(len(panels), 1, figsize=(11, 2.6 * len(panels) + 1), sharex=True, squeeze=False,
                                gridspec_kw={"height_ratios": [2 if label.startswith("loss") else 1
                                                               for label, _ in panels]})
    curve = 0
    boundaries = [r["iteration"] for r, after in zip(records, records[1:]) if after.get("epoch") != r.get("epoch")]
    for axis, (label, curves) in zip(axes[:, 0], panels):
        if label == "AP (evaluations)":
            curve = draw_evaluations(axis, aps, undefined, colours, curve)
            continue
        for name in curves:
            values = [r.get(name, float("nan")) for r in records]
            axis.plot(iterations, values, label=name, color=colours[curve % len(colours)], marker=".",
                      markersize=3 if len(records) < 200 else 0, linewidth=1.2)
            curve += 1
        if label.startswith("loss") and all(v > 0 for n in curves for v in (r.get(n) for r in records)
                                            if v is not None):
            axis.set_yscale("log")
        for boundary in boundaries:
            axis.axvline(boundary, color="0.6", linestyle=":", linewidth=0.8)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1, 0].set_xlabel("iteration (dotted: epoch boundaries)")
    epochs = sorted({r["epoch"] for r in records if "epoch" in r})
    figure.suptitle(f"{run_name}: {len(records)} records, epochs {epochs[0]}-{epochs[-1]}" if epochs else run_name)
    figure.tight_layout()
    return figure


def draw_evaluations(axis, aps, undefined, colours, curve):
    """The AP panel: a marked line per stat against the iteration of each evaluation, the first stat's
    points labelled with their epoch, the undefined stats named; returns the next curve's colour index."""
    for name, points in aps.items():
        axis.plot([p[0] for p in points], [p[2] for p in points], label=name, color=colours[curve % len(colours)],
                  marker="o", markersize=4, linewidth=1.2)
        curve += 1
    for iteration, epoch, value in next(iter(aps.values()), []):
        axis.annotate(f"e{epoch}", (iteration, value), textcoords="offset points", xytext=(0, 5), ha="center",
                      fontsize=7)
    if undefined:
        axis.set_title(f"undefined at every evaluation (no point): {', '.join(undefined)}", fontsize=8, loc="left")
    axis.set_ylabel("AP (evaluations)")
    axis.grid(alpha=0.3)
    if aps:
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return curve


def plot(records, out, run_name, evaluations=()):
    figure = figure_of(records, run_name, evaluations)
    figure.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(figure)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run folder (output/NAME) or its metrics.jsonl")
    parser.add_argument("--out", help="PNG to write (default: metrics.png beside the metrics file)")
    args = parser.parse_args(argv)
    path = os.path.join(args.path, "metrics.jsonl") if os.path.isdir(args.path) else args.path
    if not os.path.isfile(path):
        sys.exit(f"no metrics file {path}: it is written by main_train.py into the run folder")
    records, evaluations, skipped = read_metrics(path)
    if not records:
        sys.exit(f"{path} holds no metrics records ({skipped} unreadable lines)")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.png")
    plot(records, out, os.path.basename(os.path.dirname(os.path.abspath(path))), evaluations)
    note = f", {skipped} unreadable lines skipped" if skipped else ""
    print(f"{len(records)} records and {len(evaluations)} evaluations of {shown_path(path)}{note} -> "
          f"{shown_path(out)}")


if __name__ == "__main__":
    main()
