"""Time the dataset stage: synthetic image generation, and a COCO-sized roidb built vs read from cache.

    python tools/bench_dataset.py --images 20000 --objects 7 --synthetic 20

The COCO-like annotation file is random boxes over blank image files (only their existence is
checked), so the figures are the reader's and the cache's cost, not JPEG decoding.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os
import tempfile

import numpy as np

from lib.benchmarking import markdown_table, measure
from lib.config import load_config
from lib.dataset import load_roidb
from lib.dataset.synthetic import generate_synthetic_coco
from lib.logger import report_user_errors


def fake_coco(root, images, objects, seed=0):
    """A COCO-layout dataset with ``images`` blank image files and ``objects`` random boxes each."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "annotations"))
    os.makedirs(os.path.join(root, "images", "train"))
    records, anns = [], []
    for image_id in range(1, images + 1):
        records.append({"id": image_id, "file_name": f"{image_id}.jpg", "width": 640, "height": 480})
        open(os.path.join(root, "images", "train", f"{image_id}.jpg"), "wb").close()
        for xy, wh in zip(rng.uniform(0, 400, (objects, 2)), rng.uniform(4, 200, (objects, 2))):
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": int(rng.integers(1, 81)),
                         "bbox": [round(float(v), 2) for v in (*xy, *wh)], "area": float(wh[0] * wh[1]),
                         "iscrowd": 0})
    categories = [{"id": i, "name": f"c{i}"} for i in range(1, 81)]
    with open(os.path.join(root, "annotations", "instances_train.json"), "w") as f:
        json.dump({"images": records, "annotations": anns, "categories": categories}, f)
    return len(anns)


def timed(function):
    """(seconds, result) of one call: a second call would measure a warm cache."""
    timing = measure(function, repeat=1, warmup=0)
    return timing.best, timing.result


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--objects", type=int, default=7, help="boxes per image")
    parser.add_argument("--synthetic", type=int, default=20, help="synthetic images to generate")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        seconds, _ = timed(lambda: generate_synthetic_coco(os.path.join(tmp, "synthetic"), args.synthetic, 0, 0))
        rows.append((f"synthetic dataset, {args.synthetic} images", seconds,
                     f"{seconds / args.synthetic * 1000:.0f} ms/image"))
        boxes = fake_coco(os.path.join(tmp, "coco"), args.images, args.objects)
        cfg = load_config(None, [("dataset.dataset_path", os.path.join(tmp, "coco")),
                                 ("dataset.root_path", os.path.join(tmp, "root"))])
        seconds, (roidb, _) = timed(lambda: load_roidb(cfg, "train"))
        rows.append((f"roidb build, {args.images} images / {boxes} boxes", seconds, f"{len(roidb)} entries (flips)"))
        seconds, (roidb, _) = timed(lambda: load_roidb(cfg, "train"))
        rows.append(("roidb from cache (hash + verify + unpickle + file check)", seconds, f"{len(roidb)} entries"))
        seconds, (_, dataset) = timed(lambda: load_roidb(cfg, "train", training=False))
        seconds_coco, _ = timed(lambda: dataset.coco)
        rows.append(("test roidb build", seconds, ""))
        rows.append(("pycocotools index on demand (dataset.coco)", seconds_coco, ""))
    print(markdown_table(["step", "seconds", "note"], rows, [None, ".2f", None]))


if __name__ == "__main__":
    main()
