"""The training iterator (lib/data): chip pixels, chip boxes, batches, determinism, and reliability."""
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import cv2
import mxnet as mx
import numpy as np
import psutil
import pytest

from stall_helpers import assert_each_stopped_worker_warned_once

from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from lib.data import ChipLoader, WorkerDiedError, WorkerError, WorkerStalledError
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import BatchRing, Field
from lib.data.chip_boxes import chip_gt_boxes, chip_valid_range, pack_gt_boxes
from lib.data.chip_image import render_chip
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import _MINE, ChipRef, stream
from lib.data.image_cache import DecodedImageCache
from lib.data.worker_pool import ProcessPool
from lib.data.pixels import network_pixels
from chip_generator.mining import MiningParams, mine_image_chips
from lib.dataset import load_roidb, read_image

MEANS = np.array([103.939, 116.779, 123.68], np.float32)


# -- chip pixels -------------------------------------------------------------------------------------
def smooth_image(height, width, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3)).astype(np.uint8)
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)


def test_render_chip_at_scale_one_is_the_exact_crop_minus_means_with_zero_padding():
    image = smooth_image(300, 400)
    out = np.full((3, 256, 256), 7, np.float32)
    height, width = render_chip(image, (150, 100, 399, 299), 1.0, False, MEANS, "BGR", "round", out)
    assert (height, width) == (200, 250)
    expected = image[100:300, 150:400].astype(np.float32) - MEANS
    np.testing.assert_array_equal(out[:, :200, :250], expected.transpose(2, 0, 1))
    assert not out[:, 200:, :].any() and not out[:, :, 250:].any()


def test_truncated_crop_uses_the_inclusive_end_as_exclusive_as_the_reference():
    # chip x 150..399, y 100..299 at scale 1: the reference crops im[int(100):int(299), int(150):int(399)],
    # losing the last row and column
    image = smooth_image(300, 400)
    out = np.full((3, 256, 256), 7, np.float32)
    assert render_chip(image, (150, 100, 399, 299), 1.0, False, MEANS, "BGR", "truncate", out) == (199, 249)
    np.testing.assert_array_equal(out[:, :199, :249], (image[100:299, 150:399] - MEANS).transpose(2, 0, 1))
    assert not out[:, 199:, :].any() and not out[:, :, 249:].any()


def test_network_pixels_feed_rgb_minus_the_bgr_listed_means():
    image = np.zeros((2, 3, 3), np.uint8)
    image[1, 2] = (10, 20, 30)  # B, G, R
    out = np.full((3, 4, 4), 7.0, np.float32)
    network_pixels(image, MEANS, "RGB", out)
    np.testing.assert_allclose(out[:, 1, 2], [30 - 123.68, 20 - 116.779, 10 - 103.939], rtol=1e-6)
    np.testing.assert_allclose(out[:, 0, 0], [-123.68, -116.779, -103.939], rtol=1e-6)
    assert (out[:, 2:, :] == 7).all() and (out[:, :, 3:] == 7).all()  # outside the image: untouched
    network_pixels(image, MEANS, "BGR", out)
    np.testing.assert_allclose(out[:, 1, 2], [10 - 103.939, 20 - 116.779, 30 - 123.68], rtol=1e-6)
    with pytest.raises(ValueError, match="CHANNEL_ORDER"):
        network_pixels(image, MEANS, "rgb", out)


@pytest.mark.parametrize("crop, size", [("round", 200), ("truncate", 199)])
def test_render_chip_flipped_reads_the_mirrored_image(crop, size):
    image = smooth_image(300, 400)
    out = np.zeros((3, 256, 256), np.float32)
    render_chip(image, (0, 50, 199, 249), 1.0, True, MEANS, "BGR", crop, out)
    mirrored = image[:, ::-1]
    np.testing.assert_array_equal(out[:, :size, :size], (mirrored[50:50 + size, 0:size] - MEANS).transpose(2, 0, 1))


