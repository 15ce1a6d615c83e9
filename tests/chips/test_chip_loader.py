"""The training loader (lib.data.ChipLoader): the shared-memory batch ring, batches on a tiny synthetic
dataset (layout, content, determinism, workers, the image cache) and reliability (bad images, failing,
killed and stopped workers, a killed main process)."""
import logging
import os
import re
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

from stall_helpers import assert_each_stopped_worker_warned_once

from lib.bootstrap import ROOT
from lib.config import load_config, with_overrides
from lib.data import ChipLoader, WorkerDiedError, WorkerError, WorkerStalledError
from lib.data.batch_ring import BatchRing, Field
from lib.data.epoch_plan import _MINE, stream
from lib.data.image_cache import DecodedImageCache
from lib.data.worker_pool import ProcessPool
from chip_generator.mining import MiningParams, mine_image_chips
from lib.dataset import load_roidb, read_image

MEANS = np.array([103.939, 116.779, 123.68], np.float32)


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
    # each chip's im_info and valid range follow from its ChipRef, as the reference sets them: the chip is
    # 512 x 512, at the coarsest scale the whole int(H * s) x int(W * s) image; open ends 0 and 512
    for number, batch in enumerate(first):
        arrays = dict(zip(names, batch))
        for position in range(4 - batch[-1]):
            chip, _ = plan.chip_at(number, position)
            entry = roidb[chip.image_index]
            coarsest = chip.scale_index == 2
            scaled = (int(entry["height"] * chip.im_scale), int(entry["width"] * chip.im_scale))
            size = scaled if coarsest else (512, 512)
            np.testing.assert_allclose(arrays["im_info"][position], [*size, chip.im_scale], rtol=1e-6)
            lo, hi = [[-1, 80], [32, 150], [120, -1]][chip.scale_index]
            expected = [0 if lo == -1 else lo * chip.im_scale, 512 if hi == -1 else hi * chip.im_scale]
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
        # the network is fed RGB: channel c is image channel 2 - c minus its mean; at most 512 x 512
        expected = scaled[y1 - oy:min(y2, y1 + 511) - oy + 1, x1 - ox:min(x2, x1 + 511) - ox + 1, ::-1]
        expected = expected.astype(np.float32) - MEANS[::-1]
        height, width = expected.shape[:2]
        # the reference's crop starts at int(x1 / s): content shifted by up to s scaled pixels
        assert np.abs(data[position][:, :height, :width] - expected.transpose(2, 0, 1)).mean() < 12.0
        assert not data[position][:, height + 1:, :].any() and not data[position][:, :, width + 1:].any()
        # every box of the image in the chip, in image order: (box - chip origin) * s rounded, clipped to the
        # 512 x 512 input, kept when at least 10 px each way
        origin = np.float32([x1 / scale, y1 / scale] * 2)
        moved = np.round((entry["boxes"] - origin) * np.float32(scale))
        clipped = np.clip(moved, 0, 511)
        seen = ((clipped[:, 2] - clipped[:, 0] + 1 >= 10) & (clipped[:, 3] - clipped[:, 1] + 1 >= 10)
                & (moved[:, 2] >= 0) & (moved[:, 3] >= 0) & (moved[:, 0] <= x2 - x1) & (moved[:, 1] <= y2 - y1))
        rows = gt_boxes[position][gt_boxes[position][:, 4] >= 0]
        expected_rows = np.concatenate([clipped, entry["gt_classes"][:, None]], axis=1)[seen]
        np.testing.assert_array_equal(rows, expected_rows)


def test_epochs_differ_and_chips_are_remined(inline_epochs):
    first, second, _, _, _ = inline_epochs
    assert len(first) > 1
    assert not np.array_equal(first[0][0], second[0][0])


def assert_same_batches(expected_epochs, actual_epochs):
    for expected, actual in zip(expected_epochs, actual_epochs, strict=True):
        assert len(expected) == len(actual)
        for batch_expected, batch_actual in zip(expected, actual):
            for a, b in zip(batch_expected, batch_actual):
                np.testing.assert_array_equal(a, b)


def two_epochs(roidb, cfg, workers):
    """(first epoch's batches, second's, files the two plans read, stats) of a loader with seed 11."""
    with ChipLoader(roidb, cfg, CHIPS, num_workers=workers, seed=11) as loader:
        assert len(loader.pids) == workers
        first = numpy_batches(loader)
        files = {roidb[i]["image"] for i in loader._plan.chips.image_index}
        loader.reset()
        second = numpy_batches(loader)
        files |= {roidb[i]["image"] for i in loader._plan.chips.image_index}
        return first, second, files, loader.stats


