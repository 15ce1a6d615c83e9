"""What every dataset format gives the roidb, the run record and the tester.

A format is a subclass of ``Dataset`` in a file of its own, registered under its config name
(``dataset.dataset``) in ``lib.dataset.roidb.DATASETS``; nothing else names a format. It reads its
annotations into unflipped roidb entries (``load_entries``), says which files those are
(``annotation_files``: the roidb cache is keyed on their content), names its classes (``classes[label]``,
0 = ``__background__``; counted before any entry is read by ``class_count``) and the ids results are
written with (``category_ids[label]``), says whether it has instance masks (``supports_masks``) and in which
order the reference tests its images (``reference_test_order``), and scores a test set's detections the way
that dataset is scored (``evaluate``, the tester's one evaluator interface). Instances are pickled into the
roidb cache, so they hold plain data.
"""
import os


def numbered_classes(num_classes):
    """Class names when only the count is known: background, then "class 1", ..."""
    return ["__background__"] + [f"class {label}" for label in range(1, num_classes)]


class Dataset:
    """One image set of a dataset format; ``classes`` and ``image_ids`` are known once entries are loaded,
    ``annotation_files`` (a list, or a property) from the start."""

    kind = None  # the format's name in log lines and cache file names
    classes = None
    category_ids = None  # per label; a format without ids of its own gives the labels themselves
    supports_masks = False  # True: load_entries(masks=True) gives each box's polygons (TRAIN.WITH_MASK)

    def __init__(self, dataset_path, image_set):
        self.dataset_path = os.path.abspath(dataset_path)
        self.image_set = image_set
        self.image_ids = None
        self.box_report = {}

    @classmethod
    def from_config(cls, cfg, image_set):
        """The dataset of ``image_set`` under ``dataset.dataset_path`` (a format that prepares its files
        first, e.g. generates them, does it here)."""
        return cls(cfg.dataset.dataset_path, image_set)

    @classmethod
    def check_config(cls, cfg):
        """The format's own checks of its dataset keys at config load (lib.config.validation), a
        ``ConfigError`` naming the key; a format with keys of its own overrides this."""

    @classmethod
    def class_count(cls, cfg, image_set):
        """The class count (background included) from the config and the class lists of the annotation
        files alone, without reading the entries or preparing files: a training start checks
        dataset.NUM_CLASSES against it before the roidb is built (lib.start_checks). Here: a format whose
        ``from_config`` knows its classes; a format that learns them from its entries overrides this."""
        return cls.from_config(cfg, image_set).num_classes

    @property
    def num_classes(self):
        """The class count, background included."""
        return len(self.classes)

    def load_entries(self):
        """Unflipped roidb entries of every image, in the dataset's order (sets ``classes`` and ``image_ids``);
        a format that ``supports_masks`` also takes ``masks=True`` (the polygons, lib/dataset/polygons.py)."""
        raise NotImplementedError

    def reference_test_order(self, entries):
        """The test ``entries`` in the order the reference tests this format's images
        (``dataset.TEST_IMAGE_ORDER: reference``); the dataset's own order unless a format says otherwise."""
        return entries

    def evaluate(self, entries, detections, out_dir, segmentations=None, scoring=None):
        """Score ``detections`` (per entry, (N, 6) ``[x1, y1, x2, y2, score, label]``) of the tested
        ``entries`` into ``out_dir``, with ``segmentations`` (per entry, one COCO RLE per detection row:
        a mask network's) where the format scores masks, and the test section ``scoring`` (TEST.EVAL_MAX_DETS,
        SIZE_BANDS, ...) where the format reads it; returns what goes into the test summary (``stats``: the
        metrics, when the set has annotations; ``results``: a results file, when the format writes one)."""
        raise NotImplementedError
