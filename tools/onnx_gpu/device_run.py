"""The device side of tools/onnx_gpu_prep.sh: make the weights of the ONNX model folders from a seed
(tools/onnx_gpu_model.py left them out) and time the three-scale test on ONNX Runtime (CUDA or CPU provider),
float32 and float16, end to end (with the host pipeline: resizing, proposals, merging) and in the network
alone. Runs on a bare Python with NumPy, OpenCV and onnxruntime(-gpu) (no MXNet, no virtualenv: no
tools/_bootstrap), from the repository root:

    python tools/onnx_gpu/device_run.py --model DIR --provider cuda --out RESULT.json [--images 8] [--seconds 300]

``DIR`` holds one folder per precision (float32, float16); each gets an equal share of ``--seconds``.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lib.benchmarking import smooth_images  # noqa: E402  (the repository on sys.path first)
from lib.inference.detector import Detector  # noqa: E402

PROVIDERS = {"cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"), "cpu": ("CPUExecutionProvider",)}


PRECISIONS = ("float32", "float16")  # tools/onnx_gpu_model.py's folders


def make_weights(folder, seed):
    """Write each graph's ``<graph>-weights.bin`` from weights.json: Gaussian weights of variance 1 / fan-in,
    ones, zeros or a constant, of the entry's type, as its entries say, from one NumPy generator seeded
    ``seed``."""
    rng = np.random.default_rng(seed)
    with open(os.path.join(folder, "weights.json")) as f:
        places = json.load(f)
    for key, entries in places.items():
        blob = bytearray(sum(entry["length"] for entry in entries))
        for entry in entries:
            shape, kind = entry["shape"], entry["kind"]
            if kind == "gauss":
                value = rng.normal(0, np.sqrt(1.0 / max(1, int(np.prod(shape[1:])))), shape)
            elif kind == "ones":
                value = np.ones(shape)
            elif kind == "zeros":
                value = np.zeros(shape)
            else:
                value = np.full(shape, float(kind))
            raw = value.astype(entry.get("dtype", "float32")).tobytes()
            if len(raw) != entry["length"]:
                raise ValueError(f"{entry['name']}: {len(raw)} bytes made, weights.json says {entry['length']}")
            blob[entry["offset"]:entry["offset"] + len(raw)] = raw
        with open(os.path.join(folder, f"{key}-weights.bin"), "wb") as f:
            f.write(blob)


def time_precision(folder, providers, images, runs, seconds):
    """The timing of one model folder: a warm-up, then up to ``runs`` timed runs of the test of ``images``
    while ``seconds`` last; its result entry."""
    started = time.perf_counter()
    detector = Detector.from_onnx(folder, providers=providers)
    network = detector.network
    network_seconds = [0.0]
    forward = network.forward

    def timed_forward(data, im_info):
        begin = time.perf_counter()
        try:
            return forward(data, im_info)
        finally:
            network_seconds[0] += time.perf_counter() - begin

    network.forward = timed_forward
    detector.detect(images[:1])  # warm-up: sessions, CUDA kernels
    timed = []
    for _ in range(runs):
        if time.perf_counter() - started > seconds:
            break
        network_seconds[0] = 0.0
        begin = time.perf_counter()
        found = detector.detect(images)
        timed.append((time.perf_counter() - begin, network_seconds[0], sum(len(d) for d in found)))
    result = {"precision": network.description.get("precision", "float32"),
              "session_providers": network.sessions["body"].get_providers(),
              "symbol": detector.cfg.symbol, "scales": [list(s) if isinstance(s, (list, tuple)) else s
                                                        for s in detector.cfg.TEST.SCALES],
              "runs": [{"seconds": s, "network_seconds": n, "detections": d} for s, n, d in timed]}
    if timed:
        whole, alone = sorted(r[0] for r in timed)[len(timed) // 2], sorted(r[1] for r in timed)[len(timed) // 2]
        result.update(images_per_s=len(images) / whole, network_images_per_s=len(images) / alone)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the folder tools/onnx_gpu_model.py wrote")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cuda")
    parser.add_argument("--images", type=int, default=8, help="images per timed run")
    parser.add_argument("--image_size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--runs", type=int, default=3, help="timed runs after a warm-up (median reported)")
    parser.add_argument("--seconds", type=float, default=300, help="stop starting runs after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the JSON result")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import onnxruntime

    if args.provider == "cuda":
        onnxruntime.preload_dlls()  # the CUDA 13 / cuDNN libraries of the Python's nvidia pip packages (PyTorch's)
    images = smooth_images(args.images, *args.image_size)
    result = {"provider": args.provider, "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0],
              "numpy": np.__version__, "images": args.images, "image_size": args.image_size, "precisions": []}
    for number, precision in enumerate(PRECISIONS):
        folder = os.path.join(args.model, precision)
        make_weights(folder, args.seed)
        share = (args.seconds - (time.perf_counter() - started)) / (len(PRECISIONS) - number)
        result["precisions"].append(time_precision(folder, PROVIDERS[args.provider], images, args.runs, share))
        with open(args.out, "w") as f:  # what is done so far, should the next precision run out of time
            json.dump(result, f, indent=1)
    print(json.dumps(result))

if __name__ == "__main__":
    main()
