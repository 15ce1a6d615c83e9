// Per-chip proposal target: rank anchors by score, decode and filter them as the ranking is walked,
// NMS, append gts, label, encode. The two rule sets differ in the conventions gathered in ExactRules /
// ReferenceRules below and in the roi layout (ChipTargets); the selection is shared.
#include "proposal_target.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace sniper {

std::vector<Box> BaseAnchors(int stride, const std::vector<double>& ratios,
                             const std::vector<double>& scales) {
  // Same double arithmetic as NumPy; nearbyint rounds half to even like np.round.
  const double centre = 0.5 * (stride - 1);
  std::vector<Box> anchors;
  anchors.reserve(ratios.size() * scales.size());
  for (double ratio : ratios) {
    const double ratio_width = std::nearbyint(std::sqrt(static_cast<double>(stride) * stride / ratio));
    const double ratio_height = std::nearbyint(ratio_width * ratio);
    for (double scale : scales) {
      const double w = ratio_width * scale;
      const double h = ratio_height * scale;
      anchors.push_back({static_cast<float>(centre - 0.5 * (w - 1)), static_cast<float>(centre - 0.5 * (h - 1)),
                         static_cast<float>(centre + 0.5 * (w - 1)), static_cast<float>(centre + 0.5 * (h - 1))});
    }
  }
  return anchors;
}

namespace {

// The NMS kernel of the reference prefers, among equal scores, relative array position r over s
// (r, s = position minus the slot being filled): one of 1024 threads, t = r mod 1024, keeps the first
// maximum of its strided slice, and the block reduction then takes the smallest t mod 32, then the
// smallest t.
inline bool KernelPrefers(int32_t r, int32_t s) {
  if ((r & 31) != (s & 31)) return (r & 31) < (s & 31);
  if ((r & 1023) != (s & 1023)) return (r & 1023) < (s & 1023);
  return r < s;
}

// Scores as unsigned keys in the same order; -0 equals +0; NaN below everything.
inline uint32_t ScoreKey(float score) {
  if (std::isnan(score)) return 0;
  score += 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof(bits));
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The project's rules: true IoU with +1 areas, both sides >= min size (+1), sqrt(+1 area) within the
// inclusive range, anchors in (h, w, a) order, ties broken by that index.
struct ExactRules {
  using Real = double;  // areas and NMS threshold
  static constexpr bool kPositionalTies = false;
  static constexpr bool kLabelsPadding = false;  // padding rois get label -1, gts go right after the proposals
  static constexpr float kUnsetTarget = 0.0f;

  static int32_t AnchorIndex(int a, int y, int x, int num_anchors, int height, int width) {
    return (y * width + x) * num_anchors + a;
  }
  static void Cell(int32_t index, int num_anchors, int height, int width, int* a, int* y, int* x) {
    *a = index % num_anchors;
    *x = (index / num_anchors) % width;
    *y = index / num_anchors / width;
  }
  static uint32_t TieRank(int32_t index) { return static_cast<uint32_t>(index); }
  static int32_t IndexOfRank(uint32_t rank) { return static_cast<int32_t>(rank); }
  static bool Scored(float score) { return true; }  // NaN scores rank last
  static float MaxLogScale() { return sniper::MaxLogScale(); }
  static bool KeepsSize(const Box& box, float min_size) {
    return Width(box) >= min_size && Height(box) >= min_size;
  }
  static bool ProposalInRange(const Box& box, const float* range) {
    return InValidRange(box, range[0], range[1]);
  }
  static bool GtInRange(const Box& box, const float* range) { return InValidRange(box, range[0], range[1]); }
  static double AreaOf(const Box& box) { return Area(box); }
  static double Threshold(double threshold) { return threshold; }
  // IoU(kept, box) > threshold without branches, so that a loop over kept boxes vectorises (where
  // IoU() returns 0 early this multiplies by a zero side).
  static bool Above(float x1, float y1, float x2, float y2, double area, const Box& box, double box_area,
                    double threshold) {
    const double iw = static_cast<double>(std::min(x2, box.x2) - std::max(x1, box.x1)) + 1.0;
    const double ih = static_cast<double>(std::min(y2, box.y2) - std::max(y1, box.y1)) + 1.0;
    const double inter = std::max(iw, 0.0) * std::max(ih, 0.0);
    const double union_area = area + box_area - inter;
    return (union_area > 0) & (inter / union_area > threshold);
  }
  // bbox_overlaps' float32 IoU, compared with the threshold in float32 as NumPy does.
  static float LabelOverlap(const Box& roi, double roi_area, const Box& gt, double gt_area) {
    return static_cast<float>(IoU(roi, roi_area, gt, gt_area));
  }
  static bool Foreground(float overlap, double fg_thresh) { return overlap > static_cast<float>(fg_thresh); }
  static void Targets(const Box& roi, const Box& gt, const double stds[4], float out[4]) {
    const float float_stds[4] = {static_cast<float>(stds[0]), static_cast<float>(stds[1]),
                                 static_cast<float>(stds[2]), static_cast<float>(stds[3])};
    Encode(roi, gt, float_stds, out);
  }
  static std::vector<double>& KeptAreas(ChipWorkspace* work) { return work->kept_area_double; }
};

// The published operator's rules (multi_proposal_target.cu as it ran on GPUs), see
// lib/ops/__init__.py: no-+1 areas in float32 against double thresholds, a box dropped only when both
// sides are under the minimum size, anchors in (a, h, w) order, the NMS kernel's tie rule.
struct ReferenceRules {
  using Real = float;
  static constexpr bool kPositionalTies = true;
  static constexpr bool kLabelsPadding = true;  // every roi is labelled; gts overwrite the last slots
  static constexpr float kUnsetTarget = 1.0f;

