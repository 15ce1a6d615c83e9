"""Pictures a person can read: distinct class colours shared by every picture, lines that grow with the
image, tags inside the image and off each other, whole titles, and metric plots with one panel per kind
of curve, a colour per curve and legends beside the panels."""
import itertools
import json
import os
import sys

import cv2
import numpy as np
import pytest

from lib.bootstrap import ROOT
from lib.drawing import BACKGROUND_COLOUR, class_palette, draw_detections, legend, line_width, tag_places, title
from lib.train.progress import record_every

sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot_metrics  # noqa: E402


def lab(colours):
    return cv2.cvtColor(np.array([colours], np.uint8), cv2.COLOR_BGR2LAB)[0].astype(np.float64)


def min_distance(colours):
    points = lab(colours)
    return min(np.linalg.norm(a - b) for a, b in itertools.combinations(points, 2))


@pytest.mark.parametrize("classes, least", [
    # CIELAB distances: ~2.3 is just noticeable, ~10 clearly different at a glance, ~40 unmistakable
    (5, 50), (10, 50), (20, 40), (80, 15),
])
def test_class_colours_stay_far_apart(classes, least):
    palette = class_palette(classes + 1)[1:]  # the object classes; label 0 is the background
    assert len(set(palette)) == classes and min_distance(palette) >= least


# Machado, Oliveira and Fernandes (2009), severity 1: what a dichromat sees, as a matrix on linear RGB.
DICHROMACY = {
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
}


def seen_with(kind, colours):
    """BGR ``colours`` as a ``kind`` dichromat sees them (sRGB -> linear -> matrix -> sRGB), BGR uint8."""
    srgb = np.array(colours, np.float64)[:, ::-1] / 255
    linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    seen = np.clip(linear @ np.array(DICHROMACY[kind]).T, 0, 1)
    srgb = np.where(seen <= 0.0031308, 12.92 * seen, 1.055 * seen ** (1 / 2.4) - 0.055)
    return [tuple(int(round(c)) for c in row[::-1] * 255) for row in srgb]


@pytest.mark.parametrize("kind", sorted(DICHROMACY))
def test_the_first_class_colours_stay_apart_for_red_green_colour_blind_eyes(kind):
    assert seen_with(kind, [(255, 255, 255), (0, 0, 0)]) == [(255, 255, 255), (0, 0, 0)]  # greys stay greys
    red_olive = [(0, 0, 160), (0, 60, 120)]  # a red and an olive green, told apart by normal eyes, not by these
    assert min_distance(red_olive) > 30 and min_distance(seen_with(kind, red_olive)) < 15
    palette = class_palette(8)[1:]  # the first seven object classes (Okabe-Ito)
    assert min_distance(seen_with(kind, palette)) >= 20  # clearly different at a glance


def test_one_palette_by_label_for_every_picture_and_none_like_ground_truth():
    assert class_palette(81)[:6] == class_palette(6)  # label k has one colour whatever the class count
    assert class_palette(3)[0] == BACKGROUND_COLOUR
    white = lab([(255, 255, 255)])[0]  # visualize_detections draws ground truth in white
    assert min(np.linalg.norm(point - white) for point in lab(class_palette(81)[1:])) > 25


def test_lines_grow_with_the_image():
    widths = [line_width(np.zeros((h, w, 3), np.uint8)) for h, w in ((240, 320), (480, 640), (800, 1333), (1400, 2000))]
    assert widths == [1, 2, 4, 6]


def test_tags_stay_inside_the_image_and_off_each_other():
    size = (100, 200)  # height, width
    boxes = np.array([[150, 0, 199, 30],  # at the top right corner: no room above, none to the right
                      [10, 40, 60, 90], [12, 42, 62, 92], [14, 44, 64, 94]], np.float64)  # a pile of boxes
    sizes = [(70, 14)] * 4
    places = tag_places(boxes, sizes, size)
    assert None not in places  # room for all four
    rects = [(x, y, x + w, y + h) for (x, y), (w, h) in zip(places, sizes)]
    for x1, y1, x2, y2 in rects:
        assert 0 <= x1 and x2 <= size[1] and 0 <= y1 and y2 <= size[0]
    for a, b in itertools.combinations(rects, 2):
        assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    assert places[3] == (14, 44 - 14)  # the last drawn (the best) keeps its place right above its box
    crowded = tag_places(np.tile([[10, 80, 60, 95]], (9, 1)), [(70, 14)] * 9, size)
    assert crowded[-1] == (10, 66) and None in crowded  # no room left below: those boxes go untagged, not piled


def test_drawn_tags_do_not_pile_up_on_an_image():
    image = np.zeros((120, 160, 3), np.uint8)
    dets = np.array([[20, 40, 80, 100, 0.9, 1], [22, 42, 82, 102, 0.8, 2], [24, 44, 84, 104, 0.7, 3]], np.float32)
    drawn = draw_detections(image, dets, ["bg", "a", "b", "c"], 0.5)
    palette = class_palette(4)
    for label in (1, 2, 3):  # each tag's filled label is visible somewhere: none hidden under another
        assert (np.abs(drawn.astype(int) - palette[label]).max(axis=2) < 10).sum() > 40


