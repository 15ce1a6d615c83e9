#include "deformable_psroi_pooling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <omp.h>

namespace sniper {
namespace {

// One bilinear sample of a pooling bin: the four cells around it, in the order (y0, x0), (y1, x0),
// (y0, x1), (y1, x1) (y0 = floor, y1 = ceil), their weights, and the fractional position that the
// offset gradient needs. Computed once per sample and reused for every channel.
struct PoolTap {
  int32_t index[4];
  float weight[4];
  float dist_x, dist_y;
};

// A roi in feature-map coordinates, rounded and widened as the reference does.
struct RoiBox {
  int batch;
  float start_w, start_h, width, height;
};

RoiBox ScaledRoi(const float* roi, float spatial_scale) {
  RoiBox box;
  box.batch = static_cast<int>(roi[0]);
  box.start_w = std::round(roi[1]) * spatial_scale - 0.5f;
  box.start_h = std::round(roi[2]) * spatial_scale - 0.5f;
  const float end_w = (std::round(roi[3]) + 1.0f) * spatial_scale - 0.5f;
  const float end_h = (std::round(roi[4]) + 1.0f) * spatial_scale - 0.5f;
  box.width = std::max(end_w - box.start_w, 0.1f);  // empty and inverted rois become 0.1 wide
  box.height = std::max(end_h - box.start_h, 0.1f);
  return box;
}

// Per bin (ph * pooled + pw): its part (trans cell) and its position-sensitive channel offset.
struct BinLayout {
  std::vector<int> part_h, part_w, group_channel;

  explicit BinLayout(const PSROIPoolingParams& p) {
    const int pooled = p.pooled_size, group = p.group_size, part = p.part_size;
    for (int ph = 0; ph < pooled; ++ph) {
      for (int pw = 0; pw < pooled; ++pw) {
        part_h.push_back(static_cast<int>(std::floor(static_cast<float>(ph) / pooled * part)));
        part_w.push_back(static_cast<int>(std::floor(static_cast<float>(pw) / pooled * part)));
        const int gh = static_cast<int>(std::floor(static_cast<float>(ph) * group / pooled));
        const int gw = static_cast<int>(std::floor(static_cast<float>(pw) * group / pooled));
        group_channel.push_back(std::min(std::max(gh, 0), group - 1) * group + std::min(std::max(gw, 0), group - 1));
      }
    }
  }
};

// The valid samples of every bin of one roi for one class: taps[bin * S * S + s] for s < counts[bin].
// `roi_trans` is the roi's (2 * num_classes, part, part) slice of trans, or null without offsets.
void BinTaps(const PSROIPoolingParams& p, const PSROIPoolingShape& shape, const BinLayout& layout,
             const RoiBox& box, const float* roi_trans, int cls, PoolTap* taps, int* counts) {
  const int pooled = p.pooled_size, samples = p.sample_per_part, part = p.part_size;
  const int height = shape.height, width = shape.width;
  const float bin_h = box.height / static_cast<float>(pooled);
  const float bin_w = box.width / static_cast<float>(pooled);
  const float sub_h = bin_h / static_cast<float>(samples);
  const float sub_w = bin_w / static_cast<float>(samples);
  for (int ph = 0; ph < pooled; ++ph) {
    for (int pw = 0; pw < pooled; ++pw) {
      const int bin = ph * pooled + pw;
      float trans_x = 0, trans_y = 0;
      if (roi_trans != nullptr) {
        const int cell = layout.part_h[bin] * part + layout.part_w[bin];
        trans_x = roi_trans[(2 * cls) * part * part + cell] * p.trans_std;
        trans_y = roi_trans[(2 * cls + 1) * part * part + cell] * p.trans_std;
      }
      float wstart = static_cast<float>(pw) * bin_w + box.start_w;
      wstart += trans_x * box.width;
      float hstart = static_cast<float>(ph) * bin_h + box.start_h;
      hstart += trans_y * box.height;
      PoolTap* tap = taps + bin * samples * samples;
      int count = 0;
      for (int ih = 0; ih < samples; ++ih) {
        for (int iw = 0; iw < samples; ++iw) {
          float w = wstart + static_cast<float>(iw) * sub_w;
          float h = hstart + static_cast<float>(ih) * sub_h;
          // samples more than half a cell outside the map are dropped, the others clamped onto it
          if (w < -0.5 || w > width - 0.5 || h < -0.5 || h > height - 0.5) continue;
          w = std::min(std::max(w, 0.0f), static_cast<float>(width - 1));
          h = std::min(std::max(h, 0.0f), static_cast<float>(height - 1));
          const int x0 = static_cast<int>(std::floor(w)), x1 = static_cast<int>(std::ceil(w));
          const int y0 = static_cast<int>(std::floor(h)), y1 = static_cast<int>(std::ceil(h));
          const float dist_x = w - static_cast<float>(x0), dist_y = h - static_cast<float>(y0);
          *tap++ = PoolTap{{y0 * width + x0, y1 * width + x0, y0 * width + x1, y1 * width + x1},
                           {(1 - dist_x) * (1 - dist_y), (1 - dist_x) * dist_y, dist_x * (1 - dist_y),
                            dist_x * dist_y},
                           dist_x,
                           dist_y};
          ++count;
        }
      }
      counts[bin] = count;
    }
  }
}

int ChannelsPerClass(const PSROIPoolingParams& p, const PSROIPoolingShape& shape) {
  return p.no_trans ? p.output_dim : p.output_dim / shape.num_classes;
}

// The channels the pooling reads, channel-last: out[(b * cells + cell) * used + c] for c < used, so
// that one sample's bilinear weights apply to every output channel with contiguous (vector) loads.
std::unique_ptr<float[]> ChannelsLast(const float* data, const PSROIPoolingShape& shape, int used) {
  const int64_t cells = static_cast<int64_t>(shape.height) * shape.width;
  constexpr int64_t kTile = 64;
  const int64_t tiles = (cells + kTile - 1) / kTile;
  std::unique_ptr<float[]> out(new float[shape.batch * cells * used]);
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < shape.batch * tiles; ++item) {
    const int64_t b = item / tiles, first = item % tiles * kTile, last = std::min(first + kTile, cells);
    const float* image = data + b * shape.channels * cells;
    float* image_out = &out[b * cells * used];
    for (int c = 0; c < used; ++c) {
      for (int64_t cell = first; cell < last; ++cell) image_out[cell * used + c] = image[c * cells + cell];
    }
  }
  return out;
}

// The inverse of ChannelsLast into a (batch, channels, height, width) tensor; channels >= used get 0.
void ToChannelsFirst(const float* in, const PSROIPoolingShape& shape, int used, float* data) {
  const int64_t cells = static_cast<int64_t>(shape.height) * shape.width;
  constexpr int64_t kTile = 64;
  const int64_t tiles = (cells + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < shape.batch * tiles; ++item) {
    const int64_t b = item / tiles, first = item % tiles * kTile, last = std::min(first + kTile, cells);
    const float* image_in = in + b * cells * used;
    float* image = data + b * shape.channels * cells;
    for (int c = 0; c < shape.channels; ++c) {
      for (int64_t cell = first; cell < last; ++cell) {
        image[c * cells + cell] = c < used ? image_in[cell * used + c] : 0.0f;
      }
    }
  }
}

// Per-call constants of both passes.
struct Pooling {
  const PSROIPoolingParams& params;
  const PSROIPoolingShape& shape;
  BinLayout layout;
  int bins, taps_per_bin, num_classes, per_class, group_channels, used;
  int64_t cells, trans_per_roi;

