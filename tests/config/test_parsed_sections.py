"""The sections parsed once at load (lib.config.parsed) and handed on: the stages take them, never parse again."""
import copy
import pickle

import numpy as np
import pytest

from chip_generator.mining import MiningParams
from lib.config import ConfigError, load_config, parsed, with_overrides
from lib.config.core import plain, restore
from lib.data.chip_worker import ChipWorker
from lib.pixel_budget import epoch_pixel_budget
from lib.scales import ScaleLevel, ScaleSpec


def test_the_parsed_sections_are_the_sections_parsers_values():
    cfg = load_config(None, [("TRAIN.SCALES", "[2.0, [800, 1333]]"), ("TRAIN.VALID_RANGES", "[[-1, 80], [32, -1]]"),
                             ("TRAIN.NEG_CHIP_MIN_PROPOSALS", "[0, 0]"), ("TEST.SCALES", "[[480, 512]]"),
                             ("TEST.VALID_RANGES", "[[-1, -1]]"), ("TEST.BATCH_IMAGES", "1")])
    sections = parsed(cfg)
    assert sections.mining.levels == (ScaleLevel(ScaleSpec(factor=2.0), (-1.0, 80.0)),
                                      ScaleLevel(ScaleSpec(short=800, long=1333), (32.0, -1.0)))
    assert sections.test_levels == (ScaleLevel(ScaleSpec(short=480, long=512), (-1.0, -1.0)),)
    assert sections.test_batch_images == (1,)
    assert sections.lr_step_epochs == (5.33,)  # the default TRAIN.lr_step
    assert sections.mining == MiningParams.from_config(cfg)


def test_the_parsed_sections_travel_with_the_config_and_a_variant_is_parsed_anew():
    cfg = load_config(None)
    assert parsed(pickle.loads(pickle.dumps(cfg))) == parsed(cfg)
    assert parsed(copy.deepcopy(cfg)) == parsed(cfg)
    variant = with_overrides(cfg, {"TRAIN.CHIP_STRIDE": 48})
    assert (parsed(variant).mining.chip_stride, parsed(cfg).mining.chip_stride) == ((48,), (56, 60))


def test_a_restored_config_holds_no_parsed_sections():
    with pytest.raises(ConfigError, match="restored from saved values"):
        parsed(restore(plain(load_config(None))))


def test_the_chip_worker_and_the_pixel_budget_take_the_training_pyramid_parsed_at_load(monkeypatch):
    cfg = load_config(None, [("TRAIN.USE_NEG_CHIPS", "false")])

    def parse_again(_):
        raise AssertionError("the training section was parsed again")

    monkeypatch.setattr(MiningParams, "from_config", classmethod(parse_again))
    assert ChipWorker([], cfg, None, rpn_only=False).mining is parsed(cfg).mining
    entry = {"boxes": np.array([[10, 10, 60, 60]], np.float32), "width": 200, "height": 150}
    totals = epoch_pixel_budget([entry], cfg, np.random.default_rng(0))
    assert totals["images"] == 1 and totals["positive"].sum() >= 1


def test_the_test_planner_takes_the_test_pyramid_parsed_at_load_and_parses_a_restored_one(monkeypatch):
    from lib.inference import batching

    cfg = load_config(None, [("TEST.SCALES", "[[480, 512], [64, 96]]"), ("TEST.VALID_RANGES", "[[-1, 80], [32, -1]]"),
                             ("TEST.BATCH_IMAGES", "[3, 1]")])
    restored = restore(plain(cfg))
    planner = batching.BatchPlanner(restored, devices=2)  # an export's config: parsed here, once
    assert planner.levels == parsed(cfg).test_levels and planner.batch_counts(planner.levels) == [6, 2]

    def parse_again(*_):
        raise AssertionError("the test section was parsed again")

    monkeypatch.setattr("lib.scales.pyramid", parse_again)
    monkeypatch.setattr("lib.config.validation.images_per_device", parse_again)
    planner = batching.BatchPlanner(cfg, devices=1)
    assert planner.levels is parsed(cfg).test_levels and planner.batch_counts(planner.levels[::-1]) == [1, 3]
