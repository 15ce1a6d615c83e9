# distutils: language = c++
# distutils: include_dirs = lib/ops/src
# cython: language_level=3, boundscheck=False, wraparound=False
"""Anchor ranking in std::sort's order (lib/ops/src/score_order.h): the test proposal layer's."""
import numpy as np

from libc.stdint cimport int64_t


cdef extern from "score_order.h" namespace "sniper" nogil:
    void descending_order(const float* scores, int64_t count, int64_t* order)


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
