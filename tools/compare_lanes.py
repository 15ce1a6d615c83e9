"""Same results on both Python lanes (3.8-3.11 with NumPy 1.23, 3.12+ with NumPy 2): the same computations run
in two checkouts' venvs, compared quantity by quantity.

    python tools/compare_lanes.py CHECKOUT_A CHECKOUT_B [--work DIR]

Each checkout's ``.venv/bin/python`` runs this script with ``--dump`` in a process of its own, without
``PYTHONPATH``. A dump writes under ``WORK/a`` or ``WORK/b``: the synthetic dataset that lane generates, the
chips of the first training epoch and the first loader batches (built by two loader worker processes), then
trains and tests the small run of dev/commit_comparison.py (one short epoch of the tiny default, a metrics
record per batch); lane A tests its checkpoint and lane B tests that same checkpoint, so that the test path
is compared on the same weights. Lane B works on lane A's dataset, so that every later quantity has the same inputs. The records are
compared with each quantity's tolerance (``TOLERANCES``, where the reasons are); a table is printed, and the
exit status is 1 when one is exceeded.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from lib.logger import report_user_errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASET = {"train": 10, "val": 4, "seed": 3}  # dev.commit_comparison.SMALL_RUN's images, the tiny default's seed
LOADER_BATCHES = 3
LOADER_WORKERS = 2
# Largest difference accepted per quantity, absolute (in the quantity's unit) or relative to its largest value.
# Exact everywhere but one: the data, the chip miner, the loader's crops and targets are NumPy and OpenCV
# arithmetic with explicit dtypes, training and testing run in the same libmxnet.so on the same inputs, and the
# project's NumPy parts of them (proposal target, box decoding, NMS) must not move with NumPy 2's promotion rules
# (NEP 50): the weights after an epoch and every detection are bit-identical. The logged losses are metrics: each
# is a NumPy float32 sum over a batch's anchors or rois (lib/train/metrics.py), which NumPy 2's vectorised
# reduction adds up in another order; that moves the last bits of a sum of ~10^5 float32 values by a few
# roundings (6e-8 relative each; 7e-8 measured, on RPNL1Loss only). 1e-6 admits that and nothing a changed
# computation would give.
TOLERANCES = {
    "dataset images (pixel values)": 0, "dataset annotations": 0, "chips of epoch 0": 0, "loader batches": 0,
    "training losses (relative)": 1e-6, "checkpoint weights (relative)": 0,
    "detections of lane A's checkpoint (boxes, px)": 0, "detections of lane A's checkpoint (scores)": 0,
}


def dump(out, data, test_model):
    """This lane's quantities under ``out`` (its own dataset generated under ``out``/data; the rest on
    ``data``)."""
    import cv2
    import mxnet as mx
    from dev.commit_comparison import CONFIG, SMALL_RUN, checkpoint_arrays, train_and_test
    from lib.config import load_config
    from lib.data import ChipLoader
    from lib.dataset import ensure_synthetic_dataset, load_roidb

    os.makedirs(out, exist_ok=True)
    versions = {"python": sys.version.split()[0], "numpy": np.__version__, "opencv": cv2.__version__,
                "mxnet": mx.__version__}
    own = ensure_synthetic_dataset(os.path.join(out, "data", "synthetic"), **DATASET)
    images = {}
    for parent, _, files in os.walk(own):
        for name in files:
            path = os.path.join(parent, name)
            key = os.path.relpath(path, own)
            if name.endswith((".jpg", ".png")):
                images[key] = cv2.imread(path, cv2.IMREAD_UNCHANGED)
            elif name.endswith(".json"):
                with open(path) as f:
                    images[key] = np.frombuffer(json.dumps(json.load(f), sort_keys=True).encode(), np.uint8)
    np.savez_compressed(os.path.join(out, "dataset.npz"), **images)

    overrides = {**SMALL_RUN, "dataset.root_path": data, "dataset.dataset_path": os.path.join(data, "synthetic")}
    cfg = load_config(os.path.join(ROOT, CONFIG), overrides)
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set)
    batches = {}
    with ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, num_ctx=2, num_workers=LOADER_WORKERS) as loader:
        names = [d.name for d in loader.provide_data] + [d.name for d in loader.provide_label]
        for index, batch in enumerate(loader):
            for name, array in zip(names, list(batch.data) + list(batch.label)):
                batches[f"{index}/{name}"] = array.asnumpy()
            if index + 1 == LOADER_BATCHES:
                break
        chips = [loader.chip_ref(b, i) for b in range(loader.num_batches) for i in range(loader.batch_size)]
    np.savez_compressed(os.path.join(out, "batches.npz"), **batches)
    np.savez_compressed(os.path.join(out, "chips.npz"),
                        image_index=[c.image_index for c in chips], scale_index=[c.scale_index for c in chips],
                        im_scale=[c.im_scale for c in chips], box=[c.box for c in chips],
                        negative=[c.negative for c in chips],
                        valid_boxes=np.array([json.dumps(list(c.valid_boxes)) for c in chips]))

    # lane A tests its checkpoint; lane B tests that one too (below), not its own (the weights may differ)
    run = train_and_test(ROOT, os.path.join(out, "train"), data=data, test=not test_model)
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({**versions, "run": run}, f)
    np.savez_compressed(os.path.join(out, "weights.npz"), **checkpoint_arrays(run, 1))
    if test_model:
        tested = os.path.join(out, "test_a")
        shutil.rmtree(tested, ignore_errors=True)
        shutil.copytree(test_model, tested, ignore=shutil.ignore_patterns("results", "evaluations"))
        subprocess.run([sys.executable, os.path.join(ROOT, "main_test.py"), "--model", tested], cwd=ROOT,
                       check=True)


def _relative(a, b):
    scale = max(float(np.max(np.abs(a))) if np.size(a) else 0.0, 1e-12)
    return float(np.max(np.abs(a - b))) / scale if np.size(a) else 0.0


def _arrays_difference(path_a, path_b, relative=False):
    """Largest difference over the arrays of two .npz files (inf when their names or shapes differ)."""
    with np.load(path_a) as a, np.load(path_b) as b:
        if sorted(a.files) != sorted(b.files):
            return float("inf")
        worst = 0.0
        for name in a.files:
            x, y = a[name], b[name]
            if x.shape != y.shape or x.dtype != y.dtype:
                return float("inf")
            if x.dtype.kind in "fiub":
                x, y = x.astype(np.float64), y.astype(np.float64)
                worst = max(worst, _relative(x, y) if relative else float(np.max(np.abs(x - y), initial=0.0)))
            elif not np.array_equal(x, y):
                return float("inf")
        return worst


def _detections_difference(run_a, run_b):
    """(largest box difference in px, largest score difference) of two runs' val detections, matched in order;
    inf when their number, images or classes differ."""
    from dev.commit_comparison import detections

    dets_a, dets_b = detections(run_a), detections(run_b)
    if len(dets_a) != len(dets_b) or any((d["image_id"], d["category_id"]) != (e["image_id"], e["category_id"])
                                         for d, e in zip(dets_a, dets_b)):
        return float("inf"), float("inf")
    boxes = np.abs(np.array([d["bbox"] for d in dets_a]) - np.array([d["bbox"] for d in dets_b]))
    scores = np.abs(np.array([d["score"] for d in dets_a]) - np.array([d["score"] for d in dets_b]))
    return float(boxes.max(initial=0.0)), float(scores.max(initial=0.0))


def _losses_difference(run_a, run_b):
    from dev.commit_comparison import batch_losses

    a, b = batch_losses(run_a), batch_losses(run_b)
    if len(a) != len(b) or any(x.keys() != y.keys() for x, y in zip(a, b)):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        for key, value in x.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                worst = max(worst, abs(value - y[key]) / max(abs(value), 1e-12))
            elif value != y[key]:
                return float("inf")
    return worst


def compare(a, b):
    """``{quantity: largest difference}`` of two lanes' dumps (folders)."""
    def path(lane, name):
        return os.path.join(lane, name)

    with open(path(a, "versions.json")) as f:
        run_a = json.load(f)["run"]
    with open(path(b, "versions.json")) as f:
        run_b = json.load(f)["run"]
    with np.load(path(a, "dataset.npz")) as x, np.load(path(b, "dataset.npz")) as y:
        json_names = [n for n in x.files if n.endswith(".json")]
        same_annotations = sorted(x.files) == sorted(y.files) and all(np.array_equal(x[n], y[n]) for n in json_names)
    image_difference = float("inf")
    if same_annotations:
        with np.load(path(a, "dataset.npz")) as x, np.load(path(b, "dataset.npz")) as y:
            image_difference = max((float(np.max(np.abs(x[n].astype(np.int64) - y[n].astype(np.int64))))
                                    for n in x.files if not n.endswith(".json")), default=0.0)
    boxes, scores = _detections_difference(os.path.join(a, "train", "output", os.path.basename(run_a)),
                                           path(b, "test_a"))
    return {
        "dataset images (pixel values)": image_difference,
        "dataset annotations": 0 if same_annotations else float("inf"),
        "chips of epoch 0": _arrays_difference(path(a, "chips.npz"), path(b, "chips.npz")),
        "loader batches": _arrays_difference(path(a, "batches.npz"), path(b, "batches.npz")),
        "training losses (relative)": _losses_difference(run_a, run_b),
        "checkpoint weights (relative)": _arrays_difference(path(a, "weights.npz"), path(b, "weights.npz"), True),
        "detections of lane A's checkpoint (boxes, px)": boxes,
        "detections of lane A's checkpoint (scores)": scores,
    }


