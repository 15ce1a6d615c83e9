"""Detection metrics: COCO AP (boxes, and instance masks when the results carry them) through
pycocotools, and Pascal VOC AP.

Detections reach this module as one float32 array per image with rows
``[x1, y1, x2, y2, score, label]``: inclusive pixel boxes in original image coordinates and
contiguous labels (1..C-1), the tester's output format.
"""
import contextlib
import io
import json
import logging
import os
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from lib.atomic import write_json
from lib.boxes import bbox_overlaps
from lib.evaluation.coco_summary import COCO_BANDS, configure, per_class_size_ap, stat_names, summary_stats, \
    summary_text

logger = logging.getLogger(__name__)

COCO_STAT_NAMES = tuple(stat_names())  # the default setting's: AP, AP50, AP75, APs, APm, APl, AR1, ..., ARl


# Decimals of the results file, the reference's: scores with 8 (5 would tie many of the 1e-3 soft-NMS
# scores, and COCOeval's ranking of ties is not the detector's), boxes with 1.
SCORE_DECIMALS, BOX_DECIMALS = 8, 1


def reference_round(values, digits):
    """``values`` rounded to ``digits`` decimals as the reference's Python 2 ``round`` does: correctly
    rounded, exact ties away from zero (Python 3's ``round`` sends them to the even digit). A float64 is an
    exact tie exactly when it times 2^(digits + 1) is an odd integer, so only those take the Decimal path."""
    values = np.asarray(values, np.float64)
    doubled = values * 2.0 ** (digits + 1)  # exact: a power of two
    ties = (doubled == np.floor(doubled)) & (np.fmod(doubled, 2.0) != 0)
    quantum = Decimal(1).scaleb(-digits)
    return [float(Decimal(v).quantize(quantum, ROUND_HALF_UP)) if tie else round(v, digits)
            for v, tie in zip(values.tolist(), ties.tolist())]


def coco_results(detections, image_ids, category_ids, segmentations=None):
    """COCO results entries (test-dev format) for per-image detections.

    ``category_ids[label]`` is the original COCO category id of contiguous label ``label``
    (index 0, background, is unused). Inclusive boxes become ``[x, y, w, h]`` with w = x2 - x1 + 1.
    ``segmentations``: per image, one COCO RLE per detection row (lib.inference.masks.encode_pasted),
    written as each entry's ``segmentation``.
    """
    if len(detections) != len(image_ids):
        raise ValueError(f"{len(detections)} detection arrays for {len(image_ids)} image ids")
    results = []
    for index, (image_id, dets) in enumerate(zip(image_ids, detections)):
        dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
        labels = dets[:, 5].astype(np.int64)
        if len(labels) and (labels.min() < 1 or labels.max() >= len(category_ids)):
            raise ValueError(
                f"image {image_id}: label {labels.min() if labels.min() < 1 else labels.max()} "
                f"outside 1..{len(category_ids) - 1}"
            )
        xywh = np.stack([dets[:, 0], dets[:, 1], dets[:, 2] - dets[:, 0] + 1, dets[:, 3] - dets[:, 1] + 1], 1)
        boxes = np.reshape(reference_round(xywh.ravel(), BOX_DECIMALS), (-1, 4)).tolist()
        first = len(results)
        for box, score, label in zip(boxes, reference_round(dets[:, 4], SCORE_DECIMALS), labels):
            results.append({"image_id": int(image_id), "category_id": int(category_ids[label]), "bbox": box,
                            "score": score})
        if segmentations is not None:
            if len(segmentations[index]) != len(dets):
                raise ValueError(f"image {image_id}: {len(segmentations[index])} segmentations for {len(dets)} "
                                 f"detections")
            for entry, rle in zip(results[first:], segmentations[index]):
                entry["segmentation"] = rle
    return results


def per_category_ap(coco_eval):
    """``{category name: {"AP": .., "AP50": ..}}`` from an accumulated COCOeval: its precision array
    (IoU thresholds x recall points x categories x areas x max detections) averaged, as COCOeval's own
    summary does, over the recall points (and IoUs for AP) with valid entries, area "all", 100 detections.
    A category without gt boxes in the scored images is NaN."""
    precision = coco_eval.eval["precision"]
    names = {c["id"]: c["name"] for c in coco_eval.cocoGt.loadCats(coco_eval.params.catIds)}
    table = {}
    for k, category in enumerate(coco_eval.params.catIds):
        values = {}
        for key, curve in (("AP", precision[:, :, k, 0, -1]), ("AP50", precision[0, :, k, 0, -1])):
            valid = curve[curve > -1]
            values[key] = float(valid.mean()) if valid.size else float("nan")
        table[names[category]] = values
    return table


