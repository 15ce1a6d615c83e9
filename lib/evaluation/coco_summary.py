"""COCO metrics for dense scenes and chosen object sizes: maxDets and size bands set on COCOeval, the
summary computed from its accumulated arrays, and a per-class x per-size AP table.

pycocotools scores at most 100 detections per image and summarises three fixed bands (small < 32 px,
medium < 96 px, large, in sqrt(area)); its ``summarize()`` looks the 100 up by value (AP with maxDets
other than 100 prints -1) and the bands by name. Here ``maxDets`` becomes ``[1, 10, max(100,
TEST.MAX_PER_IMAGE)]``, so a scene with more objects than 100 is scored with every detection the test
keeps, and the bands come from ``TEST.SIZE_BANDS`` (``[name, lo, hi]`` in sqrt(area) pixels of the
annotation's ``area``, -1 open). The stats are computed as ``summarize()`` computes them (mean of the
entries > -1, -1 when none), at the last maxDets, so the default setting reproduces pycocotools exactly.

pycocotools caps the detections per image *and category*. The default ``TEST.EVAL_MAX_DETS`` 100 reproduces
the published numbers, but it cuts dense scenes: ``dense_scene_warning`` says so once per evaluation, with the
count, when a scored image has more objects of one category than that, or keeps more detections than that
for a category with at least half as many objects (``DENSE_SHARE``), and what to set.

Stat names: AP, AP50, AP75, then per band ``APs``/``APm``/``APl`` for the bands named small, medium,
large (COCO's names) and ``AP_{name}`` for any other; AR1, AR10, ``AR{maxDets}`` (AR100 by default),
then ``ARs``/``ARm``/``ARl`` or ``AR_{name}``.
"""
import math
from collections import Counter

import numpy as np

COCO_BANDS = (("small", 0, 32), ("medium", 32, 96), ("large", 96, -1))
_SHORT = {"small": "s", "medium": "m", "large": "l"}
_OPEN_AREA = 1e5 ** 2  # pycocotools' "no upper bound"
DENSE_SHARE = 0.5  # a category with this share of maxDets objects in an image is dense (dense_scene_warning)
SEGM_PREFIX = "segm_"  # the segm stats' names beside the bbox ones where both are listed (segm_AP, ...)


def parse_bands(spec, key="TEST.SIZE_BANDS"):
    """``[[name, lo, hi], ...]`` (sqrt(area) px, -1 open) -> tuple of (name, lo, hi); named errors."""
    bands = []
    for entry in spec:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and isinstance(entry[0], str) and entry[0]):
            raise ValueError(f"config key {key}: a band is [name, lo, hi], got {entry!r}")
        name, lo, hi = entry[0], float(entry[1]), float(entry[2])
        if name == "all" or lo < 0 or (hi != -1 and hi <= lo):
            raise ValueError(f"config key {key}: band {list(entry)!r} needs a name other than 'all' and "
                             f"0 <= lo < hi (hi -1: open)")
        bands.append((name, lo, hi))
    if len({b[0] for b in bands}) != len(bands):
        raise ValueError(f"config key {key}: band names repeat in {spec!r}")
    return tuple(bands)


def max_dets_for(max_per_image):
    """COCOeval's maxDets for a test keeping ``max_per_image`` detections (0 or less: no cap, 100 kept)."""
    return [1, 10, max(100, int(max_per_image))]


def scored_max_dets(test):
    """The detections per image and category COCO evaluation scores under a config's TEST section:
    TEST.EVAL_MAX_DETS, 0 following TEST.MAX_PER_IMAGE (at least 100 either way)."""
    return max_dets_for(test.EVAL_MAX_DETS or test.MAX_PER_IMAGE)[-1]


def band_stat(prefix, name):
    return f"{prefix}{_SHORT[name]}" if name in _SHORT else f"{prefix}_{name}"


def stat_names(bands=COCO_BANDS, max_dets=100):
    """The names of ``summary_stats``' entries, in order."""
    names = ["AP", "AP50", "AP75"] + [band_stat("AP", b[0]) for b in bands]
    names += ["AR1", "AR10", f"AR{max_dets}"] + [band_stat("AR", b[0]) for b in bands]
    return names


def configure(coco_eval, max_per_image=100, bands=COCO_BANDS):
    """Set ``coco_eval.params`` (before ``evaluate``): maxDets, and the area ranges 'all' + the bands."""
    params = coco_eval.params
    params.maxDets = max_dets_for(max_per_image)
    params.areaRng = [[0, _OPEN_AREA]] + [[lo ** 2, _OPEN_AREA if hi == -1 else hi ** 2] for _, lo, hi in bands]
    params.areaRngLbl = ["all"] + [name for name, _, _ in bands]


