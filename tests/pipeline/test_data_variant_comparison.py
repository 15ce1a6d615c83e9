"""tools/compare_own_data.py (lib/pipeline/own_data.py): the own-data comparison's rows, its parsing of the runs
and its table, and one real run of every kind on a few tiny images for one epoch."""
import json
import math
import os
import shutil
import sys

import pytest

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.dataset.variants import add_empty_images
from lib.pipeline import own_data
from lib.pipeline.own_data import (DataSet, OwnDataComparison, Row, chips_per_epoch, format_table, plan_rows,
                                   row_result)
from dataset_helpers import ann, image_record, write_coco

sys.path.insert(0, os.path.join(ROOT, "tools"))
import compare_own_data  # noqa: E402

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
FAST = ["gpus", "cpu:1", "TRAIN.NUM_PROCESS", "0", "TEST.NUM_PROCESS", "0", "TRAIN.BATCH_IMAGES", "2",
        "TRAIN.warmup_step", "5"]


def test_rows_are_each_config_plain_or_with_and_without_empty_images():
    plain, empty = DataSet.parse("synthetic"), DataSet.parse("small=data/small_empty")
    assert (plain.folder, empty.name, empty.folder) == ("", "small", "data/small_empty")
    assert plain.overrides() == [] and ("dataset.dataset_path", "data/small_empty") in empty.overrides()
    rows = plan_rows([plain, empty], empty_sets={"small"})
    assert [(r.data.name, r.label) for r in rows] == [
        ("synthetic", "embedded"), ("synthetic", "fitted"), ("small", "embedded_drop"), ("small", "embedded_negative"),
        ("small", "fitted_drop"), ("small", "fitted_negative")]
    for bad in ("", "a/b=x", "..=x"):
        with pytest.raises(ValueError, match="NAME or NAME=FOLDER"):
            DataSet.parse(bad)


def test_the_comparison_checks_its_arguments_and_stretches_the_lr_steps(tmp_path):
    sets = [DataSet("synthetic")]
    # the tiny config steps at 3.1 of 4 epochs: at the same fraction of any other run length
    assert dict(OwnDataComparison(TINY, [], sets, str(tmp_path), 8).schedule)["TRAIN.lr_step"] == "6.2000"
    assert dict(OwnDataComparison(TINY, [], sets, str(tmp_path)).schedule)["TRAIN.end_epoch"] == "4"
    for kwargs, message in (({"configs": ["best"]}, "unknown \\['best'\\]"), ({"empty_sets": ["other"]}, "other"),
                            ({"sets": []}, "one or more sets"), ({"sets": sets * 2}, "distinct names")):
        with pytest.raises(ValueError, match=message):
            OwnDataComparison(TINY, [], **{"sets": sets, "out": str(tmp_path), **kwargs})
    with pytest.raises(FileNotFoundError, match="make_variant_set"):
        OwnDataComparison(TINY, [], [DataSet("mine", str(tmp_path / "none"))], str(tmp_path))
    with pytest.raises(ValueError, match="TRAIN.NO_SUCH_KEY"):
        OwnDataComparison(TINY, [("TRAIN.NO_SUCH_KEY", "1")], sets, str(tmp_path))


def test_chips_per_epoch_and_the_table_from_a_run_written_by_hand(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    records = [{"epoch": 1, "batch": 5, "batches": 10}, {"epoch": 1, "batch": 10, "batches": 10},
               {"epoch": 1, "eval": {"AP": 0.5}}, {"epoch": 2, "batch": 12, "batches": 12}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert chips_per_epoch(str(metrics), 8) == 8 * (10 + 12) / 2  # evaluation records are not batches
    metrics.write_text("")
    assert math.isnan(chips_per_epoch(str(metrics), 8))

    cfg = load_config(TINY, [("output_path", str(tmp_path)), ("gpus", "cpu:2"), ("TEST.EVAL_MAX_DETS", "0")])
    os.makedirs(tmp_path / cfg.name)
    (tmp_path / cfg.name / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "batch": 3, "batches": 3}) + "\n")
    summary = tmp_path / "test_summary.json"
    summary.write_text(json.dumps({"stats": {"AP": 0.25, "AP50": 0.5, "AP75": 0.1, "APs": -1.0}}))  # -1: undefined
    result = row_result(Row(DataSet("small", "x"), "fitted", "negative"), cfg, str(summary), 3725.0)
    assert result["chips_per_epoch"] == 3 * 4 * 2 and result["max_dets"] == 200  # 4 chips x 2 contexts
    assert (result["APs"], result["epochs"], result["scales"]) == (None, 4, [3.0, 1.667, 512.0])
    assert format_table([result]).splitlines() == [
        "| set   | config | empty images | scales        | epochs |    AP |  AP50 | AP_S | maxDets | chips/epoch "
        "| wall time |",
        "|:------|:-------|:-------------|:--------------|-------:|------:|------:|-----:|--------:|------------:"
        "|:----------|",
        "| small | fitted | negative     | 3, 1.667, 512 |      4 | 0.250 | 0.500 |    - |     200 |          24 "
        "| 1h02m     |"]


