"""COCO and Pascal VOC readers, the roidb (flip, filter, cache, proposals) and every kind of bad input.

Datasets here are a few hand-written records in tmp_path, so each expected box is worked out by hand.
"""
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

from dataset_helpers import CATEGORIES, GOOD, ann, by_id, dataset_cfg, image_record, npz_bytes, png_bomb, png_header, \
    voc_xml, write_coco, write_voc

from lib.bootstrap import ROOT
from lib.boxes import flip_boxes
from lib.config import ConfigError, load_config, with_overrides
from lib.dataset import coco as coco_module
from lib.dataset import load_roidb, read_image
from lib.dataset import roidb as roidb_module
from lib.dataset.annotations import make_entry
from lib.dataset.base import Dataset
from lib.dataset.polygons import pack_polygons
from lib.dataset.proposals import write_proposals

# ---------------------------------------------------------------- COCO reading


def test_coco_boxes_labels_crowd_and_class_mapping(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [
        ann(10, 1, [10, 20, 30, 40], category_id=7),
        ann(11, 1, [0, 0, 5.5, 2], category_id=2),
        ann(12, 1, [50, 10, 20, 20], category_id=2, iscrowd=1),
    ])
    roidb, dataset = load_roidb(dataset_cfg(tmp_path), "train", training=False)
    assert dataset.classes == ["__background__", "two", "seven"]
    assert dataset.category_ids == [0, 2, 7]
    assert dataset.num_classes == 3 and dataset.image_ids == [1]
    (entry,) = roidb
    assert entry["image"] == str(tmp_path / "data" / "images" / "train" / "1.jpg")
    assert (entry["id"], entry["height"], entry["width"], entry["flipped"]) == (1, 80, 100, False)
    # [x, y, w, h] -> inclusive (x, y, x + w - 1, y + h - 1)
    np.testing.assert_array_equal(entry["boxes"], [[10, 20, 39, 59], [0, 0, 4.5, 1]])
    np.testing.assert_array_equal(entry["gt_classes"], [2, 1])
    np.testing.assert_array_equal(entry["crowd_boxes"], [[50, 10, 69, 29]])
    assert entry["boxes"].dtype == np.float32 and entry["gt_classes"].dtype == np.int32
    assert entry["crowd_boxes"].dtype == np.float32
    assert dataset.coco.getAnnIds(imgIds=1) == [10, 11, 12]


def test_coco_test_images_come_in_python_2_dict_order_training_ones_in_file_order(tmp_path):
    write_coco(str(tmp_path / "data"), "val", [image_record(i) for i in (9, 1, 3)],
               [ann(i, i, [0, 0, 10, 10]) for i in (9, 1, 3)])
    # table of 8 slots: 9 -> slot 1; 1 -> slot 1 taken, probe 5 * 1 + 1 + 1 = 7; 3 -> slot 3
    roidb, dataset = load_roidb(dataset_cfg(tmp_path), "val", training=False)
    assert [e["id"] for e in roidb] == [9, 3, 1] and dataset.image_ids == [9, 1, 3]
    in_file_order, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.TEST_IMAGE_ORDER": "file"}), "val", training=False)
    assert [e["id"] for e in in_file_order] == [9, 1, 3]
    training, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": False}), "val")
    assert [e["id"] for e in training] == [9, 1, 3]


def test_python2_dict_order_resizes_as_cpython_2_7():
    from lib.dataset.reference_rules import python2_dict_order

    keys = [40, 1, 2, 3, 4, 5]
    # five keys fit the 8 slots (40 in slot 0); the sixth fills two thirds: 32 slots, 40 moves to slot 8
    assert [keys[i] for i in python2_dict_order(keys[:5])] == [40, 1, 2, 3, 4]
    assert [keys[i] for i in python2_dict_order(keys)] == [1, 2, 3, 4, 5, 40]
    # 10 -> slot 2; 2 -> slot 2 taken, probe 5 * 2 + 2 + 1 = 13 -> slot 5; 7 -> slot 7; a repeat keeps its place
    assert python2_dict_order([10, 2, 7, 2]) == [0, 1, 2]
    # -1 hashes as -2: slot 6 of 8, in size_t arithmetic
    # (6 -> slot 6 taken, probe 5 * 6 + 6 + 1 = 37 -> slot 5); CPython 2.7 itself: the next test
    assert python2_dict_order([-1, 6]) == [1, 0] and python2_dict_order([7, -1]) == [1, 0]


def _python2():
    """CPython 2.7's interpreter (pyenv's 2.7.18 where installed), or None."""
    import shutil

    found = subprocess.run(["pyenv", "which", "python2.7"], capture_output=True, text=True,
                           env=dict(os.environ, PYENV_VERSION="2.7.18")) if shutil.which("pyenv") else None
    if found is not None and found.returncode == 0:
        return found.stdout.strip()
    return shutil.which("python2.7")


