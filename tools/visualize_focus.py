"""Draw what AutoFocus does with one test image: one panel per test scale, coarsest first.

    python tools/visualize_focus.py IMAGE_ID --cfg FILE [--set KEY VALUE ...] [--checkpoint PATH] [--out PNG]

Each panel is the whole image (shrunk for display) with the regions that scale processed (blue: the whole
image at the coarsest scale, FocusChips later), the FocusPixels of those regions shaded magenta by probability
(cells at or above the threshold that makes the next scale's chips, TEST.CHIP_HYPERPARAMS; 0.5 for the
last scale), the FocusChips they give for the next scale (orange) and the final detections scoring at
least --thresh (green, on the last panel). The network is the checkpoint's (default: TEST.MODEL or
TEST.TEST_EPOCH of the config's run); the config must enable TEST.AUTO_FOCUS.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

import cv2
import numpy as np

from lib.config import add_config_arguments, config_from_arguments
from lib.dataset import load_roidb
from lib.drawing import draw_boxes, draw_detections, grid, legend
from lib.inference.autofocus import AutoFocusStats
from lib.inference.detector import Detector
from lib.inference.focus_chips import focus_pixel_boxes
from lib.inference.streaming import RoidbImages
from lib.logger import report_user_errors, setup_logging
from lib.paths import shown_path
from lib.run.checkpoint import checkpoint_file, output_dir
from symbols.backbones import feature_stride

PANEL_HEIGHT = 540
GUTTER = 12  # pixels between the panels
REGION, CHIP, FOCUS, DETECTION = (230, 120, 20), (0, 150, 255), (200, 0, 200), (60, 200, 60)  # BGR


def shade(panel, boxes, probs, factor, colour):
    """``panel`` with every box filled in ``colour``, blended by its probability."""
    overlay = np.zeros_like(panel, np.float32)
    alpha = np.zeros(panel.shape[:2], np.float32)
    for (x1, y1, x2, y2), prob in zip(np.asarray(boxes) * factor, probs):
        top, left = int(round(y1)), int(round(x1))
        bottom, right = max(int(round(y2)), top + 1), max(int(round(x2)), left + 1)
        alpha[top:bottom, left:right] = np.maximum(alpha[top:bottom, left:right], 0.2 + 0.5 * float(prob))
        overlay[top:bottom, left:right] = colour
    alpha = alpha[:, :, None]
    return (panel * (1 - alpha) + overlay * alpha).astype(np.uint8)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image_id", type=int, help="an image id of dataset.test_image_set")
    add_config_arguments(parser,
                         cfg_help="an AutoFocus config, e.g. configs/faster/sniper_synthetic_tiny_autofocus.yml")
    parser.add_argument("--checkpoint", default=None, help="params file (default: TEST.MODEL or TEST_EPOCH)")
    parser.add_argument("--thresh", type=float, default=0.5, help="score of the detections drawn")
    parser.add_argument("--out", help="PNG path (default {output}/{name}/focus_{IMAGE_ID}.png)")
    args = parser.parse_args()
    cfg = config_from_arguments(args)
    if not cfg.TEST.AUTO_FOCUS:
        sys.exit(f"{args.cfg}: TEST.AUTO_FOCUS is false: there are no FocusChips to draw")
    setup_logging()
    roidb, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    entries = [entry for entry in roidb if entry["id"] == args.image_id]
    if not entries:
        sys.exit(f"image id {args.image_id} is not in {cfg.dataset.test_image_set} ({len(roidb)} images)")
    detector = Detector.from_config(cfg, args.checkpoint or checkpoint_file(cfg), dataset.classes)
    source = RoidbImages(entries[:1])
    image = source.read(0)

    test, stride = cfg.TEST, feature_stride(cfg)
    thresholds = [params[1] if number + 1 < len(test.SCALES) and test.DO_PRUNING[number + 1] else 0.5
                  for number, params in enumerate(test.CHIP_HYPERPARAMS)]
    seen = [{"regions": [], "focus": [], "probs": [], "chips": []} for _ in test.SCALES]

    def on_region(level, region, result, chips):
        _, focus_map, scale = result
        boxes, probs = focus_pixel_boxes(focus_map, region.box, scale, stride, thresholds[level])
        seen[level]["regions"].append(region.box)
        seen[level]["focus"].append(boxes)
        seen[level]["probs"].append(probs)
        seen[level]["chips"].extend(chips)

    stats = AutoFocusStats()
    found = dict(detector.strategy.run(source, 0, stats=stats, on_region=on_region))  # TEST.AUTO_FOCUS: AutoFocus
    if isinstance(found[0], Exception):
        sys.exit(f"image id {args.image_id}: {found[0]}")
    factor = PANEL_HEIGHT / image.shape[0]
    shrunk = cv2.resize(image, (max(int(round(image.shape[1] * factor)), 1), PANEL_HEIGHT),
                        interpolation=cv2.INTER_AREA)
    panels, captions = [], []
    for number, (level, level_stats) in enumerate(zip(seen, stats.levels)):
        panel = shade(shrunk, np.concatenate(level["focus"] or [np.zeros((0, 4))]),
                      np.concatenate(level["probs"] or [np.zeros(0)]), factor, FOCUS)
        panel = draw_boxes(panel, level["regions"], REGION, factor=factor)
        panel = draw_boxes(panel, level["chips"], CHIP, factor=factor)
        if number == len(seen) - 1:
            shown = found[0].copy()
            shown[:, :4] *= factor
            panel = draw_detections(panel, shown, list(dataset.classes), args.thresh, DETECTION)
        panels.append(panel)
        captions.append(f"scale {number} {test.SCALES[number]}: {len(level['regions'])} regions, "
                        f"{100.0 * level_stats.pixels / level_stats.full_pixels:.0f}% of the pixels, "
                        f"{len(level['chips'])} FocusChips for the next")
    picture = grid(panels, len(panels), gutter=GUTTER, captions=captions)
    picture = np.concatenate([legend(picture.shape[1], [
        ("processed region", REGION), ("FocusPixels", FOCUS), ("FocusChips for the next scale", CHIP),
        (f"detections >= {args.thresh}", DETECTION)]), picture], axis=0)
    out = args.out or os.path.join(output_dir(cfg), f"focus_{args.image_id}.png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if not cv2.imwrite(out, picture):
        sys.exit(f"cannot write {out}")
    print(shown_path(out))


if __name__ == "__main__":
    main()