def log_per_class_table(table, output_dir, title, filename="per_class_ap.json"):
    """Log ``{name: {metric: value}}`` as a table and write it to ``filename``."""
    metrics = list(next(iter(table.values()))) if table else []
    width = max([len(name) for name in table] + [8])
    lines = [f"{'class':>{width}s}  " + "  ".join(f"{m:>6s}" for m in metrics)]
    lines += [f"{name:>{width}s}  " + "  ".join(f"{values[m]:6.3f}" for m in metrics) for name, values in table.items()]
    logger.info("%s\n%s", title, "\n".join(lines))
    write_json(table, os.path.join(output_dir, filename))


def _cocoeval(coco_gt, results, iou_type, image_ids, max_dets, bands):
    """(stats, summary text, per-category table, per-category x per-size table) of COCOeval ``iou_type``
    ("bbox" or "segm") on ``results``, at ``max_dets`` detections per image and the size ``bands``
    (lib/evaluation/coco_summary.py)."""
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(results) if results else _no_detections(coco_gt)
    coco_eval = COCOeval(coco_gt, coco_dt, iou_type)
    if image_ids is not None:
        coco_eval.params.imgIds = sorted(int(i) for i in image_ids)
    configure(coco_eval, max_dets, bands)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval.evaluate()
        coco_eval.accumulate()
    return summary_stats(coco_eval), summary_text(coco_eval), per_category_ap(coco_eval), per_class_size_ap(coco_eval)


def _no_detections(coco_gt):
    """An empty detection set for COCOeval (``loadRes`` refuses an empty list): scored like any other, so a
    metric is 0 where the scored images hold ground truth and COCO's undefined -1 where they hold none."""
    from pycocotools.coco import COCO

    coco_dt = COCO()
    coco_dt.dataset = {"images": list(coco_gt.dataset["images"]), "categories": list(coco_gt.dataset["categories"]),
                       "annotations": []}
    coco_dt.createIndex()
    return coco_dt


def _gt_has_masks(coco_gt, image_ids):
    """Whether every annotation of the scored images has a ``segmentation`` (polygons or RLE)."""
    annotations = coco_gt.loadAnns(coco_gt.getAnnIds(imgIds=sorted(int(i) for i in image_ids) if image_ids
                                                      is not None else []))
    return bool(annotations) and all(a.get("segmentation") for a in annotations)


def evaluate_coco(coco_gt, results_path, output_dir, image_ids=None, max_dets=100, bands=COCO_BANDS):
    """Run COCOeval on a results file: bbox, and segm too when its entries carry ``segmentation`` and the
    ground truth has masks; log each 12-line summary and per-category AP table and write them with the
    stats.

    Only ``image_ids`` are scored when given (a subset run must not count the rest as misses); up to
    ``max_dets`` detections per image, in the size ``bands`` (TEST.EVAL_MAX_DETS, TEST.SIZE_BANDS).
    Writes ``coco_summary.txt``, ``coco_stats.json``, ``per_class_ap.json`` and ``per_class_size_ap.json``
    (segm: ``per_class_segm_ap.json``, ``per_class_size_segm_ap.json``) to ``output_dir``; returns the bbox
    stats dict, with the segm stats under the key ``segm`` when evaluated (coco_stats.json holds the same).
    """
    with open(results_path) as f:
        results = json.load(f)
    if not results:
        logger.warning("%s holds no detections: every COCO metric is 0 where the scored images have ground "
                       "truth for it (-1, undefined, where they have none)", results_path)
    iou_types = ["bbox"]
    if results and all("segmentation" in r for r in results):
        if _gt_has_masks(coco_gt, image_ids):
            iou_types.append("segm")
        else:
            logger.warning("%s has masks but the ground truth of the scored images has annotations without "
                           "segmentation: masks not evaluated", results_path)
    os.makedirs(output_dir, exist_ok=True)
    summaries, all_stats = [], {}
    for iou_type in iou_types:
        stats, summary, per_class, per_size = _cocoeval(coco_gt, results, iou_type, image_ids, max_dets, bands)
        logger.info("COCO %s evaluation of %s\n%s", iou_type, results_path, summary.rstrip())
        suffix = "" if iou_type == "bbox" else f"_{iou_type}"
        log_per_class_table(per_class, output_dir,
                            f"COCO {iou_type} AP per category (IoU 0.50:0.95 and 0.50, all areas)",
                            f"per_class{suffix}_ap.json")
        log_per_class_table(per_size, output_dir, f"COCO {iou_type} AP per category and size (IoU 0.50:0.95)",
                            f"per_class_size{suffix}_ap.json")
        summaries.append(summary if iou_type == "bbox" else f"\n{iou_type}:\n{summary}")
        all_stats[iou_type] = stats
    with open(os.path.join(output_dir, "coco_summary.txt"), "w") as f:
        f.write("".join(summaries))
    stats = dict(all_stats["bbox"])
    if "segm" in all_stats:
        stats["segm"] = all_stats["segm"]
    write_json(stats, os.path.join(output_dir, "coco_stats.json"))
    return stats


