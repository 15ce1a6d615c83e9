"""The comparisons of the parity harness: random inputs, the reference's code and the project's on each,
agreement counted per case and printed as the tables of docs/reference_differences.md.

* chip generator: the reference's C++ greedy cover (its boxes clipped by its own ``clip_boxes``) against
  ``chip_generator.generate`` (boxes clipped by the miner's rule), the project replaying the reference's
  ``rand()`` shuffle, with its own shuffle, and with the ``clipped`` windows variant;
* chip mining: the reference's ``chip_worker`` (``chip_extractor``, ``box_assigner``: valid boxes, positive
  chips, which gts each trains on, negative chips from the boxes left) against ``mine_image_chips`` on
  random scenes with gts and proposals, both covers taking the candidates unshuffled (ties to the first
  window in the reference's enumeration: the shuffle itself is the chip generator's table);
* multi-scale merge: the reference's ``Tester.aggregate`` (valid ranges, its Cython soft-NMS, the cap)
  against ``lib.inference.merge.merge_scales`` on random per-scale candidates (rois x class scores, the
  per-class rows above 0.001 handed to the reference as its ``get_detections`` makes them);
* COCO boxes: the reference's ``_load_coco_annotation`` box rule (uint16 boxes) against the project's COCO
  reader with ``dataset.INTEGER_BOXES`` on annotations with fractional boxes, some starting left of /
  above their image, and on the same scenes with every box starting inside;
* results file: the reference's ``coco_results_one_category_kernel`` against ``coco_results``.
"""
import contextlib
import json
import logging
import os
import warnings
from types import SimpleNamespace

import numpy as np

import chip_generator.mining as mining
from chip_generator.cover import candidate_windows, generate
from chip_generator.mining import mine_image_chips, to_scaled_image
from lib.config import load_config, parsed
from lib.inference.merge import merge_scales
from lib.dataset.coco import CocoDataset
from lib.dataset.reference_rules import truncate_to_whole_pixels
from lib.evaluation.metrics import coco_results
from lib.benchmarking import matched_detections, percent

CHIP_SIZE = 512
STRIDES = (32, 56, 59, 64)


# ------------------------------------------------------------------------------------------------ chips

def random_chip_case(rng):
    """(boxes float64 (N, 4) in scaled-image pixels, some beyond the image, width, height, stride)."""
    width, height = int(rng.integers(200, 2400)), int(rng.integers(200, 1800))
    count = int(rng.integers(1, 40))
    sides = np.exp(rng.uniform(np.log(4), np.log(700), (count, 2)))
    x1 = rng.uniform(-40, width + 20, count)
    y1 = rng.uniform(-40, height + 20, count)
    boxes = np.stack([x1, y1, x1 + sides[:, 0], y1 + sides[:, 1]], axis=1)
    return boxes, width, height, int(rng.choice(STRIDES))


def replay_order(windows, shuffled):
    """Positions into ``windows`` (the project's candidates, each once) in the order of ``shuffled`` (the
    reference's shuffled candidates, duplicates included: the first of equal windows stands for them, and
    a duplicate changes no pick). None when the two candidate sets differ."""
    position = {tuple(int(v) for v in window): i for i, window in enumerate(windows)}
    order, seen = [], set()
    for window in shuffled:
        key = tuple(int(v) for v in window)
        if key not in position:
            return None
        if key not in seen:
            seen.add(key)
            order.append(position[key])
    return np.array(order, np.int64) if len(order) == len(windows) else None


def _as_set(chips):
    return sorted(tuple(float(v) for v in chip) for chip in chips)


