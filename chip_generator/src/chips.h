// Greedy chip cover of SNIPER (spec section 2): the C++ core behind chip_generator/_chips.pyx.
#pragma once

#include <cstdint>
#include <vector>

namespace sniper_chips {

// Candidate windows are cells of a grid of x intervals by y intervals (inclusive pixels). Along each
// axis the intervals are sorted with both ends non-decreasing: lo[0] <= lo[1] <= ... and hi[0] <=
// hi[1] <= ..., so the intervals containing a box side form one contiguous run (a rectangle of cells
// for a box). The candidates are a subset of the cells, `cells[t] = ix * ny + iy`, listed in the order
// in which ties are broken.
//
// Greedy set cover of `num_boxes` inclusive boxes (x1, y1, x2, y2 rows of `boxes`): each step picks
// the candidate fully containing the most not-yet-covered boxes, the first one in `cells` order among
// equals. Returns the positions t of the picked candidates in pick order; stops when no candidate
// contains an uncovered box.
//
// Cost: O(N log K) set-up, then O(cells + live boxes) per pick: the counts of all cells are kept with
// 2-D difference arrays over the interval grid.
std::vector<int64_t> greedy_cover(const float* boxes, int64_t num_boxes, const int64_t* x_lo, const int64_t* x_hi,
                                  int64_t nx, const int64_t* y_lo, const int64_t* y_hi, int64_t ny,
                                  const int64_t* cells, int64_t num_candidates);

}  // namespace sniper_chips
