"""ONNX export (lib/inference/onnx_export.py, export.export_onnx) and the ONNX Runtime back end
(lib/inference/onnx_network.py): each translated deformable operator against MXNet's on inputs that reach
the borders, the whole multi-scale test of the tiny network against MXNet's detections and COCO AP, the
back end without MXNet in a child process, and the one-line refusals."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx and onnxruntime are pinned for Python >= 3.11 (requirements.txt)")
ort = pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")

from detector_helpers import WITHOUT_MXNET  # noqa: E402
from lib.bootstrap import ROOT  # noqa: E402
from lib.boxes import bbox_overlaps  # noqa: E402  (the imports below need onnx)
from lib.config import with_overrides  # noqa: E402
from lib.inference import compiled_pooling, onnx_network  # noqa: E402
from lib.inference.detector import Detector  # noqa: E402
from lib.inference.export import export_onnx  # noqa: E402
from lib.inference.onnx_export import OPSET, ExportError, translate_graph  # noqa: E402


def run_translated(symbol, params, inputs, rois=None):
    """The ONNX translation of ``symbol``'s one output on ONNX Runtime, fed ``inputs`` {name: array}."""
    nodes = json.loads(symbol.tojson())["nodes"]
    ids = {node["name"]: index for index, node in enumerate(nodes)}
    head = json.loads(symbol.tojson())["heads"][0][0]
    model = translate_graph(nodes, params, {"out": ((head, 0), 4)},
                            {(ids[name], 0): (name, [None] * array.ndim) for name, array in inputs.items()}, "t",
                            rois=rois)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


@pytest.mark.parametrize("dilate, pad, stride, groups", [(2, 2, 1, 4), (1, 1, 2, 1)])
def test_deformable_convolution_samples_as_mxnet_at_the_borders(dilate, pad, stride, groups):
    """Offsets of a few pixels put many taps in (-1, 0) and [H - 1, H), where ONNX's DeformConv and MXNet's
    sample differently; the export moves those offsets (without it the outputs differ by ~6 here)."""
    rng = np.random.default_rng(1)
    height, width, kernel = 7, 9, 3
    out_h = (height + 2 * pad - dilate * (kernel - 1) - 1) // stride + 1
    out_w = (width + 2 * pad - dilate * (kernel - 1) - 1) // stride + 1
    data = rng.normal(size=(2, 8, height, width)).astype(np.float32)
    offset = rng.normal(0, 2, (2, 2 * kernel * kernel * groups, out_h, out_w)).astype(np.float32)
    offset[:, ::3] = np.round(offset[:, ::3] * 2) / 2  # whole and half pixels: exactly on rows and columns
    weight = rng.normal(size=(6, 8, kernel, kernel)).astype(np.float32)
    symbol = mx.sym.contrib.DeformableConvolution(
        data=mx.sym.var("data"), offset=mx.sym.var("offset"), num_filter=6, kernel=(kernel, kernel), pad=(pad, pad),
        dilate=(dilate, dilate), stride=(stride, stride), num_deformable_group=groups, no_bias=True, name="dc")
    expected = symbol.eval(mx.cpu(), data=mx.nd.array(data), offset=mx.nd.array(offset),
                           dc_weight=mx.nd.array(weight))[0].asnumpy()
    found = run_translated(symbol, {"dc_weight": weight}, {"data": data, "offset": offset})
    np.testing.assert_allclose(found, expected, atol=5e-5)


