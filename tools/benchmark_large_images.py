"""The test on very large images: whole images vs tiled (TEST.TILE) vs AutoFocus-tiled, side by side: COCO AP,
images/s, megapixels processed and peak resident memory, each mode in a process of its own.

    python tools/benchmark_large_images.py --cfg configs/faster/sniper_synthetic_tiny.yml [--checkpoint PATH] \
        [--focus-cfg configs/faster/sniper_synthetic_tiny_autofocus.yml [--focus-checkpoint PATH]] \
        [--sizes 8000x8000,12000x6000] [--objects-per-mp 2] [--tile 1536 336] [--scales 1.0 0.5 512] \
        [--whole-long-side 2000] \
        [--set KEY VALUE ...] [--out DIR]

The images (tiled BigTIFF, objects of 8-64 px on a sparse textured background) are generated once into
``{out}/data`` by lib.dataset.synthetic.generate_large_synthetic_coco, in a process of their own. "whole"
is the test without tiles at the one scale that fits in memory (the longer side at ``--whole-long-side``:
the full pyramid of a 10,000 px image is tens of GB of canvases); "tiled" is the model's test pyramid in
tiles; "autofocus-tiled" is ``--focus-cfg``'s AutoFocus test in tiles (skipped without one). Checkpoints:
``--checkpoint`` / ``--focus-checkpoint``, else the configs' ``TEST.MODEL`` or ``TEST_EPOCH``. ``--set``
applies to every mode (e.g. ``TEST.SCALES``). Pixels are counted at each level's resolution, tile overlaps
included. Speed is one pass, first network passes included; pipeline workers: none (TEST.NUM_PROCESS 0), so
the peak is one process's: each mode's own high-water mark (lib.benchmarking.peak_rss_bytes), measured in
the mode's process; this one only starts them and prints the table, so nothing it held counts in theirs.
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

MODES = ("whole", "tiled", "autofocus-tiled")
GENERATE = "generate"  # the child process that writes the image set


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.add_argument("--checkpoint", default=None, help="params file (default: TEST.MODEL or TEST_EPOCH)")
    parser.add_argument("--focus-cfg", default=None, help="config of an AutoFocus model (TEST.AUTO_FOCUS)")
    parser.add_argument("--focus-checkpoint", default=None, help="its params file")
    parser.add_argument("--sizes", default="8000x8000,12000x6000", help="HEIGHTxWIDTH of each image, comma separated")
    parser.add_argument("--objects-per-mp", type=float, default=2.0, help="objects per megapixel")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--tile", type=int, nargs=2, default=(1536, 336), metavar=("SIZE", "OVERLAP"))
    parser.add_argument("--scales", type=float, nargs="+", default=None,
                        help="the tiled pyramid, finest first (AutoFocus runs it coarsest first); default: the configs'")
    parser.add_argument("--whole-long-side", type=int, default=2000, help="the whole-image mode's one scale")
    parser.add_argument("--out", default="output/large_image_benchmark")
    parser.add_argument("--mode", choices=(GENERATE,) + MODES, help=argparse.SUPPRESS)  # a child process's part
    return parser.parse_args(argv)


def dataset_overrides(args):
    return [("dataset.dataset", "coco"), ("dataset.dataset_path", os.path.abspath(os.path.join(args.out, "data"))),
            ("dataset.test_image_set", "large"), ("TEST.NUM_PROCESS", 0)]


def mode_overrides(args):
    tile = ("TEST.TILE", list(args.tile))
    scales = [("TEST.SCALES", list(args.scales))] if args.scales else []
    focus_scales = [("TEST.SCALES", list(args.scales[::-1]))] if args.scales else []
    return {"whole": [("TEST.TILE", []), ("TEST.AUTO_FOCUS", False), ("TEST.SCALES", [float(args.whole_long_side)]),
                      ("TEST.VALID_RANGES", [[-1, -1]]), ("TEST.BATCH_IMAGES", 1)],
            "tiled": [tile, ("TEST.AUTO_FOCUS", False)] + scales,
            "autofocus-tiled": [tile] + focus_scales}


def run_mode(args):
    """One mode in this process; prints its figures as JSON."""
    from lib.dataset import load_roidb
    from lib.inference.autofocus import AutoFocusStats
    from lib.inference.detector import Detector
    from lib.evaluation.metrics import coco_results, evaluate_coco
    from lib.inference.streaming import RoidbImages

    focus = args.mode == "autofocus-tiled"
    if focus:
        args.cfg = args.focus_cfg
    cfg = config_from_arguments(args, dataset_overrides(args) + mode_overrides(args)[args.mode])
    roidb, dataset = load_roidb(cfg, "large", training=False)
    detector = Detector.from_config(cfg, args.focus_checkpoint if focus else args.checkpoint, dataset.classes)
    source = RoidbImages(roidb)
    sizes = source.sizes()
    start = time.perf_counter()
    if args.mode == "whole":
        found = dict(detector.run(source))
        pixels = sum(h * w * level.spec.image_scale(h, w) ** 2 for h, w in sizes for level in detector.levels)
    elif args.mode == "tiled":
        stats = []
        found = dict(detector.strategy.run(source, 0, stats=stats))  # the mode's TEST.TILE: Tiles
        pixels = sum(p for _, p in stats)
    else:
        stats = AutoFocusStats()
        found = dict(detector.strategy.run(source, 0, stats=stats))  # TEST.AUTO_FOCUS: AutoFocus
        pixels = stats.pixels
    seconds = time.perf_counter() - start
    out = os.path.join(args.out, args.mode)
    image_ids = [entry["id"] for entry in roidb]
    path = os.path.join(out, "detections.json")
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(coco_results([found[i] for i in range(len(roidb))], image_ids, dataset.category_ids), f)
    metrics = evaluate_coco(dataset.coco, path, out, image_ids=image_ids)
    print(json.dumps({"mode": args.mode, "scales": list(cfg.TEST.SCALES), "images": len(roidb), "seconds": seconds,
                      "mpixels": pixels / 1e6, "peak_mb": peak_rss_bytes() / 2 ** 20,
                      "AP": metrics["AP"], "AP50": metrics["AP50"], "APs": metrics["APs"]}))


def image_sizes(args):
    return [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]


def generate(args):
    """Write the image set (in a child process: the parent never holds an image)."""
    from lib.dataset.synthetic import generate_large_synthetic_coco

    generate_large_synthetic_coco(os.path.join(args.out, "data"), image_sizes(args), args.objects_per_mp, args.seed)


def run_child(mode):
    """This tool with the same arguments and ``--mode mode`` in a process of its own; its last output line."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--mode", mode],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return (done.stdout.strip().splitlines() or [""])[-1]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    args = parse_args()
    if args.mode == GENERATE:
        return generate(args)
    if args.mode:
        return run_mode(args)
    sizes, data = image_sizes(args), os.path.join(args.out, "data")
    if not os.path.isfile(os.path.join(data, "annotations", "instances_large.json")):
        print(f"generating {len(sizes)} large images in {data}", flush=True)
        run_child(GENERATE)
    rows = []
    for mode in MODES:
        if mode == "autofocus-tiled" and not args.focus_cfg:
            continue
        figures = json.loads(run_child(mode))
        rows.append([mode, str(figures["scales"]), figures["mpixels"] / figures["images"],
                     figures["images"] / figures["seconds"], figures["peak_mb"], figures["AP"], figures["AP50"],
                     figures["APs"]])
    print(f"{len(sizes)} images {args.sizes}, {args.objects_per_mp} objects/MP of 8-64 px, tile {list(args.tile)}")
    print(markdown_table(["test", "scales", "Mpixels / image", "images/s", "peak RSS MB", "AP", "AP50", "AP small"],
                         rows, [None, None, ".1f", ".4f", ".0f", ".3f", ".3f", ".3f"]))


if __name__ == "__main__":
    main()
