"""Draws chips of a ChipLoader batch into a PNG, to check by eye what the network is fed.

Per chip: the image (mean added back), the extent the network is told (``im_info``, blue: the whole
input, or the scaled image at the coarsest scale), the chip's
boxes as the loader labelled them (green: valid at this scale, red: invalid, i.e. the RPN ignores
anchors around it), the boxes and centres of positive RPN anchors (yellow), and the valid range as
text with two squares of side lo and hi (top right). The text (the chip's caption in the grid, two chips a
row, a gutter between them) also counts the boxes on which the
network's own test, sqrt(area) of the cropped box in chip pixels against ``valid_ranges``, disagrees
with the loader's (which judges the whole box in original pixels, as the chip miner does).

    python tools/visualize_batch.py --model RUN_FOLDER | --cfg FILE [--set KEY VALUE ...] [--batch 0] [--chips 4]
        [--out PNG]

The picture goes into the run folder (``{output_path}/{name}/batch_{BATCH}.png``) unless ``--out`` says.

The batch is one of the first epoch of the config's training set, built in this process;
``--cfg configs/faster/sniper_synthetic_tiny.yml`` shows the synthetic dataset (generated under
data/synthetic if missing).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

import cv2
import numpy as np

from lib.data import ChipLoader
from lib.data.chip_worker import ChipWorker
from lib.dataset import load_roidb
from lib.drawing import grid, write_picture
from lib.logger import report_user_errors
from lib.paths import shown_path
from lib.run.checkpoint import output_dir
from lib.run.folder import add_model_arguments, config_from_model_arguments
from lib.scales import in_valid_range

GREEN, RED, BLUE, YELLOW, WHITE = (0, 200, 0), (0, 0, 255), (255, 128, 0), (0, 230, 255), (255, 255, 255)
GUTTER = 12  # pixels between the chips of the grid


def chip_picture(data, im_info, boxes, valid, valid_range, label, targeter, pixel_means):
    """(BGR uint8 drawing, caption) of one chip of a batch (numpy arrays of that chip; boxes in chip pixels)."""
    image = np.clip(data.transpose(1, 2, 0) + pixel_means, 0, 255).astype(np.uint8).copy()
    height, width = int(im_info[0]), int(im_info[1])
    cv2.rectangle(image, (0, 0), (width - 1, height - 1), BLUE, 1)
    size = targeter.feat_size
    positive = np.flatnonzero(label.reshape(targeter.num_anchors, size, size).transpose(1, 2, 0).reshape(-1) == 1)
    for x1, y1, x2, y2 in targeter.anchors[positive]:
        cv2.rectangle(image, (int(x1), int(y1)), (int(x2), int(y2)), YELLOW, 1)
        cv2.circle(image, (int((x1 + x2) / 2), int((y1 + y2) / 2)), 2, YELLOW, -1)
    for (x1, y1, x2, y2), ok in zip(boxes, valid):
        cv2.rectangle(image, (int(x1), int(y1)), (int(x2), int(y2)), GREEN if ok else RED, 2)
    text = f"scale {im_info[2]:.3f}  {width}x{height}  pos {len(positive)}"
    if valid_range is not None:
        lo, hi = valid_range
        disagree = int((in_valid_range(boxes, tuple(valid_range)) != valid).sum())
        text += f"  range [{lo:.0f}, {hi:.0f}]  differs {disagree}"
        right = image.shape[1] - 4
        for side in (lo, hi):
            if 0 < side < image.shape[1] - 8:
                cv2.rectangle(image, (int(right - side), 4), (right, int(4 + side)), WHITE, 1)
    return image, text


def batch_picture(batch, batch_index, loader, roidb, cfg, count):
    """A grid (two chips a row, each captioned) of the first ``count`` chips of ``batch``."""
    data = {desc.name: array.asnumpy() for desc, array in zip(loader.provide_data, batch.data)}
    data.update({desc.name: array.asnumpy() for desc, array in zip(loader.provide_label, batch.label)})
    worker = ChipWorker(roidb, cfg, None, rpn_only=False)
    means = np.asarray(cfg.network.PIXEL_MEANS, np.float32)
    pictures, captions = [], []
    for i in range(min(count, loader.batch_size - batch.pad)):
        chip = loader.chip_ref(batch_index, i)
        entry = roidb[chip.image_index]
        boxes, _, valid = worker.chip_boxes(entry, chip)
        valid_range = data["valid_ranges"][i] if "valid_ranges" in data else None
        picture, caption = chip_picture(data["data"][i], data["im_info"][i], boxes, valid, valid_range,
                                        data["label"][i], worker.targeter, means)
        pictures.append(picture)
        captions.append(f"chip {i} (image id {entry['id']}{', flipped' if entry['flipped'] else ''}): {caption}")
    return grid(pictures, min(2, len(pictures)), gutter=GUTTER, captions=captions)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)  # --model RUN_FOLDER (its config.yaml) or --cfg FILE [--set ...]
    parser.add_argument("--batch", type=int, default=0, help="which batch of the first epoch")
    parser.add_argument("--chips", type=int, default=4)
    parser.add_argument("--rpn-only", action="store_true")
    parser.add_argument("--out", help="PNG path (default: the run folder's batch_{BATCH}.png)")
    args = parser.parse_args(argv)
    cfg = config_from_model_arguments(args)
    roidb, _ = load_roidb(cfg, cfg.dataset.image_set)
    with ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, rpn_only=args.rpn_only, num_workers=0) as loader:
        for index, batch in enumerate(loader):
            if index == args.batch:
                break
        else:
            sys.exit(f"the epoch has only {index + 1} batches")
        picture = batch_picture(batch, index, loader, roidb, cfg, args.chips)
    out = args.out or os.path.join(output_dir(cfg), f"batch_{args.batch}.png")
    write_picture(picture, out)
    print(f"wrote {shown_path(out)} ({picture.shape[1]}x{picture.shape[0]}) from batch {args.batch}")


if __name__ == "__main__":
    main()