@pytest.mark.parametrize("with_trans", [False, True])
def test_deformable_roi_pooling_is_mxnets(with_trans):
    """group_size 1 pooling (the R-CNN head's) as RoiAlign boxes + validity mask + mean, against the stock
    operator and lib/ops' compiled one: rois over the whole map and beyond it, half-pixel corners (rounding),
    tiny, empty and inverted rois (0.1 cells wide), offsets moving bins off the map (dropped or clamped
    samples), a roi whose every sample is dropped (0)."""
    from lib import ops  # noqa: F401  (registers CompiledDeformablePSROIPooling)

    rng = np.random.default_rng(2)
    images, per_image, channels = 2, 8, 4
    data = rng.normal(size=(images, channels, 6, 9)).astype(np.float32)
    rois = np.concatenate([rng.uniform(0, 60, (images, per_image, 2)), rng.uniform(60, 150, (images, per_image, 2))],
                          axis=2).astype(np.float32)
    rois[0, :6] = [[0, 0, 143, 95], [2.5, 3.5, 10.5, 10.5], [100, 60, 400, 300], [30, 40, 30, 40],
                   [50.2, 20.7, 50.4, 21.1], [70, 50, 60, 40]]  # whole map, rounding, beyond, empty, tiny, inverted
    rois[1, 0] = [300, 200, 340, 260]  # wholly beyond the map: every sample dropped without offsets
    trans = rng.normal(0, 3, (images * per_image, 2, 7, 7)).astype(np.float32)
    batch_rois = np.hstack([np.repeat(np.arange(images), per_image)[:, None], rois.reshape(-1, 4)]).astype(np.float32)
    attrs = dict(spatial_scale=1 / 16, output_dim=channels, group_size=1, pooled_size=7, part_size=7,
                 sample_per_part=4, name="pool")
    inputs = [mx.sym.var("data"), mx.sym.var("rois")] + ([mx.sym.var("trans")] if with_trans else [])
    extra = dict(trans_std=0.1) if with_trans else {}
    stock = mx.sym.contrib.DeformablePSROIPooling(*inputs, no_trans=not with_trans, **extra, **attrs)
    compiled = mx.sym.CompiledDeformablePSROIPooling(*inputs, no_trans=not with_trans, **extra, **attrs)[0]
    arrays = dict(data=data, rois=batch_rois, **({"trans": trans} if with_trans else {}))
    found = run_translated(stock, {}, {**arrays, "rois": rois}, rois="rois")
    assert found.shape == (images * per_image, channels, 7, 7)
    if not with_trans:
        assert not found[per_image].any() and found[0].all()
    library = compiled_pooling.load_library()
    by_c_abi = compiled_pooling.deformable_roi_pool(library, data, batch_rois, trans if with_trans else None, 7, 4,
                                                    1 / 16, 0.1 if with_trans else 0.0)
    for symbol in (stock, compiled):
        expected = symbol.eval(mx.cpu(), **{k: mx.nd.array(v) for k, v in arrays.items()})[0].asnumpy()
        np.testing.assert_allclose(found, expected, atol=1e-5)
        np.testing.assert_allclose(by_c_abi, expected, atol=1e-6)
    np.testing.assert_allclose(by_c_abi, found, atol=1e-5)


def test_the_c_abi_pooling_takes_no_rois_and_refuses_a_bad_image_index_in_one_line():
    library = compiled_pooling.load_library()
    data = np.ones((2, 3, 4, 5), np.float32)
    assert compiled_pooling.deformable_roi_pool(library, data, np.zeros((0, 5)), None, 7, 2, 0.5, 0.0).shape == \
        (0, 3, 7, 7)
    rois = np.array([[0, 1, 1, 4, 4], [2, 1, 1, 4, 4]], np.float32)
    with pytest.raises(ValueError, match=r"roi 1 has batch index 2.0, outside \[0, 2\)$"):
        compiled_pooling.deformable_roi_pool(library, data, rois, None, 7, 2, 0.5, 0.0)
    with pytest.raises(compiled_pooling.CompiledPoolingError, match="nowhere.so not found \\(build it: make\\)$"):
        compiled_pooling.load_library("nowhere.so")


def test_export_refuses_what_it_does_not_translate_in_one_line():
    pool = mx.sym.contrib.DeformablePSROIPooling(data=mx.sym.var("data"), rois=mx.sym.var("rois"), no_trans=True,
                                                 spatial_scale=0.0625, output_dim=2, group_size=7, pooled_size=7,
                                                 name="psroi")
    with pytest.raises(ExportError, match="psroi: DeformablePSROIPooling with group_size 7") as excinfo:
        run_translated(pool, {}, {"data": np.zeros((1, 98, 4, 4), np.float32),
                                  "rois": np.zeros((1, 1, 4), np.float32)}, rois="rois")
    assert "\n" not in str(excinfo.value)
    leaky = mx.sym.LeakyReLU(mx.sym.var("data"), name="leaky")
    with pytest.raises(ExportError, match="operator LeakyReLU \\(node leaky\\) has no ONNX translation"):
        run_translated(leaky, {}, {"data": np.zeros((1, 1, 2, 2), np.float32)})


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """(cfg with TEST.MODEL, export folder) of the tiny network's random parameters saved as a checkpoint."""
    cfg, arg_params, aux_params = tiny
    folder = tmp_path_factory.mktemp("onnx_export")
    params = str(folder / "tiny-0001.params")
    mx.nd.save(params, {**{f"arg:{k}": v for k, v in arg_params.items()},
                        **{f"aux:{k}": v for k, v in aux_params.items()}})
    cfg = with_overrides(cfg, {"TEST.MODEL": params})
    export_onnx(cfg, str(folder / "export"))
    return cfg, str(folder / "export")