  Pooling(const PSROIPoolingParams& p, const PSROIPoolingShape& s)
      : params(p), shape(s), layout(p), bins(p.pooled_size * p.pooled_size),
        taps_per_bin(p.sample_per_part * p.sample_per_part), num_classes(p.no_trans ? 1 : s.num_classes),
        per_class(ChannelsPerClass(p, s)), group_channels(p.group_size * p.group_size),
        used(p.output_dim * group_channels), cells(static_cast<int64_t>(s.height) * s.width),
        trans_per_roi(static_cast<int64_t>(2) * num_classes * p.part_size * p.part_size) {}

  RoiBox Box(const float* rois, int n) const {
    return ScaledRoi(rois + 5 * static_cast<int64_t>(n), params.spatial_scale);
  }

  const float* RoiTrans(const float* trans, int n) const {
    return params.no_trans ? nullptr : trans + n * trans_per_roi;
  }

  // diff[ctop] = out_grad / top_count of bin `bin` of roi n for ctop in [lo, hi); 0 where the bin has no sample.
  void BinGradient(const float* out_grad, const float* top_count, int n, int bin, int lo, int hi, float* diff) const {
    for (int ctop = lo; ctop < hi; ++ctop) {
      const int64_t at = (static_cast<int64_t>(n) * params.output_dim + ctop) * bins + bin;
      diff[ctop] = top_count[at] > 0 ? out_grad[at] / top_count[at] : 0.0f;
    }
  }
};

}  // namespace

