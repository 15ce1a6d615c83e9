"""Evaluation while training (TRAIN.EVAL_EVERY): the best epoch by the chosen metric, early stop, resumed
histories, undefined metrics, mask networks' segm metrics, and a real training run that evaluates its checkpoints."""
import glob
import importlib.util
import json
import logging
import os

import numpy as np
import pytest

from lib.atomic import write_json
from lib.bootstrap import ROOT
from lib.config import ConfigError, load_config, with_overrides
from lib.evaluation.metrics import COCO_STAT_NAMES, evaluate_coco
from lib.inference.tester import results_dir
from lib.run import checkpoint
from lib.run.checkpoint import output_dir
from lib.run.folder import best_checkpoint, find_checkpoint
from lib.train.evaluation import EvaluationError, TrainingEvaluation, final_test, metric_names, metric_value
from lib.train.progress import RunProgress
import main_train
from dataset_helpers import coco_gt, write_results
from tensorboard_helpers import RecordedEvents, read_event_scalars

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


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
