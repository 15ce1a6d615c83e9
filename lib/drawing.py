"""Pictures of boxes (and instance masks), shared by the demo, the visualisers and the Python API (``Detector.draw``).

Images are BGR uint8, boxes inclusive-pixel ``(x1, y1, x2, y2)``; colours are BGR tuples. Every function
returns a new image and leaves its input untouched.
"""
import cv2
import numpy as np

FONT = cv2.FONT_HERSHEY_SIMPLEX
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
MASK_ALPHA = 0.5  # weight of a mask's colour over the pixels it covers


def class_palette(num_classes, seed=7):
    """A distinct, light enough BGR colour per class label (the same for every picture of a run)."""
    return [tuple(int(c) for c in row) for row in np.random.default_rng(seed).integers(60, 255, (num_classes, 3))]


def _line_width(image):
    return max(1, round(max(image.shape[:2]) / 500))


def draw_boxes(image, boxes, colour, thickness=None, factor=1.0):
    """Copy of ``image`` with the outline of every box (given in pixels of an image ``1 / factor`` as large)."""
    canvas = image.copy()
    thickness = thickness or _line_width(image)
    for x1, y1, x2, y2 in np.asarray(boxes, np.float64).reshape(-1, 4) * factor:
        cv2.rectangle(canvas, (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2))), colour, thickness,
                      cv2.LINE_AA)
    return canvas


def draw_tagged_boxes(image, boxes, tags, colours, thickness=None):
    """Copy of ``image`` with each box outlined in its colour and its tag (text) on a filled label above it."""
    canvas = image.copy()
    thickness = thickness or _line_width(image)
    font_scale = max(0.4, max(image.shape[:2]) / 1500)
    for (x1, y1, x2, y2), tag, colour in zip(np.asarray(boxes, np.float64).reshape(-1, 4), tags, colours):
        top_left, bottom_right = (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2)))
        cv2.rectangle(canvas, top_left, bottom_right, colour, thickness)
        (w, h), base = cv2.getTextSize(tag, FONT, font_scale, 1)
        y = max(top_left[1], h + base)
        cv2.rectangle(canvas, (top_left[0], y - h - base), (top_left[0] + w, y), colour, -1)
        cv2.putText(canvas, tag, (top_left[0], y - base), FONT, font_scale, BLACK, 1, cv2.LINE_AA)
    return canvas


def draw_masks(image, masks, colours, alpha=MASK_ALPHA):
    """Copy of ``image`` with each boolean (H, W) mask tinted in its colour (later masks on top)."""
    canvas = image.copy()
    for mask, colour in zip(masks, colours):
        canvas[mask] = (canvas[mask] * (1 - alpha) + np.asarray(colour, np.float64) * alpha).astype(np.uint8)
    return canvas


def draw_detections(image, detections, names, thresh, colours=None, masks=None):
    """Copy of ``image`` with a box and a "name score" tag per detection (rows ``x1, y1, x2, y2, score,
    label``) scoring at least ``thresh``, and its instance mask (``masks``: boolean (N, H, W), one per
    row) tinted under it; best drawn last (on top). ``colours``: one per label (default:
    ``class_palette``), or a single colour for every detection."""
    detections = np.asarray(detections, np.float32).reshape(-1, 6)
    keep = detections[:, 4] >= thresh
    shown = detections[keep][::-1]
    colours = class_palette(len(names)) if colours is None else colours
    per_label = isinstance(colours, list)
    labels = shown[:, 5].astype(int)
    shown_colours = [colours[label] if per_label else colours for label in labels]
    if masks is not None:
        image = draw_masks(image, np.asarray(masks, bool)[keep][::-1], shown_colours)
    tags = [f"{names[label]} {score:.2f}" for label, score in zip(labels, shown[:, 4])]
    return draw_tagged_boxes(image, shown[:, :4], tags, shown_colours)


def legend(width, items, height=24):
    """A white strip ``width`` px wide naming what each colour means: ``items`` = [(text, colour), ...]."""
    strip = np.full((height, width, 3), 255, np.uint8)
    x = 6
    for text, colour in items:
        cv2.rectangle(strip, (x, 6), (x + 14, height - 6), colour, -1)
        x += 20
        cv2.putText(strip, text, (x, height - 8), FONT, 0.45, BLACK, 1, cv2.LINE_AA)
        x += cv2.getTextSize(text, FONT, 0.45, 1)[0][0] + 16
    return strip


def grid(pictures, columns, background=255):
    """The pictures tiled row by row, ``columns`` a row, each cell the size of the largest picture."""
    if not pictures:
        raise ValueError("grid: no pictures")
    height = max(p.shape[0] for p in pictures)
    width = max(p.shape[1] for p in pictures)
    rows = -(-len(pictures) // columns)
    canvas = np.full((rows * height, columns * width, 3), background, np.uint8)
    for index, picture in enumerate(pictures):
        top, left = (index // columns) * height, (index % columns) * width
        canvas[top:top + picture.shape[0], left:left + picture.shape[1]] = picture
    return canvas