def compare_chips(reference_chips, clip_boxes, cases, seed):
    """Agreement of the chip generators over ``cases`` random images; a table's rows."""
    rng = np.random.default_rng(seed)
    same_windows = replayed = own = clipped = 0
    for case in range(cases):
        boxes, width, height, stride = random_chip_case(rng)
        ref_boxes = clip_boxes(boxes.copy(), np.array([height - 1, width - 1])).astype(np.float32)
        ref_chips, shuffled = reference_chips.generate(ref_boxes, width, height, CHIP_SIZE, stride, seed + case)
        ours = to_scaled_image(boxes, 1.0, (height, width), np.float64)
        windows = candidate_windows(width, height, CHIP_SIZE, stride, "reference")
        order = replay_order(windows, shuffled)
        same_windows += order is not None
        if order is not None:
            replayed += np.array_equal(generate(ours, width, height, CHIP_SIZE, stride, order=order), ref_chips)
        own += _as_set(generate(ours, width, height, CHIP_SIZE, stride, rng=seed + case)) == _as_set(ref_chips)
        clipped += _as_set(generate(ours, width, height, CHIP_SIZE, stride, rng=seed + case,
                                    windows="clipped")) == _as_set(ref_chips)
    return [["candidate windows identical (as sets)", percent(same_windows, cases)],
            ["chips identical, in pick order (the reference's shuffle replayed)", percent(replayed, cases)],
            ["chip sets identical, the project's own shuffle", percent(own, cases)],
            ["chip sets identical, `TRAIN.CHIP_WINDOWS: clipped`, own shuffle", percent(clipped, cases)]]


# ------------------------------------------------------------------------------------------------ mining

# The reference's effective training settings for COCO (its main_train.py's factor scales).
MINING_SCALES = (3.0, 1.667, 512.0)
MINING_RANGES = ((-1, 80), (32, 150), (120, -1))


def random_mining_scene(rng):
    """(gts float32 (G, 4) whole pixels, proposals float32 (P, 4), width, height, stride)."""
    width, height = int(rng.integers(300, 1000)), int(rng.integers(300, 1000))

    def boxes(count, low, high, whole):
        sides = np.exp(rng.uniform(np.log(low), np.log(high), (count, 2)))
        x1, y1 = rng.uniform(0, width - 2, count), rng.uniform(0, height - 2, count)
        out = np.stack([x1, y1, np.minimum(x1 + sides[:, 0], width - 1), np.minimum(y1 + sides[:, 1], height - 1)], 1)
        return (np.trunc(out) if whole else out).astype(np.float32)

    return (boxes(int(rng.integers(1, 30)), 3, 500, True), boxes(int(rng.integers(30, 300)), 8, 400, False),
            width, height, int(rng.choice((56, 57, 58, 59))))


@contextlib.contextmanager
def unshuffled_project_cover():
    """The miner's covers with the candidates in enumeration order (the reference's, unshuffled)."""
    def ordered(boxes, width, height, chip_size, stride, rng=None, windows="reference"):
        count = len(candidate_windows(width, height, chip_size, stride, windows))
        return generate(boxes, width, height, chip_size, stride, windows=windows, order=np.arange(count))

    saved, mining.generate = mining.generate, ordered
    try:
        yield
    finally:
        mining.generate = saved