def test_render_chip_fits_non_square_inputs_and_cuts_what_is_larger():
    image = smooth_image(300, 400)
    wide = np.full((3, 64, 160), 7, np.float32)
    assert render_chip(image, (10, 20, 159, 79), 1.0, False, MEANS, "BGR", "round", wide) == (60, 150)
    np.testing.assert_array_equal(wide[:, :60, :150], (image[20:80, 10:160] - MEANS).transpose(2, 0, 1))
    assert not wide[:, 60:, :].any() and not wide[:, :, 150:].any()
    tall = np.full((3, 160, 64), 7, np.float32)
    # 150 px wide content in a 64 px wide input: the first 64 columns (as a 513 px reference window in 512)
    assert render_chip(image, (10, 20, 159, 79), 1.0, False, MEANS, "BGR", "round", tall) == (60, 64)
    np.testing.assert_array_equal(tall[:, :60, :], (image[20:80, 10:74] - MEANS).transpose(2, 0, 1))
    assert not tall[:, 60:, :].any()
    assert render_chip(image, (10, 20, 69, 169), 1.0, True, MEANS, "BGR", "round", tall) == (150, 60)
    mirrored = image[:, ::-1]
    np.testing.assert_array_equal(tall[:, :150, :60], (mirrored[20:170, 10:70] - MEANS).transpose(2, 0, 1))
    assert not tall[:, 150:, :].any() and not tall[:, :, 60:].any()


@pytest.mark.parametrize("scale, flipped", [(3.0, False), (1.667, True), (0.5, False)])
def test_render_chip_scaled_matches_resizing_the_whole_image(scale, flipped):
    image = smooth_image(240, 320, seed=1)
    scaled = cv2.resize(image[:, ::-1] if flipped else image, (round(320 * scale), round(240 * scale)))
    chip = (90, 60, 90 + 127, 60 + 99) if scale > 1 else (10, 20, 149, 109)
    out = np.zeros((3, 128, 160), np.float32)
    height, width = render_chip(image, chip, scale, flipped, MEANS, "BGR", "round", out)
    expected = scaled[chip[1]:chip[3] + 1, chip[0]:chip[2] + 1].astype(np.float32) - MEANS
    # the crop is taken at whole source pixels: content may shift by under one scaled pixel
    assert np.abs(out[:, :height, :width] - expected.transpose(2, 0, 1)).mean() < 4.0


@pytest.mark.parametrize("scale, flipped", [(3.0, False), (1.667, True), (0.5, True)])
def test_truncated_crop_is_the_reference_crop_of_the_mirrored_image_resized_by_the_factor(scale, flipped):
    image = smooth_image(240, 320, seed=1)
    chip = (90, 60, 90 + 511, 60 + 511) if scale > 1 else (10, 20, 149, 109)
    out = np.zeros((3, 512, 512), np.float32)
    height, width = render_chip(image, chip, scale, flipped, MEANS, "BGR", "truncate", out)
    source = image[:, ::-1] if flipped else image  # the reference mirrors the whole image, then crops
    x1, y1, x2, y2 = (int(v / scale) for v in chip)
    expected = cv2.resize(np.ascontiguousarray(source[y1:y2, x1:x2]), None, fx=scale, fy=scale,
                          interpolation=cv2.INTER_LINEAR)[:512, :512]
    assert (height, width) == expected.shape[:2]
    np.testing.assert_array_equal(out[:, :height, :width], (expected - MEANS).transpose(2, 0, 1))
    assert not out[:, height:].any() and not out[:, :, width:].any()


# -- chip boxes --------------------------------------------------------------------------------------
def test_chip_boxes_hand_worked():
    # chip (60, 0)-(259, 199) at scale 2 in a 200 px input: origin (30, 0) original px
    boxes = np.array([
        [10, 10, 29, 29],  # x 10..29 -> -40..-2: left of the chip
        [100, 50, 104, 70],  # 5 px wide -> 140..148: 9 px, under 10: dropped
        [100, 50, 105, 70],  # 6 px wide -> 140..150: 11 px, kept
        [200, 10, 220, 30],  # x 340..: right of the chip
        [40, 90, 200, 300],  # (20, 180, 340, 600): clipped to the input, (20, 180, 199, 199)
        [100.3, 50.2, 110.6, 70.7],  # (140.6, 100.4, 161.2, 141.4) -> rounded (141, 100, 161, 141)
        [40, 90, 200, 300],  # a duplicate of a valid box: valid too
    ], np.float32)
    classes = np.array([1, 2, 3, 4, 5, 6, 7], np.int32)
    valid = np.array([True, True, False, True, True, False, False])
    chip = (60, 0, 259, 199)
    out_boxes, out_classes, out_valid = chip_gt_boxes(boxes, classes, valid, 2.0, chip, 10, 200, True)
    np.testing.assert_array_equal(out_classes, [3, 5, 6, 7])
    np.testing.assert_array_equal(out_boxes, [[140, 100, 150, 140], [20, 180, 199, 199], [141, 100, 161, 141],
                                              [20, 180, 199, 199]])
    np.testing.assert_array_equal(out_valid, [False, True, False, True])
    unrounded, _, _ = chip_gt_boxes(boxes, classes, valid, 2.0, chip, 10, 200, False)
    np.testing.assert_allclose(unrounded[2], [140.6, 100.4, 161.2, 141.4], rtol=1e-6)
    packed = np.zeros((5, 5), np.float32)
    assert pack_gt_boxes(out_boxes, out_classes, packed) == 0  # image order, valid and invalid mixed
    np.testing.assert_array_equal(packed, [[140, 100, 150, 140, 3], [20, 180, 199, 199, 5], [141, 100, 161, 141, 6],
                                           [20, 180, 199, 199, 7], [-1] * 5])
    assert pack_gt_boxes(out_boxes, out_classes, packed[:1]) == 3
    # open ends are 0 and the input size, as the reference hands them to the network
    assert chip_valid_range((-1, 80), 3.0, 512) == (0.0, 240.0)
    assert chip_valid_range((32, 150), 0.5, 512) == (16.0, 75.0)
    assert chip_valid_range((120, -1), 0.8, 512) == (96.0, 512.0)


