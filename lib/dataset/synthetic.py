"""A synthetic COCO-format detection dataset of coloured shapes: the project's embedded default.

The main job has to train and evaluate end to end on 2 CPU cores without a download, and still
exercise what SNIPER is about. So the images are large (600-1600 px a side, varied aspect), object
sizes are log-uniform from 8 px to most of the image (every training scale has work), and the
background is textured and cluttered with shapes that are *not* objects (lines, rings, hollow
outlines, soft blobs, scribbles) to give hard negatives. The objects themselves stay easy to learn:
five filled shapes, each class with its own hue (distractors use every hue, so colour alone does not
make an object), 3-15 per image, at most ~35% of any object covered by later ones. A few images hold
one ``iscrowd`` region of tiny same-class shapes.

Layout (what ``lib.dataset.coco`` reads): ``annotations/instances_{train,val}.json`` and
``images/{train,val}/{id:012d}.jpg``, plus ``synthetic.json`` recording how it was made.
Output is a pure function of (train, val, seed): each image draws from its own random stream, so
the val images do not change when the train count does.
"""
import json
import logging
import os
import shutil
import tempfile

import cv2
import numpy as np
from tqdm import tqdm

from lib.dataset.coco import CocoDataset
from lib.errors import ConfigError
from lib.paths import shown_path

logger = logging.getLogger(__name__)

CLASSES = ("circle", "square", "triangle", "cross", "star")
CLASS_HUES = (0, 60, 110, 28, 150)  # OpenCV hue (0-179): red, green, blue, yellow, magenta
GENERATOR_VERSION = 2  # 2: segmentation polygons cover the drawn pixels (half a pixel wider); images and boxes as in 1
MANIFEST = "synthetic.json"
# (split, random stream, first image id): ids stay unique when the splits are joined.
SPLITS = (("train", 0, 1), ("val", 1, 1_000_001))
DEFAULT_TRAIN, DEFAULT_VAL, DEFAULT_SEED = 200, 50, 0

MIN_OBJECT_SIZE = 8.0  # sqrt(box area) in pixels
MAX_OBJECT_FRACTION = 0.7  # largest object size as a fraction of the image's shorter side
MAX_COVERED = 0.35  # share of an object's box that objects drawn later may cover
CROWD_PROBABILITY = 0.04
JPEG_QUALITY = 90
_SHIFT = 4  # sub-pixel bits for cv2 drawing
_ONE = 1 << _SHIFT


def _fixed(points):
    """Float (K, 2) points in pixel-centre coordinates -> cv2's fixed-point int32 polygon."""
    return np.round(np.asarray(points) * _ONE).astype(np.int32)


def _hsv_colour(hue, saturation, value):
    pixel = np.uint8([[[int(hue) % 180, int(saturation), int(value)]]])
    return tuple(int(c) for c in cv2.cvtColor(pixel, cv2.COLOR_HSV2BGR)[0, 0])


def _random_colour(rng):
    return _hsv_colour(rng.integers(0, 180), rng.integers(0, 256), rng.integers(30, 256))


def _class_colour(rng, label):
    return _hsv_colour(CLASS_HUES[label] + rng.integers(-5, 6), rng.integers(170, 256), rng.integers(160, 256))


def _unit_shape(rng, label, vertices=48):
    """Outline of class ``label`` centred on the origin, randomly stretched and rotated."""
    name = CLASSES[label]
    if name == "circle":
        angles = np.linspace(0, 2 * np.pi, vertices, endpoint=False)
        points = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    elif name == "square":
        points = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=np.float64)
    elif name == "triangle":
        angles = np.deg2rad([90, 210, 330])
        points = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    elif name == "cross":
        a = 0.33  # half the arm thickness
        points = np.array([[-a, -1], [a, -1], [a, -a], [1, -a], [1, a], [a, a],
                           [a, 1], [-a, 1], [-a, a], [-1, a], [-1, -a], [-a, -a]], dtype=np.float64)
    else:  # star
        angles = np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        points = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    aspect = np.exp(rng.uniform(-0.4, 0.4))
    points = points * [np.sqrt(aspect), 1 / np.sqrt(aspect)]
    # Squares and crosses stay roughly upright so they do not turn into diamonds and x's.
    angle = np.deg2rad(rng.uniform(-20, 20) if name in ("square", "cross") else rng.uniform(0, 360))
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return points @ rotation.T


