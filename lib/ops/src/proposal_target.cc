// Per-chip proposal target: decode, filter, top-N, NMS, append valid gts, label, encode.
#include "proposal_target.h"

#include <algorithm>
#include <cmath>

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

// Decodes every anchor of the chip and keeps, in anchor order (h, w, a), the ones that survive
// clipping, the minimum size and the valid range.
void CollectCandidates(const ProposalTargetParams& params, const std::vector<Box>& base_anchors,
                       const ChipInputs& in, ChipWorkspace* work) {
  const int num_anchors = static_cast<int>(base_anchors.size());
  const int plane = in.feat_height * in.feat_width;
  const float im_height = in.im_info[0];
  const float im_width = in.im_info[1];
  const double lo = in.valid_range[0];
  const double hi = in.valid_range[1];
  const float max_log_scale = MaxLogScale();
  work->boxes.clear();
  work->scores.clear();
  for (int y = 0; y < in.feat_height; ++y) {
    for (int x = 0; x < in.feat_width; ++x) {
      const int cell = y * in.feat_width + x;
      const float shift_x = static_cast<float>(x * params.feature_stride);
      const float shift_y = static_cast<float>(y * params.feature_stride);
      for (int a = 0; a < num_anchors; ++a) {
        const Box& base = base_anchors[a];
        const Box anchor{base.x1 + shift_x, base.y1 + shift_y, base.x2 + shift_x, base.y2 + shift_y};
        const float* deltas = in.bbox_pred + static_cast<int64_t>(4 * a) * plane + cell;
        const Box box = Clip(Decode(anchor, deltas[0], deltas[plane], deltas[2 * plane], deltas[3 * plane],
                                    max_log_scale),
                             im_height, im_width);
        if (!(Width(box) >= params.min_size && Height(box) >= params.min_size)) continue;
        if (!InValidRange(box, lo, hi)) continue;
        work->boxes.push_back(box);
        work->scores.push_back(in.cls_prob[static_cast<int64_t>(num_anchors + a) * plane + cell]);
      }
    }
  }
}

// Candidate indices of the top `pre_nms_top_n` scores, best first; equal scores keep anchor order
// and NaN scores sort last (NumPy's stable argsort of -score).
void SortCandidates(const ProposalTargetParams& params, ChipWorkspace* work) {
  const std::vector<float>& scores = work->scores;
  std::vector<int32_t>& order = work->order;
  order.resize(scores.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  auto before = [&scores](int32_t i, int32_t j) {
    const float si = scores[i], sj = scores[j];
    const bool nan_i = std::isnan(si), nan_j = std::isnan(sj);
    if (nan_i != nan_j) return nan_j;
    if (!nan_i && si != sj) return si > sj;
    return i < j;
  };
  const size_t top = std::min(order.size(), static_cast<size_t>(params.pre_nms_top_n));
  if (top < order.size()) {
    std::nth_element(order.begin(), order.begin() + top, order.end(), before);
    order.resize(top);
  }
  std::sort(order.begin(), order.end(), before);
}

// Greedy NMS over the sorted candidates, stopping once `limit` boxes are kept: a candidate survives
// when no kept box overlaps it by more than the threshold.
void NonMaximumSuppression(const ProposalTargetParams& params, int limit, ChipWorkspace* work) {
  const std::vector<Box>& boxes = work->boxes;
  std::vector<double>& areas = work->areas;
  areas.resize(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) areas[i] = Area(boxes[i]);
  work->kept.clear();
  for (int32_t candidate : work->order) {
    if (static_cast<int>(work->kept.size()) >= limit) break;
    bool suppressed = false;
    for (int32_t k : work->kept) {
      if (IoU(boxes[k], areas[k], boxes[candidate], areas[candidate]) > params.nms_threshold) {
        suppressed = true;
        break;
      }
    }
    if (!suppressed) work->kept.push_back(candidate);
  }
}

Box GtBox(const float* row) { return {row[0], row[1], row[2], row[3]}; }

}  // namespace

void ChipProposalTargets(const ProposalTargetParams& params, const std::vector<Box>& base_anchors,
                         int batch_index, const ChipInputs& in, ChipOutputs out, ChipWorkspace* work) {
  const int num_rois = params.post_nms_top_n;
  const double lo = in.valid_range[0];
  const double hi = in.valid_range[1];

  // Gts: all non-padding rows label the rois; the valid ones also become rois.
  std::vector<int> labelled_gts, valid_gts;
  for (int g = 0; g < in.num_gt; ++g) {
    const float* row = in.gt_boxes + 5 * g;
    if (!(row[4] >= 0)) continue;
    labelled_gts.push_back(g);
    if (InValidRange(GtBox(row), lo, hi) && static_cast<int>(valid_gts.size()) < num_rois) valid_gts.push_back(g);
  }
  const int num_valid_gts = static_cast<int>(valid_gts.size());

  CollectCandidates(params, base_anchors, in, work);
  SortCandidates(params, work);
  NonMaximumSuppression(params, num_rois - num_valid_gts, work);

  // Rois: kept proposals, then the valid gts, then padding.
  std::vector<Box> rois;
  rois.reserve(num_rois);
  for (int32_t k : work->kept) rois.push_back(work->boxes[k]);
  for (int g : valid_gts) rois.push_back(GtBox(in.gt_boxes + 5 * g));
  const int num_real = static_cast<int>(rois.size());

  std::vector<Box> gt_boxes;
  std::vector<double> gt_areas;
  for (int g : labelled_gts) {
    gt_boxes.push_back(GtBox(in.gt_boxes + 5 * g));
    gt_areas.push_back(Area(gt_boxes.back()));
  }
  const float fg_thresh = static_cast<float>(params.fg_thresh);
  const float pad_corner = static_cast<float>(params.feature_stride - 1);
  for (int r = 0; r < num_rois; ++r) {
    float* roi_row = out.rois + 5 * r;
    float* targets = out.bbox_targets + 4 * r;
    float* weights = out.bbox_weights + 4 * r;
    std::fill(targets, targets + 4, 0.0f);
    std::fill(weights, weights + 4, 0.0f);
    roi_row[0] = static_cast<float>(batch_index);
    if (r >= num_real) {  // padding: a harmless stride-sized box in the corner, ignored by the losses
      roi_row[1] = roi_row[2] = 0.0f;
      roi_row[3] = roi_row[4] = pad_corner;
      out.labels[r] = -1.0f;
      continue;
    }
    const Box& roi = rois[r];
    roi_row[1] = roi.x1;
    roi_row[2] = roi.y1;
    roi_row[3] = roi.x2;
    roi_row[4] = roi.y2;
    // Best gt by IoU rounded to float32 (as bbox_overlaps returns it), first one on ties.
    const double roi_area = Area(roi);
    int best = -1;
    float best_iou = 0.0f;
    for (size_t g = 0; g < gt_boxes.size(); ++g) {
      const float iou = static_cast<float>(IoU(roi, roi_area, gt_boxes[g], gt_areas[g]));
      if (best < 0 || iou > best_iou) {
        best = static_cast<int>(g);
        best_iou = iou;
      }
    }
    if (best < 0 || !(best_iou > fg_thresh)) {
      out.labels[r] = 0.0f;
      continue;
    }
    out.labels[r] = in.gt_boxes[5 * labelled_gts[best] + 4];
    Encode(roi, gt_boxes[best], params.bbox_stds, targets);
    std::fill(weights, weights + 4, 1.0f);
  }
}

}  // namespace sniper