@pytest.mark.skipif(_python2() is None, reason="no Python 2.7 interpreter (pyenv 2.7.18 or python2.7 on PATH)")
@pytest.mark.parametrize("count", [5, 300, 5000, 60000])
def test_python2_dict_order_is_python_2_7_s_own_key_order(count):
    """The reference's getImgIds is its pycocotools' ``{im['id']: {} for im in images}.keys()`` under Python 2:
    the same dict built by a Python 2.7 interpreter from random COCO-like ids (file order, a few repeats)."""
    from lib.dataset.reference_rules import python2_dict_order

    ids = [int(i) for i in np.random.default_rng(count).integers(1, 600000, count)] + [-1, 7]
    script = "import json, sys\nids = json.load(sys.stdin)\nprint(json.dumps({i: {} for i in ids}.keys()))"
    done = subprocess.run([_python2(), "-c", script], input=json.dumps(ids), capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(done.stdout) == [ids[i] for i in python2_dict_order(ids)]


def test_joined_image_sets_keep_order_and_share_one_coco_index(tmp_path):
    root = str(tmp_path / "data")
    write_coco(root, "a", [image_record(1), image_record(2)], [ann(1, 1, [0, 0, 10, 10]), ann(2, 2, [0, 0, 9, 9])])
    write_coco(root, "b", [image_record(5)], [ann(3, 5, [1, 1, 10, 10], category_id=7)])
    roidb, dataset = load_roidb(dataset_cfg(tmp_path), "a+b", training=False)
    assert [e["id"] for e in roidb] == [1, 2, 5] == dataset.image_ids
    assert by_id(roidb)[5]["image"].endswith(os.path.join("images", "b", "5.jpg"))
    assert sorted(dataset.coco.getImgIds()) == [1, 2, 5] and len(dataset.coco.getAnnIds()) == 3


def test_joined_sets_must_share_categories_and_not_repeat_image_ids(tmp_path):
    root = str(tmp_path / "data")
    write_coco(root, "a", [image_record(1)], [ann(1, 1, [0, 0, 10, 10])])
    write_coco(root, "b", [image_record(1)], [ann(2, 1, [0, 0, 10, 10])])
    write_coco(root, "c", [image_record(3)], [ann(3, 3, [0, 0, 10, 10], category_id=1)],
               categories=[{"id": 1, "name": "other"}])
    with pytest.raises(ValueError, match=r"image id 1 appears twice"):
        load_roidb(dataset_cfg(tmp_path), "a+b", training=False)
    with pytest.raises(ValueError, match=r"instances_c\.json: categories differ"):
        load_roidb(dataset_cfg(tmp_path), "a+c", training=False)
    with pytest.raises(ValueError, match="empty name"):
        load_roidb(dataset_cfg(tmp_path), "a++c", training=False)


def test_num_classes_derived_when_zero_and_checked_when_set(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [0, 0, 10, 10])])
    assert load_roidb(dataset_cfg(tmp_path), "train")[1].num_classes == 3
    assert load_roidb(dataset_cfg(tmp_path, **{"dataset.NUM_CLASSES": 3}), "train")[1].num_classes == 3
    with pytest.raises(ValueError, match=r"NUM_CLASSES is 81.*2 categories.*3 classes"):
        load_roidb(dataset_cfg(tmp_path, **{"dataset.NUM_CLASSES": 81}), "train")


def test_a_training_start_checks_the_class_count_before_any_roidb_is_built(tmp_path):
    from lib.config import ConfigError
    from lib.start_checks import check_class_count

    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [0, 0, 10, 10])])
    check_class_count(dataset_cfg(tmp_path, **{"dataset.NUM_CLASSES": 3, "dataset.image_set": "train"}))
    with pytest.raises(ConfigError, match=r"NUM_CLASSES is 81, but coco image set 'train' in .*data has 2 "
                                          r"categories, i.e. 3 classes with background; set it to 3 or to 0"):
        check_class_count(dataset_cfg(tmp_path, **{"dataset.NUM_CLASSES": 81, "dataset.image_set": "train"}))
    assert not (tmp_path / "root").exists()  # no roidb built, nothing cached
    # a format whose classes come from the config: VOC's 20, or dataset.CLASSES
    write_voc(str(tmp_path / "voc"), "mine", "train", {"a": voc_xml(10, 10, [("cow", (1, 1, 5, 5), False)])})
    voc = {"dataset.dataset": "pascal_voc", "dataset.dataset_path": str(tmp_path / "voc"),
           "dataset.image_set": "mine_train", "dataset.NUM_CLASSES": 21}
    check_class_count(load_config(None, voc))
    with pytest.raises(ConfigError, match="NUM_CLASSES is 21, but pascal_voc image set 'mine_train' .* 1 categories"):
        check_class_count(load_config(None, {**voc, "dataset.CLASSES": "[cow]"}))


