"""Times the gradient exchange of one dist_sync training iteration over ps-lite on this machine.

Every worker pushes one float32 gradient per trainable parameter of the configured network (shapes
inferred from its symbol; frozen parameters send nothing) and pulls the sum back, as Module does with
``default.kvstore dist_sync``, through tools/launch.py on 127.0.0.1. The volume per worker and
iteration is 2 x 4 bytes x the trainable parameters; over loopback the time is the software cost
(serialising, copying, summing on the servers) that a real network only adds to.

    python tools/benchmark_kvstore.py --cfg configs/faster/sniper_res101_e2e.yml [--set KEY VALUE ...]
        [--jobs 2x1,2x2] [--iterations 3]
"""
import _bootstrap  # repository root (_bootstrap.ROOT) on sys.path, the project's virtualenv
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from lib.benchmarking import markdown_table, measure
from lib.config import add_config_arguments, config_from_arguments
from lib.logger import report_user_errors

COCO_CLASSES = 81  # the class count when the config derives it from annotations (dataset.NUM_CLASSES 0)


def trainable_shapes(args):
    """(name, shape) of every parameter the optimizer updates, in the symbol's order."""
    from symbols import get_fixed_param_names, inference_symbol

    cfg = config_from_arguments(args)
    symbol = inference_symbol(cfg, cfg.dataset.NUM_CLASSES or COCO_CLASSES)
    shapes, _, _ = symbol.infer_shape_partial(data=(1, 3, cfg.TRAIN.CHIP_SIZE, cfg.TRAIN.CHIP_SIZE))
    fixed = set(get_fixed_param_names(symbol, cfg))
    inputs = {"data", "im_info", "im_ids", "chip_ids"}
    return [(name, shape) for name, shape in zip(symbol.list_arguments(), shapes)
            if name not in inputs and name not in fixed]


def run_worker(args):
    import mxnet as mx

    kvstore = mx.kv.create("dist_sync")
    shapes = trainable_shapes(args)
    names = [name for name, _ in shapes]
    grads = [mx.nd.ones(shape) / kvstore.num_workers for _, shape in shapes]
    kvstore.init(names, grads)

    def iteration():
        for index, (name, grad) in enumerate(zip(names, grads)):
            kvstore.pushpull(name, grad, priority=-index)
        mx.nd.waitall()

    timing = measure(iteration, repeat=args.iterations)
    print(json.dumps({"rank": kvstore.rank, "seconds": timing.seconds,
                      "parameters": int(sum(np.prod(shape) for _, shape in shapes))}), flush=True)


def run_job(args, workers, servers):
    """Median seconds per iteration over the workers, and the trainable parameter count."""
    command = [sys.executable, os.path.join(_bootstrap.ROOT, "tools", "launch.py"), "-n", str(workers), "-s",
               str(servers), "--env", "OMP_NUM_THREADS=1", "--", sys.executable, os.path.abspath(__file__), "--worker",
               "--cfg", os.path.abspath(args.cfg), "--iterations", str(args.iterations)] + (["--set", *args.set] if args.set else [])
    result = subprocess.run(command, cwd=_bootstrap.ROOT, capture_output=True, text=True, timeout=900)
    if result.returncode:
        sys.exit(f"job {workers}x{servers} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    reports = [json.loads(line.split("] ", 1)[1]) for line in result.stdout.splitlines() if '"seconds"' in line]
    return statistics.median(s for report in reports for s in report["seconds"]), reports[0]["parameters"]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="config YAML of the network, e.g. configs/faster/sniper_res101_e2e.yml")
    parser.add_argument("--jobs", default="2x1,2x2", help="WORKERSxSERVERS, comma-separated")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    config_from_arguments(args)  # a bad file, key or value stops here, before any job
    print(f"gradient exchange per dist_sync iteration, {args.cfg}, 127.0.0.1")
    rows = []
    for job in args.jobs.split(","):
        workers, servers = (int(part) for part in job.split("x"))
        seconds, parameters = run_job(args, workers, servers)
        megabytes = 2 * 4 * parameters / 1e6
        rows.append((workers, servers, parameters / 1e6, megabytes, seconds, megabytes / seconds))
    print(markdown_table(["workers", "servers", "params (M)", "MB/worker/iter", "s/iter", "MB/s/worker"], rows,
                         [None, None, ".1f", ".0f", ".2f", ".0f"]))


if __name__ == "__main__":
    main()