def _shape_of_size(rng, label, size):
    """Class outline scaled so that sqrt(box width * box height) == size, centred on its box."""
    points = _unit_shape(rng, label, vertices=int(np.clip(size / 4, 24, 128)))
    extent = points.max(axis=0) - points.min(axis=0)
    points = points * (size / np.sqrt(extent[0] * extent[1]))
    return points - (points.max(axis=0) + points.min(axis=0)) / 2


def _background(rng, height, width):
    """Muted, low-saturation texture: smooth shading with a little colour, plus grey blotches."""
    base = rng.uniform(70, 190) + rng.uniform(-18, 18, size=3)
    grid = rng.integers(3, 9, size=2)
    # Composed at a quarter of the resolution (it is smooth anyway), then enlarged.
    quarter = (width // 4 + 1, height // 4 + 1)
    shades = rng.normal(0, 22, (grid[0], grid[1], 1)) + rng.normal(0, 7, (grid[0], grid[1], 3))  # mostly grey
    drift = cv2.resize(shades.astype(np.float32), quarter, interpolation=cv2.INTER_CUBIC)
    blotches = cv2.resize(rng.normal(0, 10, (height // 16 + 1, width // 16 + 1)).astype(np.float32), quarter,
                          interpolation=cv2.INTER_LINEAR)
    image = np.clip(drift + blotches[:, :, None] + base.astype(np.float32), 0, 255).astype(np.uint8)
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


def _draw_blob(rng, image):
    """A soft-edged translucent ellipse: object-like colour without an object's sharp outline."""
    height, width = image.shape[:2]
    radius = np.exp(rng.uniform(np.log(6), np.log(0.25 * min(height, width))))
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    pad = int(radius * 2) + 2
    x0, y0, x1, y1 = max(0, int(cx) - pad), max(0, int(cy) - pad), min(width, int(cx) + pad), min(height, int(cy) + pad)
    if x1 <= x0 or y1 <= y0:
        return
    # Drawn and blurred at low resolution (a blurred mask has no detail to lose), then enlarged.
    factor = max(1.0, radius / 12)
    small = np.zeros((int(np.ceil((y1 - y0) / factor)), int(np.ceil((x1 - x0) / factor))), dtype=np.float32)
    axes = (int(radius / factor * _ONE), int(radius / factor * np.exp(rng.uniform(-0.5, 0.5)) * _ONE))
    cv2.ellipse(small, (int((cx - x0) / factor * _ONE), int((cy - y0) / factor * _ONE)), axes, rng.uniform(0, 180),
                0, 360, 1.0, -1, cv2.LINE_AA, _SHIFT)
    small = cv2.GaussianBlur(small, (0, 0), max(1.0, radius / factor * 0.4))
    mask = cv2.resize(small, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR) * rng.uniform(0.4, 0.9)
    patch = image[y0:y1, x0:x1].astype(np.float32)
    patch += mask[:, :, None] * (np.float32(_random_colour(rng)) - patch)
    image[y0:y1, x0:x1] = patch.astype(np.uint8)


def _draw_distractor(rng, image):
    """One piece of clutter that is not an object."""
    height, width = image.shape[:2]
    kind = rng.choice(("line", "ring", "outline", "blob", "scribble"))
    colour = _random_colour(rng)
    centre = rng.uniform([0, 0], [width, height])
    if kind == "line":
        length = np.exp(rng.uniform(np.log(30), np.log(0.8 * max(height, width))))
        direction = rng.normal(size=2)
        step = direction / np.linalg.norm(direction) * length / 2
        cv2.line(image, *map(tuple, _fixed([centre - step, centre + step])), colour, int(rng.integers(1, 5)),
                 cv2.LINE_AA, _SHIFT)
    elif kind == "ring":  # hollow: the hole keeps it apart from a filled circle
        radius = np.exp(rng.uniform(np.log(8), np.log(0.3 * min(height, width))))
        axes = (int(radius * _ONE), int(radius * np.exp(rng.uniform(-0.3, 0.3)) * _ONE))
        thickness = max(1, int(radius * rng.uniform(0.08, 0.2)))
        cv2.ellipse(image, tuple(_fixed(centre)), axes, rng.uniform(0, 180), 0, 360, colour, thickness,
                    cv2.LINE_AA, _SHIFT)
    elif kind == "outline":  # hollow class shape, large enough for its inside to show
        size = np.exp(rng.uniform(np.log(24), np.log(0.4 * min(height, width))))
        points = _shape_of_size(rng, int(rng.integers(len(CLASSES))), size) + centre
        thickness = max(1, int(size * rng.uniform(0.02, 0.06)))
        cv2.polylines(image, [_fixed(points)], True, colour, thickness, cv2.LINE_AA, _SHIFT)
    elif kind == "blob":
        _draw_blob(rng, image)
    else:  # scribble: a short random walk
        steps = rng.normal(0, rng.uniform(10, 60), size=(int(rng.integers(4, 12)), 2))
        points = centre + np.cumsum(steps, axis=0)
        cv2.polylines(image, [_fixed(points)], False, colour, int(rng.integers(1, 4)), cv2.LINE_AA, _SHIFT)


class _Layout:
    """Boxes placed so far; an object may only cover a little of the ones drawn before it."""

    def __init__(self):
        self.boxes = np.zeros((0, 4))
        self.covered = np.zeros(0)
        self.limits = np.zeros(0)

    def _cover(self, box):
        if not len(self.boxes):
            return np.zeros(0)
        lo = np.maximum(self.boxes[:, :2], box[:2])
        hi = np.minimum(self.boxes[:, 2:], box[2:])
        inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
        return inter / np.prod(self.boxes[:, 2:] - self.boxes[:, :2], axis=1)

    def try_add(self, box, limit):
        cover = self._cover(box)
        if np.any((cover > 0) & (self.covered + cover > self.limits)):
            return False
        self.boxes = np.vstack([self.boxes, box])
        self.covered = np.append(self.covered + cover, 0.0)
        self.limits = np.append(self.limits, limit)
        return True


def _place(rng, layout, points, width, height, limit, tries=25):
    """Move ``points`` (centred) to a random spot inside the image that the layout accepts."""
    low, high = points.min(axis=0), points.max(axis=0)
    lo_offset, hi_offset = 1 - low, np.array([width - 2, height - 2]) - high
    if np.any(hi_offset < lo_offset):
        return None
    for _ in range(tries):
        offset = rng.uniform(lo_offset, hi_offset)
        if layout.try_add(np.concatenate([low + offset, high + offset]), limit):
            return points + offset
    return None


def _crowd(rng, layout, image, width, height):
    """A tight cluster of tiny same-class shapes, annotated as one iscrowd region."""
    label = int(rng.integers(len(CLASSES)))
    region = rng.uniform(60, 200, size=2)
    shapes = [_shape_of_size(rng, label, rng.uniform(4, 8)) + rng.uniform([0, 0], region)
              for _ in range(int(rng.integers(12, 31)))]
    points = np.concatenate(shapes)
    centre = (points.max(axis=0) + points.min(axis=0)) / 2
    outline = np.array([points.min(axis=0), [points.max(axis=0)[0], points.min(axis=0)[1]],
                        points.max(axis=0), [points.min(axis=0)[0], points.max(axis=0)[1]]]) - centre
    placed = _place(rng, layout, outline, width, height, limit=0.0)
    if placed is None:
        return None
    shift = placed[0] - outline[0] - centre
    for shape in shapes:
        cv2.fillPoly(image, [_fixed(shape + shift)], _class_colour(rng, label), cv2.LINE_AA, _SHIFT)
    return {"label": label, "points": placed, "iscrowd": 1}


def render_image(rng):
    """One image and its objects: ``(image BGR uint8, [{"label", "points" (K, 2), "iscrowd"}])``.

    ``points`` are polygon vertices in pixel-centre coordinates (cv2's), label 0..len(CLASSES)-1.
    """
    long_side = rng.uniform(800, 1600)
    short_side = max(600.0, long_side * rng.uniform(0.55, 1.0))
    width, height = (int(long_side), int(short_side)) if rng.random() < 0.6 else (int(short_side), int(long_side))
    image = _background(rng, height, width)
    for _ in range(int(rng.integers(4, 15))):
        _draw_distractor(rng, image)
    layout, objects = _Layout(), []
    if rng.random() < CROWD_PROBABILITY:
        crowd = _crowd(rng, layout, image, width, height)
        objects += [crowd] if crowd else []
    max_size = MAX_OBJECT_FRACTION * min(width, height)
    sizes = np.exp(rng.uniform(np.log(MIN_OBJECT_SIZE), np.log(max_size), size=int(rng.integers(3, 16))))
    for size in sorted(sizes, reverse=True):  # large first, so small objects are never hidden
        label = int(rng.integers(len(CLASSES)))
        points = _shape_of_size(rng, label, size)
        placed = None
        while placed is None and size >= MIN_OBJECT_SIZE:
            placed = _place(rng, layout, points, width, height, MAX_COVERED)
            points, size = points * 0.75, size * 0.75
        if placed is not None:
            cv2.fillPoly(image, [_fixed(placed)], _class_colour(rng, label), cv2.LINE_AA, _SHIFT)
            objects.append({"label": label, "points": placed, "iscrowd": 0})
    for _ in range(int(rng.integers(0, 4))):  # thin clutter crossing the objects
        ends = rng.uniform([0, 0], [width, height], size=(2, 2))
        cv2.line(image, *map(tuple, _fixed(ends)), _random_colour(rng), int(rng.integers(1, 3)), cv2.LINE_AA, _SHIFT)
    noisy = image.astype(np.int16)
    noisy += rng.integers(-8, 9, size=(height, width, 1), dtype=np.int16)  # sensor-like grain
    return np.clip(noisy, 0, 255, out=noisy).astype(np.uint8), objects


def render_large_image(rng, height, width, count, object_sizes=(8.0, 64.0)):
    """A large, sparse image (aerial-like): the background texture and about ``count`` objects of
    sqrt(box area) log-uniform in ``object_sizes``; ``(image, objects)`` as ``render_image``."""
    image = _background(rng, height, width)
    layout, objects = _Layout(), []
    low, high = np.log(object_sizes[0]), np.log(object_sizes[1])
    for size in sorted(np.exp(rng.uniform(low, high, size=count)), reverse=True):
        label = int(rng.integers(len(CLASSES)))
        placed = _place(rng, layout, _shape_of_size(rng, label, size), width, height, MAX_COVERED)
        if placed is not None:
            cv2.fillPoly(image, [_fixed(placed)], _class_colour(rng, label), cv2.LINE_AA, _SHIFT)
            objects.append({"label": label, "points": placed, "iscrowd": 0})
    for top in range(0, height, 1024):  # grain, a band of rows at a time
        band = image[top:top + 1024].astype(np.int16)
        band += rng.integers(-8, 9, size=(len(band), width, 1), dtype=np.int16)
        image[top:top + 1024] = np.clip(band, 0, 255)
    return image, objects


def generate_large_synthetic_coco(out_dir, sizes, objects_per_megapixel, seed, split="large"):
    """A COCO-format split of large images, one per (height, width) of ``sizes``, stored as tiled BigTIFF
    (lib.dataset.large_images reads their windows); returns the annotation file's path."""
    from lib.dataset.large_images import write_tiled_tiff

    image_dir = os.path.join(out_dir, "images", split)
    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    for index, (height, width) in enumerate(sizes):
        image_id = index + 1
        count = max(1, int(round(objects_per_megapixel * height * width / 1e6)))
        image, objects = render_large_image(np.random.default_rng([seed, index]), height, width, count)
        file_name = f"{image_id:012d}.tif"
        write_tiled_tiff(image, os.path.join(image_dir, file_name))
        del image
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height})
        annotations += [_annotation(obj, image_id, k) for k, obj in enumerate(objects)]
    for number, record in enumerate(annotations, 1):  # more than 99 objects an image: ids of their own
        record["id"] = number
    path = os.path.join(out_dir, "annotations", f"instances_{split}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"info": {"description": f"SNIPER synthetic large images, seed {seed}"}, "images": images,
                   "annotations": annotations, "categories": _categories()}, f)
    return path


