"""A user's mistake is one line on the console and a non-zero exit, its traceback in the log file only; a
defect of the program keeps its traceback (lib/errors.py). Each case of the reliability table is here:
the entry point run as a user would where that is cheap, else the function raising a UserError with the
message that names the file, key or id."""
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dataset_helpers import GOOD, ann, image_record, npz_bytes, write_coco

from lib.bootstrap import ROOT
from lib.config import ConfigError, load_config
from lib.data.epoch_plan import EpochPlan
from lib.data.worker_pool import ProcessPool, WorkerDiedError
from lib.dataset.coco import CocoDataset
from lib.dataset.proposals import check_proposal_file, read_proposals
from lib.dataset.roidb import training_roidb
from lib.errors import DataError, DataFileError, Interrupted, MachineError, UserError
from lib.logger import logged_outcome, report_user_errors, setup_logging

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


def run_train(*overrides, cwd, extra=(), program="main_train.py"):
    return subprocess.run([sys.executable, os.path.join(ROOT, program), "--cfg", TINY, *extra, "--set",
                           *overrides], cwd=cwd, capture_output=True, text=True, timeout=300)


def assert_one_line(result, *fragments):
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr[-3000:]
    assert all(fragment in errors[0] for fragment in fragments), errors[0]
    return errors[0]


