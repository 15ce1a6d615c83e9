"""The GPU check's driver: runs each part in a child process with a time limit, judges the results
against the tolerances below (docs/gpu.md says why these), and writes the JSON and Markdown report.
"""
import json
import os
import signal
import subprocess
import sys
import time

from lib.benchmarking import markdown_table
from lib.bootstrap import ROOT

TOOL = os.path.join(ROOT, "tools", "gpu_check.py")
FP16_FIRST_TOLERANCE = 0.02
FP16_MEAN_TOLERANCE = 0.10
GRADIENT_TOLERANCE = 1e-3
# the checks after the environment's, in report order
GPU_RUNS = ("first_kernel", "proposal_target", "train_fp32", "train_fp16", "fp16_vs_fp32", "gradients", "inference")


def run_section(name, plan, workdir, precision=None, deadline=None):
    """Run section ``name`` in a child process; its result dict, or ``{"error": ...}``. The child is stopped
    at the plan's time limit for the section or at ``deadline`` (``time.monotonic()``), whichever comes first."""
    arguments = ["--precision", precision] if precision else []
    tag = f"{name}_{precision}" if precision else name
    result_path = os.path.join(workdir, f"{tag}.json")
    log_path = os.path.join(workdir, f"{tag}.log")
    if os.path.exists(result_path):
        os.remove(result_path)
    command = [sys.executable, TOOL, "--section", name, "--plan", json.dumps(plan),
               "--workdir", workdir, "--result", result_path, *arguments]
    limit = plan["timeouts"][name]
    if deadline is not None:
        limit = round(max(1.0, min(limit, deadline - time.monotonic())), 1)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        # its own process group, so that a run past its time is stopped with its data-loader workers
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            code = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = "timeout"
    seconds = round(time.perf_counter() - start, 1)
    if code == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            return dict(json.load(f), seconds=seconds)
    with open(log_path) as f:
        tail = f.read().strip().splitlines()[-12:]
    reason = f"timed out after {limit:g} s" if code == "timeout" else f"exit code {code}"
    return {"error": f"{reason}; log {log_path}", "log_tail": tail, "seconds": seconds}


class Report:
    def __init__(self, plan_name):
        self.plan, self.checks, self.results = plan_name, [], {}

    def check(self, name, status, detail):
        self.checks.append({"check": name, "status": status, "detail": detail})

    def skip_unreported(self, names, reason):
        reported = {c["check"] for c in self.checks}
        for name in names:
            if name not in reported:
                self.check(name, "skip", reason)

    def failed(self):
        return [c["check"] for c in self.checks if c["status"] == "fail"]


def judge_environment(report, env, plan):
    """The environment's checks; True when MXNet can run the remaining sections on the plan's device."""
    if "error" in env:
        report.check("mxnet", "fail", f"environment run failed: {env['error']} {' | '.join(env['log_tail'][-3:])}")
        return False
    if "import_error" in env:
        report.check("mxnet", "fail", f"import mxnet failed: {env['import_error']}")
    else:
        features = env["features"]
        usable = plan["device"] != "gpu" or (features["CUDA"] and features["CUDNN"])
        report.check("mxnet", "pass" if usable else "fail",
                     f"MXNet {env['mxnet']} on Python {env['python']}, numpy {env['numpy']}; "
                     + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in features.items()))
    if plan["device"] != "gpu":
        report.check("gpus", "skip", f"CPU plan; the driver reports {len(env['gpus'])} GPU(s)")
        return "import_error" not in env
    gpus, archs = env["gpus"], env["libmxnet_archs"]
    report.check("gpus", "pass" if gpus else "fail", "; ".join(
        f"gpu{g['index']} {g['name']} sm_{g['compute_capability']} {g['memory_gib']} GiB (driver {g['driver']})"
        for g in gpus) + (f"; MXNet sees {env['mxnet_gpus']}" if "mxnet_gpus" in env else "")
        if gpus else "no GPU found by the CUDA driver (libcuda.so.1)")
    inventory = (f"libmxnet.so: SASS {', '.join(f'sm_{a}' for a in archs['sass']) or 'none'}; PTX "
                 f"{', '.join(f'compute_{a}' for a in archs['ptx']) or 'none'}")
    if not gpus:
        report.check("kernels", "skip", f"{inventory}; no GPU to run them")
        return False
    kernels = gpus[0]["kernels"]
    report.check("kernels", {"sass": "pass", "ptx-jit": "warn", "none": "fail"}[kernels],
                 f"{inventory}; gpu0 sm_{gpus[0]['compute_capability']} "
                 + {"sass": "runs its machine code", "ptx-jit": "runs only through the driver's PTX JIT (slow start)",
                    "none": "can run none of its kernels"}[kernels])
    if "import_error" in env:
        return False
    registered = env["ops_registered"].get("MultiProposalTarget", {}).get("forward", [])
    report.check("ops_gpu", "pass" if "gpu" in registered else "fail",
                 f"{env['ops_library']} registers MultiProposalTarget forward on {', '.join(registered)}")
    return kernels != "none" and env["mxnet_gpus"] > 0 and env["features"]["CUDA"]


