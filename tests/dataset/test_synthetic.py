"""The synthetic COCO-format shapes dataset: layout, determinism, annotation/pixel agreement, atomic set-up."""
import contextlib
import io
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.dataset import load_roidb, read_image
from lib.dataset import synthetic
from lib.dataset.synthetic import CLASS_HUES, CLASSES, ensure_synthetic_dataset, generate_synthetic_coco


def files_of(path):
    """{relative path: bytes} of every file under ``path``."""
    out = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("synthetic") / "data")
    return ensure_synthetic_dataset(path, train=12, val=3, seed=1)


@pytest.fixture(scope="module")
def train_coco(dataset_dir):
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(os.path.join(dataset_dir, "annotations", "instances_train.json"))


def test_same_seed_same_bytes_and_val_independent_of_train_count(tmp_path):
    generate_synthetic_coco(str(tmp_path / "a"), train=2, val=2, seed=5)
    generate_synthetic_coco(str(tmp_path / "b"), train=2, val=2, seed=5)
    generate_synthetic_coco(str(tmp_path / "c"), train=1, val=2, seed=5)
    generate_synthetic_coco(str(tmp_path / "d"), train=1, val=0, seed=6)
    a, b, c, d = (files_of(str(tmp_path / name)) for name in "abcd")
    assert a == b
    image = os.path.join("images", "train", "000000000001.jpg")
    val_images = [name for name in a if name.startswith(os.path.join("images", "val"))]
    assert len(val_images) == 2 and all(c[name] == a[name] for name in val_images)
    assert c[image] == a[image]
    assert d[image] != a[image]


def test_layout_loads_with_pycocotools_and_follows_the_recipe(dataset_dir, train_coco):
    for split, count in (("train", 12), ("val", 3)):
        assert len(os.listdir(os.path.join(dataset_dir, "images", split))) == count
    assert [c["name"] for c in train_coco.loadCats(train_coco.getCatIds())] == list(CLASSES)
    sizes, counts = [], []
    for image in train_coco.loadImgs(train_coco.getImgIds()):
        assert 600 <= image["width"] <= 1600 and 600 <= image["height"] <= 1600
        pixels = cv2.imread(os.path.join(dataset_dir, "images", "train", image["file_name"]))
        assert pixels.shape == (image["height"], image["width"], 3)
        anns = train_coco.loadAnns(train_coco.getAnnIds(imgIds=image["id"]))
        counts.append(sum(not ann["iscrowd"] for ann in anns))
        for ann in anns:
            x, y, w, h = ann["bbox"]
            assert 0 <= x and 0 <= y and x + w <= image["width"] and y + h <= image["height"]
            polygon = np.array(ann["segmentation"][0]).reshape(-1, 2)
            # the box is the outline's tight extent and the area the outline's; the segmentation is the outline
            # moved out by half a pixel, at most twice that at a sharp corner (tests/chips/test_mask_data.py: it
            # covers the pixels drawn); 0.02: the file's rounding
            gaps = np.r_[[x, y] - polygon.min(0), polygon.max(0) - [x + w, y + h]]
            assert (gaps > 0).all() and (gaps <= 2 * 0.5 + 0.02).all(), gaps
            assert 0 < ann["area"] <= w * h + 0.1
            if not ann["iscrowd"]:
                sizes.append(np.sqrt(w * h))
    assert min(counts) >= 3 and max(counts) <= 15
    assert min(sizes) >= 8 - 0.05
    # every SNIPER valid range (sqrt area < 32, 32-150, > 150 px) gets objects
    sizes = np.array(sizes)
    assert (sizes < 32).sum() >= 5 and ((sizes >= 32) & (sizes < 150)).sum() >= 5 and (sizes >= 150).sum() >= 5


def test_pixels_inside_each_polygon_have_its_class_hue(dataset_dir, train_coco):
    checked, matching = 0, 0
    for image in train_coco.loadImgs(train_coco.getImgIds()):
        hsv = cv2.cvtColor(read_image(os.path.join(dataset_dir, "images", "train", image["file_name"])),
                           cv2.COLOR_BGR2HSV)
        for ann in train_coco.loadAnns(train_coco.getAnnIds(imgIds=image["id"], iscrowd=False)):
            mask = np.zeros(hsv.shape[:2], np.uint8)
            polygon = np.array(ann["segmentation"][0]).reshape(-1, 2) - 0.5  # COCO -> pixel centres
            cv2.fillPoly(mask, [np.round(polygon).astype(np.int32)], 1)
            mask = cv2.erode(mask, np.ones((5, 5), np.uint8))
            if mask.sum() < 20:
                continue
            hue, saturation, _ = np.median(hsv[mask > 0], axis=0)
            expected = CLASS_HUES[ann["category_id"] - 1]
            distance = min(abs(hue - expected), 180 - abs(hue - expected))
            checked += 1
            matching += distance <= 12 and saturation >= 120
    # a later object may cover part of an earlier one, so allow a few misses
    assert checked >= 50 and matching >= 0.9 * checked