def categories_file(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_categories_are_read_by_a_scan_with_the_whole_file_read_where_the_scan_cannot_tell(tmp_path, monkeypatch):
    whole_reads = []
    monkeypatch.setattr(coco_module, "read_coco_json",
                        lambda path, read=coco_module.read_coco_json: whole_reads.append(path) or read(path))
    expected = [(2, "two"), (7, "seven")]
    cats = json.dumps(CATEGORIES)
    # COCO's own order, and the key between damaged images and annotations: only the key's value is parsed
    assert coco_module.read_categories(write_coco(str(tmp_path / "a"), "train", [image_record(1)], [])) == expected
    damaged = categories_file(tmp_path / "damaged.json", f'{{"images": [{{"id": 1, oops]], "categories": {cats} , '
                                                         f'"annotations": [}}')
    assert coco_module.read_categories(damaged) == expected and whole_reads == []
    # a list longer than the first window (1 MB): the window grows
    many = [{"id": i, "name": f"class {i:06d}" + "x" * 40} for i in range(1, 30001)]
    long_list = categories_file(tmp_path / "many.json", json.dumps({"annotations": [], "categories": many,
                                                                    "images": []}))
    assert len(coco_module.read_categories(long_list)) == 30000 and whole_reads == []
    # the name also in a value: the file is read whole (and the right key found)
    named = dict(image_record(1), file_name="categories")
    twice = categories_file(tmp_path / "twice.json", json.dumps({"images": [named], "annotations": [],
                                                                 "categories": CATEGORIES}))
    assert coco_module.read_categories(twice) == expected and whole_reads == [twice]
    # no such key (a truncated file): the whole read's error names the file
    cut = categories_file(tmp_path / "cut.json", '{"images": [], "annotations": [')
    with pytest.raises(ValueError, match="cut.json is not valid JSON"):
        coco_module.read_categories(cut)


def test_unknown_dataset_kind_is_named(tmp_path):
    with pytest.raises(ValueError, match="'imagenet'"):
        load_roidb(dataset_cfg(tmp_path, dataset="imagenet"), "train")


def write_image_info(root, image_set, image_folder, images, categories=CATEGORIES):
    """A COCO test-dev style set: ``annotations/image_info_{image_set}.json`` (images and categories,
    no 'annotations' key at all) with its images in ``images/{image_folder}``."""
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, "images", image_folder), exist_ok=True)
    with open(os.path.join(root, "annotations", f"image_info_{image_set}.json"), "w") as f:
        json.dump({"info": {"description": "test-dev"}, "images": images, "categories": categories}, f)
    for image in images:
        cv2.imwrite(os.path.join(root, "images", image_folder, image["file_name"]),
                    np.zeros((image["height"], image["width"], 3), np.uint8))


def test_coco_test_dev_image_info_loads_for_testing_without_boxes(tmp_path):
    root = str(tmp_path / "data")
    write_image_info(root, "test-dev2015", "test2015", [image_record(5, 60, 40), image_record(3)])
    roidb, dataset = load_roidb(dataset_cfg(tmp_path), "test-dev2015", training=False)
    assert dataset.annotation_files == [os.path.join(root, "annotations", "image_info_test-dev2015.json")]
    assert dataset.classes == ["__background__", "two", "seven"] and dataset.category_ids == [0, 2, 7]
    # the reference's order (slots 3 and 5 of a Python 2 dict), the ids in the file's
    assert [entry["id"] for entry in roidb] == [3, 5] and dataset.image_ids == [5, 3]
    assert roidb[1]["image"] == os.path.join(root, "images", "test2015", "5.jpg")  # COCO's test2015 folder
    assert (roidb[1]["height"], roidb[1]["width"]) == (40, 60)
    for entry in roidb:
        assert entry["boxes"].shape == (0, 4) and entry["gt_classes"].shape == (0,)
        assert entry["crowd_boxes"].shape == (0, 4) and entry["difficult"].shape == (0,)
    assert sorted(dataset.coco.getImgIds()) == [3, 5] and dataset.coco.getAnnIds() == []

    # an instances file, when there is one, is preferred; a folder named after the set is used when present
    write_coco(root, "test-dev2015", [image_record(9)], [ann(1, 9, [1, 2, 3, 4])])
    roidb, dataset = load_roidb(dataset_cfg(tmp_path), "test-dev2015", training=False)
    assert [len(entry["boxes"]) for entry in roidb] == [1]
    assert roidb[0]["image"] == os.path.join(root, "images", "test-dev2015", "9.jpg")


@pytest.mark.parametrize("image_set", ["minival2014", "sminival2014", "valminusminival2014", "myminival2017"])
def test_minival_sets_read_the_val_folder_unless_they_have_their_own(tmp_path, image_set):
    root = str(tmp_path / "data")
    year = image_set[-4:]
    write_coco(root, f"val{year}", [image_record(4)], [ann(1, 4, [1, 2, 3, 4])])
    os.rename(os.path.join(root, "annotations", f"instances_val{year}.json"),
              os.path.join(root, "annotations", f"instances_{image_set}.json"))
    roidb, _ = load_roidb(dataset_cfg(tmp_path), image_set, training=False)
    assert roidb[0]["image"] == os.path.join(root, "images", f"val{year}", "4.jpg")
    write_coco(root, image_set, [image_record(4)], [ann(1, 4, [1, 2, 3, 4])])  # a folder of its own wins
    roidb, _ = load_roidb(dataset_cfg(tmp_path), image_set, training=False)
    assert roidb[0]["image"] == os.path.join(root, "images", image_set, "4.jpg")


# ---------------------------------------------------------------- bad COCO input


def test_missing_annotation_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"instances_train\.json .* nor does image_info_train\.json"):
        load_roidb(dataset_cfg(tmp_path), "train")


@pytest.mark.parametrize("content, message", [
    (b"{\"images\": [", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b"{\"categories\": [{\"id\": 1, \"name\": \"a\"}]}", "'images' list"),
    (b"{\"images\": [], \"annotations\": [], \"categories\": []}", "'categories' list is empty"),
])
def test_invalid_annotation_file_is_an_error_naming_it(tmp_path, content, message):
    os.makedirs(tmp_path / "data" / "annotations")
    (tmp_path / "data" / "annotations" / "instances_train.json").write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        load_roidb(dataset_cfg(tmp_path), "train")
    assert "instances_train.json" in str(info.value)


