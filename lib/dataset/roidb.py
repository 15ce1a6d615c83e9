"""The roidb (one dict per image, format in ARCHITECTURE.md), built from a dataset and cached on disk
(lib/dataset/roidb_cache.py). Proposals are attached after the cache (they come from a separate, often
regenerated file).
"""
import logging
import os

import numpy as np

from chip_generator.mining import neg_chip_proposals
from lib.boxes import flip_boxes
from lib.dataset.base import numbered_classes
from lib.dataset.coco import CocoDataset
from lib.dataset.pascal_voc import PascalVocDataset
from lib.dataset.polygons import flip_polygons, select_polygons
from lib.dataset.proposals import read_proposals
from lib.dataset.reference_rules import suppress_pooled_proposals, truncate_to_whole_pixels
from lib.dataset.roidb_cache import cache_path, read_cache, write_cache
from lib.dataset.synthetic import SyntheticDataset
from lib.errors import ConfigError, DataError
from lib.paths import shown_path

logger = logging.getLogger(__name__)

# The dataset formats (lib.dataset.base.Dataset) by their dataset.dataset name: a new format is a file of
# its own and a line here.
DATASETS = {"coco": CocoDataset, "pascal_voc": PascalVocDataset, "synthetic": SyntheticDataset}
# How many missing ids an error or log line lists.
MAX_LISTED = 5


def make_dataset(cfg, image_set):
    """The dataset object named by ``cfg.dataset.dataset`` for ``image_set``."""
    kind = cfg.dataset.dataset
    if kind not in DATASETS:
        raise ConfigError(f"config key dataset.dataset: unknown dataset {kind!r}; expected one of {sorted(DATASETS)}")
    return DATASETS[kind].from_config(cfg, image_set)


def load_roidb(cfg, image_set, training=True):
    """``(roidb, dataset)`` for ``image_set``.

    Training: images without usable boxes are dropped, VOC difficult objects are moved to ``crowd_boxes``
    (which training does not read), mirrored copies are appended when ``cfg.TRAIN.FLIP``, proposals are attached
    when ``cfg.dataset.proposal`` names a file, and with ``cfg.TRAIN.WITH_MASK`` (COCO-format sets only)
    every box has its polygons (lib/dataset/polygons.py). Test: every image, in the dataset's order,
    with all its boxes and their ``difficult`` flags (the VOC evaluator's ground truth).
    An image file missing from disk is an error listing the first few, not a skip: a silently
    smaller dataset would change training and make AP incomparable. The project's synthetic
    dataset (``dataset.dataset: synthetic``) is generated first when absent.
    """
    dataset = make_dataset(cfg, image_set)
    flip = bool(training and cfg.TRAIN.FLIP)
    masks = bool(training and cfg.TRAIN.WITH_MASK)
    if masks and not dataset.supports_masks:
        raise ConfigError(f"config key TRAIN.WITH_MASK: instance masks need a COCO-format dataset (polygons), "
                          f"but dataset.dataset is {cfg.dataset.dataset!r}")
    keep_empty = training and keeps_empty_images(cfg)
    path = cache_path(cfg.dataset.root_path, dataset, training, flip, masks, keep_empty)
    cached = read_cache(path)
    if cached is not None:
        dataset, roidb = cached
        logger.info("roidb of %s %r: %d entries from cache %s", dataset.kind, image_set, len(roidb), shown_path(path))
    else:
        entries = dataset.load_entries(masks=True) if masks else dataset.load_entries()
        roidb = training_roidb(entries, flip, keep_empty) if training else entries
        write_cache(path, (dataset, roidb))
        logger.info("roidb of %s %r: %d entries, cached to %s", dataset.kind, image_set, len(roidb), shown_path(path))
    check_num_classes(cfg, dataset.num_classes, f"{dataset.kind} image set {dataset.image_set!r} in "
                                                f"{dataset.dataset_path}")
    check_image_sizes(roidb, dataset, cfg.dataset.MAX_IMAGE_PIXELS)
    check_image_files(roidb)
    if not training and cfg.dataset.TEST_IMAGE_ORDER == "reference":
        roidb = dataset.reference_test_order(roidb)
    if training and cfg.dataset.INTEGER_BOXES:
        roidb = truncate_to_whole_pixels(roidb)
    if training and (proposals := neg_chip_proposals(cfg)):
        attach_proposals(roidb, proposals, cfg.dataset.PROPOSAL_NMS)
    return roidb, dataset


