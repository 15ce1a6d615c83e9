// Greedy chip cover of SNIPER (spec section 2). See chips.h for the contract.
#include "chips.h"

#include <algorithm>

namespace sniper_chips {

namespace {

// The cells containing one box: index rectangle [i0, i1] x [j0, j1] of the interval grid.
struct CandidateRect {
    int64_t i0, i1, j0, j1;
};

// Indices of the intervals [lo[i], hi[i]] (both ends sorted) containing [box_lo, box_hi]:
// lo[i] <= box_lo (a prefix) and hi[i] >= box_hi (a suffix). Empty (first > last) when none.
void containing_range(const int64_t* lo, const int64_t* hi, int64_t count, double box_lo, double box_hi,
                      int64_t* first, int64_t* last) {
    const int64_t* begin = std::lower_bound(hi, hi + count, box_hi, [](int64_t end, double v) {
        return static_cast<double>(end) < v;
    });
    const int64_t* end = std::upper_bound(lo, lo + count, box_lo, [](double v, int64_t start) {
        return v < static_cast<double>(start);
    });
    *first = begin - hi;
    *last = (end - lo) - 1;
}

// 2-D difference array over an nx x ny grid: add rectangles in O(1), then read all cells in O(nx * ny).
class RectAccumulator {
  public:
    RectAccumulator(int64_t nx, int64_t ny) : nx_(nx), ny_(ny), diff_((nx + 1) * (ny + 1), 0) {}

    void add(const CandidateRect& r, int32_t value) {
        const int64_t stride = ny_ + 1;
        diff_[r.i0 * stride + r.j0] += value;
        diff_[r.i0 * stride + r.j1 + 1] -= value;
        diff_[(r.i1 + 1) * stride + r.j0] -= value;
        diff_[(r.i1 + 1) * stride + r.j1 + 1] += value;
    }

    // Adds the accumulated rectangles to `cells` (row-major nx x ny) and clears the accumulator.
    void flush_into(std::vector<int32_t>* cells) {
        const int64_t stride = ny_ + 1;
        for (int64_t i = 0; i < nx_; ++i) {
            int32_t* row = &diff_[i * stride];
            if (i > 0) {
                const int32_t* prev = &diff_[(i - 1) * stride];
                for (int64_t j = 0; j <= ny_; ++j) row[j] += prev[j];
            }
        }
        for (int64_t i = 0; i < nx_; ++i) {
            int32_t running = 0;
            const int32_t* row = &diff_[i * stride];
            int32_t* out = &(*cells)[i * ny_];
            for (int64_t j = 0; j < ny_; ++j) {
                running += row[j];
                out[j] += running;
            }
        }
        std::fill(diff_.begin(), diff_.end(), 0);
    }

  private:
    int64_t nx_, ny_;
    std::vector<int32_t> diff_;
};

}  // namespace

std::vector<int64_t> greedy_cover(const float* boxes, int64_t num_boxes, const int64_t* x_lo, const int64_t* x_hi,
                                  int64_t nx, const int64_t* y_lo, const int64_t* y_hi, int64_t ny,
                                  const int64_t* cells, int64_t num_candidates) {

    // Boxes that fit in at least one candidate, with the rectangle of candidates containing them.
    std::vector<CandidateRect> live;
    live.reserve(num_boxes);
    RectAccumulator accumulator(nx, ny);
    for (int64_t b = 0; b < num_boxes; ++b) {
        const float* box = boxes + 4 * b;
        CandidateRect r{0, 0, 0, 0};
        containing_range(x_lo, x_hi, nx, box[0], box[2], &r.i0, &r.i1);
        containing_range(y_lo, y_hi, ny, box[1], box[3], &r.j0, &r.j1);
        if (r.i0 > r.i1 || r.j0 > r.j1) continue;
        live.push_back(r);
        accumulator.add(r, 1);
    }
    std::vector<int32_t> counts(nx * ny, 0);
    accumulator.flush_into(&counts);

    std::vector<int64_t> picked;
    while (!live.empty()) {
        int64_t best = -1;
        int32_t best_count = 0;
        for (int64_t t = 0; t < num_candidates; ++t) {
            const int32_t count = counts[cells[t]];
            if (count > best_count) {
                best_count = count;
                best = t;
            }
        }
        if (best < 0) break;
        picked.push_back(best);
        const int64_t bi = cells[best] / ny, bj = cells[best] % ny;
        // Boxes contained in the pick are covered: drop them and their rectangles from the counts.
        auto still_live = std::partition(live.begin(), live.end(), [bi, bj](const CandidateRect& r) {
            return !(r.i0 <= bi && bi <= r.i1 && r.j0 <= bj && bj <= r.j1);
        });
        for (auto it = still_live; it != live.end(); ++it) accumulator.add(*it, -1);
        live.erase(still_live, live.end());
        accumulator.flush_into(&counts);
    }
    return picked;
}

}  // namespace sniper_chips