def test_roidb_boxes_round_trip_to_coco_ap_of_one(dataset_dir, tmp_path):
    from pycocotools.cocoeval import COCOeval

    cfg = load_config(None, [("dataset.dataset_path", dataset_dir), ("dataset.root_path", str(tmp_path))])
    roidb, dataset = load_roidb(cfg, "train", training=False)
    assert dataset.num_classes == len(CLASSES) + 1
    results = [
        {"image_id": entry["id"], "category_id": dataset.category_ids[label], "score": 1.0,
         "bbox": [float(x1), float(y1), float(x2 - x1 + 1), float(y2 - y1 + 1)]}
        for entry in roidb for (x1, y1, x2, y2), label in zip(entry["boxes"], entry["gt_classes"])
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(dataset.coco, dataset.coco.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.stats[0] == pytest.approx(1.0)


def test_ensure_is_a_no_op_when_complete_and_never_replaces_other_settings(dataset_dir, tmp_path, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("regenerated a complete dataset")

    with monkeypatch.context() as patch:
        patch.setattr(synthetic, "generate_synthetic_coco", must_not_run)
        assert ensure_synthetic_dataset(dataset_dir, train=12, val=3, seed=1) == dataset_dir

    path = str(tmp_path / "data")
    assert ensure_synthetic_dataset(path, train=1, val=1, seed=0) == path
    before = {name: os.path.getmtime(os.path.join(path, "images", "train", name))
              for name in os.listdir(os.path.join(path, "images", "train"))}
    other = ensure_synthetic_dataset(path, train=2, val=0, seed=0)
    assert other == path + "-2-0-s0"  # other counts: their own folder beside it
    with open(os.path.join(other, synthetic.MANIFEST)) as f:
        assert json.load(f)["train"] == 2
    assert len(os.listdir(os.path.join(other, "images", "train"))) == 2
    assert os.listdir(os.path.join(other, "images", "val")) == []
    with open(os.path.join(path, synthetic.MANIFEST)) as f:  # the first dataset, untouched
        assert (json.load(f)["train"], len(os.listdir(os.path.join(path, "images", "val")))) == (1, 1)
    assert {name: os.path.getmtime(os.path.join(path, "images", "train", name)) for name in before} == before
    # asked again, each settings' folder is found, nothing regenerated
    with monkeypatch.context() as patch:
        patch.setattr(synthetic, "generate_synthetic_coco", must_not_run)
        assert ensure_synthetic_dataset(path, train=1, val=1, seed=0) == path
        assert ensure_synthetic_dataset(path, train=2, val=0, seed=0) == other
    assert sorted(os.listdir(tmp_path)) == ["data", "data-2-0-s0"]  # no temporary folders left behind


def test_ensure_never_leaves_half_a_dataset_and_never_overwrites_foreign_folders(tmp_path, monkeypatch):
    real_write_split = synthetic._write_split

    def killed_after_train(root, split, *args):
        if split == "val":
            raise KeyboardInterrupt
        real_write_split(root, split, *args)

    monkeypatch.setattr(synthetic, "_write_split", killed_after_train)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthetic_dataset(str(tmp_path / "data"), train=1, val=1, seed=0)
    assert os.listdir(tmp_path) == []

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        ensure_synthetic_dataset(str(foreign), train=1, val=1, seed=0)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_a_dataset_installed_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    path = str(tmp_path / "data")
    real_generate = synthetic.generate_synthetic_coco

    def racing(out_dir, train, val, seed):
        real_generate(path, train, val, seed)  # the other process finishes and installs first...
        with open(os.path.join(path, "installed_first"), "w"):
            pass
        real_generate(out_dir, train, val, seed)  # ...while this one is still generating its copy

    monkeypatch.setattr(synthetic, "generate_synthetic_coco", racing)
    assert ensure_synthetic_dataset(path, train=0, val=0, seed=0) == path
    assert os.path.isfile(os.path.join(path, "installed_first"))  # the complete dataset was not replaced
    assert sorted(os.listdir(tmp_path)) == ["data"]  # our copy and any temporary folder are gone

    # an incomplete dataset of the same settings found there at the end is replaced
    monkeypatch.setattr(synthetic, "generate_synthetic_coco", real_generate)
    os.remove(os.path.join(path, "annotations", "instances_val.json"))
    ensure_synthetic_dataset(path, train=0, val=0, seed=0)
    assert not os.path.exists(os.path.join(path, "installed_first"))
    assert os.path.isfile(os.path.join(path, "annotations", "instances_val.json"))
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_generator_rejects_bad_counts(tmp_path):
    with pytest.raises(ValueError, match="train"):
        generate_synthetic_coco(str(tmp_path), train=-1, val=1, seed=0)


def test_command_line_tool(tmp_path):
    out = tmp_path / "cli"
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_coco.py"), "--out", str(out),
                    "--train", "1", "--val", "1", "--seed", "3"], check=True, capture_output=True)
    with open(out / "annotations" / "instances_val.json") as f:
        assert len(json.load(f)["images"]) == 1
    assert len(os.listdir(out / "images" / "train")) == 1


def test_the_shipped_demo_picture_is_the_tiny_config_s_first_val_image():
    """docs/demo.jpg (README's demo commands) is what the generator writes as val image 1000001 with the tiny
    config's dataset.synthetic_seed: the project makes it, so it may ship."""
    from lib.dataset.synthetic import SPLITS, rendered_jpeg

    cfg = load_config(os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml"))
    (stream,) = [stream for split, stream, _ in SPLITS if split == "val"]
    _, _, made = rendered_jpeg(cfg.dataset.synthetic_seed, stream, 0)
    with open(os.path.join(ROOT, "docs", "demo.jpg"), "rb") as f:
        shipped = f.read()
    shipped, made = (cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).astype(np.int16)
                     for data in (shipped, made))
    assert shipped.shape == made.shape == (735, 1002, 3)
    assert np.abs(shipped - made).mean() < 0.5  # the same bytes, unless another libjpeg encoded it
