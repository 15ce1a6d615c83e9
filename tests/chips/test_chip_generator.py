"""The compiled greedy chip cover (chip_generator.generate) against hand-worked cases, the pure-Python
reference (chip_generator/reference.py) and coverage / bounds properties on random and adversarial scenes,
for both candidate-window rules (TRAIN.CHIP_WINDOWS)."""
import numpy as np
import pytest

import chip_generator
from chip_generator.cover import candidate_windows
from chip_generator.reference import reference_generate, reference_offsets, reference_windows

WINDOW_RULES = ("reference", "clipped")


def contains(chips, boxes):
    """(N, K) bool: box n inside chip k (inclusive pixels), computed independently of the generator."""
    return ((boxes[:, None, 0] >= chips[None, :, 0]) & (boxes[:, None, 1] >= chips[None, :, 1])
            & (boxes[:, None, 2] <= chips[None, :, 2]) & (boxes[:, None, 3] <= chips[None, :, 3]))


def all_candidates(width, height, chip_size, stride, windows):
    return np.array(reference_windows(width, height, chip_size, stride, windows), np.float32)


def random_scene(rng, width, height, count, max_size=300.0, margin=0.0):
    """`count` random boxes, possibly reaching `margin` pixels past the image."""
    x1 = rng.uniform(-margin, width - 1, count)
    y1 = rng.uniform(-margin, height - 1, count)
    w = rng.uniform(0, max_size, count)
    h = rng.uniform(0, max_size, count)
    return np.stack([x1, y1, x1 + w, y1 + h], axis=1).astype(np.float32)


def check_cover(chips, boxes, width, height, chip_size, stride, windows):
    """Bounds, sizes, and coverage of every box that fits in some candidate window."""
    assert chips.dtype == np.float32 and chips.ndim == 2 and chips.shape[1] == 4
    assert (chips[:, :2] >= 0).all() and (chips[:, 2] <= width - 1).all() and (chips[:, 3] <= height - 1).all()
    # clipped: never larger than a chip; reference: the corner and edge windows may be one pixel larger
    sizes = {"clipped": ([min(chip_size, width)], [min(chip_size, height)]),
             "reference": ([min(chip_size, width), chip_size + 1], [min(chip_size, height), chip_size + 1])}
    assert np.isin(chips[:, 2] - chips[:, 0] + 1, sizes[windows][0]).all()
    assert np.isin(chips[:, 3] - chips[:, 1] + 1, sizes[windows][1]).all()
    assert (chips == np.round(chips)).all()
    fits = contains(all_candidates(width, height, chip_size, stride, windows), boxes).any(axis=1)
    covered = contains(chips, boxes).any(axis=1) if len(chips) else np.zeros(len(boxes), bool)
    np.testing.assert_array_equal(covered, fits)
    # Every chip covers something new when it is picked (no wasted chips).
    seen = np.zeros(len(boxes), bool)
    for chip in chips:
        inside = contains(chip[None], boxes)[:, 0]
        assert (inside & ~seen).any()
        seen |= inside


def test_clipped_windows_are_the_grid_plus_the_flush_window():
    assert reference_offsets(1000, 512, 100) == [0, 100, 200, 300, 400, 488]
    assert reference_offsets(1024, 512, 256) == [0, 256, 512]  # flush window already on the grid
    assert reference_offsets(300, 512, 32) == [0]
    assert reference_offsets(513, 512, 32) == [0, 1]
    np.testing.assert_array_equal(candidate_windows(1000, 300, 512, 100, "clipped"),
                                  [[x, 0, x + 511, 299] for x in (0, 100, 200, 300, 400, 488)])


