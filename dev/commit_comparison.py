"""Two commits trained and tested side by side, to show that a refactoring leaves behaviour unchanged.

Each commit is checked out into a worktree of its own (``git worktree add --detach``, the project's
``.venv`` linked in, ``make`` building its compiled parts), then trains the tiny synthetic config for
one short epoch on a handful of generated images and tests the checkpoint, both through the command
line (``main_train.py --eval``), which every commit has. The runs are then compared: the losses of
every batch (``metrics.jsonl`` with ``default.frequent 1``: identical), every parameter of the
checkpoint (bit-identical) and the test detections (identical).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

CONFIG = "configs/faster/sniper_synthetic_tiny.yml"
RUN_NAME = "sniper_synthetic_tiny"
# A handful of images, one epoch of about 20 batches, a log line (and metrics record) per batch, a short
# warm-up and the lr step inside the epoch; every detection of the barely trained network kept.
SMALL_RUN = {"dataset.synthetic_train": 10, "dataset.synthetic_val": 4, "TRAIN.end_epoch": 1,
             "TRAIN.lr_step": "0.75", "TRAIN.warmup_step": 5, "TEST.TEST_EPOCH": 1, "TEST.SCORE_THRESH": 0.0,
             "default.frequent": 1}
# metrics.jsonl fields that measure the machine, not the computation.
TIMING_FIELDS = ("chips_per_s", "seconds")


def checkout(repo, commit, folder):
    """A detached worktree of ``commit`` at ``folder`` (made, or moved to the commit) with ``repo``'s ``.venv``
    linked and ``make`` run for the compiled parts only: the venv is ``repo``'s, so its install step (pinned
    packages, start-up hooks naming ``repo`` as the checkout) is left as ``repo`` made it."""
    if os.path.isdir(folder):
        subprocess.run(["git", "-C", folder, "checkout", "-q", "--detach", commit], check=True)
    else:
        subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", folder, commit], check=True)
    venv = os.path.join(folder, ".venv")
    if not os.path.exists(venv):
        os.symlink(os.path.realpath(os.path.join(repo, ".venv")), venv)
    stamps = [f"--old-file=.venv/{name}" for name in os.listdir(venv) if name.startswith(".installed-")]
    subprocess.run(["nice", "make", "-s", *stamps, "build"], cwd=folder, check=True)
    return folder


def train_and_test(tree, work, overrides=SMALL_RUN, data=None, test=True):
    """Train (and with ``test`` test) the small run of ``CONFIG`` in ``tree``, outputs under ``work`` (emptied
    first), data under ``data`` (default: ``work``/data, generated); returns the run folder."""
    shutil.rmtree(work, ignore_errors=True)
    data = data or os.path.join(work, "data")
    settings = {**overrides, "output_path": os.path.join(work, "output"), "dataset.root_path": data,
                "dataset.dataset_path": os.path.join(data, "synthetic")}
    words = [f"{key}={value}" for key, value in settings.items()]
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run(["nice", os.path.join(tree, ".venv", "bin", "python"), "main_train.py", "--cfg", CONFIG,
                    *(["--eval"] if test else []), "--set", *words], cwd=tree, env=env, check=True)
    return os.path.join(work, "output", RUN_NAME)


def batch_losses(run):
    """Per metrics record: everything but the timing fields."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS} for line in f if line.strip()]


def checkpoint_arrays(run, epoch):
    """The checkpoint's arrays by name, as NumPy."""
    import mxnet as mx

    return {name: array.asnumpy() for name, array in
            mx.nd.load(os.path.join(run, f"SNIPER-{epoch:04d}.params")).items()}


def detections(run, image_set="val"):
    with open(os.path.join(run, "results", image_set, f"detections_{image_set}_results.json")) as f:
        return json.load(f)


def compare_runs(run_a, run_b, epoch=1):
    """``{"batches", "losses_identical", "params", "params_identical", "detections", "detections_identical",
    "first_difference"}`` of two run folders: exact equality throughout (same code path, same inputs)."""
    losses_a, losses_b = batch_losses(run_a), batch_losses(run_b)
    params_a, params_b = checkpoint_arrays(run_a, epoch), checkpoint_arrays(run_b, epoch)
    dets_a, dets_b = detections(run_a), detections(run_b)
    differences = []
    if losses_a != losses_b:
        index = next((i for i, (a, b) in enumerate(zip(losses_a, losses_b)) if a != b), min(len(losses_a),
                                                                                             len(losses_b)))
        differences.append(f"metrics record {index}")
    same_params = params_a.keys() == params_b.keys() and all(
        params_a[k].dtype == params_b[k].dtype and params_a[k].tobytes() == params_b[k].tobytes() for k in params_a)
    if not same_params:
        differing = sorted(set(params_a) ^ set(params_b)) or [
            k for k in sorted(params_a) if params_a[k].tobytes() != params_b[k].tobytes()]
        differences.append(f"parameter {differing[0]}")
    if dets_a != dets_b:
        differences.append("detections")
    return {"batches": len(losses_a), "last_losses": losses_a[-1] if losses_a else None,
            "losses_identical": losses_a == losses_b, "params": len(params_a),
            "param_values": int(sum(np.size(v) for v in params_a.values())), "params_identical": same_params,
            "detections": len(dets_a), "detections_identical": dets_a == dets_b,
            "first_difference": differences[0] if differences else None}


def compare_commits(repo, commit_a, commit_b, work):
    """Check out, train, test and compare ``commit_a`` and ``commit_b`` (revisions of ``repo``, e.g. main and
    HEAD; work folders under ``work``)."""
    runs = []
    for label, revision in (("a", commit_a), ("b", commit_b)):
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", f"{revision}^{{commit}}"], check=True,
                                capture_output=True, text=True).stdout.strip()
        tree = checkout(repo, commit, os.path.join(work, f"tree_{label}"))
        print(f"== {label}: {commit} in {tree}", file=sys.stderr, flush=True)
        runs.append(train_and_test(tree, os.path.join(work, f"run_{label}")))
    return compare_runs(*runs)
