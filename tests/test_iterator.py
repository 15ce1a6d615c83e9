"""The training iterator (lib/data): chip pixels, chip boxes, batches, determinism, and reliability."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import cv2
import mxnet as mx
import numpy as np
import psutil
import pytest

from lib.config import load_config
from lib.data import ChipLoader, WorkerDiedError, WorkerError
from lib.data.batch_ring import BatchRing, Field
from lib.data.chip_boxes import chip_gt_boxes, crop_to_chip, pack_gt_boxes, scaled_valid_range
from lib.data.chip_image import render_chip
from lib.data.pixels import network_pixels
from chip_generator.mining import MiningParams, mine_image_chips
from lib.dataset import load_roidb, read_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEANS = np.array([103.939, 116.779, 123.68], np.float32)


# -- chip pixels -------------------------------------------------------------------------------------
def smooth_image(height, width, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3)).astype(np.uint8)
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)


def test_render_chip_at_scale_one_is_the_exact_crop_minus_means_with_zero_padding():
    image = smooth_image(300, 400)
    out = np.full((3, 256, 256), 7, np.float32)
    height, width = render_chip(image, (150, 100, 399, 299), 1.0, False, MEANS, "BGR", out)
    assert (height, width) == (200, 250)
    expected = image[100:300, 150:400].astype(np.float32) - MEANS
    np.testing.assert_array_equal(out[:, :200, :250], expected.transpose(2, 0, 1))
    assert not out[:, 200:, :].any() and not out[:, :, 250:].any()


def test_network_pixels_feed_rgb_minus_the_bgr_listed_means():
    image = np.zeros((2, 3, 3), np.uint8)
    image[1, 2] = (10, 20, 30)  # B, G, R
    out = np.full((3, 4, 4), 7.0, np.float32)
    network_pixels(image, MEANS, "RGB", out)
    np.testing.assert_allclose(out[:, 1, 2], [30 - 123.68, 20 - 116.779, 10 - 103.939], rtol=1e-6)
    np.testing.assert_allclose(out[:, 0, 0], [-123.68, -116.779, -103.939], rtol=1e-6)
    assert (out[:, 2:, :] == 7).all() and (out[:, :, 3:] == 7).all()  # outside the image: untouched
    network_pixels(image, MEANS, "BGR", out)
    np.testing.assert_allclose(out[:, 1, 2], [10 - 103.939, 20 - 116.779, 30 - 123.68], rtol=1e-6)
    with pytest.raises(ValueError, match="CHANNEL_ORDER"):
        network_pixels(image, MEANS, "rgb", out)


def test_render_chip_flipped_reads_the_mirrored_image():
    image = smooth_image(300, 400)
    out = np.zeros((3, 256, 256), np.float32)
    render_chip(image, (0, 50, 199, 249), 1.0, True, MEANS, "BGR", out)
    mirrored = image[:, ::-1]
    np.testing.assert_array_equal(out[:, :200, :200], (mirrored[50:250, 0:200] - MEANS).transpose(2, 0, 1))


def test_render_chip_fits_non_square_inputs_by_their_own_height_and_width():
    image = smooth_image(300, 400)
    wide = np.full((3, 64, 160), 7, np.float32)
    assert render_chip(image, (10, 20, 159, 79), 1.0, False, MEANS, "BGR", wide) == (60, 150)  # 150 wide, 60 high
    np.testing.assert_array_equal(wide[:, :60, :150], (image[20:80, 10:160] - MEANS).transpose(2, 0, 1))
    assert not wide[:, 60:, :].any() and not wide[:, :, 150:].any()
    tall = np.full((3, 160, 64), 7, np.float32)
    with pytest.raises(ValueError, match="does not fit the 160 x 64 network input"):
        render_chip(image, (10, 20, 159, 79), 1.0, False, MEANS, "BGR", tall)
    assert render_chip(image, (10, 20, 69, 169), 1.0, True, MEANS, "BGR", tall) == (150, 60)  # 60 wide, 150 high
    mirrored = image[:, ::-1]
    np.testing.assert_array_equal(tall[:, :150, :60], (mirrored[20:170, 10:70] - MEANS).transpose(2, 0, 1))
    assert not tall[:, 150:, :].any() and not tall[:, :, 60:].any()


@pytest.mark.parametrize("scale, flipped", [(3.0, False), (1.667, True), (0.5, False)])
def test_render_chip_scaled_matches_resizing_the_whole_image(scale, flipped):
    image = smooth_image(240, 320, seed=1)
    scaled = cv2.resize(image[:, ::-1] if flipped else image, (round(320 * scale), round(240 * scale)))
    chip = (90, 60, 90 + 127, 60 + 99) if scale > 1 else (10, 20, 149, 109)
    out = np.zeros((3, 128, 160), np.float32)
    height, width = render_chip(image, chip, scale, flipped, MEANS, "BGR", out)
    expected = scaled[chip[1]:chip[3] + 1, chip[0]:chip[2] + 1].astype(np.float32) - MEANS
    # the crop is taken at whole source pixels: content may shift by under one scaled pixel
    assert np.abs(out[:, :height, :width] - expected.transpose(2, 0, 1)).mean() < 4.0


# -- chip boxes --------------------------------------------------------------------------------------
def test_chip_boxes_hand_worked():
    boxes = np.array([
        [10, 10, 29, 29],  # x2: inside the chip (60, 0)-(259, 199) at scale 2 -> (20, 20, 58, 58): left part cut
        [100, 50, 104, 70],  # 5 px wide -> 9 px scaled (x 200..208): under 10 px, dropped
        [100, 50, 105, 70],  # 6 px wide -> 10 px scaled: kept
        [200, 10, 220, 30],  # right of the chip entirely
        [40, 90, 200, 300],  # covers the bottom right corner, cropped
    ], np.float32)
    classes = np.array([1, 2, 3, 4, 5], np.int32)
    valid = np.array([True, True, False, True, True])
    chip = (60, 0, 259, 199)
    cropped = crop_to_chip(boxes, 2.0, chip)
    np.testing.assert_allclose(cropped[0], [0, 20, -2, 58])
    out_boxes, out_classes, out_valid = chip_gt_boxes(boxes, classes, valid, 2.0, chip, 10)
    np.testing.assert_array_equal(out_classes, [3, 5])
    np.testing.assert_allclose(out_boxes, [[140, 100, 150, 140], [20, 180, 199, 199]])
    np.testing.assert_array_equal(out_valid, [False, True])
    packed = np.zeros((4, 5), np.float32)
    assert pack_gt_boxes(out_boxes, out_classes, out_valid, packed) == 0
    np.testing.assert_allclose(packed, [[20, 180, 199, 199, 5], [140, 100, 150, 140, 3], [-1] * 5, [-1] * 5])
    assert pack_gt_boxes(out_boxes, out_classes, out_valid, packed[:1]) == 1
    assert scaled_valid_range((-1, 80), 3.0) == (-1.0, 240.0)
    assert scaled_valid_range((32, 150), 0.5) == (16.0, 75.0)


# -- shared memory ring ------------------------------------------------------------------------------
def test_batch_ring_slots_are_disjoint_views_and_the_name_goes_away():
    ring = BatchRing([Field("a", (3, 5)), Field("b", (7,), np.int32, True)], batch_size=2, num_slots=3)
    name = ring._memory.name
    assert os.path.exists(f"/dev/shm/{name}")
    for index in range(3):
        ring.slot(index)["a"][...] = index
        ring.slot(index)["b"][...] = 10 + index
    for index in range(3):
        assert (ring.slot(index)["a"] == index).all() and (ring.slot(index)["b"] == 10 + index).all()
    ring.unlink()
    assert not os.path.exists(f"/dev/shm/{name}")
    ring.slot(0)["a"][...] = 5  # still mapped after unlink
    ring.close()


def test_batch_ring_refuses_a_too_small_dev_shm(monkeypatch):
    import lib.data.batch_ring as batch_ring
    monkeypatch.setattr(batch_ring.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(64 << 20, 0, 1 << 20))
    with pytest.raises(MemoryError, match="needs 4 MB of shared memory but /dev/shm has 1 MB free"):
        BatchRing([Field("a", (1024, 1024))], batch_size=1, num_slots=1)


# -- the loader on a tiny synthetic dataset ----------------------------------------------------------
CHIPS = 4  # chips per device


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset(train=3, val=0)


def dataset_cfg(dataset_path, root, *overrides):
    return load_config(None, [("dataset.dataset_path", dataset_path), ("dataset.image_set", "train"),
                              ("dataset.root_path", str(root)), *overrides])


@pytest.fixture(scope="module")
def cfg(dataset, tmp_path_factory):
    return dataset_cfg(dataset, tmp_path_factory.mktemp("root"))


@pytest.fixture(scope="module")
def roidb(cfg):
    return load_roidb(cfg, "train")[0]


def numpy_batches(loader):
    return [[a.asnumpy() for a in batch.data + batch.label] + [batch.pad] for batch in loader]


@pytest.fixture(scope="module")
def inline_epochs(roidb, cfg):
    """Two epochs built in-process, with the loader's plan of the first."""
    with ChipLoader(roidb, cfg, CHIPS, num_workers=0, seed=11) as loader:
        first, plan = numpy_batches(loader), loader._plan
        loader.reset()
        second = numpy_batches(loader)
        return first, second, plan, loader.provide_data, loader.provide_label