def test_chip_boxes_clip_to_the_input_not_the_content():
    # coarsest scale of a 2000 x 1000 image (x0.256): the content is 512 x 256, a gt on the bottom edge
    # rounds to y2 = 256 (below the content), as the reference keeps it
    boxes = np.array([[100, 900, 400, 999]], np.float32)
    out, _, _ = chip_gt_boxes(boxes, [1], [True], 0.256, (0, 0, 511, 255), 10, 512, True)
    np.testing.assert_array_equal(out, [[26, 230, 102, 256]])


# -- one chip through the chip worker -------------------------------------------------------------------
def built_chip(tmp_path, overrides, scale_index, im_scale, box):
    """The arrays ChipWorker.make_chip writes for ``box`` of a 120 x 90 image with one gt box."""
    path = str(tmp_path / "image.jpg")
    cv2.imwrite(path, smooth_image(90, 120))
    entry = {"image": path, "id": 1, "height": 90, "width": 120, "flipped": False,
             "boxes": np.array([[10.2, 10.2, 40.4, 40.4]], np.float32), "gt_classes": np.array([1], np.int32)}
    cfg = load_config(None, [("TRAIN.RPN_BATCH_SIZE", str(10 ** 9)), *overrides])
    targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
    ring = BatchRing(batch_fields(cfg, targeter, rpn_only=False), batch_size=1, num_slots=1, shared=False)
    worker = ChipWorker([entry], cfg, ring, rpn_only=False)
    assert worker.make_chip(0, 0, "test", ChipRef(0, scale_index, im_scale, box, (0,)), (0,))[0] == "chip"
    return {name: array[0] for name, array in ring.slot(0).items()}


def test_chip_pixels_are_the_references_double_mean_subtraction_bit_for_bit(tmp_path):
    # the reference's data worker: rim[j] = im[:, :, 2 - j] - PIXEL_MEANS[2 - j] with the YAML's float64 means,
    # stored once into its float32 input; means a float32 cannot hold exactly round differently when made
    # float32 first (about a quarter of the pixels)
    means = (103.06, 115.90, 123.15)
    arrays = built_chip(tmp_path, [("network.PIXEL_MEANS", str(list(means)))], 0, 1.0, (0, 0, 119, 89))
    image = cv2.imread(str(tmp_path / "image.jpg"), cv2.IMREAD_COLOR)
    crop = cv2.resize(image[0:89, 0:119], None, None, fx=1.0, fy=1.0, interpolation=cv2.INTER_LINEAR)
    expected = np.zeros((3, 512, 512), np.float32)
    for j in range(3):
        expected[j, :89, :119] = crop[:, :, 2 - j] - np.array(means)[2 - j]
    np.testing.assert_array_equal(arrays["data"], expected)
    single = np.zeros_like(expected)
    for j in range(3):
        single[j, :89, :119] = crop[:, :, 2 - j] - np.float32(means[2 - j])
    assert (single != expected).any()  # the test can tell the two


@pytest.mark.parametrize("border", ["chip", "content"])
def test_anchor_border_is_measured_from_the_whole_input_by_default(tmp_path, border):
    # at 3x the image is 360 x 270: the 32 x 32 anchor of cell (h 25, w 25), x 392..423, is over the padding,
    # inside the 512 + 32 border of the input but outside the 360 + 32 border of the content
    arrays = built_chip(tmp_path, [("TRAIN.RPN_ANCHOR_BORDER", border)], 0, 3.0, (0, 0, 359, 269))
    labels = arrays["label"].reshape(21, 32, 32)
    assert labels[1 * 7 + 0, 25, 25] == (0 if border == "chip" else -1)
    assert (labels[:, 31, 31] >= 0).any() == (border == "chip")