def test_reference_windows_hand_worked():
    # 1000 x 600, chip 512, stride 100 (cchips.cpp): corners, grid x in 0..400, y in {0}, right edge, bottom edge
    expected = [[488, 0, 999, 512],  # top-right corner, 513 tall
                [0, 88, 512, 599],  # bottom-left corner, 513 wide
                [488, 88, 999, 599],  # bottom-right corner
                [0, 0, 511, 511], [100, 0, 611, 511], [200, 0, 711, 511], [300, 0, 811, 511], [400, 0, 911, 511],
                [487, 0, 999, 511],  # right edge (j = 0), 513 wide
                *[[x, 87, x + 511, 599] for x in (0, 100, 200, 300, 400)]]  # bottom edge, 513 tall
    np.testing.assert_array_equal(candidate_windows(1000, 600, 512, 100, "reference"), expected)
    # narrower than a chip: the corners collapse to two windows, the right edge is a column at x = 0
    np.testing.assert_array_equal(candidate_windows(300, 700, 512, 100, "reference"),
                                  [[0, 0, 299, 512], [0, 188, 299, 699], [0, 0, 299, 511], [0, 100, 299, 611]])
    np.testing.assert_array_equal(candidate_windows(300, 200, 512, 100, "reference"), [[0, 0, 299, 199]])
    for windows in WINDOW_RULES:
        np.testing.assert_array_equal(candidate_windows(1000, 600, 512, 100, windows),
                                      reference_windows(1000, 600, 512, 100, windows))
    with pytest.raises(ValueError, match="CHIP_WINDOWS"):
        candidate_windows(1000, 600, 512, 100, "bogus")


def test_reference_edge_window_is_one_pixel_wider():
    # A box touching the right edge of a 1000 px image, 512 px wide from x = 488: only the 513 px edge
    # window starting at 487 and the corner at 488 contain it; the box 487..999 only the edge window.
    box = np.array([[487, 10, 999, 40]], np.float32)
    np.testing.assert_array_equal(chip_generator.generate(box, 1000, 600, 512, 100, rng=0), [[487, 0, 999, 511]])
    assert len(chip_generator.generate(box, 1000, 600, 512, 100, rng=0, windows="clipped")) == 0


def test_single_box_gives_one_chip_containing_it():
    boxes = np.array([[10, 20, 50, 60]], np.float32)
    chips = chip_generator.generate(boxes, 2000, 1400, 512, 32, rng=0)
    assert chips.shape == (1, 4)
    x1, y1, x2, y2 = chips[0]
    assert x1 <= 10 and y1 <= 20 and x2 >= 50 and y2 >= 60 and x2 - x1 == 511 and y2 - y1 == 511


@pytest.mark.parametrize("windows", WINDOW_RULES)
def test_image_smaller_than_chip_is_one_clipped_chip(windows):
    boxes = np.array([[0, 0, 299, 199], [10, 10, 20, 20]], np.float32)
    np.testing.assert_array_equal(chip_generator.generate(boxes, 300, 200, 512, 32, rng=0, windows=windows),
                                  [[0, 0, 299, 199]])
    # Clipped along one axis only (reference: the bottom-left corner window, 513 wide, ties with it).
    picks = {tuple(chip_generator.generate(boxes[1:], 1000, 200, 512, 32, rng=seed, windows=windows)[0])
             for seed in range(20)}
    assert picks == ({(0, 0, 511, 199)} if windows == "clipped" else {(0, 0, 511, 199), (0, 0, 512, 199)})


def test_greedy_picks_the_crowded_window_first():
    # Three boxes together near the left, one far right: the first chip holds the three, then the lone one.
    boxes = np.array([[10, 10, 40, 40], [200, 100, 260, 160], [400, 300, 450, 350], [1800, 900, 1850, 950]],
                     np.float32)
    chips = chip_generator.generate(boxes, 2000, 1000, 512, 32, rng=3)
    assert len(chips) == 2
    np.testing.assert_array_equal(contains(chips, boxes), [[1, 0], [1, 0], [1, 0], [0, 1]])
    # The lone box's chip must contain x 1800..1850 and y 900..950: offsets x in 1344..1488, y in 448..488.
    assert 1344 <= chips[1, 0] <= 1488 and 448 <= chips[1, 1] <= 488


@pytest.mark.parametrize("windows", WINDOW_RULES)
def test_greedy_takes_max_count_at_each_step(windows):
    rng = np.random.default_rng(11)
    boxes = random_scene(rng, 1500, 1100, 60, max_size=120)
    chips = chip_generator.generate(boxes, 1500, 1100, 512, 48, rng=5, windows=windows)
    candidates = all_candidates(1500, 1100, 512, 48, windows)
    uncovered = np.ones(len(boxes), bool)
    for chip in chips:
        best = (contains(candidates, boxes) & uncovered[:, None]).sum(axis=0).max()
        inside = contains(chip[None], boxes)[:, 0]
        assert (inside & uncovered).sum() == best
        uncovered &= ~inside


