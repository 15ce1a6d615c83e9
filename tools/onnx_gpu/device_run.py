"""The device side of tools/onnx_gpu_prep.sh: make an ONNX model folder's weights from a seed
(tools/onnx_gpu_model.py left them out) and time the three-scale test on ONNX Runtime (CUDA or CPU
provider), end to end and in the network alone. Runs on a bare Python with NumPy, OpenCV and onnxruntime(-gpu)
(no MXNet, no virtualenv: no tools/_bootstrap), from the repository root:

    python tools/onnx_gpu/device_run.py --model DIR --provider cuda --out RESULT.json [--images 8] [--seconds 300]
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


def make_weights(folder, seed):
    """Write each graph's ``<graph>-weights.bin`` from weights.json: Gaussian weights of variance 1 / fan-in,
    ones, zeros or a constant, as its entries say, from one NumPy generator seeded ``seed``."""
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
            raw = value.astype(np.float32).tobytes()
            if len(raw) != entry["length"]:
                raise ValueError(f"{entry['name']}: {len(raw)} bytes made, weights.json says {entry['length']}")
            blob[entry["offset"]:entry["offset"] + len(raw)] = raw
        with open(os.path.join(folder, f"{key}-weights.bin"), "wb") as f:
            f.write(blob)


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
    make_weights(args.model, args.seed)
    if args.provider == "cuda":
        import onnxruntime

        onnxruntime.preload_dlls()  # the CUDA 13 / cuDNN libraries of the Python's nvidia pip packages (PyTorch's)
    detector = Detector.from_onnx(args.model, providers=PROVIDERS[args.provider])
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
    images = smooth_images(args.images, *args.image_size)
    detector.detect(images[:1])  # warm-up: sessions, CUDA kernels
    runs = []
    for _ in range(args.runs):
        if time.perf_counter() - started > args.seconds:
            break
        network_seconds[0] = 0.0
        begin = time.perf_counter()
        found = detector.detect(images)
        runs.append((time.perf_counter() - begin, network_seconds[0], sum(len(d) for d in found)))
    import onnxruntime

    result = {"provider": args.provider, "session_providers": network.sessions["body"].get_providers(),
              "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0], "numpy": np.__version__,
              "symbol": detector.cfg.symbol, "scales": [list(s) if isinstance(s, (list, tuple)) else s
                                                        for s in detector.cfg.TEST.SCALES],
              "images": args.images, "image_size": args.image_size, "precision": "float32",
              "runs": [{"seconds": s, "network_seconds": n, "detections": d} for s, n, d in runs]}
    if runs:
        whole, alone = sorted(r[0] for r in runs)[len(runs) // 2], sorted(r[1] for r in runs)[len(runs) // 2]
        result.update(images_per_s=args.images / whole, network_images_per_s=args.images / alone)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
