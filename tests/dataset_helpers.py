"""Small datasets written for tests: COCO-format files (``write_coco`` with ``image_record`` / ``ann``), Pascal
VOC folders (``write_voc`` with ``voc_xml``), proposal files' bytes (``npz_bytes``, ``GOOD``), a pycocotools
index of given records (``indexed_coco``) or of squares on one image (``coco_gt``, with a results file of
squares: ``write_results``), the config reading them (``dataset_cfg``) and its roidb caches (``roidb_caches``),
PNG files that only declare a size (``png_header``, ``png_bomb``)."""
import contextlib
import io
import json
import os

import cv2
import numpy as np
from pycocotools.coco import COCO

from lib.atomic import write_json
from lib.config import load_config

# Two categories with non-contiguous ids, listed out of order: labels follow sorted ids.
CATEGORIES = [{"id": 7, "name": "seven"}, {"id": 2, "name": "two"}]


def image_record(image_id, width=100, height=80):
    return {"id": image_id, "file_name": f"{image_id}.jpg", "width": width, "height": height}


def ann(ann_id, image_id, bbox, category_id=2, iscrowd=0, area=None):
    record = {"id": ann_id, "image_id": image_id, "category_id": category_id, "bbox": bbox, "iscrowd": iscrowd}
    record["area"] = area if area is not None else (bbox[2] * bbox[3] if _numeric(bbox) else 1.0)
    return record


def _numeric(bbox):
    return isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)


def write_coco(root, image_set, images, annotations, categories=CATEGORIES, image_files=True):
    """A COCO-layout dataset under ``root``; returns the annotation file path."""
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, "images", image_set), exist_ok=True)
    path = os.path.join(root, "annotations", f"instances_{image_set}.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    if image_files:
        for image in images:
            cv2.imwrite(os.path.join(root, "images", image_set, image["file_name"]),
                        np.zeros((image["height"], image["width"], 3), np.uint8))
    return path


def dataset_cfg(tmp_path, dataset="coco", **overrides):
    """The default config reading ``dataset`` from ``tmp_path/data``, caching under ``tmp_path/root``."""
    return load_config(None, {"dataset.dataset": dataset, "dataset.dataset_path": str(tmp_path / "data"),
                              "dataset.root_path": str(tmp_path / "root"), **overrides})


def by_id(roidb, flipped=False):
    return {entry["id"]: entry for entry in roidb if entry["flipped"] == flipped}


def roidb_caches(cache_dir):
    """The roidb cache files in ``cache_dir``, sorted."""
    return sorted(name for name in os.listdir(cache_dir) if name.endswith(".pkl"))


def npz_bytes(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


GOOD = {"version": np.int64(1), "image_ids": np.array([1]), "offsets": np.array([0, 1]),
        "boxes": np.zeros((1, 5), np.float32)}


def voc_xml(width, height, objects):
    body = "".join(
        f"<object><name>{name}</name><difficult>{int(difficult)}</difficult>"
        f"<bndbox><xmin>{box[0]}</xmin><ymin>{box[1]}</ymin><xmax>{box[2]}</xmax><ymax>{box[3]}</ymax></bndbox>"
        f"</object>" for name, box, difficult in objects)
    size = f"<size><width>{width}</width><height>{height}</height><depth>3</depth></size>"
    return f"<annotation>{size}{body}</annotation>"


def write_voc(root, year, split, images):
    """``images``: {name: xml text}; writes the list, the XMLs and blank JPEGs."""
    base = os.path.join(root, f"VOC{year}")
    for folder in ("Annotations", os.path.join("ImageSets", "Main"), "JPEGImages"):
        os.makedirs(os.path.join(base, folder), exist_ok=True)
    with open(os.path.join(base, "ImageSets", "Main", f"{split}.txt"), "w") as f:
        f.write("".join(f"{name}\n" for name in images))
    for name, xml in images.items():
        with open(os.path.join(base, "Annotations", f"{name}.xml"), "w") as f:
            f.write(xml)
        cv2.imwrite(os.path.join(base, "JPEGImages", f"{name}.jpg"), np.zeros((4, 4, 3), np.uint8))


def indexed_coco(images, annotations, category_ids):
    """A pycocotools COCO of these images and annotations, categories ``category_ids[1:]`` named c<id>."""
    coco = COCO()
    coco.dataset = {"images": images, "annotations": annotations,
                    "categories": [{"id": c, "name": f"c{c}"} for c in category_ids[1:]]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def coco_gt(objects, size=640):
    """A pycocotools COCO of one image holding ``objects``: [(x, y, side, category id)] squares."""
    coco = COCO()
    coco.dataset = {"images": [{"id": 1, "width": size, "height": size, "file_name": "1.jpg"}],
                    "annotations": [{"id": i + 1, "image_id": 1, "category_id": c, "bbox": [x, y, s, s],
                                     "area": s * s, "iscrowd": 0} for i, (x, y, s, c) in enumerate(objects)],
                    "categories": [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def write_results(tmp_path, detections):
    """``detections``: [(x, y, side, category id, score)] -> a COCO results file."""
    path = str(tmp_path / "results.json")
    write_json([{"image_id": 1, "category_id": int(c), "bbox": [float(x), float(y), float(s), float(s)],
                 "score": float(score)}
                for x, y, s, c, score in detections], path)
    return path


def png_chunk(kind, data):
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width, height):
    """The first bytes of a PNG declaring ``width`` x ``height`` (8-bit RGB): what a decompression bomb
    shows before its tiny, highly compressed pixel data."""
    import struct

    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def png_bomb(width, height):
    """A whole PNG file of a few hundred bytes declaring ``width`` x ``height``: its header, a first
    compressed row of zeros and the end chunk (what Pillow opens as an image of that size)."""
    import zlib

    return png_header(width, height) + png_chunk(b"IDAT", zlib.compress(bytes(1 + 3 * min(width, 1000)))) + \
        png_chunk(b"IEND", b"")
