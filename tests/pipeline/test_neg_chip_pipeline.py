"""Negative chip mining end to end (lib/pipeline/neg_chips.py; its command line through
scripts/train_neg_props_and_sniper.sh): RPN-only training, proposal extraction with that checkpoint,
SNIPER training on positive and negative chips, evaluation, resumable stages; and the loader's count of
negative chips."""
import logging
import os
import subprocess

import numpy as np
import pytest

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.data.epoch_plan import EpochPlan, mine_images
from lib.dataset.proposals import read_proposals
from lib.inference.detector import Detector
from lib.run.checkpoint import load_params
from lib.dataset.base import numbered_classes
from chip_generator.mining import MiningParams
from lib.pipeline.neg_chips import NegChipPipeline
from symbols import inference_symbol

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
WRAPPER = os.path.join(ROOT, "scripts", "train_neg_props_and_sniper.sh")


# -- the loader's negative chip flags ------------------------------------------------------------------
def test_mined_chips_are_flagged_negative_exactly_for_the_background_chips():
    rng = np.random.default_rng(3)
    gt = np.array([[600, 440, 629, 469]], np.float32)  # bottom-right corner, finest scale only
    x1, y1 = 10 + rng.uniform(0, 60, 30), 10 + rng.uniform(0, 60, 30)
    proposals = np.stack([x1, y1, x1 + 19, y1 + 19], axis=1).astype(np.float32)  # 30 > 25 in the top-left
    entry = {"id": 1, "image": "img.jpg", "width": 640, "height": 480, "flipped": False, "boxes": gt,
             "gt_classes": np.ones(1, np.int32), "proposals": proposals}
    params = MiningParams.from_config(load_config(None, [("TRAIN.CHIP_STRIDE", "56")]))
    table = mine_images([entry], params, 56, seed=0, epoch=0, indices=[0])
    # the reference's pools: the finest scale, and the intermediate one, whose pool has no lower size
    # bound (the gt and the proposals, sqrt 20 < 32, there on no positive chip: 31 > 10)
    assert table.negative.dtype == bool and table.negative.sum() == 2
    negatives = table.boxes[table.negative]
    assert sorted(table.scale_index[table.negative].tolist()) == [0, 1]
    for chip, level in zip(negatives, table.scale_index[table.negative]):
        scaled = proposals * np.float32((3.0, 1.667)[level])
        assert ((scaled[:, :2] >= chip[:2]) & (scaled[:, 2:] <= chip[2:])).all()
    positives = table.boxes[~table.negative]
    assert len(positives) >= 1 and any(((gt[0, :2] * 3 >= p[:2]) & (gt[0, 2:] * 3 <= p[2:])).all() for p in positives)
    without = MiningParams.from_config(load_config(None, [("TRAIN.USE_NEG_CHIPS", "false")]))
    assert not mine_images([entry], without, 56, 0, 0, [0]).negative.any()

    plan = EpochPlan(table, 56, batch_size=2, seed=0, epoch=0, shuffle=True)
    assert plan.num_negative == 2
    flagged = sorted(plan.chip(i).box for i in range(plan.num_chips) if plan.chip(i).negative)
    assert flagged == sorted(tuple(float(v) for v in chip) for chip in negatives)


# -- the pipeline ----------------------------------------------------------------------------------------
def overrides(tmp_path):
    return [("dataset.dataset_path", str(tmp_path / "data")), ("dataset.root_path", str(tmp_path)),
            ("dataset.synthetic_train", "2"), ("dataset.synthetic_val", "1"), ("output_path", str(tmp_path / "out")),
            ("TRAIN.FLIP", "false"), ("TRAIN.end_epoch", "1"), ("TRAIN.lr_step", ""), ("TRAIN.BATCH_IMAGES", "2"),
            ("TRAIN.NUM_PROCESS", "0"), ("TRAIN.warmup_step", "5"), ("gpus", "cpu:1")]


def loader_stats(records):
    """The LoaderStats the trainer logs after each epoch, in order (each stage here trains one epoch)."""
    return [r.args[0] for r in records if r.name == "lib.train.trainer" and r.msg.startswith("data loader")]


