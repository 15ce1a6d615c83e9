"""The command-line entry points: bad configs stop them with a message; what main_test.py logs."""
import glob
import json
import logging
import os
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

import demo
import main_test
import main_train
from lib.bootstrap import ROOT
from lib.config.core import dump_config
from lib.inference import tester

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


def run_entry(program, *argv, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, program), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_main_test_logs_the_effective_config_as_yaml_to_the_log_file_only(tmp_path, monkeypatch, capsys):
    config = tmp_path / "exp.yml"
    config.write_text("TEST:\n  TEST_EPOCH: 3\n")
    tested = []
    monkeypatch.setattr(tester, "test", lambda cfg, **options: tested.append(cfg))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        main_test.main(["--cfg", str(config), "--set", "output_path", str(tmp_path / "out"), "TEST.BATCH_IMAGES", "2",
                        "TEST.fp16", "false"])  # a CPU machine: the default fp16 test is refused at start
    finally:  # setup_logging replaced the root handlers: restore pytest's
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    (cfg,) = tested
    assert (cfg.name, cfg.TEST.TEST_EPOCH, cfg.TEST.BATCH_IMAGES) == ("exp", 3, 2)
    (log,) = glob.glob(os.path.join(tmp_path, "out", "exp", "test_*.log"))
    with open(log) as f:
        text = f.read()
    named = (f"config {config} with overrides ['output_path', '{tmp_path / 'out'}', 'TEST.BATCH_IMAGES', '2', "
             f"'TEST.fp16', 'false']")
    assert f"{named}\n" in text and f"effective config:\n{dump_config(cfg)}" in text  # every key, as YAML
    assert "  TEST_EPOCH: 3\n" in text and "  BATCH_IMAGES: 2\n" in text
    console = capsys.readouterr().err
    assert named in console and "TEST_EPOCH" not in console  # the console: file and overrides, no dump


@pytest.mark.parametrize("entry", [main_train, main_test, demo])
@pytest.mark.parametrize("overrides, message", [
    (["TRAIN.NO_SUCH_KEY", "1"], "TRAIN.NO_SUCH_KEY"),
    (["TRAIN.BATCH_IMAGES", "many"], "TRAIN.BATCH_IMAGES"),
    (["TRAIN.lr"], "needs a value"),
])
def test_entry_points_stop_on_a_bad_override_naming_it(entry, overrides, message, tmp_path):
    argv = ["--cfg", "configs/faster/sniper_synthetic_tiny.yml", "--set"] + overrides
    if entry is demo:
        argv += ["--im_path", str(tmp_path / "image.png")]
    with pytest.raises(SystemExit) as info:
        entry.main(argv)
    assert str(info.value.code).startswith("config error:") and message in str(info.value.code)


@pytest.mark.parametrize("key, value, requirement", [
    ("TRAIN.lr", "-0.01", "TRAIN.lr = -0.01: must be a positive number"),
    ("TRAIN.lr", "nan", "TRAIN.lr = nan: must be a positive number"),
    ("TRAIN.momentum", "1.0", "TRAIN.momentum = 1.0: must be in [0, 1)"),
    ("TRAIN.momentum", "-0.1", "TRAIN.momentum = -0.1: must be in [0, 1)"),
    ("default.frequent", "0", "default.frequent = 0: must be at least 1"),
    ("TRAIN.BATCH_IMAGES", "0", "TRAIN.BATCH_IMAGES = 0: must be at least 1"),
    ("TRAIN.NUM_PROCESS", "-1", "TRAIN.NUM_PROCESS = -1: must be >= 0"),
    ("TRAIN.EVAL_METRIC", "segm_AP", "TRAIN.EVAL_METRIC = 'segm_AP': segm metrics need a mask network"),
])
def test_main_train_refuses_a_bad_value_in_one_line_naming_the_key(tmp_path, key, value, requirement):
    result = run_entry("main_train.py", "--cfg", TINY, "--set", "output_path", str(tmp_path), key, value, cwd=ROOT)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: config key {requirement}"), result.stderr
    assert "Traceback" not in result.stderr and not os.listdir(tmp_path)  # stopped before anything ran


def test_demo_refuses_an_output_name_without_an_image_extension_before_running(tmp_path):
    image = tmp_path / "image.png"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    result = run_entry("demo.py", "--cfg", TINY, "--im_path", str(image), "--out", str(tmp_path / "drawn"), cwd=ROOT)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [f"--out {tmp_path / 'drawn'}: not an image file name OpenCV can write; "
                                          f"end it in .png or .jpg"]
    assert os.listdir(tmp_path) == ["image.png"]


