// MultiProposalTargetMask per chip, as multi_proposal_target_mask.cu runs it: its proposal stage
// differs from MultiProposalTarget's kernel (the host sorts every anchor by score with std::sort, the
// best 6000 positions enter a plain greedy NMS; gts go in reversed order into the last slots under a
// strict upper bound; padding boxes [t % 100, ...]); its labels and targets are the same code.
#include "mask_proposal_target.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sniper {

std::vector<Box> ForkAnchors(int stride, const std::vector<float>& ratios, const std::vector<float>& scales) {
  const float w = static_cast<float>(stride), h = w;  // base box [0, 0, stride - 1, stride - 1]
  const float x_ctr = static_cast<float>(0.5 * (w - 1.0f));
  const float y_ctr = static_cast<float>(0.5 * (h - 1.0f));
  const float size = w * h;
  std::vector<Box> anchors;
  for (float ratio : ratios) {
    for (float scale : scales) {
      const float size_ratios = std::floor(size / ratio);
      const float new_w = std::floor(std::sqrt(size_ratios) + 0.5f) * scale;
      const float new_h = std::floor((new_w / scale * ratio) + 0.5f) * scale;
      anchors.push_back({x_ctr - 0.5f * (new_w - 1.0f), y_ctr - 0.5f * (new_h - 1.0f),
                         x_ctr + 0.5f * (new_w - 1.0f), y_ctr + 0.5f * (new_h - 1.0f)});
    }
  }
  return anchors;
}

namespace {

constexpr float kDropped = -1.0f;   // the fork's score of a filtered or suppressed box
constexpr float kMinSize = 3.0f;    // the fork's getPropsCu: fixed, the rpn_min_size attribute unused
constexpr double kFgThresh = 0.5;   // label overlap threshold, fixed in the fork
const double kStds[4] = {0.1, 0.1, 0.2, 0.2};  // the fork's literals 10, 10, 5, 5 as 1 / stds

// area < lo^2 or area >= hi^2 drops a proposal; -1 (the project loader's open end) is open.
bool ProposalAreaInRange(float area, const float* range) {
  return (IsOpen(range[0]) || !(area < range[0] * range[0])) && (IsOpen(range[1]) || !(area >= range[1] * range[1]));
}

// lo^2 <= area < hi^2 admits a gt into its slot (the mask kernel's bound; MultiProposalTarget's is <=).
bool GtAreaInRange(float area, const float* range) {
  return (IsOpen(range[0]) || area >= range[0] * range[0]) && (IsOpen(range[1]) || area < range[1] * range[1]);
}

}  // namespace