def test_a_title_too_long_for_its_panel_wraps_instead_of_being_cut():
    text = "scale 2: x0.213 -> 512x341, valid 3/12, pos 2, neg 1"
    narrow, wide = title(200, text), title(2000, text)
    assert wide.shape[0] < narrow.shape[0] and narrow.shape[1] == 200
    assert (narrow[:, -6:] == 255).all()  # nothing drawn into the right margin: no word cut at the edge


def test_a_legend_with_many_classes_wraps_onto_rows():
    items = [(f"class {i}", colour) for i, colour in enumerate(class_palette(30))]
    strip = legend(400, items)
    assert strip.shape[0] >= 24 * 5 and strip.shape[1] == 400


def test_short_epochs_still_record_several_points():
    assert record_every(20, 1000) == 20 and record_every(20, 12) == 3 and record_every(20, 3) == 1


def test_metric_plot_draws_the_evaluations_ap_per_epoch_without_undefined_points(tmp_path):
    records = [{"iteration": i, "epoch": 1 + i // 4, "lr": 0.01, "RPNLogLoss": 1 / i, "chips_per_s": 5.0}
               for i in range(1, 12)]
    stats = [{"AP": 0.1, "AP50": 0.3, "APs": -1.0, "APm": -1.0, "AR100": 0.4},  # APs undefined on this set
             {"AP": 0.2, "AP50": 0.45, "APs": -1.0, "APm": 0.05, "AR100": 0.5},
             {"AP": 0.25, "AP50": float("nan"), "APs": -1.0, "APm": 0.1, "AR100": 0.6}]
    evaluations = [{"iteration": 4 * epoch, "epoch": epoch, "eval": e} for epoch, e in enumerate(stats, start=1)]
    path = tmp_path / "run" / "metrics.jsonl"
    os.makedirs(path.parent)
    path.write_text("".join(json.dumps(r) + "\n" for r in records[:4] + evaluations[:1] + records[4:8] +
                            evaluations[1:2] + records[8:] + evaluations[2:]))
    records_read, evaluations_read, skipped = plot_metrics.read_metrics(str(path))
    assert (len(records_read), evaluations_read, skipped) == (11, json.loads(json.dumps(evaluations)), 0)
    figure = plot_metrics.figure_of(records_read, "my_run", evaluations_read)
    figure.canvas.draw()
    panel = figure.axes[-1]
    assert panel.get_ylabel() == "AP (evaluations)"
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in panel.get_lines()}
    assert curves == {"AP": ([4, 8, 12], [0.1, 0.2, 0.25]), "AP50": ([4, 8], [0.3, 0.45]),  # no NaN point
                      "APm": ([8, 12], [0.05, 0.1])}  # no -1 point; no AR
    assert panel.get_title(loc="left") == "undefined at every evaluation (no point): APs"
    assert [text.get_text() for text in panel.texts] == ["e1", "e2", "e3"]
    colours = [line.get_color() for axis in figure.axes for line in axis.get_lines() if line.get_label()[0] != "_"]
    assert len(set(colours)) == len(colours)
    plot_metrics.main([str(path.parent)])
    assert cv2.imread(str(path.parent / "metrics.png")) is not None


def test_metric_plot_panels_colours_and_legends(tmp_path):
    records = [{"iteration": i, "epoch": 1 + i // 6, "batch": i % 6, "batches": 6, "lr": 0.01 * min(1, i / 5),
                "RPNLogLoss": 1 / i, "RCNNLogLoss": 2 / i, "RPNL1Loss": 0.5 / i, "RPNAcc": 0.5 + i / 40,
                "RCNNAcc": 0.4 + i / 40, "chips_per_s": 5.0 + i % 3, "seconds": float(i)} for i in range(1, 13)]
    figure = plot_metrics.figure_of(records, "my_run")
    figure.canvas.draw()
    axes = figure.axes
    assert [axis.get_ylabel() for axis in axes] == ["loss (log)", "accuracy", "lr", "chips/s"]
    assert axes[0].get_yscale() == "log" and figure._suptitle.get_text().startswith("my_run")
    lines = [line for axis in axes for line in axis.get_lines() if line.get_label()[0] != "_"]
    assert len(lines) == 7 and len({line.get_color() for line in lines}) == 7  # no colour shared by two curves
    for axis in axes:  # each legend right of its panel, over no curve
        legend_box = axis.get_legend().get_window_extent()
        assert legend_box.x0 >= axis.get_window_extent().x1
    path = tmp_path / "run" / "metrics.jsonl"
    os.makedirs(path.parent)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_metrics.main([str(path.parent)])
    assert cv2.imread(str(path.parent / "metrics.png")) is not None
