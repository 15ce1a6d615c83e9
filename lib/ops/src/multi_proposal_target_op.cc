// MultiProposalTarget: the MXNet library-operator glue (lib_api.h) around ChipProposalTargets.
//
// Inputs  cls_prob (B, 2A, H, W), bbox_pred (B, 4A, H, W), im_info (B, 3), gt_boxes (B, G, 5),
//         valid_ranges (B, 2), all float32.
// Outputs rois (B*R, 5), labels (B*R,), bbox_targets (B*R, 4), bbox_weights (B*R, 4) with
//         R = rpn_post_nms_top_n; chip b owns rows b*R .. b*R + R - 1.
// No gradient flows to the inputs: the backward writes zeros. Every attribute is required (the rule
// set "reference" or "exact" included); lib/ops/__init__.py describes the semantics.
//
// The forward runs on the host. It is registered for "cpu"; with -DSNIPER_WITH_CUDA (and the CUDA
// runtime on the include/link path) a "gpu" forward copies the inputs to the host, computes there
// and copies the outputs back (the reference's GPU operator, too, assigned the targets on the host).
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "host_forward.h"
#include "mxnet/lib_api.h"
#include "op_attrs.h"
#include "proposal_target.h"

using mxnet::ext::MXContext;
using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using sniper::ParseNumber;
using sniper::ParseNumberList;
using sniper::ProposalTargetParams;
using sniper::ShapeString;

namespace {

constexpr char kOpName[] = "MultiProposalTarget";
constexpr int kNumInputs = 5;
constexpr int kNumOutputs = 4;
const char* const kInputNames[kNumInputs] = {"cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges"};
using Attrs = sniper::OpAttrs;

std::ostream& AttrError(const std::string& key, const std::string& value) {
  return MX_ERROR_MSG << kOpName << ": attribute " << key << "='" << value << "' ";
}

// Every attribute is required: the config (lib.ops.proposal_target_attrs) is their one source, so a
// graph built without one fails here instead of training with a silent default.
const char* const kAttributeNames[] = {"rules", "feature_stride", "scales", "ratios", "rpn_pre_nms_top_n",
                                       "rpn_post_nms_top_n", "threshold", "rpn_min_size", "fg_thresh",
                                       "bbox_stds"};

std::string KnownAttributes() {
  std::string names;
  for (const char* name : kAttributeNames) names += std::string(names.empty() ? "" : ", ") + name;
  return names;
}

// Attribute strings -> params; every problem names the attribute and its value.
bool ParseParams(const Attrs& attrs, ProposalTargetParams* params) {
  for (const char* name : kAttributeNames) {
    if (attrs.count(name) == 0) {
      MX_ERROR_MSG << kOpName << ": attribute " << name << " is missing (every one of " << KnownAttributes()
                   << " must be given; lib.ops.proposal_target_attrs(cfg) gives them all)";
      return false;
    }
  }
  for (const auto& kv : attrs) {
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    if (key.rfind("__", 0) == 0) continue;  // MXNet's own bookkeeping (__ext_dtype__, __ctx_group__...)
    if (key == "rules") {
      if (value != "reference" && value != "exact") {
        AttrError(key, value) << "must be reference or exact";
        return false;
      }
      params->rules = value == "reference" ? sniper::Rules::kReference : sniper::Rules::kExact;
      continue;
    }
    double number = 0;
    std::vector<double> list;
    if (key == "scales" || key == "ratios" || key == "bbox_stds") {
      if (!ParseNumberList(value, &list)) {
        AttrError(key, value) << "is not a list of numbers";
        return false;
      }
      for (double v : list) {
        if (!(v > 0)) {
          AttrError(key, value) << "must hold positive numbers";
          return false;
        }
      }
      if (key == "bbox_stds") {
        if (list.size() != 4) {
          AttrError(key, value) << "must hold 4 numbers";
          return false;
        }
        for (int i = 0; i < 4; ++i) params->bbox_stds[i] = list[i];
      } else {
        (key == "scales" ? params->scales : params->ratios) = list;
      }
      continue;
    }
    const bool is_int = key == "feature_stride" || key == "rpn_pre_nms_top_n" || key == "rpn_post_nms_top_n";
    const bool is_real = key == "threshold" || key == "rpn_min_size" || key == "fg_thresh";
    if (!is_int && !is_real) {
      MX_ERROR_MSG << kOpName << ": unknown attribute " << key << "='" << value << "' (known: " << KnownAttributes()
                   << ")";
      return false;
    }
    if (!ParseNumber(value, &number)) {
      AttrError(key, value) << "is not a number";
      return false;
    }
    if (key == "rpn_pre_nms_top_n") {
      if (!(number >= 0 && number <= 1e7 && number == static_cast<int>(number))) {
        AttrError(key, value) << "must be an integer >= 0 (0: no cap)";
        return false;
      }
      params->pre_nms_top_n = static_cast<int>(number);
      continue;
    }
    if (is_int && !(number >= 1 && number <= 1e7 && number == static_cast<int>(number))) {
      AttrError(key, value) << "must be a positive integer";
      return false;
    }
    if (key == "feature_stride") params->feature_stride = static_cast<int>(number);
    if (key == "rpn_post_nms_top_n") params->post_nms_top_n = static_cast<int>(number);
    if ((key == "threshold" || key == "fg_thresh") && !(number >= 0 && number <= 1)) {
      AttrError(key, value) << "must lie in [0, 1]";
      return false;
    }
    if (key == "rpn_min_size" && !(number >= 0)) {
      AttrError(key, value) << "must be >= 0";
      return false;
    }
    if (key == "threshold") params->nms_threshold = number;
    if (key == "fg_thresh") params->fg_thresh = number;
    if (key == "rpn_min_size") params->min_size = static_cast<float>(number);
  }
  return true;
}

MXReturnValue inferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  ProposalTargetParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const unsigned int anchors = static_cast<unsigned int>(params.num_anchors());
  unsigned int batch, height, width;
  if (!sniper::CheckProposalInputs(kOpName, kInputNames, *in_shapes, anchors, 0, "(B, G, 5)", &batch, &height,
                                   &width)) {
    return MX_FAIL;
  }
  if (static_cast<uint64_t>(anchors) * height * width >= (1u << 26)) {  // the tie ranks' range
    MX_ERROR_MSG << kOpName << ": " << anchors << " anchors on a " << height << " x " << width
                 << " feature map are too many (at most 2^26 - 1 per chip)";
    return MX_FAIL;
  }
  if (batch == 0) return MX_SUCCESS;  // outputs stay unknown until the batch size is
  const unsigned int rows = batch * static_cast<unsigned int>(params.post_nms_top_n);
  (*out_shapes)[0] = {rows, 5};
  (*out_shapes)[1] = {rows};
  (*out_shapes)[2] = {rows, 4};
  (*out_shapes)[3] = {rows, 4};
  return MX_SUCCESS;
}

