"""The COCO reader: boxes, labels, crowds and the class mapping, the reference's image order, joined sets,
categories, test-dev image infos, minival folders, and every kind of bad COCO input.

Datasets here are a few hand-written records in tmp_path, so each expected box is worked out by hand.
"""
import json
import logging
import os
import subprocess

import cv2
import numpy as np
import pytest

from dataset_helpers import CATEGORIES, ann, by_id, dataset_cfg, image_record, voc_xml, write_coco, write_voc

from lib.config import load_config
from lib.dataset import coco as coco_module
from lib.dataset import load_roidb


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
