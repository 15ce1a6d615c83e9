"""Times the gradient exchange of one dist_sync training iteration over ps-lite on this machine.

Every worker pushes one float32 gradient per trainable parameter of the configured network (shapes
inferred from its symbol; frozen parameters send nothing) and pulls the sum back, as Module does with
``default.kvstore dist_sync``, through tools/launch.py on 127.0.0.1. The volume per worker and
iteration is 2 x 4 bytes x the trainable parameters; over loopback the time is the software cost
(serialising, copying, summing on the servers) that a real network only adds to.

    .venv/bin/python tools/benchmark_kvstore.py [--cfg configs/faster/sniper_res101_e2e.yml]
        [--jobs 2x1,2x2] [--iterations 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def trainable_shapes(cfg_path):
    """(name, shape) of every parameter the optimizer updates, in the symbol's order."""
    from lib.config import load_config
    from symbols import get_fixed_param_names, get_symbol

    cfg = load_config(cfg_path)
    cfg.dataset.NUM_CLASSES = cfg.dataset.NUM_CLASSES or 81
    symbol = get_symbol(cfg, is_train=False)
    shapes, _, _ = symbol.infer_shape_partial(data=(1, 3, cfg.TRAIN.CHIP_SIZE, cfg.TRAIN.CHIP_SIZE))
    fixed = set(get_fixed_param_names(symbol, cfg))
    inputs = {"data", "im_info", "im_ids", "chip_ids"}
    return [(name, shape) for name, shape in zip(symbol.list_arguments(), shapes)
            if name not in inputs and name not in fixed]


def run_worker(cfg_path, iterations):
    import mxnet as mx

    kvstore = mx.kv.create("dist_sync")
    shapes = trainable_shapes(cfg_path)
    names = [name for name, _ in shapes]
    grads = [mx.nd.ones(shape) / kvstore.num_workers for _, shape in shapes]
    kvstore.init(names, grads)
    seconds = []
    for _ in range(iterations + 1):  # the first one warms up
        tic = time.perf_counter()
        for index, (name, grad) in enumerate(zip(names, grads)):
            kvstore.pushpull(name, grad, priority=-index)
        mx.nd.waitall()
        seconds.append(time.perf_counter() - tic)
    print(json.dumps({"rank": kvstore.rank, "seconds": seconds[1:],
                      "parameters": int(sum(np.prod(shape) for _, shape in shapes))}), flush=True)


def run_job(cfg_path, workers, servers, iterations):
    """Median seconds per iteration over the workers, and the trainable parameter count."""
    command = [sys.executable, os.path.join(ROOT, "tools", "launch.py"), "-n", str(workers), "-s", str(servers),
               "--env", "OMP_NUM_THREADS=1", "--", sys.executable, os.path.abspath(__file__), "--worker",
               "--cfg", cfg_path, "--iterations", str(iterations)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if result.returncode:
        sys.exit(f"job {workers}x{servers} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    reports = [json.loads(line.split("] ", 1)[1]) for line in result.stdout.splitlines() if '"seconds"' in line]
    return statistics.median(s for report in reports for s in report["seconds"]), reports[0]["parameters"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", default="configs/faster/sniper_res101_e2e.yml")
    parser.add_argument("--jobs", default="2x1,2x2", help="WORKERSxSERVERS, comma-separated")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.cfg, args.iterations)
        return
    print(f"gradient exchange per dist_sync iteration, {args.cfg}, 127.0.0.1")
    print(f"{'workers':>7} {'servers':>7} {'params (M)':>10} {'MB/worker/iter':>15} {'s/iter':>7} {'MB/s/worker':>11}")
    for job in args.jobs.split(","):
        workers, servers = (int(part) for part in job.split("x"))
        seconds, parameters = run_job(args.cfg, workers, servers, args.iterations)
        megabytes = 2 * 4 * parameters / 1e6
        print(f"{workers:>7} {servers:>7} {parameters / 1e6:>10.1f} {megabytes:>15.0f} {seconds:>7.2f} "
              f"{megabytes / seconds:>11.0f}")


if __name__ == "__main__":
    main()
