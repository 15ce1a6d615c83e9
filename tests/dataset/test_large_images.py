"""Large images read by windows (lib.dataset.large_images): pixels as OpenCV decodes them (PNG, JPEG, tiled
and strip TIFF), reduced reads, bad files, training chips from windows, the resident memory of the tiled
test and of the chip cropping on a 20,000 x 20,000 image (measured in a subprocess), and the benchmark
tool's whole / tiled / AutoFocus-tiled rows."""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import tifffile

from lib.bootstrap import ROOT
from lib.data.chip_image import render_chip
from lib.dataset.image_io import read_image
from lib.dataset.large_images import WindowedImage, is_large, open_windowed, shrink_factor, write_tiled_tiff

RNG = np.random.default_rng(7)
COLOUR = RNG.integers(0, 255, (37, 53, 3), dtype=np.uint8)
JPEG_SAMPLING = {"420.jpg": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420],
                 "422.jpg": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
                 "444.jpg": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
                             cv2.IMWRITE_JPEG_PROGRESSIVE, 1]}


@pytest.mark.parametrize("name, pixels", [
    ("colour.png", COLOUR),
    ("grey.png", COLOUR[:, :, 0]),
    ("alpha.png", np.dstack([COLOUR, COLOUR[:, :, :1]])),
    ("deep.png", COLOUR.astype(np.uint16) * 257 + 3),
    ("tiled.tif", COLOUR),
    ("420.jpg", COLOUR),  # JPEG chroma subsampling 4:2:0, 4:2:2, 4:4:4 (progressive): libvips decodes with
    ("422.jpg", COLOUR),  # mozjpeg, OpenCV with libjpeg-turbo: the same decoder (mozjpeg changes only the
    ("444.jpg", COLOUR),  # encoder), the same integer IDCT and upsampling, so the same pixels
])
def test_windows_are_the_pixels_opencv_decodes(tmp_path, name, pixels):
    path = str(tmp_path / name)
    if name.endswith(".tif"):  # tiled BigTIFF, tiles of 16 px: windows across tile edges
        write_tiled_tiff(pixels, path, tile=16)
    else:
        cv2.imwrite(path, pixels, JPEG_SAMPLING.get(name, []))
    expected = read_image(path) if not name.endswith(".tif") else COLOUR
    image = WindowedImage(path)
    assert image.shape == expected.shape
    np.testing.assert_array_equal(image[5:30, 7:50], expected[5:30, 7:50])
    np.testing.assert_array_equal(image[30:99, 40:99], expected[30:, 40:])  # clamped like a NumPy slice