// The computation on host memory; `inputs` and `outputs` point at host copies of the tensors.
MXReturnValue ComputeOnHost(const Attrs& attrs, const std::vector<MXTensor>& tensors_in,
                            const std::vector<const float*>& inputs, const std::vector<float*>& outputs) {
  ProposalTargetParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const std::vector<sniper::Box> anchors = sniper::BaseAnchors(params.feature_stride, params.ratios, params.scales);
  // the feature map's size from bbox_pred (B, 4A, H, W): cls_prob may come as (B, 2, A*H, W), same memory
  const std::vector<int64_t>& box_shape = tensors_in[1].shape;
  const int batch = static_cast<int>(box_shape[0]);
  const int feat_height = static_cast<int>(box_shape[2]);
  const int feat_width = static_cast<int>(box_shape[3]);
  const int num_gt = static_cast<int>(tensors_in[3].shape[1]);
  const int64_t plane = static_cast<int64_t>(feat_height) * feat_width;
  const int64_t num_anchors = static_cast<int64_t>(anchors.size());
  const int64_t rois = params.post_nms_top_n;
  sniper::ChipWorkspace work;
  for (int b = 0; b < batch; ++b) {
    sniper::ChipInputs chip{inputs[0] + b * 2 * num_anchors * plane,
                            inputs[1] + b * 4 * num_anchors * plane,
                            feat_height,
                            feat_width,
                            inputs[2] + 3 * b,
                            inputs[3] + static_cast<int64_t>(5) * num_gt * b,
                            num_gt,
                            inputs[4] + 2 * b};
    sniper::ChipOutputs out{outputs[0] + 5 * rois * b, outputs[1] + rois * b, outputs[2] + 4 * rois * b,
                            outputs[3] + 4 * rois * b};
    sniper::ChipProposalTargets(params, anchors, b, chip, out, &work);
  }
  return MX_SUCCESS;
}

}  // namespace

SNIPER_REGISTER_HOST_OP(MultiProposalTarget, ProposalTargetParams);

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "libsniper_ops needs MXNet >= 1.9.0, this is MXNet version code " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
