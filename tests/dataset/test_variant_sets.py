"""The variant sets BENCHMARKS.md measures on (lib.dataset.variants): small-object mosaics and inpainted
empty images."""
import os

import cv2
import numpy as np

from lib.dataset import load_roidb
from lib.dataset.variants import add_empty_images, small_object_set
from dataset_helpers import ann, by_id, dataset_cfg, image_record, write_coco


def test_small_object_mosaics_and_inpainted_empty_images(tmp_path):
    source, out = str(tmp_path / "src"), str(tmp_path / "out")
    write_coco(source, "train", [image_record(1, 90, 60), image_record(2, 90, 60)],
               [ann(1, 1, [30, 15, 30, 30]), ann(2, 2, [0, 0, 9, 6])])
    cv2.imwrite(os.path.join(source, "images", "train", "1.jpg"), np.full((60, 90, 3), 200, np.uint8))
    small_object_set(source, out, "train", count=2, tile=3, seed=0)
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.dataset_path": out}), "train", training=False)
    assert [(e["width"], e["height"]) for e in roidb] == [(90, 60), (90, 60)]  # 3 x 3 cells of 30 x 20
    boxes = np.concatenate([e["boxes"] for e in roidb])
    # each 30 x 30 box of image 1 becomes 10 x 10 in its cell, image 2's 9 x 6 becomes 3 x 2: 1/3 the size
    assert len(boxes) == 9 * 2
    sizes = sorted({(round(float(b[2] - b[0] + 1)), round(float(b[3] - b[1] + 1))) for b in boxes})
    assert set(sizes) <= {(10, 10), (3, 2)} and all(b[0] % 30 in (0, 10) for b in boxes)
    added = add_empty_images(out, "train", count=1, seed=0)
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.dataset_path": out, "dataset.root_path":
                                                   str(tmp_path / "root2")}), "train", training=False)
    empty = by_id(roidb)[added[0]]
    assert len(roidb) == 3 and empty["boxes"].shape == (0, 4)
    copy = cv2.imread(empty["image"])
    assert copy.shape == (60, 90, 3)