def _categories():
    return [{"id": label + 1, "name": name, "supercategory": "shape"} for label, name in enumerate(CLASSES)]


# cv2's antialiased fill covers a polygon's outline and half a pixel beyond it (a vertex at pixel centre i
# fills pixel i whole): the segmentation is the outline moved out by this much, so that it rasterises to
# the pixels drawn (pycocotools.mask); the box and the area stay those of the outline.
DRAWN_MARGIN = 0.5
MAX_MITER = 2.0  # a corner's outward shift, in margins (sharp tips move less than the exact miter)


def _drawn_outline(points, margin=DRAWN_MARGIN):
    """The closed polygon ``points`` (K, 2) with every edge moved ``margin`` px outwards (mitred corners)."""
    x, y = points[:, 0], points[:, 1]
    orientation = np.sign(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))
    edges = np.roll(points, -1, axis=0) - points  # edge k runs from vertex k to vertex k + 1
    normals = np.stack([edges[:, 1], -edges[:, 0]], axis=1) * orientation
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)
    previous = np.roll(normals, 1, axis=0)  # the normal of the edge ending at vertex k
    cosine = np.maximum(np.sum(normals * previous, axis=1), 1 / MAX_MITER - 1)
    return points + margin * (normals + previous) / (1 + cosine)[:, None]