void DeformablePSROIPoolingForward(const PSROIPoolingParams& params, const PSROIPoolingShape& shape,
                                   const float* data, const float* rois, const float* trans, float* out,
                                   float* top_count) {
  const Pooling pool(params, shape);
  const std::unique_ptr<float[]> data_last = ChannelsLast(data, shape, pool.used);
  const int stride = pool.group_channels;
#pragma omp parallel
  {
    std::vector<PoolTap> taps(static_cast<size_t>(pool.bins) * pool.taps_per_bin);
    std::vector<int> counts(pool.bins);
    std::vector<float> sums(params.output_dim);
#pragma omp for schedule(dynamic, 1)
    for (int n = 0; n < shape.num_rois; ++n) {
      const RoiBox box = pool.Box(rois, n);
      const float* image = &data_last[box.batch * pool.cells * pool.used];
      for (int cls = 0; cls < pool.num_classes; ++cls) {
        BinTaps(params, shape, pool.layout, box, pool.RoiTrans(trans, n), cls, taps.data(), counts.data());
        const int lo = cls * pool.per_class, hi = lo + pool.per_class;
        for (int bin = 0; bin < pool.bins; ++bin) {
          std::fill(sums.begin() + lo, sums.begin() + hi, 0.0f);
          const PoolTap* tap = &taps[static_cast<size_t>(bin) * pool.taps_per_bin];
          for (int s = 0; s < counts[bin]; ++s, ++tap) {
            const float* v0 = image + tap->index[0] * pool.used + pool.layout.group_channel[bin];
            const float* v1 = image + tap->index[1] * pool.used + pool.layout.group_channel[bin];
            const float* v2 = image + tap->index[2] * pool.used + pool.layout.group_channel[bin];
            const float* v3 = image + tap->index[3] * pool.used + pool.layout.group_channel[bin];
            const float w0 = tap->weight[0], w1 = tap->weight[1], w2 = tap->weight[2], w3 = tap->weight[3];
            for (int ctop = lo; ctop < hi; ++ctop) {
              const int c = ctop * stride;
              const float value = w0 * v0[c] + w1 * v1[c] + w2 * v2[c] + w3 * v3[c];
              sums[ctop] += value;
            }
          }
          for (int ctop = lo; ctop < hi; ++ctop) {
            const int64_t at = (static_cast<int64_t>(n) * params.output_dim + ctop) * pool.bins + bin;
            out[at] = counts[bin] == 0 ? 0.0f : sums[ctop] / static_cast<float>(counts[bin]);
            top_count[at] = static_cast<float>(counts[bin]);
          }
        }
      }
    }
  }
}

