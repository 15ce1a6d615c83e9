"""Own data: images without objects (TRAIN.EMPTY_IMAGES), evaluation while training, dense-scene
evaluation, Pascal VOC-format sets with any classes."""
import json
import logging
import os

import cv2
import numpy as np
import pytest

from chip_generator.mining import MiningParams, mine_image_chips, sample_epoch_chips
from lib.config import load_config
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import BatchRing
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import ChipRef
from lib.dataset import load_roidb
from lib.dataset.proposals import write_proposals
from lib.run_folder import find_checkpoint
from lib.train import checkpoint
from lib.train.checkpoint import output_dir
from lib.train.evaluation import EvaluationError, TrainingEvaluation, metric_value
from lib.train.progress import RunProgress
from lib.train.trainer import train

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "faster",
                    "sniper_synthetic_tiny.yml")
from test_dataset import ann, by_id, dataset_cfg, image_record, write_coco


# ---------------------------------------------------------------- images without objects
def empty_image_set(tmp_path):
    """Image 1 with a box, image 2 without any: and a proposal file covering both."""
    write_coco(str(tmp_path / "data"), "train", [image_record(1, 200, 160), image_record(2, 200, 160)],
               [ann(1, 1, [10, 20, 30, 40])])
    proposals = {image_id: np.array([[x, y, x + 19, y + 19, 0.5] for x in range(0, 180, 30) for y in range(0, 140, 30)],
                                    np.float32) for image_id in (1, 2)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    return str(path)


def test_empty_images_dropped_by_default_kept_for_negative_chips(tmp_path, caplog):
    proposals = empty_image_set(tmp_path)
    on = {"dataset.proposal": proposals, "TRAIN.USE_NEG_CHIPS": "true", "dataset.PROPOSAL_NMS": "0"}
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **on), "train")
    assert "dropped 1 of 2 training images without usable boxes" in caplog.text
    assert sorted(by_id(roidb)) == [1]

    roidb, _ = load_roidb(dataset_cfg(tmp_path, **on, **{"TRAIN.EMPTY_IMAGES": "negative"}), "train")
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False), (2, False), (1, True), (2, True)]
    empty = by_id(roidb)[2]
    assert empty["boxes"].shape == (0, 4) and empty["gt_classes"].shape == (0,)
    assert empty["proposals"].shape == (30, 4)  # 6 columns x 5 rows


def test_empty_images_still_dropped_without_negative_chips(tmp_path, caplog):
    proposals = empty_image_set(tmp_path)
    for off in ({"TRAIN.USE_NEG_CHIPS": "false", "dataset.proposal": proposals}, {"dataset.proposal": ""}):
        with caplog.at_level(logging.INFO):
            roidb, _ = load_roidb(dataset_cfg(tmp_path, **off, **{"TRAIN.EMPTY_IMAGES": "negative"}), "train")
        assert sorted(by_id(roidb)) == [1]
        assert "negative chips are off" in caplog.text


