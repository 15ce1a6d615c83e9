// Proposal generation and R-CNN target assignment for one chip (spec section 5), free of MXNet types
// so that the operator glue (multi_proposal_target_op.cc) only moves tensors in and out.
#ifndef SNIPER_OPS_PROPOSAL_TARGET_H_
#define SNIPER_OPS_PROPOSAL_TARGET_H_

#include <cstdint>
#include <vector>

#include "box_math.h"

namespace sniper {

struct ProposalTargetParams {
  int feature_stride = 16;
  std::vector<double> scales{2, 4, 7, 10, 13, 16, 24};
  std::vector<double> ratios{0.5, 1, 2};
  int pre_nms_top_n = 6000;
  int post_nms_top_n = 300;  // rois per chip
  double nms_threshold = 0.7;
  float min_size = 3.0f;
  double fg_thresh = 0.5;
  float bbox_stds[4] = {0.1f, 0.1f, 0.2f, 0.2f};

  int num_anchors() const { return static_cast<int>(scales.size() * ratios.size()); }
};

// The per-cell anchors of lib/boxes/anchors.py base_anchors: ratio-major, row r * S + s.
std::vector<Box> BaseAnchors(int stride, const std::vector<double>& ratios,
                             const std::vector<double>& scales);

// One chip's slices of the operator inputs (float32, C order).
struct ChipInputs {
  const float* cls_prob;      // (2A, H, W); foreground scores in channels A..2A-1
  const float* bbox_pred;     // (4A, H, W); anchor a's deltas in channels 4a..4a+3
  int feat_height, feat_width;
  const float* im_info;       // (3,) height, width, scale of the chip
  const float* gt_boxes;      // (num_gt, 5) x1, y1, x2, y2, class; class < 0 marks padding
  int num_gt;
  const float* valid_range;   // (2,) lo, hi of sqrt(area) in chip pixels, -1 open
};

// One chip's slices of the outputs, each post_nms_top_n rows.
struct ChipOutputs {
  float* rois;          // (R, 5) batch index, x1, y1, x2, y2
  float* labels;        // (R,)
  float* bbox_targets;  // (R, 4)
  float* bbox_weights;  // (R, 4)
};

// Scratch buffers reused across chips of one call.
struct ChipWorkspace {
  std::vector<Box> boxes;
  std::vector<float> scores;
  std::vector<int32_t> order;
  std::vector<double> areas;
  std::vector<int32_t> kept;
};

void ChipProposalTargets(const ProposalTargetParams& params, const std::vector<Box>& base_anchors,
                         int batch_index, const ChipInputs& in, ChipOutputs out,
                         ChipWorkspace* work);

}  // namespace sniper

#endif  // SNIPER_OPS_PROPOSAL_TARGET_H_