void DeformablePSROIPoolingBackward(const PSROIPoolingParams& params, const PSROIPoolingShape& shape,
                                    const float* out_grad, const float* top_count, const float* data,
                                    const float* rois, const float* trans, float* data_grad, float* trans_grad) {
  const Pooling pool(params, shape);
  const int stride = pool.group_channels;
  std::vector<std::vector<int>> image_rois(shape.batch);
  for (int n = 0; n < shape.num_rois; ++n) image_rois[static_cast<int>(rois[5 * static_cast<int64_t>(n)])].push_back(n);

  // Data gradient, channel-last. A work item is one image and a slice of the output channels: it alone
  // writes those channels of that image, adding rois, bins, samples and corners in the reference's order.
  const std::unique_ptr<float[]> grad_last(new float[shape.batch * pool.cells * pool.used]);
  std::fill(&grad_last[0], &grad_last[0] + shape.batch * pool.cells * pool.used, 0.0f);
  const int threads = omp_get_max_threads();
  const int slices = std::max(1, std::min((params.output_dim + 7) / 8, (2 * threads + shape.batch - 1) / shape.batch));
  const int slice_width = (params.output_dim + slices - 1) / slices;
#pragma omp parallel
  {
    std::vector<PoolTap> taps(static_cast<size_t>(pool.bins) * pool.taps_per_bin);
    std::vector<int> counts(pool.bins);
    std::vector<float> diff(params.output_dim);
#pragma omp for schedule(dynamic, 1)
    for (int item = 0; item < shape.batch * slices; ++item) {
      const int b = item / slices, first = item % slices * slice_width;
      const int last = std::min(first + slice_width, params.output_dim);
      float* image = &grad_last[b * pool.cells * pool.used];
      for (int n : image_rois[b]) {
        const RoiBox box = pool.Box(rois, n);
        for (int cls = 0; cls < pool.num_classes; ++cls) {
          const int lo = std::max(first, cls * pool.per_class), hi = std::min(last, (cls + 1) * pool.per_class);
          if (lo >= hi) continue;
          BinTaps(params, shape, pool.layout, box, pool.RoiTrans(trans, n), cls, taps.data(), counts.data());
          for (int bin = 0; bin < pool.bins; ++bin) {
            pool.BinGradient(out_grad, top_count, n, bin, lo, hi, diff.data());
            const PoolTap* tap = &taps[static_cast<size_t>(bin) * pool.taps_per_bin];
            for (int s = 0; s < counts[bin]; ++s, ++tap) {
              for (int corner = 0; corner < 4; ++corner) {
                float* cell = image + tap->index[corner] * pool.used + pool.layout.group_channel[bin];
                const float weight = tap->weight[corner];
                for (int ctop = lo; ctop < hi; ++ctop) cell[ctop * stride] += weight * diff[ctop];
              }
            }
          }
        }
      }
    }
  }
  ToChannelsFirst(grad_last.get(), shape, pool.used, data_grad);
  if (params.no_trans || trans_grad == nullptr) return;

  // Offset gradient: each roi owns its trans cells. Per bin the terms of all (sample, channel) pairs are
  // formed with vector loops, then added channel by channel, sample by sample (the reference's order
  // when part_size == pooled_size, as in the network).
  const std::unique_ptr<float[]> data_last = ChannelsLast(data, shape, pool.used);
  const int part = params.part_size, part_cells = part * part;
#pragma omp parallel
  {
    std::vector<PoolTap> taps(static_cast<size_t>(pool.bins) * pool.taps_per_bin);
    std::vector<int> counts(pool.bins);
    std::vector<float> diff(params.output_dim);
    std::vector<float> terms_x(static_cast<size_t>(pool.taps_per_bin) * params.output_dim);
    std::vector<float> terms_y(terms_x.size());
#pragma omp for schedule(dynamic, 1)
    for (int n = 0; n < shape.num_rois; ++n) {
      const RoiBox box = pool.Box(rois, n);
      const float* image = &data_last[box.batch * pool.cells * pool.used];
      float* roi_grad = trans_grad + n * pool.trans_per_roi;
      std::fill(roi_grad, roi_grad + pool.trans_per_roi, 0.0f);
      for (int cls = 0; cls < pool.num_classes; ++cls) {
        BinTaps(params, shape, pool.layout, box, pool.RoiTrans(trans, n), cls, taps.data(), counts.data());
        const int lo = cls * pool.per_class, hi = lo + pool.per_class;
        for (int bin = 0; bin < pool.bins; ++bin) {
          pool.BinGradient(out_grad, top_count, n, bin, lo, hi, diff.data());
          const PoolTap* tap = &taps[static_cast<size_t>(bin) * pool.taps_per_bin];
          const int group = pool.layout.group_channel[bin];
          for (int s = 0; s < counts[bin]; ++s, ++tap) {
            const float* u00 = image + tap->index[0] * pool.used + group;
            const float* u01 = image + tap->index[1] * pool.used + group;
            const float* u10 = image + tap->index[2] * pool.used + group;
            const float* u11 = image + tap->index[3] * pool.used + group;
            const float dx = tap->dist_x, dy = tap->dist_y;
            float* term_x = &terms_x[static_cast<size_t>(s) * params.output_dim];
            float* term_y = &terms_y[static_cast<size_t>(s) * params.output_dim];
            for (int ctop = lo; ctop < hi; ++ctop) {
              const int c = ctop * stride;
              float diff_x = u11[c] * dy + u10[c] * (1 - dy) - u01[c] * dy - u00[c] * (1 - dy);
              diff_x *= params.trans_std * diff[ctop] * box.width;
              float diff_y = u11[c] * dx + u01[c] * (1 - dx) - u10[c] * dx - u00[c] * (1 - dx);
              diff_y *= params.trans_std * diff[ctop] * box.height;
              term_x[ctop] = diff_x;
              term_y[ctop] = diff_y;
            }
          }
          float* grad_x = roi_grad + (2 * cls) * part_cells + pool.layout.part_h[bin] * part + pool.layout.part_w[bin];
          float* grad_y = grad_x + part_cells;
          float sum_x = *grad_x, sum_y = *grad_y;
          for (int ctop = lo; ctop < hi; ++ctop) {
            for (int s = 0; s < counts[bin]; ++s) {
              sum_x += terms_x[static_cast<size_t>(s) * params.output_dim + ctop];
              sum_y += terms_y[static_cast<size_t>(s) * params.output_dim + ctop];
            }
          }
          *grad_x = sum_x;
          *grad_y = sum_y;
        }
      }
    }
  }
}

}  // namespace sniper
