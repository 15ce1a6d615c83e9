// Inclusive-pixel box arithmetic for the proposal-target operator, in two conventions.
//
// "exact" (the project's rules): every formula repeats, operation for operation and in the same
// precision, the shared Python pieces (lib/boxes/coder.py in float32, lib/boxes/_cython_boxes.pyx IoU
// in double, lib/scales.py in_valid_range in double), so that the operator and its NumPy reference
// agree to the last bit wherever the C library and NumPy agree on exp/log.
// "reference" (the published SNIPER's GPU operator): areas without the +1 while intersections keep
// it, float32 products and quotients, comparisons against double thresholds, and the regression
// target's gt centre at x1 + 0.5 * w; dev/oracles/proposal_target.py states the same arithmetic in NumPy.
#ifndef SNIPER_OPS_BOX_MATH_H_
#define SNIPER_OPS_BOX_MATH_H_

#include <algorithm>
#include <cmath>

namespace sniper {

struct Box {
  float x1, y1, x2, y2;
};

// Largest dw/dh applied by Decode (lib/boxes/coder.py MAX_LOG_SCALE, cast to float32 like NumPy).
inline float MaxLogScale() { return static_cast<float>(std::log(1000.0 / 16.0)); }

// Faster R-CNN decode of one box by (dx, dy, dw, dh), float32 throughout.
inline Box Decode(const Box& box, float dx, float dy, float dw, float dh, float max_log_scale) {
  const float w = box.x2 - box.x1 + 1.0f;
  const float h = box.y2 - box.y1 + 1.0f;
  const float cx = box.x1 + 0.5f * (w - 1.0f);
  const float cy = box.y1 + 0.5f * (h - 1.0f);
  const float centre_x = dx * w + cx;
  const float centre_y = dy * h + cy;
  const float half_w = 0.5f * (std::exp(std::min(dw, max_log_scale)) * w - 1.0f);
  const float half_h = 0.5f * (std::exp(std::min(dh, max_log_scale)) * h - 1.0f);
  return {centre_x - half_w, centre_y - half_h, centre_x + half_w, centre_y + half_h};
}

// Regression target (dx, dy, dw, dh) / stds moving `roi` onto `gt`, float32 throughout.
inline void Encode(const Box& roi, const Box& gt, const float stds[4], float out[4]) {
  const float w = roi.x2 - roi.x1 + 1.0f;
  const float h = roi.y2 - roi.y1 + 1.0f;
  const float cx = roi.x1 + 0.5f * (w - 1.0f);
  const float cy = roi.y1 + 0.5f * (h - 1.0f);
  const float gw = gt.x2 - gt.x1 + 1.0f;
  const float gh = gt.y2 - gt.y1 + 1.0f;
  const float gcx = gt.x1 + 0.5f * (gw - 1.0f);
  const float gcy = gt.y1 + 0.5f * (gh - 1.0f);
  out[0] = ((gcx - cx) / w) / stds[0];
  out[1] = ((gcy - cy) / h) / stds[1];
  out[2] = std::log(gw / w) / stds[2];
  out[3] = std::log(gh / h) / stds[3];
}

// x into [0, width - 1], y into [0, height - 1] (NumPy clip: min(max(v, 0), upper)).
inline Box Clip(const Box& box, float height, float width) {
  const float max_x = width - 1.0f;
  const float max_y = height - 1.0f;
  return {std::min(std::max(box.x1, 0.0f), max_x), std::min(std::max(box.y1, 0.0f), max_y),
          std::min(std::max(box.x2, 0.0f), max_x), std::min(std::max(box.y2, 0.0f), max_y)};
}

inline float Width(const Box& box) { return box.x2 - box.x1 + 1.0f; }
inline float Height(const Box& box) { return box.y2 - box.y1 + 1.0f; }

// sqrt(area) within [lo, hi], -1 meaning an open end (lib/scales.py in_valid_range, in double).
inline bool InValidRange(const Box& box, double lo, double hi) {
  const double w = static_cast<double>(box.x2) - static_cast<double>(box.x1) + 1.0;
  const double h = static_cast<double>(box.y2) - static_cast<double>(box.y1) + 1.0;
  const double size = std::sqrt(std::max(w * h, 0.0));
  return (lo == -1.0 || size >= lo) && (hi == -1.0 || size <= hi);
}

// Area and IoU as the Cython kernels compute them: float differences, double products.
inline double Area(const Box& box) {
  return (static_cast<double>(box.x2 - box.x1) + 1.0) * (static_cast<double>(box.y2 - box.y1) + 1.0);
}

inline double IoU(const Box& a, double area_a, const Box& b, double area_b) {
  const double iw = static_cast<double>(std::min(a.x2, b.x2) - std::max(a.x1, b.x1)) + 1.0;
  if (iw <= 0) return 0.0;
  const double ih = static_cast<double>(std::min(a.y2, b.y2) - std::max(a.y1, b.y1)) + 1.0;
  if (ih <= 0) return 0.0;
  const double inter = iw * ih;
  const double union_area = area_a + area_b - inter;
  return union_area > 0 ? inter / union_area : 0.0;
}

// ---- reference rules ----

// Area without the +1 (x2 - x1) * (y2 - y1), in float32.
inline float AreaNoPlusOne(const Box& box) { return (box.x2 - box.x1) * (box.y2 - box.y1); }

// Overlap of the reference: intersection with the +1, areas without it, all in float32. It exceeds
// the true IoU, more so for small boxes.
inline float InflatedOverlap(const Box& a, float area_a, const Box& b, float area_b) {
  const float iw = std::max(0.0f, std::min(a.x2, b.x2) - std::max(a.x1, b.x1) + 1.0f);
  const float ih = std::max(0.0f, std::min(a.y2, b.y2) - std::max(a.y1, b.y1) + 1.0f);
  const float inter = iw * ih;
  return inter / (area_a + area_b - inter);
}

// A bound of the chip's valid range squared (float32, as the reference multiplies it); -1 = open.
inline bool IsOpen(float bound) { return bound == -1.0f; }

// Regression target of the reference: gt centre x1 + 0.5 * w (half a pixel right of / below the
// inclusive-pixel centre), roi centre x1 + 0.5 * (w - 1), 1e-7 added to the roi size, the scale
// factors 1 / stds (the reference's literals 10, 10, 5, 5) applied to the centre offsets in float32 and
// to the logarithms in double.
inline void EncodeReference(const Box& roi, const Box& gt, const double stds[4], float out[4]) {
  const float gw = gt.x2 - gt.x1 + 1.0f;
  const float gh = gt.y2 - gt.y1 + 1.0f;
  const float gcx = static_cast<float>(gt.x1 + 0.5 * gw);
  const float gcy = static_cast<float>(gt.y1 + 0.5 * gh);
  const float pw = roi.x2 - roi.x1 + 1.0f;
  const float ph = roi.y2 - roi.y1 + 1.0f;
  const float pcx = static_cast<float>(roi.x1 + 0.5 * (pw - 1.0f));
  const float pcy = static_cast<float>(roi.y1 + 0.5 * (ph - 1.0f));
  const double eps = 1e-7;
  out[0] = static_cast<float>((static_cast<float>(1.0 / stds[0]) * (gcx - pcx)) / (pw + eps));
  out[1] = static_cast<float>((static_cast<float>(1.0 / stds[1]) * (gcy - pcy)) / (ph + eps));
  out[2] = static_cast<float>((1.0 / stds[2]) * std::log(gw / (pw + eps)));
  out[3] = static_cast<float>((1.0 / stds[3]) * std::log(gh / (ph + eps)));
}

}  // namespace sniper

#endif  // SNIPER_OPS_BOX_MATH_H_
