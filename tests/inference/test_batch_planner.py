"""The BatchPlanner (lib.inference.batching): images per forward pass per level, the plan and the forward
shapes of a network on several devices, fixed once from ``TEST`` and the device count."""
from lib.config import load_config
from lib.inference.batching import BatchPlanner, plan
from lib.scales import ScaleLevel, ScaleSpec


def tiny(**test):
    return load_config(None, {"symbol": "resnet_tiny", **{f"TEST.{key}": value for key, value in test.items()}})


def test_batch_counts_are_the_per_device_count_of_the_same_scale_times_the_devices():
    cfg = tiny(SCALES=[2.0, 1.0, 512.0], VALID_RANGES=[[-1, 80], [32, 160], [64, -1]], BATCH_IMAGES=[2, 3, 4])
    planner = BatchPlanner(cfg, devices=2)
    finest, middle, coarsest = planner.levels
    assert planner.batch_counts(planner.levels) == [4, 6, 8]
    assert planner.batch_counts([coarsest, finest]) == [8, 4]  # by scale, whatever the order asked
    # a level outside the pyramid (a tool's single scale) takes 1 image per device
    assert planner.batch_counts([ScaleLevel(ScaleSpec(factor=3.0), (-1, -1))]) == [2]
    assert BatchPlanner(tiny(BATCH_IMAGES=3), devices=1).batch_counts(BatchPlanner(tiny(), 1).levels) == [3] * 3


def test_the_plan_is_the_batching_plan_of_its_settings_and_every_device_gets_images():
    cfg = tiny(SCALES=[1.0, 0.5], VALID_RANGES=[[-1, -1], [-1, -1]], BATCH_IMAGES=[1, 2], BATCH_PARTS=1)
    planner = BatchPlanner(cfg, devices=2)
    sizes = [(60, 80), (90, 50), (40, 40)]
    batches = planner.plan(sizes)
    assert batches == plan(sizes, planner.levels, [2, 4], 1, cfg.network.IMAGE_STRIDE)
    assert planner.plan(sizes, planner.levels[1:]) == plan(sizes, planner.levels[1:], [4], 1,
                                                             cfg.network.IMAGE_STRIDE)
    for batch in batches:  # one image on 2 devices: a forward of 2 (the second a padding slot)
        count = len(batch.images)
        assert planner.forward_shape(batch) == (count + count % 2,) + tuple(batch.canvas)
    assert {len(b.images) for b in batches} >= {1, 2}