def config_classes(cfg):
    """The class names (background first) a config gives its data: numbered ``dataset.NUM_CLASSES`` names
    when the count is set, else the classes of ``dataset.test_image_set`` when its annotations are on disk;
    None when it cannot be read."""
    if cfg.dataset.NUM_CLASSES:
        return numbered_classes(cfg.dataset.NUM_CLASSES)
    try:
        return list(load_roidb(cfg, cfg.dataset.test_image_set, training=False)[1].classes)
    except (FileNotFoundError, FileExistsError, ValueError):
        return None


def flip_entry(entry):
    """The mirrored copy of an unflipped entry (the loader flips the pixels when ``flipped``)."""
    flipped = dict(entry, flipped=True)
    for key in ("boxes", "crowd_boxes"):
        flipped[key] = flip_boxes(entry[key], entry["width"])
    if "mask_coords" in entry:
        flipped["mask_coords"] = flip_polygons(entry["mask_coords"], entry["width"])
    return flipped


def keeps_empty_images(cfg):
    """Whether training keeps images without a usable box (TRAIN.EMPTY_IMAGES negative): only where they
    can give negative chips, i.e. with negative chips on and a proposal file; said once otherwise."""
    if cfg.TRAIN.EMPTY_IMAGES != "negative":
        return False
    if neg_chip_proposals(cfg):
        return True
    logger.info("TRAIN.EMPTY_IMAGES negative: images without boxes are still dropped, negative chips are off "
                "(TRAIN.USE_NEG_CHIPS with a dataset.proposal file turns them on)")
    return False


def training_roidb(entries, flip, keep_empty=False):
    """Training entries: difficult boxes moved to crowd_boxes (unread), images without boxes dropped (``keep_empty``:
    kept in place, for their negative chips), flips appended."""
    usable, empty = [], []
    for entry in entries:
        entry = dict(entry)
        difficult = entry.pop("difficult")
        entry["crowd_boxes"] = np.concatenate([entry["crowd_boxes"], entry["boxes"][difficult]])
        if "mask_counts" in entry:
            entry.update(select_polygons(entry, ~difficult))
        entry["boxes"] = entry["boxes"][~difficult]
        entry["gt_classes"] = entry["gt_classes"][~difficult]
        if not len(entry["boxes"]):
            empty.append(entry)
        if len(entry["boxes"]) or keep_empty:
            usable.append(entry)
    if empty and keep_empty:
        logger.info("kept %d of %d training images without usable boxes as sources of negative chips",
                    len(empty), len(entries))
    elif empty:
        logger.warning("dropped %d of %d training images without usable boxes (e.g. image ids %s)",
                       len(empty), len(entries), ", ".join(str(e["id"]) for e in empty[:MAX_LISTED]))
    if entries and len(empty) == len(entries):
        raise DataError(f"none of the {len(entries)} training images has a usable box (every box is invalid, "
                        f"difficult or of an unknown class: see the warnings above); check the annotations")
    return usable + [flip_entry(entry) for entry in usable] if flip else usable


def check_image_sizes(roidb, dataset, max_pixels):
    """Every annotated image size must be within ``max_pixels`` (dataset.MAX_IMAGE_PIXELS): refused at load,
    before anything decodes it or plans chips over it."""
    sizes = np.array([entry["height"] * entry["width"] for entry in roidb], dtype=np.float64)
    if len(sizes) and sizes.max() > max_pixels:
        entry = roidb[int(np.argmax(sizes))]
        raise DataError(f"{dataset.kind} image set {dataset.image_set!r}: image id {entry['id']} ({entry['image']}) "
                        f"is annotated {entry['width']}x{entry['height']} pixels ({sizes.max() / 1e6:.0f} Mpx), "
                        f"more than dataset.MAX_IMAGE_PIXELS ({max_pixels / 1e6:.0f} Mpx); {len({e['id'] for e, s in zip(roidb, sizes) if s > max_pixels})} "
                        f"image(s) are over it: fix their annotated sizes, or raise the limit for genuine large images")


def check_num_classes(cfg, num_classes, where):
    """``cfg.dataset.NUM_CLASSES`` must be 0 (derive from the data) or ``num_classes``, the class count
    (background included) of the data ``where`` names."""
    expected = cfg.dataset.NUM_CLASSES
    if expected and expected != num_classes:
        raise ConfigError(
            f"config key dataset.NUM_CLASSES is {expected}, but {where} has {num_classes - 1} categories, i.e. "
            f"{num_classes} classes with background; set it to {num_classes} or to 0 to derive it")


