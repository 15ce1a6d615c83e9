"""Pascal VOC datasets in the standard VOCdevkit layout, VOC's own or a user's.

``{dataset_path}/VOC{year}/ImageSets/Main/{split}.txt`` lists the images of a split,
``VOC{year}/Annotations/{name}.xml`` holds their boxes (1-based inclusive pixels) and
``VOC{year}/JPEGImages/{name}.jpg`` the pixels (or the XML's ``<filename>`` there when no such .jpg
exists); names are any file names without whitespace. An image set names ``{year}_{split}`` parts
joined with '+', e.g. ``2007_trainval+2012_trainval``; ``year`` is any letters and digits (own data:
``VOCmine/``, image set ``mine_train``).

The classes are VOC's 20 unless ``dataset.CLASSES`` (a list) or ``dataset.CLASSES_FILE`` (one name per
line) names others, background excluded; labels follow that order. Image ids are ints (the roidb and
proposal files need them): ``{year}{digits}`` for VOC's names (``2007``/``000005`` -> 20070000000005),
a stable hash of ``{year}/{name}`` above 10^16 for any other name.

Objects marked ``difficult`` stay in the entries with a ``difficult`` flag: VOC evaluation ignores
them, and training leaves them out: they go to ``crowd_boxes``, which training does not read, as the reference
drops them (see ``lib.dataset.roidb``).
"""
import hashlib
import os
import re
import xml.etree.ElementTree as ET

from tqdm import tqdm

from lib.dataset.annotations import BoxReport, clean_boxes, escapes_folder, make_entry, split_image_sets
from lib.dataset.base import Dataset
from lib.errors import DataError, DataFileError
from lib.evaluation.metrics import evaluate_voc

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)


HASHED_IDS = 10 ** 16  # ids of names that are not VOC's digits start here


def voc_image_id(year, name):
    """Integer id of a VOC image, unique across years: ``2007``/``000005`` -> 20070000000005 for VOC's
    names (digits with an optional '_', e.g. ``2008_000008``), otherwise ``HASHED_IDS`` + a 15-digit
    hash of ``{year}/{name}`` (stable, so a proposal file keeps matching its images)."""
    digits = name.replace("_", "")
    if year.isdigit() and digits.isdigit() and len(digits) <= 10:
        return int(year) * 10 ** 10 + int(digits)
    return HASHED_IDS + int(hashlib.sha1(f"{year}/{name}".encode()).hexdigest(), 16) % 10 ** 15


def read_class_names(names, path):
    """The class names (background excluded) of ``dataset.CLASSES`` or the file ``dataset.CLASSES_FILE``
    (one per line, blank lines and ``#`` comments skipped); VOC's 20 when both are empty."""
    if names and path:
        raise DataError("config keys dataset.CLASSES and dataset.CLASSES_FILE: set one of them, not both")
    if path:
        try:
            with open(path) as f:
                names = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"config key dataset.CLASSES_FILE: cannot read {path}: {err}") from None
    if not names:
        if path:
            raise DataError(f"config key dataset.CLASSES_FILE: {path} names no class")
        return VOC_CLASSES
    names = tuple(str(n).strip() for n in names)
    key = f"dataset.CLASSES_FILE ({path})" if path else "dataset.CLASSES"
    bad = [n for n in names if not n or n == "__background__"]
    if bad or len(set(names)) != len(names):
        raise DataError(f"config key {key}: class names must be distinct, non-empty and not __background__, "
                         f"got {list(names)!r}")
    return names


def _read_xml(path):
    try:
        return ET.parse(path).getroot()
    except OSError as err:
        raise DataFileError(f"cannot read VOC annotation file {path}: {err.strerror or err}") from None
    except ET.ParseError as err:
        raise DataError(f"VOC annotation file {path} is not valid XML: {err}") from None


def _positive_int(root, key, path):
    text = root.findtext(f"size/{key}")
    try:
        value = int(float(text))
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise DataError(f"VOC annotation file {path}: missing or invalid <size><{key}> ({text!r})")
    return value


