#include "deformable_im2col.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace sniper {
namespace {

// Per sampling point (image, group, tap, output position) three precomputed records, each shared by the
// point's channels_per_group channels: the forward's four cells and weights; the data gradient's cells
// and weights (the reference's col2im rules, which round differently at the borders); and the offset
// gradient's four cells and fractional parts. index[0] < 0 marks a point outside the map.
struct SampleTap {
  int32_t index[4];  // (h_low, w_low), (h_low, w_high), (h_high, w_low), (h_high, w_high)
  float weight[4];
};

struct OffsetTap {
  int32_t index[4];  // as SampleTap
  float low_w, high_w, low_h, high_h;  // 1 - frac and frac of each coordinate
};

// Where tap k of output position (y, x) reads, before clamping: the input row and column.
struct SamplePoint {
  float h, w;
};

SamplePoint PointOf(const Im2ColGeometry& g, const float* group_offset, int k, int y, int x) {
  const int i = k / g.kernel_w, j = k % g.kernel_w;
  const int64_t plane = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t at = static_cast<int64_t>(y) * g.out_width + x;
  const int row = -g.pad_h + i * g.dilate_h + y * g.stride_h;
  const int col = -g.pad_w + j * g.dilate_w + x * g.stride_w;
  return {static_cast<float>(row) + group_offset[2 * k * plane + at],
          static_cast<float>(col) + group_offset[(2 * k + 1) * plane + at]};
}

// The two cells around coordinate x >= 0 of an axis of `size` cells, as the reference picks them, and
// the coordinate they are weighed at: trunc(x) and the next one; from the last cell on, both are the
// last cell and x moves onto it.
struct AxisCells {
  int low, high;
  float x;
};

AxisCells CellsAround(float x, int size) {
  const int low = static_cast<int>(x);
  if (low >= size - 1) return {size - 1, size - 1, static_cast<float>(size - 1)};
  return {low, low + 1, x};
}

SampleTap ForwardTap(const Im2ColGeometry& g, SamplePoint p) {
  if (!(p.h >= 0 && p.w >= 0 && p.h < g.height && p.w < g.width)) return SampleTap{{-1, 0, 0, 0}, {0, 0, 0, 0}};
  const AxisCells h = CellsAround(p.h, g.height), w = CellsAround(p.w, g.width);
  const float lh = h.x - static_cast<float>(h.low), lw = w.x - static_cast<float>(w.low);
  const float hh = 1 - lh, hw = 1 - lw;
  const int width = g.width;
  return SampleTap{{h.low * width + w.low, h.low * width + w.high, h.high * width + w.low, h.high * width + w.high},
                   {hh * hw, hh * lw, lh * hw, lh * lw}};
}

// The reference's col2im weight of cell (h, w) for a point at (point_h, point_w).
float ScatterWeight(float point_h, float point_w, int64_t h, int64_t w, int height, int width) {
  if (point_h < 0 || point_h > height || point_w < 0 || point_w > width) return 0;
  const AxisCells rows = CellsAround(point_h, height), cols = CellsAround(point_w, width);
  const float below_h = static_cast<float>(h + 1) - rows.x, above_h = (rows.x + 1) - static_cast<float>(h);
  const float below_w = static_cast<float>(w + 1) - cols.x, above_w = (cols.x + 1) - static_cast<float>(w);
  if (h == rows.low) {
    if (w == cols.low) return below_h * below_w;
    if (w == cols.high) return below_h * above_w;
  } else if (h == rows.high) {
    if (w == cols.low) return above_h * below_w;
    if (w == cols.high) return above_h * above_w;
  }
  return 0;
}

// The cells the reference's col2im visits (integers less than 1 away, row-major order) and their
// weights; unused slots get weight 0.
SampleTap ScatterTap(const Im2ColGeometry& g, SamplePoint p) {
  SampleTap tap{{0, 0, 0, 0}, {0, 0, 0, 0}};
  if (!(p.h >= 0 && p.h <= g.height && p.w >= 0 && p.w <= g.width)) return tap;  // all weights would be 0
  const int64_t base_h = static_cast<int64_t>(p.h), base_w = static_cast<int64_t>(p.w);
  int slot = 0;
  for (int64_t h = base_h - 2; h <= base_h + 2; ++h) {
    for (int64_t w = base_w - 2; w <= base_w + 2; ++w) {
      if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
      if (!(std::abs(p.h - static_cast<float>(h)) < 1 && std::abs(p.w - static_cast<float>(w)) < 1)) continue;
      tap.index[slot] = static_cast<int32_t>(h * g.width + w);
      tap.weight[slot] = ScatterWeight(p.h, p.w, h, w, g.height, g.width);
      ++slot;
    }
  }
  return tap;
}

OffsetTap CoordinateTap(const Im2ColGeometry& g, SamplePoint p) {
  if (!(p.h >= 0 && p.w >= 0 && p.h < g.height && p.w < g.width)) return OffsetTap{{-1, 0, 0, 0}, 0, 0, 0, 0};
  const AxisCells h = CellsAround(p.h, g.height), w = CellsAround(p.w, g.width);
  const int width = g.width;
  return OffsetTap{{h.low * width + w.low, h.low * width + w.high, h.high * width + w.low, h.high * width + w.high},
                   static_cast<float>(w.low + 1) - w.x, w.x - static_cast<float>(w.low),
                   static_cast<float>(h.low + 1) - h.x, h.x - static_cast<float>(h.low)};
}

// Fills taps[((n * groups + group) * taps + k) * positions + position] for every sampling point.
template <typename Tap, typename MakeTap>
std::unique_ptr<Tap[]> AllTaps(const Im2ColGeometry& g, const float* offset, MakeTap make_tap) {
  const int64_t positions = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t rows = static_cast<int64_t>(g.batch) * g.deformable_groups * g.taps() * g.out_height;
  std::unique_ptr<Tap[]> taps(new Tap[rows * g.out_width]);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int y = static_cast<int>(row % g.out_height);
    const int k = static_cast<int>(row / g.out_height % g.taps());
    const int64_t image_group = row / g.out_height / g.taps();  // n * groups + group
    const float* group_offset = offset + image_group * 2 * g.taps() * positions;
    Tap* out = &taps[row * g.out_width];
    for (int x = 0; x < g.out_width; ++x) out[x] = make_tap(g, PointOf(g, group_offset, k, y, x));
  }
  return taps;
}