def check_image_files(roidb):
    """Fail early, listing a few, when images named by the annotations are not on disk."""
    missing = [entry for entry in roidb if not entry["flipped"] and not os.path.isfile(entry["image"])]
    if missing:
        listed = "; ".join(f"image id {entry['id']}: {entry['image']}" for entry in missing[:MAX_LISTED])
        raise FileNotFoundError(
            f"{len(missing)} of {sum(not e['flipped'] for e in roidb)} images named by the annotations "
            f"are missing, e.g. {listed}")


def attach_proposals(roidb, path, nms_thresh=0.0):
    """Set ``entry["proposals"]`` (P, 4) from a proposal file (``lib.dataset.proposals``: ``{image_id: (P, 5)
    [box, score]}``).

    Boxes are in original, unflipped pixels; flipped entries get mirrored copies. Proposals that cannot
    seed a chip are dropped, counted by reason in one warning per file: not finite, inverted or empty
    (x2 < x1 or y2 < y1: the chip generator refuses them), or sharing no pixel with their image
    (x1 > width - 1, y1 > height - 1, x2 < 0 or y2 < 0: clamped, they would become degenerate boxes in the
    corners).
    Then each image's proposals go through NMS at ``nms_thresh`` (dataset.PROPOSAL_NMS; 0 or a file
    without scores: none). Images absent from the file get an empty (0, 4) array and are counted in one
    log line.
    """
    proposals = read_proposals(path)
    missing, kept, dropped = [], {}, {}
    reasons = dict.fromkeys(PROPOSAL_DROP_REASONS, 0)
    for entry in roidb:
        image_id = entry["id"]
        if image_id not in proposals:
            if not entry["flipped"]:
                missing.append(image_id)
            entry["proposals"] = np.zeros((0, 4), dtype=np.float32)
            continue
        if image_id not in kept:  # once per image, the mirrored entry mirrors the result
            boxes = proposals[image_id]
            reason = proposal_drop_reasons(boxes, entry["width"], entry["height"])
            if reason.any():
                dropped[image_id] = int(np.count_nonzero(reason))
                for code, name in enumerate(PROPOSAL_DROP_REASONS, start=1):
                    reasons[name] += int(np.count_nonzero(reason == code))
                boxes = boxes[reason == 0]
            if nms_thresh and boxes.shape[1] == 5:
                boxes = suppress_pooled_proposals(boxes, nms_thresh)
            kept[image_id] = boxes
        boxes = kept[image_id]
        entry["proposals"] = flip_boxes(boxes[:, :4], entry["width"]) if entry["flipped"] else boxes[:, :4].copy()
    if dropped:
        logger.warning("proposal file %s: dropped %d proposals (%s) in %d images (e.g. %s)", path,
                       sum(dropped.values()), ", ".join(f"{n} {name}" for name, n in reasons.items() if n),
                       len(dropped), ", ".join(f"image id {i}: {n}" for i, n in list(dropped.items())[:MAX_LISTED]))
    if missing:
        logger.warning("proposal file %s has no proposals for %d of %d images (e.g. image ids %s); they get none",
                       path, len(missing), sum(not e["flipped"] for e in roidb),
                       ", ".join(str(i) for i in missing[:MAX_LISTED]))


# why a proposal cannot seed a chip, in the order checked (code = position + 1; 0: kept)
PROPOSAL_DROP_REASONS = ("not finite", "inverted or empty", "outside their image")


def proposal_drop_reasons(boxes, width, height):
    """Per box, 0 when it is usable (finite, x2 >= x1 and y2 >= y1, sharing at least one pixel with a
    ``width`` x ``height`` image, inclusive boxes), else the code of the first reason it is not."""
    coords = boxes[:, :4]
    finite = np.isfinite(coords).all(axis=1)
    with np.errstate(invalid="ignore"):
        x1, y1, x2, y2 = coords.T
        upright = (x2 >= x1) & (y2 >= y1)
        inside = (x1 <= width - 1) & (y1 <= height - 1) & (x2 >= 0) & (y2 >= 0)
    return np.select([~finite, ~upright, ~inside], [1, 2, 3], 0)
