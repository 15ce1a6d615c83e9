"""Very large images (aerial, satellite, pathology, scanned documents) read by windows, never whole.

An image whose annotated size exceeds ``LARGE_IMAGE_PIXELS`` is opened with libvips (pyvips, with the
libvips shipped in the pyvips-binary wheel): the file is decoded once per process and only the requested
windows reach memory. Tiled TIFF (BigTIFF too) is read tile by tile from the file; a JPEG, PNG or
stripped TIFF is decoded once, streamed into a temporary file that libvips keeps for the windows (its
"disc threshold"), so memory stays bounded whatever the image size. libvips was chosen over tifffile +
imagecodecs because it also decodes large JPEG and PNG by streaming (tifffile reads TIFF only) and
shrinks a window while reading it.

Smaller images keep the OpenCV path (lib.dataset.image_io) unchanged, so results on ordinary datasets do
not move. Pixels come back as BGR uint8 (H, W, 3), as ``read_image`` gives them: grey is replicated, an
alpha band dropped, 16-bit samples shifted to 8 bits as OpenCV does.

A window read at a scale below 1/2 is first reduced by the integer factor ``shrink_factor(scale)`` (a
block average, which also anti-aliases), then resized by the rest of the scale: the coarse scales of a
20,000 px image never hold its full resolution.
"""
import math
import os
from collections import OrderedDict

import numpy as np

from lib.dataset.image_io import check_annotated_size

# 6000 x 6000: the decoded image would take 108 MB and the whole-image test canvases at the usual scales
# several GB; below it nothing changes.
LARGE_IMAGE_PIXELS = 6000 * 6000
_OPEN_HANDLES = 4  # opened images kept per process (an image's windows are read close together)
# libvips threads per window read. Its default is one per core, and each thread holds its own input
# region (a window reduced by k reads k x k times its output area), so the resident memory of a read grew
# with the core count (the 20,000 px test: 0.39 GB with 2 threads, 0.60 GB with 64). A fixed count keeps
# the bound machine-independent; VIPS_CONCURRENCY in the environment still decides if set.
WINDOW_READ_THREADS = 2


def is_large(height, width):
    """Whether an image of this (annotated) size is read by windows."""
    return height * width > LARGE_IMAGE_PIXELS


def shrink_factor(scale):
    """The integer factor (>= 1) a window read at ``scale`` is reduced by before the final resize."""
    return max(int(math.floor(1.0 / scale + 1e-9)), 1) if scale < 0.5 else 1


def _vips():
    """pyvips, imported on first use: a process that never reads a large image never starts libvips's
    threads (forked loader and test workers start their own)."""
    try:
        import pyvips
    except (ImportError, OSError) as err:
        raise IOError(f"reading an image larger than {LARGE_IMAGE_PIXELS} pixels needs pyvips and pyvips-binary "
                      f"(requirements.txt): {err}") from None
    if "VIPS_CONCURRENCY" not in os.environ:
        pyvips.concurrency_set(WINDOW_READ_THREADS)
    return pyvips


class WindowedImage:
    """A large image file opened for window reads. Supports ``shape`` and ``image[top:bottom, left:right]``
    (clamped to the image, as NumPy slices are), so the chip cropping code takes it as an array."""

    def __init__(self, path):
        pyvips = _vips()
        self.path = path
        try:
            self._image = pyvips.Image.new_from_file(path, access="random", fail_on="truncated")
        except pyvips.Error as err:
            raise IOError(f"cannot decode image {path}: {_first_line(err)}") from None
        self.shape = (self._image.height, self._image.width, 3)

    def __getitem__(self, index):
        rows, cols = index
        top, bottom, _ = rows.indices(self.shape[0])
        left, right, _ = cols.indices(self.shape[1])
        return self.window(left, top, right, bottom)

    def window(self, left, top, right, bottom, shrink=1):
        """BGR uint8 pixels of columns [left, right) and rows [top, bottom), reduced by the integer
        ``shrink`` (box average; the result has ceil(extent / shrink) pixels a side)."""
        left, top = max(int(left), 0), max(int(top), 0)
        right, bottom = min(int(right), self.shape[1]), min(int(bottom), self.shape[0])
        if right <= left or bottom <= top:
            return np.zeros((max(bottom - top, 0), max(right - left, 0), 3), np.uint8)
        region = self._image.crop(left, top, right - left, bottom - top)
        if shrink > 1:
            region = region.shrink(shrink, shrink, ceil=True)
        try:
            return _to_bgr8(region)
        except _vips().Error as err:
            raise IOError(f"cannot decode image {self.path}: {_first_line(err)}") from None


def _to_bgr8(region):
    """A libvips region as OpenCV's IMREAD_COLOR would give it: BGR uint8 (H, W, 3)."""
    if region.bands in (2, 4):  # alpha
        region = region.extract_band(0, n=region.bands - 1)
    if region.format in ("ushort", "short"):
        region = region >> 8
    if region.format != "uchar":
        region = region.cast("uchar")
    pixels = np.ndarray(buffer=region.write_to_memory(), dtype=np.uint8,
                        shape=(region.height, region.width, region.bands))
    if pixels.shape[2] == 1:
        return np.repeat(pixels, 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, 2::-1])


def _first_line(err):
    return str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__


class WindowedImages:
    """The opened large images of one process, the most recently used ``_OPEN_HANDLES`` kept."""

    def __init__(self):
        self._open = OrderedDict()

    def open(self, path):
        """The WindowedImage of ``path`` (IOError when it cannot be opened)."""
        image = self._open.pop(path, None)
        if image is None:
            image = WindowedImage(path)
            while len(self._open) >= _OPEN_HANDLES:
                self._open.popitem(last=False)
        self._open[path] = image
        return image


OPENED = WindowedImages()  # per process: forked workers start with the parent's (empty) one


def open_windowed(entry):
    """A roidb entry's image opened for window reads (size checked against the annotation) when it is
    large, else None (read it whole)."""
    if not is_large(entry["height"], entry["width"]):
        return None
    return check_annotated_size(entry, OPENED.open(entry["image"]))


def write_tiled_tiff(image, path, tile=512):
    """Write a BGR uint8 array as a tiled, deflate-compressed BigTIFF (RGB), the layout large-image
    formats use (tests, benchmarks)."""
    rgb = np.ascontiguousarray(image[:, :, ::-1])
    vips = _vips().Image.new_from_memory(rgb.data, rgb.shape[1], rgb.shape[0], 3, "uchar")
    vips.tiffsave(path, tile=True, tile_width=tile, tile_height=tile, compression="deflate", bigtiff=True)
