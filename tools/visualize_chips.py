"""Draw the chips SNIPER mines for one training image: one panel per training scale.

    python tools/visualize_chips.py IMAGE_ID (--model RUN_FOLDER | --cfg FILE) [--set KEY VALUE ...] [--out PNG] \
        [--flipped] [--stride N]

Each panel is the image at that scale (shrunk for display) with its gt boxes, green when valid at
the scale and red when not, the positive chips in blue and the negative chips in orange; a legend
strip on top says so, a caption over each panel gives its scale and counts, a gutter keeps the panels apart.
The picture goes into the run folder (``{output_path}/{name}/chips_{IMAGE_ID}.png``) unless ``--out`` says.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import os

import cv2
import numpy as np

from chip_generator.mining import draw_epoch_stride, mine_image_chips
from lib.config import parsed
from lib.dataset import load_roidb, read_image
from lib.drawing import draw_boxes, grid, legend, line_width, write_picture
from lib.logger import report_user_errors, setup_logging
from lib.paths import shown_path
from lib.run.checkpoint import output_dir
from lib.run.folder import add_model_arguments, config_from_model_arguments

logger = logging.getLogger("visualize_chips")
PANEL_HEIGHT = 540  # display height of every panel, in pixels
GUTTER = 12  # pixels between the panels
VALID, INVALID, POSITIVE, NEGATIVE = (60, 200, 60), (40, 40, 230), (230, 120, 20), (0, 150, 255)  # BGR


def find_entry(roidb, image_id, flipped):
    for entry in roidb:
        if entry["id"] == image_id and entry["flipped"] == flipped:
            return entry
    kind = "flipped " if flipped else ""
    raise SystemExit(f"image id {image_id}: no {kind}entry in the training roidb ({len(roidb)} entries)")


def scale_panel(image, entry, scale, level):
    """The display panel of one scale (image, gt boxes valid / invalid, positive and negative chips) and its
    caption."""
    height, width = scale.image_size
    factor = PANEL_HEIGHT / height  # scaled-image pixels -> panel pixels
    panel = cv2.resize(image, (max(int(round(width * factor)), 1), PANEL_HEIGHT), interpolation=cv2.INTER_AREA)
    boxes = np.asarray(entry["boxes"], np.float32).reshape(-1, 4) * scale.im_scale
    thin = line_width(panel)  # chips drawn thicker than boxes, all growing with the panel
    panel = draw_boxes(panel, boxes[~scale.valid], INVALID, thin, factor)
    panel = draw_boxes(panel, boxes[scale.valid], VALID, thin + 1, factor)
    panel = draw_boxes(panel, scale.neg_chips, NEGATIVE, thin + 1, factor)
    panel = draw_boxes(panel, scale.pos_chips, POSITIVE, thin + 2, factor)
    text = (f"scale {level}: x{scale.im_scale:.3f} -> {width}x{height}, valid {int(scale.valid.sum())}/"
            f"{len(scale.valid)}, pos {len(scale.pos_chips)}, neg {len(scale.neg_chips)}")
    return panel, text


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image_id", type=int)
    add_model_arguments(parser)  # --model RUN_FOLDER (its config.yaml) or --cfg FILE [--set ...]
    parser.add_argument("--out", help="PNG path (default: the run folder's chips_{IMAGE_ID}.png)")
    parser.add_argument("--flipped", action="store_true", help="the mirrored training copy")
    parser.add_argument("--stride", type=int, help="chip stride (default: drawn from TRAIN.CHIP_STRIDE)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = config_from_model_arguments(args)
    setup_logging()
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    entry = find_entry(roidb, args.image_id, args.flipped)
    rng = np.random.default_rng(args.seed)
    params = parsed(cfg).mining
    stride = args.stride if args.stride else draw_epoch_stride(params, rng)
    chips = mine_image_chips(entry, params, stride, rng)
    image = read_image(entry["image"], cfg.dataset.MAX_IMAGE_PIXELS)
    if entry["flipped"]:
        image = cv2.flip(image, 1)
    panels, captions = zip(*(scale_panel(image, entry, scale, level) for level, scale in enumerate(chips.scales)))
    canvas = grid(list(panels), len(panels), gutter=GUTTER, captions=list(captions))
    key = legend(canvas.shape[1], [("gt valid at the scale", VALID), ("gt not valid", INVALID),
                                   ("positive chip", POSITIVE), ("negative chip", NEGATIVE)])
    canvas = np.concatenate([key, canvas], axis=0)
    out = args.out or os.path.join(output_dir(cfg), f"chips_{args.image_id}.png")
    write_picture(canvas, out)
    summary = "; ".join(f"scale {i}: {len(s.pos_chips)} pos, {len(s.neg_chips)} neg" for i, s in enumerate(chips.scales))
    logger.info("image id %d (stride %d): %s", args.image_id, stride, summary)
    logger.info("wrote %s", shown_path(out))


if __name__ == "__main__":
    main()