def run_lane(checkout, out, data, test_model=None):
    """This script in ``checkout``'s venv, without PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [os.path.join(checkout, ".venv", "bin", "python"), os.path.join(checkout, "tools", "compare_lanes.py"),
               "--dump", out, "--data", data] + (["--test_model", test_model] if test_model else [])
    subprocess.run(["nice", *command], cwd=checkout, env=env, check=True)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="*", metavar="CHECKOUT", help="two checkouts, each with its .venv made")
    parser.add_argument("--work", default=os.path.join(ROOT, "output", "compare_lanes"))
    parser.add_argument("--dump", help=argparse.SUPPRESS)  # one lane's part, in that lane's venv
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--test_model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        return dump(os.path.abspath(args.dump), os.path.abspath(args.data), args.test_model)
    if len(args.checkouts) != 2:
        parser.error("give two checkouts (CHECKOUT_A CHECKOUT_B), each with a .venv made by make")
    for checkout in args.checkouts:
        if not os.path.isfile(os.path.join(checkout, ".venv", "bin", "python")):
            parser.error(f"{checkout} has no .venv: run make there first (make PYTHON=python3.11, or python3.13)")
    work = os.path.abspath(args.work)
    lane_a, lane_b = os.path.join(work, "a"), os.path.join(work, "b")
    data = os.path.join(lane_a, "data")
    run_lane(os.path.abspath(args.checkouts[0]), lane_a, data)
    with open(os.path.join(lane_a, "versions.json")) as f:
        run_a = json.load(f)["run"]
    run_lane(os.path.abspath(args.checkouts[1]), lane_b, data, test_model=run_a)
    differences = compare(lane_a, lane_b)
    versions = []
    for lane in (lane_a, lane_b):
        with open(os.path.join(lane, "versions.json")) as f:
            v = json.load(f)
        versions.append(f"Python {v['python']}, NumPy {v['numpy']}, OpenCV {v['opencv']}, MXNet {v['mxnet']}")
    print(f"lane A: {versions[0]}\nlane B: {versions[1]}\n")
    print("| quantity | largest difference | tolerance | |\n| --- | --- | --- | --- |")
    failed = False
    for name, difference in differences.items():
        ok = difference <= TOLERANCES[name]
        failed |= not ok
        print(f"| {name} | {difference:.3g} | {TOLERANCES[name]:g} | {'ok' if ok else 'EXCEEDED'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