@pytest.mark.parametrize("round_gt, expected", [(True, [31, 31, 121, 121]), (False, [30.6, 30.6, 121.2, 121.2])])
def test_gt_boxes_are_rounded_to_whole_chip_pixels_by_default(tmp_path, round_gt, expected):
    arrays = built_chip(tmp_path, [("TRAIN.RPN_ROUND_GT", str(round_gt))], 0, 3.0, (0, 0, 359, 269))
    np.testing.assert_allclose(arrays["gt_boxes"][0], [*expected, 1], rtol=1e-5)
    assert (arrays["gt_boxes"][1:] == -1).all()


def test_im_info_is_the_input_or_at_the_coarsest_scale_the_scaled_image(tmp_path):
    np.testing.assert_allclose(built_chip(tmp_path, [], 0, 3.0, (0, 0, 359, 269))["im_info"], [512, 512, 3.0])
    scale = 512 / 120  # coarsest: the image is int(90 * s) = 384 x 512
    np.testing.assert_allclose(built_chip(tmp_path, [], 2, scale, (0, 0, 511, 383))["im_info"], [384, 512, scale],
                               rtol=1e-6)


# -- shared memory ring ------------------------------------------------------------------------------
def test_batch_ring_slots_are_disjoint_views_and_the_name_goes_away():
    ring = BatchRing([Field("a", (3, 5)), Field("b", (7,), np.int32, True)], batch_size=2, num_slots=3)
    name = ring._memory.name
    assert os.path.exists(f"/dev/shm/{name}")
    for index in range(3):
        ring.slot(index)["a"][...] = index
        ring.slot(index)["b"][...] = 10 + index
    for index in range(3):
        assert (ring.slot(index)["a"] == index).all() and (ring.slot(index)["b"] == 10 + index).all()
    ring.unlink()
    assert not os.path.exists(f"/dev/shm/{name}")
    ring.slot(0)["a"][...] = 5  # still mapped after unlink
    ring.close()


def test_batch_ring_refuses_a_too_small_dev_shm(monkeypatch):
    import lib.data.batch_ring as batch_ring
    monkeypatch.setattr(batch_ring.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(64 << 20, 0, 1 << 20))
    with pytest.raises(MemoryError, match="needs 4 MB of shared memory but /dev/shm has 1 MB free"):
        BatchRing([Field("a", (1024, 1024))], batch_size=1, num_slots=1)


# -- the loader on a tiny synthetic dataset ----------------------------------------------------------
CHIPS = 4  # chips per device


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset(train=3, val=0)


def dataset_cfg(dataset_path, root, *overrides):
    return load_config(None, [("dataset.dataset_path", dataset_path), ("dataset.image_set", "train"),
                              ("dataset.root_path", str(root)), *overrides])


@pytest.fixture(scope="module")
def cfg(dataset, tmp_path_factory):
    return dataset_cfg(dataset, tmp_path_factory.mktemp("root"))


@pytest.fixture(scope="module")
def roidb(cfg):
    return load_roidb(cfg, "train")[0]


def numpy_batches(loader):
    return [[a.asnumpy() for a in batch.data + batch.label] + [batch.pad] for batch in loader]


@pytest.fixture(scope="module")
def inline_epochs(roidb, cfg):
    """Two epochs built in-process, with the loader's plan of the first."""
    with ChipLoader(roidb, cfg, CHIPS, num_workers=0, seed=11) as loader:
        first, plan = numpy_batches(loader), loader._plan
        loader.reset()
        second = numpy_batches(loader)
        return first, second, plan, loader.provide_data, loader.provide_label


