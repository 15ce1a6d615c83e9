// lib_api glue shared by the host-computing operators (MultiProposalTarget, MultiProposalTargetMask,
// MaskRcnnTarget): their forward runs on host memory; the CPU forward hands MXNet's buffers over, the
// GPU forward (-DSNIPER_WITH_CUDA) copies the inputs to the host, computes there and copies the
// outputs back, as the reference fork's GPU operators did. Their backward writes zeros.
#ifndef SNIPER_OPS_HOST_FORWARD_H_
#define SNIPER_OPS_HOST_FORWARD_H_

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mxnet/lib_api.h"
#include "op_attrs.h"

#ifdef SNIPER_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sniper {

using OpAttrs = std::unordered_map<std::string, std::string>;

// compute(attrs, input tensors (for shapes), host input pointers, host output pointers).
using HostCompute = mxnet::ext::MXReturnValue (*)(const OpAttrs&, const std::vector<mxnet::ext::MXTensor>&,
                                                   const std::vector<const float*>&, const std::vector<float*>&);

inline mxnet::ext::MXReturnValue ForwardHostBuffers(HostCompute compute, const OpAttrs& attrs,
                                                    std::vector<mxnet::ext::MXTensor>* inputs,
                                                    std::vector<mxnet::ext::MXTensor>* outputs) {
  std::vector<const float*> in_data;
  std::vector<float*> out_data;
  for (auto& tensor : *inputs) in_data.push_back(tensor.data<float>());
  for (auto& tensor : *outputs) out_data.push_back(tensor.data<float>());
  return compute(attrs, *inputs, in_data, out_data);
}

inline mxnet::ext::MXReturnValue ZeroHostGradients(std::vector<mxnet::ext::MXTensor>* grads) {
  for (auto& grad : *grads) std::memset(grad.data_ptr, 0, grad.size() * sizeof(float));
  return mxnet::ext::MX_SUCCESS;
}

#ifdef SNIPER_WITH_CUDA
inline bool CudaOk(const char* op_name, cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  MX_ERROR_MSG << op_name << ": " << what << " failed: " << cudaGetErrorString(status);
  return false;
}

inline mxnet::ext::MXReturnValue ForwardDeviceBuffers(const char* op_name, HostCompute compute, const OpAttrs& attrs,
                                                      std::vector<mxnet::ext::MXTensor>* inputs,
                                                      std::vector<mxnet::ext::MXTensor>* outputs,
                                                      const mxnet::ext::OpResource& res) {
  using mxnet::ext::MX_FAIL;
  cudaStream_t stream = static_cast<cudaStream_t>(res.get_cuda_stream());
  std::vector<std::vector<float>> host_in(inputs->size()), host_out(outputs->size());
  std::vector<const float*> in_data;
  std::vector<float*> out_data;
  for (size_t i = 0; i < inputs->size(); ++i) {
    mxnet::ext::MXTensor& tensor = (*inputs)[i];
    host_in[i].resize(tensor.size());
    if (!CudaOk(op_name, cudaMemcpyAsync(host_in[i].data(), tensor.data_ptr, tensor.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream), "copying an input to the host"))
      return MX_FAIL;
    in_data.push_back(host_in[i].data());
  }
  if (!CudaOk(op_name, cudaStreamSynchronize(stream), "waiting for the input copies")) return MX_FAIL;
  for (size_t i = 0; i < outputs->size(); ++i) {
    host_out[i].resize((*outputs)[i].size());
    out_data.push_back(host_out[i].data());
  }
  if (compute(attrs, *inputs, in_data, out_data) != mxnet::ext::MX_SUCCESS) return MX_FAIL;
  for (size_t i = 0; i < outputs->size(); ++i) {
    mxnet::ext::MXTensor& tensor = (*outputs)[i];
    if (!CudaOk(op_name, cudaMemcpyAsync(tensor.data_ptr, host_out[i].data(), tensor.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, stream), "copying an output to the device"))
      return MX_FAIL;
  }
  // host_out must outlive the copies.
  return CudaOk(op_name, cudaStreamSynchronize(stream), "waiting for the output copies") ? mxnet::ext::MX_SUCCESS
                                                                                          : MX_FAIL;
}

