"""Final detections with MXNet's stock deformable operators against lib/ops' compiled CPU ones, same weights.

    python tools/compare_deformable_ops.py --model RUN_FOLDER | --cfg FILE [--set KEY VALUE ...] [--images 8]
                                          [--image_size H W] [--seed 0]

Two Detectors on the CPU, ``network.CPU_DEFORMABLE_OPS`` ``stock`` (MXNet's operators, as the reference
network) and ``compiled`` (lib/ops' multi-core kernels, the default), with the same weights (the checkpoint's
when it exists, else random: tools/benchmark_inference.py's ``load_detectors``), test the same random images
of smooth content, batched as the config batches a test set (``TEST.BATCH_IMAGES`` images share a canvas).
The table counts the stock run's final detections the compiled run reproduces (label, box within 0.01 px,
score within 1e-4, each used once) and the images whose detections all agree. The kernels sum in another
order than MXNet's, so outputs differ in their last bits; through NMS and soft-NMS such a difference can
keep another box (docs/reference_differences.md, "Deformable operators on the CPU").
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import numpy as np

from benchmark_inference import load_detectors
from lib.benchmarking import markdown_table, matched_detections, percent, smooth_images, thread_count
from lib.logger import report_user_errors
from lib.run.folder import add_model_arguments, config_from_model_arguments


def agreement_rows(stock, compiled):
    """Table rows for per-image detections ``stock`` and ``compiled`` ((N, 6) [x1, y1, x2, y2, score, label])."""
    found = total = same = 0
    for theirs, mine in zip(stock, compiled):
        hits = matched_detections([(row[5], row[:4], row[4]) for row in theirs], mine)
        found, total, same = found + hits, total + len(theirs), same + (hits == len(theirs) == len(mine))
    return [["stock detections the compiled operators give (label, box within 0.01 px, score within 1e-4)",
             percent(found, total)], ["images whose detections all agree", percent(same, len(stock))]]


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)  # --model RUN_FOLDER (its config.yaml) or --cfg FILE [--set ...]
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--image_size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    parser.add_argument("--num_classes", type=int, default=81, help="when dataset.NUM_CLASSES is 0")
    parser.add_argument("--seed", type=int, default=0, help="of the random images")
    args = parser.parse_args(argv)
    if args.images < 1 or min(args.image_size) < 16:
        parser.error(f"--images {args.images} --image_size {args.image_size}: at least 1 image of 16 x 16 px")
    cfg = config_from_model_arguments(args)  # a bad file, key or value stops here
    detectors, weights = load_detectors(cfg, cfg.dataset.NUM_CLASSES or args.num_classes, ("stock", "compiled"))
    images = smooth_images(args.images, *args.image_size, args.seed)
    found = {variant: detector.detect(images) for variant, detector in detectors.items()}
    print(f"\n{cfg.symbol}, {weights}, {args.images} images of {args.image_size[0]}x{args.image_size[1]} (seed "
          f"{args.seed}), TEST.SCALES {cfg.TEST.SCALES}, TEST.BATCH_IMAGES {cfg.TEST.BATCH_IMAGES}, {thread_count()}")
    print(markdown_table(["quantity", "agreement"], agreement_rows(found["stock"], found["compiled"])))


if __name__ == "__main__":
    main()
