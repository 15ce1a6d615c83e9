"""Per-image chip mining (chip_generator/mining.py): valid ranges, positive chips and box assignment,
negative chips and their thresholds, epoch sampling and the per-epoch stride."""
import numpy as np
import pytest

from conftest import build_cfg

from chip_generator.mining import (ImageChips, MiningParams, ScaleChips, draw_epoch_stride, mine_image_chips,
                                   sample_epoch_chips, valid_box_mask)


def mining_params(**overrides):
    """The mining parameters of the default config with ``overrides``."""
    return MiningParams.from_config(build_cfg(overrides))


def inside(boxes, chip):
    return ((boxes[:, 0] >= chip[0]) & (boxes[:, 1] >= chip[1]) & (boxes[:, 2] <= chip[2]) & (boxes[:, 3] <= chip[3]))


def scaled_boxes(boxes, scale):
    """Boxes in the resized image, clipped to it (pixels past the edge cannot be in any chip)."""
    height, width = scale.image_size
    scaled = np.asarray(boxes, np.float32) * np.float32(scale.im_scale)
    return np.minimum(scaled, np.float32([width - 1, height - 1, width - 1, height - 1]))


def assigned_indices(scale):
    return sorted(int(i) for members in scale.pos_assigned for i in members)


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


def test_valid_box_mask_hand_worked():
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
    ranges = [(-1, 80), (32, 150), (120, -1)]
    scales = [3.0, 1.667, 0.8]
    masks = [valid_box_mask(boxes, ranges[i], scales[i], 512, 32, i, 3) for i in range(3)]
    np.testing.assert_array_equal(masks[0], [1, 0, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(masks[1], [0, 0, 1, 1, 1, 1, 0, 1, 0])
    np.testing.assert_array_equal(masks[2], [0, 0, 0, 0, 0, 1, 1, 1, 1])


def test_positive_chips_cover_and_assign_valid_boxes():
    rng = np.random.default_rng(0)
    x1, y1 = rng.uniform(0, 560, 40), rng.uniform(0, 400, 40)
    sizes = rng.uniform(4, 200, (40, 2))
    boxes = np.stack([x1, y1, np.minimum(x1 + sizes[:, 0], 639), np.minimum(y1 + sizes[:, 1], 479)], axis=1)
    cfg = mining_params(**{"TRAIN.CHIP_STRIDE": 32})
    chips = mine_image_chips(entry_with(boxes), cfg, 32, np.random.default_rng(1))
    assert isinstance(chips, ImageChips) and len(chips.scales) == 3
    for level, (scale, expected_scale) in enumerate(zip(chips.scales, [3.0, 1.667, 512 / 640])):
        assert isinstance(scale, ScaleChips)
        assert scale.im_scale == pytest.approx(expected_scale)
        assert scale.image_size == (round(480 * expected_scale), round(640 * expected_scale))
        scaled = scaled_boxes(boxes, scale)
        valid = np.flatnonzero(scale.valid)
        assert len(valid) > 0
        # Every valid box lies inside some positive chip, and is assigned to exactly one chip.
        assert all(any(inside(scaled[[b]], chip)[0] for chip in scale.pos_chips) for b in valid)
        assert len(scale.pos_assigned) == len(scale.pos_chips)
        assert assigned_indices(scale) == valid.tolist()
        # ... to a chip containing it (the best possible overlap).
        for chip, members in zip(scale.pos_chips, scale.pos_assigned):
            assert inside(scaled[members], chip).all()
        height, width = scale.image_size
        assert (scale.pos_chips[:, 2] <= width - 1).all() and (scale.pos_chips[:, 3] <= height - 1).all()
    # At the coarsest scale the image (512 x 384) fits in one chip: that chip is the whole image.
    np.testing.assert_array_equal(chips.scales[2].pos_chips, [[0, 0, 511, 383]])


def test_assignment_picks_the_chip_overlapping_most():
    cfg = mining_params(**{"TRAIN.SCALES": [1.0], "TRAIN.VALID_RANGES": [[-1, -1]], "TRAIN.NEG_CHIP_MIN_PROPOSALS": [1]})
    # Coarsest (only) scale, image 1200 x 500: no fit constraint. The 600 px box fits in no chip; it goes to
    # the chip holding most of it.
    boxes = [box_of(10, 10, 50, 50), box_of(1100, 10, 50, 50), box_of(300, 100, 600, 50)]
    chips = mine_image_chips(entry_with(boxes, width=1200, height=500), cfg, 32, np.random.default_rng(0))
    scale = chips.scales[0]
    assert len(scale.pos_chips) == 2
    big = np.float32(boxes[2])
    overlaps = [max(0, min(big[2], c[2]) - max(big[0], c[0]) + 1) for c in scale.pos_chips]
    owner = int(np.argmax(overlaps))
    assert 2 in scale.pos_assigned[owner].tolist() and 2 not in scale.pos_assigned[1 - owner].tolist()


def test_coarsest_scale_has_no_chip_without_valid_boxes():
    chips = mine_image_chips(entry_with([box_of(100, 100, 10, 10)]), mining_params(), 56, np.random.default_rng(0))
    assert len(chips.scales[0].pos_chips) == 1
    assert len(chips.scales[1].pos_chips) == 0 and len(chips.scales[2].pos_chips) == 0
    assert chips.scales[1].pos_assigned == [] and chips.scales[2].neg_chips.shape == (0, 4)


def test_boxes_at_the_image_edge_are_covered_despite_rounding():
    # 427 px wide at 1.2x: round(512.4) = 512 px, but the last column 426 lands at 511.2, past the edge.
    cfg = mining_params(**{"TRAIN.SCALES": [1.2, 1.667, 512], "TRAIN.VALID_RANGES": [[-1, -1]] * 3})
    boxes = [[380, 200, 426, 250]]
    chips = mine_image_chips(entry_with(boxes, width=427, height=320), cfg, 32, np.random.default_rng(0))
    for scale in chips.scales:
        assert scale.valid.any()
        assert assigned_indices(scale) == np.flatnonzero(scale.valid).tolist()


def test_negative_chip_kept_only_above_the_threshold():
    rng = np.random.default_rng(3)
    gt = [box_of(600, 440, 30, 30)]  # bottom-right corner; sqrt 30: finest scale only
    many = cluster(rng, 10, 10, 30)  # 30 > 25 proposals, far from the gt
    few = cluster(rng, 10, 10, 25)  # not more than 25
    cfg = mining_params()
    kept = mine_image_chips(entry_with(gt, many), cfg, 56, np.random.default_rng(0)).scales[0]
    assert len(kept.neg_chips) == 1 and kept.neg_counts.tolist() == [30]
    assert inside(many * np.float32(3.0), kept.neg_chips[0]).all()
    dropped = mine_image_chips(entry_with(gt, few), cfg, 56, np.random.default_rng(0)).scales[0]
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
    too_big = cluster(rng, 400, 300, 40, spread=20, size=100)  # sqrt 100 > 80 at the finest scale
    chips = mine_image_chips(entry_with(gt, np.concatenate([near_gt, too_big])), mining_params(**{"TRAIN.CHIP_STRIDE": 32}),
                             32, np.random.default_rng(0))
    assert chips.scales[0].neg_chips.shape == (0, 4)


def test_negative_counts_at_the_middle_scale_use_its_threshold():
    rng = np.random.default_rng(5)
    gt = [box_of(5, 5, 10, 10)]  # finest scale only, so the middle scale has no positive chip
    props = cluster(rng, 300, 200, 11, spread=100, size=50)  # sqrt 50: middle range; 11 > 10
    scale = mine_image_chips(entry_with(gt, props), mining_params(), 56, np.random.default_rng(0)).scales[1]
    assert scale.neg_counts.tolist() == [11]
    assert inside(scaled_boxes(props, scale), scale.neg_chips[0]).sum() == 11
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


def fake_chips(num_pos, num_neg):
    def scale(pos, neg):
        return ScaleChips(im_scale=1.0, image_size=(600, 600), valid=np.zeros(0, bool),
                          pos_chips=np.arange(pos * 4, dtype=np.float32).reshape(-1, 4),
                          pos_assigned=[np.zeros(0, np.int64)] * pos,
                          neg_chips=1000 + np.arange(neg * 4, dtype=np.float32).reshape(-1, 4),
                          neg_counts=np.full(neg, 30))
    return ImageChips(scales=[scale(num_pos[i], num_neg[i]) for i in range(len(num_pos))])


def test_sample_epoch_chips_takes_all_positives_and_at_most_max_neg():
    chips = fake_chips([2, 1, 1], [3, 2, 0])
    sampled = sample_epoch_chips(chips, np.random.default_rng(0), 2)
    assert [level for level, _, _, _ in sampled[:4]] == [0, 0, 1, 2]
    assert [negative for _, _, negative, _ in sampled] == [False] * 4 + [True] * 2
    negatives = sampled[4:]
    assert len(negatives) == 2
    pool = {(level, tuple(c)) for level, s in enumerate(chips.scales) for c in s.neg_chips}
    drawn = {(level, tuple(c)) for level, c, _, _ in negatives}
    assert len(drawn) == 2 and drawn <= pool
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
