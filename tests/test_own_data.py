"""Own data (issue 25): images without objects, evaluation while training, dense and small-object COCO
evaluation, own Pascal VOC-format sets, a folder of images, gradient accumulation, TensorBoard, and the
variant sets BENCHMARKS.md measures on."""
import contextlib
import glob
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from chip_generator.mining import MiningParams, mine_image_chips, sample_epoch_chips
from lib.atomic import write_json
from lib.config import ConfigError, load_config, with_overrides
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import BatchRing
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import ChipRef
from lib.dataset import load_roidb
from lib.dataset.pascal_voc import HASHED_IDS, read_class_names, voc_image_id
from lib.dataset.proposals import write_proposals
from lib.dataset.variants import add_empty_images, small_object_set
from lib.evaluation.coco_summary import dense_scene_warning, max_dets_for, parse_bands
from lib.evaluation.metrics import COCO_STAT_NAMES, evaluate_coco
from lib.inference.image_folder import detect_images, image_entries, image_ids, list_images
from lib.inference.tester import results_dir
from lib.paths import shown_path
from lib.run import checkpoint
from lib.run.checkpoint import output_dir
from lib.run.folder import MODEL_KEY, best_checkpoint, find_checkpoint, model_info, write_run_config
from lib.train.accumulation import GradientAccumulation, grad_req, updates_per_epoch
from lib.train.evaluation import EvaluationError, TrainingEvaluation, final_test, metric_names, metric_value
from lib.train.optimizer import make_optimizer_params
from lib.train.progress import RunProgress
from lib.train.tensorboard import TensorBoardLog
import main_train
from dataset_helpers import ann, by_id, dataset_cfg, image_record, png_bomb, voc_xml, write_coco, write_voc
from detector_helpers import IMAGES, OracleDetector

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


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
    keys = {"output_path": str(tmp_path), "TRAIN.end_epoch": "6", "TRAIN.lr_step": "", "TRAIN.EVAL_EVERY": "2",
            **overrides}
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


class WritingTester:
    """The tester's signature, writing a results file and test_summary.json into its folder (as the tester does),
    the AP of a fixed sequence; records its calls."""

    def __init__(self, aps):
        self.aps, self.calls = list(aps), []

    def __call__(self, cfg, checkpoint, out_dir=None, max_images=0):
        out_dir = out_dir or results_dir(cfg)
        self.calls.append((os.path.basename(checkpoint), os.path.relpath(out_dir, output_dir(cfg)), max_images))
        summary = {"checkpoint": checkpoint, "tested": 3, "stats": {"AP": self.aps.pop(0)}}
        write_json([{"image_id": 1, "score": summary["stats"]["AP"]}], os.path.join(out_dir, "detections.json"))
        write_json(summary, os.path.join(out_dir, "test_summary.json"))
        return summary


@pytest.mark.parametrize("eval_images, tested_again", [("0", False), ("2", True)])
def test_eval_does_not_test_again_a_checkpoint_evaluated_on_the_whole_set(tmp_path, eval_images, tested_again):
    """``main_train.py --eval`` with TRAIN.EVAL_EVERY: the best checkpoint (epoch 2 here) was tested on the whole
    test set while training, so its results are copied into results/ rather than tested a second time; after
    evaluations on a part of the set (TRAIN.EVAL_IMAGES 2) it is tested on the whole."""
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1", "TRAIN.end_epoch": "3", "TRAIN.EVAL_IMAGES": eval_images})
    tester = WritingTester([0.2, 0.5, 0.3, 0.45])
    evaluation = TrainingEvaluation(cfg, 0, test=tester)
    for epoch in range(1, 4):
        evaluation.after_epoch(epoch, fake_params(cfg, epoch))
    best = best_checkpoint(output_dir(cfg))
    assert os.path.basename(best) == "SNIPER-0002.params" and len(tester.calls) == 3
    summary = final_test(cfg, best, test=tester)
    results = os.path.join(output_dir(cfg), "results", cfg.dataset.test_image_set)
    if tested_again:
        assert tester.calls[3] == ("SNIPER-0002.params", os.path.relpath(results, output_dir(cfg)), 0)
        assert summary["stats"]["AP"] == 0.45
    else:
        assert len(tester.calls) == 3 and summary["stats"]["AP"] == 0.5  # epoch 2's evaluation, copied
        with open(os.path.join(results, "detections.json")) as f:
            assert json.load(f) == [{"image_id": 1, "score": 0.5}]
    with open(os.path.join(results, "test_summary.json")) as f:
        assert json.load(f) == summary


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
    # a fresh start in the same folder drops the old history: best.json no longer names an old epoch
    TrainingEvaluation(cfg, 0, test=FakeTester([]))
    assert not os.path.exists(os.path.join(output_dir(cfg), "best.json"))
    open(os.path.join(output_dir(cfg), "config.yaml"), "w").write("TRAIN:\n  model_prefix: SNIPER\n")
    assert find_checkpoint(output_dir(cfg))[0].endswith("SNIPER-0003.params")  # the newest again


def undefined_aps_stats(ap):
    """A val set without small objects: APs and ARs are COCO's undefined -1 at every epoch."""
    return {"AP": ap, "AP50": 2 * ap, "APs": -1.0, "ARs": -1.0}


