"""The Pascal VOC reader: boxes, difficult flags and joined years, a set's own classes (from the config or a
file) and image names, the image file from the XML, and bad annotations, boxes, files and class lists named."""
import logging
import os

import cv2
import numpy as np
import pytest

from dataset_helpers import by_id, dataset_cfg, voc_xml, write_voc

from lib.config import with_overrides
from lib.dataset import load_roidb
from lib.dataset.pascal_voc import HASHED_IDS, read_class_names, voc_image_id


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


def test_own_voc_classes_from_the_config_or_a_file_and_any_image_names(tmp_path):
    root = str(tmp_path / "data")
    write_voc(root, "mine", "train", {
        "field_a": voc_xml(100, 80, [("tractor", (11, 21, 40, 60), False), ("cow", (1, 1, 10, 10), False)]),
        "IMG-0042.v2": voc_xml(100, 80, [("cow", (5, 5, 20, 20), False)]),
    })
    (tmp_path / "classes.txt").write_text("# my classes\ncow\n\ntractor\n")
    by_list = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow, tractor]"}),
                         "mine_train", training=False)
    by_file = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc",
                                     **{"dataset.CLASSES_FILE": str(tmp_path / "classes.txt")}),
                         "mine_train", training=False)
    for roidb, dataset in (by_list, by_file):
        assert dataset.classes == ("__background__", "cow", "tractor") and dataset.num_classes == 3
        assert dataset.image_names == ["VOCmine/field_a", "VOCmine/IMG-0042.v2"] and not dataset.use_07_metric
        assert [e["gt_classes"].tolist() for e in roidb] == [[2, 1], [1]]  # labels in the list's order
        assert len(set(dataset.image_ids)) == 2 and all(i >= HASHED_IDS for i in dataset.image_ids)
        assert roidb[1]["image"] == os.path.join(root, "VOCmine", "JPEGImages", "IMG-0042.v2.jpg")
    assert by_list[1].image_ids == by_file[1].image_ids  # stable ids: proposal files keep matching
    assert voc_image_id("2007", "000005") == 20070000000005  # VOC's own names keep their ids

    # another class order is another roidb (labels differ): a separate cache, not the first one's
    swapped, _ = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[tractor, cow]"}),
                            "mine_train", training=False)
    assert swapped[0]["gt_classes"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="unknown class 'tractor'"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow]"}), "mine_train")


def test_voc_image_file_from_the_xml_and_bad_class_lists_named(tmp_path):
    root = str(tmp_path / "data")
    xml = voc_xml(100, 80, [("cow", (5, 5, 20, 20), False)]).replace("<annotation>",
                                                                     "<annotation><filename>scan.png</filename>")
    write_voc(root, "mine", "test", {"scan": xml})
    os.remove(os.path.join(root, "VOCmine", "JPEGImages", "scan.jpg"))
    cv2.imwrite(os.path.join(root, "VOCmine", "JPEGImages", "scan.png"), np.zeros((80, 100, 3), np.uint8))
    roidb, _ = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow]"}),
                          "mine_test", training=False)
    assert roidb[0]["image"].endswith(os.path.join("VOCmine", "JPEGImages", "scan.png"))
    for names, path, message in (([], str(tmp_path / "none.txt"), "cannot read"), (["a", "a"], "", "distinct"),
                                 (["a"], "x.txt", "not both"), (["__background__"], "", "distinct")):
        with pytest.raises(ValueError, match=message):
            read_class_names(names, path)