def _reference_mining(workers, gts, proposals, width, height, stride):
    cfg = SimpleNamespace(TRAIN=SimpleNamespace(VALID_RANGES=list(MINING_RANGES), SCALES=MINING_SCALES,
                                                CPP_CHIPS=True, USE_NEG_CHIPS=True))
    worker = workers.chip_worker(cfg, 512)
    worker.chip_stride = stride
    worker.chip_generator = type(worker.chip_generator)(chip_stride=stride, use_cpp=True)
    entry = {"boxes": np.concatenate([gts, proposals]), "width": width, "height": height,
             "max_overlaps": np.concatenate([np.ones(len(gts)), np.zeros(len(proposals))])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entry["crops"] = worker.chip_extractor(entry)
        props_in_chips, neg_chips, neg_props = worker.box_assigner(entry)
    per_scale = [{"pos": [], "pos_valid": [], "neg": [], "neg_members": []} for _ in MINING_SCALES]
    for crop, members in zip(entry["crops"], props_in_chips):
        chip, im_scale, level = crop[0], crop[1], crop[4]
        per_scale[level]["pos"].append(np.round(np.asarray(chip, np.float64) * im_scale))
        per_scale[level]["pos_valid"].append(sorted(int(i) for i in members if i < len(gts)))
    for crop, members in zip(neg_chips, neg_props):
        chip, im_scale, level = crop[0], crop[1], crop[4]
        per_scale[level]["neg"].append(np.round(np.asarray(chip, np.float64) * im_scale))
        per_scale[level]["neg_members"].append((len(members), sorted(int(i) for i in members if i < len(gts))))
    return per_scale


# The project's own rule variants (docs/reference_differences.md), compared as a second column.
MINING_VARIANTS = (("TRAIN.VALIDITY_RULES", "strict"), ("TRAIN.CHIP_VALID_BOXES", "visible"),
                   ("TRAIN.NEG_CHIP_RULES", "contained"))


def compare_mining(workers, cases, seed, overrides=()):
    """Agreement of the miners per (image, scale) over ``cases`` random scenes, the project's config with
    ``overrides`` ((key, value) pairs); a table's rows."""
    rng = np.random.default_rng(seed)
    pos_same = valid_same = valid_total = chips_valid_same = neg_same = total = 0
    for _ in range(cases):
        gts, proposals, width, height, stride = random_mining_scene(rng)
        theirs = _reference_mining(workers, gts, proposals, width, height, stride)
        cfg = load_config(None, [("TRAIN.SCALES", str(list(MINING_SCALES))),
                                 ("TRAIN.VALID_RANGES", str([list(r) for r in MINING_RANGES])),
                                 ("TRAIN.CHIP_STRIDE", str(stride)), ("TRAIN.USE_NEG_CHIPS", "true"),
                                 *overrides])
        with unshuffled_project_cover():
            ours = mine_image_chips({"boxes": gts, "proposals": proposals, "width": width, "height": height},
                                    parsed(cfg).mining, stride, np.random.default_rng(0)).scales
        for ref, mine in zip(theirs, ours):
            total += 1
            same_pos = np.array_equal(np.reshape(ref["pos"], (-1, 4)), mine.pos_chips)
            pos_same += same_pos
            if same_pos:
                decisions = [r == sorted(int(i) for i in m) for r, m in zip(ref["pos_valid"], mine.pos_valid)]
                chips_valid_same += all(decisions)
                valid_same += sum(decisions)
                valid_total += len(decisions)
            neg_same += (np.array_equal(np.reshape(ref["neg"], (-1, 4)), mine.neg_chips) and
                         [m for m in ref["neg_members"]] ==
                         [(int(c), sorted(int(i) for i in v)) for c, v in zip(mine.neg_counts, mine.neg_valid)])
    return [["positive chips identical, in pick order (image, scale)", percent(pos_same, total)],
            ["chips with identical valid gt sets (of those)", percent(valid_same, valid_total)],
            ["(image, scale) with every chip's valid gts identical (of those)", percent(chips_valid_same, pos_same)],
            ["negative chips identical, with their counts and counted gts (image, scale)", percent(neg_same, total)]]


# ------------------------------------------------------------------------------------------------ merge

TEST_RANGES = ((-1, 90), (32, 180), (75, -1))  # the reference's COCO test ranges, finest scale first


def random_scale_candidates(rng, classes, rois=300):
    """(boxes float32 (R, 4) original pixels, scores float32 (R, C)) of one scale: rois around a few
    objects of 8-600 px, softmax scores over the classes (background first)."""
    centres = rng.uniform(50, 900, (int(rng.integers(2, 8)), 2))
    sizes = np.exp(rng.uniform(np.log(8), np.log(600), len(centres)))
    pick = rng.integers(0, len(centres), rois)
    half = sizes[pick, None] * rng.uniform(0.35, 0.65, (rois, 2))
    middle = centres[pick] + rng.normal(0, 0.15, (rois, 2)) * sizes[pick, None]
    boxes = np.concatenate([middle - half, middle + half], 1).astype(np.float32)
    logits = rng.normal(0, 2.5, (rois, classes))
    scores = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return boxes, scores.astype(np.float32)


def _reference_class_dets(boxes, scores, thresh=1e-3):
    """The reference's per-class rows of one region, as its get_detections makes them:
    ``hstack(boxes[s > thresh], s)`` per foreground class j (index j of the list)."""
    return [None] + [np.hstack([boxes[scores[:, j] > thresh], scores[scores[:, j] > thresh, j, None]])
                     for j in range(1, scores.shape[1])]


def compare_merge(tester, workers, images, seed, classes=5):
    """Final detections of the reference's aggregate found by the project's merge; a table's rows."""
    rng = np.random.default_rng(seed)
    per_image = [[random_scale_candidates(rng, classes) for _ in TEST_RANGES] for _ in range(images)]
    scale_cls_dets = [[[[_reference_class_dets(*per_image[i][s])[j]] for i in range(images)] if j else None
                       for j in range(classes)] for s in range(len(TEST_RANGES))]
    cfg = load_config(None, [("TEST.VALID_RANGES", str([list(r) for r in TEST_RANGES])), ("TEST.MAX_PER_IMAGE", "200")])
    fake = SimpleNamespace(cfg=cfg, num_images=images, num_classes=classes, show_info=lambda text: None,
                           nms_worker=workers.nms_worker(-1, cfg.TEST.SOFT_NMS_SIGMA), roidb=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_boxes = tester.Tester.aggregate(fake, scale_cls_dets, cache_name=None)
    ranges = [level.valid_range for level in parsed(cfg).test_levels]
    found = total = same_count = 0
    for i in range(images):
        theirs = [(j, row[:4], row[4]) for j in range(1, classes) for row in np.asarray(all_boxes[j][i]).reshape(-1, 5)]
        mine = merge_scales(per_image[i], ranges, cfg.TEST)
        total += len(theirs)
        found += matched_detections(theirs, mine)
        same_count += len(theirs) == len(mine)
    return [["reference final detections the project gives (label, box within 0.01 px, score within 1e-4)",
             percent(found, total)], ["images with as many final detections", percent(same_count, images)]]


# ------------------------------------------------------------------------------------------------ COCO boxes

def random_coco(rng, images, inside=False):
    """A COCO annotation dict: fractional boxes, some starting left of / above the image (none when
    ``inside``) or reaching past its far edge."""
    data = {"images": [], "annotations": [], "categories": [{"id": 3, "name": "thing"}, {"id": 7, "name": "other"}]}
    for image_id in range(1, images + 1):
        width, height = int(rng.integers(100, 1000)), int(rng.integers(100, 1000))
        data["images"].append({"id": image_id, "file_name": f"{image_id}.jpg", "width": width, "height": height})
        for _ in range(int(rng.integers(1, 12))):
            w, h = (round(float(v), 2) for v in rng.uniform(1, 0.6 * np.array([width, height])))
            x = round(float(rng.uniform(0 if inside else -0.1 * width, 1.02 * width)), 2)
            y = round(float(rng.uniform(0 if inside else -0.1 * height, 1.02 * height)), 2)
            data["annotations"].append({"id": len(data["annotations"]) + 1, "image_id": image_id, "bbox": [x, y, w, h],
                                        "area": w * h, "iscrowd": 0, "category_id": int(rng.choice([3, 7]))})
    return data


class _ReferenceCocoSelf:
    """What the reference's ``coco._load_coco_annotation`` reads of its ``self``: pycocotools' lookups
    (``getAnnIds(iscrowd=flag)`` keeps the annotations whose iscrowd equals flag) and the class map."""

    def __init__(self, data):
        self.images = {image["id"]: image for image in data["images"]}
        self.annotations = data["annotations"]
        self.by_id = {ann["id"]: ann for ann in self.annotations}
        categories = [c["id"] for c in data["categories"]]
        self.num_classes = len(categories) + 1
        self._coco_ind_to_class_ind = {cat: label for label, cat in enumerate(categories, 1)}
        self.load_mask = False
        self.coco = self

    def loadImgs(self, index):  # noqa: N802 (pycocotools' names)
        return [self.images[index]]

    def getAnnIds(self, imgIds, iscrowd):  # noqa: N802
        return [a["id"] for a in self.annotations if a["image_id"] == imgIds and a["iscrowd"] == iscrowd]

    def loadAnns(self, ids):  # noqa: N802
        return [dict(self.by_id[i]) for i in ids]

    def image_path_from_index(self, index):
        return f"{index}.jpg"


def _project_boxes(data, workdir):
    """The project's integer gt boxes per image id (its box report, expected to list clipped and dropped
    boxes here, is silenced)."""
    folder = os.path.join(workdir, "annotations")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "instances_parity.json"), "w") as f:
        json.dump(data, f)
    dataset_logger = logging.getLogger("lib.dataset")
    level, dataset_logger.level = dataset_logger.level, logging.ERROR
    try:
        entries = CocoDataset(workdir, "parity").load_entries()
    finally:
        dataset_logger.setLevel(level)
    entries = truncate_to_whole_pixels([dict(e, flipped=False) for e in entries])
    return {entry["id"]: entry["boxes"] for entry in entries}


