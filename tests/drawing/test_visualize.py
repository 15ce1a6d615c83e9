"""Pictures: the shared drawing pieces (lib/drawing.py) by their pixels, and the detections viewer
(tools/visualize_detections.py) end to end on a synthetic test set."""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from dataset_helpers import png_bomb

from lib.bootstrap import ROOT
from lib.drawing import class_palette, draw_boxes, draw_detections, grid, legend, title

TOOL = os.path.join(ROOT, "tools", "visualize_detections.py")


def near(pixel, colour, tolerance=40):
    """Antialiased lines: the pixel is close to the colour."""
    return np.abs(pixel.astype(int) - np.array(colour)).max() <= tolerance


def test_boxes_are_outlined_inclusive_and_the_input_is_untouched():
    image = np.zeros((40, 50, 3), np.uint8)
    drawn = draw_boxes(image, [[10, 5, 29, 24]], (0, 0, 255), thickness=1)
    assert not image.any()
    assert near(drawn[5, 20], (0, 0, 255)) and near(drawn[24, 20], (0, 0, 255))  # top and bottom edges
    assert near(drawn[15, 10], (0, 0, 255)) and near(drawn[15, 29], (0, 0, 255))  # left and right
    assert not drawn[15, 20].any() and not drawn[15, 31].any()  # inside and outside stay black
    half = draw_boxes(image, [[20, 10, 58, 48]], (255, 0, 0), thickness=1, factor=0.5)  # boxes of a 2x image
    assert near(half[5, 15], (255, 0, 0))


def test_detections_below_the_threshold_are_not_drawn_and_colours_follow_the_label():
    image = np.zeros((60, 60, 3), np.uint8)
    dets = np.array([[5, 30, 20, 50, 0.9, 1], [35, 30, 55, 50, 0.3, 2]], np.float32)
    palette = [(0, 0, 0), (0, 0, 250), (250, 0, 0)]
    drawn = draw_detections(image, dets, ["bg", "cat", "dog"], 0.5, colours=palette)
    assert near(drawn[40, 5], (0, 0, 250))  # the 0.9 "cat" box's left edge
    assert not drawn[40, 35].any()  # the 0.3 "dog" box is below the threshold
    assert class_palette(3) == class_palette(3) and len(set(class_palette(20))) == 20


def test_grid_and_legend_layout():
    a, b = np.zeros((10, 20, 3), np.uint8), np.full((5, 8, 3), 9, np.uint8)
    sheet = grid([a, b, a], columns=2)
    assert sheet.shape == (20, 40, 3)
    assert (sheet[:5, 20:28] == 9).all() and (sheet[5:10, 20:28] == 255).all() and (sheet[10:20, 20:] == 255).all()
    strip = legend(200, [("gt", (0, 200, 0))])
    assert strip.shape == (24, 200, 3) and tuple(strip[12, 10]) == (0, 200, 0)


def test_grid_tiles_get_a_gutter_and_a_caption_each():
    a, b = np.zeros((10, 200, 3), np.uint8), np.full((5, 80, 3), 9, np.uint8)
    sheet = grid([a, b, a], columns=2, gutter=6, captions=["first tile", "second", "a third tile whose caption is "
                                                                                   "longer than the tile is wide"])
    caption = title(200, "first tile").shape[0]  # one line; the third wraps onto two
    tall = title(200, "a third tile whose caption is longer than the tile is wide").shape[0]
    assert tall > caption
    cell = tall + 10  # every caption strip of a grid as tall as the tallest
    assert sheet.shape == (2 * cell + 6, 2 * 200 + 6, 3)
    assert (sheet[tall:tall + 10, :200] == 0).all() and (sheet[tall:tall + 5, 206:286] == 9).all()  # tiles
    assert (sheet[:, 200:206] == 255).all() and (sheet[cell:cell + 6] == 255).all()  # the gutters
    ink = sheet[:caption, :200] < 128  # dark text on the white caption strips
    assert ink.any() and (sheet[:tall, 206:406] < 128).any() and (sheet[cell + 6:cell + 6 + tall, :200] < 128).any()
    with pytest.raises(ValueError, match="2 captions for 3 pictures"):
        grid([a, b, a], columns=2, captions=["one", "two"])