def test_batches_have_the_declared_layout(inline_epochs, roidb):
    first, _, plan, provide_data, provide_label = inline_epochs
    names = [d.name for d in provide_data + provide_label]
    assert names == ["data", "valid_ranges", "im_info", "label", "bbox_target", "bbox_weight", "gt_boxes"]
    shapes = dict(zip(names, [d.shape for d in provide_data + provide_label]))
    assert shapes == {"data": (4, 3, 512, 512), "valid_ranges": (4, 2), "im_info": (4, 3), "label": (4, 21 * 32 * 32),
                      "bbox_target": (4, 84, 32, 32), "bbox_weight": (4, 84, 32, 32), "gt_boxes": (4, 100, 5)}
    assert len(first) == plan.num_batches == -(-plan.num_chips // 4)
    assert [b[-1] for b in first] == [0] * (len(first) - 1) + [plan.pad]
    for batch in first:
        arrays = dict(zip(names, batch))
        for name in names:
            assert arrays[name].shape == shapes[name] and arrays[name].dtype == np.float32
        assert set(np.unique(arrays["label"])) <= {-1.0, 0.0, 1.0}
        assert ((arrays["label"] == 1).sum(axis=1) <= 128).all() and ((arrays["label"] >= 0).sum(axis=1) <= 256).all()
        padding = arrays["gt_boxes"][:, :, 4] < 0
        assert (arrays["gt_boxes"][padding] == -1).all()
    # each chip's im_info and valid range follow from its ChipRef
    arrays = dict(zip(names, first[0]))
    for position in range(4):
        chip, _ = plan.chip_at(0, position)
        x1, y1, x2, y2 = chip.box
        np.testing.assert_allclose(arrays["im_info"][position], [y2 - y1 + 1, x2 - x1 + 1, chip.im_scale], rtol=1e-6)
        lo, hi = [[-1, 80], [32, 150], [120, -1]][chip.scale_index]
        expected = [-1 if lo == -1 else lo * chip.im_scale, -1 if hi == -1 else hi * chip.im_scale]
        np.testing.assert_allclose(arrays["valid_ranges"][position], expected, rtol=1e-6)


def test_chip_content_and_boxes_match_an_independent_computation(inline_epochs, roidb):
    first, _, plan, _, _ = inline_epochs
    data, gt_boxes = first[0][0], first[0][6]
    for position in range(4):
        chip, _ = plan.chip_at(0, position)
        entry = roidb[chip.image_index]
        image = read_image(entry["image"])
        if entry["flipped"]:
            image = image[:, ::-1]
        scale = chip.im_scale
        x1, y1, x2, y2 = (int(v) for v in chip.box)
        # resize only the neighbourhood of the chip (the whole 3x image would be slow), then crop
        left, top = max(int(x1 / scale) - 2, 0), max(int(y1 / scale) - 2, 0)
        region = image[top:int((y2 + 1) / scale) + 3, left:int((x2 + 1) / scale) + 3]
        scaled = cv2.resize(region, None, fx=scale, fy=scale)
        ox, oy = round(left * scale), round(top * scale)
        # the network is fed RGB: channel c is image channel 2 - c minus its mean
        expected = scaled[y1 - oy:y2 - oy + 1, x1 - ox:x2 - ox + 1, ::-1].astype(np.float32) - MEANS[::-1]
        height, width = expected.shape[:2]
        assert np.abs(data[position][:, :height, :width] - expected.transpose(2, 0, 1)).mean() < 6.0
        assert not data[position][:, height:, :].any() and not data[position][:, :, width:].any()
        # every box of the image visible (>= 10 px) in the chip, and nothing else
        boxes = entry["boxes"] * scale
        vis_x1, vis_y1 = np.maximum(boxes[:, 0], x1) - x1, np.maximum(boxes[:, 1], y1) - y1
        vis_x2, vis_y2 = np.minimum(boxes[:, 2], x2) - x1, np.minimum(boxes[:, 3], y2) - y1
        seen = (vis_x2 - vis_x1 + 1 >= 10) & (vis_y2 - vis_y1 + 1 >= 10)
        rows = gt_boxes[position][gt_boxes[position][:, 4] >= 0]
        expected_rows = np.stack([vis_x1, vis_y1, vis_x2, vis_y2, entry["gt_classes"]], axis=1)[seen]
        assert len(rows) == len(expected_rows)
        np.testing.assert_allclose(rows[np.lexsort(rows.T)], expected_rows[np.lexsort(expected_rows.T)], atol=1e-3)


def test_epochs_differ_and_chips_are_remined(inline_epochs):
    first, second, _, _, _ = inline_epochs
    assert len(first) > 1
    assert not np.array_equal(first[0][0], second[0][0])


def test_workers_give_the_same_batches_as_in_process(inline_epochs, roidb, cfg):
    first, second, _, _, _ = inline_epochs
    with ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=11) as loader:
        assert len(loader.pids) == 2
        got = numpy_batches(loader)
        loader.reset()
        got_second = numpy_batches(loader)
        assert loader.stats.chips == sum(4 - b[-1] for b in first + second) + first[-1][-1] + second[-1][-1]
    for expected, actual in ((first, got), (second, got_second)):
        assert len(expected) == len(actual)
        for batch_expected, batch_actual in zip(expected, actual):
            for a, b in zip(batch_expected, batch_actual):
                np.testing.assert_array_equal(a, b)


