// MultiProposalTargetMask: the MXNet library-operator glue (lib_api.h) around ChipMaskProposalTargets.
//
// The reference fork's operator of that name, attribute for attribute (names and defaults of
// multi_proposal_target_mask-inl.h):
// Inputs  cls_prob (B, 2A, H, W), bbox_pred (B, 4A, H, W), im_info (B, 3), gt_boxes (B, max_gts, 5),
//         valid_ranges (B, 2), all float32.
// Outputs rois (B*R, 5), label (B*R, 1), bbox_target (B*R, 4), bbox_weight (B*R, 4),
//         mask_rois (B*max_masks, 5), mask_ids (B*max_masks, 1), R = rpn_post_nms_top_n.
// Semantics: the fork's GPU forward (multi_proposal_target_mask.cu; its CPU forward is empty), see
// mask_proposal_target.h and lib/ops/__init__.py. Attributes the fork's kernels do not read are
// accepted and have no effect here either: rpn_min_size (the kernel's minimum is 3), batch_size (it
// sized the fork's host buffers), bbox_scale, max_crowd, workspace. rpn_pre_nms_top_n and threshold,
// fixed at 6000 and 0.7 in the kernel, are read here; their defaults are those values.
// No gradient flows to the inputs: the backward writes zeros. The forward runs on the host; with
// -DSNIPER_WITH_CUDA a "gpu" forward copies the inputs to the host and the outputs back, as the fork did.
#include <string>
#include <vector>

#include "host_forward.h"
#include "mask_proposal_target.h"
#include "mxnet/lib_api.h"
#include "op_attrs.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using sniper::OpAttrs;

