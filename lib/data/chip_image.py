"""The pixels of one training chip: crop, resize, flip, mean subtraction, CHW float32, zero padding.

The chip is given in the scaled image (flipped when the roidb entry is), but the scaled image is never
built: the matching region of the original image is cropped at whole source pixels and resized to
the chip content, then mirrored if needed. Compared with resizing the whole image first this shifts
content by under one scaled pixel and costs a fraction of the work (a 3x image is 9x the pixels).
"""
import cv2

from lib.data.pixels import network_pixels


def source_region(chip, im_scale, image_width, flipped):
    """(left, top, right, bottom) of the original-image pixels (right/bottom exclusive) under ``chip``.

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


def render_chip(image, chip, im_scale, flipped, pixel_means, channel_order, out):
    """Write the chip of ``image`` (BGR uint8, original, unflipped) into ``out`` (3, H, W) float32;
    the chip must fit ``out``'s own height and width (non-square inputs work as well as square ones).

    The content fills the top-left ``height x width`` corner (the chip's size) in the network's
    ``channel_order`` minus ``pixel_means`` (lib.data.pixels); the padding is 0, i.e. the mean colour.
    Returns (height, width).
    """
    x1, y1, x2, y2 = (int(round(float(v))) for v in chip)
    height, width = y2 - y1 + 1, x2 - x1 + 1
    if not (0 < height <= out.shape[1] and 0 < width <= out.shape[2]):
        raise ValueError(f"chip {list(chip)} does not fit the {out.shape[1]} x {out.shape[2]} network input")
    left, top, right, bottom = source_region(chip, im_scale, image.shape[1], flipped)
    left, top = min(max(left, 0), image.shape[1] - 1), min(max(top, 0), image.shape[0] - 1)
    crop = image[top:max(bottom, top + 1), left:max(right, left + 1)]
    resized = cv2.resize(crop, (width, height), interpolation=cv2.INTER_LINEAR)
    if flipped:
        resized = cv2.flip(resized, 1)
    network_pixels(resized, pixel_means, channel_order, out)
    out[:, height:, :] = 0
    out[:, :height, width:] = 0
    return height, width
