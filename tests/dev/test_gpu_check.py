"""tools/gpu_check.py (dev/gpu_check): the --cpu-smoke run of the GPU check's code path, its --help, and how it
judges results (a Hopper GPU with a CUDA 11 wheel, fp16 against fp32, a run that fails)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from lib.bootstrap import ROOT
from dev.gpu_check import report as gpu_report, runs

SCRIPT = os.path.join(ROOT, "tools", "gpu_check.py")


def test_cpu_smoke_runs_every_check_that_needs_no_gpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    result = subprocess.run([sys.executable, SCRIPT, "--cpu-smoke", "--out", str(out), "--workdir",
                             str(tmp_path / "work")], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses == {"mxnet": "pass", "gpus": "skip", "first_kernel": "pass", "proposal_target": "pass",
                        "train_fp32": "pass", "fp16_vs_fp32": "skip", "gradients": "pass", "inference": "pass"}
    assert report["failed"] == []
    run = report["train"]["fp32"]
    assert len(run["losses"]) == runs.PLANS["cpu-smoke"]["iterations"] and run["chips_per_second"] > 0
    assert report["gradients"]["max_relative_difference"] <= gpu_report.GRADIENT_TOLERANCE
    assert report["gradients"]["devices"] == ["cpu(0)", "cpu(1)"]
    rows = report["inference"]["fp32"]["rows"]
    # every scale of the tiny config's pyramid plus the merged detection without and with host workers,
    # per batch size
    assert len(rows) == 5 * len(runs.PLANS["cpu-smoke"]["inference_batches"])
    assert [row["spec"] for row in rows if row["scale"] == "all"] == [
        "merged, 0 host workers", "merged, 1 host workers"] * len(runs.PLANS["cpu-smoke"]["inference_batches"])
    assert all(row["end_to_end_images_per_second"] > 0 for row in rows)
    assert re.search(r"^\| check +\| status +\| detail +\|$", result.stdout, re.M)
    assert re.search(r"^\| train_fp32 +\| pass +\| summed loss", result.stdout, re.M)


def test_help_says_how_to_prepare_a_machine_without_network():
    result = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for step in ("gpu_machine_prep.sh fetch", "gpu_machine_prep.sh install", "gpu_machine_prep.sh check",
                 "--cpu-smoke", "no PTX"):
        assert step in result.stdout


def environment(compute_capability, sass, ptx=()):
    """An environment report as the environment run writes it, for one GPU."""
    from dev.cuda_kernels import runnable_code

    archs = {"sass": list(sass), "ptx": list(ptx)}
    return {"python": "3.12.3", "numpy": "2.5.2", "mxnet": "1.9.1", "mxnet_gpus": 1, "libmxnet": "libmxnet.so",
            "features": {"CUDA": True, "CUDNN": True, "NCCL": True, "CUDA_RTC": True},
            "libmxnet_archs": archs, "ops_library": "lib/ops/libsniper_ops.so",
            "ops_registered": {"MultiProposalTarget": {"forward": ["cpu", "gpu"], "backward": ["cpu", "gpu"]}},
            "gpus": [{"index": 0, "name": "NVIDIA H200", "compute_capability": compute_capability, "memory_gib": 139.8,
                      "driver": 13000, "kernels": runnable_code(archs, compute_capability)}]}


CU117_SASS = (50, 60, 70, 80, 86)  # what mxnet-cu117 1.9.1's libmxnet.so carries (no PTX)


@pytest.mark.parametrize("compute_capability, ptx, status, runnable", [
    (90, (), "fail", False),  # Hopper: no sm_9x machine code, no PTX to compile
    (90, (86,), "warn", True),  # PTX the driver can compile for it
    (89, (), "pass", True),  # Ada runs sm_86 machine code
    (80, (), "pass", True),
])
def test_kernels_check_follows_the_binary_and_the_gpu(compute_capability, ptx, status, runnable):
    report = gpu_report.Report("gpu")
    assert gpu_report.judge_environment(report, environment(compute_capability, CU117_SASS, ptx),
                                    runs.PLANS["gpu"]) is runnable
    checks = {c["check"]: c for c in report.checks}
    assert checks["kernels"]["status"] == status
    assert f"sm_{compute_capability}" in checks["kernels"]["detail"]


def test_hopper_with_a_cuda11_wheel_fails_fast_and_runs_nothing(tmp_path, monkeypatch):
    """The whole check stops after the environment: every GPU run is skipped, the exit code says failed."""
    monkeypatch.setattr(gpu_report, "run_section", lambda name, *args, **kwargs: environment(90, CU117_SASS))
    out = tmp_path / "report.json"
    assert gpu_report.check_plan("gpu", runs.PLANS["gpu"], str(tmp_path), str(out)) == 1
    report = json.loads(out.read_text())
    assert report["failed"] == ["kernels"]
    assert {c["check"]: c["status"] for c in report["checks"]}["train_fp16"] == "skip"


def training_run(totals, distinct_batches=2):
    """A training result whose summed loss per iteration is ``totals`` (split over the four losses)."""
    return {"losses": [{name: total / 4 for name in runs.LOSS_NAMES} for total in totals],
            "distinct_batches": distinct_batches, "chips_per_second": 10.0, "peak_memory_mib": 1.0, "chips": 16}


@pytest.mark.parametrize("fp16_totals, status", [
    ([2.01, 1.95, 1.86, 1.81, 1.70, 1.66], "pass"),
    ([2.10, 1.95, 1.86, 1.81, 1.70, 1.66], "fail"),  # 5 % apart at the start: not the same network
    ([2.00, 2.30, 2.40, 2.20, 2.10, 2.15], "fail"),  # wanders off
])
def test_fp16_curve_must_follow_fp32(fp16_totals, status):
    report = gpu_report.Report("gpu")
    fp32 = [2.00, 1.96, 1.85, 1.80, 1.71, 1.65]
    gpu_report.judge_training(report, {"fp32": training_run(fp32), "fp16": training_run(fp16_totals)})
    checks = {c["check"]: c["status"] for c in report.checks}
    assert checks["fp16_vs_fp32"] == status and checks["train_fp32"] == "pass"


def test_training_must_be_finite_and_falling():
    report = gpu_report.Report("gpu")
    gpu_report.judge_training(report, {"fp32": training_run([2.0, 1.9, 2.0, 2.1, 2.0, 2.2]),
                                      "fp16": training_run([2.0, 1.9, 1.8, float("nan"), 1.6, 1.5])})
    checks = {c["check"]: c for c in report.checks}
    assert checks["train_fp32"]["status"] == "fail" and checks["train_fp16"]["status"] == "fail"
    assert "NON-FINITE" in checks["train_fp16"]["detail"]
    assert checks["fp16_vs_fp32"]["status"] == "fail"


def test_a_crashing_run_is_a_failed_check_with_its_log(tmp_path):
    plan = dict(runs.PLANS["cpu-smoke"], config="configs/faster/no_such_config.yml")
    result = gpu_report.run_section("environment", plan, str(tmp_path))
    assert result["error"].startswith("exit code 1") and str(tmp_path) in result["error"]
    assert any("no_such_config" in line for line in result["log_tail"])


def test_a_run_past_its_time_is_stopped_and_failed(tmp_path):
    plan = dict(runs.PLANS["cpu-smoke"], timeouts={"environment": 0.5})
    result = gpu_report.run_section("environment", plan, str(tmp_path))
    assert result["error"].startswith("timed out after 0.5 s") and result["seconds"] < 30


def test_device_memory_keeps_the_peak_in_use(monkeypatch):
    import mxnet as mx

    readings = iter([(90, 100), (40, 100)] + [(70, 100)] * 10000)  # (free, total) bytes
    monkeypatch.setattr(mx.context, "gpu_memory_info", lambda device_id: next(readings))
    with runs.DeviceMemory(0) as memory:
        time.sleep(0.2)
    assert memory.device == 60 and memory.rss > 0


def test_a_deadline_stops_a_run_before_its_own_limit(tmp_path):
    """--budget: a run gets what is left of the budget (at least 1 s) when that is less than its limit."""
    plan = runs.PLANS["cpu-smoke"]  # the environment run's own limit is 60 s; it needs several (MXNet import)
    start = time.monotonic()
    result = gpu_report.run_section("environment", plan, str(tmp_path), deadline=start + 0.2)
    assert result["error"].startswith("timed out after 1 s") and time.monotonic() - start < 30


def test_the_report_so_far_is_written_after_every_run(tmp_path, monkeypatch):
    """A check killed from outside (the device call's timeout) still leaves the runs it finished."""
    calls = []

    def fake_run(name, *args, **kwargs):
        calls.append((name, kwargs["deadline"]))
        if name == "environment":
            return environment(90, (90,), (90,))
        raise KeyboardInterrupt  # stands for the kill during the second run

    monkeypatch.setattr(gpu_report, "run_section", fake_run)
    out = tmp_path / "report.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_report.check_plan("gpu", runs.PLANS["gpu"], str(tmp_path), str(out), budget=600)
    report = json.loads(out.read_text())
    assert {c["check"]: c["status"] for c in report["checks"]}["kernels"] == "pass"
    assert report["environment"]["gpus"][0]["name"] == "NVIDIA H200"
    assert [name for name, _ in calls] == ["environment", "first_kernel"]
    assert 0 < calls[0][1] - time.monotonic() <= 600  # the deadline: the budget from the start