namespace {

constexpr char kOpName[] = "MultiProposalTargetMask";
constexpr int kNumInputs = 5;
constexpr int kNumOutputs = 6;
const char* const kInputNames[kNumInputs] = {"cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges"};

// The fork's attributes and defaults.
const sniper::AttrDefaults kDefaults = {
    {"rpn_pre_nms_top_n", "6000"}, {"rpn_post_nms_top_n", "300"}, {"threshold", "0.7"},
    {"batch_size", "16"}, {"max_masks", "50"}, {"max_gts", "100"}, {"max_crowd", "10"},
    {"bbox_scale", "1"}, {"rpn_min_size", "4"}, {"scales", "(2, 4, 7, 10, 13, 16, 24)"},
    {"ratios", "(0.5, 1, 2)"}, {"feature_stride", "16"}, {"workspace", "128"}};

std::string Value(const OpAttrs& attrs, const std::string& key) { return sniper::AttrValue(attrs, kDefaults, key); }

bool Fail(const std::string& key, const std::string& value, const char* rule) {
  MX_ERROR_MSG << kOpName << ": attribute " << key << "='" << value << "' " << rule;
  return false;
}

bool ParseParams(const OpAttrs& attrs, sniper::MaskProposalParams* params) {
  if (!sniper::OnlyKnownAttrs(kOpName, attrs, kDefaults)) return false;
  int unused = 0;
  double number = 0;
  for (const char* key : {"batch_size", "max_crowd", "workspace"}) {
    if (!sniper::ParseInt(Value(attrs, key), 0, 1 << 30, &unused)) return Fail(key, Value(attrs, key), "must be an integer >= 0");
  }
  for (const char* key : {"bbox_scale", "rpn_min_size"}) {
    if (!sniper::ParseNumber(Value(attrs, key), &number)) return Fail(key, Value(attrs, key), "is not a number");
  }
  if (!sniper::ParseInt(Value(attrs, "rpn_pre_nms_top_n"), 0, 10000000, &params->pre_nms_top_n))
    return Fail("rpn_pre_nms_top_n", Value(attrs, "rpn_pre_nms_top_n"), "must be an integer >= 0 (0: no cap)");
  const std::pair<const char*, int*> positive[] = {{"rpn_post_nms_top_n", &params->post_nms_top_n},
                                                   {"feature_stride", &params->feature_stride},
                                                   {"max_gts", &params->max_gts},
                                                   {"max_masks", &params->max_masks}};
  for (const auto& entry : positive) {
    if (!sniper::ParseInt(Value(attrs, entry.first), 1, 10000000, entry.second))
      return Fail(entry.first, Value(attrs, entry.first), "must be a positive integer");
  }
  if (!sniper::ParseNumber(Value(attrs, "threshold"), &params->nms_threshold) ||
      !(params->nms_threshold >= 0 && params->nms_threshold <= 1))
    return Fail("threshold", Value(attrs, "threshold"), "must be a number in [0, 1]");
  for (const char* key : {"scales", "ratios"}) {
    std::vector<double> list;
    if (!sniper::ParseNumberList(Value(attrs, key), &list)) return Fail(key, Value(attrs, key), "is not a list of numbers");
    std::vector<float>& out = std::string(key) == "scales" ? params->scales : params->ratios;
    out.clear();
    for (double v : list) {
      if (!(v > 0)) return Fail(key, Value(attrs, key), "must hold positive numbers");
      out.push_back(static_cast<float>(v));
    }
  }
  return true;
}

MXReturnValue inferShape(const OpAttrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  sniper::MaskProposalParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const unsigned int anchors = static_cast<unsigned int>(params.num_anchors());
  const unsigned int max_gts = static_cast<unsigned int>(params.max_gts);
  unsigned int batch, height, width;
  if (!sniper::CheckProposalInputs(kOpName, kInputNames, *in_shapes, anchors, max_gts,
                                   "(B, max_gts, 5) with max_gts = " + std::to_string(max_gts), &batch, &height,
                                   &width)) {
    return MX_FAIL;
  }
  if (static_cast<uint64_t>(anchors) * height * width >= (1u << 30)) {
    MX_ERROR_MSG << kOpName << ": " << anchors << " anchors on a " << height << " x " << width
                 << " feature map are too many";
    return MX_FAIL;
  }
  if (batch == 0) return MX_SUCCESS;  // outputs stay unknown until the batch size is
  const unsigned int rows = batch * static_cast<unsigned int>(params.post_nms_top_n);
  const unsigned int masks = batch * static_cast<unsigned int>(params.max_masks);
  *out_shapes = {{rows, 5}, {rows, 1}, {rows, 4}, {rows, 4}, {masks, 5}, {masks, 1}};
  return MX_SUCCESS;
}

MXReturnValue ComputeOnHost(const OpAttrs& attrs, const std::vector<MXTensor>& tensors_in,
                            const std::vector<const float*>& inputs, const std::vector<float*>& outputs) {
  sniper::MaskProposalParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const std::vector<sniper::Box> anchors = sniper::ForkAnchors(params.feature_stride, params.ratios, params.scales);
  // the feature map's size from bbox_pred (B, 4A, H, W): cls_prob may come as (B, 2, A*H, W), same memory
  const std::vector<int64_t>& box_shape = tensors_in[1].shape;
  const int batch = static_cast<int>(box_shape[0]);
  const int feat_height = static_cast<int>(box_shape[2]);
  const int feat_width = static_cast<int>(box_shape[3]);
  const int64_t plane = static_cast<int64_t>(feat_height) * feat_width;
  const int64_t num_anchors = static_cast<int64_t>(anchors.size());
  const int64_t rois = params.post_nms_top_n;
  std::vector<float> matched_gt(static_cast<size_t>(batch * rois));
#pragma omp parallel
  {
    sniper::MaskChipWorkspace work;
#pragma omp for schedule(dynamic, 1)
    for (int b = 0; b < batch; ++b) {
      sniper::ChipInputs chip{inputs[0] + b * 2 * num_anchors * plane,
                              inputs[1] + b * 4 * num_anchors * plane,
                              feat_height,
                              feat_width,
                              inputs[2] + 3 * b,
                              inputs[3] + static_cast<int64_t>(5) * params.max_gts * b,
                              params.max_gts,
                              inputs[4] + 2 * b};
      sniper::ChipOutputs out{outputs[0] + 5 * rois * b, outputs[1] + rois * b, outputs[2] + 4 * rois * b,
                              outputs[3] + 4 * rois * b};
      sniper::ChipMaskProposalTargets(params, anchors, b, chip, out, matched_gt.data() + rois * b, &work);
    }
  }
  sniper::CollectMaskRois(batch, static_cast<int>(batch * rois), outputs[0], outputs[1], matched_gt.data(),
                          params.max_masks, outputs[4], outputs[5]);
  return MX_SUCCESS;
}

}  // namespace

SNIPER_REGISTER_HOST_OP(MultiProposalTargetMask, sniper::MaskProposalParams);
