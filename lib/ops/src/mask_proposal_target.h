// MultiProposalTargetMask's computation, free of MXNet types: the reference fork's GPU operator
// (multi_proposal_target_mask.cu, the code the published mask training ran; its CPU forward is empty)
// per chip, then the batch-wide choice of the mask rois. lib/ops/__init__.py states the semantics,
// dev/oracles/mask_target.py transcribes the same kernels in NumPy.
#ifndef SNIPER_OPS_MASK_PROPOSAL_TARGET_H_
#define SNIPER_OPS_MASK_PROPOSAL_TARGET_H_

#include <vector>

#include "box_math.h"
#include "proposal_target.h"

namespace sniper {

struct MaskProposalParams {
  int feature_stride;
  std::vector<float> scales;  // float32 like the fork's nnvm::Tuple<float>
  std::vector<float> ratios;
  int pre_nms_top_n;   // candidates entering NMS (the fork: 6000 whatever the attribute); 0: all
  int post_nms_top_n;  // rois per chip R
  double nms_threshold;  // the fork: 0.7 whatever the attribute
  int max_gts;         // gt rows per chip (the fork's stride into gt_boxes)
  int max_masks;       // mask rois per chip on average: the batch gets B * max_masks

  int num_anchors() const { return static_cast<int>(scales.size() * ratios.size()); }
};

// The fork's GenerateAnchors on the base box [0, 0, stride - 1, stride - 1], in its float32
// arithmetic (floor(size / ratio), floor(x + 0.5)); ratio-major.
std::vector<Box> ForkAnchors(int stride, const std::vector<float>& ratios, const std::vector<float>& scales);

struct ScoredIndex {
  float score;
  int index;
};

// Scratch reused across the chips one thread handles.
struct MaskChipWorkspace {
  std::vector<Box> boxes;
  std::vector<float> scores, areas;
  std::vector<ScoredIndex> order;
  std::vector<Box> kept;
  std::vector<float> kept_x1, kept_y1, kept_x2, kept_y2, kept_areas;  // for the vectorisable overlap scan
};

// One chip: rois, labels, targets, weights as the fork's kernels leave them, and for each of the R rois
// the gt row whose class it took (-1 where it is not a positive), the fork's maxids.
void ChipMaskProposalTargets(const MaskProposalParams& params, const std::vector<Box>& anchors, int batch_index,
                             const ChipInputs& in, ChipOutputs out, float* matched_gt, MaskChipWorkspace* work);

// The fork's mask rois over the whole batch: the rows (all chips' R rois in order) with label > 0,
// their roi and matched gt row, at most B * max_masks; the rest padded with
// [i % B, i % 200, i % 200, i % 200 + 100, i % 200 + 100] and id -1.
void CollectMaskRois(int batch, int rows, const float* rois, const float* labels, const float* matched_gt,
                     int max_masks, float* mask_rois, float* mask_ids);

}  // namespace sniper

#endif  // SNIPER_OPS_MASK_PROPOSAL_TARGET_H_