@pytest.fixture(scope="module")
def val_set(synthetic_dataset):
    folder = synthetic_dataset(train=1, val=3)
    with open(os.path.join(folder, "annotations", "instances_val.json")) as f:
        return folder, json.load(f)


def run_tool(*argv):
    return subprocess.run([sys.executable, TOOL, *argv], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_viewer_draws_ground_truth_and_detections_of_a_test_set(val_set, tmp_path, tiny_config):
    folder, annotations = val_set
    first = annotations["images"][0]
    boxes = [a for a in annotations["annotations"] if a["image_id"] == first["id"]]
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.95}
               for a in boxes]
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(results))
    out = tmp_path / "pictures"
    result = run_tool("--results", str(results_path), "--cfg", tiny_config, "--set", f"dataset.dataset_path={folder}",
                      f"dataset.root_path={tmp_path}", "--images", "3", "--per-grid", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["detections_000.png", "detections_001.png"]
    sheet = cv2.imread(str(out / "detections_000.png"))
    assert sheet.shape[1] == 2 * 640 + 12  # two images of the first grid side by side, a gutter between
    # the image with detections comes first: a detection drawn exactly over a gt box shows its class colour
    x, y, w, h = boxes[0]["bbox"]
    factor = 640 / first["width"]
    top = 24 + title(640, "image 1 (x.jpg): 1 of 1 detections shown, 1 ground truth").shape[0]  # legend, caption
    row, column = top + int(round((y + h / 2) * factor)), int(round(x * factor))
    categories = sorted(c["id"] for c in annotations["categories"])
    colour = class_palette(len(categories) + 1)[categories.index(boxes[0]["category_id"]) + 1]  # the demo's
    assert any(near(pixel, colour) for pixel in sheet[row, max(column - 2, 0):column + 3])

    bad = run_tool("--results", str(results_path))
    assert bad.returncode == 2 and "either --model RUN_FOLDER or --cfg" in bad.stderr


def test_viewer_takes_a_folder_of_images_with_ids_in_the_file_names(val_set, tmp_path):
    folder, annotations = val_set
    results = [{"image_id": annotations["images"][1]["id"], "category_id": annotations["categories"][0]["id"],
                "bbox": [10, 10, 40, 40], "score": 0.8}]
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(results))
    result = run_tool("--results", str(results_path), "--folder", os.path.join(folder, "images", "val"),
                      "--annotations", os.path.join(folder, "annotations", "instances_val.json"),
                      "--out", str(tmp_path / "out"), "--images", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "drew 1 images" in result.stdout and os.path.isfile(tmp_path / "out" / "detections_000.png")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"image_id": 1}]')
    failed = run_tool("--results", str(broken), "--folder", str(tmp_path))
    assert failed.returncode == 1 and "entry 0 is not a detection" in failed.stderr and "Traceback" not in failed.stderr


def test_viewer_refuses_an_image_over_the_pixel_limit_before_decoding_in_one_line(tmp_path):
    (tmp_path / "images").mkdir()
    bomb = tmp_path / "images" / "7.png"
    bomb.write_bytes(png_bomb(100_000, 100_000))  # a few hundred bytes declaring 10 Gpx
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 7, "category_id": 1, "bbox": [1, 1, 5, 5], "score": 0.9}]))
    result = run_tool("--results", str(results), "--folder", str(tmp_path / "images"), "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr == (f"error: image {bomb} declares 100000x100000 pixels (10000 Mpx), more than "
                             f"dataset.MAX_IMAGE_PIXELS (1000 Mpx); not decoded (a decompression bomb, or raise the "
                             f"limit for a genuine large image)\n")