def test_box_wider_than_chip_minus_stride_may_not_fit_but_smaller_ones_always_do():
    # 500 px wide at x1 = 150 needs a window offset in [138, 150]: none on the 0, 100, 200, ... grid.
    boxes = np.array([[150, 0, 649, 10]], np.float32)
    assert len(chip_generator.generate(boxes, 2000, 600, 512, 100, rng=0)) == 0
    # Any box with w, h <= chip - stride inside the image fits.
    rng = np.random.default_rng(2)
    x1 = rng.uniform(0, 2000 - 412, 300)
    y1 = rng.uniform(0, 600 - 412, 300)
    small = np.stack([x1, y1, x1 + 411, y1 + rng.uniform(0, 411, 300)], axis=1).astype(np.float32)
    chips = chip_generator.generate(small, 2000, 600, 512, 100, rng=0)
    assert contains(chips, small).any(axis=1).all()


def test_empty_input_returns_empty_float32():
    chips = chip_generator.generate(np.zeros((0, 4), np.float32), 640, 480, 512, 32)
    assert chips.shape == (0, 4) and chips.dtype == np.float32


@pytest.mark.parametrize("boxes, kwargs, message", [
    (np.zeros((2, 4), np.float64), {}, "float32"),
    ([[0, 0, 1, 1]], {}, "float32"),
    (np.zeros((2, 3), np.float32), {}, "shape"),
    (np.zeros(4, np.float32), {}, "shape"),
    (np.array([[0, 0, np.nan, 5]], np.float32), {}, "NaN"),
    (np.array([[0, 0, np.inf, 5]], np.float32), {}, "NaN"),
    (np.array([[0, 0, 5, 5], [10, 10, 4, 20]], np.float32), {}, "box 1"),
    (np.zeros((1, 4), np.float32), {"chip_size": 0}, "chip_size"),
    (np.zeros((1, 4), np.float32), {"stride": -32}, "stride"),
    (np.zeros((1, 4), np.float32), {"stride": 1.5}, "stride"),
    (np.zeros((1, 4), np.float32), {"width": 0}, "width"),
    (np.zeros((1, 4), np.float32), {"height": float("nan")}, "height"),
    (np.zeros((1, 4), np.float32), {"height": "480"}, "height"),
])
def test_invalid_input_raises_value_error(boxes, kwargs, message):
    args = dict(width=640, height=480, chip_size=512, stride=32)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        chip_generator.generate(boxes, **args)


def test_same_seed_same_chips_and_ties_break_randomly():
    boxes = np.array([[900, 600, 920, 620]], np.float32)  # fits in ~16 x 16 tied candidates
    first = chip_generator.generate(boxes, 2000, 1400, 512, 32, rng=7)
    np.testing.assert_array_equal(first, chip_generator.generate(boxes, 2000, 1400, 512, 32, rng=7))
    np.testing.assert_array_equal(first, chip_generator.generate(boxes, 2000, 1400, 512, 32,
                                                                 rng=np.random.default_rng(7)))
    picks = {tuple(chip_generator.generate(boxes, 2000, 1400, 512, 32, rng=seed)[0]) for seed in range(20)}
    assert len(picks) > 5


@pytest.mark.parametrize("windows", WINDOW_RULES)
@pytest.mark.parametrize("seed", range(12))
def test_matches_reference_on_random_scenes(seed, windows):
    rng = np.random.default_rng(100 + seed)
    width, height = int(rng.integers(1, 2100)), int(rng.integers(1, 1500))
    stride = int(rng.choice([7, 32, 56, 100, 600]))
    boxes = random_scene(rng, width, height, int(rng.integers(1, 40)), margin=30)
    chips = chip_generator.generate(boxes, width, height, 512, stride, rng=seed, windows=windows)
    np.testing.assert_array_equal(chips, reference_generate(boxes, width, height, 512, stride, rng=seed,
                                                            windows=windows))
    check_cover(chips, boxes, width, height, 512, stride, windows)