def judge_training(report, runs):
    for precision, run in runs.items():
        name = f"train_{precision}"
        if "error" in run:
            report.check(name, "fail", f"{run['error']} {' | '.join(run['log_tail'][-3:])}")
            continue
        totals = [sum(step.values()) for step in run["losses"]]
        finite = all(map(_finite, totals))
        cycle = run["distinct_batches"]
        first, last = totals[:cycle], totals[-cycle:]
        falling = finite and len(totals) >= 2 * cycle and sum(last) / len(last) < sum(first) / len(first)
        report.check(name, "pass" if finite and falling else "fail",
                     f"summed loss {_mean(first):.4f} (first pass over the {cycle} batches) -> {_mean(last):.4f} "
                     f"(last); {run['chips_per_second']} chips/s, peak memory {run['peak_memory_mib']} MiB"
                     + ("" if finite else "; NON-FINITE losses"))
    if set(runs) != {"fp16", "fp32"} or any("error" in r for r in runs.values()):
        report.check("fp16_vs_fp32", "skip" if "fp16" not in runs else "fail",
                     "fp16 runs on GPUs only" if "fp16" not in runs else "a run failed")
        return
    half, full = ([sum(s.values()) for s in runs[p]["losses"]] for p in ("fp16", "fp32"))
    first = abs(half[0] - full[0]) / abs(full[0])
    mean = _mean([abs(a - b) for a, b in zip(half, full)]) / abs(_mean(full))
    close = first <= FP16_FIRST_TOLERANCE and mean <= FP16_MEAN_TOLERANCE
    report.check("fp16_vs_fp32", "pass" if close else "fail",
                 f"first iteration {100 * first:.2f} % apart (<= {100 * FP16_FIRST_TOLERANCE:.0f} %), mean absolute "
                 f"difference {100 * mean:.2f} % of fp32's mean loss (<= {100 * FP16_MEAN_TOLERANCE:.0f} %)")


def _finite(value):
    return value == value and abs(value) != float("inf")


def _mean(values):
    return sum(values) / len(values)