def _annotation(obj, image_id, index):
    """COCO record of an object. COCO coordinates are continuous (pixel i spans [i, i + 1)), so the
    pixel-centre polygon moves by +0.5 and the box is its tight extent; the segmentation is the outline
    of the pixels drawn (``_drawn_outline``)."""
    points = obj["points"] + 0.5
    segmentation = _drawn_outline(points)
    x1, y1 = points.min(axis=0)
    x2, y2 = points.max(axis=0)
    x, y = points[:, 0], points[:, 1]
    area = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))
    if obj["iscrowd"]:
        area = (x2 - x1) * (y2 - y1)
    return {
        "id": image_id * 100 + index + 1,
        "image_id": image_id,
        "category_id": obj["label"] + 1,
        "bbox": [round(float(v), 2) for v in (x1, y1, x2 - x1, y2 - y1)],
        "area": round(float(area), 2),
        "iscrowd": obj["iscrowd"],
        "segmentation": [[round(float(v), 2) for v in segmentation.reshape(-1)]],
    }


def rendered_jpeg(seed, stream, index):
    """Image ``index`` of split ``stream`` (SPLITS) of the set made with ``seed``: ``(image, objects, JPEG
    bytes)`` as the dataset's file holds it (docs/demo.jpg is the tiny config's first val image: seed 3)."""
    image, objects = render_image(np.random.default_rng([seed, stream, index]))
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise IOError(f"cannot encode synthetic image {index} of stream {stream}, seed {seed}")
    return image, objects, encoded.tobytes()