def test_workers_give_the_same_batches_as_in_process(inline_epochs, roidb, cfg):
    first, second, _, _, _ = inline_epochs
    got, got_second, files, stats = two_epochs(roidb, cfg, 2)
    assert stats.chips == sum(4 - b[-1] for b in first + second) + first[-1][-1] + second[-1][-1]
    assert_same_batches((first, second), (got, got_second))
    # every chip of a file went to the one worker that kept it decoded: one decode per file in two epochs
    assert len(files) < len(roidb) < stats.chips
    assert stats.decoded_images == len(files)


@pytest.mark.parametrize("workers", [0, 2])
def test_without_the_image_cache_every_chip_decodes_and_the_batches_are_the_same(inline_epochs, roidb, cfg,
                                                                                  workers):
    first, second, _, _, _ = inline_epochs  # built with the default cache
    got, got_second, _, stats = two_epochs(roidb, with_overrides(cfg, {"TRAIN.IMAGE_CACHE_MB": 0}), workers)
    assert_same_batches((first, second), (got, got_second))
    assert stats.decoded_images == stats.chips


def _pid_of(task):
    return ("ran", task, os.getpid())


def test_a_routed_pool_runs_every_task_of_a_key_in_one_worker():
    pool = ProcessPool(_pid_of, 2, routed=True)
    try:
        for task in range(12):
            pool.submit(task, key=task // 2 if task < 8 else None)  # keys 0..3 twice each; 4 unkeyed in turn
        ran = {}
        while len(ran) < 12:
            message = pool.get()
            if message is not None:
                ran[message[1]] = message[2]
    finally:
        pool.close()
    assert set(ran.values()) == set(pool.pids)
    assert [ran[task] for task in range(8)] == [pool.pids[key % 2] for key in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert [ran[task] for task in range(8, 12)] == [pool.pids[turn % 2] for turn in range(4)]


def test_image_cache_keeps_the_least_recently_used_within_its_bytes():
    images = {name: np.full((10, 10, 3), k, np.uint8) for k, name in enumerate("abcd")}  # 300 bytes each
    decoded = []

    def decode(name):
        decoded.append(name)
        return images[name].copy()

    cache = DecodedImageCache(600)
    for name in "abacbdd":  # a, b; a hit; c evicts b (a was used last); b evicts a; d evicts c; d hit
        image, fresh = cache.get(name, decode)
        np.testing.assert_array_equal(image, images[name])
    assert decoded == ["a", "b", "c", "b", "d"]
    assert len(cache) == 2 and cache.nbytes == 600
    with pytest.raises(ValueError, match="read-only"):
        cache.get("d", decode)[0][0, 0, 0] = 1  # a chip can never change what the next one reads
    big = DecodedImageCache(299)  # an image larger than the cache is decoded every time, never kept
    assert [big.get("a", decode)[1] for _ in range(2)] == [True, True] and len(big) == 0
    with pytest.raises(OSError):
        cache.get("missing", lambda path: (_ for _ in ()).throw(OSError(path)))
    assert len(cache) == 2


def test_valid_boxes_are_the_miners(inline_epochs, roidb, cfg):
    """Every chip of the plan carries the valid boxes the miner gave that very chip (its own assigned
    boxes, which differ between chips of one scale)."""
    _, _, plan, _, _ = inline_epochs
    params = MiningParams.from_config(cfg)
    mined = {}
    differing_sets = 0
    for index in range(plan.num_chips):
        chip = plan.chip(index)
        if chip.image_index not in mined:  # the miner's own random stream of this image and epoch
            rng = stream(plan.seed, plan.epoch, _MINE, chip.image_index)
            mined[chip.image_index] = mine_image_chips(roidb[chip.image_index], params, plan.stride, rng)
        scale = mined[chip.image_index].scales[chip.scale_index]
        chips, valid = (scale.neg_chips, scale.neg_valid) if chip.negative else (scale.pos_chips, scale.pos_valid)
        k = [tuple(float(v) for v in c) for c in chips].index(chip.box)
        assert chip.valid_boxes == tuple(valid[k])
        differing_sets += chip.valid_boxes != tuple(np.flatnonzero(scale.valid))
    assert len(mined) > 3 and differing_sets > 0


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
def damaged(synthetic_dataset, tmp_path):
    """A copy of the dataset with one corrupt, one missing and one truncated image (a real JPEG cut to
    two thirds, which the decoder alone would return with grey rows), and its roidb."""
    copy = tmp_path / "synthetic"
    shutil.copytree(synthetic_dataset(train=5, val=0), copy)
    cfg = dataset_cfg(str(copy), tmp_path / "root")
    roidb = load_roidb(cfg, "train")[0]
    corrupt, missing, truncated = roidb[0]["image"], roidb[1]["image"], roidb[2]["image"]
    with open(corrupt, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not a jpeg" * 10)
    os.remove(missing)
    with open(truncated, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) * 2 // 3])
    return cfg, roidb, corrupt, missing, truncated


@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_images_are_replaced_logged_and_counted(damaged, workers, caplog):
    cfg, roidb, corrupt, missing, truncated = damaged
    with ChipLoader(roidb, cfg, CHIPS, num_workers=workers, seed=2) as loader:
        batches = numpy_batches(loader)
        plan = loader._plan
    bad_chips = sum(roidb[i]["image"] in (corrupt, missing, truncated) for i in plan.chips.image_index)
    assert bad_chips > 0
    assert set(loader.stats.bad_images) == {corrupt, missing, truncated}
    assert loader.stats.bad_image_count >= bad_chips
    assert len(batches) == plan.num_batches
    for batch in batches:
        assert (batch[2][:, 0] > 0).all()  # every chip got content (im_info height)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert corrupt in logged and missing in logged
    assert f"unreadable image {truncated} (truncated image {truncated}: the file ends before" in logged


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


def stop_at(module, path, monkeypatch):
    """Make a worker that decodes the image at ``path`` stop itself (SIGSTOP) there: the workers are forked
    after this, so they run the patched reader."""
    from lib.dataset import image_io

    def read(entry):
        if entry["image"] == path:
            os.kill(os.getpid(), signal.SIGSTOP)
        return image_io.read_roidb_image(entry)

    monkeypatch.setattr(module, "read_roidb_image", read)


def test_a_stopped_worker_is_warned_about_then_named_with_its_image_instead_of_hanging(roidb, cfg, monkeypatch,
                                                                                         caplog):
    """TRAIN.STALL_WARN and TRAIN.LOADER_TIMEOUT reach the loader's workers: a warning, then the stop."""
    from lib.data import chip_worker

    stopped = roidb[1]["image"]
    stop_at(chip_worker, stopped, monkeypatch)
    loader = ChipLoader(roidb, with_overrides(cfg, {"TRAIN.LOADER_TIMEOUT": 2, "TRAIN.STALL_WARN": 0.5}), CHIPS,
                        num_workers=2, seed=1)
    pids = loader.pids
    try:
        with alarm(60), pytest.raises(WorkerStalledError) as info, \
                caplog.at_level(logging.WARNING, logger="lib.data.worker_pool"):
            for _ in loader:
                pass
    finally:
        loader.close()
    assert_each_stopped_worker_warned_once(caplog.records, "chip-loader", f"building a chip of image {stopped}",
                                           "TRAIN.LOADER_TIMEOUT", 2)
    match = re.fullmatch(r"data loader worker chip-loader-\d \(pid (\d+)\) has shown no sign of life for (\d+) s "
                         r"\(TRAIN.LOADER_TIMEOUT is 2 s\) while building a chip of image (.*); the process is "
                         r"stopped \(SIGSTOP or Ctrl-Z\?\); stopping rather than waiting forever", str(info.value))
    assert match, str(info.value)
    assert int(match.group(1)) in pids and int(match.group(2)) >= 2 and match.group(3) == stopped
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def start_script(dataset, tmp_path):
    script, cache = tmp_path / "run_loader.py", str(tmp_path / "root")
    script.write_text(textwrap.dedent(f"""
        import signal, time
        # Ctrl-C as a terminal delivers it, whatever this test runs under: a shell's background job
        # (`make test &`) starts its children with SIGINT ignored, and Python keeps an ignored SIGINT
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from lib.config import load_config, with_overrides
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
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    if how == signal.SIGINT:  # the loader closed itself at exit: the workers are already gone
        assert "KeyboardInterrupt" in stderr
        assert wait_gone(pids, 1) == []
    else:  # orphans notice the missing parent on their own
        assert wait_gone(pids, 10) == []