def test_an_undefined_metric_never_picks_the_best_epoch_nor_stops_training(tmp_path, caplog):
    # issue 35: APs -1 at every epoch, epoch 2 without detections (every defined stat 0): no best epoch, no
    # early stop, one warning naming the metrics that are defined, --model RUN_FOLDER then takes the newest
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1", "TRAIN.EARLY_STOP": "2", "TRAIN.EVAL_METRIC": "APs"})
    sequence = [undefined_aps_stats(0.3), undefined_aps_stats(0.0), undefined_aps_stats(0.2),
                undefined_aps_stats(0.1)]

    def tester(cfg, checkpoint, out_dir, max_images):
        return {"tested": 4, "stats": sequence.pop(0)}

    evaluation = TrainingEvaluation(cfg, 0, test=tester)
    with caplog.at_level(logging.WARNING, logger="lib.train.evaluation"):
        stops = [evaluation.after_epoch(epoch, fake_params(cfg, epoch)) for epoch in range(1, 5)]
    assert stops == [False] * 4 and evaluation.best() is None
    warnings = [r.getMessage() for r in caplog.records if "undefined" in r.getMessage()]
    assert len(warnings) == 1 and "TRAIN.EVAL_METRIC APs is undefined on minival2014" in warnings[0]
    assert warnings[0].endswith("defined there: AP, AP50")
    best = json.load(open(os.path.join(output_dir(cfg), "best.json")))
    assert best["best"] is None and [h["value"] for h in best["history"]] == [None] * 4
    open(os.path.join(output_dir(cfg), "config.yaml"), "w").write("TRAIN:\n  model_prefix: SNIPER\n")
    assert find_checkpoint(output_dir(cfg))[0].endswith("SNIPER-0004.params")  # the newest, not an undefined best


def test_undefined_evaluations_count_for_nothing_between_defined_ones(tmp_path):
    # NaN (VOC without ground truth) and -1 are skipped: AP 0.2, NaN, -1, 0.3 -> best epoch 4, and with
    # EARLY_STOP 2 the two undefined evaluations after epoch 1 do not stop the run
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1", "TRAIN.EARLY_STOP": "2"})
    evaluation = TrainingEvaluation(cfg, 0, test=FakeTester([0.2, float("nan"), -1.0, 0.3, 0.25, 0.1]))
    stops = [evaluation.after_epoch(epoch, fake_params(cfg, epoch)) for epoch in range(1, 7)]
    assert stops == [False] * 5 + [True] and evaluation.best()["epoch"] == 4
    # an older best.json that kept -1 as a value: read back as undefined
    path = os.path.join(output_dir(cfg), "best.json")
    old = json.load(open(path))
    old["history"] = [{"epoch": 1, "value": -1.0, "stats": {}, "params": "SNIPER-0001.params"},
                      {"epoch": 2, "value": -1.0, "stats": {}, "params": "SNIPER-0002.params"}]
    write_json(old, path)
    assert TrainingEvaluation(cfg, 2, test=FakeTester([])).best() is None


def test_a_resume_with_another_metric_scores_the_kept_history_by_it(tmp_path):
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1"})
    first = TrainingEvaluation(cfg, 0, test=FakeTester([0.4, 0.2]))
    for epoch in (1, 2):
        first.after_epoch(epoch, fake_params(cfg, epoch))
    assert first.best()["epoch"] == 1
    # its APs are half its AP: the kept epochs' values are their APs, not dropped
    resumed = TrainingEvaluation(with_overrides(cfg, {"TRAIN.EVAL_METRIC": "APs"}), 2, test=FakeTester([]))
    assert [(h["epoch"], h["value"]) for h in resumed.history] == [(1, 0.2), (2, 0.1)]


def test_a_val_set_without_annotations_is_an_undefined_metric_not_a_crash(tmp_path, caplog):
    cfg = eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "1"})
    evaluation = TrainingEvaluation(cfg, 0, test=lambda cfg, checkpoint, out_dir, max_images: {"tested": 3})
    with caplog.at_level(logging.WARNING, logger="lib.train.evaluation"):
        assert evaluation.after_epoch(1, fake_params(cfg, 1)) is False
    assert evaluation.best() is None and "defined there: none" in caplog.text


def test_an_epoch_without_detections_keeps_minus_one_where_there_is_no_ground_truth(tmp_path):
    # one 100 px object of category 1, nothing small or medium, no detections at all: COCOeval's own rule,
    # 0 where ground truth exists (AP, APl, every AR of it), -1 where none does (APs, APm, ARs, ARm);
    # per category: 0 for "one", NaN for "two" (no ground truth)
    stats = evaluate_coco(coco_gt([(10, 10, 100, 1)]), write_results(tmp_path, []), str(tmp_path))
    undefined = {"APs", "APm", "ARs", "ARm"}
    assert stats == {name: -1.0 if name in undefined else 0.0 for name in COCO_STAT_NAMES}
    per_class = json.load(open(tmp_path / "per_class_ap.json"))
    assert per_class["one"] == {"AP": 0.0, "AP50": 0.0} and np.isnan(per_class["two"]["AP"])


def test_evaluation_keys_are_checked_before_training(tmp_path):
    with pytest.raises(EvaluationError, match="TRAIN.EVAL_METRIC"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_METRIC": "mean"}), 0, test=FakeTester([]))
    with pytest.raises(EvaluationError, match="EARLY_STOP needs"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "0", "TRAIN.EARLY_STOP": "1"}), 0,
                           test=FakeTester([]))
    with pytest.raises(EvaluationError, match="several workers"):
        TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EARLY_STOP": "1"}), 0, num_workers=2, test=FakeTester([]))
    for key in ("TRAIN.EVAL_EVERY", "TRAIN.EARLY_STOP", "TRAIN.EVAL_IMAGES", "TRAIN.GRAD_ACCUM_STEPS"):
        with pytest.raises(ConfigError, match=key):
            eval_cfg(tmp_path, **{key: "-1"})
    off = TrainingEvaluation(eval_cfg(tmp_path, **{"TRAIN.EVAL_EVERY": "0"}), 0, test=FakeTester([]))
    assert not any(off.due(epoch) for epoch in range(1, 7))
    assert metric_value({"mAP": 0.7, "AP": {"cat": 0.7}}, "AP50") == 0.7  # a VOC set: its one metric


class MaskTester:
    """The tester of a mask network: the bbox stats, and the segm ones nested under "segm" (evaluate_coco)."""

    def __init__(self, bbox_aps, segm_aps):
        self.aps = list(zip(bbox_aps, segm_aps))

    def __call__(self, cfg, checkpoint, out_dir, max_images):
        box, segm = self.aps.pop(0)
        return {"tested": 3, "stats": {"AP": box, "AP50": 2 * box, "segm": {"AP": segm, "AP50": 2 * segm}}}


