// DeformableIm2Col: the lib_api glue around deformable_im2col.h.
//
// Inputs data (B, C, H, W) and offset (B, 2 * kh * kw * num_deformable_group, Ho, Wo); output the
// columns (B, C * kh * kw, Ho, Wo), Ho = (H + 2 pad_h - dilate_h (kh - 1) - 1) / stride_h + 1 (Wo alike).
// Attributes kernel, stride, pad, dilate, num_deformable_group as in MXNet's
// _contrib_DeformableConvolution. The backward writes the data and offset gradients. Host kernels only.
#include <string>
#include <unordered_map>
#include <vector>

#include "deformable_im2col.h"
#include "mxnet/lib_api.h"
#include "op_attrs.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using sniper::Im2ColGeometry;

namespace {

constexpr const char* kOpName = "DeformableIm2Col";
using Attrs = std::unordered_map<std::string, std::string>;

// The attributes; input shapes are filled in by Resolve.
bool ParseGeometry(const Attrs& attrs, Im2ColGeometry* g) {
  *g = Im2ColGeometry{};
  g->stride_h = g->stride_w = g->dilate_h = g->dilate_w = g->deformable_groups = 1;
  bool seen_kernel = false;
  for (const auto& kv : attrs) {
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    if (key.rfind("__", 0) == 0) continue;  // MXNet's own bookkeeping (__ext_dtype__, __ctx_group__...)
    std::vector<int> pair;
    if (key == "kernel" || key == "stride" || key == "dilate" || key == "pad") {
      const int lo = key == "pad" ? 0 : 1;
      if (!sniper::ParseIntTuple(value, 2, lo, &pair)) {
        MX_ERROR_MSG << kOpName << ": attribute " << key << "='" << value << "' must be two whole numbers >= " << lo
                     << " (height, width)";
        return false;
      }
      int* target_h = key == "kernel" ? &g->kernel_h : key == "stride" ? &g->stride_h
                      : key == "dilate" ? &g->dilate_h : &g->pad_h;
      int* target_w = key == "kernel" ? &g->kernel_w : key == "stride" ? &g->stride_w
                      : key == "dilate" ? &g->dilate_w : &g->pad_w;
      *target_h = pair[0];
      *target_w = pair[1];
      seen_kernel |= key == "kernel";
    } else if (key == "num_deformable_group") {
      if (!sniper::ParseInt(value, 1, 1 << 20, &g->deformable_groups)) {
        MX_ERROR_MSG << kOpName << ": attribute " << key << "='" << value << "' must be a positive integer";
        return false;
      }
    } else {
      MX_ERROR_MSG << kOpName << ": unknown attribute " << key << "='" << value
                   << "' (known: kernel, stride, pad, dilate, num_deformable_group)";
      return false;
    }
  }
  if (!seen_kernel) {
    MX_ERROR_MSG << kOpName << ": attribute kernel is required";
    return false;
  }
  return true;
}

// Completes `g` from a known data shape; false (with the reason) for shapes the attributes cannot take.
bool Resolve(const std::vector<unsigned int>& data, Im2ColGeometry* g) {
  if (data.size() != 4) {
    MX_ERROR_MSG << kOpName << ": input data must have shape (B, C, H, W), got " << sniper::ShapeString(data);
    return false;
  }
  g->batch = static_cast<int>(data[0]);
  g->channels = static_cast<int>(data[1]);
  g->height = static_cast<int>(data[2]);
  g->width = static_cast<int>(data[3]);
  const int span_h = g->dilate_h * (g->kernel_h - 1) + 1, span_w = g->dilate_w * (g->kernel_w - 1) + 1;
  g->out_height = (g->height + 2 * g->pad_h - span_h) / g->stride_h + 1;
  g->out_width = (g->width + 2 * g->pad_w - span_w) / g->stride_w + 1;
  if (g->height + 2 * g->pad_h < span_h || g->width + 2 * g->pad_w < span_w) {
    MX_ERROR_MSG << kOpName << ": input data " << sniper::ShapeString(data) << " is smaller than the dilated kernel ("
                 << span_h << ", " << span_w << ") with padding (" << g->pad_h << ", " << g->pad_w << ")";
    return false;
  }
  if (g->channels % g->deformable_groups != 0) {
    MX_ERROR_MSG << kOpName << ": data channels " << g->channels << " are not a multiple of num_deformable_group "
                 << g->deformable_groups;
    return false;
  }
  return true;
}

std::vector<unsigned int> OffsetShape(const Im2ColGeometry& g) {
  return {static_cast<unsigned int>(g.batch), static_cast<unsigned int>(2 * g.taps() * g.deformable_groups),
          static_cast<unsigned int>(g.out_height), static_cast<unsigned int>(g.out_width)};
}

bool CheckOffset(const Im2ColGeometry& g, const std::vector<unsigned int>& offset) {
  if (offset.empty() || offset == OffsetShape(g)) return true;
  MX_ERROR_MSG << kOpName << ": input offset must have shape " << sniper::ShapeString(OffsetShape(g))
               << " (B, 2 * kh * kw * num_deformable_group, Ho, Wo), got " << sniper::ShapeString(offset);
  return false;
}

MXReturnValue parseAttrs(const Attrs& attrs, int* num_inputs, int* num_outputs) {
  Im2ColGeometry g;
  if (!ParseGeometry(attrs, &g)) return MX_FAIL;
  *num_inputs = 2;
  *num_outputs = 1;
  return MX_SUCCESS;
}

MXReturnValue inferType(const Attrs& attrs, std::vector<int>* in_types, std::vector<int>* out_types) {
  const char* names[] = {"data", "offset"};
  for (size_t i = 0; i < in_types->size(); ++i) {
    if ((*in_types)[i] != -1 && (*in_types)[i] != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << kOpName << ": input " << names[i] << " must be float32, got MXNet dtype code " << (*in_types)[i];
      return MX_FAIL;
    }
    (*in_types)[i] = mxnet::ext::kFloat32;
  }
  (*out_types)[0] = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

MXReturnValue inferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  Im2ColGeometry g;
  if (!ParseGeometry(attrs, &g)) return MX_FAIL;
  if ((*in_shapes)[0].empty()) return MX_SUCCESS;  // the output stays unknown until the data shape is
  if (!Resolve((*in_shapes)[0], &g) || !CheckOffset(g, (*in_shapes)[1])) return MX_FAIL;
  (*in_shapes)[1] = OffsetShape(g);
  (*out_shapes)[0] = {static_cast<unsigned int>(g.batch), static_cast<unsigned int>(g.channels * g.taps()),
                      static_cast<unsigned int>(g.out_height), static_cast<unsigned int>(g.out_width)};
  return MX_SUCCESS;
}

bool Prepare(const Attrs& attrs, const MXTensor& data, const MXTensor& offset, Im2ColGeometry* g) {
  return ParseGeometry(attrs, g) && Resolve(std::vector<unsigned int>(data.shape.begin(), data.shape.end()), g) &&
         CheckOffset(*g, std::vector<unsigned int>(offset.shape.begin(), offset.shape.end()));
}

MXReturnValue forwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                         const OpResource& res) {
  Im2ColGeometry g;
  if (!Prepare(attrs, (*inputs)[0], (*inputs)[1], &g)) return MX_FAIL;
  sniper::DeformableIm2Col(g, (*inputs)[0].data<float>(), (*inputs)[1].data<float>(), (*outputs)[0].data<float>());
  return MX_SUCCESS;
}

// inputs: columns gradient, data, offset, columns; outputs: data and offset gradients. MXNet passes no
// request types: both are written (a null one, which MXNet does not ask for, is skipped).
MXReturnValue backwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                          const OpResource& res) {
  Im2ColGeometry g;
  auto& in = *inputs;
  if (!Prepare(attrs, in[1], in[2], &g)) return MX_FAIL;
  sniper::DeformableIm2ColBackward(g, in[0].data<float>(), in[1].data<float>(), in[2].data<float>(),
                                   (*outputs)[0].data<float>(), (*outputs)[1].data<float>());
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(DeformableIm2Col)
    .setParseAttrs(parseAttrs)
    .setInferType(inferType)
    .setInferShape(inferShape)
    .setForward(forwardCPU, "cpu")
    .setBackward(backwardCPU, "cpu");