def run_in_process(entry, argv):
    """``entry.main(argv)``, the root logger's handlers restored afterwards (setup_logging adds some)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        entry.main(argv)
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_failing_training_run_ends_its_log_with_the_error_and_traceback(tmp_path, monkeypatch, capsys):
    from lib.train import trainer

    def broken_train(cfg, **kwargs):
        raise RuntimeError("out of cheese")
    monkeypatch.setattr(trainer, "train", broken_train)
    with pytest.raises(SystemExit) as info:
        run_in_process(main_train, ["--cfg", TINY, "--set", "output_path", str(tmp_path / "out")])
    assert info.value.code == 1
    assert capsys.readouterr().err.count("Traceback") == 1  # printed once, by the log's console handler
    (log,) = glob.glob(str(tmp_path / "out" / "sniper_synthetic_tiny" / "train_*.log"))
    with open(log) as f:
        text = f.read()
    assert "training failed: RuntimeError: out of cheese" in text and "Traceback" in text
    assert text.rstrip("\n").splitlines()[-1] == "RuntimeError: out of cheese"


@pytest.mark.parametrize("outcome, last_line", [
    (None, "INFO lib.logger: testing finished"),
    (RuntimeError("out of cheese"), "RuntimeError: out of cheese"),
    (SystemExit("error: no checkpoint"), "ERROR lib.logger: testing stopped: error: no checkpoint"),
])
def test_main_test_log_ends_with_finished_or_the_error(tmp_path, monkeypatch, outcome, last_line):
    def fake_test(cfg, **options):
        if outcome is not None:
            raise outcome
    monkeypatch.setattr(tester, "test", fake_test)
    if outcome is None:
        run_in_process(main_test, ["--cfg", TINY, "--set", "output_path", str(tmp_path)])
    else:
        with pytest.raises(SystemExit) as info:
            run_in_process(main_test, ["--cfg", TINY, "--set", "output_path", str(tmp_path)])
        assert info.value.code == 1
    (log,) = glob.glob(str(tmp_path / "sniper_synthetic_tiny" / "test_*.log"))
    with open(log) as f:
        lines = f.read().rstrip("\n").splitlines()
    assert lines[-1].endswith(last_line)


def test_main_test_vis_draws_the_dataset_test_only(tmp_path, monkeypatch, capsys):
    options = []
    monkeypatch.setattr(tester, "test", lambda cfg, **given: options.append(given))
    run_in_process(main_test, ["--cfg", TINY, "--vis", "--draw-thresh", "0.3", "--set", "output_path", str(tmp_path)])
    assert options == [{"vis": True, "vis_thresh": 0.3}]
    with pytest.raises(SystemExit) as info:
        main_test.main(["--cfg", TINY, "--vis", "--images", str(tmp_path)])
    assert info.value.code == 2 and "with --images use --draw" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main_test.main(["--cfg", TINY, "--vis", "--set", "TEST.EXTRACT_PROPOSALS", "true"])
    assert info.value.code == 1 and "TEST.EXTRACT_PROPOSALS true extracts proposals" in capsys.readouterr().err
    assert options == [{"vis": True, "vis_thresh": 0.3}]


@pytest.mark.parametrize("program", ["main_train.py", "main_test.py"])
def test_missing_or_foreign_data_folders_are_one_line(program, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    for overrides, message in ((["dataset.dataset_path", str(foreign)], "is not a synthetic dataset"),
                               (["dataset.dataset", "coco", "dataset.dataset_path", str(tmp_path / "none")],
                                "annotations/instances_")):
        result = run_entry(program, "--cfg", TINY, "--set", "output_path", str(tmp_path / "out"), *overrides,
                           cwd=tmp_path)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        last = result.stderr.splitlines()[-1]  # the plain message, or the log's closing line that carries it
        assert re.match(r"(\S+ ERROR lib\.logger: \w+( \w+)? stopped: )?error: ", last) and message in last, last
    assert os.listdir(foreign) == []


def test_own_coco_folder_on_the_tiny_config_needs_only_the_dataset_keys(synthetic_dataset, tmp_path):
    data = synthetic_dataset(2, 1)  # COCO-format files: any folder of that layout
    result = run_entry("main_train.py", "--cfg", TINY, "--eval", "--set", "dataset.dataset", "coco",
                       "dataset.dataset_path", data, "dataset.image_set", "train", "dataset.test_image_set", "val",
                       "dataset.root_path", str(tmp_path), "output_path", str(tmp_path / "out"), "TRAIN.end_epoch=1",
                       "TRAIN.lr_step=", "TRAIN.BATCH_IMAGES=2", "TRAIN.NUM_PROCESS=0", "gpus=cpu:1",
                       "TRAIN.FLIP=false", "TEST.NUM_PROCESS=0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "out" / "sniper_synthetic_tiny" / "results" / "val" / "test_summary.json") as f:
        assert json.load(f)["tested"] == 1
