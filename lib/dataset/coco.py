"""COCO-format datasets, read with plain JSON and indexed with pycocotools for evaluation.

Layout: ``{dataset_path}/annotations/instances_{image_set}.json`` with the images of that set in
``{dataset_path}/images/{image_set}/``. Several sets joined with '+' form one dataset; they must share
their categories and have distinct image and annotation ids (as COCO's own splits do).

A set without annotations, such as COCO test-dev, has ``annotations/image_info_{image_set}.json``
instead (images and categories only): it loads for testing, with entries without boxes, and the
tester writes its results without evaluating them. test-dev's images live in COCO's
``test{year}`` folder, so ``images/test{year}/`` serves ``test-dev{year}`` unless
``images/test-dev{year}/`` exists; likewise ``images/val{year}/`` serves the minival sets cut from val
(``minival2014``, ``sminival2014``, ``valminusminival2014``: any name ending in ``minival{year}``).

With ``masks`` (TRAIN.WITH_MASK) the entries also carry each box's polygons (lib/dataset/polygons.py),
read as the reference reads them: the polygons of a ``segmentation`` list with at least 3 points, none
for an RLE-only annotation (its box trains with an empty mask); crowd annotations have no box among the
training boxes (they are ``crowd_boxes``), so no polygons either.
"""
import contextlib
import io
import json
import logging
import mmap
import os
import re

import numpy as np
from tqdm import tqdm

from lib.atomic import write_json
from lib.dataset.annotations import BoxReport, clean_boxes, escapes_folder, make_entry, split_image_sets
from lib.dataset.base import Dataset
from lib.dataset.polygons import pack_polygons
from lib.dataset.reference_rules import python2_dict_order
from lib.errors import DataError, DataFileError
from lib.evaluation.coco_summary import COCO_BANDS, dense_scene_warning, parse_bands, scored_max_dets
from lib.evaluation.metrics import coco_results, evaluate_coco


logger = logging.getLogger(__name__)

