"""The first iterations of the embedded default's training, pinned (issue 41): a change of training
behaviour (data, chips, targets, initialisation, losses, optimizer, schedule) moves these numbers, so it is
always a deliberate one that updates them here (and reruns the main-job benchmark, BENCHMARKS.md).

The run: configs/faster/sniper_synthetic_tiny.yml on one synthetic training image (and its flip), one CPU
context, 2 chips a batch, the loader in process, a metrics record every batch (4 batches, seconds).

Tolerances are set from the spread measured on one AMD EPYC (AVX-512) between the kernels MXNet 1.9.1 picks
(oneDNN with AVX-512, AVX2 or SSE4.1 via DNNL_MAX_CPU_ISA, MXNET_MKLDNN_ENABLED=0, 1 or 2 OpenMP threads),
about 10x over it. Iteration 1 is one forward pass of the initial network (largest spread 3e-5 relative);
later iterations also test the updates. After 2 updates a last-digit difference of the kernels can flip
which proposals the R-CNN head samples: RCNNL1Loss then moves by up to 13% (so it is pinned at iterations
1-2 only) and the accuracies by a few samples. Measured against these bounds: another seed or the
reference's initialisation fail at iteration 1, lr x1.1 at iteration 3; ten times the weight decay and a
ulp-sized change (float32 vs double pixel means) stay under the spread: ``dev/compare_commits.py``
compares two commits exactly, batch for batch, on one machine."""
import json
import os

import pytest

from lib.config import load_config
from lib.run import checkpoint
from lib.train.trainer import train

METRICS = ("RPNAcc", "RPNLogLoss", "RPNL1Loss", "RCNNAcc", "RCNNLogLoss", "RCNNL1Loss")
# metrics.jsonl's running means after iterations 1-4 (AVX-512 oneDNN kernels, one OpenMP thread)
PINNED = {
    1: (0.439453125, 0.6971627473831177, 0.0032734419219195843, 0.03125, 1.8022571802139282, 0.04921780154109001),
    2: (0.478515625, 0.6951338052749634, 0.015694398200139403, 0.439453125, 1.7810435891151428, 0.057054297998547554),
    3: (0.4986979166666667, 0.6945531368255615, 0.011262290955831608, 0.62109375, 1.7352282206217449,
        0.045821444441874824),
    4: (0.529296875, 0.6924988925457001, 0.014243965153582394, 0.7021484375, 1.6219599545001984, 0.05826390627771616),
}
# (relative, absolute) tolerance per metric after iteration 1, the largest spread measured in brackets
LATER = {"RPNAcc": (0, 0.005),  # 0.0007
         "RPNLogLoss": (1e-4, 0),  # 8e-6 relative
         "RPNL1Loss": (5e-4, 0),  # 3e-5
         "RCNNAcc": (0, 0.02),  # 0.002
         "RCNNLogLoss": (2e-3, 0),  # 2.5e-4
         "RCNNL1Loss": (1e-3, 0)}  # 2e-5 at iteration 2; not compared after it (see above)
FIRST = (1e-3, 0)  # every metric at iteration 1: 3e-5


def tolerance(iteration, metric):
    """(rel, abs) for ``metric`` at ``iteration``, None where it is not compared."""
    if iteration == 1:
        return FIRST
    if metric == "RCNNL1Loss" and iteration > 2:
        return None
    return LATER[metric]


def test_the_first_iterations_losses_of_the_embedded_default_are_pinned(synthetic_dataset, tiny_config, tmp_path):
    data = synthetic_dataset(1, 1)
    cfg = load_config(tiny_config, [
        ("dataset.dataset_path", data), ("dataset.synthetic_train", "1"), ("dataset.synthetic_val", "1"),
        ("dataset.root_path", str(tmp_path)), ("output_path", str(tmp_path)), ("gpus", "cpu:1"),
        ("TRAIN.NUM_PROCESS", "0"), ("TRAIN.BATCH_IMAGES", "2"), ("TRAIN.end_epoch", "1"), ("TRAIN.lr_step", ""),
        ("TRAIN.warmup_step", "2"), ("default.frequent", "1")])
    train(cfg)
    with open(os.path.join(checkpoint.output_dir(cfg), "metrics.jsonl")) as f:
        records = {record["iteration"]: record for record in map(json.loads, f)}
    got = {iteration: tuple(records[iteration][metric] for metric in METRICS) for iteration in PINNED}
    table = "\n".join(f"    {iteration}: {values!r}," for iteration, values in got.items())
    for iteration, expected in PINNED.items():
        for metric, want, value in zip(METRICS, expected, got[iteration]):
            tol = tolerance(iteration, metric)
            if tol is not None:
                assert value == pytest.approx(want, rel=tol[0], abs=tol[1]), (
                    f"{metric} at iteration {iteration}: {value!r}, pinned {want!r}. If training behaviour changed on "
                    f"purpose, rerun the main-job benchmark (BENCHMARKS.md) and pin the new values:\n{table}")