def test_a_mask_network_picks_its_best_epoch_by_segm_ap_and_logs_segm_beside_bbox(tmp_path):
    cfg = eval_cfg(tmp_path, **{"TRAIN.WITH_MASK": "true", "TRAIN.EVAL_EVERY": "1", "TRAIN.end_epoch": "3",
                                "TRAIN.EVAL_METRIC": "segm_AP"})
    assert {"AP", "segm_AP", "segm_AP50", "segm_APs", "segm_AR100"} <= set(metric_names(cfg))
    # bbox AP is best after epoch 1, segm AP after epoch 2: the chosen metric decides
    evaluation = TrainingEvaluation(cfg, 0, test=MaskTester([0.5, 0.3, 0.4], [0.1, 0.35, 0.2]))
    events = RecordedEvents()
    progress = RunProgress(os.path.join(output_dir(cfg), "metrics.jsonl"), 0, 3, 0, events=events)
    for epoch in range(1, 4):
        progress.start_epoch(epoch - 1, 10)
        progress.end_epoch_updates(10)
        evaluation.after_epoch(epoch, fake_params(cfg, epoch), progress)
    best = json.load(open(os.path.join(output_dir(cfg), "best.json")))
    assert best["metric"] == "segm_AP" and (best["best"]["epoch"], best["best"]["value"]) == (2, 0.35)
    assert best["history"][0]["stats"] == {"AP": 0.5, "AP50": 1.0, "segm_AP": 0.1, "segm_AP50": 0.2}
    records = [json.loads(line) for line in open(os.path.join(output_dir(cfg), "metrics.jsonl"))]
    assert [(r["eval"]["AP"], r["eval"]["segm_AP"]) for r in records] == [(0.5, 0.1), (0.3, 0.35), (0.4, 0.2)]
    assert events.calls[1] == (20, {"eval/AP": 0.3, "eval/AP50": 0.6, "eval/segm_AP": 0.35, "eval/segm_AP50": 0.7})


def test_segm_metrics_are_refused_at_load_for_a_network_without_masks(tmp_path):
    with pytest.raises(ConfigError) as info:
        eval_cfg(tmp_path, **{"TRAIN.EVAL_METRIC": "segm_APs"})
    assert str(info.value) == ("config key TRAIN.EVAL_METRIC = 'segm_APs': segm metrics need a mask network "
                               "(TRAIN.WITH_MASK true); choose a bbox metric such as 'APs'")
    assert not any(name.startswith("segm_") for name in metric_names(eval_cfg(tmp_path)))
    assert eval_cfg(tmp_path, **{"TRAIN.EVAL_METRIC": "segm_APs", "TRAIN.WITH_MASK": "true"}).TRAIN.WITH_MASK
    with pytest.raises(EvaluationError, match="segm_AR1': the evaluation gives AP, segm_AP$"):
        metric_value({"AP": 0.5, "segm": {"AP": 0.2}}, "segm_AR1")