def test_an_empty_image_gives_negative_chips_only_whose_targets_are_background(tmp_path):
    # 30 proposals of 20 px (valid at the finest scale, [-1, 80]) tile a 200 x 160 image; at scale 3 the
    # image is 600 x 480 px, so a few 512 px negative chips cover them, each counting more than 5.
    cfg = load_config(None, [("TRAIN.NEG_CHIP_MIN_PROPOSALS", "[5, 5, 5]"), ("TRAIN.RPN_BATCH_SIZE", "256")])
    params = MiningParams.from_config(cfg)
    proposals = np.array([[x, y, x + 19, y + 19] for x in range(0, 180, 30) for y in range(0, 140, 30)], np.float32)
    entry = {"id": 2, "image": str(tmp_path / "empty.jpg"), "height": 160, "width": 200, "flipped": False,
             "boxes": np.zeros((0, 4), np.float32), "gt_classes": np.zeros(0, np.int32), "proposals": proposals}
    chips = mine_image_chips(entry, params, 56, np.random.default_rng(0))
    assert all(len(scale.pos_chips) == 0 for scale in chips.scales)
    assert len(chips.scales[0].neg_chips) >= 1
    sampled = sample_epoch_chips(chips, np.random.default_rng(0), params.max_neg_chips)
    assert sampled and all(negative and len(valid) == 0 for _, _, negative, valid in sampled)

    cv2.imwrite(entry["image"], np.full((160, 200, 3), 128, np.uint8))
    targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
    ring = BatchRing(batch_fields(cfg, targeter, rpn_only=False), batch_size=1, num_slots=1, shared=False)
    worker = ChipWorker([entry], cfg, ring, rpn_only=False)
    level, box, _, valid = sampled[0]
    ref = ChipRef(0, level, chips.scales[level].im_scale, tuple(float(v) for v in box), tuple(valid), True)
    assert worker.make_chip(0, 0, "test", ref, 0)[0] == "chip"
    arrays = {name: array[0] for name, array in ring.slot(0).items()}
    assert not (arrays["label"] == 1).any() and (arrays["label"] == 0).sum() == 256  # background only
    assert (arrays["gt_boxes"] == -1).all() and not arrays["bbox_weight"].any()  # -1: padding rows


# ---------------------------------------------------------------- evaluation while training
def eval_cfg(tmp_path, **overrides):
    keys = {"output_path": str(tmp_path), "TRAIN.end_epoch": "6", "TRAIN.EVAL_EVERY": "2", **overrides}
    return load_config(None, list(keys.items()))


class FakeTester:
    """The tester's signature, returning the next AP of a fixed sequence (and recording its calls)."""

    def __init__(self, aps):
        self.aps, self.calls = list(aps), []

    def __call__(self, cfg, checkpoint, out_dir, max_images):
        self.calls.append((os.path.basename(checkpoint), os.path.relpath(out_dir, output_dir(cfg)), max_images))
        ap = self.aps.pop(0)
        return {"tested": max_images, "stats": {"AP": ap, "AP50": 2 * ap, "APs": 0.5 * ap}}


def fake_params(cfg, epoch):
    path = checkpoint.params_path(checkpoint.checkpoint_prefix(cfg), epoch)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return path


def test_evaluation_every_n_epochs_names_the_best_and_logs_it(tmp_path):
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_IMAGES": "7", "TRAIN.end_epoch": "5"})
    tester = FakeTester([0.2, 0.4, 0.3])
    evaluation = TrainingEvaluation(cfg, 0, test=tester)
    progress = RunProgress(os.path.join(output_dir(cfg), "metrics.jsonl"), 0, 5, 0)
    for epoch in range(1, 6):
        progress.start_epoch(epoch - 1, 10)
        progress.end_epoch_updates(10)
        assert evaluation.after_epoch(epoch, fake_params(cfg, epoch), progress) is False
    # every 2nd epoch and the last: 2, 4, 5; the same 7 images each time, into per-epoch folders
    assert tester.calls == [(f"SNIPER-{e:04d}.params", f"evaluations/epoch_{e:04d}", 7) for e in (2, 4, 5)]
    best = json.load(open(os.path.join(output_dir(cfg), "best.json")))
    assert best["metric"] == "AP" and best["best"]["epoch"] == 4 and best["best"]["params"] == "SNIPER-0004.params"
    assert [h["value"] for h in best["history"]] == [0.2, 0.4, 0.3]
    records = [json.loads(line) for line in open(os.path.join(output_dir(cfg), "metrics.jsonl"))]
    assert [(r["epoch"], r["iteration"], r["eval"]["AP50"]) for r in records] == [(2, 20, 0.4), (4, 40, 0.8),
                                                                                 (5, 50, 0.6)]
    # --model RUN_FOLDER takes the best epoch, not the newest
    open(os.path.join(output_dir(cfg), "config.yaml"), "w").write("TRAIN:\n  model_prefix: SNIPER\n")
    assert find_checkpoint(output_dir(cfg))[0] == os.path.join(output_dir(cfg), "SNIPER-0004.params")