def test_valid_boxes_are_the_miners(inline_epochs, roidb, cfg):
    _, _, plan, _, _ = inline_epochs
    params = MiningParams.from_config(cfg)
    checked = set()
    for index in range(plan.num_chips):
        chip = plan.chip(index)
        if (chip.image_index, chip.scale_index) in checked:
            continue
        checked.add((chip.image_index, chip.scale_index))
        mined = mine_image_chips(roidb[chip.image_index], params, plan.stride, np.random.default_rng(0))
        assert chip.valid_boxes == tuple(np.flatnonzero(mined.scales[chip.scale_index].valid))
    assert len(checked) > 3


def test_rpn_only_and_two_contexts_bind_a_module(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_ctx=2, rpn_only=True, num_workers=2) as loader:
        assert loader.batch_size == 8
        assert [d.name for d in loader.provide_data] == ["data"]
        assert [d.name for d in loader.provide_label] == ["label", "bbox_target", "bbox_weight"]
        names = [d.name for d in loader.provide_data + loader.provide_label]
        total = mx.sym.add_n(*[mx.sym.sum(mx.sym.Variable(name)) for name in names])
        module = mx.mod.Module(mx.sym.MakeLoss(total), data_names=names[:1], label_names=names[1:],
                               context=[mx.cpu(0), mx.cpu(1)])
        module.bind(loader.provide_data, loader.provide_label, for_training=False)
        module.init_params()
        for _, batch in zip(range(4), loader):  # zero-copy batches, recycled after the module read them
            expected = sum(array.asnumpy().astype(np.float64).sum() for array in batch.data + batch.label)
            module.forward(batch, is_train=False)
            got = sum(out.asnumpy().sum() for out in module.get_outputs())
            assert got == pytest.approx(expected, rel=1e-4)


