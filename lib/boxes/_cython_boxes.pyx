# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled IoU, containment and (soft-)NMS kernels for inclusive-pixel boxes.

Boxes are ``(x1, y1, x2, y2)`` with width ``x2 - x1 + 1`` (ARCHITECTURE.md). Inputs of any real dtype
are rounded to float32 (so results do not depend on the caller's dtype); the arithmetic runs in
double. They run per chip in the data loader and per image in the tester; tools/benchmark_boxes.py
compares them with NumPy, MXNet and GluonCV.
"""
import numpy as np

from libc.math cimport exp


cdef inline double _intersection(double ax1, double ay1, double ax2, double ay2,
                                 double bx1, double by1, double bx2, double by2) noexcept nogil:
    """Inclusive intersection area of two boxes (0 when they do not overlap)."""
    cdef double iw = min(ax2, bx2) - max(ax1, bx1) + 1.0
    if iw <= 0:
        return 0.0
    cdef double ih = min(ay2, by2) - max(ay1, by1) + 1.0
    if ih <= 0:
        return 0.0
    return iw * ih


cdef inline double _iou(const double[:, ::1] c, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    """IoU of boxes i and j of a column table (see ``_columns``)."""
    cdef double inter = _intersection(c[0, i], c[1, i], c[2, i], c[3, i], c[0, j], c[1, j], c[2, j], c[3, j])
    if inter <= 0:
        return 0.0
    cdef double union = c[4, i] + c[4, j] - inter
    return inter / union if union > 0 else 0.0


def _as_rows(caller, name, array, int columns):
    """``array`` as a float32 (N, columns) array; any empty input becomes (0, columns)."""
    rows = np.asarray(array)
    if rows.dtype.kind not in "fiu":
        raise TypeError(f"{caller}: {name} must hold real numbers, got dtype {rows.dtype}")
    if rows.size == 0:
        return np.zeros((0, columns), np.float32)
    if rows.ndim != 2 or rows.shape[1] != columns:
        raise ValueError(f"{caller}: {name} must have shape (N, {columns}), got {rows.shape}")
    return rows.astype(np.float32, copy=False)


def _columns(rows):
    """(5, N) float64 table x1, y1, x2, y2, area of float32 boxes: the kernels read it sequentially."""
    table = np.empty((5, rows.shape[0]), np.float64)
    table[:4] = rows[:, :4].T
    table[4] = (table[2] - table[0] + 1.0) * (table[3] - table[1] + 1.0)
    return table


def bbox_overlaps(boxes, query):
    """IoU of every box with every query box: (N, 4), (K, 4) -> float32 (N, K)."""
    cdef const double[:, ::1] b = _columns(_as_rows("bbox_overlaps", "boxes", boxes, 4))
    cdef const double[:, ::1] q = _columns(_as_rows("bbox_overlaps", "query", query, 4))
    cdef Py_ssize_t n, k, N = b.shape[1], K = q.shape[1]
    cdef double x1, y1, x2, y2, area, inter, union
    out = np.zeros((N, K), np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        for n in range(N):
            x1, y1, x2, y2, area = b[0, n], b[1, n], b[2, n], b[3, n], b[4, n]
            for k in range(K):
                inter = _intersection(x1, y1, x2, y2, q[0, k], q[1, k], q[2, k], q[3, k])
                if inter > 0:
                    union = area + q[4, k] - inter
                    if union > 0:
                        o[n, k] = <float>(inter / union)
    return out


def ignore_overlaps(boxes, query):
    """Fraction of each box inside each query box, intersection / area(boxes[n]): float32 (N, K).

    1.0 means box n lies entirely inside query k (the chip-containment test of the greedy cover).
    """
    cdef const double[:, ::1] b = _columns(_as_rows("ignore_overlaps", "boxes", boxes, 4))
    cdef const double[:, ::1] q = _columns(_as_rows("ignore_overlaps", "query", query, 4))
    cdef Py_ssize_t n, k, N = b.shape[1], K = q.shape[1]
    cdef double x1, y1, x2, y2, area
    out = np.zeros((N, K), np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        for n in range(N):
            x1, y1, x2, y2, area = b[0, n], b[1, n], b[2, n], b[3, n], b[4, n]
            if area <= 0:
                continue
            for k in range(K):
                o[n, k] = <float>(_intersection(x1, y1, x2, y2, q[0, k], q[1, k], q[2, k], q[3, k]) / area)
    return out


def nms(dets, double thresh, Py_ssize_t max_kept=-1):
    """Greedy NMS on (N, 5) ``[x1, y1, x2, y2, score]``: indices of kept rows, highest score first.

    A box is suppressed when its IoU with an already kept box is above ``thresh``; equal scores keep
    the lower row index first. With ``max_kept`` >= 0 the scan stops after that many kept boxes (the
    test proposal layer keeps 300 of 12000).

    Each box, in score order, is compared with the boxes kept so far (stopping at the first that
    suppresses it), which keeps exactly the boxes the classic loop keeps (each kept box suppressing every
    later one) but stops early when only a few are wanted.
    """
    rows = _as_rows("nms", "dets", dets, 5)
    order = np.argsort(-rows[:, 4], kind="stable")
    cdef const double[:, ::1] c = _columns(rows[order])  # in score order, so the scan is sequential
    cdef Py_ssize_t N = c.shape[1], a, k, num_kept = 0
    cdef bint suppressed
    kept_positions = np.empty(N, np.intp)
    cdef Py_ssize_t[::1] kept = kept_positions
    with nogil:
        for a in range(N):
            if num_kept == max_kept:
                break
            suppressed = False
            for k in range(num_kept):
                if _iou(c, kept[k], a) > thresh:
                    suppressed = True
                    break
            if not suppressed:
                kept[num_kept] = a
                num_kept += 1
    return order[kept_positions[:num_kept]].astype(np.int64)


_SOFT_NMS_METHODS = {"linear": 1, "gaussian": 2, "hard": 0}


def soft_nms(dets, double sigma=0.5, double score_thresh=0.001, method="gaussian", double iou_thresh=0.3):
    """Soft-NMS (Bodla et al. 2017) on (N, 5) dets: kept float32 (M, 5) rows with decayed scores.

    Repeatedly keeps the highest-scoring remaining box (lower index on ties) and multiplies the
    others' scores by a weight of their IoU ``o`` with it: ``exp(-o**2 / sigma)`` (gaussian),
    ``1 - o`` if ``o > iou_thresh`` (linear) or ``0`` if ``o > iou_thresh`` (hard, i.e. plain NMS).
    Boxes whose score falls below ``score_thresh`` are dropped. Rows come out in selection order,
    which is descending score.
    """
    if method not in _SOFT_NMS_METHODS:
        raise ValueError(f"soft_nms: method must be one of {sorted(_SOFT_NMS_METHODS)}, got {method!r}")
    if method == "gaussian" and not sigma > 0:
        raise ValueError(f"soft_nms: sigma must be > 0 for the gaussian method, got {sigma}")
    if not 0 <= iou_thresh <= 1:
        raise ValueError(f"soft_nms: iou_thresh must be in [0, 1], got {iou_thresh}")
    cdef int kind = _SOFT_NMS_METHODS[method]
    rows = _as_rows("soft_nms", "dets", dets, 5)
    cdef const double[:, ::1] c = _columns(rows)
    cdef Py_ssize_t N = c.shape[1]
    score_array = rows[:, 4].astype(np.float64)
    cdef double[::1] score = score_array
    # The first `remaining` entries of `alive` are the boxes still in play, in ascending index
    # order, so that equal scores select the lower index.
    cdef Py_ssize_t[::1] alive = np.empty(N, np.intp)
    selected = np.empty(N, np.intp)
    cdef Py_ssize_t[::1] picked = selected
    cdef Py_ssize_t remaining = 0, num_picked = 0, a, best_pos, i, j, write
    cdef double overlap
    with nogil:
        for a in range(N):
            if score[a] >= score_thresh:
                alive[remaining] = a
                remaining += 1
        while remaining > 0:
            best_pos = 0
            for a in range(1, remaining):
                if score[alive[a]] > score[alive[best_pos]]:
                    best_pos = a
            i = alive[best_pos]
            picked[num_picked] = i
            num_picked += 1
            write = 0
            for a in range(remaining):
                j = alive[a]
                if a == best_pos:
                    continue
                overlap = _iou(c, i, j)
                if overlap > 0:  # otherwise the weight is 1 for every method (iou_thresh >= 0)
                    if kind == 2:
                        score[j] *= exp(-overlap * overlap / sigma)
                    elif overlap > iou_thresh:
                        score[j] *= (1.0 - overlap) if kind == 1 else 0.0
                if score[j] >= score_thresh:
                    alive[write] = j
                    write += 1
            remaining = write
    order = selected[:num_picked]
    out = rows[order].copy()
    out[:, 4] = score_array[order]
    return out