def check_plan(plan_name, plan, workdir, out, budget=None):
    """Every check of ``plan``; with ``budget`` (seconds) every run stops by then (a device lease's end), and
    the report so far is written before each run, so that a check stopped from outside still leaves one."""
    os.makedirs(workdir, exist_ok=True)
    report = Report(plan_name)
    deadline = time.monotonic() + budget if budget else None

    def run(*args):
        write_report(report, out)
        return run_section(*args, deadline=deadline)

    env = report.results["environment"] = run("environment", plan, workdir)
    runnable = judge_environment(report, env, plan)
    if not runnable:
        report.skip_unreported(GPU_RUNS, "not run: see the failed checks above")
        return finish(report, out)
    first = report.results["first_kernel"] = run("first_kernel", plan, workdir)
    ran = "error" not in first and first["value"] == 2 * 64 * 64
    report.check("first_kernel", "pass" if ran else "fail",
                 first.get("error", f"sum of 2 * ones(64, 64) = {first.get('value')}; {first.get('first_seconds')} s "
                                    f"for the first kernel (JIT compilation included), {first.get('second_seconds')} "
                                    f"s for the next"))
    if not ran:
        report.skip_unreported(GPU_RUNS, "not run: no kernel ran")
        return finish(report, out)
    target = report.results["proposal_target"] = run("proposal_target", plan, workdir)
    if "error" in target:
        report.check("proposal_target", "fail", target["error"])
    else:
        equal = not target["mismatched_outputs"]
        report.check("proposal_target", "pass" if equal else "fail",
                     f"{plan['device']} vs cpu: outputs {target['outputs']}, "
                     + ("identical" if equal else f"outputs {target['mismatched_outputs']} differ")
                     + f"; {target['foreground_rois']} foreground rois")
    runs = {p: run("train", plan, workdir, p) for p in plan["precisions"]}
    report.results["train"] = runs
    judge_training(report, runs)
    gradients = report.results["gradients"] = run_gradients(plan, env, workdir, run)
    if gradients is None:
        report.check("gradients", "skip", "needs 2 GPUs")
    elif "error" in gradients:
        report.check("gradients", "fail", gradients["error"])
    else:
        ok = gradients["max_relative_difference"] <= GRADIENT_TOLERANCE
        report.check("gradients", "pass" if ok else "fail",
                     f"{' + '.join(gradients['devices'])} vs {gradients['devices'][0]} alone: max relative difference "
                     f"{gradients['max_relative_difference']:.2e} ({gradients['worst_parameter']}) over "
                     f"{gradients['parameters']} parameters (<= {GRADIENT_TOLERANCE:g})")
    inference = {p: run("inference", plan, workdir, p) for p in plan["precisions"]}
    report.results["inference"] = inference
    errors = {p: r["error"] for p, r in inference.items() if "error" in r}
    report.check("inference", "fail" if errors else "pass",
                 "; ".join(f"{p}: {e}" for p, e in errors.items()) or
                 f"{sum(len(r['rows']) for r in inference.values())} timings (table below)")
    return finish(report, out)


def run_gradients(plan, env, workdir, run):
    if plan["device"] == "gpu" and len(env["gpus"]) < 2:
        return None
    return run("gradients", plan, workdir)


def write_report(report, out):
    result = {"plan": report.plan, "checks": report.checks, "failed": report.failed(), **report.results}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    return result


def finish(report, out):
    result = write_report(report, out)
    print(markdown(result))
    print(f"\nwrote {out}")
    return 1 if result["failed"] else 0


def markdown(result):
    parts = [f"## gpu_check ({result['plan']})",
             markdown_table(["check", "status", "detail"], [[c["check"], c["status"], c["detail"]]
                                                           for c in result["checks"]])]
    train = {p: r for p, r in result.get("train", {}).items() if "error" not in r}
    if train:
        parts.append(markdown_table(
            ["training", "chips/s", "peak memory (MiB)", "summed loss, first iteration", "last iteration"],
            [[f"{precision}, {run['chips']} chips", run["chips_per_second"], run["peak_memory_mib"],
              sum(run["losses"][0].values()), sum(run["losses"][-1].values())] for precision, run in train.items()],
            [None, ".2f", ".1f", ".4f", ".4f"]))
    rows = [row for r in result.get("inference", {}).values() if "rows" in r for row in r["rows"]]
    if rows:
        parts.append(markdown_table(
            ["scale", "precision", "TEST.BATCH_IMAGES", "images/s end to end", "images/s network only"],
            [[row["spec"], row["precision"], row["batch_images"], row["end_to_end_images_per_second"],
              row.get("network_images_per_second")] for row in rows], [None, None, None, ".2f", ".2f"]))
    return "\n\n".join(parts)