def test_kept_batches_are_not_overwritten(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=5) as loader:
        kept = [next(loader) for _ in range(3)]
        copies = [b.data[0].asnumpy().copy() for b in kept]
        for _ in loader:
            pass
        for batch, copy in zip(kept, copies):
            np.testing.assert_array_equal(batch.data[0].asnumpy(), copy)
        # the kept batches pinned their slots, so later ones were copies; dropped copies were reused
        assert 1 <= len(loader._outputs._sets) <= 3


def test_dropped_batches_are_handed_out_without_copies(roidb, cfg):
    with ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=5) as loader:
        for _ in loader:
            pass
        assert loader._outputs._sets == []


# -- reliability -------------------------------------------------------------------------------------
@pytest.fixture()
def damaged(dataset, tmp_path):
    """A copy of the dataset with one corrupt and one missing image, and its roidb."""
    copy = tmp_path / "synthetic"
    shutil.copytree(dataset, copy)
    cfg = dataset_cfg(str(copy), tmp_path / "root")
    roidb = load_roidb(cfg, "train")[0]
    corrupt, missing = roidb[0]["image"], roidb[1]["image"]
    with open(corrupt, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a jpeg" * 10)
    os.remove(missing)
    return cfg, roidb, corrupt, missing


@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_images_are_replaced_logged_and_counted(damaged, workers, caplog):
    cfg, roidb, corrupt, missing = damaged
    with ChipLoader(roidb, cfg, CHIPS, num_workers=workers, seed=2) as loader:
        batches = numpy_batches(loader)
        plan = loader._plan
    bad_chips = sum(roidb[i]["image"] in (corrupt, missing) for i in plan.chips.image_index)
    assert bad_chips > 0
    assert set(loader.stats.bad_images) == {corrupt, missing}
    assert loader.stats.bad_image_count >= bad_chips
    assert len(batches) == plan.num_batches
    for batch in batches:
        assert (batch[2][:, 0] > 0).all()  # every chip got content (im_info height)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert corrupt in logged and missing in logged


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_task_raises_with_the_cause_and_leaves_no_workers(roidb, cfg, workers):
    broken = [dict(entry) for entry in roidb]
    broken[1]["boxes"] = broken[1]["boxes"][:, :3]
    def workers_alive():  # children but multiprocessing's resource tracker (it lives until exit)
        return {p.pid for p in psutil.Process().children() if "resource_tracker" not in " ".join(p.cmdline())}

    before = workers_alive()
    expected = WorkerError if workers else ValueError
    with pytest.raises(expected, match=f"image id {broken[1]['id']}.*shape"):
        ChipLoader(broken, cfg, CHIPS, num_workers=workers)
    assert workers_alive() == before


class alarm:
    """Fail instead of hanging: SIGALRM after ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        def fail(*_):
            raise TimeoutError(f"still waiting after {self.seconds} s")
        self.previous = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def test_a_killed_worker_raises_instead_of_hanging_and_close_reaps_all(roidb, cfg):
    loader = ChipLoader(roidb, cfg, CHIPS, num_workers=2, seed=1)
    pids = loader.pids
    try:
        os.kill(pids[0], signal.SIGKILL)
        with alarm(30), pytest.raises(WorkerDiedError, match=f"pid {pids[0]}.*SIGKILL"):
            for _ in loader:
                pass
    finally:
        loader.close()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)


def start_script(dataset, tmp_path):
    script, cache = tmp_path / "run_loader.py", str(tmp_path / "root")
    script.write_text(textwrap.dedent(f"""
        import time
        from lib.config import load_config
        from lib.data import ChipLoader
        from lib.dataset import load_roidb
        cfg = load_config(None, [("dataset.dataset_path", {dataset!r}), ("dataset.image_set", "train"),
                                 ("dataset.root_path", {cache!r})])
        roidb = load_roidb(cfg, "train")[0]
        loader = ChipLoader(roidb, cfg, 4, num_workers=2)
        print(" ".join(map(str, loader.pids)), loader._resources.ring._memory.name, flush=True)
        while True:
            for batch in loader:
                time.sleep(0.05)
            loader.reset()
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    words = process.stdout.readline().split()
    assert len(words) == 3, process.stderr.read()
    time.sleep(1.0)  # let it run a few batches
    return process, [int(w) for w in words[:2]], words[2]


def wait_gone(pids, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and any(psutil.pid_exists(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if psutil.pid_exists(pid)]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_or_kill_of_the_main_process_leaves_no_workers_or_shared_memory(dataset, tmp_path, how):
    process, pids, name = start_script(dataset, tmp_path)
    assert not os.path.exists(f"/dev/shm/{name}")  # unlinked as soon as the workers were forked
    process.send_signal(how)
    try:
        process.wait(20)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    if how == signal.SIGINT:  # the loader closed itself at exit: the workers are already gone
        assert "KeyboardInterrupt" in stderr
        assert wait_gone(pids, 1) == []
    else:  # orphans notice the missing parent on their own
        assert wait_gone(pids, 10) == []