def test_training_evaluates_its_checkpoints_and_names_the_best(tmp_path, monkeypatch):
    # the tiny config on 2 synthetic training images, evaluated on the first of 2 validation images, with
    # gradients accumulated over 2 batches, keeping the newest checkpoint only (and the best)
    overrides = {"dataset.dataset_path": str(tmp_path / "data"), "dataset.synthetic_train": "2",
                 "dataset.synthetic_val": "2", "dataset.root_path": str(tmp_path), "output_path": str(tmp_path),
                 "TRAIN.NUM_PROCESS": "0", "TEST.NUM_PROCESS": "0", "TRAIN.BATCH_IMAGES": "2",
                 "TRAIN.end_epoch": "2", "TRAIN.warmup_step": "5", "TRAIN.lr_step": "", "gpus": "cpu:1",
                 "TRAIN.EVAL_EVERY": "1", "TRAIN.EVAL_IMAGES": "1", "TRAIN.GRAD_ACCUM_STEPS": "2",
                 "TRAIN.KEEP_CHECKPOINTS": "1"}
    cfg = load_config(TINY, list(overrides.items()))
    from lib.inference.tester import test as real_test

    def epoch_one_best(cfg, checkpoint=None, out_dir=None, max_images=0):
        """The real tester; the evaluations while training score AP 1 / epoch, so epoch 1 is the best."""
        summary = real_test(cfg, checkpoint=checkpoint, out_dir=out_dir, max_images=max_images)
        if out_dir and os.path.basename(os.path.dirname(out_dir)) == "evaluations":
            summary["stats"] = {**summary["stats"], "AP": 1 / int(out_dir[-4:])}
        return summary

    monkeypatch.setattr("lib.inference.tester.test", epoch_one_best)
    main_train.main(["--cfg", TINY, "--eval", "--set", *[f"{k}={v}" for k, v in overrides.items()]])
    run = output_dir(cfg)
    for epoch in (1, 2):
        summary = json.load(open(os.path.join(run, "evaluations", f"epoch_{epoch:04d}", "test_summary.json")))
        assert summary["images"] == 1 and summary["checkpoint"].endswith(f"SNIPER-{epoch:04d}.params")
    best = json.load(open(os.path.join(run, "best.json")))
    assert [(h["epoch"], h["value"]) for h in best["history"]] == [(1, 1.0), (2, 0.5)]
    assert best["best"]["params"] == "SNIPER-0001.params"
    # TRAIN.KEEP_CHECKPOINTS 1 keeps the newest epoch, and the best one beside it
    assert sorted(glob.glob(os.path.join(run, "SNIPER-*.params"))) == [
        os.path.join(run, f"SNIPER-{epoch:04d}.params") for epoch in (1, 2)]
    # --eval tested the best epoch on the whole test set
    summary = json.load(open(os.path.join(run, "results", "val", "test_summary.json")))
    assert summary["images"] == 2 and summary["checkpoint"].endswith("SNIPER-0001.params")
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["epoch"] for r in records if "eval" in r] == [1, 2]
    # GRAD_ACCUM_STEPS 2: the schedule counts one update per two batches (the last group may be partial)
    batches = [next(r["batches"] for r in records if r.get("epoch") == e and "eval" not in r) for e in (1, 2)]
    saved = json.load(open(checkpoint.progress_path(checkpoint.checkpoint_prefix(cfg), 2)))
    assert saved["iters_per_epoch"] == -(-batches[0] // 2)
    assert saved["num_update"] == sum(-(-b // 2) for b in batches)
    # the log line of each epoch's last batch counts updates (a partial last group updates after it)
    last = [r for r in records if "eval" not in r and r["batch"] == r["batches"]]
    assert [r["iteration"] for r in last] == [batches[0] // 2, -(-batches[0] // 2) + batches[1] // 2]
    if importlib.util.find_spec("tensorboardX"):  # the optional event files (TRAIN.TENSORBOARD)
        tags = {tag for tag, _, _ in read_event_scalars(os.path.join(run, "tensorboard"))}
        assert {"eval/AP", "lr", "loss/RPNLogLoss", "speed/chips_per_s"} <= tags


# ---------------------------------------------------------------- dense scenes and size bands
def coco_gt(objects, size=640):
    """A pycocotools COCO of one image holding ``objects``: [(x, y, side, category id)] squares."""
    coco = COCO()
    coco.dataset = {"images": [{"id": 1, "width": size, "height": size, "file_name": "1.jpg"}],
                    "annotations": [{"id": i + 1, "image_id": 1, "category_id": c, "bbox": [x, y, s, s],
                                     "area": s * s, "iscrowd": 0} for i, (x, y, s, c) in enumerate(objects)],
                    "categories": [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def write_results(tmp_path, detections):
    """``detections``: [(x, y, side, category id, score)] -> a COCO results file."""
    path = str(tmp_path / "results.json")
    write_json([{"image_id": 1, "category_id": int(c), "bbox": [float(x), float(y), float(s), float(s)],
                 "score": float(score)}
                for x, y, s, c, score in detections], path)
    return path


def grid(count, side, step, category=1):
    return [(step * (i % 20), step * (i // 20), side, category) for i in range(count)]


def test_default_setting_reproduces_pycocotools_summarize(tmp_path):
    rng = np.random.default_rng(0)
    objects = grid(30, 12, 30) + [(x + 300, y, 50, 2) for x, y, _, _ in grid(10, 0, 60)] + [(0, 400, 200, 1)]
    detections = [(x + rng.integers(-3, 4), y + rng.integers(-3, 4), s + rng.integers(-4, 5), c, rng.random())
                  for x, y, s, c in objects] + [(500, 500, 40, 1, 0.95), (100, 100, 20, 2, 0.4)]
    path = write_results(tmp_path, detections)
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path))
    gt = coco_gt(objects)
    reference = COCOeval(gt, gt.loadRes(path), "bbox")
    with contextlib.redirect_stdout(io.StringIO()):
        reference.evaluate(), reference.accumulate()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        reference.summarize()
    # the same reductions over the same arrays: equal to rounding (1e-12 leaves room for summation order)
    assert list(stats) == list(COCO_STAT_NAMES)
    np.testing.assert_allclose([stats[n] for n in COCO_STAT_NAMES], reference.stats, rtol=0, atol=1e-12)
    assert 0 < stats["AP"] < 1 and stats["APs"] != stats["APm"]
    assert open(tmp_path / "coco_summary.txt").read() == printed.getvalue()


def test_a_dense_scene_is_scored_at_every_detection_kept(tmp_path):
    # 150 objects, 150 perfect detections. At maxDets 100 only the 100 best count: precision 1 up to recall
    # 100/150, nothing beyond, so AP = (recall points 0, 0.01, .. 0.66: 67 of 101) = 67/101.
    objects = grid(150, 20, 30)
    path = write_results(tmp_path, [(x, y, s, c, 1 - i / 1000) for i, (x, y, s, c) in enumerate(objects)])
    assert evaluate_coco(coco_gt(objects), path, str(tmp_path))["AP"] == pytest.approx(67 / 101)
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path), max_dets=200)
    assert stats["AP"] == pytest.approx(1.0) and stats["AR200"] == pytest.approx(1.0)
    assert max_dets_for(50) == [1, 10, 100] and max_dets_for(300) == [1, 10, 300]


def scene_gt(images):
    """A pycocotools COCO of images 1..N; ``images``: per image [(category id, objects, crowd)]."""
    coco = COCO()
    annotations = []
    for image_id, groups in enumerate(images, start=1):
        for category, count, crowd in groups:
            annotations += [{"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                             "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": int(crowd)} for _ in range(count)]
    coco.dataset = {"images": [{"id": i, "width": 640, "height": 640} for i in range(1, len(images) + 1)],
                    "annotations": annotations, "categories": [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def test_dense_scenes_cut_by_the_scored_detections_are_warned_about_once_with_the_count():
    # image 1: 150 objects of category 1 (more than 100); image 2: 60 + 60 objects (100 or fewer per category:
    # pycocotools caps per image and category) and 150 detections of category 1 (dense: 60 >= 100 / 2);
    # image 3: 10 objects, 150 detections (not dense); image 4: 120 crowd regions (not objects)
    gt = scene_gt([[(1, 150, False)], [(1, 60, False), (2, 60, False)], [(1, 10, False)], [(2, 120, True)]])
    results = [{"image_id": image, "category_id": 1} for image in (2, 3) for _ in range(150)]
    test = load_config(None).TEST
    assert (test.EVAL_MAX_DETS, test.MAX_PER_IMAGE) == (100, 200)
    assert dense_scene_warning(gt, results, [1, 2, 3, 4], test) == (
        "COCO evaluation scores at most 100 detections per image and category, so the AP and AR of dense scenes "
        "are capped: 1 of 4 scored images have more objects of one category (up to 150), 1 more keep more "
        "detections for a category of at least 50 objects; set TEST.EVAL_MAX_DETS 0 to score every detection "
        "the test keeps")
    assert dense_scene_warning(gt, results, [2, 3, 4], test).endswith(  # the scored images only
        "capped: 1 of 3 scored images keep more detections for a category of at least 50 objects; set "
        "TEST.EVAL_MAX_DETS 0 to score every detection the test keeps")
    assert dense_scene_warning(gt, results, [3, 4], test) is None
    follows = load_config(None, [("TEST.EVAL_MAX_DETS", "0")]).TEST  # scores the test's 200: nothing cut
    assert dense_scene_warning(gt, results, [1, 2, 3, 4], follows) is None
    fewer = load_config(None, [("TEST.EVAL_MAX_DETS", "0"), ("TEST.MAX_PER_IMAGE", "100")]).TEST
    assert dense_scene_warning(gt, results, [1, 2], fewer).endswith(
        "up to 150), 1 more keep more detections for a category of at least 50 objects; raise TEST.MAX_PER_IMAGE "
        "(100) above 150")


def test_the_test_of_a_dense_set_warns_and_eval_max_dets_0_scores_it_whole(tmp_path, caplog):
    # 120 objects of category 2 (label 1), all found, ranked: at maxDets 100 precision 1 up to recall
    # 100/120, nothing beyond: AP = recall points 0, 0.01, .. 0.83 (84 of 101); scored whole: 1
    write_coco(str(tmp_path / "data"), "val", [image_record(1, 400, 400)],
               [ann(i + 1, 1, [20 * (i % 20), 20 * (i // 20), 12, 12]) for i in range(120)])
    _, dataset = load_roidb(dataset_cfg(tmp_path), "val", training=False)
    detections = [np.array([[20 * (i % 20), 20 * (i // 20), 20 * (i % 20) + 11, 20 * (i // 20) + 11, 1 - i / 1000, 1]
                            for i in range(120)], np.float32)]
    for eval_max_dets, warnings, ap in (("100", 1, 84 / 101), ("0", 0, 1.0)):
        caplog.clear()
        scoring = load_config(None, [("TEST.EVAL_MAX_DETS", eval_max_dets)]).TEST
        with caplog.at_level(logging.WARNING):
            stats = dataset.evaluate([{"id": 1}], detections, str(tmp_path / eval_max_dets), scoring=scoring)["stats"]
        messages = [r.getMessage() for r in caplog.records if "dense scenes" in r.getMessage()]
        assert len(messages) == warnings and stats["AP"] == pytest.approx(ap)
        assert all("1 of 1 scored images have more objects of one category (up to 120)" in m for m in messages)


def test_size_bands_and_the_per_class_size_table(tmp_path):
    # class 1: ten 10 px objects (tiny) found, ten 40 px ones (medium) missed; class 2: ten 40 px found
    objects = grid(10, 10, 30) + [(x, y + 200, 40, 1) for x, y, _, _ in grid(10, 0, 60)] + \
        [(x, y + 400, 40, 2) for x, y, _, _ in grid(10, 0, 60)]
    found = [o for o in objects if not (o[2] == 40 and o[3] == 1)]
    path = write_results(tmp_path, [(*o, 0.9) for o in found])
    bands = parse_bands([["tiny", 0, 16], ["small", 16, 32], ["medium", 32, 96], ["large", 96, -1]])
    stats = evaluate_coco(coco_gt(objects), path, str(tmp_path), bands=bands)
    assert list(stats)[:7] == ["AP", "AP50", "AP75", "AP_tiny", "APs", "APm", "APl"]
    assert stats["AP_tiny"] == pytest.approx(1.0)  # only class 1 has tiny objects, all found
    assert stats["APm"] == pytest.approx(0.5)  # class 1 medium 0, class 2 medium 1
    assert stats["APs"] == stats["APl"] == -1  # no objects in those bands
    table = json.load(open(tmp_path / "per_class_size_ap.json"))
    assert table["one"]["AP_tiny"] == pytest.approx(1.0) and table["one"]["APm"] == pytest.approx(0.0)
    assert table["two"]["APm"] == pytest.approx(1.0) and np.isnan(table["two"]["AP_tiny"])
    assert table["one"]["AP"] == pytest.approx(0.5, abs=0.01)  # half its objects, all ranked first
    cfg = load_config(None, [("TEST.SIZE_BANDS", "[[tiny, 0, 16], [rest, 16, -1]]"), ("TEST.EVAL_MAX_DETS", "0")])
    assert {"AP_tiny", "AP_rest", "AR200", "mAP"} <= set(metric_names(cfg))


def test_bad_size_bands_are_named():
    for bad in ([["all", 0, 16]], [["a", 16, 8]], [["a", 0]], [["a", 0, 8], ["a", 8, -1]]):
        with pytest.raises(ValueError, match="TEST.SIZE_BANDS"):
            parse_bands(bad)


# ---------------------------------------------------------------- own Pascal VOC-format data
def test_own_voc_classes_from_the_config_or_a_file_and_any_image_names(tmp_path):
    root = str(tmp_path / "data")
    write_voc(root, "mine", "train", {
        "field_a": voc_xml(100, 80, [("tractor", (11, 21, 40, 60), False), ("cow", (1, 1, 10, 10), False)]),
        "IMG-0042.v2": voc_xml(100, 80, [("cow", (5, 5, 20, 20), False)]),
    })
    (tmp_path / "classes.txt").write_text("# my classes\ncow\n\ntractor\n")
    by_list = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow, tractor]"}),
                         "mine_train", training=False)
    by_file = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc",
                                     **{"dataset.CLASSES_FILE": str(tmp_path / "classes.txt")}),
                         "mine_train", training=False)
    for roidb, dataset in (by_list, by_file):
        assert dataset.classes == ("__background__", "cow", "tractor") and dataset.num_classes == 3
        assert dataset.image_names == ["VOCmine/field_a", "VOCmine/IMG-0042.v2"] and not dataset.use_07_metric
        assert [e["gt_classes"].tolist() for e in roidb] == [[2, 1], [1]]  # labels in the list's order
        assert len(set(dataset.image_ids)) == 2 and all(i >= HASHED_IDS for i in dataset.image_ids)
        assert roidb[1]["image"] == os.path.join(root, "VOCmine", "JPEGImages", "IMG-0042.v2.jpg")
    assert by_list[1].image_ids == by_file[1].image_ids  # stable ids: proposal files keep matching
    assert voc_image_id("2007", "000005") == 20070000000005  # VOC's own names keep their ids

    # another class order is another roidb (labels differ): a separate cache, not the first one's
    swapped, _ = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[tractor, cow]"}),
                            "mine_train", training=False)
    assert swapped[0]["gt_classes"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="unknown class 'tractor'"):
        load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow]"}), "mine_train")


def test_voc_image_file_from_the_xml_and_bad_class_lists_named(tmp_path):
    root = str(tmp_path / "data")
    xml = voc_xml(100, 80, [("cow", (5, 5, 20, 20), False)]).replace("<annotation>",
                                                                     "<annotation><filename>scan.png</filename>")
    write_voc(root, "mine", "test", {"scan": xml})
    os.remove(os.path.join(root, "VOCmine", "JPEGImages", "scan.jpg"))
    cv2.imwrite(os.path.join(root, "VOCmine", "JPEGImages", "scan.png"), np.zeros((80, 100, 3), np.uint8))
    roidb, _ = load_roidb(dataset_cfg(tmp_path, dataset="pascal_voc", **{"dataset.CLASSES": "[cow]"}),
                          "mine_test", training=False)
    assert roidb[0]["image"].endswith(os.path.join("VOCmine", "JPEGImages", "scan.png"))
    for names, path, message in (([], str(tmp_path / "none.txt"), "cannot read"), (["a", "a"], "", "distinct"),
                                 (["a"], "x.txt", "not both"), (["__background__"], "", "distinct")):
        with pytest.raises(ValueError, match=message):
            read_class_names(names, path)


# ---------------------------------------------------------------- testing a folder of images
def test_main_test_images_runs_a_run_folder_over_a_folder_end_to_end(tiny, tmp_path):
    # a run folder as training leaves it (config.yaml, a checkpoint with its metadata) of the tiny random network
    cfg = with_overrides(tiny[0], {"output_path": str(tmp_path / "out"), "TEST.NUM_PROCESS": 0})
    _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    write_run_config(cfg)
    checkpoint.save_checkpoint(checkpoint.checkpoint_prefix(cfg), 1, None, *tiny[1:], stds=(1, 1, 1, 1),
                               means=(0, 0, 0, 0), progress={MODEL_KEY: model_info(cfg, dataset, False)})
    folder = tmp_path / "new images"
    shutil.copytree(os.path.join(cfg.dataset.dataset_path, "images", "val"), folder)  # a b broken.jpg c
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main_test.py"), "--model", output_dir(cfg),
                             "--images", str(folder), "--draw", "--set", "TEST.SCORE_THRESH", "0"],
                            cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    out = os.path.join(output_dir(cfg), "results", "images_new images")
    summary = json.load(open(os.path.join(out, "test_summary.json")))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 3, 1)
    assert summary["checkpoint"] == checkpoint.params_path(checkpoint.checkpoint_prefix(cfg), 1)
    info = json.load(open(os.path.join(out, "image_info.json")))
    assert [(i["id"], i["file_name"], i["width"], i["height"]) for i in info["images"]] == \
        [(1, "a.png", 80, 60), (2, "b.png", 50, 90), (4, "c.png", 40, 40)]
    assert info["categories"] == [{"id": 4, "name": "cat4"}, {"id": 9, "name": "cat9"}]  # the run's classes
    results = json.load(open(os.path.join(out, "detections_results.json")))
    assert results and {r["image_id"] for r in results} <= {1, 2, 4} and {r["category_id"] for r in results} <= {4, 9}
    assert sorted(os.listdir(os.path.join(out, "drawn"))) == ["a.jpg", "b.jpg", "c.jpg"]
    assert cv2.imread(os.path.join(out, "drawn", "b.jpg")).shape == (90, 50, 3)
    log = max(glob.glob(os.path.join(output_dir(cfg), "test_*.log")), key=os.path.getmtime)
    text = open(log).read()
    assert "broken.jpg" in text and re.search(r"tested 3 of 4 images of .* \(\d+\.\d+ images/s\)", text)
    assert not os.listdir(elsewhere)


class NamedOracle(OracleDetector):
    """test_tester's oracle network with class names."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.classes = ["__background__", "first", "second"]


def test_a_folder_of_images_is_tested_into_coco_results_and_drawn(tiny, tmp_path):
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0})
    folder = os.path.join(cfg.dataset.dataset_path, "images", "val")  # a.png b.png broken.jpg c.png
    summary = detect_images(cfg, folder, str(tmp_path / "out"), draw=True, thresh=0.5, detector=NamedOracle(cfg))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 3, 1)
    assert summary["images_per_s"] > 0
    info = json.load(open(tmp_path / "out" / "image_info.json"))
    # names are not numbers: ids 1..N in sorted order (broken.jpg has no readable header and no entry)
    assert [(i["id"], i["file_name"], i["width"], i["height"]) for i in info["images"]] == \
        [(1, "a.png", 80, 60), (2, "b.png", 50, 90), (4, "c.png", 40, 40)]
    assert [c["name"] for c in info["categories"]] == ["first", "second"]
    results = json.load(open(summary["results"]))
    ids = {"a.png": 1, "b.png": 2, "c.png": 4}
    assert sorted((r["image_id"], r["category_id"], tuple(r["bbox"])) for r in results) == sorted(
        (ids[name], label, (x1, y1, x2 - x1 + 1, y2 - y1 + 1))
        for name, _, _, _, objects in IMAGES["val"] if name in ids for (x1, y1, x2, y2), label in objects)
    assert sorted(os.listdir(tmp_path / "out" / "drawn")) == ["a.jpg", "b.jpg", "c.jpg"]
    drawn = cv2.imread(str(tmp_path / "out" / "drawn" / "a.jpg"))
    assert drawn.shape == (60, 80, 3)

    listed = tmp_path / "list.txt"
    listed.write_text(f"# two of them\n{os.path.join(folder, 'c.png')}\n\n{os.path.join(folder, 'a.png')}\n")
    assert list_images(str(listed)) == [os.path.join(folder, "c.png"), os.path.join(folder, "a.png")]
    assert image_ids(["x/000000000139.jpg", "y/42.png"]) == [139, 42] and image_ids(["1.jpg", "01.jpg"]) == [1, 2]
    with pytest.raises(FileNotFoundError, match="neither a folder"):
        list_images(str(tmp_path / "nowhere"))


def test_a_folder_image_over_the_pixel_limit_is_a_counted_skip_naming_file_size_and_key(tiny, tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "small.png"), np.zeros((60, 80, 3), np.uint8))
    (folder / "bomb.png").write_bytes(png_bomb(100_000, 100_000))  # a few hundred bytes declaring 10 Gpx
    (folder / "large.png").write_bytes(png_bomb(20_000, 10_000))  # 200 Mpx: over Pillow's own limit, not the key's
    with caplog.at_level(logging.ERROR, logger="lib.inference.image_folder"):
        entries, unreadable = image_entries(list_images(str(folder)), 1_000_000_000)
    assert [(os.path.basename(e["image"]), e["width"], e["height"]) for e in entries] == [
        ("large.png", 20_000, 10_000), ("small.png", 80, 60)]
    bomb = str(folder / "bomb.png")
    message = (f"image {bomb} declares 100000x100000 pixels (10000 Mpx), more than dataset.MAX_IMAGE_PIXELS "
               f"(1000 Mpx); not decoded")
    assert len(unreadable) == 1 and unreadable[0][0] == bomb and unreadable[0][1].startswith(message)
    assert f"skipping {bomb}: {message}" in caplog.text
    # main_test.py --images holds the folder to the config's dataset.MAX_IMAGE_PIXELS: a.png (80 x 60) is over 4600
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0, "dataset.MAX_IMAGE_PIXELS": 4600})
    val = os.path.join(cfg.dataset.dataset_path, "images", "val")  # a.png b.png broken.jpg c.png
    summary = detect_images(cfg, val, str(tmp_path / "out"), draw=True, detector=NamedOracle(cfg))
    assert (summary["images"], summary["tested"], summary["skipped"]) == (4, 2, 2)
    assert sorted(os.listdir(tmp_path / "out" / "drawn")) == ["b.jpg", "c.jpg"]


# ---------------------------------------------------------------- gradient accumulation
def small_network():
    """FC -> frozen batch-norm (global statistics, fixed gamma) -> FC -> softmax normalised per batch: each
    sample's gradient does not depend on the others, so a batch's gradient is a mean over its samples."""
    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=6, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=True, use_global_stats=True, name="bn")
    scores = mx.sym.FullyConnected(mx.sym.relu(hidden), num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(scores, mx.sym.var("softmax_label"), normalization="batch", name="softmax")


def trained(batches, batch_size, steps, seed=0):
    """Params after training on ``batches`` (data, labels) with GRAD_ACCUM_STEPS ``steps``, SGD with
    momentum and weight decay from make_optimizer_params (no warm-up, no fp16), the trainer's helpers."""
    cfg = load_config(None, [("TRAIN.GRAD_ACCUM_STEPS", str(steps)), ("TRAIN.warmup", "false"),
                             ("TRAIN.lr", "0.1"), ("TRAIN.lr_step", "")])
    module = mx.mod.Module(small_network(), context=mx.cpu())
    module.bind([("data", (batch_size, 5))], [("softmax_label", (batch_size,))], grad_req=grad_req(cfg))
    mx.random.seed(seed)
    module.init_params(mx.init.Normal(0.5))
    module.init_optimizer(kvstore="local", optimizer="sgd",
                          optimizer_params=make_optimizer_params(cfg, 10, 0, fp16=False))
    accumulation = GradientAccumulation(module, steps)
    updates = 0
    for data, labels in batches:
        module.forward_backward(mx.io.DataBatch([mx.nd.array(data)], [mx.nd.array(labels)]))
        updates += accumulation.after_backward()
    updates += accumulation.flush()
    arg_params, _ = module.get_params()
    return {k: v.asnumpy() for k, v in arg_params.items()}, updates


def test_accumulated_batches_update_as_one_larger_batch():
    rng = np.random.default_rng(0)
    data, labels = rng.normal(size=(24, 5)).astype(np.float32), rng.integers(0, 3, 24).astype(np.float32)
    # three updates of 8 samples: each once as 2 x 4 accumulated, once as one batch of 8
    small, small_updates = trained([(data[i:i + 4], labels[i:i + 4]) for i in range(0, 24, 4)], 4, 2)
    large, large_updates = trained([(data[i:i + 8], labels[i:i + 8]) for i in range(0, 24, 8)], 8, 1)
    assert small_updates == large_updates == 3 and updates_per_epoch(6, 2) == 3
    # float32 sums of the same 8 per-sample terms in another order (two GEMMs of 4 rows vs one of 8) and
    # the 1/2 rescale: differences of a few ulps, amplified by three momentum steps: 1e-5 is ample
    for name in large:
        np.testing.assert_allclose(small[name], large[name], rtol=1e-5, atol=1e-6, err_msg=name)
    unchanged, _ = trained([], 4, 2)
    assert any(not np.allclose(unchanged[n], large[n]) for n in large)  # the updates did change the weights


def test_an_epoch_ending_mid_group_updates_with_the_mean_of_its_last_batches():
    rng = np.random.default_rng(1)
    data, labels = rng.normal(size=(12, 5)).astype(np.float32), rng.integers(0, 3, 12).astype(np.float32)
    # 3 batches of 4 with N = 2: an update of batches 1+2, then one of batch 3 alone (its sum x 2 / 2)
    small, updates = trained([(data[i:i + 4], labels[i:i + 4]) for i in range(0, 12, 4)], 4, 2)
    assert updates == 2 == updates_per_epoch(3, 2)
    # the same as a batch of 8 then a batch of 4, each one plain update: compare the second step through
    # a 4-sample batch repeated twice (its mean is its own mean)
    reference, _ = trained([(data[:8], labels[:8]), (np.concatenate([data[8:]] * 2), np.concatenate([labels[8:]] * 2))],
                           8, 1)
    for name in reference:
        np.testing.assert_allclose(small[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)


# ---------------------------------------------------------------- TensorBoard
class RecordedEvents:
    def __init__(self):
        self.calls = []

    def scalars(self, step, values):
        self.calls.append((step, dict(values)))


def test_progress_records_go_to_the_event_log_against_the_update_count(tmp_path):
    events = RecordedEvents()
    progress = RunProgress(str(tmp_path / "metrics.jsonl"), 0, 2, 100, events=events)
    progress.start_epoch(0, 10)
    progress.record(4, 0.01, {"RPNLogLoss": 0.5}, 12.0)
    progress.end_epoch_updates(10)
    progress.record_evaluation({"AP": 0.3, "AP50": 0.6, "APs": -1.0})  # -1: undefined, not drawn
    assert events.calls == [(104, {"lr": 0.01, "speed/chips_per_s": 12.0, "loss/RPNLogLoss": 0.5}),
                            (110, {"eval/AP": 0.3, "eval/AP50": 0.6})]
    assert json.loads(open(tmp_path / "metrics.jsonl").read().splitlines()[-1])["eval"]["APs"] == -1.0


def read_event_scalars(folder):
    """(tag, step, value) of every scalar in the event files of ``folder``: TFRecord framing (u64 length,
    u32 crc, payload, u32 crc) around Event protobufs, read here independently of the writer."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        offset = 0
        while offset < len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return found


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    log = TensorBoardLog(str(tmp_path / "tb"))
    log.scalars(3, {"loss/RPNLogLoss": 0.25, "lr": 0.5, "skipped": "text"})
    log.scalars(7, {"eval/AP": 0.125})
    log.close()
    assert read_event_scalars(str(tmp_path / "tb")) == [("loss/RPNLogLoss", 3, 0.25), ("lr", 3, 0.5),
                                                        ("eval/AP", 7, 0.125)]


def test_without_tensorboardx_nothing_is_written_and_nothing_breaks(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX raises ImportError
    with caplog.at_level(logging.INFO):
        log = TensorBoardLog(str(tmp_path / "tb"))
    # what to install, with which command, into which environment
    assert f"tensorboardX is not installed in {shown_path(sys.prefix)} (the Python training runs in)" in caplog.text
    assert f"{shown_path(sys.executable)} -m pip install -c {shown_path(os.path.join(ROOT, 'constraints.txt'))} " \
           f"tensorboardX" in caplog.text
    log.scalars(1, {"lr": 0.1})
    log.close()
    assert not os.path.exists(tmp_path / "tb")
    assert TensorBoardLog(str(tmp_path / "off"), enabled=False).writer is None


def test_the_event_folder_line_says_how_to_view_it_and_where_to_get_the_viewer(tmp_path, monkeypatch, caplog):
    pytest.importorskip("tensorboardX")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no viewer on the PATH
    with caplog.at_level(logging.INFO):
        TensorBoardLog(str(tmp_path / "out" / "run" / "tensorboard")).close()
    assert (f"TensorBoard event files in {os.path.join('out', 'run', 'tensorboard')}: view them with tensorboard "
            f"--logdir out after installing the viewer") in caplog.text
    assert "python3 -m pip install tensorboard" in caplog.text
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        TensorBoardLog(str(tmp_path / "out" / "run" / "tensorboard")).close()
    assert caplog.text.rstrip().endswith(": view them with tensorboard --logdir out")


# ---------------------------------------------------------------- variant sets for measuring
def test_small_object_mosaics_and_inpainted_empty_images(tmp_path):
    source, out = str(tmp_path / "src"), str(tmp_path / "out")
    write_coco(source, "train", [image_record(1, 90, 60), image_record(2, 90, 60)],
               [ann(1, 1, [30, 15, 30, 30]), ann(2, 2, [0, 0, 9, 6])])
    cv2.imwrite(os.path.join(source, "images", "train", "1.jpg"), np.full((60, 90, 3), 200, np.uint8))
    small_object_set(source, out, "train", count=2, tile=3, seed=0)
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.dataset_path": out}), "train", training=False)
    assert [(e["width"], e["height"]) for e in roidb] == [(90, 60), (90, 60)]  # 3 x 3 cells of 30 x 20
    boxes = np.concatenate([e["boxes"] for e in roidb])
    # each 30 x 30 box of image 1 becomes 10 x 10 in its cell, image 2's 9 x 6 becomes 3 x 2: 1/3 the size
    assert len(boxes) == 9 * 2
    sizes = sorted({(round(float(b[2] - b[0] + 1)), round(float(b[3] - b[1] + 1))) for b in boxes})
    assert set(sizes) <= {(10, 10), (3, 2)} and all(b[0] % 30 in (0, 10) for b in boxes)
    added = add_empty_images(out, "train", count=1, seed=0)
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.dataset_path": out, "dataset.root_path":
                                                   str(tmp_path / "root2")}), "train", training=False)
    empty = by_id(roidb)[added[0]]
    assert len(roidb) == 3 and empty["boxes"].shape == (0, 4)
    copy = cv2.imread(empty["image"])
    assert copy.shape == (60, 90, 3)
