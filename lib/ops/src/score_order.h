// Ranking of anchors by score with the C++ standard library's std::sort, whose order of equal scores
// the reference's proposal layer had (it sorted anchor indices with std::sort on the host). Equal
// scores are common: the anchors of a canvas's padding, or of a flat image region, score alike.
#ifndef SNIPER_SCORE_ORDER_H_
#define SNIPER_SCORE_ORDER_H_

#include <algorithm>
#include <cstdint>

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

}  // namespace sniper

#endif  // SNIPER_SCORE_ORDER_H_
