// CompiledDeformablePSROIPooling: the lib_api glue around deformable_psroi_pooling.h.
//
// Attributes, inputs and outputs are those of MXNet's _contrib_DeformablePSROIPooling:
// inputs data (B, C, H, W), rois (R, 5) and, unless no_trans, trans (R, 2 * classes, part, part);
// outputs output and top_count, both (R, output_dim, pooled_size, pooled_size). The backward writes the
// data and trans gradients (rois get zeros). Host kernels only ("cpu").
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "deformable_psroi_pooling.h"
#include "mxnet/lib_api.h"
#include "op_attrs.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using sniper::PSROIPoolingParams;
using sniper::PSROIPoolingShape;

namespace {

constexpr const char* kOpName = "CompiledDeformablePSROIPooling";
constexpr const char* kKnown =
    "spatial_scale, output_dim, group_size, pooled_size, part_size, sample_per_part, trans_std, no_trans";
using Attrs = std::unordered_map<std::string, std::string>;

std::ostream& AttrError(const std::string& key, const std::string& value) {
  return MX_ERROR_MSG << kOpName << ": attribute " << key << "='" << value << "' ";
}

bool ParseParams(const Attrs& attrs, PSROIPoolingParams* params) {
  bool seen_scale = false, seen_dim = false, seen_group = false, seen_pooled = false;
  for (const auto& kv : attrs) {
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    if (key.rfind("__", 0) == 0) continue;  // MXNet's own bookkeeping (__ext_dtype__, __ctx_group__...)
    double number = 0;
    if (key == "spatial_scale" || key == "trans_std") {
      if (!sniper::ParseNumber(value, &number)) {
        AttrError(key, value) << "is not a number";
        return false;
      }
      const bool ok = key == "trans_std" ? number >= 0 && number <= 1 : number > 0 && number <= 1;
      if (!ok) {
        AttrError(key, value) << (key == "trans_std" ? "must lie in [0, 1]" : "must lie in (0, 1]");
        return false;
      }
      (key == "trans_std" ? params->trans_std : params->spatial_scale) = static_cast<float>(number);
      seen_scale |= key == "spatial_scale";
    } else if (key == "output_dim" || key == "group_size" || key == "pooled_size" || key == "part_size" ||
               key == "sample_per_part") {
      int count = 0;
      if (!sniper::ParseInt(value, key == "part_size" ? 0 : 1, 1 << 20, &count)) {
        AttrError(key, value) << (key == "part_size" ? "must be a whole number >= 0" : "must be a positive integer");
        return false;
      }
      if (key == "output_dim") params->output_dim = count, seen_dim = true;
      if (key == "group_size") params->group_size = count, seen_group = true;
      if (key == "pooled_size") params->pooled_size = count, seen_pooled = true;
      if (key == "part_size") params->part_size = count;
      if (key == "sample_per_part") params->sample_per_part = count;
    } else if (key == "no_trans") {
      if (!sniper::ParseBool(value, &params->no_trans)) {
        AttrError(key, value) << "is not a boolean";
        return false;
      }
    } else {
      MX_ERROR_MSG << kOpName << ": unknown attribute " << key << "='" << value << "' (known: " << kKnown << ")";
      return false;
    }
  }
  if (!(seen_scale && seen_dim && seen_group && seen_pooled)) {
    MX_ERROR_MSG << kOpName << ": attributes spatial_scale, output_dim, group_size and pooled_size are required";
    return false;
  }
  if (params->part_size == 0) params->part_size = params->pooled_size;
  return true;
}

int NumInputs(const PSROIPoolingParams& params) { return params.no_trans ? 2 : 3; }

MXReturnValue parseAttrs(const Attrs& attrs, int* num_inputs, int* num_outputs) {
  PSROIPoolingParams params;
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  *num_inputs = NumInputs(params);
  *num_outputs = 2;
  return MX_SUCCESS;
}

MXReturnValue inferType(const Attrs& attrs, std::vector<int>* in_types, std::vector<int>* out_types) {
  const char* names[] = {"data", "rois", "trans"};
  for (size_t i = 0; i < in_types->size(); ++i) {
    if ((*in_types)[i] != -1 && (*in_types)[i] != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << kOpName << ": input " << names[i] << " must be float32, got MXNet dtype code " << (*in_types)[i];
      return MX_FAIL;
    }
    (*in_types)[i] = mxnet::ext::kFloat32;
  }
  for (int& type : *out_types) type = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

bool ShapeError(const char* input, const std::vector<unsigned int>& shape, const std::string& expected) {
  MX_ERROR_MSG << kOpName << ": input " << input << " must have shape " << expected << ", got "
               << sniper::ShapeString(shape);
  return false;
}

// Checks the known input shapes; true when all are known and consistent (then *shape is filled).
bool CheckShapes(const PSROIPoolingParams& params, const std::vector<std::vector<unsigned int>>& in,
                 PSROIPoolingShape* shape, bool* complete) {
  const auto& data = in[0];
  const auto& rois = in[1];
  *complete = !data.empty() && !rois.empty() && (params.no_trans || !in[2].empty());
  const unsigned int group_channels =
      static_cast<unsigned int>(params.output_dim * params.group_size * params.group_size);
  if (!data.empty() && (data.size() != 4 || (data[1] != 0 && data[1] < group_channels))) {
    return ShapeError("data", data,
                      "(B, C, H, W) with C >= output_dim * group_size^2 = " + std::to_string(group_channels));
  }
  if (!rois.empty() && (rois.size() != 2 || rois[1] != 5)) return ShapeError("rois", rois, "(R, 5)");
  int num_classes = 1;
  if (!params.no_trans && !in[2].empty()) {
    const auto& trans = in[2];
    const unsigned int part = static_cast<unsigned int>(params.part_size);
    const bool ok = trans.size() == 4 && trans[1] >= 2 && trans[1] % 2 == 0 && trans[2] == part && trans[3] == part &&
                    (rois.empty() || trans[0] == rois[0]) && params.output_dim % (trans[1] / 2) == 0;
    if (!ok) {
      return ShapeError("trans", trans, "(R, 2 * classes, part_size, part_size) with part_size " +
                                            std::to_string(part) + ", R the rois and output_dim " +
                                            std::to_string(params.output_dim) + " a multiple of classes");
    }
    num_classes = static_cast<int>(trans[1] / 2);
  }
  if (*complete) {
    *shape = PSROIPoolingShape{static_cast<int>(data[0]), static_cast<int>(data[1]), static_cast<int>(data[2]),
                               static_cast<int>(data[3]), static_cast<int>(rois[0]), num_classes};
  }
  return true;
}

MXReturnValue inferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  PSROIPoolingParams params;
  if (!ParseParams(attrs, &params)) return MX_FAIL;
  PSROIPoolingShape shape;
  bool complete = false;
  if (!CheckShapes(params, *in_shapes, &shape, &complete)) return MX_FAIL;
  if ((*in_shapes)[1].empty()) return MX_SUCCESS;  // outputs stay unknown until the roi count is
  const unsigned int pooled = static_cast<unsigned int>(params.pooled_size);
  const std::vector<unsigned int> out = {(*in_shapes)[1][0], static_cast<unsigned int>(params.output_dim), pooled,
                                         pooled};
  (*out_shapes)[0] = out;
  (*out_shapes)[1] = out;
  return MX_SUCCESS;
}

std::vector<std::vector<unsigned int>> Shapes(const std::vector<MXTensor>& tensors, size_t first, size_t count) {
  std::vector<std::vector<unsigned int>> shapes;
  for (size_t i = first; i < first + count; ++i) {
    shapes.emplace_back(tensors[i].shape.begin(), tensors[i].shape.end());
  }
  return shapes;
}

// Parameters and shapes of a call, and a clear error for a roi whose batch index names no image.
bool Prepare(const Attrs& attrs, const std::vector<MXTensor>& tensors, size_t first_input,
             PSROIPoolingParams* params, PSROIPoolingShape* shape) {
  if (!ParseParams(attrs, params)) return false;
  bool complete = false;
  if (!CheckShapes(*params, Shapes(tensors, first_input, NumInputs(*params)), shape, &complete)) return false;
  const float* rois = static_cast<const float*>(tensors[first_input + 1].data_ptr);
  for (int n = 0; n < shape->num_rois; ++n) {
    const float index = rois[5 * n];
    if (!(index >= 0 && index < shape->batch)) {
      MX_ERROR_MSG << kOpName << ": roi " << n << " has batch index " << index << ", the data holds "
                   << shape->batch << " images";
      return false;
    }
  }
  return true;
}

MXReturnValue forwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                         const OpResource& res) {
  PSROIPoolingParams params;
  PSROIPoolingShape shape;
  if (!Prepare(attrs, *inputs, 0, &params, &shape)) return MX_FAIL;
  const float* trans = params.no_trans ? nullptr : (*inputs)[2].data<float>();
  sniper::DeformablePSROIPoolingForward(params, shape, (*inputs)[0].data<float>(), (*inputs)[1].data<float>(),
                                        trans, (*outputs)[0].data<float>(), (*outputs)[1].data<float>());
  return MX_SUCCESS;
}

