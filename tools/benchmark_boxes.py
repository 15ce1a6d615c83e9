"""Times the compiled box kernels (lib/boxes) against vectorised NumPy, stock MXNet and GluonCV.

Decides whether the Cython kernels earn their place. Every candidate is timed from NumPy input to
NumPy output, because that is how the data loader and the tester call them. MXNet's ``box_iou`` /
``box_nms`` and GluonCV's ``bbox_iou`` use exclusive widths, so they get boxes with ``x2 + 1, y2 + 1``
(which makes their IoU equal to the inclusive one); the "max |diff|" column checks that.

    python tools/benchmark_boxes.py [--repeat 5]
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import mxnet as mx
import numpy as np
from gluoncv.utils import bbox_iou as gluoncv_bbox_iou

from lib.benchmarking import markdown_table, measure
from lib.boxes import base_anchors, bbox_overlaps, decode, grid_anchors, nms, soft_nms


def numpy_overlaps(boxes, query):
    """Vectorised inclusive IoU with broadcasting."""
    iw = np.minimum(boxes[:, None, 2], query[None, :, 2]) - np.maximum(boxes[:, None, 0], query[None, :, 0]) + 1
    ih = np.minimum(boxes[:, None, 3], query[None, :, 3]) - np.maximum(boxes[:, None, 1], query[None, :, 1]) + 1
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)
    box_area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    query_area = (query[:, 2] - query[:, 0] + 1) * (query[:, 3] - query[:, 1] + 1)
    return inter / (box_area[:, None] + query_area[None, :] - inter)


def numpy_nms(dets, thresh):
    """Greedy NMS, one vectorised IoU row per kept box."""
    x1, y1, x2, y2, scores = dets.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1, 0)
        ih = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1, 0)
        inter = iw * ih
        order = rest[inter / (areas[i] + areas[rest] - inter) <= thresh]
    return np.array(keep, np.int64)


def exclusive(boxes):
    shifted = np.array(boxes, dtype=np.float32, copy=True)
    shifted[:, 2:4] += 1
    return shifted


def mxnet_overlaps(boxes, query):
    return mx.nd.contrib.box_iou(mx.nd.array(exclusive(boxes)), mx.nd.array(exclusive(query)), format="corner").asnumpy()


def mxnet_nms(dets, thresh):
    """box_nms returns the sorted, suppressed rows; an index column recovers the kept indices."""
    data = np.hstack([exclusive(dets), np.arange(len(dets), dtype=np.float32)[:, None]])
    out = mx.nd.contrib.box_nms(mx.nd.array(data), overlap_thresh=thresh, coord_start=0, score_index=4, id_index=-1,
                                valid_thresh=-1.0, topk=-1).asnumpy()
    return out[out[:, 5] >= 0, 5].astype(np.int64)


def chip_boxes(rng, num, spread):
    """RPN-like boxes on a 512 x 512 chip: real anchors jittered, with random scores."""
    anchors = grid_anchors(base_anchors(16, (0.5, 1, 2), (2, 4, 7, 10, 13, 16, 24)), 32, 32, 16)
    picked = anchors[rng.integers(0, len(anchors), num)]
    boxes = decode(picked, rng.normal(0, spread, (num, 4)).astype(np.float32))
    return np.clip(boxes, 0, 511).astype(np.float32)


def best_ms(function, repeat):
    """Best of ``repeat`` rounds of at least 0.2 s; the first of two warm-up calls initialises MXNet's engine, the
    second sizes the rounds."""
    return measure(function, repeat=repeat, warmup=2, min_seconds=0.2).best * 1e3


def overlap_rows(rng, repeat):
    rows = []
    for num_boxes, num_query, what in [(2000, 20, "rois x gts"), (21504, 20, "anchors x gts, 512 chip"),
                                       (300, 100, "proposals x padded gts")]:
        boxes, query = chip_boxes(rng, num_boxes, 0.3), chip_boxes(rng, num_query, 0.3)
        ours = bbox_overlaps(boxes, query)
        for name, function in [
            ("cython bbox_overlaps", bbox_overlaps),
            ("numpy broadcast", numpy_overlaps),
            ("mx.nd.contrib.box_iou", mxnet_overlaps),
            ("gluoncv bbox_iou", lambda a, b: gluoncv_bbox_iou(exclusive(a), exclusive(b))),
        ]:
            diff = np.abs(function(boxes, query) - ours).max()
            ms = best_ms(lambda: function(boxes, query), repeat)
            rows.append((f"IoU {num_boxes}x{num_query} ({what})", name, ms, f"{diff:.1e}"))
    return rows


def nms_rows(rng, repeat):
    rows = []
    for num, thresh, what in [(6000, 0.7, "RPN pre-NMS top-N"), (2000, 0.5, "detections")]:
        dets = np.hstack([chip_boxes(rng, num, 0.2), rng.random((num, 1), dtype=np.float32)])
        ours = nms(dets, thresh)
        for name, function in [("cython nms", nms), ("numpy nms", numpy_nms), ("mx.nd.contrib.box_nms", mxnet_nms)]:
            same = np.array_equal(function(dets, thresh), ours)
            ms = best_ms(lambda: function(dets, thresh), repeat)
            rows.append((f"NMS {num} @ {thresh} ({what}, keeps {len(ours)})", name, ms, "same" if same else "DIFFERS"))
        ms = best_ms(lambda: soft_nms(dets, sigma=0.55, method="gaussian"), repeat)
        rows.append((f"NMS {num} @ {thresh} ({what}, keeps {len(ours)})", "cython soft_nms gaussian", ms, "-"))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats; the best is reported")
    args = parser.parse_args()
    mx.random.seed(0)
    rng = np.random.default_rng(0)
    rows = overlap_rows(rng, args.repeat) + nms_rows(rng, args.repeat)
    print(markdown_table(["case", "implementation", "ms", "vs cython"], rows, [None, None, ".3f", None]))


if __name__ == "__main__":
    main()