def _write_split(root, split, count, seed, stream, first_id):
    image_dir = os.path.join(root, "images", split)
    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    for index in tqdm(range(count), desc=f"synthetic {split}", leave=False):
        image_id = first_id + index
        image, objects, encoded = rendered_jpeg(seed, stream, index)
        file_name = f"{image_id:012d}.jpg"
        with open(os.path.join(image_dir, file_name), "wb") as f:
            f.write(encoded)
        images.append({"id": image_id, "file_name": file_name, "width": image.shape[1], "height": image.shape[0]})
        annotations += [_annotation(obj, image_id, k) for k, obj in enumerate(objects)]
    categories = _categories()
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w") as f:
        json.dump({"info": {"description": f"SNIPER synthetic shapes, {split}, seed {seed}"},
                   "images": images, "annotations": annotations, "categories": categories}, f)


def generate_synthetic_coco(out_dir, train, val, seed):
    """Write the dataset into ``out_dir`` (created if needed), manifest last."""
    for name, value in (("train", train), ("val", val), ("seed", seed)):
        if not (isinstance(value, (int, np.integer)) and value >= 0):
            raise ValueError(f"synthetic dataset: {name} must be a non-negative integer, got {value!r}")
    counts = {"train": train, "val": val}
    for split, stream, first_id in SPLITS:
        _write_split(out_dir, split, counts[split], seed, stream, first_id)
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(_manifest(train, val, seed), f)


def _manifest(train, val, seed):
    return {"generator_version": GENERATOR_VERSION, "train": int(train), "val": int(val), "seed": int(seed)}


