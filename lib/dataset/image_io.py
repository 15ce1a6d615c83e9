"""Image reading shared by the data loader, the tester and the tools.

Every image reaches the network as BGR uint8 (H, W, 3), whatever its file holds (grayscale, an alpha
channel, 16-bit samples), so the rest of the pipeline never branches on image format.
"""
import cv2
import numpy as np

# EXIF orientation is ignored: annotation files give boxes in the stored pixel frame (as PIL and
# pycocotools see it), and rotating the pixels would move every object away from its box.
_READ_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


def read_image(path):
    """Return the image at ``path`` as BGR uint8 (H, W, 3); raise IOError naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise IOError(f"cannot read image {path}: {err.strerror or err}") from None
    # imdecode on the bytes (rather than imread) works for any path encoding and separates
    # "cannot open" from "cannot decode".
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), _READ_FLAGS) if data else None
    if image is None:
        raise IOError(f"cannot decode image {path}: not a supported image file ({len(data)} bytes)")
    return image