def test_bad_boxes_are_skipped_or_clipped_counted_and_logged(tmp_path, caplog):
    nan = float("nan")
    write_coco(str(tmp_path / "data"), "train", [image_record(1, width=100, height=80), image_record(2, 50, 40)], [
        ann(1, 1, [10, 10, 20, 20]),  # fine: (10, 10, 29, 29)
        ann(2, 1, [10, 10, 0, 20]),  # w == 0
        ann(3, 1, [30, 10, -5, 20]),  # w < 0, i.e. x2 < x1
        ann(4, 1, [10, 10, 20, -1]),  # h < 0
        ann(5, 1, [10, nan, 20, 20]),  # NaN
        ann(6, 1, [10, 10, 20, 20], area=0),  # zero area
        ann(7, 1, [10, 10, 20]),  # not 4 numbers
        ann(8, 1, [90, -5, 20, 20]),  # partly outside -> (90, 0, 99, 14)
        ann(9, 1, [200, 10, 20, 20]),  # entirely outside
        ann(10, 2, [40, 30, 20, 20]),  # partly outside the smaller image 2 -> (40, 30, 49, 39)
        ann(11, 2, [60, 10, 5, 5]),  # inside image 1's width, outside image 2's
    ])
    with caplog.at_level(logging.WARNING):
        roidb, dataset = load_roidb(dataset_cfg(tmp_path), "train", training=False)
    np.testing.assert_array_equal(roidb[0]["boxes"], [[10, 10, 29, 29], [90, 0, 99, 14]])
    np.testing.assert_array_equal(roidb[1]["boxes"], [[40, 30, 49, 39]])
    assert dataset.box_report == {
        "non-positive width or height": 3,
        "non-finite coordinates": 1,
        "zero or invalid 'area'": 1,
        "malformed bbox (not a list of 4 numbers)": 1,
        "entirely outside the image": 2,
        "clipped to the image": 2,
    }
    log = caplog.text
    assert "instances_train.json" in log
    assert "skipped 3 boxes: non-positive width or height (e.g. 2, 3, 4)" in log
    assert "skipped 2 boxes: entirely outside the image (e.g. 9, 11)" in log
    assert "fixed 2 boxes: clipped to the image (e.g. 8, 10)" in log


def test_images_without_files_are_an_error_listing_their_ids(tmp_path):
    root = str(tmp_path / "data")
    write_coco(root, "train", [image_record(i) for i in range(1, 9)],
               [ann(i, i, [0, 0, 10, 10]) for i in range(1, 9)])
    for image_id in (2, 3, 4, 5, 6, 7, 8):
        os.remove(os.path.join(root, "images", "train", f"{image_id}.jpg"))
    with pytest.raises(FileNotFoundError, match=r"7 of 8 images.*image id 2: .*2\.jpg.*image id 6") as info:
        load_roidb(dataset_cfg(tmp_path), "train")
    assert "image id 7" not in str(info.value)  # only the first few are listed


@pytest.mark.parametrize("bad, message", [
    ({"image_id": 99}, "annotation 1 refers to image id 99"),
    ({"category_id": 5}, "annotation 1 has category_id 5"),
    ({"id": None}, "has no integer 'id'"),
])
def test_annotations_pointing_nowhere_are_errors(tmp_path, bad, message):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [{**ann(1, 1, [0, 0, 10, 10]), **bad}])
    with pytest.raises(ValueError, match=message):
        load_roidb(dataset_cfg(tmp_path), "train")


@pytest.mark.parametrize("image, message", [
    ({"id": 1, "file_name": "1.jpg", "width": 0, "height": 80}, "image id 1 has invalid width 0"),
    ({"id": 1, "width": 100, "height": 80}, "image id 1 has no 'file_name'"),
    ({"id": "1", "file_name": "1.jpg", "width": 100, "height": 80}, "has no integer 'id'"),
])
def test_malformed_image_records_are_errors(tmp_path, image, message):
    write_coco(str(tmp_path / "data"), "train", [image], [], image_files=False)
    with pytest.raises(ValueError, match=message):
        load_roidb(dataset_cfg(tmp_path), "train")


def test_duplicate_annotation_ids_are_an_error(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [0, 0, 5, 5]), ann(1, 1, [0, 0, 6, 6])])
    with pytest.raises(ValueError, match="annotation id 1 appears twice"):
        load_roidb(dataset_cfg(tmp_path), "train")


# ---------------------------------------------------------------- training roidb


def test_training_roidb_drops_images_without_boxes_and_appends_flips(tmp_path, caplog):
    images = [image_record(i) for i in (1, 2, 3, 4)]
    write_coco(str(tmp_path / "data"), "train", images, [
        ann(1, 1, [10, 20, 30, 40]),
        ann(2, 1, [0, 0, 10, 10], iscrowd=1),
        ann(3, 2, [0, 0, 10, 10], iscrowd=1),  # image 2: only a crowd region
        ann(4, 3, [10, 10, 0, 5]),  # image 3: only a broken box; image 4: no annotation at all
    ])
    with caplog.at_level(logging.WARNING):
        roidb, dataset = load_roidb(dataset_cfg(tmp_path), "train")
    assert "dropped 3 of 4 training images without usable boxes (e.g. image ids 2, 3, 4)" in caplog.text
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False), (1, True)]
    assert "difficult" not in roidb[0]
    flipped = roidb[1]
    # width 100: x -> 99 - x, so (10, 20, 39, 59) -> (60, 20, 89, 59)
    np.testing.assert_array_equal(flipped["boxes"], [[60, 20, 89, 59]])
    np.testing.assert_array_equal(flipped["crowd_boxes"], [[90, 0, 99, 9]])
    np.testing.assert_array_equal(flipped["gt_classes"], roidb[0]["gt_classes"])
    assert flipped["image"] == roidb[0]["image"]

    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False)]


