"""Testing a folder of images (main_test.py --images, lib.inference.image_folder): COCO results and pictures,
end to end from a run folder, and an image over the pixel limit a counted skip."""
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from lib.bootstrap import ROOT
from lib.config import with_overrides
from lib.dataset import load_roidb
from lib.inference.image_folder import detect_images, image_entries, image_ids, list_images
from lib.run import checkpoint
from lib.run.checkpoint import output_dir
from lib.run.folder import MODEL_KEY, model_info, write_run_config
from dataset_helpers import png_bomb
from detector_helpers import IMAGES, OracleDetector


def test_main_test_images_runs_a_run_folder_over_a_folder_end_to_end(tiny, tmp_path):
    # a run folder as training leaves it (config.yaml, a checkpoint with its metadata) of the tiny random network
    cfg = with_overrides(tiny[0], {"output_path": str(tmp_path / "out"), "TEST.NUM_PROCESS": 0})
    _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    write_run_config(cfg)
    checkpoint.save_checkpoint(checkpoint.checkpoint_prefix(cfg), 1, None, *tiny[1:], stds=(1, 1, 1, 1),
                               means=(0, 0, 0, 0), progress={MODEL_KEY: model_info(cfg, dataset, False)})
    folder = tmp_path / "new images"
    shutil.copytree(os.path.join(cfg.dataset.dataset_path, "images", "val"), folder)  # a b broken.jpg c
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main_test.py"), "--model", output_dir(cfg),
                             "--images", str(folder), "--draw", "--set", "TEST.SCORE_THRESH", "0"],
                            cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    out = os.path.join(output_dir(cfg), "results", "images_new images")
    summary = json.load(open(os.path.join(out, "test_summary.json")))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 3, 1)
    assert summary["checkpoint"] == checkpoint.params_path(checkpoint.checkpoint_prefix(cfg), 1)
    info = json.load(open(os.path.join(out, "image_info.json")))
    assert [(i["id"], i["file_name"], i["width"], i["height"]) for i in info["images"]] == \
        [(1, "a.png", 80, 60), (2, "b.png", 50, 90), (4, "c.png", 40, 40)]
    assert info["categories"] == [{"id": 4, "name": "cat4"}, {"id": 9, "name": "cat9"}]  # the run's classes
    results = json.load(open(os.path.join(out, "detections_results.json")))
    assert results and {r["image_id"] for r in results} <= {1, 2, 4} and {r["category_id"] for r in results} <= {4, 9}
    assert sorted(os.listdir(os.path.join(out, "drawn"))) == ["a.jpg", "b.jpg", "c.jpg"]
    assert cv2.imread(os.path.join(out, "drawn", "b.jpg")).shape == (90, 50, 3)
    log = max(glob.glob(os.path.join(output_dir(cfg), "test_*.log")), key=os.path.getmtime)
    text = open(log).read()
    assert "broken.jpg" in text and re.search(r"tested 3 of 4 images of .* \(\d+\.\d+ images/s\)", text)
    assert not os.listdir(elsewhere)


class NamedOracle(OracleDetector):
    """test_tester's oracle network with class names."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.classes = ["__background__", "first", "second"]


def test_a_folder_of_images_is_tested_into_coco_results_and_drawn(tiny, tmp_path):
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0})
    folder = os.path.join(cfg.dataset.dataset_path, "images", "val")  # a.png b.png broken.jpg c.png
    summary = detect_images(cfg, folder, str(tmp_path / "out"), draw=True, thresh=0.5, detector=NamedOracle(cfg))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 3, 1)
    assert summary["images_per_s"] > 0
    info = json.load(open(tmp_path / "out" / "image_info.json"))
    # names are not numbers: ids 1..N in sorted order (broken.jpg has no readable header and no entry)
    assert [(i["id"], i["file_name"], i["width"], i["height"]) for i in info["images"]] == \
        [(1, "a.png", 80, 60), (2, "b.png", 50, 90), (4, "c.png", 40, 40)]
    assert [c["name"] for c in info["categories"]] == ["first", "second"]
    results = json.load(open(summary["results"]))
    ids = {"a.png": 1, "b.png": 2, "c.png": 4}
    assert sorted((r["image_id"], r["category_id"], tuple(r["bbox"])) for r in results) == sorted(
        (ids[name], label, (x1, y1, x2 - x1 + 1, y2 - y1 + 1))
        for name, _, _, _, objects in IMAGES["val"] if name in ids for (x1, y1, x2, y2), label in objects)
    assert sorted(os.listdir(tmp_path / "out" / "drawn")) == ["a.jpg", "b.jpg", "c.jpg"]
    drawn = cv2.imread(str(tmp_path / "out" / "drawn" / "a.jpg"))
    assert drawn.shape == (60, 80, 3)

    listed = tmp_path / "list.txt"
    listed.write_text(f"# two of them\n{os.path.join(folder, 'c.png')}\n\n{os.path.join(folder, 'a.png')}\n")
    assert list_images(str(listed)) == [os.path.join(folder, "c.png"), os.path.join(folder, "a.png")]
    assert image_ids(["x/000000000139.jpg", "y/42.png"]) == [139, 42] and image_ids(["1.jpg", "01.jpg"]) == [1, 2]
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        list_images(str(tmp_path / "nowhere"))


def test_a_folder_image_over_the_pixel_limit_is_a_counted_skip_naming_file_size_and_key(tiny, tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "small.png"), np.zeros((60, 80, 3), np.uint8))
    (folder / "bomb.png").write_bytes(png_bomb(100_000, 100_000))  # a few hundred bytes declaring 10 Gpx
    (folder / "large.png").write_bytes(png_bomb(20_000, 10_000))  # 200 Mpx: over Pillow's own limit, not the key's
    with caplog.at_level(logging.ERROR, logger="lib.inference.image_folder"):
        entries, unreadable = image_entries(list_images(str(folder)), 1_000_000_000)
    assert [(os.path.basename(e["image"]), e["width"], e["height"]) for e in entries] == [
        ("large.png", 20_000, 10_000), ("small.png", 80, 60)]
    bomb = str(folder / "bomb.png")
    message = (f"image {bomb} declares 100000x100000 pixels (10000 Mpx), more than dataset.MAX_IMAGE_PIXELS "
               f"(1000 Mpx); not decoded")
    assert len(unreadable) == 1 and unreadable[0][0] == bomb and unreadable[0][1].startswith(message)
    assert f"skipping {bomb}: {message}" in caplog.text
    # main_test.py --images holds the folder to the config's dataset.MAX_IMAGE_PIXELS: a.png (80 x 60) is over 4600
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0, "dataset.MAX_IMAGE_PIXELS": 4600})
    val = os.path.join(cfg.dataset.dataset_path, "images", "val")  # a.png b.png broken.jpg c.png
    summary = detect_images(cfg, val, str(tmp_path / "out"), draw=True, detector=NamedOracle(cfg))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 2, 2)
    assert sorted(os.listdir(tmp_path / "out" / "drawn")) == ["b.jpg", "c.jpg"]
