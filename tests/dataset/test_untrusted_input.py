"""Dataset files from outside are data only: nothing read from disk runs code (pickled proposals, the roidb
cache), and no image path leads outside the dataset's folders."""
import hashlib
import hmac
import json
import logging
import os
import pickle
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

from dataset_helpers import CATEGORIES, ann, by_id, dataset_cfg, image_record, roidb_caches, voc_xml, write_coco, \
    write_voc

from lib.bootstrap import ROOT
from lib.dataset import load_roidb, read_image


class WritesMarker:
    """Unpickling this runs ``open(marker, "w")``: what a crafted file could do with any code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_crafted_pickle_proposal_file_is_refused_without_running_it(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    marker = tmp_path / "marker"
    path = tmp_path / "published.pkl"
    path.write_bytes(pickle.dumps({1: WritesMarker(marker)}, protocol=0))  # the oldest protocol too
    with pytest.raises(ValueError, match=r"published.pkl is a pickle .* tools/convert_proposals.py .*published.npz"):
        load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train")
    assert not marker.exists()


CONVERTER = os.path.join(ROOT, "tools", "convert_proposals.py")


def test_convert_proposals_tool_warns_and_converts_a_legacy_pickle(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(9)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 9, [0, 0, 10, 10])])
    legacy = {"COCO_train2014_000000000009.jpg": np.array([[1, 2, 30, 40, 0.5]]), 1: [[5, 6, 20, 30, 0.9]]}
    source, target = tmp_path / "published.pkl", tmp_path / "published.npz"
    source.write_bytes(pickle.dumps(legacy))
    run = subprocess.run([sys.executable, CONVERTER, str(source), str(target)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "can run arbitrary code" in run.stderr and "wrote proposals of 2 images" in run.stderr
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": target, "dataset.PROPOSAL_NMS": 0}), "train")
    np.testing.assert_array_equal(by_id(roidb)[9]["proposals"], [[1, 2, 30, 40]])
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], [[5, 6, 20, 30]])

    source.write_bytes(pickle.dumps({"no_id_here.jpg": np.zeros((1, 5))}))
    run = subprocess.run([sys.executable, CONVERTER, str(source), str(tmp_path / "x.npz")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1] == (
        "error: key 'no_id_here.jpg' is neither an image id nor an image file name ending in one")
    assert not (tmp_path / "x.npz").exists()


def test_roidb_cache_is_signed_and_a_forged_one_is_rebuilt_without_running_it(tmp_path, caplog):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    cfg = dataset_cfg(tmp_path)
    first, _ = load_roidb(cfg, "train")
    cache_dir = tmp_path / "root" / "cache"
    key_file = cache_dir / ".roidb_cache_key"
    assert os.stat(key_file).st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32
    (cache_file,) = roidb_caches(cache_dir)
    marker = tmp_path / "marker"
    forged = pickle.dumps(WritesMarker(marker))
    other_key = b"k" * 32  # a cache signed elsewhere (another machine, another user) is not trusted here either
    for content in (forged, hmac.new(other_key, forged, hashlib.sha256).digest() + forged):
        (cache_dir / cache_file).write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            roidb, _ = load_roidb(cfg, "train")
        assert "fails verification" in caplog.text and cache_file in caplog.text
        assert not marker.exists()
        np.testing.assert_array_equal(roidb[0]["boxes"], first[0]["boxes"])

    # a key others can read could sign anything: the cache is bypassed, even when the signature matches
    os.chmod(key_file, 0o644)
    signed = hmac.new(key_file.read_bytes(), forged, hashlib.sha256).digest() + forged
    (cache_dir / cache_file).write_bytes(signed)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(cfg, "train")
    assert "is not a 32-byte file private to this user (mode 644" in caplog.text
    assert not marker.exists()
    np.testing.assert_array_equal(roidb[0]["boxes"], first[0]["boxes"])
    assert (cache_dir / cache_file).read_bytes() == signed  # left alone, not re-signed with a public key


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "a/../../b.jpg", ".."])
def test_a_coco_file_name_leading_outside_the_image_folder_is_refused_at_load(tmp_path, name):
    images = [image_record(1), dict(image_record(2), file_name=name)]
    path = write_coco(str(tmp_path / "data"), "train", images[:1], [ann(1, 1, [10, 20, 30, 40])])
    with open(path, "w") as f:  # the escaping record written without an image file
        json.dump({"images": images, "annotations": [ann(1, 1, [10, 20, 30, 40])], "categories": CATEGORIES}, f)
    with pytest.raises(ValueError, match=rf"COCO annotation file .*instances_train.json: image id 2 has file_name "
                                         rf"'{re.escape(name)}', which leads outside the image folder"):
        load_roidb(dataset_cfg(tmp_path), "train")


def test_a_symlink_inside_the_image_folder_and_a_subfolder_name_stay_allowed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cv2.imwrite(str(elsewhere / "real.jpg"), np.zeros((80, 100, 3), np.uint8))
    images = [image_record(1), dict(image_record(2), file_name="sub/./2.jpg")]
    write_coco(str(tmp_path / "data"), "train", images, [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 5, 5])],
               image_files=False)
    folder = tmp_path / "data" / "images" / "train"
    os.symlink(elsewhere / "real.jpg", folder / "1.jpg")  # as the COCO minival layout links val2014 images
    (folder / "sub").mkdir()
    cv2.imwrite(str(folder / "sub" / "2.jpg"), np.zeros((80, 100, 3), np.uint8))
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": False}), "train")
    assert [read_image(entry["image"]).shape for entry in roidb] == [(80, 100, 3)] * 2


def test_a_voc_list_entry_leading_outside_the_dataset_is_refused(tmp_path):
    root = str(tmp_path / "data")
    write_voc(root, "2007", "trainval", {"000005": voc_xml(100, 80, [("dog", (11, 21, 40, 60), False)])})
    with open(os.path.join(root, "VOC2007", "ImageSets", "Main", "trainval.txt"), "a") as f:
        f.write("../../../etc/passwd\n")
    with pytest.raises(ValueError, match=r"names image '../../../etc/passwd', which leads outside"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "2007_trainval", training=False)