def test_flip_boxes_twice_is_identity_and_matches_mirrored_pixels():
    boxes = np.array([[0, 0, 0, 0], [3, 1, 7, 2], [0, 0, 9, 4]], np.float32)
    np.testing.assert_array_equal(flip_boxes(flip_boxes(boxes, 10), 10), boxes)
    mask = np.zeros((5, 10), bool)
    mask[1:3, 3:8] = True
    mirrored = mask[:, ::-1]
    x1, y1, x2, y2 = flip_boxes(boxes[1:2], 10)[0]
    cols = np.flatnonzero(mirrored.any(axis=0))
    assert (x1, x2) == (cols[0], cols[-1]) and (y1, y2) == (1, 2)


@pytest.mark.parametrize("integer", [True, False])
def test_training_boxes_are_truncated_to_whole_pixels_before_mirroring(tmp_path, integer):
    # [10.7, 5.2, w 20.2, h 15.3] -> inclusive (10.7, 5.2, 29.9, 19.5); the reference stores uint16:
    # (10, 5, 29, 19), mirrored in a 100 px image from those: (70, 5, 89, 19)
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10.7, 5.2, 20.2, 15.3])])
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.INTEGER_BOXES": integer}), "train")
    if integer:
        expected, mirrored = [[10, 5, 29, 19]], [[70, 5, 89, 19]]
    else:
        expected, mirrored = [[10.7, 5.2, 29.9, 19.5]], [[69.1, 5.2, 88.3, 19.5]]
    np.testing.assert_allclose(by_id(roidb)[1]["boxes"], expected, rtol=1e-6)
    np.testing.assert_allclose(by_id(roidb, flipped=True)[1]["boxes"], mirrored, rtol=1e-6)
    assert all(e["boxes"].dtype == np.float32 for e in roidb)
    test_roidb, _ = load_roidb(dataset_cfg(tmp_path), "train", training=False)  # evaluation keeps the annotation
    np.testing.assert_allclose(test_roidb[0]["boxes"], [[10.7, 5.2, 29.9, 19.5]], rtol=1e-6)


# ---------------------------------------------------------------- cache


def caches(cache_dir):
    return sorted(name for name in os.listdir(cache_dir) if name.endswith(".pkl"))


def test_cache_is_reused_rebuilt_on_content_change_and_survives_corruption(tmp_path, monkeypatch, caplog):
    root = str(tmp_path / "data")
    write_coco(root, "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    cfg = dataset_cfg(tmp_path)
    first, _ = load_roidb(cfg, "train")
    cache_dir = tmp_path / "root" / "cache"
    assert sorted(os.listdir(cache_dir)) == [".roidb_cache_key", *caches(cache_dir)]  # no temporary leftovers
    assert len(caches(cache_dir)) == 1

    real_load = coco_module.CocoDataset.load_entries
    monkeypatch.setattr(coco_module.CocoDataset, "load_entries", lambda self: pytest.fail("cache not used"))
    cached, dataset = load_roidb(cfg, "train")
    np.testing.assert_array_equal(cached[0]["boxes"], first[0]["boxes"])
    assert dataset.classes == ["__background__", "two", "seven"]
    assert dataset.coco.getAnnIds() == [1]  # the COCO index comes back on demand
    monkeypatch.setattr(coco_module.CocoDataset, "load_entries", real_load)

    # same file name, same size, different content: a new roidb, never the stale one
    write_coco(root, "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 41])])
    changed, _ = load_roidb(cfg, "train")
    np.testing.assert_array_equal(changed[0]["boxes"], [[10, 20, 39, 60]])
    assert len(caches(cache_dir)) == 2

    # the option that changes the roidb is part of the key too
    load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert len(caches(cache_dir)) == 3

    newest = max((cache_dir / name for name in caches(cache_dir)), key=os.path.getmtime)
    newest.write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING):
        rebuilt, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert "fails verification" in caplog.text
    np.testing.assert_array_equal(rebuilt[0]["boxes"], [[10, 20, 39, 60]])
    assert not [name for name in os.listdir(cache_dir) if name.startswith(".tmp")]


# ---------------------------------------------------------------- proposals


def test_proposals_attached_mirrored_and_missing_ids_counted(tmp_path, caplog):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])])
    proposals = {1: np.array([[5, 6, 20, 30, 0.9], [0, 0, 99, 79, 0.1]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train")
    assert "no proposals for 1 of 2 images (e.g. image ids 2)" in caplog.text
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], [[5, 6, 20, 30], [0, 0, 99, 79]])
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"], [[79, 6, 94, 30], [0, 0, 99, 79]])
    for flipped in (False, True):
        assert by_id(roidb, flipped)[2]["proposals"].shape == (0, 4)
    assert all(e["proposals"].dtype == np.float32 for e in roidb)

    test_roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train", training=False)
    assert "proposals" not in test_roidb[0]


@pytest.mark.parametrize("thresh", [0.7, 0.0])
def test_pooled_proposals_go_through_nms_before_mirroring(tmp_path, thresh):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    # (0, 0, 19, 19) vs (0, 0, 19, 21): IoU 400 / 440 = 0.91 > 0.7, the lower score goes; (0, 0, 19, 27):
    # IoU with the first 400 / 560 = 0.71 > 0.7 too; (50, 50, 69, 69) overlaps nothing
    proposals = {1: np.array([[0, 0, 19, 21, 0.5], [0, 0, 19, 19, 0.9], [50, 50, 69, 69, 0.1],
                              [0, 0, 19, 27, 0.3]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path, "dataset.PROPOSAL_NMS": thresh}),
                          "train")
    kept = [[0, 0, 19, 19], [50, 50, 69, 69]] if thresh else proposals[1][:, :4]
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], kept)
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"], flip_boxes(kept, 100))


