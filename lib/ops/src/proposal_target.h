// Proposal generation and R-CNN target assignment for one chip (spec section 5), free of MXNet types
// so that the operator glue (multi_proposal_target_op.cc) only moves tensors in and out.
#ifndef SNIPER_OPS_PROPOSAL_TARGET_H_
#define SNIPER_OPS_PROPOSAL_TARGET_H_

#include <cstdint>
#include <vector>

#include "box_math.h"
#include "kernel_tie_order.h"

namespace sniper {

// "reference": the published SNIPER's GPU operator; "exact": the project's true-IoU rules
// (lib/ops/__init__.py describes both).
enum class Rules { kReference, kExact };

// Every field comes from an operator attribute (the operator refuses a missing one).
struct ProposalTargetParams {
  Rules rules;
  int feature_stride;
  std::vector<double> scales;
  std::vector<double> ratios;
  int pre_nms_top_n;   // 0: no cap
  int post_nms_top_n;  // rois per chip
  double nms_threshold;
  float min_size;
  double fg_thresh;
  double bbox_stds[4];

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
  const float* valid_range;   // (2,) lo, hi in chip pixels, -1 open
};

// One chip's slices of the outputs, each post_nms_top_n rows.
struct ChipOutputs {
  float* rois;          // (R, 5) batch index, x1, y1, x2, y2
  float* labels;        // (R,)
  float* bbox_targets;  // (R, 4)
  float* bbox_weights;  // (R, 4)
};

// A decoded proposal: its anchor index, box and area (in the rules' convention).
struct Proposal {
  int32_t index;
  Box box;
  double area;
};

// Scratch buffers reused across chips of one call.
struct ChipWorkspace {
  std::vector<uint64_t> ranking;      // score, then the rules' preference among equal scores
  std::vector<Box> kept;              // kept proposals in slot order
  // The kept boxes by coordinate, for the vectorisable overlap scan; areas in the rules' precision.
  std::vector<float> kept_x1, kept_y1, kept_x2, kept_y2, kept_area_float;
  std::vector<double> kept_area_double;
  std::vector<int32_t> element_at, position_of;  // the reference kernel's array positions
  KernelTieOrder<Proposal> tie_group;            // candidates tied at one score
};

void ChipProposalTargets(const ProposalTargetParams& params, const std::vector<Box>& base_anchors,
                         int batch_index, const ChipInputs& in, ChipOutputs out,
                         ChipWorkspace* work);

}  // namespace sniper

#endif  // SNIPER_OPS_PROPOSAL_TARGET_H_
