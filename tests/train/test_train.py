"""Training loop (issue 5): loss falls, resume is exact, frozen params stay, divergence stops cleanly,
checkpoints are atomic and store the de-normalised regressor, and the optimizer schedule is right."""
import glob
import json
import logging
import os
import re
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

from lib.atomic import write_json
from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from lib.run import checkpoint
from lib.train.optimizer import lr_steps, make_optimizer_params
from lib.train import trainer
from lib.run.folder import check_resume_config, write_run_config
from lib.run.lock import RunFolderError, clear_later_epochs, run_lock
from lib.start_checks import check_run_folder
from lib.train.trainer import TrainingDiverged, train

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
TINY_MASK = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny_mask.yml")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("synthetic") / "data")


def tiny_cfg(data_dir, out_dir, config=TINY, **overrides):
    base = {
        "dataset.dataset_path": data_dir, "dataset.synthetic_train": "2", "dataset.synthetic_val": "1",
        "dataset.root_path": str(out_dir), "output_path": str(out_dir), "TRAIN.NUM_PROCESS": "0",
        "TRAIN.BATCH_IMAGES": "2", "TRAIN.end_epoch": "2", "TRAIN.warmup_step": "5", "TRAIN.lr_step": "",
        "gpus": "cpu:1",
    }
    base.update(overrides)
    return load_config(config, list(base.items()))


def params_of(prefix, epoch):
    args, aux = checkpoint.load_params(checkpoint.params_path(prefix, epoch))
    return {k: v.asnumpy() for k, v in {**args, **aux}.items()}


