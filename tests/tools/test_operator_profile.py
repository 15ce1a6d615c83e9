"""tools/profile_main_job.py (issue 41): MXNet's operator table read (the C API calls, which wait on the
operators, left out) and grouped by hand-worked numbers, and a tiny training run profiled end to end."""
import os
import subprocess
import sys

import pytest

from lib.bootstrap import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))

from profile_main_job import grouped, operator_times  # noqa: E402

TABLE = """
Profile Statistics:
\tNote the difference in units for different entries.
MXNET_C_API
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)
----                          -----------        ---------    -------------    -------------    -------------
MXNDArraySyncCopyToCPU                434       87202.0625           0.0010         900.0000         200.9264
operator
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)
----                          -----------        ---------    -------------    -------------    -------------
_backward_Convolution                 792       600.0000           0.7030         996.9290          75.0413
Convolution                           792       200.0000           0.3430         614.0690          44.5665
_backward_CompiledDeformablePSROIPooling  72  100.0000           8.7000         472.0480         119.5272
sniper_test_proposal::WaitForVar              31          60.0000           0.0050          15.3020           1.2166
multi_sgd_mom_update                 1134        40.0000           0.0030          56.5810           0.1775
[_sg_mkldnn_conv,Pooling,BatchNorm,Activation]  15  1000.0000  243.2310  5980.4048  66.6667
"""


def test_the_operator_table_is_read_and_grouped():
    times = operator_times(TABLE)
    assert times == {"_backward_Convolution": 600.0, "Convolution": 200.0,
                     "_backward_CompiledDeformablePSROIPooling": 100.0, "sniper_test_proposal::WaitForVar": 60.0,
                     "multi_sgd_mom_update": 40.0, "[_sg_mkldnn_conv,Pooling,BatchNorm,Activation]": 1000.0}
    assert grouped(times) == [("fused subgraph (test network)", pytest.approx(0.5)),
                              ("convolution (backward)", pytest.approx(0.3)), ("convolution", pytest.approx(0.1)),
                              ("PS-ROI pooling (backward)", pytest.approx(0.05)),
                              ("test proposal layer (host, Python custom operator)", pytest.approx(0.03)),
                              ("optimizer, gradient sum", pytest.approx(0.02))]


def test_a_tiny_training_run_is_profiled(synthetic_dataset, tiny_config, tmp_path):
    data = synthetic_dataset(1, 1)
    settings = [f"dataset.dataset_path={data}", "dataset.synthetic_train=1", "dataset.synthetic_val=1",
                f"dataset.root_path={tmp_path}", f"output_path={tmp_path}", "gpus=cpu:1", "TRAIN.NUM_PROCESS=0",
                "TRAIN.BATCH_IMAGES=2", "TRAIN.end_epoch=1", "TRAIN.lr_step=", "TRAIN.warmup_step=2"]
    out = tmp_path / "profile"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "profile_main_job.py"), "train", "--cfg",
                           tiny_config, "--out", str(out), "--set", *settings], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("CPU s: this process ")
    shares = dict(line.rsplit(None, 1) for line in lines[2:] if line.endswith("%"))
    shares = {group: float(share.rstrip("%")) for group, share in shares.items()}
    assert shares["convolution (backward)"] > 0 and shares["convolution"] > 0
    assert sum(shares.values()) == pytest.approx(100, abs=0.5)
    assert "lib/train/trainer.py" in done.stdout  # the project's functions by cumulative time
    assert {"train.pstats", "train_operators.txt"} <= set(os.listdir(out))
