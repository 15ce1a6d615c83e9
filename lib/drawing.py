"""Pictures of boxes and instance masks, shared by the demo, the visualisers and the Python API
(``Detector.draw``).

Images are BGR uint8, boxes inclusive-pixel ``(x1, y1, x2, y2)``; colours are BGR tuples. Every function
returns a new image and leaves its input untouched. One palette (``class_palette``, indexed by label,
0 the background) colours a class alike in the demo and every viewer; lines and text grow with the
image; a detection's tag stays inside the image and is moved off the tags already placed.
``write_picture`` saves one atomically.
"""
import functools
import os

import cv2
import numpy as np

from lib.atomic import write_bytes

FONT = cv2.FONT_HERSHEY_SIMPLEX
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
MASK_ALPHA = 0.5  # weight of a mask's colour over the pixels it covers


BACKGROUND_COLOUR = (128, 128, 128)


# Okabe and Ito's colour-blind-safe set (orange, sky blue, bluish green, yellow, blue, vermillion, reddish
# purple; their black left out, which a dark image would hide), in BGR: the first seven classes stay apart
# for red-green colour-blind eyes (deuteranopia, protanopia) as well.
OKABE_ITO = ((0, 159, 230), (233, 180, 86), (115, 158, 0), (66, 228, 240), (178, 114, 0), (0, 94, 213),
             (167, 121, 204))


@functools.lru_cache(maxsize=1)
def _distinct_colours():
    """``OKABE_ITO``, then saturated colours in the order that keeps each new one farthest (CIELAB distance,
    close to what the eye tells apart) from all before it: greedy farthest-point over a grid of hues,
    saturations, values."""
    hsv = np.array([[h, s, v] for h in range(0, 180, 5) for s in (255, 170) for v in (255, 190, 130)], np.uint8)
    bgr = np.concatenate([np.array(OKABE_ITO, np.uint8), cv2.cvtColor(hsv[None], cv2.COLOR_HSV2BGR)[0]])
    lab = cv2.cvtColor(bgr[None], cv2.COLOR_BGR2LAB)[0].astype(np.float64)
    order = list(range(len(OKABE_ITO)))
    nearest = np.min([np.linalg.norm(lab - lab[i], axis=1) for i in order], axis=0)
    while len(order) < len(lab):
        pick = int(np.argmax(nearest))
        order.append(pick)
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[pick], axis=1))
    return [tuple(int(c) for c in bgr[i]) for i in order]


def class_palette(num_classes):
    """A BGR colour per class label, label 0 (the background) grey: the same for every picture of every
    run, since label ``k`` gets ``class_palette(n)[k]`` whatever ``n`` is; the first classes get the most
    distinct colours."""
    colours = _distinct_colours()
    return [BACKGROUND_COLOUR] + [colours[(label - 1) % len(colours)] for label in range(1, num_classes)]


def line_width(image):
    """Box outlines grow with the image: 1 px up to 480 px, 2 px at 640-960, 4 px at 1333..."""
    return max(1, round(max(image.shape[:2]) / 320))


def _font_scale(image):
    return max(0.4, max(image.shape[:2]) / 1400)


def draw_boxes(image, boxes, colour, thickness=None, factor=1.0):
    """Copy of ``image`` with the outline of every box (given in pixels of an image ``1 / factor`` as large)."""
    canvas = image.copy()
    thickness = thickness or line_width(image)
    for x1, y1, x2, y2 in np.asarray(boxes, np.float64).reshape(-1, 4) * factor:
        cv2.rectangle(canvas, (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2))), colour, thickness,
                      cv2.LINE_AA)
    return canvas


def tag_places(boxes, sizes, image_size):
    """Where each box's tag goes, ``(x, y)`` of its top-left corner: above the box (inside it at the top
    of the image), within the image, and moved down past the tags placed before it; None when no free
    place is left in the image (the box is drawn without a tag rather than a tag over another). Boxes
    come in drawing order (the last on top), so the last is placed first: the best keeps its place."""
    height, width = image_size
    placed, places = [], [None] * len(boxes)
    for index in reversed(range(len(boxes))):
        x1, y1, x2, y2 = boxes[index]
        w, h = sizes[index]
        x = int(min(max(x1, 0), max(width - w, 0)))
        y = int(y1 - h if y1 - h >= 0 else max(y1, 0))
        for _ in range(len(placed) + 1):  # each step clears one placed tag: a free place always follows
            hit = next((p for p in placed if x < p[2] and p[0] < x + w and y < p[3] and p[1] < y + h), None)
            if hit is None:
                break
            y = hit[3]
        if y + h > height:  # pushed out of the image: no tag
            continue
        placed.append((x, y, x + w, y + h))
        places[index] = (x, y)
    return places


