// MaskRcnnTarget: the MXNet library-operator glue (lib_api.h) around PolygonMaskTarget.
//
// The reference fork's operator of that name, attribute for attribute (mask_rcnn_target-inl.h):
// Inputs  rois (B*num_proposals, 5) [b, x1, y1, x2, y2], mask_polys (B, max_num_gts, max_polygon_len)
//         (the loader's polygon encoding, -1 padded), mask_ids (B*num_proposals, 1) (gt row per roi,
//         -1: none), all float32; MultiProposalTargetMask's mask_rois / mask_ids are the rois / ids.
// Outputs mask_targets (B*num_proposals, M, M), mask_cls (B*num_proposals, M, M), M = mask_size.
// Per roi i with id g >= 0: targets = its gt's polygons rasterised on the roi's M x M grid (1 / 0),
// mask_cls = the encoding's category (its first number) in every cell; a roi with id -1 keeps
// ignore_label targets and class 0. The semantics are the fork's GPU forward (mask_rcnn_target.cu;
// its CPU forward is empty); where the fork reads out of bounds or crashes (an id or image index
// outside the input, a gt row without a well-formed polygon encoding) the roi is treated as id -1.
// batch_size, num_classes and workspace are accepted and unused, as in the fork's kernel (batch_size
// sized its host buffers; here the inputs' shapes do). No gradient: the backward writes zeros.
#include <string>
#include <vector>

#include "host_forward.h"
#include "mxnet/lib_api.h"
#include "op_attrs.h"
#include "polygon_mask.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using sniper::OpAttrs;