def read_coco_json(path):
    """Load and structurally check one COCO annotation file; errors name the file."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except OSError as err:
        raise DataFileError(f"cannot read COCO annotation file {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"COCO annotation file {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise DataError(f"COCO annotation file {path}: expected a JSON object, got {type(data).__name__}")
    for key in ("images", "categories"):
        if not isinstance(data.get(key), list):
            raise DataError(f"COCO annotation file {path}: missing or malformed '{key}' list")
    if not data["categories"]:
        raise DataError(f"COCO annotation file {path}: the 'categories' list is empty")
    data.setdefault("annotations", [])  # image-info files (test-dev) have none
    if not isinstance(data["annotations"], list):
        raise DataError(f"COCO annotation file {path}: 'annotations' must be a list")
    return data


# JSON numbers load as int or float; exact type tests are also much faster than isinstance on ABCs.
def _is_int(value):
    return type(value) is int


def _number(value):
    """``value`` as a float when it is a JSON number, else None."""
    return float(value) if type(value) in (int, float) else None


def _is_box(value):
    return type(value) is list and len(value) == 4 and all(type(v) in (int, float) for v in value)


_NO_BOX = [float("nan")] * 4


def _categories(data, path):
    """``[(category_id, name), ...]`` sorted by id, which fixes the contiguous labels 1..C."""
    categories = []
    for cat in data["categories"]:
        if not (type(cat) is dict and _is_int(cat.get("id")) and type(cat.get("name")) is str):
            raise DataError(f"COCO annotation file {path}: category {cat!r} needs an integer 'id' and a 'name'")
        categories.append((int(cat["id"]), cat["name"]))
    ids = [cat_id for cat_id, _ in categories]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"COCO annotation file {path}: category id {duplicate} appears twice")
    return sorted(categories)


_CATEGORIES_KEY = b'"categories"'
_FIRST_WINDOW = 1 << 20  # bytes after the key parsed at first (COCO's 80 categories: 6 kB), 4x more per retry


def read_categories(path):
    """``_categories`` of one annotation file at the cost of a byte scan: where the name ``"categories"``
    occurs once in the file (COCO's own files), that key's value alone is parsed; otherwise, or where that
    value does not parse, the whole file is read (``read_coco_json``, whose errors name the file)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(_CATEGORIES_KEY)
            categories = _json_value_at(data, at + len(_CATEGORIES_KEY)) \
                if at >= 0 and data.find(_CATEGORIES_KEY, at + 1) < 0 else None
    except (OSError, ValueError):  # unreadable, or empty (nothing to map): the whole read says what is wrong
        categories = None
    if type(categories) is not list or not categories:
        return _categories(read_coco_json(path), path)
    return _categories({"categories": categories}, path)


def _json_value_at(data, start):
    """The JSON value after the ``:`` at ``data[start:]`` (bytes), parsed from a window that grows until it
    holds the value; None where there is no such value."""
    window = _FIRST_WINDOW
    while True:
        text = data[start:start + window].decode("utf-8", "ignore")  # (a character cut at the window's end)
        colon = re.match(r"\s*:\s*", text)
        try:
            return json.JSONDecoder().raw_decode(text, colon.end())[0] if colon else None
        except json.JSONDecodeError:
            if start + window >= len(data):
                return None
            window *= 4


def _check_image(image, path):
    if not (type(image) is dict and _is_int(image.get("id"))):
        raise DataError(f"COCO annotation file {path}: image record {str(image)[:200]} has no integer 'id'")
    if type(image.get("file_name")) is not str:
        raise DataError(f"COCO annotation file {path}: image id {image['id']} has no 'file_name'")
    if escapes_folder(image["file_name"]):
        raise DataError(f"COCO annotation file {path}: image id {image['id']} has file_name "
                        f"{image['file_name']!r}, which leads outside the image folder (image paths must stay "
                        f"inside it; a symlink placed inside it may point elsewhere)")
    for key in ("width", "height"):
        value = _number(image.get(key))
        if value is None or not value >= 1:  # NaN fails too
            raise DataError(
                f"COCO annotation file {path}: image id {image['id']} has invalid {key} {image.get(key)!r}")


def _check_annotation(ann, path, index_of, label_of, seen_annotations):
    """Every id an annotation refers to must exist; a dangling one is an error naming it."""
    if not (type(ann) is dict and _is_int(ann.get("id"))):
        raise DataError(f"COCO annotation file {path}: annotation {str(ann)[:200]} has no integer 'id'")
    if ann["id"] in seen_annotations:
        raise DataError(f"COCO annotation file {path}: annotation id {ann['id']} appears twice")
    seen_annotations.add(ann["id"])
    if not _is_int(ann.get("image_id")) or ann["image_id"] not in index_of:
        raise DataError(f"COCO annotation file {path}: annotation {ann['id']} refers to image id "
                        f"{ann.get('image_id')!r}, which is not in its 'images' list")
    if not _is_int(ann.get("category_id")) or ann["category_id"] not in label_of:
        raise DataError(f"COCO annotation file {path}: annotation {ann['id']} has category_id "
                        f"{ann.get('category_id')!r}, which is not in its 'categories' list")


def _polygons(ann, report):
    """The polygons of a non-crowd annotation as (2K,) float64 arrays: those of its ``segmentation`` list with
    at least 6 coordinates (the reference's rule), none for RLE. Malformed polygons (not a list of finite
    numbers, odd length) are left out and counted, as are the short ones; the box is kept either way."""
    segmentation = ann.get("segmentation")
    if type(segmentation) is not list:
        report.fix("no polygon segmentation (RLE or none): trained with an empty mask", [ann["id"]])
        return []
    polygons = []
    for polygon in segmentation:
        try:
            coords = np.array(polygon, np.float64) if type(polygon) is list else None
        except (TypeError, ValueError):
            coords = None
        if coords is None or coords.ndim != 1 or len(coords) % 2 or not np.isfinite(coords).all():
            report.fix("malformed polygon (not an even-length list of finite numbers) left out of its mask",
                       [ann["id"]])
        elif len(coords) < 6:
            report.fix("polygon of fewer than 3 points left out of its mask", [ann["id"]])
        else:
            polygons.append(coords)
    return polygons


def annotation_file(dataset_path, image_set):
    """``annotations/instances_{image_set}.json``, or ``image_info_{image_set}.json`` for a set
    without annotations (COCO test-dev); an error naming both when neither exists."""
    folder = os.path.join(dataset_path, "annotations")
    candidates = [os.path.join(folder, f"{kind}_{image_set}.json") for kind in ("instances", "image_info")]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"COCO annotation file {candidates[0]} (image set {image_set!r}) does not exist, "
                            f"nor does {os.path.basename(candidates[1])} (a set without annotations)")


# Sets cut from a COCO split, read from that split's image folder when they have none of their own: test-dev
# from test{year}; any set named ``...minival{year}`` (the reference's minival2014, sminival2014,
# valminusminival2014, or one of the user's) from val{year}.
SPLIT_OF_SET = ((re.compile(r"test-dev(\d*)"), "test"), (re.compile(r"\w*minival(\d{4})"), "val"))


