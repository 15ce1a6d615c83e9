"""A dataset format is one subclass of lib.dataset.base.Dataset and its registration."""
import os

import cv2
import numpy as np
import pytest

from dataset_helpers import dataset_cfg

from lib.config import ConfigError
from lib.dataset import load_roidb
from lib.dataset import roidb as roidb_module
from lib.dataset.annotations import make_entry
from lib.dataset.base import Dataset
from lib.dataset.polygons import pack_polygons


class ToyDataset(Dataset):
    """A format of two images given in code (module level: the roidb cache pickles it): the first with a
    box and its triangle, the second empty; the reference tests them last first."""

    kind = "toy"
    classes = ("__background__", "thing")
    category_ids = (0, 7)
    supports_masks = True

    @property
    def annotation_files(self):
        return []

    def load_entries(self, masks=False):
        self.image_ids = [1, 2]
        entries = [make_entry(os.path.join(self.dataset_path, "a.jpg"), 1, 20, 30, [[1, 2, 10, 12]], [1], [], [False]),
                   make_entry(os.path.join(self.dataset_path, "b.jpg"), 2, 20, 30, [], [], [], [])]
        if masks:
            for entry, triangles in zip(entries, [[[np.array([1, 2, 10, 2, 10, 12])]], []]):
                entry.update(pack_polygons(triangles))
        return entries

    def reference_test_order(self, entries):
        return entries[::-1]

    def evaluate(self, entries, detections, out_dir, segmentations=None, scoring=None):
        return {"scored": [(e["id"], len(d)) for e, d in zip(entries, detections)]}


class BoxOnlyToyDataset(ToyDataset):
    supports_masks = False


def test_a_dataset_format_is_one_subclass_and_its_registration(tmp_path, monkeypatch):
    # registered by name, the format's entries become the roidb (flips, cache) and its evaluate scores them
    os.makedirs(tmp_path / "data")
    for name in ("a.jpg", "b.jpg"):
        cv2.imwrite(str(tmp_path / "data" / name), np.zeros((20, 30, 3), np.uint8))
    monkeypatch.setitem(roidb_module.DATASETS, "toy", ToyDataset)
    cfg = dataset_cfg(tmp_path, "toy", **{"TRAIN.FLIP": True})
    roidb, dataset = load_roidb(cfg, "train")
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False), (1, True)] and dataset.num_classes == 2
    np.testing.assert_array_equal(roidb[1]["boxes"], [[19, 2, 28, 12]])  # mirrored in a 30 px wide image
    assert dataset.evaluate(roidb[:1], [np.zeros((3, 6))], str(tmp_path)) == {"scored": [(1, 3)]}
    # the format's own test order and masks, not COCO's
    assert [e["id"] for e in load_roidb(cfg, "val", training=False)[0]] == [2, 1]
    file_order = dataset_cfg(tmp_path, "toy", **{"dataset.TEST_IMAGE_ORDER": "file"})
    assert [e["id"] for e in load_roidb(file_order, "val", training=False)[0]] == [1, 2]
    masked, _ = load_roidb(dataset_cfg(tmp_path, "toy", **{"TRAIN.WITH_MASK": True, "TRAIN.FLIP": False}), "train")
    np.testing.assert_array_equal(masked[0]["mask_coords"], [1, 2, 10, 2, 10, 12])
    monkeypatch.setitem(roidb_module.DATASETS, "toy", BoxOnlyToyDataset)
    with pytest.raises(ConfigError, match="TRAIN.WITH_MASK"):
        load_roidb(dataset_cfg(tmp_path, "toy", **{"TRAIN.WITH_MASK": True}), "train")
