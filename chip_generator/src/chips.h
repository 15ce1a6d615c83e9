// Greedy chip cover of SNIPER (spec section 2): the C++ core behind chip_generator/_chips.pyx.
#pragma once

#include <cstdint>
#include <vector>

namespace sniper_chips {

// Left (or top) offsets of the candidate windows along one image axis of `extent` pixels: a grid
// with step `stride`, plus the window flush with the far edge so every pixel is reachable. A single
// offset 0 when the image is not larger than a chip.
std::vector<int64_t> window_offsets(int64_t extent, int64_t chip, int64_t stride);

// Greedy set cover of `num_boxes` inclusive boxes (x1, y1, x2, y2 rows of `boxes`) by the candidate
// windows at offsets xs[i] x ys[j] (both sorted) of size win_w x win_h, candidate index i * ny + j. Each step picks the
// candidate fully containing the most not-yet-covered boxes; ties go to the candidate that comes
// first in `order` (a permutation of the candidate indices). Returns the picked candidate indices in
// pick order; stops when no candidate contains an uncovered box.
//
// Cost: O(N log K) set-up, then O(K + live boxes) per pick, since the candidates containing a box
// form a rectangle of the candidate grid and the counts are updated with 2-D difference arrays.
std::vector<int64_t> greedy_cover(const float* boxes, int64_t num_boxes, const int64_t* xs, int64_t nx,
                                  const int64_t* ys, int64_t ny, int64_t win_w, int64_t win_h,
                                  const int64_t* order);

}  // namespace sniper_chips
