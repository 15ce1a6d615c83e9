"""Per-image chip mining (chip_generator/mining.py): the reference's validity, assignment and negative-chip
rules on hand-worked cases (each rule its own test), the variants of each config key, epoch sampling and the
per-epoch stride."""
import numpy as np
import pytest

from lib.config import load_config
from chip_generator.mining import (ImageChips, MiningParams, ScaleChips, draw_epoch_stride, mine_image_chips,
                                   sample_epoch_chips, valid_box_mask)
from lib.scales import scaled_image_size

COCO_RANGES = [(-1, 80), (32, 150), (120, -1)]
ONE_SCALE = {"TRAIN.SCALES": [1.0], "TRAIN.VALID_RANGES": [[-1, -1]], "TRAIN.NEG_CHIP_MIN_PROPOSALS": [25]}


def mining_params(**overrides):
    """The mining parameters of the default config with ``overrides``."""
    return MiningParams.from_config(load_config(None, overrides))


def inside(boxes, chip):
    return ((boxes[:, 0] >= chip[0]) & (boxes[:, 1] >= chip[1]) & (boxes[:, 2] <= chip[2]) & (boxes[:, 3] <= chip[3]))


def box_of(x, y, w, h):
    return [x, y, x + w - 1, y + h - 1]


def entry_with(boxes, proposals=None, width=640, height=480):
    entry = {"id": 42, "image": "img.jpg", "width": width, "height": height, "flipped": False,
             "boxes": np.array(boxes, np.float32).reshape(-1, 4), "gt_classes": np.ones(len(boxes), np.int32)}
    if proposals is not None:
        entry["proposals"] = np.array(proposals, np.float32).reshape(-1, 4)
    return entry


def cluster(rng, x, y, count, spread=60, size=20):
    """`count` proposals of about size x size (sqrt area ~ 20: valid at the finest scale) near (x, y)."""
    x1 = x + rng.uniform(0, spread, count)
    y1 = y + rng.uniform(0, spread, count)
    return np.stack([x1, y1, x1 + size - 1, y1 + size - 1], axis=1)


def reference_mask(boxes, level, assignment=False, scale=None, stride=32, ranges=COCO_RANGES):
    scale = scale if scale is not None else (3.0, 1.667, 0.8)[level]
    return valid_box_mask(np.array(boxes, np.float32), ranges[level], scale, 512, stride, level, len(ranges),
                          "reference", assignment)


# -- validity: TRAIN.VALIDITY_RULES reference ---------------------------------------------------------
def test_reference_sizes_are_truncated_differences_without_plus_one():
    boxes = [[0, 0, 79.5, 79.5],  # x2 - x1 = 79.5 -> 79 px: sqrt 79 < 80 (the +1 rule would say 80.5 > 80)
             [0, 0, 80, 80],  # 80 px: not < 80
             [10, 10, 89.9, 30]]  # 79 x 20 px
    np.testing.assert_array_equal(reference_mask(boxes, 0), [1, 0, 1])
    strict = valid_box_mask(np.array(boxes, np.float32), (-1, 80), 3.0, 512, 32, 0, 3, "strict", False)
    np.testing.assert_array_equal(strict, [0, 0, 1])