@pytest.mark.parametrize("content, error, message", [
    (None, IOError, "cannot read proposal file"),
    (b"not an npz", ValueError, "not a readable proposal .npz"),
    (pickle.dumps({1: np.zeros((3, 5))}), ValueError, "is a pickle .* tools/convert_proposals.py"),
    (npz_bytes(**{**GOOD, "boxes": np.zeros((3, 2), np.float32)}), ValueError, r"boxes must be .* \(3, 2\)"),
    (npz_bytes(**{k: v for k, v in GOOD.items() if k != "offsets"}), ValueError, "lacks array.* offsets"),
    (npz_bytes(**{**GOOD, "offsets": np.array([0, 2])}), ValueError, "offsets must rise from 0 to 1"),
    (npz_bytes(**{**GOOD, "image_ids": np.array([1, 1]), "offsets": np.array([0, 1, 1])}), ValueError,
     "not distinct"),
    (npz_bytes(**{**GOOD, "image_ids": np.array([[1]], dtype=object)}), ValueError, "Object arrays cannot"),
])
def test_bad_proposal_files_are_errors_naming_them(tmp_path, content, error, message):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    path = tmp_path / "proposals.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(error, match=message) as info:
        load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train")
    assert "proposals.npz" in str(info.value)


def test_unusable_proposals_are_dropped_counted_by_reason_and_warned_once(tmp_path, caplog):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])])  # images 100 x 80 (w x h)
    inside = [[5, 6, 20, 30, 0.9], [99, 79, 120, 100, 0.5], [-10, -10, 0, 0, 0.5], [98.5, 0, 99.9, 5, 0.3],
              [7, 7, 7, 7, 0.2]]  # the last one pixel: inclusive boxes
    outside = [[99.5, 0, 130, 10, 0.8], [0, 79.5, 10, 90, 0.8], [-20, 5, -0.5, 10, 0.7], [5, -9, 9, -1, 0.7],
               [150, 150, 200, 200, 0.6], [np.nan, 0, 5, 5, 0.5], [20, 5, 10, 15, 0.5], [5, 20, 15, 19.5, 0.4]]
    proposals = {1: np.array(inside[:2] + outside + inside[2:], np.float32),
                 2: np.array([inside[0], [300, 10, 320, 20, 0.4]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path, "dataset.PROPOSAL_NMS": 0}),
                              "train")
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], np.array(inside, np.float32)[:, :4])
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"],
                                  flip_boxes(np.array(inside)[:, :4], 100))
    np.testing.assert_array_equal(by_id(roidb)[2]["proposals"], [inside[0][:4]])
    warnings = [r.getMessage() for r in caplog.records if "proposal file" in r.getMessage()]
    assert len(warnings) == 1  # once for the file, the flipped copies not counted again
    assert "dropped 9 proposals (1 not finite, 2 inverted or empty, 6 outside their image)" in warnings[0]
    assert "in 2 images" in warnings[0] and "image id 1: 8" in warnings[0] and "image id 2: 1" in warnings[0]


def test_an_inverted_proposal_is_a_counted_skip_not_a_stop_of_mining(tmp_path):
    from chip_generator.mining import MiningParams, mine_image_chips

    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    proposals = {1: np.array([[40, 10, 20, 30, 0.9], [50, 40, 70, 60, 0.8]], np.float32)}  # the first: x2 < x1
    write_proposals(proposals, str(tmp_path / "proposals.npz"))
    cfg = dataset_cfg(tmp_path, **{"dataset.proposal": tmp_path / "proposals.npz", "dataset.PROPOSAL_NMS": 0,
                                   "TRAIN.USE_NEG_CHIPS": True})
    roidb, _ = load_roidb(cfg, "train")
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], [[50, 40, 70, 60]])
    mine_image_chips(by_id(roidb)[1], MiningParams.from_config(cfg), 32, np.random.default_rng(0))  # no error


def test_proposal_file_is_not_read_without_negative_chips(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    missing = tmp_path / "never_written.pkl"
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": missing, "TRAIN.USE_NEG_CHIPS": False}),
                          "train")
    assert roidb and all("proposals" not in entry for entry in roidb)


# ---------------------------------------------------------------- Pascal VOC


