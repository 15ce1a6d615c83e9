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
    vector[int64_t] window_offsets(int64_t extent, int64_t chip, int64_t stride) nogil
    vector[int64_t] greedy_cover(const float* boxes, int64_t num_boxes, const int64_t* xs, int64_t nx,
                                 const int64_t* ys, int64_t ny, int64_t win_w, int64_t win_h,
                                 const int64_t* order) nogil


def candidate_offsets(int64_t extent, int64_t chip, int64_t stride):
    """Offsets (int64) of the candidate windows along one axis: stride grid plus the flush window."""
    return np.asarray(window_offsets(extent, chip, stride), dtype=np.int64)


def cover(const float[:, ::1] boxes, const int64_t[::1] xs, const int64_t[::1] ys, int64_t win_w,
          int64_t win_h, const int64_t[::1] order):
    """Picked candidate indices (int64, pick order) of the greedy cover; candidate = i * len(ys) + j."""
    cdef vector[int64_t] picked
    cdef const float* box_ptr = &boxes[0, 0] if boxes.shape[0] > 0 else NULL
    with nogil:
        picked = greedy_cover(box_ptr, boxes.shape[0], &xs[0], xs.shape[0], &ys[0], ys.shape[0], win_w, win_h,
                              &order[0])
    return np.asarray(picked, dtype=np.int64)
