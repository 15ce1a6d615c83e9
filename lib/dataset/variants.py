"""Own-data variants of a COCO-format set, to measure what the own-data tools do (BENCHMARKS.md; front
tools/make_variant_set.py): dense small objects, and images without objects.

``small_object_set``: every output image is a ``tile`` x ``tile`` mosaic of source images drawn at random
(seeded), each resized to one cell (the first source image's size / tile): ``tile``² times the objects at
about 1/tile their size, as in aerial scenes. ``add_empty_images``: copies of source images with every
annotated box (and a 3 px margin) inpainted (``cv2.inpaint``), so the background, distractors included,
stays and no object does; they are appended to the set without annotations.
"""
import os

import cv2
import numpy as np

from lib.atomic import write_bytes, write_json
from lib.dataset.coco import read_coco_json
from lib.dataset.image_io import read_image

INPAINT_MARGIN = 3  # px around a box that are inpainted too (anti-aliased edges)


def _read_set(root, image_set):
    return read_coco_json(os.path.join(root, "annotations", f"instances_{image_set}.json"))


def _write_image(image, root, image_set, name):
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise IOError(f"cannot encode {name}")
    write_bytes(encoded.tobytes(), os.path.join(root, "images", image_set, name))


def small_object_set(source, out, image_set, count, tile=3, seed=0):
    """Write ``count`` mosaics of ``source``'s ``image_set`` into ``out`` (same set name); returns the
    annotation file written."""
    data = _read_set(source, image_set)
    by_image = {}
    for ann in data["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    first = data["images"][0]
    cell_w, cell_h = first["width"] // tile, first["height"] // tile
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for index in range(count):
        mosaic = np.zeros((cell_h * tile, cell_w * tile, 3), np.uint8)
        for cell in range(tile * tile):
            record = data["images"][int(rng.integers(len(data["images"])))]
            pixels = read_image(os.path.join(source, "images", image_set, record["file_name"]))
            sx, sy = cell_w / record["width"], cell_h / record["height"]
            ox, oy = (cell % tile) * cell_w, (cell // tile) * cell_h
            mosaic[oy:oy + cell_h, ox:ox + cell_w] = cv2.resize(pixels, (cell_w, cell_h), interpolation=cv2.INTER_AREA)
            for ann in by_image.get(record["id"], []):
                x, y, w, h = ann["bbox"]
                annotations.append({"id": len(annotations) + 1, "image_id": index + 1,
                                    "category_id": ann["category_id"], "iscrowd": ann.get("iscrowd", 0),
                                    "bbox": [ox + x * sx, oy + y * sy, w * sx, h * sy],
                                    "area": ann["area"] * sx * sy})
        name = f"{index + 1:012d}.jpg"
        _write_image(mosaic, out, image_set, name)
        images.append({"id": index + 1, "file_name": name, "width": cell_w * tile, "height": cell_h * tile})
    path = os.path.join(out, "annotations", f"instances_{image_set}.json")
    write_json({"images": images, "annotations": annotations, "categories": data["categories"]}, path)
    return path


def add_empty_images(root, image_set, count, seed=0):
    """Append ``count`` object-free copies of images of ``root``'s ``image_set`` (inpainted) to it;
    returns their ids."""
    data = _read_set(root, image_set)
    boxes = {}
    for ann in data["annotations"]:
        boxes.setdefault(ann["image_id"], []).append(ann["bbox"])
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(data["images"]), size=min(count, len(data["images"])), replace=False)
    next_id = max(image["id"] for image in data["images"]) + 1
    added = []
    for offset, index in enumerate(sorted(picked)):
        record = data["images"][int(index)]
        image = read_image(os.path.join(root, "images", image_set, record["file_name"]))
        mask = np.zeros(image.shape[:2], np.uint8)
        for x, y, w, h in boxes.get(record["id"], []):
            x1, y1 = max(int(x) - INPAINT_MARGIN, 0), max(int(y) - INPAINT_MARGIN, 0)
            mask[y1:int(np.ceil(y + h)) + INPAINT_MARGIN, x1:int(np.ceil(x + w)) + INPAINT_MARGIN] = 255
        image_id = next_id + offset
        name = f"empty_{image_id:012d}.jpg"
        _write_image(cv2.inpaint(image, mask, 5, cv2.INPAINT_TELEA), root, image_set, name)
        data["images"].append({"id": image_id, "file_name": name, "width": record["width"],
                               "height": record["height"]})
        added.append(image_id)
    write_json(data, os.path.join(root, "annotations", f"instances_{image_set}.json"))
    return added