// Sampling points per block of work: their taps (32 bytes each) fit the first-level cache.
constexpr int64_t kTapBlock = 512;

}  // namespace

void DeformableIm2Col(const Im2ColGeometry& g, const float* data, const float* offset, float* columns) {
  const std::unique_ptr<SampleTap[]> taps = AllTaps<SampleTap>(g, offset, ForwardTap);
  const int64_t plane = static_cast<int64_t>(g.height) * g.width;
  const int64_t group_taps = static_cast<int64_t>(g.taps()) * g.out_height * g.out_width;
  const int per_group = g.channels / g.deformable_groups;
  // A work item is a block of one group's sampling points, applied to each of the group's channels while
  // the block's taps stay in the first-level cache.
  const int64_t blocks = (group_taps + kTapBlock - 1) / kTapBlock;
  const int64_t items = static_cast<int64_t>(g.batch) * g.deformable_groups * blocks;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t image_group = item / blocks;  // n * groups + group
    const int64_t first = item % blocks * kTapBlock, last = std::min(first + kTapBlock, group_taps);
    const SampleTap* block = &taps[image_group * group_taps];
    const int64_t first_channel = image_group * per_group;  // n * channels + group * per_group
    for (int64_t nc = first_channel; nc < first_channel + per_group; ++nc) {
      const float* channel = data + nc * plane;
      float* out = columns + nc * group_taps;
      for (int64_t at = first; at < last; ++at) {
        const SampleTap& t = block[at];
        out[at] = t.index[0] < 0 ? 0.0f
                                 : t.weight[0] * channel[t.index[0]] + t.weight[1] * channel[t.index[1]] +
                                       t.weight[2] * channel[t.index[2]] + t.weight[3] * channel[t.index[3]];
      }
    }
  }
}

