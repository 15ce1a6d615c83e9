"""Checkpoint housekeeping a user sees: a missing checkpoint lists the epochs that exist, and
TRAIN.KEEP_CHECKPOINTS keeps the newest N epochs (plus TEST.TEST_EPOCH's)."""
import os

import pytest

import demo
from lib.config import load_config
from lib.run.checkpoint import load_params, params_path, progress_path, prune_checkpoints, states_path


def make_epochs(prefix, epochs):
    for epoch in epochs:
        for path in (params_path(prefix, epoch), states_path(prefix, epoch), progress_path(prefix, epoch)):
            open(path, "w").close()


def test_a_missing_checkpoint_lists_the_epochs_that_exist_and_suggests_model(tmp_path):
    prefix = str(tmp_path / "SNIPER")
    make_epochs(prefix, [1, 2, 3])
    with pytest.raises(FileNotFoundError) as info:
        load_params(params_path(prefix, 4))
    assert str(info.value) == (f"checkpoint not found: {prefix}-0004.params; the run has epochs 1, 2, 3: "
                               f"--set TEST.TEST_EPOCH 3, or --model {tmp_path} (its newest checkpoint)")
    with pytest.raises(FileNotFoundError, match="no checkpoint of that run exists"):
        load_params(str(tmp_path / "other-0001.params"))


def test_keep_checkpoints_keeps_the_newest_epochs_and_the_tested_one(tmp_path):
    prefix = str(tmp_path / "SNIPER")
    make_epochs(prefix, range(1, 7))
    open(f"{prefix}-symbol.json", "w").close()
    assert prune_checkpoints(prefix, keep=2, also=(3,)) == [1, 2, 4]
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(["SNIPER-symbol.json"] + [f"SNIPER-{e:04d}.{s}" for e in (3, 5, 6)
                                                    for s in ("params", "states", "progress.json")])
    assert prune_checkpoints(prefix, keep=0) == [] and len(os.listdir(tmp_path)) == len(left)


def test_keep_checkpoints_is_a_checked_key():
    assert load_config(None).TRAIN.KEEP_CHECKPOINTS == 0
    with pytest.raises(ValueError, match="TRAIN.KEEP_CHECKPOINTS = -1: must be >= 0"):
        load_config(None, {"TRAIN.KEEP_CHECKPOINTS": -1})


def test_the_demo_draws_into_the_run_folder_never_beside_the_image(tmp_path):
    cfg = load_config(None, {"output_path": str(tmp_path / "out")})
    out = demo.default_out(cfg, "/data/coco/images/val2017/000000000139.jpg")
    assert out == str(tmp_path / "out" / "default" / "demo" / "000000000139_detections.png")