def small_set(root):
    """Three 96 x 64 training images of two objects each and two validation images."""
    images = {"train": [image_record(i, 96, 64) for i in (1, 2, 3)], "val": [image_record(i, 96, 64) for i in (4, 5)]}
    for image_set, records in images.items():
        write_coco(root, image_set, records, [ann(10 * r["id"] + k, r["id"], [8 + 40 * k, 10, 20 + 4 * k, 24],
                                                  category_id=(2, 7)[k]) for r in records for k in (0, 1)])


def test_a_comparison_of_one_epoch_on_tiny_sets_trains_tests_and_tabulates_every_kind_of_row(tmp_path, monkeypatch,
                                                                                                capsys):
    small_set(str(tmp_path / "plain"))
    shutil.copytree(tmp_path / "plain", tmp_path / "empty")
    add_empty_images(str(tmp_path / "empty"), "train", count=1)
    argv = ["--cfg", TINY, "--epochs", "1", "--out", str(tmp_path / "out"), "--configs", "fitted", "--rpn-epochs", "1",
            "--data", f"plain={tmp_path / 'plain'}", f"empty={tmp_path / 'empty'}", "--empty-images", "empty",
            "--set", *FAST, "dataset.root_path", str(tmp_path / "root")]
    compare_own_data.main(argv)
    printed = capsys.readouterr().out
    results = json.load(open(tmp_path / "out" / "comparison.json"))
    assert printed == open(tmp_path / "out" / "comparison.md").read() == format_table(results) + "\n"
    assert [(r["set"], r["config"], r["empty"], r["epochs"]) for r in results] == [
        ("plain", "fitted", "", 1), ("empty", "fitted", "drop", 1), ("empty", "fitted", "negative", 1)]
    fitted = load_config(str(tmp_path / "out" / "plain" / "sniper_synthetic_tiny_fitted.yml"))
    for result in results:
        run = os.path.dirname(os.path.dirname(os.path.dirname(result["summary"])))  # {run}/results/val/...
        saved = load_config(os.path.join(run, "config.yaml"))
        assert result["scales"] == list(saved.TRAIN.SCALES) == list(fitted.TRAIN.SCALES)
        assert saved.TRAIN.EMPTY_IMAGES == (result["empty"] or "drop")
        assert saved.TRAIN.USE_NEG_CHIPS == bool(result["empty"])  # the negative chip pipeline for those
        summary = json.load(open(result["summary"]))
        assert summary["checkpoint"].endswith("SNIPER-0001.params") and summary["images"] == 2
        assert [result[k] for k in ("AP", "AP50", "APs")] == [summary["stats"][k] for k in ("AP", "AP50", "APs")]
        batches = [json.loads(line)["batches"] for line in open(os.path.join(run, "metrics.jsonl"))]
        assert result["chips_per_epoch"] == 2 * batches[-1] and result["seconds"] > 0

    # started again: every row's kept result, nothing trained again
    def refuse(*args, **kwargs):
        raise AssertionError("a finished row ran again")

    monkeypatch.setattr(own_data, "train_stage", refuse)
    monkeypatch.setattr(own_data, "NegChipPipeline", refuse)
    compare_own_data.main(argv)
    assert capsys.readouterr().out == printed
    with pytest.raises(SystemExit) as stop:  # another length needs another folder: said in one line
        compare_own_data.main([*argv[:3], "2", *argv[4:]])
    assert stop.value.code == 1 and "that run trained 1 epochs, not 2: give another output folder (--out)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("case", ["no gpu", "class count", "out is a file"])
def test_a_doomed_comparison_fails_in_one_line_before_anything_is_written(tmp_path, capsys, case):
    small_set(str(tmp_path / "plain"))
    shutil.copytree(tmp_path / "plain", tmp_path / "empty")
    add_empty_images(str(tmp_path / "empty"), "train", count=1)
    out = tmp_path / "out"
    extra = {"no gpu": ["gpus", "0"], "class count": ["dataset.NUM_CLASSES", "7"], "out is a file": []}[case]
    if case == "out is a file":
        out.write_text("not a folder")
    argv = ["--cfg", TINY, "--epochs", "1", "--out", str(out), "--rpn-epochs", "1", "--data",
            f"plain={tmp_path / 'plain'}", f"empty={tmp_path / 'empty'}", "--empty-images", "empty",
            "--set", *FAST, "dataset.root_path", str(tmp_path / "root"), *extra]

    def refuse(*args, **kwargs):
        raise AssertionError("work started")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(own_data, "train_stage", refuse)
        with pytest.raises(SystemExit) as stop:
            compare_own_data.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code != 0 and "Traceback" not in err
    assert {"no gpu": "gpus", "class count": "NUM_CLASSES", "out is a file": "output_path"}[case] in err
    assert (out.is_file() if case == "out is a file" else not out.exists())  # nothing written
    assert not (tmp_path / "root").exists()