def test_reference_range_is_lower_inclusive_upper_exclusive_and_assignment_drops_the_lower_bound():
    boxes = [box_of(0, 0, 32, 32), [0, 0, 31, 31], [0, 0, 32, 32], [0, 0, 149, 149], [0, 0, 150, 150]]
    # sizes 31, 31, 32, 149, 150 at the intermediate scale (32, 150): chips are made for 32 <= size < 150,
    # boxes are assigned to chips with size < 150 only
    np.testing.assert_array_equal(reference_mask(boxes, 1), [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(reference_mask(boxes, 1, assignment=True), [1, 1, 1, 1, 0])
    # the finest scale has no lower bound anyway; the coarsest only the lower one (120)
    np.testing.assert_array_equal(reference_mask([[0, 0, 119, 119], [0, 0, 120, 120], [0, 0, 2000, 2000]], 2),
                                  [0, 1, 1])


def test_reference_two_pixel_rule_at_the_finest_scale_and_for_assignment():
    thin, wide = [0, 0, 1, 30], [0, 0, 2, 30]  # 1 px and 2 px wide (x2 - x1)
    np.testing.assert_array_equal(reference_mask([thin, wide], 0), [0, 1])
    ranges = [(-1, 80), (4, 150), (4, -1)]  # sqrt(1 * 30) = 5.5 is in range at every scale
    np.testing.assert_array_equal(reference_mask([thin, wide], 1, ranges=ranges), [1, 1])  # chips: no 2 px rule
    np.testing.assert_array_equal(reference_mask([thin, wide], 1, assignment=True, ranges=ranges), [0, 1])
    np.testing.assert_array_equal(reference_mask([thin, wide], 2, assignment=True, ranges=ranges), [1, 1])


def test_reference_fit_rule_uses_the_stride_and_skips_the_coarsest_scale():
    # finest, stride 32: the longer side must be < (512 - 32 - 1) / 3 = 159.67; stride 56: < 151.67
    boxes = [[0, 0, 20, 151], [0, 0, 20, 159], [0, 0, 20, 160]]
    np.testing.assert_array_equal(reference_mask(boxes, 0), [1, 1, 0])
    np.testing.assert_array_equal(reference_mask(boxes, 0, stride=56), [1, 0, 0])
    np.testing.assert_array_equal(reference_mask([[0, 0, 20, 1000]], 2), [1])  # sqrt 141 >= 120, no fit rule


def test_strict_rule_is_one_plus_one_rule_for_chips_and_assignment():
    # Default COCO settings, chip 512, stride 32: fit limits (512-32-1)/3 = 159.67 and /1.667 = 287.3.
    boxes = np.array([box_of(0, 0, 10, 10),  # sqrt 10: finest only
                      box_of(0, 0, 1, 5),  # too thin for the finest scale, too small for the others
                      box_of(0, 0, 100, 100),  # sqrt 100: middle only
                      box_of(0, 0, 20, 150),  # sqrt 54.8, 150 < 159.67: finest (and middle, sqrt >= 32)
                      box_of(0, 0, 20, 170),  # sqrt 58.3 but 170 px does not fit a chip at 3x: middle only
                      box_of(0, 0, 130, 130),  # sqrt 130: middle and coarsest
                      box_of(0, 0, 300, 100),  # sqrt 173: coarsest only (middle too big anyway)
                      box_of(0, 0, 280, 60),  # sqrt 129.6, 280 < 287.3: middle and coarsest
                      box_of(0, 0, 290, 60)],  # sqrt 131.9, 290 > 287.3: coarsest only
                     np.float32)
    scales = [3.0, 1.667, 0.8]
    expected = [[1, 0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 1, 1, 1, 1]]
    for level in range(3):
        for assignment in (False, True):
            mask = valid_box_mask(boxes, COCO_RANGES[level], scales[level], 512, 32, level, 3, "strict", assignment)
            np.testing.assert_array_equal(mask, expected[level])


# -- positive chips and assignment ---------------------------------------------------------------------
def containment(boxes, chips):
    """(N, K) share of each box (original pixels, +1 areas) inside each chip, written out independently."""
    iw = np.minimum(boxes[:, None, 2], chips[None, :, 2]) - np.maximum(boxes[:, None, 0], chips[None, :, 0]) + 1
    ih = np.minimum(boxes[:, None, 3], chips[None, :, 3]) - np.maximum(boxes[:, None, 1], chips[None, :, 1]) + 1
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    return np.clip(iw, 0, None) * np.clip(ih, 0, None) / area[:, None]


def test_positive_chips_cover_valid_boxes_and_each_box_is_valid_in_its_best_chip_only():
    rng = np.random.default_rng(0)
    x1, y1 = rng.uniform(0, 560, 40), rng.uniform(0, 400, 40)
    sizes = rng.uniform(4, 200, (40, 2))
    boxes = np.stack([x1, y1, np.minimum(x1 + sizes[:, 0], 639), np.minimum(y1 + sizes[:, 1], 479)], axis=1)
    params = mining_params(**{"TRAIN.CHIP_STRIDE": 32})
    chips = mine_image_chips(entry_with(boxes), params, 32, np.random.default_rng(1))
    assert isinstance(chips, ImageChips) and len(chips.scales) == 3
    for level, (scale, factor) in enumerate(zip(chips.scales, [3.0, 1.667, 512 / 640])):
        assert isinstance(scale, ScaleChips)
        assert scale.im_scale == pytest.approx(factor)
        assert scale.image_size == (int(480 * factor), int(640 * factor))  # truncated, as the reference
        height, width = scale.image_size
        # the cover's boxes: scaled in float32 and clipped to [0, W - 2] x [0, H - 2], as the reference's
        scaled = np.minimum(np.float32(boxes) * np.float32(factor), np.float32([width - 2, height - 2] * 2))
        valid = np.flatnonzero(scale.valid)
        assert len(valid) > 0
        np.testing.assert_array_equal(scale.valid, reference_mask(boxes, level, scale=factor))
        # every box the chips are made for lies inside some positive chip
        assert all(any(inside(scaled[[b]], chip)[0] for chip in scale.pos_chips) for b in valid)
        assert len(scale.pos_valid) == len(scale.pos_chips)
        members = np.concatenate(scale.pos_valid)
        assert len(members) == len(set(members.tolist()))  # valid in one chip at most
        assert set(valid.tolist()) <= set(members.tolist())  # the generating boxes are all assigned
        assert set(members.tolist()) <= set(np.flatnonzero(reference_mask(boxes, level, True, factor)).tolist())
        share = containment(boxes.astype(np.float64), scale.pos_chips.astype(np.float64) / factor)
        for k, chip_members in enumerate(scale.pos_valid):
            for b in chip_members:  # the chip containing most of the box, the first in pick order on ties
                assert k == int(np.flatnonzero(share[b] == share[b].max())[0])
        assert (scale.pos_chips[:, 2] <= width - 1).all() and (scale.pos_chips[:, 3] <= height - 1).all()
    # At the coarsest scale the image (512 x 384) fits in one chip: that chip is the whole image.
    np.testing.assert_array_equal(chips.scales[2].pos_chips, [[0, 0, 511, 383]])


def test_assignment_picks_the_chip_containing_most_and_needs_the_lower_bound_on_the_visible_part():
    # Coarsest (only) scale, image 1200 x 500: no fit rule. Two 130 px boxes at the sides make two chips; the
    # 600 px box fits in neither: it goes to the chip holding most of it, if the visible part there is at
    # least lo (sqrt(w * h), no +1: 212..260 px x 49 px, sqrt 102..113).
    boxes = [box_of(10, 10, 130, 130), box_of(1060, 10, 130, 130), box_of(300, 100, 600, 50)]
    for lo, assigned in ((100, True), (120, False)):
        params = mining_params(**dict(ONE_SCALE, **{"TRAIN.VALID_RANGES": [[lo, -1]]}))
        scale = mine_image_chips(entry_with(boxes, width=1200, height=500), params, 32,
                                 np.random.default_rng(0)).scales[0]
        assert len(scale.pos_chips) == 2
        big = np.float64(boxes[2])
        visible = [max(0, min(big[2], c[2]) - max(big[0], c[0])) for c in scale.pos_chips]
        owner = int(np.argmax(visible))
        assert 100 < np.sqrt(visible[owner] * 49) < 120
        assert (2 in scale.pos_valid[owner].tolist()) == assigned
        assert 2 not in scale.pos_valid[1 - owner].tolist()


def test_box_valid_for_assignment_only_is_valid_in_a_chip_containing_it_and_unassigned_elsewhere():
    # Intermediate scale (x1.667, range 32..150): a 40 px box makes a chip; a 20 px box (below 32) inside that
    # chip is assigned to it and trained as valid; one far away overlaps no chip and stays unassigned.
    boxes = [box_of(100, 100, 40, 40), box_of(150, 150, 20, 20), box_of(1800, 1300, 20, 20)]
    scale = mine_image_chips(entry_with(boxes, width=2000, height=1500), mining_params(), 56,
                             np.random.default_rng(0)).scales[1]
    np.testing.assert_array_equal(scale.valid, [1, 0, 0])
    assert len(scale.pos_chips) == 1
    assert scale.pos_valid[0].tolist() == [0, 1]


def test_coarsest_scale_has_no_chip_without_valid_boxes():
    chips = mine_image_chips(entry_with([box_of(100, 100, 10, 10)]), mining_params(), 56, np.random.default_rng(0))
    assert len(chips.scales[0].pos_chips) == 1
    assert len(chips.scales[1].pos_chips) == 0 and len(chips.scales[2].pos_chips) == 0
    assert chips.scales[1].pos_valid == [] and chips.scales[2].neg_chips.shape == (0, 4)


def test_boxes_at_the_image_edge_are_covered_despite_the_truncated_image_size():
    # 427 px wide at 1.2x: int(512.4) = 512 px, but the last column 426 lands at 511.2, past the edge.
    params = mining_params(**{"TRAIN.SCALES": [1.2, 1.667, 512], "TRAIN.VALID_RANGES": [[-1, -1]] * 3})
    boxes = [[380, 200, 426, 250]]
    chips = mine_image_chips(entry_with(boxes, width=427, height=320), params, 32, np.random.default_rng(0))
    for scale in chips.scales:
        assert scale.valid.all() and len(scale.pos_chips) == 1 and scale.pos_valid[0].tolist() == [0]


@pytest.mark.parametrize("crop, size", [("truncate", (200, 501)), ("round", (200, 502))])
def test_scaled_image_size_is_truncated_by_default(crop, size):
    assert scaled_image_size(120, 301, 1.667, crop == "truncate") == size  # 301 * 1.667 = 501.77
    params = mining_params(**dict(ONE_SCALE, **{"TRAIN.CHIP_CROP": crop, "TRAIN.SCALES": [1.667]}))
    scale = mine_image_chips(entry_with([box_of(10, 10, 30, 30)], width=301, height=120), params, 32,
                             np.random.default_rng(0)).scales[0]
    assert scale.image_size == size
    np.testing.assert_array_equal(scale.pos_chips, [[0, 0, size[1] - 1, size[0] - 1]])


@pytest.mark.parametrize("windows", ["reference", "clipped"])
def test_chip_windows_key(windows):
    # a 513 px box in a 1200 px image fits only the reference's 513 px wide bottom-left corner window
    params = mining_params(**dict(ONE_SCALE, **{"TRAIN.CHIP_WINDOWS": windows}))
    scale = mine_image_chips(entry_with([[0, 100, 512, 150]], width=1200, height=500), params, 32,
                             np.random.default_rng(0)).scales[0]
    expected = [[0, 0, 512, 499]] if windows == "reference" else np.zeros((0, 4))
    np.testing.assert_array_equal(scale.pos_chips, expected)


@pytest.mark.parametrize("rule, expected", [("assigned", [[1, 2], [0]]), ("visible", [[0, 1, 2], [0, 1, 2]])])
def test_chip_valid_boxes_key(rule, expected):
    # 1000 x 500 at scale 1: the chip holding boxes 1 and 2 is picked first (488..999), then one for box 0
    # (0..511), which shows 12 px of box 1: assigned, box 1 is valid only in the first chip
    boxes = [[0, 0, 50, 50], [500, 100, 560, 150], [900, 100, 950, 150]]
    params = mining_params(**dict(ONE_SCALE, **{"TRAIN.CHIP_VALID_BOXES": rule}))
    scale = mine_image_chips(entry_with(boxes, width=1000, height=500), params, 32, np.random.default_rng(0)).scales[0]
    np.testing.assert_array_equal(scale.pos_chips, [[488, 0, 999, 499], [0, 0, 511, 499]])
    assert [v.tolist() for v in scale.pos_valid] == expected
    assert [v.tolist() for _, _, _, v in sample_epoch_chips(ImageChips([scale]), np.random.default_rng(0), 2)] == \
        expected


# -- negative chips -------------------------------------------------------------------------------------
def column_cluster(rng, x, count, width=50):
    """`count` proposals 40 px tall, ``width`` wide, starting within 10 px of x (original pixels)."""
    x1, y1 = x + rng.uniform(0, 10, count), rng.uniform(100, 300, count)
    return np.stack([x1, y1, x1 + width, y1 + 40], axis=1)


@pytest.mark.parametrize("rule", ["reference", "contained"])
def test_proposals_overlapping_a_positive_chip_are_covered_in_the_reference(rule):
    # 30 proposals across the right edge of the positive chip (0..511 or 0..512): none is contained in it,
    # all overlap it by >= 1 px
    proposals = column_cluster(np.random.default_rng(0), 490, 30, width=70)
    params = mining_params(**dict(ONE_SCALE, **{"TRAIN.NEG_CHIP_RULES": rule}))
    scale = mine_image_chips(entry_with([[10, 10, 59, 59]], proposals, width=1200, height=500), params, 32,
                             np.random.default_rng(0)).scales[0]
    assert scale.neg_counts.tolist() == ([] if rule == "reference" else [30])


@pytest.mark.parametrize("seed", range(3))
def test_each_remaining_box_is_counted_once_in_the_reference(seed):
    # clusters of 20 (x 600), 10 (x 900) and 20 (x 1140): no window holds the outer two, so two negative
    # chips both hold the middle one; the reference counts it in the first (30 and 20: one chip above 25),
    # the contained rule in both (30 and 30)
    rng = np.random.default_rng(0)
    proposals = np.concatenate([column_cluster(rng, 600, 20), column_cluster(rng, 900, 10),
                                column_cluster(rng, 1140, 20, width=40)])
    entry = entry_with([[10, 10, 59, 59]], proposals, width=1200, height=500)
    counts = {}
    for rule in ("reference", "contained"):
        params = mining_params(**dict(ONE_SCALE, **{"TRAIN.NEG_CHIP_RULES": rule}))
        counts[rule] = mine_image_chips(entry, params, 32, np.random.default_rng(seed)).scales[0].neg_counts.tolist()
    assert counts == {"reference": [30], "contained": [30, 30]}


def test_uncovered_gts_join_the_negative_pool_and_are_valid_in_their_negative_chip():
    # Intermediate scale: the 20 px gt far from the only positive chip is valid for assignment but
    # uncovered; with 11 proposals around it a negative chip is made (11 + the gt > 10) and trains on it
    rng = np.random.default_rng(1)
    gts = [box_of(100, 100, 40, 40), box_of(1800, 1300, 20, 20)]
    proposals = cluster(rng, 1750, 1250, 11, spread=60, size=40)
    for rule, counts, valid in (("reference", [12], [[1]]), ("contained", [11], [[]])):
        params = mining_params(**{"TRAIN.NEG_CHIP_RULES": rule})
        scale = mine_image_chips(entry_with(gts, proposals, width=2000, height=1500), params, 56,
                                 np.random.default_rng(0)).scales[1]
        assert scale.neg_counts.tolist() == counts
        assert [v.tolist() for v in scale.neg_valid] == valid


def test_negative_chip_kept_only_above_the_threshold():
    rng = np.random.default_rng(3)
    gt = [box_of(600, 440, 30, 30)]  # bottom-right corner; sqrt 30: finest scale only
    many = cluster(rng, 10, 10, 30)  # 30 > 25 proposals, far from the gt
    few = cluster(rng, 10, 10, 25)  # not more than 25
    params = mining_params()
    kept = mine_image_chips(entry_with(gt, many), params, 56, np.random.default_rng(0)).scales[0]
    assert len(kept.neg_chips) == 1 and kept.neg_counts.tolist() == [30]
    assert inside(many * np.float32(3.0), kept.neg_chips[0]).all()
    dropped = mine_image_chips(entry_with(gt, few), params, 56, np.random.default_rng(0)).scales[0]
    assert dropped.neg_chips.shape == (0, 4) and dropped.neg_counts.shape == (0,)
    # With a lower threshold the same 25 proposals make a chip.
    lower = mining_params(**{"TRAIN.NEG_CHIP_MIN_PROPOSALS": [24, 10, 10]})
    lowered = mine_image_chips(entry_with(gt, few), lower, 56, np.random.default_rng(0)).scales[0]
    assert lowered.neg_counts.tolist() == [25]
    # Disabled by config.
    off = mining_params(**{"TRAIN.USE_NEG_CHIPS": False})
    assert len(mine_image_chips(entry_with(gt, many), off, 56, np.random.default_rng(0)).scales[0].neg_chips) == 0


def test_proposals_inside_positive_chips_or_out_of_range_make_no_negative_chip():
    rng = np.random.default_rng(4)
    gt = [box_of(40, 40, 30, 30)]
    near_gt = cluster(rng, 20, 20, 40, spread=50)  # inside any chip covering the gt at 3x (offsets <= 120)
    too_big = cluster(rng, 400, 300, 40, spread=20, size=100)  # sqrt 99 >= 80 at the finest scale
    for rule in ("reference", "contained"):
        params = mining_params(**{"TRAIN.CHIP_STRIDE": 32, "TRAIN.NEG_CHIP_RULES": rule})
        chips = mine_image_chips(entry_with(gt, np.concatenate([near_gt, too_big])), params, 32,
                                 np.random.default_rng(0))
        assert chips.scales[0].neg_chips.shape == (0, 4)


def test_negative_counts_at_the_middle_scale_use_its_threshold():
    rng = np.random.default_rng(5)
    gt = [box_of(5, 5, 10, 10)]  # finest scale only, so the middle scale has no positive chip
    props = cluster(rng, 300, 200, 11, spread=100, size=50)  # sqrt 49: middle range; 11 > 10
    scale = mine_image_chips(entry_with(gt, props), mining_params(), 56, np.random.default_rng(0)).scales[1]
    assert scale.neg_counts.tolist() == [11]
    assert inside(np.float32(props) * np.float32(1.667), scale.neg_chips[0]).sum() == 11
    fewer = mine_image_chips(entry_with(gt, props[:10]), mining_params(), 56, np.random.default_rng(0)).scales[1]
    assert len(fewer.neg_chips) == 0


def test_mining_is_deterministic_under_a_seed():
    rng = np.random.default_rng(6)
    boxes = cluster(rng, 0, 0, 30, spread=500, size=40)
    props = cluster(rng, 0, 0, 300, spread=500, size=25)
    results = [mine_image_chips(entry_with(boxes, props), mining_params(), 58, np.random.default_rng(9)) for _ in range(2)]
    for a, b in zip(results[0].scales, results[1].scales):
        np.testing.assert_array_equal(a.pos_chips, b.pos_chips)
        np.testing.assert_array_equal(a.neg_chips, b.neg_chips)


def test_bad_entry_names_the_image():
    entry = entry_with([box_of(0, 0, 10, 10)])
    entry["boxes"] = np.array([[10, 10, 5, 20]], np.float32)
    with pytest.raises(ValueError, match="image id 42"):
        mine_image_chips(entry, mining_params(), 32, np.random.default_rng(0))
    entry = entry_with([box_of(0, 0, 10, 10)])
    entry["proposals"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="image id 42.*proposals"):
        mine_image_chips(entry, mining_params(), 32, np.random.default_rng(0))


# -- epoch sampling -------------------------------------------------------------------------------------
def fake_chips(num_pos, num_neg):
    def scale(level, pos, neg):
        return ScaleChips(im_scale=1.0, image_size=(600, 600), valid=np.zeros(0, bool),
                          pos_chips=np.arange(pos * 4, dtype=np.float32).reshape(-1, 4),
                          pos_valid=[np.array([level, k]) for k in range(pos)],
                          neg_chips=1000 + np.arange(neg * 4, dtype=np.float32).reshape(-1, 4),
                          neg_counts=np.full(neg, 30), neg_valid=[np.array([100 + level, k]) for k in range(neg)])
    return ImageChips(scales=[scale(i, num_pos[i], num_neg[i]) for i in range(len(num_pos))])


def test_sample_epoch_chips_takes_all_positives_and_at_most_max_neg():
    chips = fake_chips([2, 1, 1], [3, 2, 0])
    sampled = sample_epoch_chips(chips, np.random.default_rng(0), 2)
    assert [level for level, _, _, _ in sampled[:4]] == [0, 0, 1, 2]
    assert [negative for _, _, negative, _ in sampled] == [False] * 4 + [True] * 2
    assert [v.tolist() for _, _, _, v in sampled[:4]] == [[0, 0], [0, 1], [1, 0], [2, 0]]  # each chip's own set
    negatives = sampled[4:]
    assert len(negatives) == 2
    pool = {(level, tuple(c)) for level, s in enumerate(chips.scales) for c in s.neg_chips}
    drawn = {(level, tuple(c)) for level, c, _, _ in negatives}
    assert len(drawn) == 2 and drawn <= pool
    for level, chip, _, valid in negatives:
        k = [tuple(c) for c in chips.scales[level].neg_chips].index(tuple(chip))
        assert valid.tolist() == [100 + level, k]
    assert len(sample_epoch_chips(chips, np.random.default_rng(0), 0)) == 4
    assert len(sample_epoch_chips(chips, np.random.default_rng(0), 10)) == 4 + 5
    # Over many epochs every negative chip gets drawn.
    seen = {(level, tuple(c)) for seed in range(50)
            for level, c, _, _ in sample_epoch_chips(chips, np.random.default_rng(seed), 2)[4:]}
    assert seen == pool


def test_draw_epoch_stride():
    rng = np.random.default_rng(0)
    assert draw_epoch_stride(mining_params(**{"TRAIN.CHIP_STRIDE": 32}), rng) == 32
    draws = {draw_epoch_stride(mining_params(), rng) for _ in range(200)}  # default [56, 60)
    assert draws == {56, 57, 58, 59}
    for bad in ([60, 56], 31.5):
        with pytest.raises(ValueError, match="CHIP_STRIDE"):
            mining_params(**{"TRAIN.CHIP_STRIDE": bad})