inline mxnet::ext::MXReturnValue ZeroDeviceGradients(const char* op_name, std::vector<mxnet::ext::MXTensor>* grads,
                                                     const mxnet::ext::OpResource& res) {
  cudaStream_t stream = static_cast<cudaStream_t>(res.get_cuda_stream());
  for (auto& grad : *grads) {
    if (!CudaOk(op_name, cudaMemsetAsync(grad.data_ptr, 0, grad.size() * sizeof(float), stream), "zeroing a gradient"))
      return mxnet::ext::MX_FAIL;
  }
  return mxnet::ext::MX_SUCCESS;
}
#endif  // SNIPER_WITH_CUDA

// lib_api parse-attributes callback: `Parse` must accept the attributes; fixed input / output counts.
template <class Params, bool (*Parse)(const OpAttrs&, Params*), int kInputs, int kOutputs>
mxnet::ext::MXReturnValue ParseAttrsCallback(const OpAttrs& attrs, int* num_inputs, int* num_outputs) {
  Params params{};
  if (!Parse(attrs, &params)) return mxnet::ext::MX_FAIL;
  *num_inputs = kInputs;
  *num_outputs = kOutputs;
  return mxnet::ext::MX_SUCCESS;
}

// lib_api forward / backward callbacks of an operator computing with `Compute` on the host; `kName`
// (a char array) names it in errors.
template <HostCompute Compute>
mxnet::ext::MXReturnValue HostForward(const OpAttrs& attrs, std::vector<mxnet::ext::MXTensor>* inputs,
                                      std::vector<mxnet::ext::MXTensor>* outputs, const mxnet::ext::OpResource& res) {
  return ForwardHostBuffers(Compute, attrs, inputs, outputs);
}

inline mxnet::ext::MXReturnValue HostZeroBackward(const OpAttrs& attrs, std::vector<mxnet::ext::MXTensor>* inputs,
                                                  std::vector<mxnet::ext::MXTensor>* outputs,
                                                  const mxnet::ext::OpResource& res) {
  return ZeroHostGradients(outputs);
}

#ifdef SNIPER_WITH_CUDA
template <const char* kName, HostCompute Compute>
mxnet::ext::MXReturnValue DeviceForward(const OpAttrs& attrs, std::vector<mxnet::ext::MXTensor>* inputs,
                                        std::vector<mxnet::ext::MXTensor>* outputs,
                                        const mxnet::ext::OpResource& res) {
  return ForwardDeviceBuffers(kName, Compute, attrs, inputs, outputs, res);
}

template <const char* kName>
mxnet::ext::MXReturnValue DeviceZeroBackward(const OpAttrs& attrs, std::vector<mxnet::ext::MXTensor>* inputs,
                                             std::vector<mxnet::ext::MXTensor>* outputs,
                                             const mxnet::ext::OpResource& res) {
  return ZeroDeviceGradients(kName, outputs, res);
}
#endif  // SNIPER_WITH_CUDA

// The input/output dtype rule of these operators, as a lib_api callback: float32 only.
template <const char* kName, const char* const* kInputNames>
mxnet::ext::MXReturnValue Float32Types(const OpAttrs& attrs, std::vector<int>* in_types, std::vector<int>* out_types) {
  for (size_t i = 0; i < in_types->size(); ++i) {
    const int type = (*in_types)[i];
    if (type != -1 && type != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << kName << ": input " << kInputNames[i] << " must be float32, got MXNet dtype code " << type;
      return mxnet::ext::MX_FAIL;
    }
    (*in_types)[i] = mxnet::ext::kFloat32;
  }
  for (auto& type : *out_types) type = mxnet::ext::kFloat32;
  return mxnet::ext::MX_SUCCESS;
}

// An operator's attributes with the reference fork's defaults (dmlc parameters there).
using AttrDefaults = std::vector<std::pair<std::string, std::string>>;

inline std::string AttrValue(const OpAttrs& attrs, const AttrDefaults& defaults, const std::string& key) {
  const auto found = attrs.find(key);
  if (found != attrs.end()) return found->second;
  for (const auto& entry : defaults) {
    if (entry.first == key) return entry.second;
  }
  return "";
}

// False, with the known names, for an attribute the operator does not have (as the fork's dmlc parameter
// parsing refuses one); MXNet's own "__" keys pass.
inline bool OnlyKnownAttrs(const char* op_name, const OpAttrs& attrs, const AttrDefaults& defaults) {
  for (const auto& kv : attrs) {
    if (kv.first.rfind("__", 0) == 0) continue;
    bool known = false;
    for (const auto& entry : defaults) known = known || entry.first == kv.first;
    if (!known) {
      std::string names;
      for (const auto& entry : defaults) names += (names.empty() ? "" : ", ") + entry.first;
      MX_ERROR_MSG << op_name << ": unknown attribute " << kv.first << "='" << kv.second << "' (known: " << names
                   << ")";
      return false;
    }
  }
  return true;
}