def test_voc_boxes_difficult_and_joined_years(tmp_path, caplog):
    root = str(tmp_path / "data")
    write_voc(root, "2007", "trainval", {
        "000005": voc_xml(100, 80, [("dog", (11, 21, 40, 60), False), ("cat", (1, 1, 10, 10), True),
                                    ("person", (90, 70, 120, 80), False)]),
        "000007": voc_xml(100, 80, [("cat", (5, 5, 20, 20), True)]),
    })
    write_voc(root, "2012", "trainval", {"2008_000008": voc_xml(50, 40, [("tvmonitor", (1, 1, 50, 40), False)])})
    cfg = dataset_cfg(tmp_path, dataset="pascal_voc")
    with caplog.at_level(logging.WARNING):
        test_roidb, dataset = load_roidb(cfg, "2007_trainval+2012_trainval", training=False)
    assert "fixed 1 boxes: clipped to the image (e.g. VOC2007/000005 object 2)" in caplog.text
    assert dataset.num_classes == 21 and dataset.classes[12] == "dog" and not dataset.use_07_metric
    assert dataset.image_ids == [20070000000005, 20070000000007, 20122008000008]
    assert dataset.image_names == ["VOC2007/000005", "VOC2007/000007", "VOC2012/2008_000008"]
    entry = by_id(test_roidb)[20070000000005]
    assert entry["image"] == os.path.join(root, "VOC2007", "JPEGImages", "000005.jpg")
    # 1-based inclusive -> 0-based inclusive; the person box is clipped to (89, 69, 99, 79)
    np.testing.assert_array_equal(entry["boxes"], [[10, 20, 39, 59], [0, 0, 9, 9], [89, 69, 99, 79]])
    np.testing.assert_array_equal(entry["gt_classes"], [12, 8, 15])
    np.testing.assert_array_equal(entry["difficult"], [False, True, False])  # kept for evaluation

    train_roidb, _ = load_roidb(cfg, "2007_trainval+2012_trainval")
    entry = by_id(train_roidb)[20070000000005]
    np.testing.assert_array_equal(entry["boxes"], [[10, 20, 39, 59], [89, 69, 99, 79]])
    np.testing.assert_array_equal(entry["crowd_boxes"], [[0, 0, 9, 9]])  # difficult: kept aside, not trained on
    assert 20070000000007 not in by_id(train_roidb)  # only a difficult object: no training boxes
    assert sorted(by_id(train_roidb, flipped=True)) == [20070000000005, 20122008000008]
    assert load_roidb(cfg, "2007_trainval", training=False)[1].use_07_metric
    # TEST.VOC_EVAL_RULES: a 30 x 20.04 px detection of the 30 x 40 px dog, IoU 0.501; the reference's 0.1 px
    # result file makes it 30 x 20, IoU 0.5: not a hit
    found = [np.array([[10, 20, 39, 39.04, 0.9, 12]]) if e["id"] == 20070000000005 else np.zeros((0, 6))
             for e in test_roidb]
    for rules, ap in (("reference", 0.0), ("exact", 1.0)):
        result = dataset.evaluate(test_roidb, found, str(tmp_path / rules), scoring=with_overrides(
            cfg, {"TEST.VOC_EVAL_RULES": rules}).TEST)["stats"]
        assert result["rules"] == rules and result["AP"]["dog"] == pytest.approx(ap)


@pytest.mark.parametrize("xml, error, message", [
    (voc_xml(100, 80, [("unicorn", (1, 1, 5, 5), False)]), ValueError, "unknown class 'unicorn'"),
    ("<annotation><size>", ValueError, "not valid XML"),
    ("<annotation><object/></annotation>", ValueError, r"invalid <size><width>"),
])
def test_bad_voc_annotations_are_errors_naming_the_file(tmp_path, xml, error, message):
    write_voc(str(tmp_path / "data"), "2007", "test", {"000001": xml})
    with pytest.raises(error, match=message) as info:
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "2007_test")
    assert "000001.xml" in str(info.value)


def test_bad_voc_boxes_skipped_and_missing_files_named(tmp_path):
    root = str(tmp_path / "data")
    write_voc(root, "2007", "test", {"000001": voc_xml(100, 80, [("dog", (30, 5, 10, 20), False),
                                                                 ("dog", (1, 1, "x", 5), False),
                                                                 ("dog", (1, 1, 5, 5), False)])})
    roidb, dataset = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "2007_test", training=False)
    np.testing.assert_array_equal(roidb[0]["boxes"], [[0, 0, 4, 4]])
    assert dataset.box_report == {"x2 < x1 or y2 < y1": 1, "malformed <bndbox>": 1}

    with pytest.raises(ValueError, match="YEAR_SPLIT"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "trainval")
    with pytest.raises(FileNotFoundError, match=r"VOC2012.*val\.txt"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "2012_val")
    with open(os.path.join(root, "VOC2007", "ImageSets", "Main", "test.txt"), "a") as f:
        f.write("000002\n")
    with pytest.raises(FileNotFoundError, match=r"000002\.xml"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc"), "2007_test")


# ---------------------------------------------------------------- image reading


def test_read_image_converts_gray_and_alpha_to_bgr(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    cv2.imwrite(str(tmp_path / "gray.png"), gray)
    image = read_image(str(tmp_path / "gray.png"))
    assert image.shape == (3, 4, 3) and image.dtype == np.uint8
    for channel in range(3):
        np.testing.assert_array_equal(image[:, :, channel], gray)

    bgra = np.random.default_rng(0).integers(0, 256, (5, 6, 4), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "bgra.png"), bgra)
    np.testing.assert_array_equal(read_image(str(tmp_path / "bgra.png")), bgra[:, :, :3])

    deep = (np.arange(6, dtype=np.uint16).reshape(2, 3) * 10000)
    cv2.imwrite(str(tmp_path / "deep.png"), deep)
    np.testing.assert_array_equal(read_image(str(tmp_path / "deep.png"))[:, :, 0], deep >> 8)


def test_read_image_errors_name_the_file(tmp_path):
    with pytest.raises(IOError, match=r"cannot read image .*missing\.jpg"):
        read_image(str(tmp_path / "missing.jpg"))
    (tmp_path / "junk.jpg").write_bytes(b"definitely not a jpeg")
    with pytest.raises(IOError, match=r"cannot decode image .*junk\.jpg"):
        read_image(str(tmp_path / "junk.jpg"))
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(IOError, match=r"empty\.jpg"):
        read_image(str(tmp_path / "empty.jpg"))


# ---------------------------------------------------------------- nothing read from disk runs code


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
    (cache_file,) = caches(cache_dir)
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


def photo_like(height=120, width=160):
    """A smooth image with detail (JPEG's entropy-coded data of it is tens of kB, like a photo's)."""
    y, x = np.mgrid[:height, :width]
    noise = np.random.default_rng(1).integers(0, 40, (height, width, 3))
    return np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=2).astype(np.uint8) + noise.astype(np.uint8)