# -- refused at load, before anything is written ----------------------------------------------------------
@pytest.mark.parametrize("overrides, fragments", [
    (["gpus", "0"], ["cannot run gpus '0' (this MXNet sees no GPU)", "--set gpus ''"]),
    (["TRAIN.lr_step", "abc"], ["config key TRAIN.lr_step: expected comma-separated epochs, got 'abc'"]),
    (["dataset.dataset", "cocoo"], ["dataset.dataset = 'cocoo': unknown dataset", "coco, pascal_voc, synthetic"]),
    (["TRAIN.SCALES", "[1.0]", "TRAIN.VALID_RANGES", "[[200, -1]]", "TRAIN.CHIP_SIZE", "128",
      "TRAIN.NEG_CHIP_MIN_PROPOSALS", "[1]"], ["TRAIN.CHIP_SIZE = 128: no valid box fits in a chip", "200 pixels"]),
    # the data's cheap facts: the class list (the synthetic set's, without generating it), the proposal file
    (["dataset.NUM_CLASSES", "7"], ["dataset.NUM_CLASSES is 7, but synthetic image set 'train'",
                                    "5 categories, i.e. 6 classes with background; set it to 6 or to 0"]),
    (["TRAIN.USE_NEG_CHIPS", "true", "dataset.proposal", "missing.npz"],
     ["cannot read proposal file missing.npz (dataset.proposal): No such file", "TRAIN.USE_NEG_CHIPS false"]),
])
def test_a_doomed_start_is_refused_in_one_line_leaving_nothing_behind(overrides, fragments, tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    result = run_train("output_path", str(out), "dataset.dataset_path", str(tmp_path / "data"), *overrides,
                       cwd=tmp_path)
    assert_one_line(result, *fragments)
    assert not out.exists() and not (tmp_path / "data").exists()  # no log, lock, run folder or generated data
    assert time.monotonic() - started < 60  # seconds (an MXNet import), not a data load


@pytest.mark.parametrize("overrides, fragments", [
    (["gpus", "0"], ["cannot run gpus '0' (this MXNet sees no GPU)", "--set gpus ''"]),
    (["dataset.NUM_CLASSES", "7"], ["dataset.NUM_CLASSES is 7", "set it to 6"]),
])
def test_the_negative_chip_pipeline_refuses_a_doomed_start_as_main_train_does(overrides, fragments, tmp_path):
    """tools/train_neg_chips.py (scripts/train_neg_props_and_sniper.sh) runs the same start checks."""
    out = tmp_path / "out"
    result = run_train("output_path", str(out), "dataset.dataset_path", str(tmp_path / "data"), *overrides,
                       cwd=tmp_path, program=os.path.join("tools", "train_neg_chips.py"))
    assert_one_line(result, *fragments)
    assert sorted(os.listdir(tmp_path)) == []  # no log, lock, run folder or generated data


@pytest.mark.parametrize("extract, image_set", [("false", "val"), ("true", "train")])
def test_a_test_refuses_a_class_count_its_image_set_contradicts_before_reading_it(extract, image_set, tmp_path):
    """main_test.py checks the image set it reads (the test set, or the training set it extracts proposals of)."""
    out = tmp_path / "out"
    result = run_train("output_path", str(out), "dataset.dataset_path", str(tmp_path / "data"),
                       "dataset.NUM_CLASSES", "7", "TEST.EXTRACT_PROPOSALS", extract, cwd=tmp_path,
                       program="main_test.py")
    assert_one_line(result, f"dataset.NUM_CLASSES is 7, but synthetic image set '{image_set}'", "set it to 6")
    assert sorted(os.listdir(tmp_path)) == []  # no log, results or generated data


def mx_gpu_count():
    import mxnet as mx

    return mx.context.num_gpus()


GPU_CONFIG = os.path.join(ROOT, "configs", "faster", "sniper_res101_e2e.yml")  # gpus 0-7, fp16 in training and test


@pytest.mark.parametrize("program, extra, keys", [
    ("main_train.py", [], ["gpus ''", "TRAIN.fp16 false"]),
    ("main_train.py", ["--eval"], ["gpus ''", "TRAIN.fp16 false", "TEST.fp16 false"]),
    ("main_test.py", [], ["gpus ''", "TEST.fp16 false"]),
    ("demo.py", ["--im_path", "x.jpg"], ["gpus ''", "TEST.fp16 false"]),
])
def test_a_gpu_config_on_a_cpu_machine_names_every_key_to_change_at_once(program, extra, keys, tmp_path):
    if mx_gpu_count():
        pytest.skip("this machine has a GPU")
    result = subprocess.run([sys.executable, os.path.join(ROOT, program), "--cfg", GPU_CONFIG, *extra, "--set",
                             "output_path", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    line = assert_one_line(result, f"--set {' '.join(keys)} (or run on a machine with GPUs)")
    assert line.count(".fp16 true") == len(keys) - 1
    assert sorted(os.listdir(tmp_path)) == []  # nothing written


@pytest.mark.parametrize("program, extra, section", [
    ("main_train.py", [], "TRAIN"), ("main_test.py", [], "TEST"), ("demo.py", ["--im_path", "x.jpg"], "TEST")])
def test_fp16_on_cpu_contexts_is_one_line_in_training_test_and_demo(program, extra, section, tmp_path):
    result = run_train("output_path", str(tmp_path / "out"), "dataset.dataset_path", str(tmp_path / "data"),
                       f"{section}.fp16", "true", cwd=tmp_path, extra=extra, program=program)
    assert_one_line(result, f"cannot run {section}.fp16 true (MXNet 1.9 cannot run a float16 network on the CPU)",
                    f"--set {section}.fp16 false")


def test_an_output_path_naming_a_file_is_refused_at_load(tmp_path):
    afile = tmp_path / "results.txt"
    afile.write_text("mine")
    result = run_train("output_path", str(afile), "dataset.dataset_path", str(tmp_path / "data"), cwd=tmp_path)
    assert_one_line(result, f"output_path = '{afile}'", "is a file, not a folder")
    assert afile.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["results.txt"]


# -- refused after the data is read: one console line, the traceback in the log file -------------------
def test_resume_without_a_readable_checkpoint_is_one_line_with_the_traceback_logged(tmp_path):
    out = tmp_path / "out"
    run = out / "sniper_synthetic_tiny"
    os.makedirs(run)
    for suffix in (".params", ".states"):  # {output_path}/{name}/{TRAIN.model_prefix}-0001...
        (run / f"SNIPER-0001{suffix}").write_bytes(b"truncated")
    result = run_train("output_path", str(out), "dataset.dataset_path", str(tmp_path / "data"),
                       "dataset.synthetic_train", "2", "dataset.synthetic_val", "0",
                       "dataset.root_path", str(tmp_path / "root"), cwd=tmp_path, extra=["--resume"])
    line = assert_one_line(result, "no readable checkpoint of", "SNIPER-0001.params", "--overwrite")
    assert "training stopped: error: " in line
    (log,) = glob.glob(str(run / "train_*.log"))
    with open(log) as f:
        text = f.read()
    assert "Traceback" in text and "no readable checkpoint of" in text


# -- the mechanism ---------------------------------------------------------------------------------------
@pytest.fixture()
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def _fail_inside_logged_outcome(tmp_path, error):
    setup_logging(str(tmp_path), name="run")
    with pytest.raises(SystemExit) as info, logged_outcome("training"):
        raise error
    (log,) = glob.glob(str(tmp_path / "run_*.log"))
    with open(log) as f:
        return info.value.code, f.read()


def test_a_user_error_is_one_console_line_and_a_logged_traceback(tmp_path, capsys, restore_logging):
    code, log = _fail_inside_logged_outcome(tmp_path, DataError("annotation file x.json: image id 3 appears twice"))
    console = capsys.readouterr().err.splitlines()
    assert code == 1 and len(console) == 1
    assert console[0].endswith("training stopped: error: annotation file x.json: image id 3 appears twice")
    assert "Traceback" in log and log.rstrip().endswith("DataError: annotation file x.json: image id 3 appears twice")


def test_a_defect_keeps_its_traceback_on_the_console(tmp_path, capsys, restore_logging):
    code, log = _fail_inside_logged_outcome(tmp_path, KeyError("cheese"))
    console = capsys.readouterr().err
    assert code == 1 and "Traceback" in console and "Traceback" in log


def test_ctrl_c_is_one_line_and_exit_code_130(tmp_path, capsys, restore_logging):
    code, log = _fail_inside_logged_outcome(tmp_path, KeyboardInterrupt())
    assert code == 130 and "Traceback" not in capsys.readouterr().err
    code, _ = _fail_inside_logged_outcome(tmp_path, Interrupted("training interrupted (Ctrl-C) in epoch 2; ..."))
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 130 and line.endswith("training stopped: training interrupted (Ctrl-C) in epoch 2; ...")


def test_before_logging_starts_a_user_error_is_its_line_alone(capsys):
    @report_user_errors
    def main():
        raise MachineError("config key gpus = '0' names gpu(0), but this MXNet sees 0 GPUs")

    @report_user_errors
    def defect():
        raise ZeroDivisionError("a bug")
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    assert capsys.readouterr().err == "error: config key gpus = '0' names gpu(0), but this MXNet sees 0 GPUs\n"
    with pytest.raises(ZeroDivisionError):
        defect()


def test_the_interrupted_training_says_where_it_stopped_and_how_to_resume(tmp_path):
    from lib.train import trainer
    from lib.train.progress import RunProgress

    prefix = str(tmp_path / "model")
    for epoch in (1, 2):
        for suffix in ("params", "states"):
            open(f"{prefix}-{epoch:04d}.{suffix}", "w").close()
    progress = RunProgress(None, 2, 5, 0)
    progress.start_epoch(2, 10)
    with pytest.raises(Interrupted) as info, trainer._interruption_said(prefix, progress):
        raise KeyboardInterrupt
    assert str(info.value) == ("training interrupted (Ctrl-C) in epoch 3; the last complete checkpoint is epoch 2: "
                               "the same command with --resume continues from epoch 3")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt, expected
def test_ctrl_c_that_a_finaliser_drops_still_stops_the_training(tmp_path):
    """A KeyboardInterrupt raised inside __del__ is printed and dropped by Python (it happened under load:
    the run trained on and exited 0); the remembered signal is raised again at the next batch."""
    from lib.train import trainer
    from lib.train.progress import RunProgress

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the finaliser

    progress = RunProgress(None, 0, 5, 0)
    progress.start_epoch(0, 10)
    reached, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted), trainer._interruption_said(str(tmp_path / "model"), progress):
        Finaliser()
        reached.append("after the finaliser")  # its KeyboardInterrupt was dropped
        trainer._CtrlC.raise_if_pending()
    assert reached and signal.getsignal(signal.SIGINT) is before  # the handler put back


# -- each case raises a UserError naming what is wrong ------------------------------------------------------
@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["categories"].append({"id": "x", "name": "bad"}), "category {'id': 'x', 'name': 'bad'} needs an "
                                                                   "integer 'id'"),
    (lambda d: d["images"].append(dict(d["images"][0])), "image id 1 appears twice"),
    (lambda d: d["annotations"].append(dict(d["annotations"][0])), "annotation id 1 appears twice"),
    (lambda d: d["annotations"].append(ann(9, 99, [1, 1, 5, 5])), "annotation 9 refers to image id 99"),
    (lambda d: d["images"].__setitem__(0, dict(d["images"][0], id="1")), "has no integer 'id'"),
])
def test_damaged_coco_files_are_data_errors_naming_file_and_id(tmp_path, mutate, message):
    path = write_coco(str(tmp_path), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    with open(path) as f:
        data = json.load(f)
    mutate(data)
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(DataError, match="instances_train.json") as info:
        CocoDataset(str(tmp_path), "train").load_entries()
    assert message in str(info.value)


def test_a_truncated_coco_file_is_a_data_error(tmp_path):
    path = write_coco(str(tmp_path), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    with open(path, "r+") as f:
        f.truncate(40)
    with pytest.raises(DataError, match="instances_train.json is not valid JSON"):
        CocoDataset(str(tmp_path), "train").load_entries()


@pytest.mark.parametrize("content, error, message", [
    (None, DataFileError, "cannot read proposal file"),
    (npz_bytes(**GOOD)[:60], DataError, "not a readable proposal .npz"),
    (npz_bytes(**{k: v for k, v in GOOD.items() if k != "offsets"}), DataError, "lacks array.* offsets"),
    (b"\x80\x04legacy pickle", DataError, "is a pickle .* tools/convert_proposals.py"),
])
def test_missing_truncated_malformed_or_pickled_proposals_are_user_errors(tmp_path, content, error, message):
    path = tmp_path / "proposals.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(error, match=message):
        read_proposals(str(path))
    with pytest.raises(error, match=message):  # the training start's check, from the file's index alone
        check_proposal_file(str(path))


def test_every_box_invalid_is_a_data_error_not_an_empty_run():
    entries = [{"id": i, "boxes": np.zeros((0, 4), np.float32), "gt_classes": np.zeros(0, np.int32),
                "difficult": np.zeros(0, bool), "crowd_boxes": np.zeros((0, 4), np.float32)} for i in (1, 2)]
    with pytest.raises(DataError, match="none of the 2 training images has a usable box"):
        training_roidb(entries, flip=False)


def test_no_chips_mined_is_a_data_error_naming_the_keys():
    with pytest.raises(DataError, match="no chips were mined.*TRAIN.CHIP_SIZE"):
        EpochPlan([], stride=32, batch_size=2, seed=0, epoch=0, shuffle=False)


def test_every_training_image_unreadable_is_a_data_error(synthetic_dataset, tmp_path):
    from lib.data import ChipLoader
    from lib.dataset import load_roidb

    copy = tmp_path / "synthetic"
    shutil.copytree(synthetic_dataset(train=2, val=0), copy)
    cfg = load_config(None, [("dataset.dataset_path", str(copy)), ("dataset.image_set", "train"),
                             ("dataset.root_path", str(tmp_path / "root"))])
    roidb = load_roidb(cfg, "train")[0]
    for entry in roidb:
        with open(entry["image"], "wb") as f:
            f.write(b"not an image")
    with pytest.raises(DataError, match="replacement chips in a row came from unreadable images"):
        with ChipLoader(roidb, cfg, 2, num_workers=0) as loader:
            for _ in loader:
                pass


def _wait():
    time.sleep(60)


def test_a_worker_killed_with_sigkill_is_a_machine_error_naming_it():
    pool = ProcessPool(lambda task: _wait(), 1)
    try:
        pool.submit("task")
        os.kill(pool.pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        with pytest.raises(WorkerDiedError, match=f"pid {pool.pids[0]}.*SIGKILL") as info:
            while time.monotonic() < deadline:
                pool.get()
        assert isinstance(info.value, UserError)
    finally:
        pool.close()


def test_the_error_types_keep_the_builtin_types_their_callers_catch():
    assert issubclass(DataError, ValueError) and issubclass(DataFileError, OSError)
    assert issubclass(ConfigError, UserError) and issubclass(MachineError, UserError)
    with pytest.raises(ConfigError, match="TRAIN.lr_step: expected comma-separated epochs, got '2,x'"):
        load_config(None, {"TRAIN.lr_step": "2,x"})


def test_a_run_folder_in_use_is_refused_before_a_log_file_is_made(tmp_path):
    from lib.run.lock import run_lock

    out = tmp_path / "out"
    run = out / "sniper_synthetic_tiny"
    with run_lock(str(run)):  # another training run holds the folder
        result = run_train("output_path", str(out), "dataset.dataset_path", str(tmp_path / "data"), cwd=tmp_path)
    assert_one_line(result, f"run folder {run} is in use by another training run (pid {os.getpid()}")
    assert sorted(os.listdir(run)) == ["train.lock"] and not (tmp_path / "data").exists()


def test_ctrl_c_during_training_is_one_line_saying_how_to_resume(tmp_path):
    """SIGINT to a real training run (a worker process loading chips): exit 130, no traceback, one line naming
    the epoch and the --resume command's first epoch."""
    argv = [sys.executable, os.path.join(ROOT, "main_train.py"), "--cfg", TINY, "--set", "output_path", "out",
            "dataset.dataset_path", "data/synthetic", "dataset.root_path", "data", "dataset.synthetic_train", "2",
            "dataset.synthetic_val", "0", "TRAIN.end_epoch", "5", "TRAIN.BATCH_IMAGES", "2", "gpus", "cpu:1",
            "TRAIN.NUM_PROCESS", "1", "default.frequent", "1", "TRAIN.FLIP", "false"]
    process = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if " batch[1/" in line:  # training runs: interrupt it
                process.send_signal(signal.SIGINT)
                break
        lines += process.stderr.readlines()
        code = process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(lines)
    assert code == 130 and "Traceback" not in text, text[-3000:]
    assert re.search(r"training stopped: training interrupted \(Ctrl-C\) in epoch 1; the last complete checkpoint "
                     r"is epoch 0: the same command with --resume continues from epoch 1$", text.rstrip()), text[-2000:]