def test_batches_have_the_declared_layout(inline_epochs, roidb):
    first, _, plan, provide_data, provide_label = inline_epochs
    names = [d.name for d in provide_data + provide_label]
    assert names == ["data", "valid_ranges", "im_info", "label", "bbox_target", "bbox_weight", "gt_boxes"]
    shapes = dict(zip(names, [d.shape for d in provide_data + provide_label]))
    assert shapes == {"data": (4, 3, 512, 512), "valid_ranges": (4, 2), "im_info": (4, 3), "label": (4, 21 * 32 * 32),
                      "bbox_target": (4, 84, 32, 32), "bbox_weight": (4, 84, 32, 32), "gt_boxes": (4, 100, 5)}
    assert len(first) == plan.num_batches == -(-plan.num_chips // 4)
    assert [b[-1] for b in first] == [0] * (len(first) - 1) + [plan.pad]
    for batch in first:
        arrays = dict(zip(names, batch))
        for name in names:
            assert arrays[name].shape == shapes[name] and arrays[name].dtype == np.float32
        assert set(np.unique(arrays["label"])) <= {-1.0, 0.0, 1.0}
        assert ((arrays["label"] == 1).sum(axis=1) <= 128).all() and ((arrays["label"] >= 0).sum(axis=1) <= 256).all()
        padding = arrays["gt_boxes"][:, :, 4] < 0
        assert (arrays["gt_boxes"][padding] == -1).all()
    # each chip's im_info and valid range follow from its ChipRef, as the reference sets them: the chip is
    # 512 x 512, at the coarsest scale the whole int(H * s) x int(W * s) image; open ends 0 and 512
    for number, batch in enumerate(first):
        arrays = dict(zip(names, batch))
        for position in range(4 - batch[-1]):
            chip, _ = plan.chip_at(number, position)
            entry = roidb[chip.image_index]
            coarsest = chip.scale_index == 2
            scaled = (int(entry["height"] * chip.im_scale), int(entry["width"] * chip.im_scale))
            size = scaled if coarsest else (512, 512)
            np.testing.assert_allclose(arrays["im_info"][position], [*size, chip.im_scale], rtol=1e-6)
            lo, hi = [[-1, 80], [32, 150], [120, -1]][chip.scale_index]
            expected = [0 if lo == -1 else lo * chip.im_scale, 512 if hi == -1 else hi * chip.im_scale]
            np.testing.assert_allclose(arrays["valid_ranges"][position], expected, rtol=1e-6)


def test_chip_content_and_boxes_match_an_independent_computation(inline_epochs, roidb):
    first, _, plan, _, _ = inline_epochs
    data, gt_boxes = first[0][0], first[0][6]
    for position in range(4):
        chip, _ = plan.chip_at(0, position)
        entry = roidb[chip.image_index]
        image = read_image(entry["image"])
        if entry["flipped"]:
            image = image[:, ::-1]
        scale = chip.im_scale
        x1, y1, x2, y2 = (int(v) for v in chip.box)
        # resize only the neighbourhood of the chip (the whole 3x image would be slow), then crop
        left, top = max(int(x1 / scale) - 2, 0), max(int(y1 / scale) - 2, 0)
        region = image[top:int((y2 + 1) / scale) + 3, left:int((x2 + 1) / scale) + 3]
        scaled = cv2.resize(region, None, fx=scale, fy=scale)
        ox, oy = round(left * scale), round(top * scale)
        # the network is fed RGB: channel c is image channel 2 - c minus its mean; at most 512 x 512
        expected = scaled[y1 - oy:min(y2, y1 + 511) - oy + 1, x1 - ox:min(x2, x1 + 511) - ox + 1, ::-1]
        expected = expected.astype(np.float32) - MEANS[::-1]
        height, width = expected.shape[:2]
        # the reference's crop starts at int(x1 / s): content shifted by up to s scaled pixels
        assert np.abs(data[position][:, :height, :width] - expected.transpose(2, 0, 1)).mean() < 12.0
        assert not data[position][:, height + 1:, :].any() and not data[position][:, :, width + 1:].any()
        # every box of the image in the chip, in image order: (box - chip origin) * s rounded, clipped to the
        # 512 x 512 input, kept when at least 10 px each way
        origin = np.float32([x1 / scale, y1 / scale] * 2)
        moved = np.round((entry["boxes"] - origin) * np.float32(scale))
        clipped = np.clip(moved, 0, 511)
        seen = ((clipped[:, 2] - clipped[:, 0] + 1 >= 10) & (clipped[:, 3] - clipped[:, 1] + 1 >= 10)
                & (moved[:, 2] >= 0) & (moved[:, 3] >= 0) & (moved[:, 0] <= x2 - x1) & (moved[:, 1] <= y2 - y1))
        rows = gt_boxes[position][gt_boxes[position][:, 4] >= 0]
        expected_rows = np.concatenate([clipped, entry["gt_classes"][:, None]], axis=1)[seen]
        np.testing.assert_array_equal(rows, expected_rows)


def test_epochs_differ_and_chips_are_remined(inline_epochs):
    first, second, _, _, _ = inline_epochs
    assert len(first) > 1
    assert not np.array_equal(first[0][0], second[0][0])


def assert_same_batches(expected_epochs, actual_epochs):
    for expected, actual in zip(expected_epochs, actual_epochs, strict=True):
        assert len(expected) == len(actual)
        for batch_expected, batch_actual in zip(expected, actual):
            for a, b in zip(batch_expected, batch_actual):
                np.testing.assert_array_equal(a, b)


def two_epochs(roidb, cfg, workers):
    """(first epoch's batches, second's, files the two plans read, stats) of a loader with seed 11."""
    with ChipLoader(roidb, cfg, CHIPS, num_workers=workers, seed=11) as loader:
        assert len(loader.pids) == workers
        first = numpy_batches(loader)
        files = {roidb[i]["image"] for i in loader._plan.chips.image_index}
        loader.reset()
        second = numpy_batches(loader)
        files |= {roidb[i]["image"] for i in loader._plan.chips.image_index}
        return first, second, files, loader.stats


def test_workers_give_the_same_batches_as_in_process(inline_epochs, roidb, cfg):
    first, second, _, _, _ = inline_epochs
    got, got_second, files, stats = two_epochs(roidb, cfg, 2)
    assert stats.chips == sum(4 - b[-1] for b in first + second) + first[-1][-1] + second[-1][-1]
    assert_same_batches((first, second), (got, got_second))
    # every chip of a file went to the one worker that kept it decoded: one decode per file in two epochs
    assert len(files) < len(roidb) < stats.chips
    assert stats.decoded_images == len(files)


@pytest.mark.parametrize("workers", [0, 2])
def test_without_the_image_cache_every_chip_decodes_and_the_batches_are_the_same(inline_epochs, roidb, cfg,
                                                                                  workers):
    first, second, _, _, _ = inline_epochs  # built with the default cache
    got, got_second, _, stats = two_epochs(roidb, with_overrides(cfg, {"TRAIN.IMAGE_CACHE_MB": 0}), workers)
    assert_same_batches((first, second), (got, got_second))
    assert stats.decoded_images == stats.chips


def _pid_of(task):
    return ("ran", task, os.getpid())


def test_a_routed_pool_runs_every_task_of_a_key_in_one_worker():
    pool = ProcessPool(_pid_of, 2, routed=True)
    try:
        for task in range(12):
            pool.submit(task, key=task // 2 if task < 8 else None)  # keys 0..3 twice each; 4 unkeyed in turn
        ran = {}
        while len(ran) < 12:
            message = pool.get()
            if message is not None:
                ran[message[1]] = message[2]
    finally:
        pool.close()
    assert set(ran.values()) == set(pool.pids)
    assert [ran[task] for task in range(8)] == [pool.pids[key % 2] for key in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert [ran[task] for task in range(8, 12)] == [pool.pids[turn % 2] for turn in range(4)]


def test_image_cache_keeps_the_least_recently_used_within_its_bytes():
    images = {name: np.full((10, 10, 3), k, np.uint8) for k, name in enumerate("abcd")}  # 300 bytes each
    decoded = []

    def decode(name):
        decoded.append(name)
        return images[name].copy()

    cache = DecodedImageCache(600)
    for name in "abacbdd":  # a, b; a hit; c evicts b (a was used last); b evicts a; d evicts c; d hit
        image, fresh = cache.get(name, decode)
        np.testing.assert_array_equal(image, images[name])
    assert decoded == ["a", "b", "c", "b", "d"]
    assert len(cache) == 2 and cache.nbytes == 600
    with pytest.raises(ValueError, match="read-only"):
        cache.get("d", decode)[0][0, 0, 0] = 1  # a chip can never change what the next one reads
    big = DecodedImageCache(299)  # an image larger than the cache is decoded every time, never kept
    assert [big.get("a", decode)[1] for _ in range(2)] == [True, True] and len(big) == 0
    with pytest.raises(OSError):
        cache.get("missing", lambda path: (_ for _ in ()).throw(OSError(path)))
    assert len(cache) == 2


def test_valid_boxes_are_the_miners(inline_epochs, roidb, cfg):
    """Every chip of the plan carries the valid boxes the miner gave that very chip (its own assigned
    boxes, which differ between chips of one scale)."""
    _, _, plan, _, _ = inline_epochs
    params = MiningParams.from_config(cfg)
    mined = {}
    differing_sets = 0
    for index in range(plan.num_chips):
        chip = plan.chip(index)
        if chip.image_index not in mined:  # the miner's own random stream of this image and epoch
            rng = stream(plan.seed, plan.epoch, _MINE, chip.image_index)
            mined[chip.image_index] = mine_image_chips(roidb[chip.image_index], params, plan.stride, rng)
        scale = mined[chip.image_index].scales[chip.scale_index]
        chips, valid = (scale.neg_chips, scale.neg_valid) if chip.negative else (scale.pos_chips, scale.pos_valid)
        k = [tuple(float(v) for v in c) for c in chips].index(chip.box)
        assert chip.valid_boxes == tuple(valid[k])
        differing_sets += chip.valid_boxes != tuple(np.flatnonzero(scale.valid))
    assert len(mined) > 3 and differing_sets > 0


def test_rpn_only_and_two_contexts_bind_a_module(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_ctx=2, rpn_only=True, num_workers=2) as loader:
        assert loader.batch_size == 8
        assert [d.name for d in loader.provide_data] == ["data"]
        assert [d.name for d in loader.provide_label] == ["label", "bbox_target", "bbox_weight"]
        names = [d.name for d in loader.provide_data + loader.provide_label]
        total = mx.sym.add_n(*[mx.sym.sum(mx.sym.Variable(name)) for name in names])
        module = mx.mod.Module(mx.sym.MakeLoss(total), data_names=names[:1], label_names=names[1:],
                               context=[mx.cpu(0), mx.cpu(1)])
        module.bind(loader.provide_data, loader.provide_label, for_training=False)
        module.init_params()
        for _, batch in zip(range(4), loader):  # zero-copy batches, recycled after the module read them
            expected = sum(array.asnumpy().astype(np.float64).sum() for array in batch.data + batch.label)
            module.forward(batch, is_train=False)
            got = sum(out.asnumpy().sum() for out in module.get_outputs())
            assert got == pytest.approx(expected, rel=1e-4)


def test_kept_batches_are_not_overwritten(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=5) as loader:
        kept = [next(loader) for _ in range(3)]
        copies = [b.data[0].asnumpy().copy() for b in kept]
        for _ in loader:
            pass
        for batch, copy in zip(kept, copies):
            np.testing.assert_array_equal(batch.data[0].asnumpy(), copy)
        # the kept batches pinned their slots, so later ones were copies; dropped copies were reused
        assert 1 <= len(loader._outputs._sets) <= 3


def test_dropped_batches_are_handed_out_without_copies(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=5) as loader:
        for _ in loader:
            pass
        assert loader._outputs._sets == []


# -- reliability -------------------------------------------------------------------------------------
@pytest.fixture()
def damaged(synthetic_dataset, tmp_path):
    """A copy of the dataset with one corrupt, one missing and one truncated image (a real JPEG cut to
    two thirds, which the decoder alone would return with grey rows), and its roidb."""
    copy = tmp_path / "synthetic"
    shutil.copytree(synthetic_dataset(train=5, val=0), copy)
    cfg = dataset_cfg(str(copy), tmp_path / "root")
    roidb = load_roidb(cfg, "train")[0]
    corrupt, missing, truncated = roidb[0]["image"], roidb[1]["image"], roidb[2]["image"]
    with open(corrupt, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a jpeg" * 10)
    os.remove(missing)
    with open(truncated, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) * 2 // 3])
    return cfg, roidb, corrupt, missing, truncated


@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_images_are_replaced_logged_and_counted(damaged, workers, caplog):
    cfg, roidb, corrupt, missing, truncated = damaged
    with ChipLoader(roidb, cfg, CHIPS, num_workers=workers, seed=2) as loader:
        batches = numpy_batches(loader)
        plan = loader._plan
    bad_chips = sum(roidb[i]["image"] in (corrupt, missing, truncated) for i in plan.chips.image_index)
    assert bad_chips > 0
    assert set(loader.stats.bad_images) == {corrupt, missing, truncated}
    assert loader.stats.bad_image_count >= bad_chips
    assert len(batches) == plan.num_batches
    for batch in batches:
        assert (batch[2][:, 0] > 0).all()  # every chip got content (im_info height)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert corrupt in logged and missing in logged
    assert f"unreadable image {truncated} (truncated image {truncated}: the file ends before" in logged


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_task_raises_with_the_cause_and_leaves_no_workers(roidb, cfg, workers):
    broken = [dict(entry) for entry in roidb]
    broken[1]["boxes"] = broken[1]["boxes"][:, :3]
    def workers_alive():  # children but multiprocessing's resource tracker (it lives until exit)
        return {p.pid for p in psutil.Process().children() if "resource_tracker" not in " ".join(p.cmdline())}

    before = workers_alive()
    expected = WorkerError if workers else ValueError
    with pytest.raises(expected, match=f"image id {broken[1]['id']}.*shape"):
        ChipLoader(broken, cfg, CHIPS, num_workers=workers)
    assert workers_alive() == before


class alarm:
    """Fail instead of hanging: SIGALRM after ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        def fail(*_):
            raise TimeoutError(f"still waiting after {self.seconds} s")
        self.previous = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def test_a_killed_worker_raises_instead_of_hanging_and_close_reaps_all(roidb, cfg):
    loader = ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=1)
    pids = loader.pids
    try:
        os.kill(pids[0], signal.SIGKILL)
        with alarm(30), pytest.raises(WorkerDiedError, match=f"pid {pids[0]}.*SIGKILL"):
            for _ in loader:
                pass
    finally:
        loader.close()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def stop_at(module, path, monkeypatch):
    """Make a worker that decodes the image at ``path`` stop itself (SIGSTOP) there: the workers are forked
    after this, so they run the patched reader."""
    from lib.dataset import image_io

    def read(entry):
        if entry["image"] == path:
            os.kill(os.getpid(), signal.SIGSTOP)
        return image_io.read_roidb_image(entry)

    monkeypatch.setattr(module, "read_roidb_image", read)


def test_a_stopped_worker_is_warned_about_then_named_with_its_image_instead_of_hanging(roidb, cfg, monkeypatch,
                                                                                         caplog):
    """TRAIN.STALL_WARN and TRAIN.LOADER_TIMEOUT reach the loader's workers: a warning, then the stop."""
    from lib.data import chip_worker

    stopped = roidb[1]["image"]
    stop_at(chip_worker, stopped, monkeypatch)
    loader = ChipLoader(roidb, with_overrides(cfg, {"TRAIN.LOADER_TIMEOUT": 2, "TRAIN.STALL_WARN": 0.5}), CHIPS,
                        num_workers=2, seed=1)
    pids = loader.pids
    try:
        with alarm(60), pytest.raises(WorkerStalledError) as info, \
                caplog.at_level(logging.WARNING, logger="lib.data.worker_pool"):
            for _ in loader:
                pass
    finally:
        loader.close()
    assert_each_stopped_worker_warned_once(caplog.records, "chip-loader", f"building a chip of image {stopped}",
                                           "TRAIN.LOADER_TIMEOUT", 2)
    match = re.fullmatch(r"data loader worker chip-loader-\d \(pid (\d+)\) has shown no sign of life for (\d+) s "
                         r"\(TRAIN.LOADER_TIMEOUT is 2 s\) while building a chip of image (.*); the process is "
                         r"stopped \(SIGSTOP or Ctrl-Z\?\); stopping rather than waiting forever", str(info.value))
    assert match, str(info.value)
    assert int(match.group(1)) in pids and int(match.group(2)) >= 2 and match.group(3) == stopped
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def start_script(dataset, tmp_path):
    script, cache = tmp_path / "run_loader.py", str(tmp_path / "root")
    script.write_text(textwrap.dedent(f"""
        import signal, time
        # Ctrl-C as a terminal delivers it, whatever this test runs under: a shell's background job
        # (`make test &`) starts its children with SIGINT ignored, and Python keeps an ignored SIGINT
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from lib.config import load_config, with_overrides
        from lib.data import ChipLoader
        from lib.dataset import load_roidb
        cfg = load_config(None, [("dataset.dataset_path", {dataset!r}), ("dataset.image_set", "train"),
                                 ("dataset.root_path", {cache!r})])
        roidb = load_roidb(cfg, "train")[0]
        loader = ChipLoader(roidb, cfg, 4, num_workers=2)
        print(" ".join(map(str, loader.pids)), loader._resources.ring._memory.name, flush=True)
        while True:
            for batch in loader:
                time.sleep(0.05)
            loader.reset()
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    words = process.stdout.readline().split()
    assert len(words) == 3, process.stderr.read()
    time.sleep(1.0)  # let it run a few batches
    return process, [int(w) for w in words[:2]], words[2]


def wait_gone(pids, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and any(psutil.pid_exists(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if psutil.pid_exists(pid)]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_or_kill_of_the_main_process_leaves_no_workers_or_shared_memory(dataset, tmp_path, how):
    process, pids, name = start_script(dataset, tmp_path)
    assert not os.path.exists(f"/dev/shm/{name}")  # unlinked as soon as the workers were forked
    process.send_signal(how)
    try:
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    if how == signal.SIGINT:  # the loader closed itself at exit: the workers are already gone
        assert "KeyboardInterrupt" in stderr
        assert wait_gone(pids, 1) == []
    else:  # orphans notice the missing parent on their own
        assert wait_gone(pids, 10) == []