def test_export_writes_checked_opset_19_graphs_and_what_the_runtime_needs(exported):
    cfg, folder = exported
    assert sorted(os.listdir(folder)) == ["body.onnx", "head.onnx", "model.json"]
    for name, inputs, outputs in (("body", ["data"], ["rpn_cls_prob", "rpn_bbox_pred", "features"]),
                                  ("head", ["features", "rois"], ["cls_prob", "bbox_pred"])):
        model = onnx.load(os.path.join(folder, f"{name}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET] and OPSET >= 19
        assert [i.name for i in model.graph.input] == inputs and [o.name for o in model.graph.output] == outputs
    ops = {node.op_type for node in onnx.load(os.path.join(folder, "body.onnx")).graph.node}
    assert "DeformConv" in ops
    with open(os.path.join(folder, "model.json")) as f:
        description = json.load(f)
    from lib.run.folder import checkpoint_classes

    assert description["classes"] == checkpoint_classes(cfg.TEST.MODEL, cfg) and len(description["classes"]) == 3
    assert description["stride"] == 16
    assert description["PIXEL_MEANS"] == list(cfg.network.PIXEL_MEANS) and description["CHANNEL_ORDER"] == "RGB"
    assert description["TEST.SCALES"] == [[96, 128], [64, 96], [32, 48]]
    saved = description["config"]["TEST"]
    assert saved["RPN_NMS_THRESH"] == cfg.TEST.RPN_NMS_THRESH and saved["PROPOSAL_LAYER"] == "reference"
    assert saved["VALID_RANGES"] == [list(r) for r in cfg.TEST.VALID_RANGES] and saved["fp16"] is False


def blurred_images(seed=0, sizes=((60, 80), (90, 50), (40, 40))):
    """Smooth random images (a random network then gives proposals of many sizes and few equal scores)."""
    import cv2

    rng = np.random.default_rng(seed)
    return [cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (5, 5), 2) for h, w in sizes]


def assert_same_detections(expected, found, iou=0.99, score=1e-3):
    """Every detection of ``expected`` (N, 6) has one of the same label in ``found`` at IoU >= ``iou`` whose score
    differs by at most ``score``, and the counts agree."""
    assert len(expected) == len(found) > 0
    for row in expected:
        same = found[found[:, 5] == row[5]]
        close = bbox_overlaps(row[None, :4].astype(np.float32), same[:, :4].astype(np.float32))[0] >= iou
        assert close.any() and np.abs(same[close, 4] - row[4]).min() <= score, row


def test_onnx_runtime_gives_mxnets_multi_scale_detections(tiny, exported):
    cfg, arg_params, aux_params = tiny
    images = blurred_images()
    expected = Detector.from_params(cfg, ["__background__", "cat4", "cat9"], arg_params, aux_params).detect(images)
    found = Detector.from_onnx(exported[1]).detect(images)
    for image_expected, image_found in zip(expected, found):
        assert_same_detections(image_expected, image_found)


def test_the_compiled_head_pooling_gives_the_graphs_outputs_and_detections(tiny, exported, caplog):
    """TEST.ONNX_POOLING auto (the default) runs head.onnx in pieces around lib/ops' compiled pooling: its head
    outputs are the whole graph's (RoiAlign) to float rounding and its detections MXNet's and the graph's."""
    cfg, folder = exported
    with caplog.at_level("INFO", logger=onnx_network.__name__):
        compiled = Detector.from_onnx(folder)
        graph = Detector.from_onnx(folder, with_overrides(cfg, {"TEST.ONNX_POOLING": "graph"}))
    assert (compiled.network.pooling, graph.network.pooling) == ("compiled", "graph")
    assert isinstance(compiled.network.sessions["head"], compiled_pooling.CompiledPoolingGraph)
    assert len(compiled.network.sessions["head"].poolings) == 2  # the plain pooling, then the offset one
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "RoI pooling" in r.getMessage()] == [
        "deformable RoI pooling compiled (lib/ops/libsniper_pool.so) between pieces of head.onnx",
        "deformable RoI pooling by the graphs' RoiAlign (TEST.ONNX_POOLING graph)"]
    rng = np.random.default_rng(5)
    feeds = {"features": graph.network.sessions["body"].run(["features"], {
        "data": rng.normal(size=(2, 3, 100, 130)).astype(np.float32)})[0]}
    feeds["rois"] = np.concatenate([rng.uniform(-20, 60, (2, 30, 2)), rng.uniform(40, 160, (2, 30, 2))],
                                   axis=2).astype(np.float32)  # some beyond the map's borders, some inverted
    for found, expected in zip(compiled.network.sessions["head"].run(None, feeds),
                               graph.network.sessions["head"].run(None, feeds)):
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-5)
    images = blurred_images(seed=3)
    on_mxnet = Detector.from_params(cfg, ["__background__", "cat4", "cat9"], *tiny[1:]).detect(images)
    for expected, by_graph, by_compiled in zip(on_mxnet, graph.detect(images), compiled.detect(images)):
        assert_same_detections(expected, by_compiled)
        assert_same_detections(by_graph, by_compiled)