// One known input shape against `expected` (0 = any size); an unknown shape (ndim 0) passes.
inline bool CheckInputShape(const char* op_name, const char* input_name, const std::vector<unsigned int>& shape,
                            const std::vector<unsigned int>& expected, const std::string& layout) {
  if (shape.empty()) return true;
  bool ok = shape.size() == expected.size();
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = expected[d] == 0 || shape[d] == 0 || shape[d] == expected[d];
  if (!ok) {
    MX_ERROR_MSG << op_name << ": input " << input_name << " must have shape " << layout << ", got "
                 << ShapeString(shape);
  }
  return ok;
}

// The inputs of the proposal-target operators, named `names`: cls_prob (B, 2A, H, W) or its (B, 2, A*H, W) view, bbox_pred (B, 4A,
// H, W), im_info (B, 3), gt_boxes (B, gt_rows, 5) (gt_rows 0: any, described by `gt_layout`),
// valid_ranges (B, 2). Sets the batch size (0 while unknown) and the map size; false with the reason.
inline bool CheckProposalInputs(const char* op_name, const char* const* names,
                                const std::vector<std::vector<unsigned int>>& shapes, unsigned int anchors,
                                unsigned int gt_rows, const std::string& gt_layout, unsigned int* batch,
                                unsigned int* height, unsigned int* width) {
  *batch = *height = *width = 0;
  for (const auto& shape : shapes) {
    if (*batch == 0 && !shape.empty()) *batch = shape[0];
  }
  for (int i : {1, 0}) {  // bbox_pred first: its (H, W) are the feature map's in either score layout
    if (shapes[i].size() == 4) {
      *height = *height ? *height : shapes[i][2];
      *width = *width ? *width : shapes[i][3];
    }
  }
  const unsigned int b = *batch, h = *height, w = *width;
  const std::string score_layout = "(B, 2A, H, W) or (B, 2, A*H, W) with A = len(scales) * len(ratios) = " +
                                   std::to_string(anchors);
  // The reference's mask symbol feeds the softmax's (B, 2, A*H, W) view of the same memory.
  const bool two_channels = anchors > 1 && shapes[0].size() == 4 && shapes[0][1] == 2 && h && shapes[0][2] == anchors * h;
  const std::vector<unsigned int> score = two_channels ? std::vector<unsigned int>{b, 2, anchors * h, w}
                                                       : std::vector<unsigned int>{b, 2 * anchors, h, w};
  return CheckInputShape(op_name, names[0], shapes[0], score, score_layout) &&
         CheckInputShape(op_name, names[1], shapes[1], {b, 4 * anchors, h, w}, "(B, 4A, H, W) like cls_prob") &&
         CheckInputShape(op_name, names[2], shapes[2], {b, 3}, "(B, 3)") &&
         CheckInputShape(op_name, names[3], shapes[3], {b, gt_rows, 5}, gt_layout) &&
         CheckInputShape(op_name, names[4], shapes[4], {b, 2}, "(B, 2)");
}

}  // namespace sniper

// Registers the float32 host operator `name` of the including file, whose anonymous namespace defines
// kOpName, kInputNames, kNumInputs, kNumOutputs, ParseParams (into a `params_type`), inferShape and
// ComputeOnHost: the host forward, zero gradients, and with SNIPER_WITH_CUDA the same on GPU contexts
// (inputs copied to the host and back).
#ifdef SNIPER_WITH_CUDA
#define SNIPER_GPU_VARIANT                                              \
  .setForward(sniper::DeviceForward<kOpName, ComputeOnHost>, "gpu")     \
      .setBackward(sniper::DeviceZeroBackward<kOpName>, "gpu")
#else
#define SNIPER_GPU_VARIANT
#endif
#define SNIPER_REGISTER_HOST_OP(name, params_type)                                                         \
  REGISTER_OP(name)                                                                                         \
      .setParseAttrs(sniper::ParseAttrsCallback<params_type, ParseParams, kNumInputs, kNumOutputs>)       \
      .setInferType(sniper::Float32Types<kOpName, kInputNames>)                                            \
      .setInferShape(inferShape)                                                                           \
      .setForward(sniper::HostForward<ComputeOnHost>, "cpu")                                               \
      .setBackward(sniper::HostZeroBackward, "cpu") SNIPER_GPU_VARIANT

#endif  // SNIPER_OPS_HOST_FORWARD_H_
