"""Image reading shared by the data loader, the tester and the tools.

Every image reaches the network as BGR uint8 (H, W, 3), whatever its file holds (grayscale, an alpha
channel, 16-bit samples), so the rest of the pipeline never branches on image format.

A truncated JPEG or PNG is refused: the decoders fill the missing rows with grey and report nothing,
so a file cut short by an interrupted copy would otherwise be trained on, or tested, silently.

A JPEG or PNG whose header declares more pixels than allowed (``dataset.MAX_IMAGE_PIXELS``), or another
size than its annotations, is refused before it is decoded: a small file can decode to gigapixels (a
decompression bomb) and take the process down by memory.
"""
import re

import cv2
import numpy as np

from configs.default import DEFAULTS
from lib.errors import DataFileError

# Where no config is at hand (a tool given a folder of images), the pixel limit is the key's default.
DEFAULT_MAX_PIXELS = DEFAULTS["dataset"]["MAX_IMAGE_PIXELS"]

# EXIF orientation is ignored: annotation files give boxes in the stored pixel frame (as PIL and
# pycocotools see it), and rotating the pixels would move every object away from its box.
_READ_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
_JPEG_START = b"\xff\xd8"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# In entropy-coded JPEG data an 0xFF byte is followed by 0x00 (a stuffed byte), a restart marker
# (0xD0-0xD7) or fill (0xFF); anything else is the marker that ends the scan.
_END_OF_SCAN = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _jpeg_truncated(data):
    """True when the JPEG's marker segments end before its end-of-image marker (FFD9).

    The segments are walked by their lengths (an embedded EXIF thumbnail, with an FFD9 of its own, is
    skipped whole), so bytes after the end-of-image marker (padding, a camera's trailer) are allowed.
    A structure this walk does not understand is left to the decoder.
    """
    pos = 2
    while pos + 2 <= len(data):
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
        elif marker == 0xD9:
            return False
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            pos += 2
        else:
            if pos + 4 > len(data):
                return True
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
            if marker == 0xDA:  # start of scan: entropy-coded data up to the next marker
                end = _END_OF_SCAN.search(data, pos)
                if end is None:
                    return True
                pos = end.start()
    return True


def _png_truncated(data):
    """True when the PNG's chunks end before its IEND chunk."""
    pos = len(_PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IEND":
            return False
        pos += 12 + length  # length, type, data, CRC
    return True


# JPEG start-of-frame markers (which carry the frame's size): C0-CF but DHT (C4), JPG (C8) and DAC (CC)
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def declared_size(data):
    """``(height, width)`` that a JPEG or PNG's header declares, read without decoding a pixel; None for
    other formats or a header this walk does not understand (their decoders keep their own limits)."""
    if data.startswith(_PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")
    if not data.startswith(_JPEG_START):
        return None
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
        elif marker in _JPEG_FRAMES:
            return (int.from_bytes(data[pos + 5:pos + 7], "big"), int.from_bytes(data[pos + 7:pos + 9], "big")) \
                if pos + 9 <= len(data) else None
        elif 0xD0 <= marker <= 0xD9 or marker == 0x01:  # no length; a scan or the end before any frame
            return None
        else:
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return None


def read_image(path, max_pixels=DEFAULT_MAX_PIXELS, expected_size=None):
    """Return the image at ``path`` as BGR uint8 (H, W, 3); raise IOError naming the file otherwise
    (unreadable, or ``decode_image``'s refusals)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise DataFileError(f"cannot read image {path}: {err.strerror or err}") from None
    return decode_image(data, path, max_pixels, expected_size)


def check_image_bytes(data, name, max_pixels=DEFAULT_MAX_PIXELS, expected_size=None):
    """What can be refused of an image file's bytes ``data`` without decoding a pixel (DataFileError naming
    ``name``): a JPEG/PNG declaring a size other than ``expected_size`` (height, width: the annotated one), or
    more than ``max_pixels`` pixels (the config's dataset.MAX_IMAGE_PIXELS where there is a config; 0: no
    limit), or cut short. Returns the declared (height, width), None for other formats."""
    size = declared_size(data)
    if size is not None and expected_size is not None and size != tuple(expected_size):
        raise DataFileError(size_mismatch(name, size, expected_size))
    if size is not None:
        check_pixel_limit(name, size, max_pixels)
    if data.startswith(_JPEG_START) and _jpeg_truncated(data) or \
            data.startswith(_PNG_SIGNATURE) and _png_truncated(data):
        raise DataFileError(f"truncated image {name}: the file ends before its end-of-image marker "
                            f"({len(data)} bytes; an interrupted copy or download?)")
    return size


def decode_image(data, name, max_pixels=DEFAULT_MAX_PIXELS, expected_size=None):
    """An image file's bytes ``data`` as BGR uint8 (H, W, 3), checked first by ``check_image_bytes``; a
    DataFileError naming ``name`` otherwise."""
    check_image_bytes(data, name, max_pixels, expected_size)
    # imdecode on the bytes (rather than imread) works for any path encoding and separates
    # "cannot open" from "cannot decode".
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), _READ_FLAGS) if data else None
    if image is None:
        raise DataFileError(f"cannot decode image {name}: not a supported image file ({len(data)} bytes)")
    return image


def check_pixel_limit(path, size, max_pixels):
    """Refuse (DataFileError) an image whose file declares (height, width) ``size`` over ``max_pixels``
    (dataset.MAX_IMAGE_PIXELS; 0: no limit), before anything decodes it."""
    if max_pixels and size[0] * size[1] > max_pixels:
        raise DataFileError(f"image {path} declares {size[1]}x{size[0]} pixels ({size[0] * size[1] / 1e6:.0f} Mpx), "
                            f"more than dataset.MAX_IMAGE_PIXELS ({max_pixels / 1e6:.0f} Mpx); not decoded (a "
                            f"decompression bomb, or raise the limit for a genuine large image)")


def read_roidb_image(entry):
    """The image of a roidb entry (``read_image``), refused when its size is not the annotated one
    (``check_annotated_size``; from the header, before decoding, for JPEG and PNG)."""
    return check_annotated_size(entry, read_image(entry["image"], expected_size=(entry["height"], entry["width"])))


def size_mismatch(path, size, annotated):
    """The message of an image whose (height, width) ``size`` is not its ``annotated`` one."""
    return f"image {path} is {size[1]}x{size[0]} pixels, but its annotations say {annotated[1]}x{annotated[0]}"


def check_annotated_size(entry, image):
    """``image``, or IOError when its size is not the roidb ``entry``'s annotated one (boxes, chips and test
    canvases are all planned from the annotated size); training's loader and the tester give the same
    message."""
    if image.shape[:2] != (entry["height"], entry["width"]):
        raise DataFileError(size_mismatch(entry["image"], image.shape[:2], (entry["height"], entry["width"])))
    return image
