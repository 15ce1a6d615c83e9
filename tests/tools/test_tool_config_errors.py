"""The tools' command lines (tools/NAME.py): every tool that takes a config stops on a config mistake
with the one-line message of lib.config, before doing any work, never with a traceback."""
import ast
import glob
import os
import subprocess
import sys

import pytest

from lib.bootstrap import ROOT

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
# each tool with the arguments it needs besides --cfg / --set
CONFIG_TOOLS = {
    "pixel_budget.py": [], "visualize_chips.py": ["1"], "visualize_batch.py": [], "ablation_synthetic.py": [],
    "train_neg_chips.py": [], "benchmark_inference.py": [], "benchmark_iterator.py": [], "benchmark_kvstore.py": [],
    "benchmark_autofocus.py": [], "visualize_focus.py": ["1"], "fit_scales.py": [],
    "proposal_recall.py": ["--proposals", "proposals.npz"], "benchmark_masks.py": [], "compare_deformable_ops.py": [],
    "compare_backends.py": [], "onnx_gpu_model.py": ["--out", "model"],
}


def run_tool(tool, *argv, cwd=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), *CONFIG_TOOLS[tool], *argv],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("tool", sorted(CONFIG_TOOLS))
def test_a_bad_set_key_is_one_line(tool, tmp_path):
    result = run_tool(tool, "--cfg", TINY, "--set", "TRAIN.NO_SUCH_KEY", "1", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "config error: unknown config key TRAIN.NO_SUCH_KEY\n"
    assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.parametrize("variants", ["single,sniper", "sniper_neg"])
def test_a_doomed_ablation_is_refused_in_one_line_before_anything_is_written(variants, tmp_path):
    out = tmp_path / "out"  # gpus 0 on a machine without a GPU: every variant's start is checked first
    result = run_tool("ablation_synthetic.py", "--cfg", TINY, "--variants", variants, "--out", str(out),
                      "--set", "gpus", "0", "dataset.root_path", str(tmp_path / "root"), cwd=tmp_path)
    assert result.returncode == 1 and "gpus" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and not out.exists() and not (tmp_path / "root").exists()


@pytest.mark.parametrize("tool", ["pixel_budget.py", "visualize_chips.py", "visualize_batch.py"])
def test_a_missing_config_file_is_one_line(tool, tmp_path):
    missing = tmp_path / "missing.yml"
    result = run_tool(tool, "--cfg", str(missing))
    assert result.returncode == 1
    assert result.stderr == f"config error: cannot read config file {missing}: No such file or directory\n"


@pytest.mark.parametrize("tool", ["benchmark_autofocus.py", "visualize_focus.py"])
def test_autofocus_tools_refuse_a_config_without_autofocus(tool, tmp_path):
    result = run_tool(tool, "--cfg", TINY, cwd=tmp_path)
    assert result.returncode == 1 and "TEST.AUTO_FOCUS is false" in result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback
    assert os.listdir(tmp_path) == []


def test_a_bad_value_and_a_missing_cfg_option():
    result = run_tool("visualize_chips.py", "--cfg", TINY, "--set", "TRAIN.BATCH_IMAGES", "many")
    assert result.returncode == 1 and "TRAIN.BATCH_IMAGES" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    result = run_tool("pixel_budget.py")
    assert result.returncode == 2 and "the following arguments are required: --cfg" in result.stderr


def test_inference_benchmark_with_a_null_forward_reports_each_worker_count(tmp_path):
    result = run_tool("benchmark_inference.py", "--cfg", TINY, "--null-forward", "--images", "3", "--runs", "1",
                      "--image_size", "60", "80", "--workers", "0", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert rows[0].split("|")[1].strip() == "TEST.NUM_PROCESS"
    assert [row.split("|")[1].strip() for row in rows[2:]] == ["0", "1"]
    assert all(float(row.split("|")[2]) > 0 for row in rows[2:])


def test_iterator_benchmark_generates_images_and_compares_cache_sizes(tmp_path):
    result = run_tool("benchmark_iterator.py", "--cfg", TINY, "--synthetic", "400x300", "--images", "2",
                      "--batches", "0", "--workers", "0,1", "--cache-mb", "0,64", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in result.stdout.splitlines()
            if line.startswith("| generated")]
    header = [cell.strip() for cell in result.stdout.split("\n| images")[1].split("\n")[0].split("|")[1:-1]]
    columns = dict(zip(["images"] + header, zip(*rows)))
    assert columns["processes"] == ("0 (inline)", "0 (inline)", "1", "1")
    assert columns["cache MB"] == ("0", "64", "0", "64")
    # a whole cold epoch: without the cache every chip decodes its image; with it, each of the 2 files once
    entries, chips_each = columns["entries (chips each)"][0].replace("(", "").replace(")", "").split()
    chips = int(entries) * float(chips_each)
    assert int(entries) == 4 and chips > 4
    decodes = [float(v) for v in columns["decodes/chip"]]
    assert decodes[0] == decodes[2] == 1.0
    assert decodes[1] == decodes[3] == pytest.approx(2 / chips, abs=0.01)
    assert columns["vs cache 0"][0] == "-" and columns["vs cache 0"][1].endswith("x")
    bad = run_tool("benchmark_iterator.py", "--cfg", TINY, "--synthetic", "400", cwd=tmp_path)
    assert bad.returncode == 2 and "--synthetic: expected comma-separated WIDTHxHEIGHT" in bad.stderr


def test_inference_benchmark_says_when_each_row_starts_and_ends(tmp_path):
    result = run_tool("benchmark_inference.py", "--cfg", TINY, "--set", "TEST.NUM_PROCESS", "0", "--no_gluoncv",
                      "--images", "1", "--runs", "1", "--image_size", "64", "96", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    progress = [line for line in result.stderr.splitlines() if line.startswith("benchmark_inference: ")]
    assert [line.split(":")[1].strip() for line in progress] == [
        "row 1/2", "row 1/2 done", "row 2/2", "row 2/2 done"]
    assert progress[1].startswith("benchmark_inference: row 1/2 done: SNIPER resnet_tiny, single-scale: ")
    assert progress[1].endswith(" images/s")
    table = [line for line in result.stdout.splitlines() if line.startswith("| SNIPER")]
    assert len(table) == 2  # the table still comes, on stdout


@pytest.mark.parametrize("tool", ["visualize_chips.py", "pixel_budget.py", "fit_scales.py", "proposal_recall.py"])
def test_a_damaged_dataset_is_one_line_in_a_tool_too(tool, tmp_path):
    annotations = tmp_path / "mine" / "annotations"
    annotations.mkdir(parents=True)
    (annotations / "instances_train.json").write_text('{"images": [{"id": 1, "file_na')  # truncated
    result = run_tool(tool, "--cfg", TINY, "--set", "dataset.dataset", "coco", "dataset.dataset_path",
                      str(tmp_path / "mine"), "dataset.root_path", str(tmp_path / "root"), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: COCO annotation file ") and "instances_train.json is not valid JSON" in last


def test_a_damaged_variant_source_is_one_line(tmp_path):
    (tmp_path / "source" / "annotations").mkdir(parents=True)
    (tmp_path / "source" / "annotations" / "instances_train.json").write_text('{"images": [')
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_variant_set.py"), "--source",
                             str(tmp_path / "source"), "--out", str(tmp_path / "out"), "--train", "1", "--val", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert result.stderr.startswith("error: COCO annotation file ") and "is not valid JSON" in result.stderr


# Calls that read a config or data a user gives: a tool making them reports a user's mistake in one line.
READS_USER_INPUT = {"load_config", "config_from_arguments", "config_from_model_arguments", "load_roidb",
                    "read_proposals", "read_image", "read_coco_json", "NegChipPipeline", "small_object_set",
                    "add_empty_images"}


def test_every_tool_that_reads_a_config_or_data_reports_a_users_mistake_in_one_line():
    checked, undecorated = [], []
    for path in sorted(glob.glob(os.path.join(ROOT, "tools", "**", "*.py"), recursive=True)):
        with open(path) as f:
            tree = ast.parse(f.read())
        called = {node.func.id if isinstance(node.func, ast.Name) else node.func.attr for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))}
        mains = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
        if mains and called & READS_USER_INPUT:
            checked.append(os.path.basename(path))
            if "report_user_errors" not in {d.id for d in mains[0].decorator_list if isinstance(d, ast.Name)}:
                undecorated.append(os.path.relpath(path, ROOT))
    assert {"fit_scales.py", "proposal_recall.py", "train_neg_chips.py", "make_variant_set.py"} <= set(checked)
    assert undecorated == []


def test_deformable_op_comparison_counts_each_stock_detection_found_once():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        from compare_deformable_ops import agreement_rows
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    import numpy as np

    stock = [np.array([[0, 0, 10, 10, 0.9, 1], [0, 0, 10, 10, 0.9, 1], [5, 5, 20, 20, 0.5, 2]]),
             np.array([[1, 1, 4, 4, 0.3, 3]])]
    # image 0: one copy of the twin, the other box 0.02 px off; image 1: the same within the tolerances
    compiled = [np.array([[0, 0, 10, 10, 0.9, 1], [5, 5, 20.02, 20, 0.5, 2]]),
                np.array([[1, 1, 4.005, 4, 0.30005, 3]])]
    assert agreement_rows(stock, compiled) == [
        ["stock detections the compiled operators give (label, box within 0.01 px, score within 1e-4)",
         "50.0% (2 / 4)"], ["images whose detections all agree", "50.0% (1 / 2)"]]