  static int32_t AnchorIndex(int a, int y, int x, int num_anchors, int height, int width) {
    return (a * height + y) * width + x;
  }
  static void Cell(int32_t index, int num_anchors, int height, int width, int* a, int* y, int* x) {
    *x = index % width;
    *y = (index / width) % height;
    *a = index / width / height;
  }
  // KernelPrefers at slot 0 as a number (for fewer than 2^26 anchors): it decides only which of equal
  // scores a pre-NMS cap admits.
  static uint32_t TieRank(int32_t index) {
    const uint32_t i = static_cast<uint32_t>(index);
    return ((i & 31u) << 21) | (((i >> 5) & 31u) << 16) | (i >> 10);
  }
  static int32_t IndexOfRank(uint32_t rank) {
    return static_cast<int32_t>(((rank & 0xFFFFu) << 10) | (((rank >> 16) & 31u) << 5) | (rank >> 21));
  }
  // Scores are probabilities; the kernel marks dropped boxes -1 and never selects NaN.
  static bool Scored(float score) { return score > -1.0f; }
  static float MaxLogScale() { return std::numeric_limits<float>::infinity(); }  // the reference has no cap
  static bool KeepsSize(const Box& box, float min_size) {
    return !(box.x2 - box.x1 < min_size && box.y2 - box.y1 < min_size);
  }
  // Dropped when area < lo^2 or area >= hi^2.
  static bool ProposalInRange(const Box& box, const float* range) {
    const float area = AreaNoPlusOne(box);
    return (IsOpen(range[0]) || !(area < range[0] * range[0])) && (IsOpen(range[1]) || !(area >= range[1] * range[1]));
  }
  // Appended when lo^2 <= area <= hi^2 (the upper bound is inclusive here).
  static bool GtInRange(const Box& box, const float* range) {
    const float area = AreaNoPlusOne(box);
    return (IsOpen(range[0]) || area >= range[0] * range[0]) && (IsOpen(range[1]) || area <= range[1] * range[1]);
  }
  static double AreaOf(const Box& box) { return AreaNoPlusOne(box); }
  // A float32 overlap o is > the double threshold t exactly when o > the largest float <= t.
  static float Threshold(double threshold) {
    float rounded = static_cast<float>(threshold);
    if (static_cast<double>(rounded) > threshold) rounded = std::nextafter(rounded, -1.0f);
    return rounded;
  }
  static bool Above(float x1, float y1, float x2, float y2, float area, const Box& box, float box_area,
                    float threshold) {
    return InflatedOverlap({x1, y1, x2, y2}, area, box, box_area) > threshold;
  }
  static float LabelOverlap(const Box& roi, double roi_area, const Box& gt, double gt_area) {
    return InflatedOverlap(gt, static_cast<float>(gt_area), roi, static_cast<float>(roi_area));
  }
  static bool Foreground(float overlap, double fg_thresh) { return overlap > fg_thresh; }
  static void Targets(const Box& roi, const Box& gt, const double stds[4], float out[4]) {
    EncodeReference(roi, gt, stds, out);
  }
  static std::vector<float>& KeptAreas(ChipWorkspace* work) { return work->kept_area_float; }
};

// The scored anchors' keys (score in the high 32 bits, the complement of the tie rank in the low
// ones) handed out best first, ordered in doubling chunks (nth_element, then sort) so that only the
// part the selection visits is ever sorted.
class Ranking {
 public:
  explicit Ranking(std::vector<uint64_t>* keys) : keys_(*keys) {}
  bool empty() const { return next_ == keys_.size(); }
  uint64_t front() {
    if (next_ == ordered_) Extend();
    return keys_[next_];
  }
  uint64_t pop() {
    const uint64_t key = front();
    ++next_;
    return key;
  }