void ChipMaskProposalTargets(const MaskProposalParams& params, const std::vector<Box>& anchors, int batch_index,
                             const ChipInputs& in, ChipOutputs out, float* matched_gt, MaskChipWorkspace* work) {
  const int num_anchors = static_cast<int>(anchors.size());
  const int height = in.feat_height, width = in.feat_width, plane = height * width;
  const int count = num_anchors * plane;
  const int num_rois = params.post_nms_top_n;
  const float infinity = std::numeric_limits<float>::infinity();

  // getPropsCu: element a * H * W + y * W + x.
  work->boxes.resize(count);
  work->scores.resize(count);
  work->areas.resize(count);
  for (int a = 0; a < num_anchors; ++a) {
    for (int cell = 0; cell < plane; ++cell) {
      const int y = cell / width, x = cell % width;
      const int index = a * plane + cell;
      const float shift_x = static_cast<float>(x * params.feature_stride);
      const float shift_y = static_cast<float>(y * params.feature_stride);
      const Box anchor{anchors[a].x1 + shift_x, anchors[a].y1 + shift_y, anchors[a].x2 + shift_x,
                       anchors[a].y2 + shift_y};
      const float* deltas = in.bbox_pred + static_cast<int64_t>(4 * a) * plane + cell;
      const Box box = Clip(Decode(anchor, deltas[0], deltas[plane], deltas[2 * plane], deltas[3 * plane], infinity),
                           in.im_info[0], in.im_info[1]);
      float score = in.cls_prob[static_cast<int64_t>(num_anchors + a) * plane + cell];
      const float area = AreaNoPlusOne(box);
      // NaN scores have no place in the fork's sort (undefined there): dropped here.
      if (std::isnan(score) || (box.y2 - box.y1 < kMinSize && box.x2 - box.x1 < kMinSize) ||
          !ProposalAreaInRange(area, in.valid_range)) {
        score = kDropped;
      }
      work->boxes[index] = box;
      work->scores[index] = score;
      work->areas[index] = area;
    }
  }

  // The host's std::sort of the element indices by descending score: the same call on the same sequence
  // gives the fork's order, ties included (libstdc++'s introsort; dev/oracles/mask_target.py transcribes it).
  // The scores travel with the indices: the comparisons, hence the moves, are the fork's.
  std::vector<ScoredIndex>& order = work->order;
  order.resize(count);
  for (int i = 0; i < count; ++i) order[i] = {work->scores[i], i};
  std::sort(order.begin(), order.end(), [](const ScoredIndex& a, const ScoredIndex& b) { return a.score > b.score; });
  const float* scores = work->scores.data();

  // NonMaximumSuppressionCu: the first min(pre_nms_top_n, count) positions, greedy; a box is suppressed
  // when its overlap (+1 intersection, no-+1 areas, float32) with a kept one is > the threshold (double).
  const int candidates = params.pre_nms_top_n > 0 ? std::min(params.pre_nms_top_n, count) : count;
  // A float32 overlap o is > the double threshold exactly when o > the largest float <= it.
  float threshold = static_cast<float>(params.nms_threshold);
  if (static_cast<double>(threshold) > params.nms_threshold) threshold = std::nextafter(threshold, -1.0f);
  work->kept.clear();
  for (auto* column : {&work->kept_x1, &work->kept_y1, &work->kept_x2, &work->kept_y2, &work->kept_areas}) {
    column->clear();
  }
  // Whether a kept box overlaps `box` above the threshold; blocks without early exits vectorise.
  auto suppressed = [&](const Box& box, float area) {
    const float *x1 = work->kept_x1.data(), *y1 = work->kept_y1.data();
    const float *x2 = work->kept_x2.data(), *y2 = work->kept_y2.data(), *kept_area = work->kept_areas.data();
    const size_t num_kept = work->kept.size();
    for (size_t start = 0; start < num_kept; start += 32) {
      const size_t end = std::min(num_kept, start + 32);
      int hits = 0;
      for (size_t k = start; k < end; ++k) {
        hits |= InflatedOverlap({x1[k], y1[k], x2[k], y2[k]}, kept_area[k], box, area) > threshold;
      }
      if (hits) return true;
    }
    return false;
  };
  for (int p = 0; p < candidates && static_cast<int>(work->kept.size()) < num_rois; ++p) {
    const int i = order[p].index;
    if (scores[i] == kDropped) continue;
    const Box& box = work->boxes[i];
    if (suppressed(box, work->areas[i])) continue;
    work->kept.push_back(box);
    work->kept_x1.push_back(box.x1);
    work->kept_y1.push_back(box.y1);
    work->kept_x2.push_back(box.x2);
    work->kept_y2.push_back(box.y2);
    work->kept_areas.push_back(work->areas[i]);
  }

  // Rois: kept boxes, then [t % 100, t % 100, t % 100 + 200, t % 100 + 200]; gt row t (class != -1,
  // lo^2 <= area < hi^2) overwrites slot R - 1 - t, for t < min(R, max_gts).
  std::vector<Box> rois(work->kept);
  for (int t = static_cast<int>(rois.size()); t < num_rois; ++t) {
    const float m = static_cast<float>(t % 100);
    rois.push_back({m, m, m + 200.0f, m + 200.0f});
  }
  for (int t = 0; t < std::min(num_rois, params.max_gts); ++t) {
    const float* row = in.gt_boxes + 5 * t;
    const Box gt{row[0], row[1], row[2], row[3]};
    if (row[4] != -1.0f && GtAreaInRange(AreaNoPlusOne(gt), in.valid_range)) rois[num_rois - 1 - t] = gt;
  }

  // Labels: the first n gt rows, n = rows whose class is not -1; per roi the first gt with the highest
  // overlap > 0.5 gives its class; every roi is labelled (0 = background), targets 1 where not positive.
  int num_gts = 0;
  for (int g = 0; g < params.max_gts; ++g) num_gts += in.gt_boxes[5 * g + 4] != -1.0f;
  std::vector<float> best(num_rois, 0.0f);
  for (int r = 0; r < num_rois; ++r) {
    float* row = out.rois + 5 * r;
    row[0] = static_cast<float>(batch_index);
    row[1] = rois[r].x1;
    row[2] = rois[r].y1;
    row[3] = rois[r].x2;
    row[4] = rois[r].y2;
    out.labels[r] = 0.0f;
    matched_gt[r] = -1.0f;
    std::fill(out.bbox_targets + 4 * r, out.bbox_targets + 4 * r + 4, 1.0f);
    std::fill(out.bbox_weights + 4 * r, out.bbox_weights + 4 * r + 4, 0.0f);
  }
  for (int g = 0; g < num_gts; ++g) {
    const float* row = in.gt_boxes + 5 * g;
    const Box gt{row[0], row[1], row[2], row[3]};
    const float gt_area = AreaNoPlusOne(gt);
    for (int r = 0; r < num_rois; ++r) {
      const float overlap = InflatedOverlap(gt, gt_area, rois[r], AreaNoPlusOne(rois[r]));
      if (overlap > best[r] && overlap > kFgThresh) {
        best[r] = overlap;
        matched_gt[r] = static_cast<float>(g);
        out.labels[r] = row[4];
      }
    }
  }
  for (int r = 0; r < num_rois; ++r) {
    if (matched_gt[r] < 0) continue;
    const float* row = in.gt_boxes + 5 * static_cast<int>(matched_gt[r]);
    EncodeReference(rois[r], {row[0], row[1], row[2], row[3]}, kStds, out.bbox_targets + 4 * r);
    std::fill(out.bbox_weights + 4 * r, out.bbox_weights + 4 * r + 4, 1.0f);
  }
}

void CollectMaskRois(int batch, int rows, const float* rois, const float* labels, const float* matched_gt,
                     int max_masks, float* mask_rois, float* mask_ids) {
  const int capacity = batch * max_masks;
  int count = 0;
  for (int i = 0; i < rows && count < capacity; ++i) {
    if (!(labels[i] > 0)) continue;
    std::copy(rois + 5 * i, rois + 5 * i + 5, mask_rois + 5 * count);
    mask_ids[count] = matched_gt[i];
    ++count;
  }
  for (int i = count; i < capacity; ++i) {
    const float m = static_cast<float>(i % 200);
    float* row = mask_rois + 5 * i;
    row[0] = static_cast<float>(i % batch);
    row[1] = m;
    row[2] = m;
    row[3] = m + 100.0f;
    row[4] = m + 100.0f;
    mask_ids[i] = -1.0f;
  }
}

}  // namespace sniper