@pytest.mark.parametrize("windows", WINDOW_RULES)
def test_matches_reference_with_stride_one(windows):
    rng = np.random.default_rng(9)
    boxes = random_scene(rng, 560, 530, 15, max_size=100)
    chips = chip_generator.generate(boxes, 560, 530, 512, 1, rng=2, windows=windows)
    np.testing.assert_array_equal(chips, reference_generate(boxes, 560, 530, 512, 1, rng=2, windows=windows))
    check_cover(chips, boxes, 560, 530, 512, 1, windows)


@pytest.mark.parametrize("windows", WINDOW_RULES)
def test_matches_reference_on_duplicate_and_nested_boxes(windows):
    base = np.array([[100, 100, 150, 150], [100, 100, 150, 150], [90, 90, 400, 400], [120, 120, 121, 121]],
                    np.float32)
    boxes = np.concatenate([base, base + 700, base + np.float32([1200, 0, 1200, 0])])
    for seed in range(3):
        chips = chip_generator.generate(boxes, 1700, 1300, 512, 32, rng=seed, windows=windows)
        np.testing.assert_array_equal(chips, reference_generate(boxes, 1700, 1300, 512, 32, rng=seed,
                                                                windows=windows))
        check_cover(chips, boxes, 1700, 1300, 512, 32, windows)


@pytest.mark.parametrize("windows", WINDOW_RULES)
def test_boxes_touching_every_border_and_corner(windows):
    w, h = 1333, 999
    boxes = np.array([[0, 0, 30, 30], [w - 31, 0, w - 1, 30], [0, h - 31, 30, h - 1], [w - 31, h - 31, w - 1, h - 1],
                      [600, 0, 640, 5], [0, 500, 5, 540], [w - 1, 400, w - 1, 450], [700, h - 1, 760, h - 1],
                      [w - 50, h - 50, w, h]],  # the last one pokes past the image: fits nowhere
                     np.float32)
    chips = chip_generator.generate(boxes, w, h, 512, 59, rng=1, windows=windows)
    check_cover(chips, boxes, w, h, 512, 59, windows)
    assert contains(chips, boxes[:-1]).any(axis=1).all()
    assert not contains(chips, boxes[-1:]).any()
    np.testing.assert_array_equal(chips, reference_generate(boxes, w, h, 512, 59, rng=1, windows=windows))


@pytest.mark.parametrize("windows", WINDOW_RULES)
@pytest.mark.parametrize("width, height", [(1, 1), (5, 700), (700, 5), (512, 512), (513, 1), (513, 514)])
def test_tiny_images(width, height, windows):
    boxes = np.array([[0, 0, width - 1, height - 1], [0, 0, 0, 0]], np.float32)
    chips = chip_generator.generate(boxes, width, height, 512, 32, rng=0, windows=windows)
    check_cover(chips, boxes, width, height, 512, 32, windows)
    np.testing.assert_array_equal(chips, reference_generate(boxes, width, height, 512, 32, rng=0, windows=windows))


def test_huge_image_with_many_candidates():
    rng = np.random.default_rng(4)
    width, height = 12000, 9000  # 360 x 266 = 96k candidate windows
    boxes = random_scene(rng, width, height, 200, max_size=200)
    chips = chip_generator.generate(boxes, width, height, 512, 32, rng=0)
    check_cover(chips, boxes, width, height, 512, 32, "reference")


def test_thousands_of_boxes():
    rng = np.random.default_rng(5)
    width, height = 2000, 1400
    boxes = random_scene(rng, width, height, 5000, max_size=150, margin=5)
    chips = chip_generator.generate(boxes, width, height, 512, 32, rng=0)
    check_cover(chips, boxes, width, height, 512, 32, "reference")
    np.testing.assert_array_equal(chips, chip_generator.generate(boxes, width, height, 512, 32, rng=0))


def test_adversarial_grid_of_boxes_needing_one_chip_each():
    # Boxes of 400 px spaced 600 apart: no window holds two, so there is one chip per box.
    starts = np.arange(0, 2400, 600, dtype=np.float32)
    gx, gy = np.meshgrid(starts, starts)
    boxes = np.stack([gx.ravel(), gy.ravel(), gx.ravel() + 399, gy.ravel() + 399], axis=1)
    chips = chip_generator.generate(boxes, 2400, 2400, 512, 16, rng=0)
    assert len(chips) == len(boxes)
    check_cover(chips, boxes, 2400, 2400, 512, 16, "reference")