def voc_ap(recall, precision, use_07_metric=False):
    """Average precision from a recall/precision curve.

    VOC2007's 11-point metric averages the best precision at recall >= 0, 0.1, ..., 1; the
    VOC2010+ metric integrates the monotone precision envelope over recall.
    """
    recall = np.asarray(recall, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    if use_07_metric:
        points = [precision[recall >= t].max() if np.any(recall >= t) else 0.0 for t in np.linspace(0, 1, 11)]
        return float(np.mean(points))
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def devkit_values(values, decimals):
    """``values`` as the reference's VOC evaluation reads them back from the devkit result files it writes
    with ``'{:.Nf}'`` (correctly rounded from the binary value), as float64."""
    values = np.asarray(values, np.float64)
    return np.array([float(f"{v:.{decimals}f}") for v in values.ravel().tolist()]).reshape(values.shape)


def voc_class_ap(det_images, det_scores, det_boxes, gt_boxes, gt_difficult, iou_thresh=0.5, use_07_metric=False,
                 reference_rules=False):
    """AP of one class, the VOC way.

    ``det_images`` (D,) indexes ``gt_boxes``/``gt_difficult`` (lists over images of (G,4) boxes and
    (G,) bools). A detection matching an unclaimed gt above ``iou_thresh`` is a true positive; one
    whose best match is a difficult gt counts neither way; duplicates are false positives.
    ``reference_rules`` (dataset.VOC_EVAL_RULES reference): scores rounded to 3 decimals and boxes (1-based)
    to 0.1 px as the reference's devkit files hold them, ranked by NumPy's default (not stable) argsort as
    its voc_eval ranks them; otherwise the detector's values in a stable order.
    Returns (recall, precision, ap); with no non-difficult gt the AP is NaN.
    """
    det_scores = np.asarray(det_scores, dtype=np.float64)
    det_boxes = np.asarray(det_boxes, dtype=np.float64).reshape(-1, 4)
    if reference_rules:
        det_scores, det_boxes = devkit_values(det_scores, 3), devkit_values(det_boxes + 1, 1) - 1
        order = np.argsort(-det_scores)
    else:
        order = np.argsort(-det_scores, kind="stable")
    det_images = np.asarray(det_images, dtype=np.int64)[order]
    det_boxes = det_boxes.astype(np.float32)[order]
    claimed = [np.zeros(len(b), dtype=bool) for b in gt_boxes]
    num_positives = sum(int(np.sum(~np.asarray(d, dtype=bool))) for d in gt_difficult)
    tp = np.zeros(len(order))
    fp = np.zeros(len(order))
    for d, (image, box) in enumerate(zip(det_images, det_boxes)):
        gts = np.asarray(gt_boxes[image], dtype=np.float32).reshape(-1, 4)
        if len(gts) == 0:
            fp[d] = 1
            continue
        overlaps = bbox_overlaps(box[None], gts)[0]
        best = int(np.argmax(overlaps))
        if overlaps[best] <= iou_thresh:
            fp[d] = 1
        elif gt_difficult[image][best]:
            continue
        elif claimed[image][best]:
            fp[d] = 1
        else:
            tp[d] = 1
            claimed[image][best] = True
    tp = np.cumsum(tp)
    fp = np.cumsum(fp)
    if num_positives == 0:
        return tp * 0, tp * 0, float("nan")
    recall = tp / num_positives
    precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return recall, precision, voc_ap(recall, precision, use_07_metric)


def evaluate_voc(detections, gt_boxes, gt_classes, gt_difficult, classes, output_dir, use_07_metric,
                 iou_thresh=0.5, extra_thresholds=(0.7,), reference_rules=False):
    """Per-class VOC AP and mAP for per-image detections at ``iou_thresh`` ("AP", "mAP") and at each of
    ``extra_thresholds`` ("AP@0.70", "mAP@0.70": the reference reports 0.5 and 0.7); logs the table and
    writes ``voc_ap.json``. ``reference_rules``: as for ``voc_class_ap``.

    ``gt_boxes``/``gt_classes``/``gt_difficult`` are per-image lists aligned with ``detections``;
    ``classes[label]`` names contiguous label ``label`` (0 is background).
    """
    detections = [np.asarray(d, dtype=np.float32).reshape(-1, 6) for d in detections]

    def class_aps(thresh):
        aps = {}
        for label in range(1, len(classes)):
            masks = [np.asarray(c) == label for c in gt_classes]
            kept = [dets[dets[:, 5] == label] for dets in detections]
            _, _, aps[classes[label]] = voc_class_ap(
                np.concatenate([np.full(len(d), image) for image, d in enumerate(kept)]),
                np.concatenate([d[:, 4] for d in kept]), np.concatenate([d[:, :4] for d in kept]),
                [np.asarray(b).reshape(-1, 4)[m] for b, m in zip(gt_boxes, masks)],
                [np.asarray(d, dtype=bool)[m] for d, m in zip(gt_difficult, masks)],
                thresh, use_07_metric, reference_rules,
            )
        scored = [ap for ap in aps.values() if not np.isnan(ap)]
        return aps, float(np.mean(scored)) if scored else float("nan")

    aps, mean = class_aps(iou_thresh)
    result = {"mAP": mean, "AP": aps, "metric": "VOC07 11-point" if use_07_metric else "VOC area",
              "rules": "reference" if reference_rules else "exact"}
    per_class = {name: {"AP": ap} for name, ap in aps.items()}
    title = f"Pascal VOC AP@{iou_thresh:.2f} per class ({result['metric']}), mAP {mean:.4f}"
    for thresh in extra_thresholds:
        extra, extra_mean = class_aps(thresh)
        result[f"AP@{thresh:.2f}"], result[f"mAP@{thresh:.2f}"] = extra, extra_mean
        for name, ap in extra.items():
            per_class[name][f"AP@{thresh:.2f}"] = ap
        title += f"; mAP@{thresh:.2f} {extra_mean:.4f}"
    os.makedirs(output_dir, exist_ok=True)
    log_per_class_table(per_class, output_dir, title)
    write_json(result, os.path.join(output_dir, "voc_ap.json"))
    return result


def proposal_recall(gt_boxes, proposals, size_ranges, thresholds=(0.5, 0.7)):
    """Recall of ground-truth boxes by proposals, to judge a proposal file before negative chips are mined
    from it: ``{range name: {"gts": count, threshold: fraction of those gts with a proposal of IoU >= it}}``.

    ``gt_boxes`` and ``proposals`` are per-image lists of inclusive boxes (proposals may carry a score
    column); ``size_ranges`` maps names to ``(lo, hi)`` bounds on a gt's ``sqrt(w h)`` (+1 sizes, original
    pixels; -1 leaves a side open), e.g. the COCO size classes and each training scale's valid range."""
    best, sizes = [], []
    for gts, props in zip(gt_boxes, proposals):
        gts = np.asarray(gts, np.float64).reshape(-1, 4)
        props = np.asarray(props, np.float64)
        props = props[:, :4] if props.ndim == 2 else props.reshape(-1, 4)
        if not len(gts):
            continue
        overlaps = bbox_overlaps(gts, props) if len(props) else np.zeros((len(gts), 0))
        best.append(overlaps.max(axis=1) if len(props) else np.zeros(len(gts)))
        sizes.append(np.sqrt((gts[:, 2] - gts[:, 0] + 1) * (gts[:, 3] - gts[:, 1] + 1)))
    best = np.concatenate(best) if best else np.zeros(0)
    sizes = np.concatenate(sizes) if sizes else np.zeros(0)
    table = {}
    for name, (lo, hi) in size_ranges.items():
        inside = ((sizes >= lo) | (lo < 0)) & ((sizes < hi) | (hi < 0))
        count = int(inside.sum())
        table[name] = {"gts": count, **{thresh: float((best[inside] >= thresh).mean()) if count else float("nan")
                                        for thresh in thresholds}}
    return table