def image_folder(dataset_path, image_set):
    """``images/{image_set}``; without that folder, the split's folder of a set cut from it (``SPLIT_OF_SET``:
    ``images/test{year}`` for ``test-dev{year}``, ``images/val{year}`` for ``...minival{year}``)."""
    folder = os.path.join(dataset_path, "images", image_set)
    if os.path.isdir(folder):
        return folder
    for pattern, split in SPLIT_OF_SET:
        match = pattern.fullmatch(image_set)
        if match:
            return os.path.join(dataset_path, "images", f"{split}{match.group(1)}")
    return folder


class CocoDataset(Dataset):
    """One or more COCO image sets; ``load_entries`` reads them, ``coco`` indexes them for COCOeval.

    ``classes[label]`` is the category name of contiguous label ``label`` (0 = background) and
    ``category_ids[label]`` its COCO category id (the evaluator writes results with it).
    """

    kind = "coco"
    supports_masks = True

    def __init__(self, dataset_path, image_set):
        super().__init__(dataset_path, image_set)
        self.image_sets = split_image_sets(image_set)
        self.annotation_files = [annotation_file(self.dataset_path, name) for name in self.image_sets]
        self._coco = None

    @property
    def cache_options(self):
        """What beyond the annotation files changes the roidb (lib.dataset.roidb_cache's key): the image folders
        read instead of ``images/{set}`` (a split's, ``SPLIT_OF_SET``), which the entries' paths name."""
        folders = {name: os.path.relpath(image_folder(self.dataset_path, name), self.dataset_path)
                   for name in self.image_sets}
        moved = {name: folder for name, folder in folders.items() if folder != os.path.join("images", name)}
        return {"image_folders": moved} if moved else {}

    @classmethod
    def class_count(cls, cfg, image_set):
        """From the categories of the first annotation file (joined sets must share them: ``load_entries``)."""
        return len(read_categories(cls.from_config(cfg, image_set).annotation_files[0])) + 1

    def load_entries(self, masks=False):
        """Unflipped roidb entries of every image, in file order, with the boxes' polygons when ``masks``; also
        sets classes and image ids."""
        report = BoxReport(f"COCO {self.image_set} ({', '.join(self.annotation_files)})")
        entries, first_file, seen_annotations = [], {}, set()
        for image_set, path in zip(self.image_sets, self.annotation_files):
            data = read_coco_json(path)
            categories = _categories(data, path)
            if self.classes is None:
                self.classes = ["__background__"] + [name for _, name in categories]
                self.category_ids = [0] + [cat_id for cat_id, _ in categories]
            elif [0] + [cat_id for cat_id, _ in categories] != self.category_ids:
                raise DataError(
                    f"COCO annotation file {path}: categories differ from {self.annotation_files[0]}; "
                    f"joined image sets must share them")
            label_of = {cat_id: label for label, cat_id in enumerate(self.category_ids) if label}
            image_dir = image_folder(self.dataset_path, image_set)
            entries += self._file_entries(data, path, image_dir, label_of, report, first_file, seen_annotations,
                                          masks)
        report.log()
        self.box_report = report.counts()
        self.image_ids = [entry["id"] for entry in entries]
        return entries

    @staticmethod
    def _file_entries(data, path, image_dir, label_of, report, first_file, seen_annotations, masks):
        """Entries of one file: ids checked per record, boxes checked in one vectorised pass, split by image."""
        images = data["images"]
        index_of = {}
        for image in images:
            _check_image(image, path)
            if image["id"] in first_file:
                raise DataError(
                    f"image id {image['id']} appears twice: in {first_file[image['id']]} and in {path}")
            first_file[image["id"]] = path
            index_of[image["id"]] = len(index_of)
        anns = data["annotations"]
        for ann in tqdm(anns, desc=f"reading {os.path.basename(path)}", leave=False, mininterval=1):
            _check_annotation(ann, path, index_of, label_of, seen_annotations)
        ids = np.array([ann["id"] for ann in anns], dtype=np.int64)
        owner = np.array([index_of[ann["image_id"]] for ann in anns], dtype=np.int64)
        labels = np.array([label_of[ann["category_id"]] for ann in anns], dtype=np.int32)
        crowd = np.array([bool(ann.get("iscrowd", 0)) for ann in anns], dtype=bool)
        area = np.array([_number(ann.get("area", 1.0)) for ann in anns], dtype=np.float64)  # absent: not checked
        bboxes = [ann.get("bbox") for ann in anns]
        malformed = np.array([not _is_box(bbox) for bbox in bboxes], dtype=bool)
        xywh = np.array([_NO_BOX if bad else bbox for bbox, bad in zip(bboxes, malformed)],
                        dtype=np.float64).reshape(-1, 4)

        report.skip("malformed bbox (not a list of 4 numbers)", ids[malformed])
        finite = np.isfinite(xywh).all(axis=1)
        report.skip("non-finite coordinates", ids[~finite & ~malformed])
        positive = finite & (np.nan_to_num(xywh[:, 2]) > 0) & (np.nan_to_num(xywh[:, 3]) > 0)
        report.skip("non-positive width or height", ids[finite & ~positive])
        has_area = positive & np.isfinite(area) & (area > 0)
        report.skip("zero or invalid 'area'", ids[positive & ~has_area])
        usable = np.flatnonzero(has_area)
        # COCO boxes are continuous [x, x + w); the inclusive last pixel is x + w - 1.
        x, y, w, h = xywh[usable].T
        corners = np.stack([x, y, x + np.maximum(w - 1, 0), y + np.maximum(h - 1, 0)], axis=1)
        heights = np.array([image["height"] for image in images], dtype=np.float64)[owner[usable]]
        widths = np.array([image["width"] for image in images], dtype=np.float64)[owner[usable]]
        keep, boxes = clean_boxes(corners, heights, widths, ids[usable], report)

        rows = usable[keep]
        order = np.argsort(owner[rows], kind="stable")  # group by image, file order within one
        rows, boxes = rows[order], boxes[order]
        bounds = np.searchsorted(owner[rows], np.arange(len(images) + 1))
        entries = []
        for index, image in enumerate(images):
            image_rows, image_boxes = rows[bounds[index]:bounds[index + 1]], boxes[bounds[index]:bounds[index + 1]]
            is_crowd = crowd[image_rows]
            entry = make_entry(
                os.path.join(image_dir, image["file_name"]), image["id"], image["height"], image["width"],
                image_boxes[~is_crowd], labels[image_rows][~is_crowd], image_boxes[is_crowd])
            if masks:
                entry.update(pack_polygons([_polygons(anns[row], report) for row in image_rows[~is_crowd]]))
            entries.append(entry)
        return entries

    def reference_test_order(self, entries):
        """One COCO set: the reference's order, its Python 2 dict of image ids; joined sets keep theirs
        (the reference tests one set at a time)."""
        if len(self.image_sets) != 1:
            return entries
        return [entries[i] for i in python2_dict_order([entry["id"] for entry in entries])]

    @property
    def coco(self):
        """pycocotools ``COCO`` over all the image sets (loaded on first use: training never needs it)."""
        if self._coco is None:
            from pycocotools.coco import COCO

            datasets = [read_coco_json(path) for path in self.annotation_files]
            merged = datasets[0]
            if len(datasets) > 1:
                merged = {
                    "images": [image for data in datasets for image in data["images"]],
                    "annotations": [ann for data in datasets for ann in data["annotations"]],
                    "categories": datasets[0]["categories"],
                }
            coco = COCO()
            coco.dataset = merged
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
                coco.createIndex()
            self._coco = coco
        return self._coco

    def __getstate__(self):
        # The roidb cache pickles the dataset; the COCO index is rebuilt from the files on demand.
        return {**self.__dict__, "_coco": None}

    def evaluate(self, entries, detections, out_dir, segmentations=None, scoring=None):
        """The results file (COCO format, original category ids: test-dev ready; masks as ``segmentation``),
        then COCO bbox (and segm) AP through pycocotools when the set has annotations, at ``scoring``'s
        TEST.EVAL_MAX_DETS (0: its MAX_PER_IMAGE) detections per image and size bands TEST.SIZE_BANDS."""
        image_ids = [entry["id"] for entry in entries]
        results = coco_results(detections, image_ids, self.category_ids, segmentations)
        path = os.path.join(out_dir, f"detections_{self.image_set}_results.json")
        write_json(results, path)
        logger.info("wrote %d detections to %s", len(results), path)
        if not self.coco.dataset.get("annotations"):
            logger.info("%s has no annotations (e.g. test-dev): results written for submission, not evaluated",
                        self.image_set)
            return {"results": path}
        max_dets, bands = 100, COCO_BANDS
        if scoring is not None:
            max_dets, bands = scored_max_dets(scoring), parse_bands(scoring.SIZE_BANDS)
            warning = dense_scene_warning(self.coco, results, image_ids, scoring)
            if warning:
                logger.warning("%s", warning)
        stats = evaluate_coco(self.coco, path, out_dir, image_ids=image_ids, max_dets=max_dets, bands=bands)
        return {"results": path, "stats": stats}

