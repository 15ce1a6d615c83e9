"""AutoFocus against full multi-scale inference at the same checkpoint: pixels processed per image, images/s
and COCO AP on the first ``--images`` images of the config's test set.

    python tools/benchmark_autofocus.py --cfg configs/faster/sniper_synthetic_tiny_autofocus.yml \
        [--set KEY VALUE ...] [--images 10] [--workers 0] [--checkpoint PATH] [--out DIR]

The config must enable AutoFocus (TEST.AUTO_FOCUS). "full" runs every level of TEST.SCALES on whole
images (Detector.run with the pyramid given: the plain SNIPER test path); "autofocus" runs
lib.inference.autofocus (the strategy TEST.AUTO_FOCUS picks). Pixels are counted at each level's resolution
(the reference's count: a chip's extent times the scale squared; whole images for "full"). Speed is the wall
time of one pass over the images after a warm-up pass on the first image (both modes), so it includes
decoding and merging.
Detections and COCO metrics go to ``--out`` (default ``{output}/{name}/autofocus_benchmark``).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

import mxnet as mx

from lib.atomic import write_json
from lib.benchmarking import markdown_table, measure
from lib.config import add_config_arguments, config_from_arguments
from lib.dataset import load_roidb
from lib.inference.autofocus import AutoFocusStats
from lib.inference.detector import Detector
from lib.evaluation.metrics import coco_results, evaluate_coco
from lib.inference.streaming import RoidbImages
from lib.logger import report_user_errors, setup_logging
from lib.run.checkpoint import checkpoint_file, output_dir


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.add_argument("--images", type=int, default=10, help="first N images of the test set (0: all)")
    parser.add_argument("--workers", type=int, default=0, help="pipeline worker processes (TEST.NUM_PROCESS)")
    parser.add_argument("--checkpoint", default=None, help="params file (default: TEST.MODEL or TEST_EPOCH)")
    parser.add_argument("--out", default=None, help="results folder")
    args = parser.parse_args()
    cfg = config_from_arguments(args)
    if not cfg.TEST.AUTO_FOCUS:
        sys.exit(f"{args.cfg}: TEST.AUTO_FOCUS is false; this benchmark compares AutoFocus with full inference")
    if args.images < 0 or args.workers < 0:
        sys.exit("--images and --workers must be >= 0")
    setup_logging()
    roidb, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    roidb = roidb[:args.images] if args.images else roidb
    if dataset.kind != "coco":
        sys.exit(f"{args.cfg}: the benchmark scores COCO-format sets (dataset.dataset coco or synthetic)")
    detector = Detector.from_config(cfg, args.checkpoint or checkpoint_file(cfg), dataset.classes)
    out = args.out or os.path.join(output_dir(cfg), "autofocus_benchmark")
    source = RoidbImages(roidb)
    sizes = source.sizes()
    image_ids = [entry["id"] for entry in roidb]

    stats = AutoFocusStats()
    modes = {"full": lambda src: detector.run(src, levels=detector.levels, num_workers=args.workers),
             "autofocus": lambda src: detector.strategy.run(src, args.workers, stats=stats)}
    for run in modes.values():  # warm-up: the network's first passes at every level
        dict(run(RoidbImages(roidb[:1])))
    stats.levels.clear()

    full_pixels = sum(h * w * level.spec.image_scale(h, w) ** 2 for h, w in sizes for level in detector.levels)
    rows = []
    for name, run in modes.items():
        timing = measure(lambda: dict(run(source)), repeat=1, warmup=0)
        mx.nd.waitall()
        found = timing.result
        detections = [found[i] for i in range(len(roidb))]
        path = os.path.join(out, name, "detections.json")
        write_json(coco_results(detections, image_ids, dataset.category_ids), path)
        metrics = evaluate_coco(dataset.coco, path, os.path.join(out, name), image_ids=image_ids)
        pixels = stats.pixels if name == "autofocus" else full_pixels
        rows.append([name, pixels / len(roidb) / 1e6, 100.0 * pixels / full_pixels, len(roidb) / timing.median,
                     metrics["AP"], metrics["AP50"], metrics["APs"]])
    print(f"{len(roidb)} images of {cfg.dataset.test_image_set}, {detector.source}, scales {list(cfg.TEST.SCALES)}, "
          f"{args.workers} pipeline workers, contexts {detector.contexts}")
    print(markdown_table(["inference", "Mpixels / image", "% of full", "images/s", "AP", "AP50", "AP small"], rows,
                         [None, ".2f", ".1f", ".3f", ".3f", ".3f", ".3f"]))
    print()
    level_rows = [[number, str(cfg.TEST.SCALES[number]), s.regions, s.pixels / len(roidb) / 1e6,
                   100.0 * s.pixels / s.full_pixels]
                  for number, s in enumerate(stats.levels)]
    print(markdown_table(["level", "scale", "regions", "Mpixels / image", "% of whole images"], level_rows,
                         [None, None, None, ".2f", ".1f"]))


if __name__ == "__main__":
    main()