void DeformableIm2ColBackward(const Im2ColGeometry& g, const float* columns_grad, const float* data,
                              const float* offset, float* data_grad, float* offset_grad) {
  const int64_t positions = static_cast<int64_t>(g.out_height) * g.out_width;
  const int64_t plane = static_cast<int64_t>(g.height) * g.width;
  const int taps_per_point = g.taps();
  const int64_t group_taps = taps_per_point * positions;
  const int per_group = g.channels / g.deformable_groups;
  if (data_grad != nullptr) {
    // A work item is a few channels of one group: it alone writes their gradient planes, going through
    // the group's sampling points block by block (taps in cache, reused by each channel) in the
    // reference's order.
    const std::unique_ptr<SampleTap[]> taps = AllTaps<SampleTap>(g, offset, ScatterTap);
    constexpr int kChannels = 8;
    const int64_t slices = (per_group + kChannels - 1) / kChannels;
    const int64_t items = static_cast<int64_t>(g.batch) * g.deformable_groups * slices;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t image_group = item / slices;
      const int64_t first_channel = image_group * per_group + item % slices * kChannels;
      const int64_t end_channel = std::min(first_channel + kChannels, (image_group + 1) * per_group);
      const SampleTap* all = &taps[image_group * group_taps];
      for (int64_t nc = first_channel; nc < end_channel; ++nc) {
        std::memset(data_grad + nc * plane, 0, plane * sizeof(float));
      }
      for (int64_t first = 0; first < group_taps; first += kTapBlock) {
        const int64_t last = std::min(first + kTapBlock, group_taps);
        for (int64_t nc = first_channel; nc < end_channel; ++nc) {
          float* channel = data_grad + nc * plane;
          const float* grad = columns_grad + nc * group_taps;
          for (int64_t at = first; at < last; ++at) {
            const SampleTap& t = all[at];
            const float top = grad[at];
            for (int slot = 0; slot < 4; ++slot) channel[t.index[slot]] += t.weight[slot] * top;
          }
        }
      }
    }
  }
  if (offset_grad == nullptr) return;
  // Each (image, group, block of positions) sums over the group's channels in the reference's order.
  const std::unique_ptr<OffsetTap[]> taps = AllTaps<OffsetTap>(g, offset, CoordinateTap);
  constexpr int64_t kBlock = 128;
  const int64_t blocks = (positions + kBlock - 1) / kBlock;
  const int64_t items = static_cast<int64_t>(g.batch) * g.deformable_groups * blocks;
#pragma omp parallel
  {
    std::vector<float> sums(2 * taps_per_point * kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t image_group = item / blocks;  // n * groups + group
      const int64_t first = item % blocks * kBlock, count = std::min(kBlock, positions - first);
      std::fill(sums.begin(), sums.end(), 0.0f);
      for (int cc = 0; cc < per_group; ++cc) {
        const int64_t nc = image_group * per_group + cc;  // n * channels + group * per_group + cc
        const float* channel = data + nc * plane;
        for (int k = 0; k < taps_per_point; ++k) {
          const float* grad = columns_grad + (nc * taps_per_point + k) * positions + first;
          const OffsetTap* tap = &taps[(image_group * taps_per_point + k) * positions + first];
          float* sum_h = &sums[(2 * k) * kBlock];
          float* sum_w = sum_h + kBlock;
          for (int64_t p = 0; p < count; ++p) {
            const OffsetTap& t = tap[p];
            if (t.index[0] < 0) continue;
            const float ll = channel[t.index[0]], lh = channel[t.index[1]];
            const float hl = channel[t.index[2]], hh = channel[t.index[3]];
            const float weight_h = -t.low_w * ll - t.high_w * lh + t.low_w * hl + t.high_w * hh;
            const float weight_w = -t.low_h * ll + t.low_h * lh - t.high_h * hl + t.high_h * hh;
            sum_h[p] += weight_h * grad[p];
            sum_w[p] += weight_w * grad[p];
          }
        }
      }
      float* out = offset_grad + image_group * 2 * taps_per_point * positions + first;
      for (int row = 0; row < 2 * taps_per_point; ++row) {
        std::copy(&sums[row * kBlock], &sums[row * kBlock] + count, out + row * positions);
      }
    }
  }
}

}  // namespace sniper