 private:
  void Extend() {
    const size_t end = std::min(keys_.size(), ordered_ + chunk_);
    const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(ordered_);
    const auto last = keys_.begin() + static_cast<std::ptrdiff_t>(end);
    if (end < keys_.size()) std::nth_element(first, last, keys_.end(), std::greater<uint64_t>());
    std::sort(first, last, std::greater<uint64_t>());
    ordered_ = end;
    chunk_ *= 2;
  }

  std::vector<uint64_t>& keys_;
  size_t next_ = 0, ordered_ = 0, chunk_ = 1024;
};

// Greedy NMS in score order: at most `limit` proposals kept into work->kept, out of at most
// params.pre_nms_top_n (0: all) that survive clipping, the minimum size and the valid range. Order:
// higher score first; equal scores by anchor index (exact) or by the kernel's positional rule, which
// depends on the swaps of earlier selections (reference). Anchors are decoded only when the ranking
// reaches them.
template <class R>
void SelectProposals(const ProposalTargetParams& params, const std::vector<Box>& base_anchors, const ChipInputs& in,
                     int limit, ChipWorkspace* work) {
  using Real = typename R::Real;
  const int num_anchors = static_cast<int>(base_anchors.size());
  const int height = in.feat_height, width = in.feat_width;
  const int plane = height * width;
  const int32_t count = num_anchors * plane;

  std::vector<uint64_t>& keys = work->ranking;
  keys.clear();
  for (int a = 0; a < num_anchors; ++a) {
    const float* scores = in.cls_prob + static_cast<int64_t>(num_anchors + a) * plane;
    for (int cell = 0; cell < plane; ++cell) {
      if (!R::Scored(scores[cell])) continue;
      const int32_t index = R::AnchorIndex(a, cell / width, cell % width, num_anchors, height, width);
      keys.push_back((static_cast<uint64_t>(ScoreKey(scores[cell])) << 32) | (0xFFFFFFFFu - R::TieRank(index)));
    }
  }
  Ranking ranking(&keys);
  auto score_of = [](uint64_t key) { return static_cast<uint32_t>(key >> 32); };

  const float max_log_scale = R::MaxLogScale();
  // The next ranked anchor's proposal, or false when it does not survive the filters.
  auto next = [&](Proposal* proposal) {
    const int32_t index = R::IndexOfRank(0xFFFFFFFFu - static_cast<uint32_t>(ranking.pop()));
    int a, y, x;
    R::Cell(index, num_anchors, height, width, &a, &y, &x);
    const Box& base = base_anchors[a];
    const float shift_x = static_cast<float>(x * params.feature_stride);
    const float shift_y = static_cast<float>(y * params.feature_stride);
    const Box anchor{base.x1 + shift_x, base.y1 + shift_y, base.x2 + shift_x, base.y2 + shift_y};
    const float* deltas = in.bbox_pred + static_cast<int64_t>(4 * a) * plane + y * width + x;
    const Box box = Clip(Decode(anchor, deltas[0], deltas[plane], deltas[2 * plane], deltas[3 * plane], max_log_scale),
                         in.im_info[0], in.im_info[1]);
    *proposal = {index, box, R::AreaOf(box)};
    return R::KeepsSize(box, params.min_size) && R::ProposalInRange(box, in.valid_range);
  };
  size_t budget = params.pre_nms_top_n > 0 ? static_cast<size_t>(params.pre_nms_top_n) : keys.size();

  const Real threshold = R::Threshold(params.nms_threshold);
  std::vector<Real>& kept_area = R::KeptAreas(work);
  work->kept.clear();
  for (auto* column : {&work->kept_x1, &work->kept_y1, &work->kept_x2, &work->kept_y2}) column->clear();
  kept_area.clear();
  // Whether a kept box overlaps `proposal` above the threshold; blocks without early exits vectorise.
  auto suppressed = [&](const Proposal& proposal) {
    const float *x1 = work->kept_x1.data(), *y1 = work->kept_y1.data();
    const float *x2 = work->kept_x2.data(), *y2 = work->kept_y2.data();
    const Real* area = kept_area.data();
    const Real box_area = static_cast<Real>(proposal.area);
    const size_t num_kept = work->kept.size();
    for (size_t start = 0; start < num_kept; start += 32) {
      const size_t end = std::min(num_kept, start + 32);
      int hits = 0;
      for (size_t k = start; k < end; ++k) {
        hits |= R::Above(x1[k], y1[k], x2[k], y2[k], area[k], proposal.box, box_area, threshold);
      }
      if (hits) return true;
    }
    return false;
  };
  auto keep = [&](const Proposal& proposal) {
    if (R::kPositionalTies) {  // the kernel swaps the selected element into the slot it fills
      const int32_t slot = static_cast<int32_t>(work->kept.size());
      const int32_t from = work->position_of[proposal.index];
      const int32_t displaced = work->element_at[slot];
      work->element_at[from] = displaced;
      work->position_of[displaced] = from;
      work->element_at[slot] = proposal.index;
      work->position_of[proposal.index] = slot;
    }
    work->kept.push_back(proposal.box);
    work->kept_x1.push_back(proposal.box.x1);
    work->kept_y1.push_back(proposal.box.y1);
    work->kept_x2.push_back(proposal.box.x2);
    work->kept_y2.push_back(proposal.box.y2);
    kept_area.push_back(static_cast<Real>(proposal.area));
  };
  auto full = [&]() { return static_cast<int>(work->kept.size()) >= limit; };

  Proposal proposal;
  if (!R::kPositionalTies) {
    while (!ranking.empty() && budget > 0 && !full()) {
      if (!next(&proposal)) continue;
      --budget;
      if (!suppressed(proposal)) keep(proposal);
    }
    return;
  }

  work->element_at.resize(count);
  work->position_of.resize(count);
  for (int32_t i = 0; i < count; ++i) work->element_at[i] = work->position_of[i] = i;
  KernelTieOrder<Proposal>& group = work->tie_group;
  while (!ranking.empty() && budget > 0 && !full()) {
    // The remaining candidates at the best score, as far as the cap admits.
    const uint32_t score = score_of(ranking.front());
    group.Clear();
    while (!ranking.empty() && budget > 0 && score_of(ranking.front()) == score) {
      if (!next(&proposal)) continue;
      --budget;
      group.Insert(proposal, work->position_of[proposal.index]);
    }
    // Slot after slot the kernel takes its preferred unsuppressed member; checking a member against
    // the kept boxes only when it comes up gives the same choice as suppressing them all at once.
    while (!group.empty() && !full()) {
      const int32_t slot = static_cast<int32_t>(work->kept.size());
      const Proposal chosen = group.TakePreferred(slot);
      if (suppressed(chosen)) continue;
      const int32_t from = work->position_of[chosen.index];
      if (from != slot) group.Move(slot, from);  // the element keep() displaces may be a member
      keep(chosen);
    }
  }
}

Box GtBox(const float* row) { return {row[0], row[1], row[2], row[3]}; }

template <class R>
void ChipTargets(const ProposalTargetParams& params, const std::vector<Box>& base_anchors, int batch_index,
                 const ChipInputs& in, ChipOutputs out, ChipWorkspace* work) {
  const int num_rois = params.post_nms_top_n;

  // Real gt rows (class >= 0) in row order: all of them label the rois.
  std::vector<int> real_gts;
  for (int g = 0; g < in.num_gt; ++g) {
    if (in.gt_boxes[5 * g + 4] >= 0) real_gts.push_back(g);
  }
  const int num_real_gts = static_cast<int>(real_gts.size());

  // Exact: the in-range gts (at most R) follow the proposals. Reference: real gt j overwrites slot
  // R - n + j when it is in range (slots below 0 do not exist).
  std::vector<int> appended_gts;  // exact: gt rows in roi order; reference: the gt row of each slot or -1
  if (R::kLabelsPadding) {
    appended_gts.assign(num_rois, -1);
    for (int j = 0; j < num_real_gts; ++j) {
      const int slot = num_rois - num_real_gts + j;
      if (slot >= 0 && R::GtInRange(GtBox(in.gt_boxes + 5 * real_gts[j]), in.valid_range)) {
        appended_gts[slot] = real_gts[j];
      }
    }
  } else {
    for (int g : real_gts) {
      if (static_cast<int>(appended_gts.size()) < num_rois && R::GtInRange(GtBox(in.gt_boxes + 5 * g), in.valid_range)) {
        appended_gts.push_back(g);
      }
    }
  }

  SelectProposals<R>(params, base_anchors, in,
                     R::kLabelsPadding ? num_rois : num_rois - static_cast<int>(appended_gts.size()), work);

  // Rois. Exact: kept proposals, appended gts, then padding [0, 0, stride - 1, stride - 1] (label -1).
  // Reference: kept proposals, then [m, m, m + 200, m + 200] with m = (b * A*H*W + slot) % 100, the
  // appended gts overwriting their slots; every roi is labelled.
  std::vector<Box> rois(work->kept);
  rois.reserve(num_rois);
  int num_labelled = num_rois;
  if (R::kLabelsPadding) {
    const int64_t first = static_cast<int64_t>(batch_index) * base_anchors.size() * in.feat_height * in.feat_width;
    for (int slot = static_cast<int>(rois.size()); slot < num_rois; ++slot) {
      const float m = static_cast<float>((first + slot) % 100);
      rois.push_back({m, m, m + 200.0f, m + 200.0f});
    }
    for (int slot = 0; slot < num_rois; ++slot) {
      if (appended_gts[slot] >= 0) rois[slot] = GtBox(in.gt_boxes + 5 * appended_gts[slot]);
    }
  } else {
    for (int g : appended_gts) rois.push_back(GtBox(in.gt_boxes + 5 * g));
    num_labelled = static_cast<int>(rois.size());
    const float corner = static_cast<float>(params.feature_stride - 1);
    while (static_cast<int>(rois.size()) < num_rois) rois.push_back({0.0f, 0.0f, corner, corner});
  }

  std::vector<Box> gt_boxes;
  std::vector<double> gt_areas;
  for (int g : real_gts) {
    gt_boxes.push_back(GtBox(in.gt_boxes + 5 * g));
    gt_areas.push_back(R::AreaOf(gt_boxes.back()));
  }
  for (int r = 0; r < num_rois; ++r) {
    const Box& roi = rois[r];
    float* roi_row = out.rois + 5 * r;
    float* targets = out.bbox_targets + 4 * r;
    float* weights = out.bbox_weights + 4 * r;
    roi_row[0] = static_cast<float>(batch_index);
    roi_row[1] = roi.x1;
    roi_row[2] = roi.y1;
    roi_row[3] = roi.x2;
    roi_row[4] = roi.y2;
    std::fill(weights, weights + 4, 0.0f);
    if (r >= num_labelled) {  // exact rules' padding: ignored by the losses
      std::fill(targets, targets + 4, 0.0f);
      out.labels[r] = -1.0f;
      continue;
    }
    std::fill(targets, targets + 4, R::kUnsetTarget);
    // The first gt with the highest overlap, if that overlap passes the foreground threshold.
    const double roi_area = R::AreaOf(roi);
    int best = -1;
    float best_overlap = 0.0f;
    for (size_t g = 0; g < gt_boxes.size(); ++g) {
      const float overlap = R::LabelOverlap(roi, roi_area, gt_boxes[g], gt_areas[g]);
      if (R::Foreground(overlap, params.fg_thresh) && (best < 0 || overlap > best_overlap)) {
        best = static_cast<int>(g);
        best_overlap = overlap;
      }
    }
    if (best < 0) {
      out.labels[r] = 0.0f;
      continue;
    }
    out.labels[r] = in.gt_boxes[5 * real_gts[best] + 4];
    R::Targets(roi, gt_boxes[best], params.bbox_stds, targets);
    std::fill(weights, weights + 4, 1.0f);
  }
}

}  // namespace

void ChipProposalTargets(const ProposalTargetParams& params, const std::vector<Box>& base_anchors,
                         int batch_index, const ChipInputs& in, ChipOutputs out, ChipWorkspace* work) {
  if (params.rules == Rules::kReference) {
    ChipTargets<ReferenceRules>(params, base_anchors, batch_index, in, out, work);
  } else {
    ChipTargets<ExactRules>(params, base_anchors, batch_index, in, out, work);
  }
}

}  // namespace sniper