def _is_complete(path, manifest):
    """True when ``path`` holds the dataset described by ``manifest``, every file in place."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            if json.load(f) != manifest:
                return False
        return all(
            os.path.isfile(os.path.join(path, "annotations", f"instances_{split}.json"))
            and len(os.listdir(os.path.join(path, "images", split))) == manifest[split]
            for split, _, _ in SPLITS)
    except (OSError, ValueError):
        return False


def _manifest_at(path):
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def synthetic_folder(path, train=DEFAULT_TRAIN, val=DEFAULT_VAL, seed=DEFAULT_SEED):
    """Where the synthetic dataset (train, val, seed) of ``dataset.dataset_path`` ``path`` lives: ``path``
    itself, unless that holds the synthetic dataset of other settings: then ``{path}-{train}-{val}-s{seed}``
    beside it. A dataset is never replaced in place, so a command with other counts never swaps the
    images under a run, a viewer or a test that uses them (``make train``'s data/synthetic stays)."""
    found = _manifest_at(path)
    if found is None or found == _manifest(train, val, seed):
        return path
    return f"{os.path.normpath(path)}-{train}-{val}-s{seed}"


def ensure_synthetic_dataset(path, train=DEFAULT_TRAIN, val=DEFAULT_VAL, seed=DEFAULT_SEED):
    """Make sure the synthetic dataset for (train, val, seed) exists at ``synthetic_folder(path, ...)``;
    return that folder.

    A no-op when it already does. Otherwise the dataset is generated into a temporary sibling folder
    and renamed into place, so an interrupted run never leaves half a dataset. Any other folder at
    ``path`` is left alone (error). When several processes generate at once, the first to finish
    installs its copy and the others keep it.
    """
    manifest = _manifest(train, val, seed)
    path = synthetic_folder(path, train, val, seed)
    if _is_complete(path, manifest):
        return path
    if os.path.exists(path) and not os.path.isfile(os.path.join(path, MANIFEST)):
        raise FileExistsError(f"{path} exists but is not a synthetic dataset (no {MANIFEST}); "
                              f"move it away or point dataset.dataset_path elsewhere")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    logger.info("generating the synthetic dataset in %s (train %d, val %d, seed %d)", shown_path(path), train, val,
                seed)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(path))}.tmp-", dir=parent)
    try:
        generate_synthetic_coco(tmp, train, val, seed)
        _install(tmp, path, manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _install(tmp, path, manifest):
    """Rename the finished ``tmp`` to ``path``, moving an outdated dataset out of the way first.

    Another process may have generated the same dataset meanwhile: a complete one found at ``path``
    now is kept (and ``tmp`` discarded by the caller), never replaced.
    """
    if _is_complete(path, manifest):
        logger.info("another process installed the synthetic dataset in %s meanwhile; keeping it", path)
        return
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(path))}.old-",
                               dir=os.path.dirname(os.path.abspath(path)))
        try:
            os.rename(path, os.path.join(old, "dataset"))
        except FileNotFoundError:  # another process moved it away first
            pass
    try:
        os.rename(tmp, path)
    except OSError:
        if not _is_complete(path, manifest):  # another process finishing first is fine
            raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


class SyntheticDataset(CocoDataset):
    """The project's COCO-format shapes set (made by ``ensure_synthetic_dataset`` above), generated first when absent from
    ``dataset.synthetic_train``, ``synthetic_val`` and ``synthetic_seed``, in its own folder per settings."""

    @classmethod
    def class_count(cls, cfg, image_set):
        """Its shapes and the background, known without generating the set."""
        return len(CLASSES) + 1

    @classmethod
    def check_config(cls, cfg):
        if cfg.dataset.synthetic_train <= 0:
            raise ConfigError(f"config key dataset.synthetic_train = {cfg.dataset.synthetic_train!r}: the synthetic "
                              f"dataset needs at least one training image")
        if cfg.dataset.synthetic_val < 0:
            raise ConfigError(f"config key dataset.synthetic_val = {cfg.dataset.synthetic_val!r}: must be >= 0")

    @classmethod
    def from_config(cls, cfg, image_set):
        # its own folder per counts and seed (synthetic_folder): never replaced in place
        return cls(ensure_synthetic_dataset(cfg.dataset.dataset_path, train=cfg.dataset.synthetic_train,
                                            val=cfg.dataset.synthetic_val, seed=cfg.dataset.synthetic_seed), image_set)
