"""Draw a COCO results JSON over the images it was computed on: ground truth and detections, a few
images per PNG grid.

    python tools/visualize_detections.py --results RESULTS.json (--model RUN_FOLDER | --cfg FILE) [--set ...] \
        [--image-set SET] [--thresh 0.5] [--images 16] [--per-grid 4] [--out DIR]
    python tools/visualize_detections.py --results RESULTS.json --folder IMAGES/ [--annotations FILE.json] ...

With ``--model RUN_FOLDER`` (the run's config.yaml) or ``--cfg`` the images, ground truth and class names
are the config's test set (``dataset.test_image_set``, or ``--image-set``), as main_test.py wrote the results. With ``--folder``
the image ids are those ``main_test.py --images`` gave the same files: the ``image_info.json`` beside the
results when there is one (ids by file name), else its rule (lib.inference.image_folder.image_ids: the names'
numbers when all are distinct numbers, COCO's ``000000000139.jpg`` is image 139, else 1..N in name order);
``--annotations`` (a COCO instances file) adds ground truth and category names, else categories are
shown by id. Ground truth is drawn in white, detections scoring at least ``--thresh`` in their class
colour with "name score" tags, and their instance masks tinted in the same colour when the results carry
``segmentation`` RLEs (a mask network's main_test.py results); a legend names the colours, a caption over each
tile its image (id, file, detections shown), a gutter keeps the tiles apart. Grids go to
``{out}/detections_{n:03d}.png``, by default the run folder's ``detections/`` (with ``--folder``: a
``detections/`` folder beside the results file, which main_test.py wrote into the run folder).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os
import sys
from collections import defaultdict

import cv2
import numpy as np

from lib.dataset import load_roidb, read_image
from lib.dataset.image_io import DEFAULT_MAX_PIXELS
from lib.drawing import class_palette, draw_boxes, draw_detections, grid, legend, write_picture
from lib.errors import DataError
from lib.inference.image_folder import IMAGE_INFO_FILE, image_ids, list_images
from lib.logger import report_user_errors
from lib.paths import shown_path
from lib.run.checkpoint import output_dir
from lib.run.folder import add_model_arguments, config_from_model_arguments

GT_COLOUR = (255, 255, 255)  # BGR: white, a colour no class has (lib.drawing.class_palette)
CELL_WIDTH = 640  # each image is shown this wide
GUTTER = 12  # pixels between the tiles of a grid


def read_results(path):
    """``{image id: float32 (N, 6) [x1, y1, x2, y2, score, category id]}`` and ``{image id: [RLE or None
    per row]}`` from a COCO results file."""
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        sys.exit(f"cannot read results {path}: {err}")
    if not isinstance(results, list):
        sys.exit(f"{path}: a COCO results file is a list of detections")
    rows, segmentations = defaultdict(list), defaultdict(list)
    for index, item in enumerate(results):
        try:
            x, y, w, h = (float(v) for v in item["bbox"])
            rows[int(item["image_id"])].append([x, y, x + w - 1, y + h - 1, float(item["score"]),
                                                int(item["category_id"])])
            segmentations[int(item["image_id"])].append(item.get("segmentation"))
        except (KeyError, TypeError, ValueError, AttributeError):
            sys.exit(f"{path}: entry {index} is not a detection (image_id, category_id, bbox [x, y, w, h], score)")
    return {image_id: np.array(r, np.float32) for image_id, r in rows.items()}, dict(segmentations)


def decode_masks(rles, height, width, path):
    """Boolean (N, height, width) masks of COCO RLEs (None: an empty mask), or None when no row has one."""
    if not any(rles):
        return None
    from pycocotools import mask as mask_utils

    masks = np.zeros((len(rles), height, width), bool)
    for mask, rle in zip(masks, rles):
        if rle:
            try:
                decoded = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode("ascii")})
            except (KeyError, TypeError, AttributeError, ValueError) as err:
                sys.exit(f"{path}: a segmentation is not a COCO RLE with string counts ({err})")
            if decoded.shape != (height, width):
                sys.exit(f"{path}: a segmentation of size {list(decoded.shape)} for an image of {[height, width]}")
            mask[:] = decoded.astype(bool)
    return masks


def from_config(cfg, image_set):
    """[(image id, path, gt boxes)], {category id: name} of the config's test set, and its pixel limit."""
    roidb, dataset = load_roidb(cfg, image_set, training=False)
    names = {dataset.category_ids[label]: name for label, name in enumerate(dataset.classes) if label}
    return [(entry["id"], entry["image"], entry["boxes"]) for entry in roidb], names, cfg.dataset.MAX_IMAGE_PIXELS