def encoded(ext, image, *params):
    ok, data = cv2.imencode(ext, image, list(params))
    assert ok
    return data.tobytes()


@pytest.mark.parametrize("ext, params", [(".jpg", ()), (".jpg", (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)), (".png", ())])
def test_a_truncated_image_is_refused_naming_the_file(tmp_path, ext, params):
    data = encoded(ext, photo_like(), *params)
    cut = data[:len(data) * 2 // 3]
    # the decoder alone fills a baseline JPEG's missing rows with grey and says nothing: the premise
    if ext == ".jpg" and not params:
        decoded = cv2.imdecode(np.frombuffer(cut, np.uint8), cv2.IMREAD_COLOR)
        assert decoded is not None and decoded.shape == (120, 160, 3)
    path = tmp_path / f"cut{ext}"
    path.write_bytes(cut)
    with pytest.raises(IOError, match=rf"truncated image .*cut\{ext}: the file ends before its end-of-image marker"):
        read_image(str(path))
    path.write_bytes(data)
    np.testing.assert_array_equal(read_image(str(path)), cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))


def test_bytes_after_the_jpeg_end_marker_are_allowed(tmp_path):
    data = encoded(".jpg", photo_like())
    expected = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    # zero padding; a camera-style trailer whose bytes include markers (FFDA: start of scan) but no FFD9
    for tail in (b"\x00" * 100, b"SEFH\xff\xda\x00\x0c" + bytes(range(0, 0xD9)) + b"\xff\xda"):
        (tmp_path / "tail.jpg").write_bytes(data + tail)
        np.testing.assert_array_equal(read_image(str(tmp_path / "tail.jpg")), expected)


def test_a_truncated_jpeg_with_a_complete_thumbnail_inside_is_refused(tmp_path):
    """An EXIF thumbnail is a whole JPEG (with its own end marker FFD9) inside an APP1 segment: finding
    an FFD9 somewhere is not enough, the segments are walked."""
    thumbnail = encoded(".jpg", photo_like(16, 16))
    app1 = b"\xff\xe1" + (len(thumbnail) + 8).to_bytes(2, "big") + b"Exif\x00\x00" + thumbnail
    main = encoded(".jpg", photo_like())
    whole = main[:2] + app1 + main[2:]
    (tmp_path / "exif.jpg").write_bytes(whole)
    assert read_image(str(tmp_path / "exif.jpg")).shape == (120, 160, 3)
    (tmp_path / "exif.jpg").write_bytes(whole[:len(whole) - len(main) // 3])
    assert whole[:len(whole) - len(main) // 3].rfind(b"\xff\xd9") > 0
    with pytest.raises(IOError, match="truncated image .*exif.jpg"):
        read_image(str(tmp_path / "exif.jpg"))


# ---------------------------------------------------------------- image paths stay inside the data


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


# ---------------------------------------------------------------- images that would exhaust memory


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_declared_size_reads_the_header_of_real_files(tmp_path, ext):
    from lib.dataset.image_io import declared_size

    path = str(tmp_path / f"x{ext}")
    cv2.imwrite(path, np.zeros((37, 53, 3), np.uint8))
    with open(path, "rb") as f:
        assert declared_size(f.read()) == (37, 53)
    assert declared_size(b"BM not a jpeg or png") is None


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    from lib.dataset import image_io

    path = tmp_path / "bomb.png"
    path.write_bytes(png_header(100_000, 100_000) + b"\x00" * 64)
    monkeypatch.setattr(image_io.cv2, "imdecode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(IOError, match=r"bomb.png declares 100000x100000 pixels \(10000 Mpx\), more than "
                                      r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); not decoded"):
        image_io.read_image(str(path), max_pixels=1_000_000_000)
    # annotated small, the header says otherwise: refused with the annotated-size message, not decoded
    entry = {"image": str(path), "height": 40, "width": 30}
    with pytest.raises(IOError, match=r"is 100000x100000 pixels, but its annotations say 30x40"):
        image_io.read_roidb_image(entry)


def test_an_image_read_without_a_config_is_held_to_the_keys_default_limit(tmp_path, monkeypatch):
    from lib.dataset import image_io

    path = tmp_path / "bomb.png"
    path.write_bytes(png_bomb(40_000, 30_000))  # 1.2 Gpx
    monkeypatch.setattr(image_io.cv2, "imdecode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(IOError, match=r"bomb.png declares 40000x30000 pixels \(1200 Mpx\), more than "
                                      r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); not decoded"):
        image_io.read_image(str(path))
    assert image_io.DEFAULT_MAX_PIXELS == load_config(None).dataset.MAX_IMAGE_PIXELS


def test_an_annotated_size_over_the_pixel_limit_is_refused_at_load(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2, width=100_000, height=100_000)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])], image_files=False)
    with pytest.raises(ValueError, match=r"image id 2 .* is annotated 100000x100000 pixels \(10000 Mpx\), more than "
                                         r"dataset.MAX_IMAGE_PIXELS \(1000 Mpx\); 1 image\(s\) are over it"):
        load_roidb(dataset_cfg(tmp_path), "train")


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