namespace {

constexpr char kOpName[] = "MaskRcnnTarget";
constexpr int kNumInputs = 3;
constexpr int kNumOutputs = 2;
const char* const kInputNames[kNumInputs] = {"rois", "mask_polys", "mask_ids"};

struct MaskTargetParams {
  int mask_size, ignore_label, num_proposals, max_polygon_len, max_num_gts;
};

// The fork's attributes and defaults.
const sniper::AttrDefaults kDefaults = {
    {"batch_size", "10"}, {"mask_size", "28"}, {"ignore_label", "-1"}, {"num_proposals", "50"},
    {"max_polygon_len", "500"}, {"max_num_gts", "100"}, {"num_classes", "80"}, {"workspace", "512"}};

std::string Value(const OpAttrs& attrs, const std::string& key) { return sniper::AttrValue(attrs, kDefaults, key); }

bool ParseParams(const OpAttrs& attrs, MaskTargetParams* params) {
  if (!sniper::OnlyKnownAttrs(kOpName, attrs, kDefaults)) return false;
  int unused = 0;
  const std::pair<const char*, int*> fields[] = {{"mask_size", &params->mask_size},
                                                 {"num_proposals", &params->num_proposals},
                                                 {"max_polygon_len", &params->max_polygon_len},
                                                 {"max_num_gts", &params->max_num_gts},
                                                 {"batch_size", &unused},
                                                 {"num_classes", &unused}};
  for (const auto& field : fields) {
    if (!sniper::ParseInt(Value(attrs, field.first), 1, 1 << 20, field.second)) {
      MX_ERROR_MSG << kOpName << ": attribute " << field.first << "='" << Value(attrs, field.first)
                   << "' must be a positive integer";
      return false;
    }
  }
  if (!sniper::ParseInt(Value(attrs, "workspace"), 0, 1 << 30, &unused)) {
    MX_ERROR_MSG << kOpName << ": attribute workspace='" << Value(attrs, "workspace") << "' must be an integer >= 0";
    return false;
  }
  if (!sniper::ParseInt(Value(attrs, "ignore_label"), -(1 << 30), 1 << 30, &params->ignore_label)) {
    MX_ERROR_MSG << kOpName << ": attribute ignore_label='" << Value(attrs, "ignore_label") << "' must be an integer";
    return false;
  }
  if (params->mask_size > 4096) {
    MX_ERROR_MSG << kOpName << ": attribute mask_size='" << params->mask_size << "' must be at most 4096";
    return false;
  }
  return true;
}

MXReturnValue inferShape(const OpAttrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  MaskTargetParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const auto& shapes = *in_shapes;
  const unsigned int proposals = static_cast<unsigned int>(params.num_proposals);
  unsigned int rows = 0;
  if (!shapes[1].empty()) rows = shapes[1][0] * proposals;
  for (int i : {0, 2}) {
    if (rows == 0 && !shapes[i].empty()) rows = shapes[i][0];
  }
  const std::string polys_layout = "(B, max_num_gts, max_polygon_len) = (B, " + std::to_string(params.max_num_gts) +
                                   ", " + std::to_string(params.max_polygon_len) + ")";
  const std::string rows_text = "B * num_proposals = B * " + std::to_string(params.num_proposals);
  if (!sniper::CheckInputShape(kOpName, kInputNames[1], shapes[1],
                               {0, static_cast<unsigned int>(params.max_num_gts),
                                static_cast<unsigned int>(params.max_polygon_len)},
                               polys_layout) ||
      !sniper::CheckInputShape(kOpName, kInputNames[0], shapes[0], {rows, 5}, "(" + rows_text + ", 5)")) {
    return MX_FAIL;
  }
  const bool ids_flat = shapes[2].size() == 1;
  if (!sniper::CheckInputShape(kOpName, kInputNames[2], shapes[2], ids_flat ? std::vector<unsigned int>{rows}
                                                                            : std::vector<unsigned int>{rows, 1},
                               "(" + rows_text + ", 1)")) {
    return MX_FAIL;
  }
  if (shapes[1].empty()) return MX_SUCCESS;  // the fork, too, waits for mask_polys' shape
  const unsigned int size = static_cast<unsigned int>(params.mask_size);
  *out_shapes = {{rows, size, size}, {rows, size, size}};
  return MX_SUCCESS;
}

MXReturnValue ComputeOnHost(const OpAttrs& attrs, const std::vector<MXTensor>& tensors_in,
                            const std::vector<const float*>& inputs, const std::vector<float*>& outputs) {
  MaskTargetParams params{};
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  const int batch = static_cast<int>(tensors_in[1].shape[0]);
  const int rows = static_cast<int>(tensors_in[0].shape[0]);
  const int cells = params.mask_size * params.mask_size;
  const int64_t row_len = params.max_polygon_len;
  const float* rois = inputs[0];
  const float* polys = inputs[1];
  const float* ids = inputs[2];
#pragma omp parallel
  {
    std::vector<uint8_t> grid;
    std::vector<int> work;
#pragma omp for schedule(dynamic, 4)
    for (int i = 0; i < rows; ++i) {
      float* targets = outputs[0] + static_cast<int64_t>(i) * cells;
      float* classes = outputs[1] + static_cast<int64_t>(i) * cells;
      const float id = ids[i];
      const float image = rois[5 * i];
      bool done = false;
      // (int) truncation as the fork converts both; -1 (and anything outside the input) has no mask.
      if (id > -1 && id < params.max_num_gts && image > -1 && image < batch) {
        const float* poly = polys + (static_cast<int64_t>(image) * params.max_num_gts + static_cast<int64_t>(id)) * row_len;
        done = sniper::PolygonMaskTarget(rois + 5 * i, poly, params.max_polygon_len, params.mask_size, targets, &grid,
                                         &work);
        if (done) std::fill(classes, classes + cells, poly[0]);
      }
      if (!done) {
        std::fill(targets, targets + cells, static_cast<float>(params.ignore_label));
        std::fill(classes, classes + cells, 0.0f);
      }
    }
  }
  return MX_SUCCESS;
}

}  // namespace

SNIPER_REGISTER_HOST_OP(MaskRcnnTarget, MaskTargetParams);