class PascalVocDataset(Dataset):
    """The images of one or more ``{year}_{split}`` parts, with ``class_names`` (default VOC's 20) as
    labels 1..C (results are written with the labels).

    ``image_names[i]`` is ``"VOC{year}/{name}"`` of ``image_ids[i]`` (for VOC-format result files).
    """

    kind = "pascal_voc"

    def __init__(self, dataset_path, image_set, class_names=VOC_CLASSES):
        super().__init__(dataset_path, image_set)
        self.classes = ("__background__",) + tuple(class_names)
        self.category_ids = tuple(range(len(self.classes)))  # results are written with the labels
        self._label_of = {name: label for label, name in enumerate(self.classes) if label}
        self.parts = []
        for part in split_image_sets(image_set):
            match = re.fullmatch(r"([A-Za-z0-9]+)_(\w+)", part)
            if not match:
                raise DataError(f"Pascal VOC image set {part!r} (in {image_set!r}) is not of the form YEAR_SPLIT, "
                                f"e.g. 2007_trainval")
            self.parts.append(match.groups())
        self.list_files = [self._path(year, "ImageSets", "Main", f"{split}.txt") for year, split in self.parts]
        for path in self.list_files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Pascal VOC image list {path} (image set {image_set!r}) does not exist")
        self.image_names = None
        self._names = None

    @property
    def cache_options(self):
        """What beyond the annotation files changes the roidb (lib.dataset.roidb's cache key): the classes."""
        return {} if self.classes[1:] == VOC_CLASSES else {"classes": list(self.classes[1:])}

    @classmethod
    def from_config(cls, cfg, image_set):
        """With the classes of ``dataset.CLASSES`` / ``CLASSES_FILE`` (VOC's 20 when both are empty)."""
        return cls(cfg.dataset.dataset_path, image_set, read_class_names(cfg.dataset.CLASSES, cfg.dataset.CLASSES_FILE))

    @property
    def use_07_metric(self):
        """VOC2007 results are reported with the 11-point AP of its devkit."""
        return all(year == "2007" for year, _ in self.parts)

    def _path(self, year, *parts):
        return os.path.join(self.dataset_path, f"VOC{year}", *parts)

    def _listed_images(self):
        """``[(year, name), ...]`` in list-file order."""
        if self._names is None:
            names = []
            for (year, _), path in zip(self.parts, self.list_files):
                try:
                    with open(path) as f:
                        names.extend((year, line.split()[0]) for line in f if line.strip())
                except (OSError, UnicodeDecodeError) as err:
                    raise DataFileError(f"cannot read Pascal VOC image list {path}: {err}") from None
            escaping = next((name for _, name in names if escapes_folder(name)), None)
            if escaping is not None:
                raise DataError(f"Pascal VOC image list of {self.image_set!r} names image {escaping!r}, which "
                                f"leads outside the dataset's folders (names must stay inside them)")
            self._names = names
        return self._names

    @property
    def annotation_files(self):
        """The image lists and every listed XML: what the roidb is built from (and its cache keyed on)."""
        listed = self._listed_images()
        return self.list_files + [self._path(year, "Annotations", f"{name}.xml") for year, name in listed]

    def load_entries(self):
        """Unflipped roidb entries, difficult objects included and flagged; sets image ids and names."""
        report = BoxReport(f"Pascal VOC {self.image_set} ({self.dataset_path})")
        entries, seen = [], {}
        for year, name in tqdm(self._listed_images(), desc=f"reading VOC {self.image_set}", leave=False):
            image_id = voc_image_id(year, name)
            if image_id in seen:
                first = seen[image_id]
                raise DataError(f"Pascal VOC image VOC{year}/{name} is listed twice in {self.image_set!r}"
                                 if first == (year, name) else
                                 f"Pascal VOC images VOC{first[0]}/{first[1]} and VOC{year}/{name} get the same "
                                 f"image id {image_id}: rename one")
            seen[image_id] = (year, name)
            entries.append(self._entry(year, name, image_id, report))
        report.log()
        self.box_report = report.counts()
        self.image_ids = [entry["id"] for entry in entries]
        self.image_names = [f"VOC{year}/{name}" for year, name in self._listed_images()]
        return entries

    def _entry(self, year, name, image_id, report):
        path = self._path(year, "Annotations", f"{name}.xml")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Pascal VOC annotation file {path} (listed in {self.image_set!r}) does not exist")
        root = _read_xml(path)
        width, height = _positive_int(root, "width", path), _positive_int(root, "height", path)
        corners, labels, difficult, refs = [], [], [], []
        for index, obj in enumerate(root.findall("object")):
            class_name = (obj.findtext("name") or "").strip()
            if class_name not in self._label_of:
                raise DataError(f"VOC annotation file {path}: object {index} has unknown class {class_name!r} "
                                 f"(not one of the {len(self._label_of)} classes; dataset.CLASSES or CLASSES_FILE "
                                 f"name own ones)")
            ref = f"VOC{year}/{name} object {index}"
            try:
                # 1-based inclusive pixels -> 0-based inclusive pixels
                box = [float(obj.findtext(f"bndbox/{key}")) - 1 for key in ("xmin", "ymin", "xmax", "ymax")]
            except (TypeError, ValueError):
                report.skip("malformed <bndbox>", [ref])
                continue
            corners.append(box)
            labels.append(self._label_of[class_name])
            difficult.append((obj.findtext("difficult") or "0").strip() == "1")
            refs.append(ref)
        keep, boxes = clean_boxes(corners, height, width, refs, report)
        return make_entry(
            self._image_path(year, name, root), image_id, height, width,
            boxes, [lab for lab, k in zip(labels, keep) if k], [], [d for d, k in zip(difficult, keep) if k])

    def _image_path(self, year, name, root):
        """``JPEGImages/{name}.jpg``, or the XML's ``<filename>`` there when that .jpg does not exist."""
        path = self._path(year, "JPEGImages", f"{name}.jpg")
        filename = os.path.basename((root.findtext("filename") or "").strip())
        if not os.path.isfile(path) and filename:
            return self._path(year, "JPEGImages", filename)
        return path

    def evaluate(self, entries, detections, out_dir, segmentations=None, scoring=None):
        """VOC AP per class at IoU 0.5 against the entries' boxes, difficult ones ignored (11-point AP for
        VOC2007), under ``scoring``'s TEST.VOC_EVAL_RULES (None: the reference's); VOC has no masks to score
        ``segmentations`` against (TRAIN.WITH_MASK is refused for it)."""
        rules = "reference" if scoring is None else scoring.VOC_EVAL_RULES
        return {"stats": evaluate_voc(detections, [e["boxes"] for e in entries], [e["gt_classes"] for e in entries],
                                      [e["difficult"] for e in entries], list(self.classes), out_dir,
                                      self.use_07_metric, reference_rules=rules == "reference")}