def folder_ids(paths, results_path):
    """The image id of each of ``paths`` as ``main_test.py --images`` gave it: by file name from the
    ``image_info.json`` it wrote beside ``results_path`` when there is one, else by its rule (``image_ids``)."""
    info_path = os.path.join(os.path.dirname(os.path.abspath(results_path)), IMAGE_INFO_FILE)
    if not os.path.isfile(info_path):
        return image_ids(paths)
    try:
        with open(info_path) as f:
            by_name = {image["file_name"]: int(image["id"]) for image in json.load(f)["images"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        sys.exit(f"cannot read the image ids of {shown_path(info_path)}: {err}")
    return [by_name.get(os.path.basename(path)) for path in paths]


def from_folder(folder, annotations, results_path):
    """The same from a folder of images (ids as main_test.py --images gave them: ``folder_ids``; files it did
    not test are left out) and an optional COCO instances file (the pixel limit: dataset.MAX_IMAGE_PIXELS's
    default)."""
    gt, names = defaultdict(list), {}
    if annotations:
        try:
            with open(annotations) as f:
                data = json.load(f)
            names = {c["id"]: c["name"] for c in data["categories"]}
            for a in data.get("annotations", []):
                x, y, w, h = a["bbox"]
                gt[int(a["image_id"])].append([x, y, x + w - 1, y + h - 1])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            sys.exit(f"cannot read annotations {annotations}: {err}")
    paths = list_images(folder)
    images = [(image_id, path, np.array(gt[image_id], np.float32).reshape(-1, 4))
              for image_id, path in zip(folder_ids(paths, results_path), paths) if image_id is not None]
    return images, names, DEFAULT_MAX_PIXELS


def picture(path, max_pixels, gt_boxes, detections, names, palette, thresh, rles=(), results_path=""):
    """One image (refused before decoding above ``max_pixels``), shrunk to CELL_WIDTH, with its ground truth and
    detections (and their masks)."""
    image = read_image(path, max_pixels)
    factor = CELL_WIDTH / image.shape[1]
    small = cv2.resize(image, (CELL_WIDTH, max(1, int(round(image.shape[0] * factor)))), interpolation=cv2.INTER_AREA)
    masks = decode_masks(list(rles), image.shape[0], image.shape[1], results_path)
    if masks is not None:
        masks = np.array([cv2.resize(m.astype(np.uint8), small.shape[1::-1], interpolation=cv2.INTER_NEAREST)
                          for m in masks], bool).reshape(-1, *small.shape[:2])
    small = draw_boxes(small, gt_boxes, GT_COLOUR, factor=factor)
    scaled = detections.copy()
    scaled[:, :4] *= factor
    ids = sorted(names)
    labels = {category: label for label, category in enumerate(ids)}
    scaled[:, 5] = [labels[int(c)] for c in detections[:, 5]]
    return draw_detections(small, scaled, [names[c] for c in ids], thresh, colours=[palette[c] for c in ids],
                           masks=masks)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, help="COCO results JSON (main_test.py's detections_*.json)")
    add_model_arguments(parser)  # --model RUN_FOLDER: the run's config; or --cfg FILE --set ...
    parser.add_argument("--image-set", help="image set of the config (default dataset.test_image_set)")
    parser.add_argument("--folder", help="a folder of images instead of a config (ids from the file names)")
    parser.add_argument("--annotations", help="with --folder: COCO instances JSON for gt boxes and names")
    parser.add_argument("--thresh", type=float, default=0.5, help="draw detections scoring at least this")
    parser.add_argument("--images", type=int, default=16, help="how many images (those with detections first)")
    parser.add_argument("--per-grid", type=int, default=4, help="images per PNG")
    parser.add_argument("--out", help="folder for the PNG grids (default: the run folder's detections/; with "
                                      "--folder, detections/ beside the results file)")
    args = parser.parse_args(argv)
    configured = bool(args.cfg or args.model)
    if configured == bool(args.folder):
        parser.error("give either --model RUN_FOLDER or --cfg FILE (a config's test set), or --folder (images)")
    if args.per_grid < 1 or args.images < 1:
        parser.error("--images and --per-grid must be at least 1")
    detections, segmentations = read_results(args.results)
    if configured:
        cfg = config_from_model_arguments(args)
        images, names, max_pixels = from_config(cfg, args.image_set or cfg.dataset.test_image_set)
        out = args.out or os.path.join(output_dir(cfg), "detections")
    else:
        images, names, max_pixels = from_folder(args.folder, args.annotations, args.results)
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "detections")
    names.update({int(c): str(int(c)) for dets in detections.values() for c in dets[:, 5] if int(c) not in names})
    colours = class_palette(len(names) + 1)  # by label, as the demo and Detector.draw colour them
    palette = {category: colours[label] for label, category in enumerate(sorted(names), start=1)}
    images.sort(key=lambda item: item[0] not in detections)  # images with detections first, else in order
    chosen = images[:args.images]
    if not chosen:
        sys.exit("no images to draw")
    if detections and not any(image_id in detections for image_id, _, _ in images):  # not pictures without a word
        raise DataError(f"none of the {len(detections)} image ids in {shown_path(args.results)} is one of these "
                        f"{len(images)} images: results of another image set?")
    key = [("ground truth (white)", (200, 200, 200))] + [(f"{names[c]}", palette[c]) for c in sorted(names)]
    written = []
    for start in range(0, len(chosen), args.per_grid):
        cells, captions = [], []
        for image_id, path, gt in chosen[start:start + args.per_grid]:
            found = detections.get(image_id, np.zeros((0, 6), np.float32))
            cells.append(picture(path, max_pixels, gt, found, names, palette, args.thresh,
                                 segmentations.get(image_id, ()), args.results))
            captions.append(f"image {image_id} ({os.path.basename(path)}): {int((found[:, 4] >= args.thresh).sum())} "
                            f"of {len(found)} detections shown, {len(gt)} ground truth")
        sheet = grid(cells, columns=min(2, len(cells)), gutter=GUTTER, captions=captions)
        sheet = np.concatenate([legend(sheet.shape[1], key), sheet], axis=0)
        path = os.path.join(out, f"detections_{start // args.per_grid:03d}.png")
        write_picture(sheet, path)
        written.append(shown_path(path))
    print(f"drew {len(chosen)} images, {sum(image_id in detections for image_id, _, _ in chosen)} with detections "
          f"({sum(len(d) for d in detections.values())} detections of {len(detections)} images in the results, "
          f"threshold {args.thresh}) into {len(written)} grids: {', '.join(written)}")


if __name__ == "__main__":
    main()
