"""Instance masks at test time: the tester's time and peak memory with and without the mask pass, each in a
process of its own.

    python tools/benchmark_masks.py [--cfg configs/faster/sniper_synthetic_tiny_mask.yml] [--images 4] \
        [--set KEY VALUE ...] [--out output/mask_benchmark]

A randomly initialised checkpoint of the config's mask network (N(0, 0.01) weights, seed 0; random weights
give the most detections, MAX_PER_IMAGE per image, hence the most masks) is written to ``{out}/random.params``
and tested with ``lib.inference.tester.test`` on ``--images`` synthetic images (a set of that many val
images, ``dataset.synthetic_train 1``, in ``{out}/data``), once per row in a child process: "boxes" (the
Detector's mask head dropped: the detection test alone) and "masks" (the mask pass too, segm AP). A child
reports the test's seconds end to end and its own peak resident memory (``lib.benchmarking.peak_rss_bytes``,
VmHWM: the model, the canvases and the pipeline's buffers; the workers are processes of their own). The
child uses only ``tester.test``, ``Detector.from_config`` and ``Detector.mask_head``, so the tool measures
earlier commits too (a copy of it in their tree).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os
import subprocess
import sys
import time

from lib.benchmarking import markdown_table, peak_rss_bytes
from lib.config import add_config_arguments, config_from_arguments
from lib.logger import report_user_errors

DEFAULT_CFG = "configs/faster/sniper_synthetic_tiny_mask.yml"
ROWS = ("boxes", "masks")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser, f"YAML config of a mask network (default {DEFAULT_CFG})", required=False)
    parser.add_argument("--images", type=int, default=4, help="synthetic test images")
    parser.add_argument("--out", default="output/mask_benchmark")
    parser.add_argument("--row", choices=ROWS, help=argparse.SUPPRESS)  # one row, in a child process
    args = parser.parse_args(argv)
    args.cfg = args.cfg or DEFAULT_CFG
    return args


def config(args):
    out = os.path.abspath(args.out)
    return config_from_arguments(args, [("dataset.dataset_path", os.path.join(out, "data")),
                                        ("dataset.synthetic_train", 1), ("dataset.synthetic_val", args.images),
                                        ("dataset.root_path", out), ("output_path", os.path.join(out, "runs")),
                                        ("TEST.MODEL", os.path.join(out, "random.params"))])


def random_checkpoint(cfg, num_classes, path, seed=0):
    """The test and mask graphs' parameters, N(0, 0.01) weights (zero offsets), unit gammas and variances."""
    import mxnet as mx
    import numpy as np

    from symbols import inference_symbol
    from symbols.backbones import feature_stride
    from symbols.sniper import mask_inference_symbol

    stride = feature_stride(cfg)
    graphs = [(inference_symbol(cfg, num_classes), dict(data=(1, 3, stride, stride), im_info=(1, 3), im_ids=(1,),
                                                        chip_ids=(1,))),
              (mask_inference_symbol(cfg, num_classes), dict(data=(1, 3, stride, stride), mask_rois=(1, 5)))]
    rng, blob = np.random.RandomState(seed), {}
    for symbol, inputs in graphs:
        arg_shapes, _, aux_shapes = symbol.infer_shape(**inputs)
        for name, shape in zip(symbol.list_arguments(), arg_shapes):
            if name not in inputs:
                random = name.endswith("weight") and "offset" not in name
                value = rng.normal(0, 0.01, shape) if random else np.full(shape, float(name.endswith("gamma")))
                blob.setdefault(f"arg:{name}", mx.nd.array(value))
        for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes):
            blob.setdefault(f"aux:{name}", mx.nd.array(np.full(shape, float(name.endswith("var")))))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mx.nd.save(path, blob)


def run_row(args):
    """One row in this process; prints its figures as JSON."""
    from lib.dataset import load_roidb
    from lib.inference import tester
    from lib.inference.detector import Detector

    cfg = config(args)
    _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    detector = Detector.from_config(cfg, cfg.TEST.MODEL, dataset.classes)
    if args.row == "boxes":
        detector.mask_head = None
    start = time.perf_counter()
    summary = tester.test(cfg, detector=detector, out_dir=os.path.join(args.out, args.row))
    seconds = time.perf_counter() - start
    stats = summary.get("stats", {})
    print(json.dumps({"row": args.row, "images": summary["tested"], "seconds": seconds,
                      "peak_mb": peak_rss_bytes() / 2 ** 20, "segm": "segm" in stats}))


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    args = parse_args()
    if args.row:
        return run_row(args)
    from lib.dataset import load_roidb

    cfg = config(args)
    _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)  # generates the images once
    random_checkpoint(cfg, len(dataset.classes), cfg.TEST.MODEL)
    rows = []
    for row in ROWS:
        child = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--row", row]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{row} failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append([row, figures["images"], figures["seconds"], figures["peak_mb"],
                     "yes" if figures["segm"] else "no"])
    print(f"{args.cfg}, {args.images} synthetic images, random weights")
    print(markdown_table(["test", "images", "seconds", "peak RSS MB", "segm AP"], rows,
                         [None, "d", ".1f", ".0f", None]))


if __name__ == "__main__":
    main()
