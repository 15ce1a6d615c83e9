"""A self-describing run folder (lib/run/folder.py), the Python API (Detector.from_checkpoint(MODEL)) and
the stock test graph export (tools/export_model.py), through the real entry points on a tiny run trained
once for this file in a working directory of its own, with relative paths."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from lib.inference.detections import Detections
from lib.run.checkpoint import CheckpointError

TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
RUN_OVERRIDES = ["dataset.dataset_path=data/synthetic", "dataset.root_path=data", "dataset.synthetic_train=2",
                 "dataset.synthetic_val=1", "output_path=out", "TRAIN.FLIP=false", "TRAIN.end_epoch=2",
                 "TRAIN.lr_step=", "TRAIN.BATCH_IMAGES=2", "TRAIN.NUM_PROCESS=0", "TRAIN.warmup_step=5", "gpus=cpu:1",
                 "TEST.NUM_PROCESS=0"]
EVERY_SCORE = ["TEST.SCORE_THRESH", "0"]  # a barely trained network scores below the default threshold


def run(argv, cwd, env=None, timeout=300):
    result = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env=env)
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(training working directory, run folder) of two epochs of the tiny config, trained by main_train.py."""
    work = tmp_path_factory.mktemp("train_here")
    result = run([os.path.join(ROOT, "main_train.py"), "--cfg", TINY, "--eval", "--set", *RUN_OVERRIDES], cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = work / "out" / "sniper_synthetic_tiny"
    with open(folder / "results" / "val" / "test_summary.json") as f:
        evaluated = json.load(f)  # --eval: trained, then tested the last checkpoint
    return work, folder, evaluated


@pytest.fixture()
def elsewhere(tmp_path):
    """A working directory that is neither the repository nor the training's."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def val_image(work):
    with open(work / "data" / "synthetic" / "annotations" / "instances_val.json") as f:
        image = json.load(f)["images"][0]
    return str(work / "data" / "synthetic" / "images" / "val" / image["file_name"]), image["id"]


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, last


# -- what training leaves in the run folder -------------------------------------------------------------
def test_run_folder_holds_its_config_and_each_checkpoint_its_model_metadata(trained):
    work, folder, _ = trained
    saved = load_config(str(folder / "config.yaml"))  # loadable by --cfg
    tiny = load_config(TINY)
    assert saved.TRAIN.end_epoch == 2 and saved.dataset.synthetic_train == 2 and saved.gpus == "cpu:1"
    assert saved.dataset.dataset_path == "data/synthetic" and saved.TEST.SCALES == tiny.TEST.SCALES
    with open(work / "data" / "synthetic" / "annotations" / "instances_train.json") as f:
        categories = sorted((c["id"], c["name"]) for c in json.load(f)["categories"])
    for epoch in (1, 2):
        with open(folder / f"SNIPER-{epoch:04d}.progress.json") as f:
            info = json.load(f)["model"]
        assert info["classes"] == ["__background__"] + [name for _, name in categories]
        assert info["category_ids"] == [0] + [cat_id for cat_id, _ in categories]
        assert info["NUM_CLASSES"] == len(categories) + 1 and info["symbol"] == "resnet_tiny"
        assert not info["rpn_only"]
        assert info["TEST.SCALES"] == list(tiny.TEST.SCALES)
        assert info["TEST.VALID_RANGES"] == [list(r) for r in tiny.TEST.VALID_RANGES]
        assert info["PIXEL_MEANS"] == list(tiny.network.PIXEL_MEANS) and info["CHANNEL_ORDER"] == "RGB"
        assert os.path.samefile(folder / info["workdir"], work)


# -- main_test.py / demo.py --model --------------------------------------------------------------------------
def test_main_train_eval_tests_the_checkpoint_it_wrote(trained):
    _, folder, evaluated = trained
    assert evaluated["checkpoint"] == os.path.join("out", "sniper_synthetic_tiny", "SNIPER-0002.params")
    assert evaluated["tested"] == 1 and "AP" in evaluated["stats"]


def test_main_test_takes_a_run_folder_alone_from_another_directory(trained, elsewhere):
    work, folder, _ = trained
    shutil.rmtree(folder / "results")
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(folder), "--set", *EVERY_SCORE], cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = sorted(folder.glob("test_*.log"), key=os.path.getmtime)
    assert "  SCORE_THRESH: 0.0\n" in logs[-1].read_text()  # the effective config logged: --set still applies
    with open(folder / "results" / "val" / "test_summary.json") as f:
        summary = json.load(f)
    # the newest epoch; the dataset's relative paths found through the run folder, not the working directory
    assert summary["checkpoint"] == str(folder / "SNIPER-0002.params")
    assert summary["tested"] == summary["images"] == 1 and {"AP", "AP50"} <= set(summary["stats"])
    assert not os.listdir(elsewhere)


def test_python_api_from_any_directory_matches_main_test(trained, elsewhere):
    work, folder, _ = trained
    run([os.path.join(ROOT, "main_test.py"), "--model", str(folder / "SNIPER-0002.params"), "--set", *EVERY_SCORE],
        cwd=elsewhere)
    with open(folder / "results" / "val" / "detections_val_results.json") as f:
        expected = json.load(f)
    image, image_id = val_image(work)
    script = (
        "import cv2, json\n"
        "from lib.inference import Detector\n"
        f"det = Detector.from_checkpoint({str(folder / 'SNIPER-0002.params')!r},\n"
        "                               overrides={'TEST.SCORE_THRESH': 0})\n"
        f"image = cv2.imread({image!r})\n"
        "dets = det(image)\n"
        "assert cv2.imwrite('drawn.png', det.draw(image, dets, thresh=0))\n"
        "print(json.dumps([[*map(float, b), float(s), n] for b, s, n in zip(dets.boxes, dets.scores, dets.names)]))\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    result = run(["-c", script], cwd=elsewhere, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    with open(folder / "SNIPER-0002.progress.json") as f:
        info = json.load(f)["model"]
    names = dict(zip(info["category_ids"], info["classes"]))
    assert len(found) == len(expected) > 0
    assert all(entry["image_id"] == image_id for entry in expected)
    key = lambda d: (-d[0], d[1])  # noqa: E731  (score, then box: ties in any order)
    api = sorted(((round(s, 8), [round(v, 1) for v in (x1, y1, x2 - x1 + 1, y2 - y1 + 1)], n)
                  for x1, y1, x2, y2, s, n in found), key=key)
    cli = sorted(((e["score"], e["bbox"], names[e["category_id"]]) for e in expected), key=key)
    for (score_a, box_a, name_a), (score_c, box_c, name_c) in zip(api, cli):
        assert score_a == pytest.approx(score_c, abs=2e-8) and name_a == name_c  # 8 decimals in the file
        np.testing.assert_allclose(box_a, box_c, atol=0.051)  # the results file keeps one decimal (the reference's)
    assert os.path.getsize(elsewhere / "drawn.png") > 0


def test_demo_names_classes_from_the_checkpoint_without_the_dataset(trained, tmp_path):
    work, folder, _ = trained
    moved = tmp_path / "moved_run"  # a copy of the run alone: its dataset paths lead nowhere
    moved.mkdir()
    for name in ("config.yaml", "SNIPER-0002.params", "SNIPER-0002.progress.json"):
        shutil.copy(folder / name, moved / name)
    image = tmp_path / "image.jpg"
    shutil.copy(val_image(work)[0], image)
    out = tmp_path / "drawn.png"
    result = run([os.path.join(ROOT, "demo.py"), "--model", str(moved / "SNIPER-0002.params"), "--im_path",
                  str(image), "--out", str(out), "--thresh", "0", "--set", *EVERY_SCORE], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(moved / "SNIPER-0002.progress.json") as f:
        classes = json.load(f)["model"]["classes"][1:]
    logged = [line.split("demo: ")[1].split()[0] for line in result.stderr.splitlines() if "demo: " in line][:-1]
    assert logged and set(logged) <= set(classes)
    assert os.path.getsize(out) > 0


def test_a_checkpoint_that_does_not_fit_the_network_is_one_line(trained, elsewhere):
    _, folder, _ = trained
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(folder), "--set", "network.ANCHOR_SCALES",
                  "[2, 4, 8]", "network.NUM_ANCHORS", "9"], cwd=elsewhere)
    assert_one_line_error(result, "SNIPER-0002.params: parameter rpn_cls_score_weight has shape")


def test_missing_metadata_says_what_to_pass_instead(trained, tmp_path):
    _, folder, _ = trained
    old = tmp_path / "old_run"
    old.mkdir()
    shutil.copy(folder / "SNIPER-0002.params", old / "SNIPER-0002.params")
    result = run([os.path.join(ROOT, "demo.py"), "--model", str(old / "SNIPER-0002.params"), "--im_path",
                  str(tmp_path / "x.jpg")], cwd=tmp_path)
    assert_one_line_error(result, "model error:", "has no metadata", "--cfg FILE")
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(old)], cwd=tmp_path)
    assert_one_line_error(result, "model error:", "has no config.yaml", "--cfg FILE")
    # what it says works: the config given, the folder's newest checkpoint of its TRAIN.model_prefix
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(old), "--cfg", str(folder / "config.yaml"),
                  "--set", "gpus=cpu:1", "output_path", str(tmp_path / "out")], cwd=trained[0])
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "out" / "config" / "results" / "val" / "test_summary.json") as f:
        assert json.load(f)["checkpoint"] == str(old / "SNIPER-0002.params")
    result = run([os.path.join(ROOT, "main_test.py")], cwd=tmp_path)
    assert_one_line_error(result, "give --model RUN_FOLDER")


def test_a_checkpoint_with_a_config_takes_its_class_names_from_the_run_record_else_the_config(trained):
    from lib.inference import Detector
    from lib.run.folder import checkpoint_classes

    work, folder, _ = trained
    cfg = load_config(str(folder / "config.yaml"), [("gpus", "cpu:1")])
    params = str(folder / "SNIPER-0001.params")
    detector = Detector.from_config(cfg, params, checkpoint_classes(params, cfg))
    assert detector.classes[1:] == ["circle", "square", "triangle", "cross", "star"]
    stripped = load_config(str(folder / "config.yaml"), [("gpus", "cpu:1"), ("dataset.NUM_CLASSES", "6")])
    plain = str(work / "plain.params")
    shutil.copy(folder / "SNIPER-0001.params", plain)  # no companion metadata: numbered classes
    assert checkpoint_classes(plain, stripped) == ["__background__"] + [f"class {i}" for i in range(1, 6)]
    # no metadata and no count: the classes of the config's test set when its annotations are on disk ...
    on_disk = load_config(str(folder / "config.yaml"), [("gpus", "cpu:1"), ("dataset.NUM_CLASSES", "0"),
                                                        ("dataset.dataset_path", str(work / "data" / "synthetic")),
                                                        ("dataset.root_path", str(work / "data"))])
    assert checkpoint_classes(plain, on_disk)[1:] == ["circle", "square", "triangle", "cross", "star"]
    # ... else an error saying what to set
    absent = with_overrides(on_disk, {"dataset.dataset": "coco", "dataset.dataset_path": str(work / "absent")})
    with pytest.raises(CheckpointError, match=r"no metadata naming its classes .* set dataset.NUM_CLASSES"):
        checkpoint_classes(plain, absent)


def test_detections_sort_by_score_and_name_their_labels():
    rows = np.array([[0, 0, 9, 9, 0.2, 2], [5, 5, 20, 30, 0.9, 1], [1, 2, 3, 4, 0.5, 2]], np.float32)
    dets = Detections.from_array(rows, ["__background__", "cat", "dog"])
    assert dets.names == ("cat", "dog", "dog") and dets.scores.tolist() == pytest.approx([0.9, 0.5, 0.2])
    assert dets.labels.tolist() == [1, 2, 2] and dets.boxes[0].tolist() == [5, 5, 20, 30]
    assert len(dets.above(0.5)) == 2 and dets.above(0.5).names == ("cat", "dog")
    np.testing.assert_array_equal(dets.to_array(), rows[[1, 2, 0]])


# -- the stock test graph -------------------------------------------------------------------------------------
STOCK_LOADER = """
import importlib.util, os, sys
# a Python without this repository: the venv has the checkout (argv[1]) on sys.path, take it off
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.realpath(sys.argv[1])]
import mxnet as mx, numpy as np
assert importlib.util.find_spec("lib") is None and importlib.util.find_spec("symbols") is None
inputs = np.load("inputs.npz")
symbol, args, aux = mx.model.load_checkpoint("export/tiny", 0)
shapes = [("data", inputs["data"].shape), ("im_info", inputs["im_info"].shape), ("im_ids", (1,)), ("chip_ids", (1,))]
module = mx.mod.Module(symbol, data_names=[n for n, _ in shapes], label_names=None, context=mx.cpu())
module.bind(shapes, for_training=False)
module.set_params(args, aux)
batch = mx.io.DataBatch([mx.nd.array(inputs["data"]), mx.nd.array(inputs["im_info"]), mx.nd.zeros(1), mx.nd.zeros(1)])
module.forward(batch, is_train=False)
np.savez("outputs.npz", **{n: o.asnumpy() for n, o in zip(module.output_names, module.get_outputs())})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("lib", "symbols", "chip_generator")))
"""


def test_exported_graph_runs_on_stock_mxnet_as_the_in_repo_network(trained, tmp_path):
    import mxnet as mx

    from lib.inference import Detector
    from lib.inference.export import STOCK_OPERATORS

    _, folder, _ = trained
    result = run([os.path.join(ROOT, "tools", "export_model.py"), "--model", str(folder), "--out",
                  str(tmp_path / "export" / "tiny")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "export" / "tiny-model.json") as f:
        description = json.load(f)
    assert description["classes"][1:] == ["circle", "square", "triangle", "cross", "star"]
    with open(folder / "SNIPER-0002.params", "rb") as f:  # the source by name and content, not a machine path
        assert description["source"] == {"run": "sniper_synthetic_tiny", "checkpoint": "SNIPER-0002.params",
                                         "sha256": hashlib.sha256(f.read()).hexdigest()}
    assert str(tmp_path) not in json.dumps(description) and str(folder) not in json.dumps(description)
    symbol = mx.sym.load(str(tmp_path / "export" / "tiny-symbol.json"))
    ops = {node["op"] for node in json.loads(symbol.tojson())["nodes"]}
    assert "Custom" not in ops and "_contrib_MultiProposal" in ops
    assert not any(op.startswith(("_sniper", "Sniper")) for op in ops)

    rng = np.random.default_rng(0)
    data = rng.normal(0, 50, (1, 3, 96, 128)).astype(np.float32)
    im_info = np.array([[90, 120, 1]], np.float32)
    np.savez(tmp_path / "inputs.npz", data=data, im_info=im_info)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run(["-c", STOCK_LOADER, ROOT], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"  # nothing of the repository was imported
    exported = np.load(tmp_path / "outputs.npz")

    detector = Detector.from_checkpoint(str(folder), overrides={**STOCK_OPERATORS, "gpus": "cpu:1"})
    expected = detector.network.forward(data, im_info)
    assert sorted(exported.files) == sorted(expected)
    for name in ("rois_output", "cls_prob_reshape_output", "bbox_pred_reshape_output"):
        np.testing.assert_array_equal(exported[name], expected[name], err_msg=name)


def test_export_stops_on_a_bad_key_or_model_in_one_line(trained, tmp_path):
    _, folder, _ = trained
    tool = os.path.join(ROOT, "tools", "export_model.py")
    result = run([tool, "--model", str(folder), "--out", "x", "--set", "TEST.NO_SUCH_KEY=1"], cwd=tmp_path)
    assert_one_line_error(result, "config error: unknown config key TEST.NO_SUCH_KEY")
    result = run([tool, "--model", str(tmp_path), "--out", "x"], cwd=tmp_path)
    assert_one_line_error(result, "model error:", "has no config.yaml")
    assert os.listdir(tmp_path) == []


def test_damaged_metadata_is_named(trained, tmp_path):
    _, folder, _ = trained
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    shutil.copy(folder / "config.yaml", damaged / "config.yaml")
    shutil.copy(folder / "SNIPER-0001.params", damaged / "SNIPER-0001.params")
    with open(folder / "SNIPER-0001.progress.json") as f:
        progress = json.load(f)
    progress["model"]["classes"] = progress["model"]["classes"][:3]
    (damaged / "SNIPER-0001.progress.json").write_text(json.dumps(progress))
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(damaged)], cwd=tmp_path)
    assert_one_line_error(result, "SNIPER-0001.progress.json: the 'model' metadata names 3 classes for NUM_CLASSES 6")
    del progress["model"]["NUM_CLASSES"]
    (damaged / "SNIPER-0001.progress.json").write_text(json.dumps(progress))
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(damaged)], cwd=tmp_path)
    assert_one_line_error(result, "metadata lacks NUM_CLASSES")


@pytest.mark.parametrize("tool, argv, made", [
    ("visualize_chips.py", ["TRAIN_ID", "--out", "chips.png"], "chips.png"),
    ("visualize_chips.py", ["TRAIN_ID"], "RUN/chips_TRAIN_ID.png"),  # by default into the run folder
    ("visualize_batch.py", ["--chips", "2", "--out", "batch.png"], "batch.png"),
    ("visualize_batch.py", ["--chips", "2", "--batch", "0"], "RUN/batch_0.png"),
    ("visualize_detections.py", ["--results", "RESULTS", "--images", "1", "--out", "pictures"], "pictures"),
    ("visualize_detections.py", ["--results", "RESULTS", "--images", "1"], "RUN/detections/detections_000.png"),
    ("benchmark_inference.py", ["--null-forward", "--images", "2", "--runs", "1", "--workers", "0"], None),
])
def test_the_tools_take_a_run_folder_alone(trained, elsewhere, tool, argv, made):
    work, folder, evaluated = trained
    with open(work / "data" / "synthetic" / "annotations" / "instances_train.json") as f:
        train_id = json.load(f)["images"][0]["id"]
    results = str(work / evaluated["results"])
    argv = [str(train_id) if a == "TRAIN_ID" else results if a == "RESULTS" else a for a in argv]
    result = run([os.path.join(ROOT, "tools", tool), *argv, "--model", str(folder)], cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    if made:  # the run's own data found through the run folder, from another directory; pictures go into it
        made = made.replace("TRAIN_ID", str(train_id))
        assert os.path.exists(folder / made[4:] if made.startswith("RUN/") else elsewhere / made)
        assert not made.startswith("RUN/") or os.listdir(elsewhere) == []
    else:
        assert "images/s" in result.stdout


def test_the_viewer_finds_the_image_ids_main_test_gave_a_folder_of_images(trained, tmp_path):
    """``main_test.py --images`` on img_9.jpg and img_10.jpg (names not all numbers: ids 1 and 2), then the
    viewer on that folder and those results: it draws the detections of both, into the results' folder."""
    work, folder, _ = trained
    images = tmp_path / "images"
    images.mkdir()
    for name in ("img_9.jpg", "img_10.jpg"):
        shutil.copy(val_image(work)[0], images / name)
    result = run([os.path.join(ROOT, "main_test.py"), "--model", str(folder), "--images", str(images), "--out",
                  str(tmp_path / "found"), "--set", *EVERY_SCORE], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "found" / "detections_results.json") as f:
        assert sorted({d["image_id"] for d in json.load(f)}) == [1, 2]  # img_10.jpg sorts first
    result = run([os.path.join(ROOT, "tools", "visualize_detections.py"), "--results",
                  str(tmp_path / "found" / "detections_results.json"), "--folder", str(images), "--thresh", "0"],
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("drew 2 images, 2 with detections")
    assert result.stdout.rstrip().endswith(f"into 1 grids: {os.path.join('found', 'detections', 'detections_000.png')}")
    (tmp_path / "found" / "image_info.json").unlink()  # without main_test's record: its rule, the same ids
    result = run([os.path.join(ROOT, "tools", "visualize_detections.py"), "--results",
                  str(tmp_path / "found" / "detections_results.json"), "--folder", str(images)], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("drew 2 images, 2 with detections"), result.stderr
    other = tmp_path / "other.json"  # results of other images: one line, no pictures without their detections
    other.write_text(json.dumps([{"image_id": 9, "category_id": 1, "bbox": [1, 1, 5, 5], "score": 0.9}]))
    result = run([os.path.join(ROOT, "tools", "visualize_detections.py"), "--results", str(other), "--folder",
                  str(images), "--out", str(tmp_path / "none")], cwd=tmp_path)
    assert_one_line_error(result, "none of the 1 image ids in other.json is one of these 2 images")
    assert not os.path.exists(tmp_path / "none")


def test_the_inference_benchmark_takes_the_network_of_the_trained_run(trained):
    """README's first look after a tiny-config run (config NUM_CLASSES 0, the checkpoint's 6 classes), then a
    single-scale test of it: the default single-scale row is its only scale, a bad index one line."""
    work, folder, _ = trained
    benchmark = [os.path.join(ROOT, "tools", "benchmark_inference.py"), "--no_gluoncv", "--images", "1", "--runs", "1",
                 "--image_size", "48", "64"]
    result = run([*benchmark, "--cfg", TINY, "--set", *RUN_OVERRIDES, "TEST.TEST_EPOCH=2"], cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SNIPER weights: out/sniper_synthetic_tiny/SNIPER-0002.params" in result.stdout
    single = ["--model", str(folder), "--set", "TEST.SCALES=[[64, 96]]", "TEST.VALID_RANGES=[[-1, -1]]",
              "TEST.BATCH_IMAGES=1"]
    result = run([*benchmark, *single], cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[2:4] for line in result.stdout.splitlines() if line.startswith("| SNIPER")]
    assert [(test.strip(), scales.strip()) for test, scales in rows] == [("single-scale", "(64, 96)"),
                                                                          ("multi-scale", "(64, 96)")]
    assert_one_line_error(run([*benchmark, *single, "--single_scale", "1"], cwd=work),
                          "--single_scale 1: TEST.SCALES has 1 scale (indices 0..0)")


def test_the_readme_python_api_snippet_runs_as_written(trained, tmp_path):
    """README's snippet, verbatim, in a directory laid out as after ``make train`` (the trained run, its data
    and the demo picture linked in), outside the repository, with the interpreter README names (.venv/bin/python:
    this test's own) and no PYTHONPATH."""
    work, folder, _ = trained
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    snippet = readme.split("\n## Python API\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    for link, target in (("output/sniper_synthetic_tiny", folder), ("data/synthetic", work / "data" / "synthetic"),
                         ("docs/demo.jpg", os.path.join(ROOT, "docs", "demo.jpg"))):
        os.makedirs(tmp_path / os.path.dirname(link), exist_ok=True)
        os.symlink(target, tmp_path / link)
    assert os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(ROOT, ".venv"))  # README's interpreter
    # no PYTHONPATH: the venv finds the checkout itself (make puts it on the venv's sys.path)
    result = run(["-c", snippet], cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "detections:" in result.stdout and os.path.getsize(tmp_path / "output" / "api_detections.png") > 0