def stage_messages(records):
    return [r.getMessage() for r in records if r.name == "lib.pipeline.neg_chips"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(pipeline, outputs, log records) of one run of every stage on two synthetic images."""
    tmp_path = tmp_path_factory.mktemp("neg_chips")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        pipeline = NegChipPipeline(TINY, overrides(tmp_path), rpn_epochs=1)
        outputs = pipeline.run(evaluate=True)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    return tmp_path, pipeline, outputs, records


def test_stage_configs_keep_the_rpn_apart_and_feed_its_proposals_to_sniper(finished):
    _, pipeline, outputs, _ = finished
    rpn, sniper = pipeline.rpn_cfg, pipeline.sniper_cfg
    assert rpn.TRAIN.ONLY_PROPOSAL and not rpn.TRAIN.USE_NEG_CHIPS and rpn.TRAIN.end_epoch == 1
    assert rpn.TRAIN.model_prefix != sniper.TRAIN.model_prefix
    assert pipeline.extract_cfg.TEST.EXTRACT_PROPOSALS and pipeline.extract_cfg.TEST.MODEL == outputs["rpn"]
    assert not sniper.TRAIN.ONLY_PROPOSAL and sniper.TRAIN.USE_NEG_CHIPS
    assert sniper.dataset.proposal == outputs["proposals"]
    assert pipeline.eval_cfg.TEST.MODEL == outputs["sniper"]
    assert os.path.basename(outputs["rpn"]) == "SNIPER_rpn-0001.params"
    assert os.path.basename(outputs["sniper"]) == "SNIPER-0001.params"


def test_rpn_checkpoint_loads_into_the_proposal_graph_only(finished):
    _, pipeline, outputs, _ = finished
    cfg = pipeline.extract_cfg
    num_classes = 6  # five shapes + background, as the tester derives it
    args, aux = load_params(outputs["rpn"])
    symbol = inference_symbol(cfg, None, rpn_only=True)
    shapes = {"data": (1, 3, 64, 64), "im_info": (1, 3), "im_ids": (1,), "chip_ids": (1,)}
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    needed = {**dict(zip(symbol.list_arguments(), arg_shapes)), **dict(zip(symbol.list_auxiliary_states(), aux_shapes))}
    given = {**args, **aux}
    for name, shape in needed.items():
        if name not in shapes:
            assert name in given and given[name].shape == shape, name
    Detector.from_config(cfg, outputs["rpn"], None, rpn_only=True)
    with pytest.raises(ValueError, match="lacks"):  # no R-CNN head in an RPN-only checkpoint
        Detector.from_config(cfg, outputs["rpn"], numbered_classes(num_classes))


def test_proposals_cover_the_training_images(finished):
    tmp_path, pipeline, outputs, _ = finished
    proposals = read_proposals(outputs["proposals"])
    assert sorted(proposals) == [1, 2]  # the synthetic training image ids
    for boxes in proposals.values():
        assert boxes.dtype == np.float32 and boxes.ndim == 2 and boxes.shape[1] == 5 and len(boxes) > 25
        assert (boxes[:, 2] >= boxes[:, 0]).all() and (boxes[:, 3] >= boxes[:, 1]).all()
    assert os.path.dirname(outputs["proposals"]).startswith(str(tmp_path / "out"))


def test_sniper_trained_on_negative_chips_and_was_evaluated(finished):
    _, _, outputs, records = finished
    rpn_stats, sniper_stats = loader_stats(records)
    assert rpn_stats.chips > 0 and rpn_stats.negative_chips == 0
    assert 0 < sniper_stats.negative_chips < sniper_stats.chips
    # at most MAX_NEG_CHIPS (2) per image and epoch: 2 images, and at most one wrapped padding chip
    assert sniper_stats.negative_chips <= 2 * 2 + 1
    assert os.path.isfile(outputs["sniper"])
    summary = outputs["summary"]
    assert summary["checkpoint"] == outputs["sniper"] and summary["tested"] == 1
    assert {"AP", "APs", "APm", "APl"} <= set(summary["stats"])


@pytest.mark.slow
def test_a_second_run_skips_done_stages_and_redoes_a_missing_one(finished, caplog):
    tmp_path, pipeline, outputs, _ = finished
    done = {stage: os.path.getmtime(outputs[stage]) for stage in ("rpn", "proposals", "sniper", "eval")}
    argv = ["--cfg", TINY, "--rpn-epochs", "1", "--eval", "--set"] + [w for pair in overrides(tmp_path) for w in pair]
    result = subprocess.run([WRAPPER] + argv, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for stage in done:
        assert f"stage {stage}: skipped" in result.stderr
        assert os.path.getmtime(outputs[stage]) == done[stage]

    os.remove(outputs["proposals"])
    caplog.set_level(logging.INFO)
    again = NegChipPipeline(TINY, overrides(tmp_path), rpn_epochs=1).run()
    assert again["proposals"] == outputs["proposals"] and os.path.isfile(outputs["proposals"])
    messages = stage_messages(caplog.records)
    assert any(m.startswith("stage rpn: skipped") for m in messages)
    assert any(m.startswith("stage proposals: done") for m in messages)
    # the SNIPER checkpoint predates the new proposals: kept, with a warning
    assert any(m.startswith("stage sniper: skipped") for m in messages)
    assert any("older than its input" in m and "stage sniper" in m for m in messages)
    assert os.path.getmtime(outputs["sniper"]) == done["sniper"]


def test_the_start_checks_pass_a_fresh_run_whose_proposals_are_not_made_yet_and_check_every_stage(tmp_path):
    from lib.config import ConfigError
    from lib.errors import MachineError

    fresh = NegChipPipeline(TINY, overrides(tmp_path) + [("dataset.NUM_CLASSES", "6")], rpn_epochs=1)
    assert fresh.sniper_cfg.dataset.proposal and not os.path.exists(fresh.sniper_cfg.dataset.proposal)
    fresh.check_start()
    assert os.listdir(tmp_path) == []  # nothing written, the synthetic set not generated
    with pytest.raises(MachineError, match="cannot run gpus '0'"):  # the SNIPER stage's devices
        NegChipPipeline(TINY, overrides(tmp_path) + [("gpus", "0")], rpn_overrides=[("gpus", "cpu:1")]).check_start()
    with pytest.raises(ConfigError, match="NUM_CLASSES is 7"):  # the SNIPER stage's class count
        NegChipPipeline(TINY, overrides(tmp_path) + [("dataset.NUM_CLASSES", "7")],
                        rpn_overrides=[("dataset.NUM_CLASSES", "0")]).check_start()


def test_bad_rpn_epochs_is_a_clear_error():
    with pytest.raises(ValueError, match="rpn_epochs"):
        NegChipPipeline(TINY, [], rpn_epochs=0)


def test_rpn_stage_keeps_the_main_lr_steps_within_its_epochs_as_the_reference():
    # the reference's RPN stage runs the main config for 2 epochs: its 5.33-epoch step never comes
    pipeline = NegChipPipeline(TINY, [("TRAIN.end_epoch", "7"), ("TRAIN.lr_step", "5.33")], rpn_epochs=2)
    assert (pipeline.rpn_cfg.TRAIN.lr_step, pipeline.sniper_cfg.TRAIN.lr_step) == ("", "5.33")
    assert pipeline.rpn_cfg.TRAIN.end_epoch == 2
    early = NegChipPipeline(TINY, [("TRAIN.end_epoch", "7"), ("TRAIN.lr_step", "1.5,5.33")], rpn_epochs=2)
    assert early.rpn_cfg.TRAIN.lr_step == "1.5"
    explicit = NegChipPipeline(TINY, [("TRAIN.end_epoch", "8")], rpn_epochs=2,
                               rpn_overrides=[("TRAIN.lr_step", "0.5")])
    assert explicit.rpn_cfg.TRAIN.lr_step == "0.5"