def test_without_the_library_the_head_runs_whole_or_is_refused_in_one_line(exported, monkeypatch, caplog):
    cfg, folder = exported
    monkeypatch.setattr(compiled_pooling, "LIBRARY", "/nowhere/libsniper_pool.so")
    with caplog.at_level("INFO", logger=onnx_network.__name__):
        assert Detector.from_onnx(folder).network.pooling == "graph"
    assert "deformable RoI pooling by the graphs' RoiAlign (/nowhere/libsniper_pool.so not found (build it: make))" \
        in caplog.text
    with pytest.raises(onnx_network.BackendError, match="^TEST.ONNX_POOLING compiled: /nowhere/libsniper_pool.so not "
                                                        "found \\(build it: make\\)$"):
        Detector.from_onnx(folder, with_overrides(cfg, {"TEST.ONNX_POOLING": "compiled"}))


def detections_without_mxnet(folder, images, tmp_path):
    """The detections of ``images`` by the ONNX export ``folder`` in a child process in which importing mxnet
    fails (two pipeline workers included), checked to have loaded no MXNet module."""
    np.savez(tmp_path / "images.npz", *images)
    script = WITHOUT_MXNET + f"""
import numpy as np
from lib.inference import Detector
from lib.inference.streaming import ArrayImages
loaded = np.load({str(tmp_path / "images.npz")!r})
images = [loaded[f"arr_{{i}}"] for i in range(len(loaded.files))]
detector = Detector.from_onnx({folder!r})
found = dict(detector.run(ArrayImages(images), num_workers=2))
np.savez({str(tmp_path / "found.npz")!r}, *[found[i] for i in range(len(images))])
assert not [name for name in sys.modules if name.split(".")[0] == "mxnet"]
assert detector.network.pooling == "compiled"
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = np.load(tmp_path / "found.npz")
    return [loaded[f"arr_{index}"] for index in range(len(images))]


def test_the_onnx_back_end_runs_without_mxnet(exported, tmp_path):
    """The whole test on the export in a child process without MXNet gives this process's detections."""
    images = blurred_images(seed=1)
    found = detections_without_mxnet(exported[1], images, tmp_path)
    for image_found, image_expected in zip(found, Detector.from_onnx(exported[1]).detect(images)):
        np.testing.assert_allclose(image_found, image_expected, rtol=1e-5, atol=1e-4)


def test_autofocus_on_onnx_runtime_is_mxnets_and_needs_no_mxnet(tmp_path):
    """The exported body's FocusPixel map (scale_prob) drives AutoFocus's chips as MXNet's does; with the
    export's stride the child process runs it without MXNet."""
    from detector_helpers import random_tiny_params
    from lib.config import load_config
    from lib.inference.export import export_onnx_params

    cfg = load_config(os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny_autofocus.yml"),
                      [("TEST.fp16", "false"), ("gpus", ""), ("dataset.NUM_CLASSES", "3")])
    arg_params, aux_params = random_tiny_params(cfg)
    classes = ["__background__", "a", "b"]
    export_onnx_params(cfg, classes, arg_params, aux_params, str(tmp_path / "export"))
    images = blurred_images(seed=2, sizes=((200, 300), (256, 180)))
    expected = Detector.from_params(cfg, classes, arg_params, aux_params).detect(images)
    for image_expected, image_found in zip(expected, detections_without_mxnet(str(tmp_path / "export"), images,
                                                                               tmp_path)):
        assert_same_detections(image_expected, image_found)