def defined(value):
    """Whether a metric value is a value: a number (not None, a bool or text read from a damaged record), finite
    and not COCO's -1 (no ground truth it scores)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return False
    return bool(math.isfinite(value) and value >= 0)


def _mean(values):
    values = values[values > -1]
    return float(np.mean(values)) if values.size else -1.0


def _summary_rows(coco_eval):
    """(name, is AP, IoU threshold or None, area label, maxDets, value) per stat, in stat_names' order."""
    params, precision, recall = coco_eval.params, coco_eval.eval["precision"], coco_eval.eval["recall"]
    labels, last = params.areaRngLbl, len(params.maxDets) - 1
    top = params.maxDets[last]

    def iou_index(threshold):
        return int(np.argmin(np.abs(params.iouThrs - threshold)))

    rows = [("AP", True, None, "all", top, _mean(precision[:, :, :, 0, last])),
            ("AP50", True, 0.5, "all", top, _mean(precision[iou_index(0.5), :, :, 0, last])),
            ("AP75", True, 0.75, "all", top, _mean(precision[iou_index(0.75), :, :, 0, last]))]
    rows += [(band_stat("AP", name), True, None, name, top, _mean(precision[:, :, :, a, last]))
             for a, name in enumerate(labels[1:], start=1)]
    rows += [(f"AR{max_dets}", False, None, "all", max_dets, _mean(recall[:, :, 0, m]))
             for m, max_dets in enumerate(params.maxDets)]
    rows += [(band_stat("AR", name), False, None, name, top, _mean(recall[:, :, a, last]))
             for a, name in enumerate(labels[1:], start=1)]
    return rows


def summary_stats(coco_eval):
    """``{name: value}`` (module docstring) of an accumulated COCOeval configured by ``configure``."""
    return {row[0]: row[-1] for row in _summary_rows(coco_eval)}


def summary_text(coco_eval):
    """The stats as pycocotools' ``summarize()`` prints them (the same 12 lines in the default setting)."""
    iou_range = f"{coco_eval.params.iouThrs[0]:0.2f}:{coco_eval.params.iouThrs[-1]:0.2f}"
    lines = []
    for _, is_ap, iou, area, max_dets, value in _summary_rows(coco_eval):
        title = "Average Precision  (AP)" if is_ap else "Average Recall     (AR)"
        iou_text = iou_range if iou is None else f"{iou:0.2f}"
        lines.append(f" {title} @[ IoU={iou_text:<9} | area={area:>6s} | maxDets={max_dets:>3d} ] = {value:0.3f}")
    return "\n".join(lines) + "\n"


def per_class_size_ap(coco_eval):
    """``{category name: {"AP": .., band AP names: ..}}`` (IoU 0.50:0.95, last maxDets); NaN where a
    category has no gt of that size in the scored images."""
    params, precision = coco_eval.params, coco_eval.eval["precision"]
    names = {c["id"]: c["name"] for c in coco_eval.cocoGt.loadCats(params.catIds)}
    table = {}
    for k, category in enumerate(params.catIds):
        row = {}
        for a, label in enumerate(params.areaRngLbl):
            curve = precision[:, :, k, a, -1]
            valid = curve[curve > -1]
            name = "AP" if label == "all" else band_stat("AP", label)
            row[name] = float(valid.mean()) if valid.size else float("nan")
        table[names[category]] = row
    return table


def capped_scenes(gt_counts, det_counts, max_dets):
    """What a cap of ``max_dets`` per image and category cuts, from ``{(image id, category id): count}`` of the
    non-crowd ground truth and of the detections: (images with more objects of a category than ``max_dets``,
    the other images keeping more detections than ``max_dets`` of a category with at least ``DENSE_SHARE *
    max_dets`` objects, the most objects of one category in an image)."""
    over = {image for (image, _), count in gt_counts.items() if count > max_dets}
    dense = {image for (image, category), count in det_counts.items() if count > max_dets
             and gt_counts.get((image, category), 0) >= DENSE_SHARE * max_dets} - over
    return over, dense, max(gt_counts.values(), default=0)


def dense_scene_warning(coco_gt, results, image_ids, test):
    """The one-line warning (or None) when COCO evaluation at the ``test`` section's TEST.EVAL_MAX_DETS
    cuts dense scenes of the scored ``image_ids`` (module docstring), naming the count and what to set."""
    max_dets = scored_max_dets(test)
    gts = Counter((a["image_id"], a["category_id"]) for i in image_ids for a in coco_gt.imgToAnns.get(int(i), ())
                  if not a.get("iscrowd"))
    over, dense, most = capped_scenes(gts, Counter((r["image_id"], r["category_id"]) for r in results), max_dets)
    keeps = max_dets_for(test.MAX_PER_IMAGE)[-1]  # what TEST.EVAL_MAX_DETS 0 scores
    steps = ["set TEST.EVAL_MAX_DETS 0 to score every detection the test keeps"] if test.EVAL_MAX_DETS else []
    if over and most > keeps:
        steps.append(f"raise TEST.MAX_PER_IMAGE ({test.MAX_PER_IMAGE}) above {most}")
    if not (over or dense) or not steps:
        return None
    found = [f"{len(over)} of {len(image_ids)} scored images have more objects of one category (up to {most})"] \
        if over else []
    if dense:
        found.append(f"{len(dense)} {'more' if over else f'of {len(image_ids)} scored images'} keep more detections "
                     f"for a category of at least {math.ceil(DENSE_SHARE * max_dets)} objects")
    return (f"COCO evaluation scores at most {max_dets} detections per image and category, so the AP and AR of "
            f"dense scenes are capped: {', '.join(found)}; {' and '.join(steps)}")
