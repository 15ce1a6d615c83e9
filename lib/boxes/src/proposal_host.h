// The host arithmetic of the reference's test proposal layer (its fork's MultiProposal: the 2018 GPU
// operator copied the RPN maps to the host and ran this there; multi_proposal.cc is the same code):
// - anchors ranked with std::sort, whose order of equal scores it had. Equal scores are common: the
//   anchors of a canvas's padding, or of a flat image region, score alike;
// - exp of a float32 delta with the C library's expf (its `exp(dw)` on a float), which differs from the
//   correctly rounded value in the last bit for a few values in ten thousand;
// - greedy NMS with the overlap in float32 (+1 sizes), compared with the threshold in double: near the
//   threshold the float32 overlap and the exact one can fall on different sides.
#ifndef SNIPER_PROPOSAL_HOST_H_
#define SNIPER_PROPOSAL_HOST_H_

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sniper {

struct HigherScore {
  const float* scores;
  bool operator()(int64_t a, int64_t b) const { return scores[a] > scores[b]; }
};

// order[i] = i, then sorted by descending score with std::sort (not stable).
inline void descending_order(const float* scores, int64_t count, int64_t* order) {
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  std::sort(order, order + count, HigherScore{scores});
}

inline void expf_array(const float* values, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = ::expf(values[i]);
}

// Greedy NMS over `count` boxes (x1, y1, x2, y2 rows) already in rank order: each kept box marks every
// later box whose float32 overlap with it is > threshold; stops after `max_kept` kept boxes. Writes the
// kept positions to `kept`, returns how many.
inline int64_t greedy_nms_float32(const float* boxes, int64_t count, double threshold, int64_t max_kept,
                                  int64_t* kept) {
  std::vector<float> area(count);
  std::vector<char> suppressed(count, 0);
  for (int64_t i = 0; i < count; ++i) {
    area[i] = (boxes[4 * i + 2] - boxes[4 * i] + 1) * (boxes[4 * i + 3] - boxes[4 * i + 1] + 1);
  }
  int64_t num_kept = 0;
  for (int64_t j = 0; j < count && num_kept < max_kept; ++j) {
    if (suppressed[j]) continue;
    kept[num_kept++] = j;
    const float* box = boxes + 4 * j;
    for (int64_t p = j + 1; p < count; ++p) {
      if (suppressed[p]) continue;
      const float* other = boxes + 4 * p;
      float xx1 = std::max(box[0], other[0]);
      float yy1 = std::max(box[1], other[1]);
      float xx2 = std::min(box[2], other[2]);
      float yy2 = std::min(box[3], other[3]);
      float w = std::max(0.0f, xx2 - xx1 + 1.0f);
      float h = std::max(0.0f, yy2 - yy1 + 1.0f);
      float inter = w * h;
      float overlap = inter / (area[j] + area[p] - inter);
      if (overlap > threshold) suppressed[p] = 1;
    }
  }
  return num_kept;
}

}  // namespace sniper

#endif  // SNIPER_PROPOSAL_HOST_H_