@pytest.fixture(scope="module")
def large_pixels():
    """6001 x 6000 px, just over LARGE_IMAGE_PIXELS (read by windows), decoded 108 MB: over libvips's 100 MiB
    disc threshold, so a JPEG or strip TIFF is decoded into a temporary file. Gradients and a fine
    pattern: every JPEG block has detail, every strip its own rows."""
    height, width = 6001, 6000
    pixels = np.empty((height, width, 3), np.uint8)
    pixels[:, :, 0] = (np.arange(width, dtype=np.uint32) * 255 // width).astype(np.uint8)[None]
    pixels[:, :, 1] = (np.arange(height, dtype=np.uint32) * 255 // height).astype(np.uint8)[:, None]
    pixels[:, :, 2] = np.arange(width, dtype=np.uint8)[None] ^ np.arange(height, dtype=np.uint8)[:, None]
    return pixels


def deleted_files():
    """{descriptor: size} of the files this process holds open that are no longer in any folder."""
    held = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(" (deleted)"):
                held[fd] = os.stat(f"/proc/self/fd/{fd}").st_size
        except OSError:  # closed meanwhile (the listing's own descriptor)
            pass
    return held


@pytest.mark.parametrize("name", ["large.jpg", "strips.tif"])
def test_windows_of_a_large_jpeg_and_a_strip_tiff_are_the_pixels_opencv_decodes(tmp_path, large_pixels, name):
    """OpenCV writes TIFF in strips of one row (LZW): libvips reads both formats sequentially, so it decodes
    them once into a temporary file (deleted, held open) and cuts the windows from it; they are exactly
    OpenCV's decode of the same file, across strip and JPEG block edges and at the image's edges."""
    path = str(tmp_path / name)
    cv2.imwrite(path, large_pixels, [cv2.IMWRITE_JPEG_QUALITY, 90] if name.endswith(".jpg") else [])
    if name.endswith(".tif"):
        with tifffile.TiffFile(path) as tiff:
            assert not tiff.pages[0].is_tiled and tiff.pages[0].rowsperstrip == 1
    expected = read_image(path)
    held = deleted_files()
    image = open_windowed({"image": path, "height": 6001, "width": 6000})
    windows = [(0, 0, 300, 200), (2999, 3001, 3777, 3517), (5701, 5800, 6000, 6001), (1, 4093, 6000, 4101)]
    for left, top, right, bottom in windows:
        np.testing.assert_array_equal(image.window(left, top, right, bottom), expected[top:bottom, left:right])
    decoded = {fd: size for fd, size in deleted_files().items() if fd not in held}
    assert any(size >= 6001 * 6000 * 3 for size in decoded.values()), decoded


def test_a_reduced_window_is_the_block_average_of_the_window(tmp_path):
    assert [shrink_factor(s) for s in (1.0, 0.5, 0.49, 0.25, 0.1, 512 / 20000)] == [1, 1, 2, 4, 10, 39]
    path = str(tmp_path / "colour.png")
    cv2.imwrite(path, COLOUR)
    window = WindowedImage(path).window(3, 4, 43, 36, 4)  # 40 x 32 -> 10 x 8
    blocks = COLOUR[4:36, 3:43].reshape(8, 4, 10, 4, 3).astype(np.float64).mean(axis=(1, 3))
    assert window.shape == (8, 10, 3)
    # libvips averages in integers (the mean of 16 samples to uint8): within one grey level
    np.testing.assert_allclose(window, blocks, atol=1.0)
    assert np.abs(window - blocks).mean() < 0.5


def test_unreadable_truncated_and_missized_large_files_are_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.tif"
    garbage.write_bytes(b"II*\x00 not a tiff")
    with pytest.raises(IOError, match="garbage.tif"):
        WindowedImage(str(garbage))
    cut = tmp_path / "cut.jpg"
    data = cv2.imencode(".jpg", np.tile(COLOUR, (20, 20, 1)))[1].tobytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(IOError, match="cut.jpg"):
        WindowedImage(str(cut))[0:740, 0:1060]
    big = tmp_path / "big.png"
    cv2.imwrite(str(big), np.zeros((10, 12, 3), np.uint8))
    assert open_windowed({"image": str(big), "height": 10, "width": 12}) is None  # small: read whole
    assert is_large(6001, 6000) and not is_large(6000, 6000)
    with pytest.raises(IOError, match=r"is 12x10 pixels, but its annotations say 8000x7000"):
        open_windowed({"image": str(big), "height": 7000, "width": 8000})


@pytest.mark.parametrize("crop", ["truncate", "round"])
@pytest.mark.parametrize("flipped", [False, True])
def test_training_chips_from_windows_are_the_chips_of_the_decoded_image(tmp_path, crop, flipped):
    """At scales >= 1/2 a window is exactly the array's slice: the same chip, bit for bit. Below, the
    window is reduced first: the chip is close to the direct resize (both sample the same smooth image;
    the block average differs from bilinear sampling by a few grey levels on this smooth gradient)."""
    yy, xx = np.mgrid[0:300, 0:400]
    image = np.dstack([xx * 255 // 400, yy * 255 // 300, (xx + yy) * 255 // 700]).astype(np.uint8)
    path = str(tmp_path / "gradient.png")
    cv2.imwrite(path, image)
    windowed = WindowedImage(path)
    means = (103.06, 115.9, 123.15)
    for scale, chip in [(1.5, (30.0, 45.0, 120.0, 140.0)), (0.5, (10.0, 20.0, 90.0, 110.0))]:
        expected, got = (np.zeros((3, 128, 128), np.float32) for _ in range(2))
        assert render_chip(image, chip, scale, flipped, means, "RGB", crop, expected) == \
            render_chip(windowed, chip, scale, flipped, means, "RGB", crop, got)
        np.testing.assert_array_equal(got, expected)
    expected, got = (np.zeros((3, 64, 64), np.float32) for _ in range(2))
    chip = (0.0, 0.0, 39.0, 29.0)  # the whole image at scale 0.1: read reduced by 10
    render_chip(image, chip, 0.1, flipped, means, "RGB", crop, expected)
    render_chip(windowed, chip, 0.1, flipped, means, "RGB", crop, got)
    np.testing.assert_allclose(got[:, :29, :39], expected[:, :29, :39], atol=4)


WRITE_SCRIPT = r"""
import json, sys
import pyvips
path, side = sys.argv[1], 20000
squares = [(1000 + 1600 * i, 700 + 1500 * i, 8 + 4 * i) for i in range(12)]  # sparse, 8-52 px
image = pyvips.Image.black(side, side, bands=3)  # composed lazily, streamed into the file
for x, y, size in squares:
    image = image.insert(pyvips.Image.black(size, size, bands=3) + 255, x, y)
image.cast("uchar").tiffsave(path, tile=True, compression="deflate", bigtiff=True)
print(json.dumps(squares))
"""

MEMORY_SCRIPT = r"""
import json, sys
import numpy as np
sys.path[:0] = [{root!r}, {tests!r}]
path, side = sys.argv[1], 20000
from lib.inference.streaming import RoidbImages
from detector_helpers import stand_in_detector
detector = stand_in_detector(SCALES=[0.25, 0.1, 512.0], VALID_RANGES=[[-1, -1]] * 3, TILE=[1024, 128])
entry = {{"image": path, "height": side, "width": side}}
found = dict(detector.run(RoidbImages([entry])))[0]

from lib.data.chip_image import render_chip
from lib.dataset.large_images import open_windowed
out = np.zeros((3, 512, 512), np.float32)
for scale, chip in [(3.0, (3000.0, 2100.0, 3511.0, 2611.0)), (1.667, (0.0, 0.0, 511.0, 511.0)),
                    (512 / side, (0.0, 0.0, 511.0, 511.0))]:
    render_chip(open_windowed(entry), chip, scale, False, (0, 0, 0), "RGB", "truncate", out)
import pyvips
from lib.benchmarking import peak_rss_bytes
print(json.dumps({{"peak_kb": peak_rss_bytes() // 1024,
                  "vips_threads": pyvips.concurrency_get(), "boxes": found[:, :4].tolist()}}))
"""

# The stated bound of the tiled test on one 20,000 x 20,000 image at three scales in 1024 px tiles, and of
# cutting training chips from it: the process imports MXNet, OpenCV and libvips (about 300 MB), one tile
# canvas is 12 MB; the whole decoded image alone would be 1,200 MB. libvips reads with a fixed number of
# threads (large_images.WINDOW_READ_THREADS), so the bound does not depend on the machine's core count.
LARGE_IMAGE_RSS_BOUND_MB = 1000


def test_tiled_test_and_chips_of_a_20000_px_image_stay_within_a_fixed_resident_memory(tmp_path):
    """The file is written by a process of its own: only reading it is measured."""
    from lib.dataset.large_images import WINDOW_READ_THREADS

    path = str(tmp_path / "large.tif")
    env = {key: value for key, value in os.environ.items() if key != "VIPS_CONCURRENCY"}
    env.update(TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    written = subprocess.run([sys.executable, "-c", WRITE_SCRIPT, path], capture_output=True, text=True, env=env,
                             timeout=300, cwd=ROOT)
    assert written.returncode == 0, written.stderr[-3000:]
    squares = json.loads(written.stdout.strip().splitlines()[-1])
    script = MEMORY_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    done = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["vips_threads"] == WINDOW_READ_THREADS
    assert report["peak_kb"] / 1024 < LARGE_IMAGE_RSS_BOUND_MB, report["peak_kb"]
    # every square found where it is (to 4 px: the finest scale, 0.25, reads 4 x 4 pixel blocks)
    found = np.array(report["boxes"])
    for x, y, size in squares:
        distance = np.abs(found - [x, y, x + size, y + size]).max(axis=1)
        assert distance.min() <= 4, (x, y, size)


def random_checkpoint(config, path, focus=None):
    """A randomly initialised checkpoint of ``config``'s network (6 classes: the synthetic set's) at ``path``;
    ``focus`` "everywhere": its FocusPixel branch calls every cell a small object's."""
    import mxnet as mx

    from lib.config import load_config
    from lib.inference.mxnet_network import DATA_NAMES
    from symbols import inference_symbol

    cfg = load_config(config, {"gpus": ""})
    module = mx.mod.Module(inference_symbol(cfg, 6), data_names=DATA_NAMES, label_names=None, context=mx.cpu())
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Normal(0.01))
    args, aux = module.get_params()
    if focus == "everywhere":
        args["conv_new_out_weight"][:] = 0
        args["conv_new_out_bias"][:] = mx.nd.array([-10, 10])
    mx.nd.save(path, {**{f"arg:{k}": v for k, v in args.items()}, **{f"aux:{k}": v for k, v in aux.items()}})
    return path


def test_benchmark_tool_compares_whole_tiled_and_autofocus_tests_in_processes_of_their_own(tmp_path, tiny_config):
    """A small set (one 700 x 900 image), random tiny checkpoints: the three rows, figures present and
    consistent (the tiled pyramid processes more pixels than the one whole-image scale; AutoFocus, whose
    FocusPixels are everywhere, processes every finer scale whole, in the tiles of the tiled pyramid)."""
    focus_config = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny_autofocus.yml")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "benchmark_large_images.py"), "--cfg", tiny_config,
         "--checkpoint", random_checkpoint(tiny_config, str(tmp_path / "tiny-0001.params")),
         "--focus-cfg", focus_config,
         "--focus-checkpoint", random_checkpoint(focus_config, str(tmp_path / "focus-0001.params"), "everywhere"),
         "--sizes", "700x900", "--objects-per-mp", "20", "--scales", "1.0", "0.5", "512",
         "--tile", "512", "128", "--whole-long-side", "600", "--set", "gpus=", f"dataset.root_path={tmp_path}",
         "--out", str(tmp_path / "bench")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| test")}
    assert set(rows) == {"whole", "tiled", "autofocus-tiled"}, done.stdout
    # whole: one scale, 900 -> 600 px: 700 * 900 * (2/3)^2 = 0.28 Mpx; tiled: more than scale 1.0 alone
    assert float(rows["whole"][1]) == pytest.approx(0.28, abs=0.05)
    assert float(rows["tiled"][1]) > 0.63
    assert rows["autofocus-tiled"][0] == "[512.0, 0.5, 1.0]"  # coarsest first
    assert float(rows["autofocus-tiled"][1]) == pytest.approx(float(rows["tiled"][1]), rel=0.02)
    assert all(float(rows[mode][3]) > 0 for mode in rows)  # peak RSS


def test_a_large_file_cut_short_is_a_bad_image_of_the_loader_not_a_crash(tmp_path, monkeypatch):
    """The training worker reads a large image's window only when it renders the chip: a file that fails
    there (truncated) is reported as the loader reports an unreadable image."""
    import lib.dataset.large_images as large_images
    from lib.data.chip_worker import ChipWorker

    cut = tmp_path / "cut.jpg"
    data = cv2.imencode(".jpg", np.tile(COLOUR, (20, 20, 1)))[1].tobytes()
    cut.write_bytes(data[:len(data) // 2])
    monkeypatch.setattr(large_images, "LARGE_IMAGE_PIXELS", 100)  # this 1060 x 740 file counts as large
    entry = {"image": str(cut), "height": 740, "width": 1060, "flipped": False}

    from types import SimpleNamespace

    chip = SimpleNamespace(image_index=0, box=(0.0, 0.0, 511.0, 511.0), im_scale=1.0)
    batch = {"data": np.zeros((1, 3, 512, 512), np.float32)}
    worker = ChipWorker.__new__(ChipWorker)  # only what building the chip's pixels needs
    worker.roidb, worker.ring = [entry], SimpleNamespace(slot=lambda slot: batch)
    worker.pixel_means, worker.channel_order, worker.crop = np.zeros(3, np.float32), "RGB", "truncate"
    message = worker.make_chip(0, 0, "tag", chip, 0)
    assert message[0] == "bad_image" and message[3] == str(cut) and "cut.jpg" in message[4]