def test_early_stop_after_n_evaluations_without_improvement_by_the_chosen_metric(tmp_path):
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1", "TRAIN.EARLY_STOP": "2", "TRAIN.EVAL_METRIC": "APs"})
    evaluation = TrainingEvaluation(cfg, 0, test=FakeTester([0.2, 0.5, 0.5, 0.4, 0.9]))
    stops = [evaluation.after_epoch(epoch, fake_params(cfg, epoch)) for epoch in range(1, 5)]
    # APs 0.1, 0.25, 0.25 (a tie is no improvement: the earliest stays best), 0.2 -> stop after epoch 4
    assert stops == [False, False, False, True]
    assert evaluation.best()["epoch"] == 2


def test_a_resumed_run_keeps_the_history_of_the_epochs_it_keeps(tmp_path):
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1", "TRAIN.EARLY_STOP": "2"})
    first = TrainingEvaluation(cfg, 0, test=FakeTester([0.3, 0.2, 0.1]))
    for epoch in (1, 2, 3):
        first.after_epoch(epoch, fake_params(cfg, epoch))
    # resumed from epoch 2: epoch 3's evaluation is dropped; one more without improvement stops
    resumed = TrainingEvaluation(cfg, 2, test=FakeTester([0.25]))
    assert [h["epoch"] for h in resumed.history] == [1, 2]
    assert resumed.after_epoch(3, fake_params(cfg, 3)) is True


def test_evaluation_keys_are_checked_before_training(tmp_path):
    with pytest.raises(EvaluationError, match="TRAIN.EVAL_METRIC"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_METRIC": "mean"}), 0, test=FakeTester([]))
    with pytest.raises(EvaluationError, match="EARLY_STOP needs"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "0", "TRAIN.EARLY_STOP": "1"}), 0,
                           test=FakeTester([]))
    with pytest.raises(EvaluationError, match="several workers"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EARLY_STOP": "1"}), 0, num_workers=2, test=FakeTester([]))
    off = TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "0"}), 0, test=FakeTester([]))
    assert not any(off.due(epoch) for epoch in range(1, 7))
    assert metric_value({"mAP": 0.7, "AP": {"cat": 0.7}}, "AP50") == 0.7  # a VOC set: its one metric


def test_training_evaluates_its_checkpoints_and_names_the_best(tmp_path):
    # the tiny config on 2 synthetic training images, evaluated on the first of 2 validation images
    overrides = {"dataset.dataset_path": str(tmp_path / "data"), "dataset.synthetic_train": "2",
                 "dataset.synthetic_val": "2", "dataset.root_path": str(tmp_path), "output_path": str(tmp_path),
                 "TRAIN.NUM_PROCESS": "0", "TEST.NUM_PROCESS": "0", "TRAIN.BATCH_IMAGES": "2",
                 "TRAIN.end_epoch": "2", "TRAIN.warmup_step": "5", "TRAIN.lr_step": "10", "gpus": "cpu:1",
                 "TRAIN.EVAL_EVERY": "1", "TRAIN.EVAL_IMAGES": "1"}
    cfg = load_config(TINY, list(overrides.items()))
    train(cfg)
    run = output_dir(cfg)
    for epoch in (1, 2):
        summary = json.load(open(os.path.join(run, "evaluations", f"epoch_{epoch:04d}", "test_summary.json")))
        assert summary["images"] == 1 and summary["checkpoint"].endswith(f"SNIPER-{epoch:04d}.params")
    best = json.load(open(os.path.join(run, "best.json")))
    assert [h["epoch"] for h in best["history"]] == [1, 2]
    assert best["best"] == max(best["history"], key=lambda h: (h["value"], -h["epoch"]))
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["epoch"] for r in records if "eval" in r] == [1, 2]
