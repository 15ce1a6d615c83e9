"""One chip as the loader builds it: its pixels (lib.data.chip_image.render_chip) against crops and resizes
of the whole image, its boxes (lib.data.chip_boxes), and one chip through the chip worker (mean subtraction,
the anchor border, gt_boxes, im_info)."""
import cv2
import numpy as np
import pytest

from lib.config import load_config
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import BatchRing
from lib.data.chip_boxes import chip_gt_boxes, chip_valid_range, pack_gt_boxes
from lib.data.chip_image import render_chip
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import ChipRef
from lib.data.pixels import network_pixels

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
