"""The pixels of one training chip: crop, resize, flip, mean subtraction, CHW float32, zero padding.

The chip is given in the scaled image (flipped when the roidb entry is), but the scaled image is never
built: the matching region of the original image is cropped and resized, as the reference does
(TRAIN.CHIP_CROP):

* ``truncate`` (the reference): the chip in original pixels, ``x1 / s .. x2 / s``, is cut from the
  (mirrored) image as ``[int(x1 / s), int(x2 / s))`` (the inclusive end used as an exclusive one) and
  resized by the factor ``s`` (``cv2.resize`` with ``fx = fy = s``: its own output size and sampling);
  the content is then misaligned with the boxes by up to ``s`` scaled pixels and loses a source column.
* ``round``: the source window is rounded to whole pixels and resized to exactly the chip's size;
  content shifts by under one scaled pixel.
Either way the content fills the top-left corner of the network input and is cut where it is larger.

A large image (lib.dataset.large_images) comes as a WindowedImage: only the chip's window is read, and at
a scale below 1/2 it is read reduced by ``shrink_factor(s)`` (block average) and resized by the rest, so
no chip ever holds the full resolution of a coarse scale.
"""
import cv2

from lib.data.pixels import network_pixels
from lib.dataset.large_images import shrink_factor


def _window(image, top, bottom, left, right, im_scale):
    """(pixels of rows [top, bottom) and columns [left, right), the scale still to apply): a WindowedImage
    reads them reduced at coarse scales, an array is sliced."""
    shrink = shrink_factor(im_scale) if hasattr(image, "window") else 1
    if shrink > 1:
        return image.window(left, top, right, bottom, shrink), im_scale * shrink
    return image[top:bottom, left:right], im_scale


def source_region(chip, im_scale, image_width, flipped):
    """(left, top, right, bottom) of the original-image pixels (right/bottom exclusive) under ``chip``
    for the ``round`` crop.

    ``chip`` is (x1, y1, x2, y2), inclusive scaled-image pixels of the possibly mirrored image.
    """
    x1, y1, x2, y2 = (float(v) for v in chip)
    left, right = x1 / im_scale, (x2 + 1) / im_scale
    if flipped:
        left, right = image_width - right, image_width - left
    top, bottom = y1 / im_scale, (y2 + 1) / im_scale
    left, top = int(round(left)), int(round(top))
    right, bottom = max(int(round(right)), left + 1), max(int(round(bottom)), top + 1)
    return left, top, right, bottom


def _rounded_crop(image, chip, im_scale, flipped):
    x1, y1, x2, y2 = (int(round(float(v))) for v in chip)
    left, top, right, bottom = source_region(chip, im_scale, image.shape[1], flipped)
    left, top = min(max(left, 0), image.shape[1] - 1), min(max(top, 0), image.shape[0] - 1)
    crop, _ = _window(image, top, max(bottom, top + 1), left, max(right, left + 1), im_scale)
    resized = cv2.resize(crop, (x2 - x1 + 1, y2 - y1 + 1), interpolation=cv2.INTER_LINEAR)
    return cv2.flip(resized, 1) if flipped else resized


def _truncated_crop(image, chip, im_scale, flipped):
    width = image.shape[1]
    left, top, right, bottom = (int(float(v) / im_scale) for v in chip)
    right, bottom = max(right, left + 1), max(bottom, top + 1)
    if flipped:  # columns [left, right) of the mirrored image
        crop, scale = _window(image, top, bottom, max(width - right, 0), width - left, im_scale)
        crop = cv2.flip(crop, 1)
    else:
        crop, scale = _window(image, top, bottom, left, right, im_scale)
    return cv2.resize(crop, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)


def render_chip(image, chip, im_scale, flipped, pixel_means, channel_order, crop, out):
    """Write the chip of ``image`` (BGR uint8, original, unflipped; an array or a WindowedImage) into ``out`` (3, H, W) float32 with
    the ``crop`` rule (module docstring); non-square inputs work as well as square ones.

    The content fills the top-left corner, at most ``out``'s height and width, in the network's
    ``channel_order`` minus ``pixel_means`` (lib.data.pixels); the padding is 0, i.e. the mean colour.
    Returns the (height, width) of the content.
    """
    resized = (_truncated_crop if crop == "truncate" else _rounded_crop)(image, chip, im_scale, flipped)
    height, width = min(resized.shape[0], out.shape[1]), min(resized.shape[1], out.shape[2])
    network_pixels(resized[:height, :width], pixel_means, channel_order, out)
    out[:, height:, :] = 0
    out[:, :height, width:] = 0
    return height, width
