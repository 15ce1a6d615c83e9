# distutils: language = c++
# distutils: sources = chip_generator/src/chips.cpp
# distutils: include_dirs = chip_generator/src
# distutils: extra_compile_args = -O3 -std=c++17
"""Thin Cython bindings of the C++ greedy cover (chip_generator/src/chips.cpp).

Inputs are validated by chip_generator.cover, which is the public entry point.
"""
from libc.stdint cimport int64_t
from libcpp.vector cimport vector

import numpy as np


cdef extern from "chips.h" namespace "sniper_chips":
    vector[int64_t] greedy_cover(const float* boxes, int64_t num_boxes, const int64_t* x_lo, const int64_t* x_hi,
                                 int64_t nx, const int64_t* y_lo, const int64_t* y_hi, int64_t ny,
                                 const int64_t* cells, int64_t num_candidates) nogil


def cover(const float[:, ::1] boxes, const int64_t[::1] x_lo, const int64_t[::1] x_hi, const int64_t[::1] y_lo,
          const int64_t[::1] y_hi, const int64_t[::1] cells):
    """Positions in ``cells`` (int64, pick order) of the candidates the greedy cover picks; candidate t is
    the window x interval ``cells[t] // len(y_lo)`` by y interval ``cells[t] % len(y_lo)``."""
    cdef vector[int64_t] picked
    cdef const float* box_ptr = &boxes[0, 0] if boxes.shape[0] > 0 else NULL
    with nogil:
        picked = greedy_cover(box_ptr, boxes.shape[0], &x_lo[0], &x_hi[0], x_lo.shape[0], &y_lo[0], &y_hi[0],
                              y_lo.shape[0], &cells[0], cells.shape[0])
    return np.asarray(picked, dtype=np.int64)
