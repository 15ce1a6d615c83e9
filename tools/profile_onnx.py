"""Where an ONNX export's forward pass spends its time on ONNX Runtime (SessionOptions.enable_profiling):

    python tools/profile_onnx.py --model EXPORT_DIR [--canvas 800 1067] [--batch 1] [--rois 300] [--runs 2]
    python tools/profile_onnx.py --model EXPORT_DIR --optimization none basic all --threads 1 2

runs ``body.onnx`` on a random canvas batch and ``head.onnx`` on its features with ``--rois`` random boxes per
image (proposal-sized: 8 to 400 pixels a side), ``--runs`` times after a warm-up, for every combination of
``--optimization`` (ONNX Runtime's graph optimisation level) and ``--threads`` (intra-op threads), and prints
per combination the wall time of each graph and, per graph, the operator types by their summed kernel time
(ONNX Runtime's profile, averaged over the runs). Works on float32 and int8 (``--quantize int8``) exports.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np

from lib.inference.onnx_network import OPTIMIZATION_LEVELS, import_onnxruntime, read_description, session_options
from lib.logger import report_user_errors


def random_inputs(batch, height, width, rois, seed=0):
    """(pixels (B, 3, H, W) as the test feeds them: mean-subtracted, (B, R, 4) boxes inside the canvas)."""
    rng = np.random.default_rng(seed)
    pixels = rng.uniform(-120, 135, (batch, 3, height, width)).astype(np.float32)
    sides = np.exp(rng.uniform(np.log(8), np.log(400), (batch, rois, 2)))
    corner = rng.uniform(0, 1, (batch, rois, 2)) * (np.array([width, height]) - sides).clip(min=0)
    boxes = np.concatenate([corner, np.minimum(corner + sides, [width - 1, height - 1])], axis=2)
    return pixels, boxes.astype(np.float32)


def profiled_session(ort, path, level, threads, folder):
    options = session_options(ort, threads, level)
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(folder, os.path.basename(path))
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def kernel_times(session):
    """{operator type: kernel ms per run} from the session's profile, the first (warm-up) run left out."""
    with open(session.end_profiling()) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    warmed = runs[0]["ts"] + runs[0]["dur"]
    per_type = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time") and event["ts"] >= warmed:
            per_type[event["args"]["op_name"]] += event["dur"] / 1000.0
    return {op: total / (len(runs) - 1) for op, total in per_type.items()}


def profile(directory, level, threads, pixels, boxes, runs):
    """({graph: wall ms per run}, {graph: {op type: kernel ms per run}}) of one setting."""
    ort = import_onnxruntime()
    description = read_description(directory)
    with tempfile.TemporaryDirectory() as folder:
        body, head = (profiled_session(ort, os.path.join(directory, description["graphs"][key]), level, threads,
                                       folder) for key in ("body", "head"))
        wall = {"body": [], "head": []}
        for _ in range(runs + 1):
            start = time.perf_counter()
            features = dict(zip([o.name for o in body.get_outputs()], body.run(None, {"data": pixels})))["features"]
            middle = time.perf_counter()
            head.run(None, {"features": features, "rois": boxes})
            wall["body"].append(middle - start)
            wall["head"].append(time.perf_counter() - middle)
        kernels = {"body": kernel_times(body), "head": kernel_times(head)}
    return {key: 1000 * float(np.median(times[1:])) for key, times in wall.items()}, kernels


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an ONNX export folder (tools/export_model.py --format onnx)")
    parser.add_argument("--canvas", type=int, nargs=2, default=[800, 1067], metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1, help="images per canvas batch")
    parser.add_argument("--rois", type=int, default=300, help="boxes per image for the head (TEST.RPN_POST_NMS_TOP_N)")
    parser.add_argument("--runs", type=int, default=2, help="timed runs after a warm-up (median wall time)")
    parser.add_argument("--optimization", nargs="+", choices=OPTIMIZATION_LEVELS, default=["all"])
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="intra-op threads (0: ONNX Runtime's)")
    parser.add_argument("--top", type=int, default=8, help="operator types listed per graph")
    args = parser.parse_args(argv)
    pixels, boxes = random_inputs(args.batch, *args.canvas, args.rois)
    quantized = (read_description(args.model).get("quantization") or {}).get("body", "float32")
    print(f"{args.model} (body {quantized}), canvas {args.batch}x3x{args.canvas[0]}x{args.canvas[1]}, {args.rois} "
          f"rois per image, median of {args.runs} runs after a warm-up, load average {os.getloadavg()[0]:.1f}")
    for level in args.optimization:
        for threads in args.threads:
            wall, kernels = profile(args.model, level, threads, pixels, boxes, args.runs)
            print(f"\noptimization {level}, {threads} threads: body {wall['body']:.0f} ms, head {wall['head']:.0f} ms")
            print("| graph | operator | kernel ms | % of the graph's kernels |\n|---|---|---:|---:|")
            for graph, per_type in kernels.items():
                total = sum(per_type.values()) or 1.0
                for op, ms in sorted(per_type.items(), key=lambda item: -item[1])[:args.top]:
                    print(f"| {graph} | {op} | {ms:.1f} | {100 * ms / total:.1f} |")


if __name__ == "__main__":
    main()
