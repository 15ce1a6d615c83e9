"""lib/scales_fit.py on size distributions whose pyramid is worked out by hand.

Default config: stride 16, smallest anchor scale 2 -> 32 px anchors, so the well-sized band is
low = 32 / sqrt(2) = 22.627 px at the finest scale, comfortable = CHIP_SIZE / 10 = 51.2 px at the others,
high = CHIP_SIZE / 2 = 256 px (chip pixels, sqrt area). Boxes are
squares of side ``a`` in inclusive pixels (sqrt area = a). Factors are rounded UP to 3 significant
digits, range ends outward to whole pixels.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.scales_fit import FitError, Pyramid, SizeBand, evaluate, fit_pyramid, fitted_config_path, \
    write_fitted_config

LOW = 32 / math.sqrt(2)


def square_entries(sides, width, height, per_image, seed=0):
    """Roidb entries holding square boxes of the given sides, ``per_image`` per image, placed at random."""
    rng = np.random.default_rng(seed)
    entries = []
    for start in range(0, len(sides), per_image):
        boxes = []
        for side in sides[start:start + per_image]:
            x1, y1 = rng.integers(0, width - side + 1), rng.integers(0, height - side + 1)
            boxes.append([x1, y1, x1 + side - 1, y1 + side - 1])
        entries.append({"id": len(entries) + 1, "image": f"/nonexistent/{len(entries)}.jpg", "width": width,
                        "height": height, "boxes": np.array(boxes, np.float32),
                        "gt_classes": np.ones(len(boxes), np.int32), "crowd_boxes": np.zeros((0, 4), np.float32),
                        "flipped": False})
    return entries


@pytest.fixture(scope="module")
def cfg():
    return load_config(None)


def test_band_from_anchors(cfg):
    band = SizeBand.from_config(cfg)
    assert band.low == pytest.approx(LOW) and band.comfortable == 51.2 and band.high == 256
    # anchor scale 0.5 -> 8 px anchors -> 5.7 px, below RPN_MIN_GT_SIZE (10): the floor wins
    assert SizeBand.from_config(cfg, (0.5, 2)) == SizeBand(low=10, comfortable=51.2, high=256)


def test_all_tiny_is_one_enlarged_scale(cfg):
    # 6 px boxes: s1 = 22.627 / 6 = 3.771 -> 3.78; its range reaches 256 / 3.78 = 67.7 px, above every box:
    # one level, open at both ends. The published 3.0 sees them at 18 px: kept 0.
    fit = fit_pyramid(square_entries([6] * 200, 640, 480, 20), cfg)
    assert fit.proposal.pyramid.scales == (3.78,)
    assert fit.proposal.pyramid.valid_ranges == ((-1, -1),)
    assert fit.proposal.kept == 1.0 and fit.meets_keep
    assert fit.current.kept == 0.0
    assert fit.proposal.chip_sizes[1] == pytest.approx(6 * 3.78)


def test_tinier_than_the_factor_cap_gets_smaller_anchors(cfg):
    # 3 px: s1 = 7.54 > max factor 4 -> 4; the needed anchor side 3 * 4 * sqrt(2) = 16.97 px = scale 1.06 ->
    # 1.0 (steps of 0.5): low becomes 16 / sqrt(2) = 11.3 <= 12 px seen.
    fit = fit_pyramid(square_entries([3] * 100, 640, 480, 20), cfg, max_factor=4)
    pyramid = fit.proposal.pyramid
    assert pyramid.scales == (4.0,) and pyramid.anchor_scales[:2] == (1.0, 2)
    assert fit.proposal.kept == 1.0


def test_all_huge_is_the_coarsest_scale_alone(cfg):
    # 300 px in 640 x 480: the whole image at 512 / 640 = 0.8 shows them at 240 px, well sized: one chip each.
    fit = fit_pyramid(square_entries([300] * 20, 640, 480, 1), cfg)
    assert fit.proposal.pyramid.scales == (512.0,)
    assert fit.proposal.pyramid.valid_ranges == ((-1, -1),)
    assert fit.proposal.chips_per_image == 1.0 and fit.proposal.kept == 1.0


def test_two_clusters_skip_the_middle_scale(cfg):
    # 10 px and 400 px in 1000 x 800: s1 = 22.627 / 10 -> 2.27 (range up to 256 / 2.27 = 112.8 -> 113);
    # the 400 px boxes are 400 * 0.512 = 205 px at the coarsest scale (>= 51.2), whose range starts at
    # 51.2 / 0.512 = 100. No middle scale.
    sides = [10, 400] * 100
    fit = fit_pyramid(square_entries(sides, 1000, 800, 10), cfg)
    assert fit.proposal.pyramid.scales == (2.27, 512.0)
    assert fit.proposal.pyramid.valid_ranges == ((-1, 113), (100, -1))
    assert fit.proposal.kept == 1.0
    assert fit.proposal.chip_pixels < fit.current.chip_pixels


def test_objects_the_coarsest_scale_shows_below_comfortable_get_a_middle_scale(cfg):
    # 10 px and 140 px in 1600 x 1200: s1 = 2.27 trains up to 113 px; the whole image in one chip
    # (512 / 1600 = 0.32) shows the 140 px boxes at 44.8 px, trainable by the anchors (>= 22.6) but below
    # comfortable: a middle factor 2.27 * 51.2 / 256 = 0.454 (range 51.2 / 0.454 = 112.8 -> 112 and up),
    # which shows them at 63.6 px, is the last level (nothing above 256 / 0.454 = 564 px). With overlap
    # 1.25 it would be 0.568, more chips for the same boxes.
    entries = square_entries([10, 140] * 60, 1600, 1200, 12)
    fit = fit_pyramid(entries, cfg)
    assert fit.proposal.pyramid.scales == (2.27, 0.454)
    assert fit.proposal.pyramid.valid_ranges == ((-1, 113), (112, -1))
    assert fit.proposal.kept == 1.0
    # the coarsest instead of the middle scale (its range from 22.627 / 0.32 = 70 px) keeps only the 10 px
    two_ends = Pyramid((2.27, 512.0), ((-1, 113), (70, -1)), tuple(cfg.network.ANCHOR_SCALES), "two ends")
    assert evaluate(entries, cfg, two_ends).kept == pytest.approx(0.5)


def test_coco_like_gives_up_the_rare_tiniest(cfg):
    # 0.5% of the boxes at 4 px, the rest log-spaced from 8 to 320 px in 640 x 480. Keeping the 4 px ones
    # would need s1 = 5.66 (or smaller anchors); giving them up (<= 1% of the 2% allowed) puts s1 near
    # 22.627 / 8 = 2.83, the 8 px boxes then at the band's low end, and the coarsest scale (0.8) shows
    # everything above 256 / s1 = 90 px at >= 72 px: two levels. (The trim-0.005 quantile interpolates the
    # last 4 px box and the first 8 px one: 7.98 px -> 2.84, which may be as cheap.)
    sides = np.round(np.geomspace(8, 320, 995)).astype(int).tolist() + [4] * 5
    order = np.random.default_rng(1).permutation(len(sides))
    fit = fit_pyramid(square_entries([sides[i] for i in order], 640, 480, 20), cfg)
    scales = fit.proposal.pyramid.scales
    assert len(scales) == 2 and scales[1] == 512.0
    assert LOW / 8.3 <= scales[0] <= LOW / 7.9
    assert 0.98 <= fit.proposal.kept <= 0.995
    assert fit.proposal.chip_pixels <= min(e.chip_pixels for e in fit.evaluations if e.kept >= 0.98)


def test_fitted_yaml_loads_and_holds_the_proposal(cfg, tmp_path):
    source = tmp_path / "mine.yml"
    source.write_text("TRAIN:\n  lr: 0.01\nTEST:\n  BATCH_IMAGES: [2, 2, 4]\n")
    fit = fit_pyramid(square_entries([10, 400] * 20, 1000, 800, 10), cfg)
    path = write_fitted_config(str(source), load_config(str(source)), fit)
    assert path == str(tmp_path / "mine_fitted.yml") == fitted_config_path(str(source))
    fitted = load_config(path)
    assert fitted.name == "mine_fitted" and fitted.TRAIN.lr == 0.01
    assert fitted.TRAIN.SCALES == fitted.TEST.SCALES == (2.27, 512.0)
    assert fitted.TRAIN.VALID_RANGES == ((-1, 113), (100, -1))
    assert fitted.TEST.BATCH_IMAGES == (2, 4) and len(fitted.TRAIN.NEG_CHIP_MIN_PROPOSALS) == 2
    assert yaml.safe_load(open(path))["TRAIN"]["lr"] == 0.01


def test_a_fitted_config_of_a_child_config_is_flat(cfg, tmp_path):
    """A config on a _BASE_ is written with its base merged in: the fitted file loads from another folder."""
    (tmp_path / "base.yml").write_text("TRAIN:\n  lr: 0.01\n  end_epoch: 9\n")
    (tmp_path / "mine.yml").write_text("_BASE_: base.yml\nTRAIN:\n  lr: 0.02\n")
    fit = fit_pyramid(square_entries([10, 400] * 20, 1000, 800, 10), cfg)
    (tmp_path / "elsewhere").mkdir()
    path = write_fitted_config(str(tmp_path / "mine.yml"), load_config(str(tmp_path / "mine.yml")), fit,
                               str(tmp_path / "elsewhere" / "mine_fitted.yml"))
    written = yaml.safe_load(open(path))
    assert "_BASE_" not in written and written["TRAIN"]["lr"] == 0.02 and written["TRAIN"]["end_epoch"] == 9
    fitted = load_config(path)
    assert (fitted.TRAIN.lr, fitted.TRAIN.end_epoch, fitted.TRAIN.SCALES) == (0.02, 9, (2.27, 512.0))


def test_no_boxes_is_an_error(cfg):
    with pytest.raises(FitError, match="no boxes"):
        fit_pyramid(square_entries([], 640, 480, 1), cfg)


def test_dense_scenes_are_scored_at_every_kept_detection(cfg, tmp_path):
    # 120 boxes in one image: EVAL_MAX_DETS follows MAX_PER_IMAGE, raised to 2 x 120 -> 300 (hundreds)
    source = tmp_path / "dense.yml"
    source.write_text("TEST:\n  MAX_PER_IMAGE: 200\n")
    fit = fit_pyramid(square_entries([30] * 120, 1000, 800, 120), cfg)
    fitted = load_config(write_fitted_config(str(source), load_config(str(source)), fit))
    assert fit.max_boxes == 120 and fitted.TEST.EVAL_MAX_DETS == 0 and fitted.TEST.MAX_PER_IMAGE == 300
    sparse = load_config(write_fitted_config(str(source), load_config(str(source)),
                                             fit_pyramid(square_entries([30] * 20, 1000, 800, 20), cfg)))
    assert sparse.TEST.EVAL_MAX_DETS == 100 and sparse.TEST.MAX_PER_IMAGE == 200


def test_boxes_no_scale_can_train_do_not_count_against_keep(cfg):
    # 10% of the boxes 1 px (x2 - x1 = 0: below the 2 px rule of the finer scales, and with no visible
    # pixel for the assignment at the coarsest), 90% 20 px: 90% is all any pyramid can train, and it is kept
    fit = fit_pyramid(square_entries([1] * 10 + [20] * 90, 640, 480, 20), cfg)
    assert fit.trainable == pytest.approx(0.9) and fit.meets_keep
    assert fit.proposal.kept == pytest.approx(0.9)


def test_the_command_line_prints_its_table_and_writes_a_loadable_fitted_config(tmp_path):
    # ten 640 x 480 images of ten 6 px boxes each: one enlarged scale, 3.78 (test_all_tiny_is_one_enlarged_scale)
    from dataset_helpers import ann, image_record, write_coco

    boxes = [ann(10 * i + k + 1, i + 1, [60 * k + 5, 40 * k + 7, 6, 6]) for i in range(10) for k in range(10)]
    write_coco(str(tmp_path / "data"), "train", [image_record(i + 1, 640, 480) for i in range(10)], boxes)
    source = tmp_path / "mine.yml"
    # issue 35: the file names the synthetic set, --set the user's COCO folder: the fitted file must train on the
    # latter, the data the fit read
    source.write_text("dataset:\n  dataset: synthetic\n  dataset_path: data/synthetic\nTRAIN:\n  lr: 0.01\n"
                      "  warmup_step: 30\n  BATCH_IMAGES: 4\ngpus: 'cpu:2'\n")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fit_scales.py"), "--cfg", str(source),
                             "--set", "dataset.dataset", "coco", f"dataset.dataset_path={tmp_path / 'data'}",
                             "--set", "dataset.root_path", str(tmp_path), "dataset.image_set", "train"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines if line.startswith("|")]
    assert rows[0][:5] == ["", "candidate", "scales", "valid ranges", "kept %"]  # the Markdown table
    current, proposal = [row for row in rows if row[1] == "current config"], [row for row in rows if row[0] == "*"]
    assert current[0][2:5] == ["[3.0, 1.667, 512.0]", "[[-1, 80], [32, 150], [120, -1]]", "0.0"]  # 6 px at 3x: 18
    assert len(proposal) == 1 and proposal[0][2:5] == ["[3.78]", "[[-1, -1]]", "100.0"]
    # the schedule in updates: chips/img x 20 entries (10 images and their flips) in batches of 4 x 2 devices;
    # 4 x warmup_step 30 = 120 updates -> ceil(120 / per epoch) epochs, the step at 5.33/7 of them
    per_image = float(proposal[0][6])
    per_epoch = math.ceil(per_image * 20 / 8)
    epochs = max(2, math.ceil(120 / per_epoch))
    assert lines[-2] == (f"schedule: about {per_image * 20:.0f} chips an epoch (20 training images, flips included) = "
                         f"{per_epoch} updates of 8 chips (x 1 accumulated); the recommended 120 updates (4 x "
                         f"TRAIN.warmup_step 30) take {epochs} epochs: --set TRAIN.end_epoch {epochs} "
                         f"TRAIN.lr_step {round(epochs * 5.33 / 7, 2):g}")
    assert lines[-1] == f"wrote {tmp_path / 'mine_fitted.yml'}"
    fitted = load_config(str(tmp_path / "mine_fitted.yml"))
    assert fitted.TRAIN.SCALES == fitted.TEST.SCALES == (3.78,) and fitted.TRAIN.VALID_RANGES == ((-1, -1),)
    assert fitted.TRAIN.lr == 0.01
    assert (fitted.dataset.dataset, fitted.dataset.dataset_path, fitted.dataset.image_set) == (
        "coco", str(tmp_path / "data"), "train")
    assert ("# Fitted with --set dataset.dataset dataset.dataset_path dataset.root_path dataset.image_set:\n# their "
            "values are written below") in open(tmp_path / "mine_fitted.yml").read()