def draw_tagged_boxes(image, boxes, tags, colours, thickness=None):
    """Copy of ``image`` with each box outlined in its colour and its tag (text) on a filled label, placed
    by ``tag_places``."""
    canvas = image.copy()
    thickness = thickness or line_width(image)
    font_scale = _font_scale(image)
    text_width = max(1, thickness // 2)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    sizes, bases = [], []
    for tag in tags:
        (w, h), base = cv2.getTextSize(tag, FONT, font_scale, text_width)
        sizes.append((w + 4, h + base + 2))
        bases.append(base)
    for (x1, y1, x2, y2), colour in zip(boxes, colours):
        cv2.rectangle(canvas, (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2))), colour, thickness,
                      cv2.LINE_AA)
    for tag, colour, place, (w, h), base in zip(tags, colours, tag_places(boxes, sizes, image.shape[:2]), sizes,
                                                bases):
        if place is None:
            continue
        x, y = place
        cv2.rectangle(canvas, (x, y), (x + w - 1, y + h - 1), colour, -1)
        cv2.putText(canvas, tag, (x + 2, y + h - base - 1), FONT, font_scale, _text_colour(colour), text_width,
                    cv2.LINE_AA)
    return canvas


def _text_colour(background):
    """Black on light labels, white on dark ones (luma of the BGR colour)."""
    blue, green, red = background
    return BLACK if 0.114 * blue + 0.587 * green + 0.299 * red > 140 else WHITE


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
    """A white strip ``width`` px wide naming what each colour means: ``items`` = [(text, colour), ...],
    in rows of ``height`` px, as many as the items need."""
    rows, x = [[]], 6
    for text, colour in items:
        step = 20 + cv2.getTextSize(text, FONT, 0.45, 1)[0][0] + 16
        if x + step - 16 > width and rows[-1]:
            rows.append([])
            x = 6
        rows[-1].append((x, text, colour))
        x += step
    strip = np.full((height * len(rows), width, 3), 255, np.uint8)
    for row, entries in enumerate(rows):
        top = row * height
        for x, text, colour in entries:
            cv2.rectangle(strip, (x, top + 6), (x + 14, top + height - 6), colour, -1)
            cv2.putText(strip, text, (x + 20, top + height - 8), FONT, 0.45, BLACK, 1, cv2.LINE_AA)
    return strip


def title(width, text, font_scale=0.5, line_height=22):
    """A white strip ``width`` px wide holding ``text`` whole, wrapped at spaces onto as many lines as it
    needs (a panel title is never cut off at the panel's edge)."""
    lines = [""]
    for word in text.split():
        candidate = f"{lines[-1]} {word}".strip()
        if lines[-1] and cv2.getTextSize(candidate, FONT, font_scale, 1)[0][0] > width - 12:
            lines.append(word)
        else:
            lines[-1] = candidate
    strip = np.full((line_height * len(lines) + 6, width, 3), 255, np.uint8)
    for index, line in enumerate(lines):
        cv2.putText(strip, line, (6, line_height * (index + 1) - 3), FONT, font_scale, BLACK, 1, cv2.LINE_AA)
    return strip


def pad_to_height(picture, height, background=255):
    """``picture`` with rows of ``background`` added at the bottom up to ``height``."""
    extra = height - picture.shape[0]
    if extra <= 0:
        return picture
    return np.concatenate([picture, np.full((extra, *picture.shape[1:]), background, np.uint8)], axis=0)


def grid(pictures, columns, background=255, gutter=0, captions=None):
    """The pictures tiled row by row, ``columns`` a row, each cell the size of the largest picture, cells
    ``gutter`` px apart (background between them: neighbouring tiles never touch); ``captions``, one text per
    picture, go whole (wrapped) on a white strip above each tile, every strip of a grid as tall as the tallest."""
    if not pictures:
        raise ValueError("grid: no pictures")
    if captions is not None and len(captions) != len(pictures):
        raise ValueError(f"grid: {len(captions)} captions for {len(pictures)} pictures")
    height = max(p.shape[0] for p in pictures)
    width = max(p.shape[1] for p in pictures)
    strips = [title(width, text) for text in captions] if captions is not None else []
    top_height = max((strip.shape[0] for strip in strips), default=0)
    cell_height = top_height + height
    rows = -(-len(pictures) // columns)
    canvas = np.full((rows * cell_height + (rows - 1) * gutter, columns * width + (columns - 1) * gutter, 3),
                     background, np.uint8)
    for index, picture in enumerate(pictures):
        top, left = (index // columns) * (cell_height + gutter), (index % columns) * (width + gutter)
        if strips:
            canvas[top:top + top_height, left:left + width] = pad_to_height(strips[index], top_height)
        canvas[top + top_height:top + top_height + picture.shape[0], left:left + picture.shape[1]] = picture
    return canvas


def write_picture(picture, path):
    """``picture`` (BGR uint8) encoded as ``path``'s extension says (JPEG, PNG, ...) and written atomically
    (lib.atomic), its folder made."""
    ok, encoded = cv2.imencode(os.path.splitext(path)[1] or ".png", picture)
    if not ok:
        raise OSError(f"cannot encode a picture of shape {picture.shape} as {path}")
    write_bytes(encoded.tobytes(), path)