def compare_coco_boxes(reference_coco, images, seed, workdir):
    """Per image and per box agreement of the integer gt boxes; a table's rows (all scenes / inside)."""
    columns = []
    for inside in (False, True):
        data = random_coco(np.random.default_rng(seed), images, inside)
        fake = _ReferenceCocoSelf(data)
        ours = _project_boxes(data, os.path.join(workdir, f"coco_{int(inside)}"))
        same_images = same_boxes = total_boxes = 0
        for image_id in fake.images:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = reference_coco.coco._load_coco_annotation(fake, image_id)[0]["boxes"].astype(np.float32)
            mine = ours.get(image_id, np.zeros((0, 4), np.float32))
            same_images += np.array_equal(theirs, mine)
            total_boxes += len(theirs)
            same_boxes += sum(any(np.array_equal(box, other) for other in mine) for box in theirs)
        columns.append((percent(same_images, len(fake.images)), percent(same_boxes, total_boxes)))
    return [["gt boxes arrays identical (images)", columns[0][0], columns[1][0]],
            ["reference boxes the project has", columns[0][1], columns[1][1]]]


# ------------------------------------------------------------------------------------------------ results

def compare_results(reference_coco, images, seed):
    """Entries of the results file identical (image, category, box, score); a table's rows."""
    rng = np.random.default_rng(seed)
    same = total = 0
    for image_id in range(images):
        count = int(rng.integers(1, 200))
        x1, y1 = rng.uniform(0, 600, (2, count)).astype(np.float32)
        w, h = rng.uniform(1, 300, (2, count)).astype(np.float32)
        # soft-NMS scores: many just above the 0.001 threshold; some quarter-pixel box edges (exact ties)
        scores = np.where(rng.random(count) < 0.5, rng.uniform(0.001, 0.0012, count), rng.random(count))
        scores = scores.astype(np.float32)
        boxes = np.stack([x1, y1, x1 + w, y1 + h], 1)
        boxes[::3] = np.round(boxes[::3] * 4) / 4
        dets = np.concatenate([boxes, scores[:, None]], 1)
        pack = {"cat_id": 7, "ann_type": "bbox", "binary_thresh": None, "all_im_info": [{"index": image_id}],
                "boxes": [dets]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = reference_coco.coco_results_one_category_kernel(pack)
        mine = coco_results([np.concatenate([dets, np.ones((count, 1), np.float32)], 1)], [image_id], [0, 7])
        total += len(theirs)
        same += sum(a == b for a, b in zip(theirs, mine))
    return [["results entries identical (box with 1 decimal, score with 8)", percent(same, total)]]
