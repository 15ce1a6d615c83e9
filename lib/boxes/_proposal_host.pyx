# distutils: language = c++
# distutils: include_dirs = lib/boxes/src
# cython: language_level=3, boundscheck=False, wraparound=False
"""The test proposal layer's host arithmetic as the reference's operator computed it
(lib/boxes/src/proposal_host.h): ranking in std::sort's order, the C library's expf, float32 greedy NMS."""
import numpy as np

from libc.stdint cimport int64_t


cdef extern from "proposal_host.h" namespace "sniper" nogil:
    void descending_order(const float* scores, int64_t count, int64_t* order)
    void expf_array(const float* values, int64_t count, float* out)
    int64_t nms_float32 "sniper::greedy_nms_float32"(const float* boxes, int64_t count, double threshold, int64_t max_kept,
                               int64_t* kept)


def std_sort_descending(scores):
    """Indices of float32 ``scores`` (1-D) by descending score, equal scores in the order std::sort
    leaves them (which depends on the whole array, not on the indices alone)."""
    cdef const float[::1] values = np.ascontiguousarray(scores, dtype=np.float32)
    order_array = np.empty(values.shape[0], np.int64)
    cdef int64_t[::1] order = order_array
    if values.shape[0]:
        with nogil:
            descending_order(&values[0], values.shape[0], &order[0])
    return order_array


def c_expf(values):
    """The C library's float32 exp of every element of ``values`` (float32, same shape)."""
    array = np.ascontiguousarray(values, dtype=np.float32)
    out_array = np.empty_like(array)
    cdef const float[::1] flat = array.reshape(-1)
    cdef float[::1] out = out_array.reshape(-1)
    if flat.shape[0]:
        with nogil:
            expf_array(&flat[0], flat.shape[0], &out[0])
    return out_array


def greedy_nms_float32(boxes, double threshold, int64_t max_kept):
    """Positions of the boxes (float32 (N, 4), in rank order) that greedy NMS keeps, at most ``max_kept``:
    a kept box suppresses every later one whose overlap with it (+1 sizes, float32) is > ``threshold``."""
    cdef const float[:, ::1] rows = np.ascontiguousarray(boxes, dtype=np.float32).reshape(-1, 4)
    kept_array = np.empty(rows.shape[0], np.int64)
    cdef int64_t[::1] kept = kept_array
    cdef int64_t count = 0
    if rows.shape[0]:
        with nogil:
            count = nms_float32(&rows[0, 0], rows.shape[0], threshold, max_kept, &kept[0])
    return kept_array[:count]