def test_the_tester_on_onnx_runtime_scores_as_on_mxnet(exported, tmp_path):
    """TEST.BACKEND onnxruntime (main_test.py --backend onnxruntime): the same COCO evaluation, from the
    checkpoint's export made beside it."""
    from lib.inference import tester

    cfg = with_overrides(exported[0], {"TEST.SCORE_THRESH": 0.0})
    on_mxnet = tester.test(cfg, out_dir=str(tmp_path / "mxnet"))
    on_onnx = tester.test(with_overrides(cfg, {"TEST.BACKEND": "onnxruntime"}), out_dir=str(tmp_path / "onnx"))
    assert os.path.isfile(os.path.join(os.path.dirname(cfg.TEST.MODEL), "onnx", "tiny-0001", "model.json"))
    assert on_mxnet["tested"] == on_onnx["tested"] == 3 and on_mxnet["stats"]["AR100"] > 0
    rounded = [{key: round(value, 3) for key, value in summary["stats"].items()} for summary in (on_mxnet, on_onnx)]
    assert rounded[0] == rounded[1]
    with open(on_mxnet["results"]) as f, open(on_onnx["results"]) as g:
        assert len(json.load(f)) == len(json.load(g)) > 0


def test_the_back_end_is_refused_in_one_line_where_it_cannot_run(exported, monkeypatch, tmp_path):
    monkeypatch.setattr(onnx_network, "MIN_PYTHON", (sys.version_info[0], sys.version_info[1] + 1))
    with pytest.raises(onnx_network.BackendError, match="the onnxruntime back end needs Python >= ") as excinfo:
        Detector.from_onnx(exported[1])
    assert "\n" not in str(excinfo.value)
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="model.json not found: export the model first"):
        Detector.from_onnx(str(tmp_path))


def test_what_the_export_and_the_back_end_do_not_cover_is_refused_in_one_line(exported, tmp_path):
    from lib.config import ConfigError
    from lib.inference.export import export_onnx_params
    from lib.run.checkpoint import CheckpointError

    cfg = exported[0]
    with pytest.raises(CheckpointError, match="lacks .* parameters of the test network") as excinfo:
        export_onnx_params(with_overrides(cfg, {"TRAIN.WITH_MASK": True}), ["__background__", "a", "b"], {}, {},
                           str(tmp_path / "masks"))
    assert "\n" not in str(excinfo.value) and not os.path.exists(tmp_path / "masks")
    with open(os.path.join(exported[1], "model.json")) as f:
        description = json.load(f)
    description["config"]["TRAIN"]["WITH_MASK"] = True  # a mask network's export without its mask graph
    (tmp_path / "no_mask").mkdir()
    (tmp_path / "no_mask" / "model.json").write_text(json.dumps({**description, "graphs": {}}))
    with pytest.raises(onnx_network.BackendError, match="lacks its mask graph"):
        Detector.from_onnx(str(tmp_path / "no_mask"))
    description["config"]["TRAIN"]["WITH_MASK"] = False
    (tmp_path / "no_mask" / "model.json").write_text(json.dumps({**description, "graphs": {"body": "body.onnx"}}))
    os.symlink(os.path.join(exported[1], "body.onnx"), tmp_path / "no_mask" / "body.onnx")
    with pytest.raises(onnx_network.BackendError, match="model.json names no head graph"):
        Detector.from_onnx(str(tmp_path / "no_mask"))
    with pytest.raises(ConfigError, match="RPN-only networks \\(proposal extraction\\) run on mxnet"):
        Detector.from_config(with_overrides(cfg, {"TEST.BACKEND": "onnxruntime"}), cfg.TEST.MODEL, None,
                             rpn_only=True)


def test_main_test_and_demo_take_the_back_end_as_the_config_key(exported):
    import demo
    import main_test
    from lib.run.folder import config_from_model_arguments

    for program in (main_test, demo):
        extra = ["--im_path", "x.png"] if program is demo else []
        args = program.parse_args(["--model", exported[0].TEST.MODEL, "--cfg", os.path.join(ROOT, "configs", "faster",
                                   "sniper_synthetic_tiny.yml"), "--backend", "onnxruntime", *extra])
        assert config_from_model_arguments(args).TEST.BACKEND == "onnxruntime"
        assert program.parse_args(["--cfg", "c.yml", *extra]).backend is None  # the config's own key then


def test_export_tool_writes_the_onnx_folder(exported, tmp_path):
    from lib.config.core import dump_config

    cfg, folder = exported
    config = tmp_path / "tiny.yml"
    config.write_text(dump_config(cfg))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--cfg", str(config),
                             "--model", cfg.TEST.MODEL, "--format", "onnx", "--out", str(tmp_path / "tool")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "tool")) == sorted(os.listdir(folder))
    for name in ("body.onnx", "head.onnx"):
        assert (tmp_path / "tool" / name).read_bytes() == open(os.path.join(folder, name), "rb").read()