// inputs: gradients of output and top_count, data, rois, [trans], output, top_count;
// outputs: gradients of data, rois, [trans]. MXNet passes no request types: every gradient is written.
MXReturnValue backwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                          const OpResource& res) {
  PSROIPoolingParams params;
  PSROIPoolingShape shape;
  if (!Prepare(attrs, *inputs, 2, &params, &shape)) return MX_FAIL;
  const int num_inputs = NumInputs(params);
  auto& in = *inputs;
  auto& grads = *outputs;
  const float* trans = params.no_trans ? nullptr : in[4].data<float>();
  const float* top_count = in[2 + num_inputs + 1].data<float>();
  float* trans_grad = params.no_trans ? nullptr : grads[2].data<float>();
  sniper::DeformablePSROIPoolingBackward(params, shape, in[0].data<float>(), top_count, in[2].data<float>(),
                                         in[3].data<float>(), trans, grads[0].data<float>(), trans_grad);
  if (grads[1].data_ptr != nullptr) std::memset(grads[1].data_ptr, 0, grads[1].size() * sizeof(float));
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(CompiledDeformablePSROIPooling)
    .setParseAttrs(parseAttrs)
    .setInferType(inferType)
    .setInferShape(inferShape)
    .setForward(forwardCPU, "cpu")
    .setBackward(backwardCPU, "cpu");