def test_loss_falls_on_two_cpu_contexts(data_dir, tmp_path):
    cfg = tiny_cfg(data_dir, tmp_path, **{"gpus": "cpu:2", "TRAIN.end_epoch": "4", "TRAIN.lr": "0.01"})
    prefix, history = train(cfg)
    assert len(history) == 4
    first, last = history[0], history[-1]
    assert last["RCNNLogLoss"] < 0.7 * first["RCNNLogLoss"]
    assert last["RPNLogLoss"] < first["RPNLogLoss"]
    for epoch in range(1, 5):
        assert os.path.isfile(checkpoint.params_path(prefix, epoch))
        assert os.path.isfile(checkpoint.states_path(prefix, epoch))
    assert checkpoint.last_complete_epoch(prefix) == 4
    with open(os.path.join(checkpoint.output_dir(cfg), "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    # one record per periodic log line: at least every epoch's last batch, iterations counting on
    assert [r["epoch"] for r in records if r["batch"] == r["batches"]] == [1, 2, 3, 4]
    assert all(b["iteration"] > a["iteration"] for a, b in zip(records, records[1:]))
    assert records[-1]["RCNNLogLoss"] == pytest.approx(last["RCNNLogLoss"], rel=1e-6)
    assert all(r["chips_per_s"] > 0 and r["lr"] > 0 for r in records)


def test_the_embedded_mask_config_trains_and_logs_a_finite_mask_loss(data_dir, tmp_path, caplog):
    """configs/faster/sniper_synthetic_tiny_mask.yml on the tiny synthetic set, one short epoch (about 10 s
    on one core): every periodic log line and metrics.jsonl record carries a finite MaskLogLoss, as does
    the epoch's history."""
    cfg = tiny_cfg(data_dir, tmp_path, TINY_MASK, **{"TRAIN.end_epoch": "1", "default.frequent": "4"})
    assert cfg.TRAIN.WITH_MASK
    with caplog.at_level(logging.INFO, logger="lib.train.trainer"):
        prefix, history = train(cfg)
    logged = re.findall(r"epoch\[1\] batch\[\d+/\d+\].* MaskLogLoss=(\S+)", caplog.text)
    with open(os.path.join(checkpoint.output_dir(cfg), "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert logged and len(logged) == len(records) >= 2
    assert all(np.isfinite(float(value)) and float(value) > 0 for value in logged)
    assert all(np.isfinite(r["MaskLogLoss"]) and r["MaskLogLoss"] > 0 for r in records)
    assert np.isfinite(history[-1]["MaskLogLoss"]) and os.path.isfile(checkpoint.params_path(prefix, 1))


def test_resume_reproduces_uninterrupted_run_and_fixed_params_stay(data_dir, tmp_path):
    fixed = {"network.FIXED_PARAMS": "[conv0, stage1]"}
    straight, _ = train(tiny_cfg(data_dir, tmp_path / "straight", **fixed))
    interrupted_cfg = tiny_cfg(data_dir, tmp_path / "resumed", **fixed, **{"TRAIN.end_epoch": "1"})
    resumed_prefix, _ = train(interrupted_cfg)
    resumed_prefix, history = train(tiny_cfg(data_dir, tmp_path / "resumed", **fixed), resume=True)
    assert len(history) == 1  # only epoch 2 ran
    expected, got = params_of(straight, 2), params_of(resumed_prefix, 2)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    epoch1 = params_of(straight, 1)
    frozen = [n for n in expected if n.startswith(("conv0", "stage1")) and not n.endswith(("moving_mean", "moving_var"))]
    assert frozen
    for name in frozen:
        np.testing.assert_array_equal(expected[name], epoch1[name], err_msg=name)
    trained = [n for n in expected if n.startswith("stage3") and n.endswith("weight")]
    assert any(not np.array_equal(expected[n], epoch1[n]) for n in trained)


def test_divergence_stops_before_update_and_keeps_last_checkpoint(data_dir, tmp_path):
    prefix, _ = train(tiny_cfg(data_dir, tmp_path, **{"TRAIN.end_epoch": "1"}))
    good = params_of(prefix, 1)
    diverging = tiny_cfg(data_dir, tmp_path, **{"TRAIN.lr": "1e30", "TRAIN.warmup": "false"})
    record = os.path.join(checkpoint.output_dir(diverging), "config.yaml")
    kept_record = open(record).read()
    # --resume with another learning rate is refused (issue 35), naming the keys; the run record is untouched
    with pytest.raises(RunFolderError, match=re.escape("were trained with other settings") + ".*"
                       + re.escape("TRAIN.lr 0.015 -> 1e+30; TRAIN.warmup True -> False; put them back")):
        train(diverging, resume=True)
    assert open(record).read() == kept_record
    write_run_config(diverging)  # a run trained at that rate from the start: its record says so
    with pytest.raises(TrainingDiverged, match=r"epoch 2 iteration \d+: \w+ is (nan|inf)"):
        train(diverging, resume=True)
    assert checkpoint.last_complete_epoch(prefix) == 1
    assert not os.path.exists(checkpoint.params_path(prefix, 2))
    kept = params_of(prefix, 1)
    for name in good:
        np.testing.assert_array_equal(kept[name], good[name])


def test_every_epoch_logs_the_loader_stats(data_dir, tmp_path, monkeypatch, caplog):
    def data_only_epoch(cfg, module, loader, metric, epoch, num_workers, progress):
        return sum(1 for _ in loader)  # the loader builds every chip; nothing is trained

    monkeypatch.setattr(trainer, "_train_epoch", data_only_epoch)
    with caplog.at_level(logging.INFO, logger="lib.train.trainer"):
        train(tiny_cfg(data_dir, tmp_path, **{"TRAIN.end_epoch": "2"}))
    logged = re.findall(r"data loader: (\d+) chips \((\d+) negative\), per chip: decode [\d.]+ ms.*"
                        r"after epoch (\d+)", caplog.text)  # as emitted, not the final totals
    assert [int(epoch) for _, _, epoch in logged] == [1, 2]
    first, second = (int(chips) for chips, _, _ in logged)
    assert 0 < first < second  # running totals


def test_resume_after_a_damaged_last_checkpoint_and_a_killed_write_continues_from_the_epoch_before(
        data_dir, tmp_path, caplog):
    cfg = tiny_cfg(data_dir, tmp_path)
    prefix, _ = train(cfg)
    expected = params_of(prefix, 2)
    last = checkpoint.params_path(prefix, 2)
    with open(last, "r+b") as f:  # a truncated copy of the last checkpoint
        f.truncate(os.path.getsize(last) // 2)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = os.path.join(os.path.dirname(prefix), f".tmp-{int(dead.stdout)}-0-{os.path.basename(last)}")
    with open(leftover, "wb") as f:  # what a write killed by SIGKILL leaves
        f.write(b"partial")
    with caplog.at_level(logging.WARNING):
        train(cfg, resume=True)
    assert re.search(rf"removed {re.escape(leftover)} \(7 bytes\), left by an interrupted write", caplog.text)
    assert not os.path.exists(leftover)
    assert re.search(rf"resuming from epoch 1, the newest readable checkpoint: skipped damaged {re.escape(last)} ",
                     caplog.text)
    got = params_of(prefix, 2)  # epoch 2 trained again from epoch 1: what the first run had (as resume above)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_resume_compares_the_settings_with_the_run_record_allowing_the_schedule_and_logging(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(TINY, [("output_path", "runs"), ("dataset.dataset_path", "data/mine")])
    with pytest.raises(RunFolderError, match=r"holds checkpoints but no config.yaml: --resume cannot check"):
        check_resume_config(cfg)
    write_run_config(cfg)
    check_resume_config(cfg)  # the same settings
    allowed = {"TRAIN.end_epoch": "9", "TRAIN.lr_step": "8", "default.frequent": "5", "TRAIN.EVAL_EVERY": "1",
               "TRAIN.EARLY_STOP": "2", "TRAIN.KEEP_CHECKPOINTS": "3", "TRAIN.NUM_PROCESS": "1", "gpus": "0,1"}
    check_resume_config(with_overrides(cfg, allowed))
    # the case: an 8-image run resumed as the 200-image one, one line naming every key that differs
    other = with_overrides(cfg, {"dataset.synthetic_train": "8", "TRAIN.BATCH_IMAGES": "2", "TRAIN.end_epoch": "9",
                                 "gpus": "cpu:3"})
    with pytest.raises(RunFolderError) as refused:
        check_resume_config(other)
    message = str(refused.value)
    assert "\n" not in message
    assert ("gpus 'cpu:2' -> 'cpu:3'; dataset.synthetic_train 200 -> 8; TRAIN.BATCH_IMAGES 4 -> 2; put them back"
            in message)
    assert "end_epoch" not in message
    # a relative path names another folder from another working directory: compared as the files they name
    # (the saved ones relative to the training's directory, which the checkpoint's metadata records)
    folder, prefix = checkpoint.output_dir(cfg), checkpoint.checkpoint_prefix(cfg)
    write_json({"model": {"symbol": cfg.symbol, "rpn_only": False, "NUM_CLASSES": 1, "classes": ["__background__"],
                          "workdir": os.path.relpath(tmp_path, folder)}}, checkpoint.progress_path(prefix, 1))
    open(checkpoint.params_path(prefix, 1), "w").close()
    os.makedirs(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    moved = with_overrides(cfg, {"output_path": str(tmp_path / "runs")})
    with pytest.raises(RunFolderError, match=re.escape(f"dataset.dataset_path '{tmp_path}/data/mine' -> "
                                                       f"'{tmp_path}/elsewhere/data/mine'")):
        check_resume_config(moved)
    same = with_overrides(moved, {"dataset.dataset_path": str(tmp_path / "data" / "mine"),
                                  "dataset.root_path": str(tmp_path / "data")})
    check_resume_config(same)
    # the start check (main_train.py, the pipelines' stages, whose finished ones are skipped) refuses before the
    # log file is made; a record of another prefix (a pipeline's other stage, sharing the folder) is not checked
    with pytest.raises(RunFolderError, match="dataset.synthetic_train 200 -> 8; put them back"):
        check_run_folder(with_overrides(same, {"dataset.synthetic_train": "8"}), resume=True, overwrite=False)
    open(checkpoint.params_path(checkpoint.checkpoint_prefix(moved) + "_rpn", 1), "w").close()
    check_run_folder(with_overrides(same, {"dataset.synthetic_train": "8", "TRAIN.model_prefix": "SNIPER_rpn"}),
                     resume=True, overwrite=False)


def test_run_paths_follow_output_path_config_name_and_prefix():
    cfg = load_config(None, [("output_path", "/runs"), ("TRAIN.model_prefix", "MODEL")])
    assert checkpoint.output_dir(cfg) == os.path.join("/runs", "default")
    assert checkpoint.checkpoint_prefix(cfg) == os.path.join("/runs", "default", "MODEL")
    assert checkpoint.params_path(checkpoint.checkpoint_prefix(cfg), 3) == "/runs/default/MODEL-0003.params"


def test_checkpoint_stores_denormalised_regressor_and_round_trips(tmp_path):
    prefix = str(tmp_path / "model")
    weight = np.arange(8, dtype=np.float32).reshape(4, 2)
    bias = np.array([1, 2, 3, 4], np.float32)
    args = {"bbox_pred_weight": mx.nd.array(weight), "bbox_pred_bias": mx.nd.array(bias), "w": mx.nd.ones(3)}
    aux = {"bn_moving_mean": mx.nd.zeros(2)}
    stds, means = [0.1, 0.1, 0.2, 0.2], [0, 0, 0, 0]
    checkpoint.save_checkpoint(prefix, 3, None, args, aux, stds, means, states={})
    stored_args, stored_aux = checkpoint.load_params(checkpoint.params_path(prefix, 3))
    # test network: regressor multiplied back by the stds, row by row
    np.testing.assert_allclose(stored_args["bbox_pred_weight"].asnumpy(),
                               [[0, 0.1], [0.2, 0.3], [0.8, 1.0], [1.2, 1.4]], rtol=1e-6)
    np.testing.assert_allclose(stored_args["bbox_pred_bias"].asnumpy(), [0.1, 0.2, 0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(stored_aux["bn_moving_mean"].asnumpy(), [0, 0])
    train_args, _ = checkpoint.load_training_checkpoint(prefix, 3, stds, means)
    np.testing.assert_allclose(train_args["bbox_pred_weight"].asnumpy(), weight, rtol=1e-6)
    np.testing.assert_allclose(train_args["bbox_pred_bias"].asnumpy(), bias, rtol=1e-6)
    assert checkpoint.last_complete_epoch(prefix) == 3


def test_a_reference_checkpoint_reads_with_its_test_ready_regressor(tmp_path):
    # the reference's checkpoint callback saves arg:bbox_pred_weight (training, normalised) beside
    # arg:bbox_pred_weight_test (multiplied by the stds), as mx.model.save_checkpoint writes them
    weight, bias = np.ones((4, 2), np.float32), np.ones(4, np.float32)
    stds = np.array([0.1, 0.1, 0.2, 0.2], np.float32)
    path = str(tmp_path / "SNIPER-0007.params")
    mx.nd.save(path, {"arg:bbox_pred_weight": mx.nd.array(weight), "arg:bbox_pred_bias": mx.nd.array(bias),
                      "arg:bbox_pred_weight_test": mx.nd.array(weight * stds[:, None]),
                      "arg:bbox_pred_bias_test": mx.nd.array(bias * stds), "arg:conv0_weight": mx.nd.ones(3),
                      "aux:bn0_moving_var": mx.nd.ones(2)})
    args, aux, training = checkpoint.load_params(path, with_training_values=True)
    assert sorted(args) == ["bbox_pred_bias", "bbox_pred_weight", "conv0_weight"] and sorted(aux) == ["bn0_moving_var"]
    np.testing.assert_allclose(args["bbox_pred_weight"].asnumpy(), [[0.1, 0.1], [0.1, 0.1], [0.2, 0.2], [0.2, 0.2]])
    np.testing.assert_allclose(args["bbox_pred_bias"].asnumpy(), stds)
    assert sorted(training) == ["bbox_pred_bias", "bbox_pred_weight"]
    np.testing.assert_array_equal(training["bbox_pred_weight"].asnumpy(), weight)


def test_interrupted_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    prefix = str(tmp_path / "model")

    def crash(path, arrays):
        open(path, "w").write("partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(mx.nd, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(prefix, 1, None, {"w": mx.nd.ones(2)}, {}, [1] * 4, [0] * 4, states={})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    assert checkpoint.last_complete_epoch(prefix) == 0
    # params without optimizer states do not count as a complete epoch
    checkpoint.save_checkpoint(prefix, 2, None, {"w": mx.nd.ones(2)}, {}, [1] * 4, [0] * 4)
    assert checkpoint.last_complete_epoch(prefix) == 0


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "bad-0001.params"
    path.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="bad-0001.params"):
        checkpoint.load_params(str(path))
    with pytest.raises(FileNotFoundError, match="absent"):
        checkpoint.load_params(str(tmp_path / "absent.params"))


def test_schedule_warmup_steps_and_fp16_rescaling():
    cfg = load_config(None, [("TRAIN.lr", "0.015"), ("TRAIN.warmup_lr", "0.0005"), ("TRAIN.warmup_step", "10"),
                             ("TRAIN.lr_step", "5.33"), ("TRAIN.wd", "0.0001")])
    assert lr_steps(cfg, 100) == [533]
    assert lr_steps(with_overrides(cfg, {"TRAIN.lr_step": "8,6", "TRAIN.end_epoch": 12}), 10) == [60, 80]
    assert lr_steps(with_overrides(cfg, {"TRAIN.lr_step": ""}), 10) == []
    params = make_optimizer_params(cfg, iters_per_epoch=100, num_update=0, fp16=False)
    schedule = params["lr_scheduler"]
    assert schedule(0) == pytest.approx(0.0005)
    assert schedule(5) == pytest.approx(0.0005 + 0.5 * (0.015 - 0.0005))
    assert schedule(100) == pytest.approx(0.015)
    assert schedule(534) == pytest.approx(0.0015)
    half = make_optimizer_params(cfg, iters_per_epoch=100, num_update=50, fp16=True)
    # fp16: lr / 100 and wd * 100, so lr/S * (S*g + wd*S*w) is the fp32 update; fp32 master weights
    assert half["learning_rate"] == pytest.approx(0.015 / 100)
    assert half["wd"] == pytest.approx(0.0001 * 100)
    assert half["multi_precision"] is True and half["begin_num_update"] == 50


# -- the run folder ----------------------------------------------------------------------------------
def fake_epochs(prefix, files):
    """Stand-ins for an earlier run's epoch files: ``{suffix: text}``, e.g. ``{"-0003.params": "old 3"}``."""
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    for suffix, text in files.items():
        with open(prefix + suffix, "w") as f:
            f.write(text)


def test_a_fresh_start_over_earlier_epochs_is_refused_and_overwrite_moves_them_aside(data_dir, tmp_path):
    cfg = tiny_cfg(data_dir, tmp_path, **{"TRAIN.end_epoch": "1"})
    prefix = checkpoint.checkpoint_prefix(cfg)
    old = {"-0001.params": "old 1", "-0001.states": "old 1 states", "-0003.params": "old 3",
           "-0003.states": "old 3 states", "-0003.progress.json": "{}"}
    fake_epochs(prefix, old)
    fake_epochs(prefix + "_rpn", {"-0001.params": "another prefix: not in the way"})
    folder = checkpoint.output_dir(cfg)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.write('{"iteration": 1}\n')
    with pytest.raises(RunFolderError, match=re.escape(
            f"{folder} already holds epochs 1, 3 of SNIPER (e.g. {prefix}-0003.params); starting at "
            f"epoch 1 would overwrite them: pass --resume to continue that run, or --overwrite")):
        train(cfg)
    assert checkpoint.last_complete_epoch(prefix) == 3  # untouched

    train(cfg, overwrite=True)
    (moved,) = glob.glob(os.path.join(folder, "replaced_*"))
    assert sorted(os.listdir(moved)) == sorted(["SNIPER" + suffix for suffix in old] + ["metrics.jsonl"])
    for suffix, text in old.items():
        with open(os.path.join(moved, "SNIPER" + suffix)) as f:
            assert f.read() == text
    # the old epoch 3 no longer passes for this run's latest: a resume continues the new run
    assert checkpoint.last_complete_epoch(prefix) == 1 and not os.path.exists(prefix + "-0003.params")
    assert params_of(prefix, 1)
    assert os.path.isfile(prefix + "_rpn-0001.params")
    # resuming and starting from a given epoch leave earlier epochs alone
    train(cfg, resume=True)
    assert checkpoint.last_complete_epoch(prefix) == 1


@pytest.mark.parametrize("begin_epoch", [0, 1])
def test_overwrite_also_moves_the_evaluations_of_the_replaced_epochs_and_the_results(tmp_path, begin_epoch,
                                                                                      monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run"
    prefix = str(folder / "SNIPER")
    fake_epochs(prefix, {"-0001.params": "1", "-0002.params": "2", "-0003.params": "3"})
    for path in ("evaluations/epoch_0001/summary.json", "evaluations/epoch_0002/summary.json",
                 "results/val/test_summary.json", "results/images_mine/detections_results.json"):
        os.makedirs(os.path.dirname(folder / path), exist_ok=True)
        (folder / path).write_text(path)
    with caplog.at_level(logging.WARNING):
        moved = clear_later_epochs(prefix, begin_epoch, overwrite=True)
    # the message names the folder relative to the current one, and what went there
    assert caplog.text.rstrip().endswith(f"evaluations/epoch_0002/, results/ to run/{os.path.basename(moved)}")
    left = sorted(os.path.relpath(os.path.join(parent, name), folder) for parent, _, names in os.walk(folder)
                  for name in names if not parent.startswith(moved))
    kept = ["SNIPER-0001.params", "evaluations/epoch_0001/summary.json"] if begin_epoch else []
    assert left == kept  # a start at epoch 2 keeps epoch 1 and its evaluation; at 1 nothing describes the old run
    taken = ["evaluations/epoch_0002/summary.json", "results/images_mine/detections_results.json",
             "results/val/test_summary.json", "SNIPER-0002.params", "SNIPER-0003.params"]
    taken += [] if begin_epoch else ["SNIPER-0001.params", "evaluations/epoch_0001/summary.json"]
    assert sorted(os.path.relpath(os.path.join(parent, name), moved) for parent, _, names in os.walk(moved)
                  for name in names) == sorted(taken)
    assert (tmp_path / "run" / os.path.relpath(moved, folder) / "results/val/test_summary.json").read_text() == \
        "results/val/test_summary.json"


def hold_lock(folder):
    """Another process holding the run folder until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from lib.run.lock import run_lock
        with run_lock({folder!r}):
            print("locked", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_a_second_run_on_a_held_folder_names_the_folder_and_the_holder(data_dir, tmp_path):
    cfg = tiny_cfg(data_dir, tmp_path)
    folder = checkpoint.output_dir(cfg)
    holder = hold_lock(folder)
    try:
        with pytest.raises(RunFolderError, match=re.escape(f"run folder {folder} is in use by another training run "
                                                           f"(pid {holder.pid}, lock file {folder}/train.lock)")):
            train(cfg)
    finally:
        holder.stdin.close()
        holder.wait(30)
    with run_lock(folder):  # released when its holder ended
        with pytest.raises(RunFolderError, match=f"pid {os.getpid()}"):
            with run_lock(folder):
                pass
    assert os.listdir(folder) == ["train.lock"]  # the refused run wrote nothing


def test_main_train_refuses_a_second_start_from_scratch_in_one_line(tmp_path):
    out = tmp_path / "out"
    prefix = str(out / "sniper_synthetic_tiny" / "SNIPER")
    fake_epochs(prefix, {"-0001.params": "", "-0001.states": ""})
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main_train.py"), "--cfg", TINY, "--set",
                             "output_path", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()  # refused before logging starts: the one line, and no log file left
    assert not glob.glob(str(out / "sniper_synthetic_tiny" / "train_*.log"))
    assert len(lines) == 1 and lines[0] == (
        f"error: {out / 'sniper_synthetic_tiny'} already holds epochs 1 of SNIPER (e.g. "
        f"{prefix}-0001.params); starting at epoch 1 would overwrite them: pass --resume to continue that run, or "
        f"--overwrite to move them to {out / 'sniper_synthetic_tiny' / 'replaced_<time>'} and start over")
    both = subprocess.run([sys.executable, os.path.join(ROOT, "main_train.py"), "--cfg", TINY, "--resume",
                           "--overwrite"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
