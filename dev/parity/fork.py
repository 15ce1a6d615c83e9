"""A checkout of the reference's MXNet fork (mahyarnajibi/SNIPER-mxnet, the reference's SNIPER-mxnet
submodule): its test proposal operator compiled from its source with stand-ins of ours for the MXNet types
it touches.

``src/operator/multi_proposal.cc`` is the fork's CPU MultiProposal; its arithmetic, ranking and NMS are
those of the 2018 GPU operator the published results came from (``multi_proposal.cu`` before 00ab7a26,
whose Forward copied the maps to the host and ran the same code there). The file is compiled as it is:
its ``#include "./multi_proposal-inl.h"`` finds the stand-in below, its other includes find empty files,
and the wrapper calls its operator's Forward. Nothing of the fork is in the repository.
"""
import ctypes
import os
import subprocess

import numpy as np

from dev.parity.reference import FORK_COMMIT, Checkout, compile_shared_library

PROPOSAL_SOURCE = "src/operator/multi_proposal.cc"
TARGET_SOURCE = "src/operator/multi_proposal_target.cu"
# What their includes ask for besides their -inl.h: empty here (the stand-ins define what is used).
EMPTY_INCLUDES = ("dmlc/logging.h", "dmlc/parameter.h", "mxnet/operator.h", "mshadow/tensor.h", "thrust/sort.h",
                  "thrust/execution_policy.h", "thrust/functional.h", "operator_common.h", "mshadow_op.h",
                  "mshadow/cuda/reduce.cuh")
TARGET_CHIPS = 16  # the GPU operator's host buffers hold 16 chips of 300 rois

# The MXNet / mshadow types the fork's operators touch, as stand-ins: tensors as a pointer and a shape, the
# temporary-space resource (device memory, in a CUDA build), the operator base class.
MXNET_STANDIN = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>
#define CHECK_EQ(a, b) if ((a) == (b)) ; else std::cerr
namespace nnvm {
template <class T> struct Tuple {
  std::vector<T> values;
  size_t ndim() const { return values.size(); }
  T operator[](size_t i) const { return values[i]; }
};
}
namespace mshadow {
struct cpu {};
struct gpu {};
typedef float real_t;
template <class xpu> struct Stream {};
template <class xpu, int dim, class T = float> struct Tensor {
  T* dptr_;
  int shape_[4];
  int size(int i) const { return shape_[i]; }
};
inline size_t Shape1(size_t size) { return size; }
namespace expr {}
}
namespace mxnet {
using mshadow::cpu;
using mshadow::gpu;
using mshadow::real_t;
enum OpReqType { kNullOp, kWriteTo };
struct Context {};
struct Resource {
  std::vector<void*>* allocated;
  template <class xpu, int dim, class T> mshadow::Tensor<xpu, dim, T> get_space_typed(size_t size,
                                                                                      mshadow::Stream<xpu>*) const {
    mshadow::Tensor<xpu, dim, T> tensor = mshadow::Tensor<xpu, dim, T>();
#ifdef __CUDACC__
    cudaMalloc(&tensor.dptr_, size * sizeof(T));
    allocated->push_back(tensor.dptr_);
#endif
    tensor.shape_[0] = (int)size;
    return tensor;
  }
};
struct OpContext {
  std::vector<Resource> requested;
  template <class xpu> mshadow::Stream<xpu>* get_stream() const { return 0; }
};
struct TBlob {
  float* dptr;
  int shape[4];
  template <class xpu, int dim, class T> mshadow::Tensor<xpu, dim, T> get(mshadow::Stream<xpu>*) const {
    mshadow::Tensor<xpu, dim, T> tensor;
    tensor.dptr_ = dptr;
    for (int i = 0; i < 4; i++) tensor.shape_[i] = shape[i];
    return tensor;
  }
};
template <class T> void Assign(T&, OpReqType, int) {}
class Operator {
 public:
  virtual ~Operator() {}
};
}
"""

# The stand-in for the fork's multi_proposal-inl.h: the operator's parameters as a plain struct, and what its
# registration at the end of the file names.
PROPOSAL_STANDIN = MXNET_STANDIN + r"""
namespace mxnet {
namespace op {
namespace proposal {
enum MultiProposalOpInputs {kClsProb, kBBoxPred, kImInfo};
enum MultiProposalOpOutputs {kRoIs, kScores};
}
struct MultiProposalParam {
  int rpn_pre_nms_top_n, rpn_post_nms_top_n, rpn_min_size, batch_size, feature_stride;
  float threshold, bbox_scale, roi_iou_thresh;
  nnvm::Tuple<float> scales, ratios;
  static int __FIELDS__() { return 0; }
};
template <typename xpu> Operator* CreateOp(MultiProposalParam param);
class MultiProposalProp {
 public:
  Operator* CreateOperator(Context ctx) const;
  MultiProposalParam param_;
};
struct HarnessRegistration {
  HarnessRegistration& describe(const char*) { return *this; }
  HarnessRegistration& add_argument(const char*, const char*, const char*) { return *this; }
  HarnessRegistration& add_arguments(int) { return *this; }
};
}
}
#define DO_BIND_DISPATCH(Method, ...) return Method<cpu>(__VA_ARGS__)
#define DMLC_REGISTER_PARAMETER(name) static int harness_unused_##name = 0
#define MXNET_REGISTER_OP_PROPERTY(name, prop) static HarnessRegistration harness_registration_##name = \
    HarnessRegistration()
"""

# The wrapper: the operator built with the given attributes and run once; srand(seed) fixes its random
# padding boxes. The operator's buffers hold 21 x 200 x 200 anchors per image: larger maps are refused.
PROPOSAL_WRAPPER = r"""
#include <stdlib.h>
#include "multi_proposal.cc"
using namespace mxnet;
extern "C" int harness_multi_proposal(const float* cls_prob, const float* bbox_pred, const float* im_info, int batch,
                                      int anchors, int height, int width, int stride, const float* scales,
                                      int num_scales, const float* ratios, int num_ratios, int post_nms_top_n,
                                      unsigned seed, float* rois, float* scores) {
  if (anchors * height * width > 21 * 200 * 200) return -1;
  op::MultiProposalParam param = op::MultiProposalParam();
  param.rpn_post_nms_top_n = post_nms_top_n;
  param.batch_size = batch;
  param.feature_stride = stride;
  param.scales.values.assign(scales, scales + num_scales);
  param.ratios.values.assign(ratios, ratios + num_ratios);
  Operator* op = op::CreateOp<cpu>(param);
  TBlob blobs[5] = {{(float*)cls_prob, {batch, 2 * anchors, height, width}},
                    {(float*)bbox_pred, {batch, 4 * anchors, height, width}},
                    {(float*)im_info, {batch, 3, 0, 0}},
                    {rois, {batch * post_nms_top_n, 5, 0, 0}},
                    {scores, {batch * post_nms_top_n, 0, 0, 0}}};
  std::vector<TBlob> in(blobs, blobs + 3), out(blobs + 3, blobs + 5), aux;
  std::vector<OpReqType> req(2, kWriteTo);
  srand(seed);
  static_cast<op::MultiProposalGPUOp<cpu>*>(op)->Forward(OpContext(), in, req, out, aux);
  delete op;
  return 0;
}
"""


# The stand-in for the fork's multi_proposal_target-inl.h.
TARGET_STANDIN = MXNET_STANDIN + r"""
namespace mxnet {
namespace op {
namespace proposal {
enum MultiProposalTargetOpInputs {kClsProb, kBBoxPred, kImInfo, kGTBoxes, kValidRanges};
enum MultiProposalTargetOpOutputs {kRoIs, kLabels, kBboxTarget, kBboxWeight};
enum MultiProposalTargetForwardResource {kTempSpace};
}
struct MultiProposalTargetParam {
  int rpn_pre_nms_top_n, rpn_post_nms_top_n, rpn_min_size, batch_size, feature_stride;
  float threshold, bbox_scale;
  uint64_t workspace;
  nnvm::Tuple<float> scales, ratios;
};
template <typename xpu> Operator* CreateOp(MultiProposalTargetParam param);
}
}
"""

# The wrapper of the GPU operator: inputs copied to the device, its Forward, outputs copied back (up to
# TARGET_CHIPS chips a call); the attributes the published training passed (300 rois, its anchors).
TARGET_WRAPPER = r"""
#include <cuda_runtime.h>
#include "multi_proposal_target.cu"
using namespace mxnet;
static float* harness_device(const float* host, size_t count, std::vector<void*>* allocated) {
  float* device = 0;
  cudaMalloc(&device, count * sizeof(float));
  if (host) cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice);
  allocated->push_back(device);
  return device;
}
extern "C" int harness_multi_proposal_target(const float* cls_prob, const float* bbox_pred, const float* im_info,
                                             const float* gt_boxes, const float* valid_ranges, int batch,
                                             int anchors, int height, int width, int stride, const float* scales,
                                             int num_scales, const float* ratios, int num_ratios, float* rois,
                                             float* labels, float* targets, float* weights) {
  if (batch > 16) return -1;
  op::MultiProposalTargetParam param = op::MultiProposalTargetParam();
  param.rpn_post_nms_top_n = 300;
  param.batch_size = batch;
  param.feature_stride = stride;
  param.workspace = 128;
  param.scales.values.assign(scales, scales + num_scales);
  param.ratios.values.assign(ratios, ratios + num_ratios);
  std::vector<void*> allocated;
  int count = batch * anchors * height * width;
  TBlob blobs[9] = {{harness_device(cls_prob, 2 * count, &allocated), {batch, 2 * anchors, height, width}},
                    {harness_device(bbox_pred, 4 * count, &allocated), {batch, 4 * anchors, height, width}},
                    {harness_device(im_info, 3 * batch, &allocated), {batch, 3, 0, 0}},
                    {harness_device(gt_boxes, 500 * batch, &allocated), {batch, 100, 5, 0}},
                    {harness_device(valid_ranges, 2 * batch, &allocated), {batch, 2, 0, 0}},
                    {harness_device(0, 1500 * batch, &allocated), {300 * batch, 5, 0, 0}},
                    {harness_device(0, 300 * batch, &allocated), {batch, 300, 0, 0}},
                    {harness_device(0, 1200 * batch, &allocated), {300 * batch, 4, 0, 0}},
                    {harness_device(0, 1200 * batch, &allocated), {300 * batch, 4, 0, 0}}};
  std::vector<TBlob> in(blobs, blobs + 5), out(blobs + 5, blobs + 9), aux;
  std::vector<OpReqType> req(4, kWriteTo);
  OpContext ctx;
  Resource space;
  space.allocated = &allocated;
  ctx.requested.push_back(space);
  Operator* op = op::CreateOp<gpu>(param);
  static_cast<op::MultiProposalTargetGPUOp<gpu>*>(op)->Forward(ctx, in, req, out, aux);
  cudaDeviceSynchronize();
  float* outputs[4] = {rois, labels, targets, weights};
  size_t sizes[4] = {1500, 300, 1200, 1200};
  for (int k = 0; k < 4; k++)
    cudaMemcpy(outputs[k], blobs[5 + k].dptr, sizes[k] * batch * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t k = 0; k < allocated.size(); k++) cudaFree(allocated[k]);
  delete op;
  return cudaGetLastError() == cudaSuccess ? 0 : -2;
}
"""


class ForkCheckout(Checkout):
    """The reference's MXNet fork at ``path``."""

    def __init__(self, path):
        super().__init__(path, PROPOSAL_SOURCE, "the reference's MXNet fork (SNIPER-mxnet)", "--fork", FORK_COMMIT)

    def multi_proposal(self, workdir):
        """Its MultiProposal compiled into ``workdir``: a ForkProposals."""
        self._write_sources(PROPOSAL_SOURCE, "multi_proposal-inl.h", PROPOSAL_STANDIN, "harness_proposal.cpp",
                            PROPOSAL_WRAPPER, workdir)
        library = compile_shared_library(workdir, os.path.join(workdir, "harness_proposal.cpp"),
                                         os.path.join(workdir, "harness_proposal.so"), f"the fork's {PROPOSAL_SOURCE}")
        return ForkProposals(library)

    def multi_proposal_target(self, workdir, nvcc="nvcc"):
        """Its GPU MultiProposalTarget compiled with ``nvcc`` into ``workdir`` (a CUDA GPU runs it): a
        ForkProposalTarget."""
        self._write_sources(TARGET_SOURCE, "multi_proposal_target-inl.h", TARGET_STANDIN, "harness_target.cu",
                            TARGET_WRAPPER, workdir)
        library = os.path.join(workdir, "harness_target.so")
        command = [nvcc, "-std=c++14", "-O3", "-Xcompiler", "-fPIC", "-shared", "-I", workdir,
                   os.path.join(workdir, "harness_target.cu"), "-o", library]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiling the fork's {TARGET_SOURCE} failed: {' '.join(command)}\n"
                               f"{done.stderr[-2000:]}")
        return ForkProposalTarget(library)

    def _write_sources(self, source, standin_name, standin, wrapper_name, wrapper, workdir):
        """The fork's ``source``, the stand-in named as its -inl.h, empty includes and ``wrapper``, in
        ``workdir``."""
        self.copy(source, workdir)
        for name in EMPTY_INCLUDES:
            os.makedirs(os.path.dirname(os.path.join(workdir, name)), exist_ok=True)
            open(os.path.join(workdir, name), "w").close()
        for name, text in ((standin_name, standin), (wrapper_name, wrapper)):
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text)


class ForkProposals:
    """ctypes binding of the compiled operator: ``__call__(cls_prob (B, 2A, H, W), bbox_pred (B, 4A, H, W),
    im_info (B, 3), stride, scales, ratios, post_nms_top_n, seed)`` -> (rois (B * post, 5), scores (B * post,)),
    float32, as its Forward writes them (its random padding boxes, score 0, after an image's kept boxes)."""

    def __init__(self, library):
        self._lib = ctypes.CDLL(library)

    def __call__(self, cls_prob, bbox_pred, im_info, stride, scales, ratios, post_nms_top_n, seed=0):
        arrays = [np.ascontiguousarray(a, np.float32) for a in (cls_prob, bbox_pred, im_info, scales, ratios)]
        batch, channels, height, width = arrays[0].shape
        rois = np.zeros((batch * post_nms_top_n, 5), np.float32)
        scores = np.zeros(batch * post_nms_top_n, np.float32)
        pointer = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))  # noqa: E731
        done = self._lib.harness_multi_proposal(
            pointer(arrays[0]), pointer(arrays[1]), pointer(arrays[2]), batch, channels // 2, height, width,
            int(stride), pointer(arrays[3]), len(arrays[3]), pointer(arrays[4]), len(arrays[4]), post_nms_top_n,
            ctypes.c_uint(seed), pointer(rois), pointer(scores))
        if done:
            raise ValueError(f"the fork's MultiProposal holds 21 x 200 x 200 anchors per image, not "
                             f"{channels // 2} x {height} x {width}")
        return rois, scores


TARGET_INPUTS = ("cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges")
TARGET_OUTPUTS = ("rois", "labels", "bbox_targets", "bbox_weights")


class ForkProposalTarget:
    """ctypes binding of the compiled GPU operator: ``__call__(inputs, stride, scales, ratios)`` with
    ``inputs`` {name: array} (TARGET_INPUTS; gt_boxes (N, 100, 5) as the fork reads them) -> {name: array} of
    TARGET_OUTPUTS: rois (N * 300, 5), labels (N, 300), targets and weights (N * 300, 4), float32."""

    def __init__(self, library):
        self._lib = ctypes.CDLL(library)

    def __call__(self, inputs, stride, scales, ratios):
        arrays = {name: np.ascontiguousarray(inputs[name], np.float32) for name in TARGET_INPUTS}
        chips, channels, height, width = arrays["cls_prob"].shape
        if arrays["gt_boxes"].shape[1:] != (100, 5):
            raise ValueError(f"the fork's MultiProposalTarget reads gt_boxes (N, 100, 5), not "
                             f"{arrays['gt_boxes'].shape}")
        shapes = {"rois": (300, 5), "labels": (300,), "bbox_targets": (300, 4), "bbox_weights": (300, 4)}
        outputs = {name: np.zeros((chips,) + shape, np.float32) for name, shape in shapes.items()}
        settings = [np.ascontiguousarray(v, np.float32) for v in (scales, ratios)]
        pointer = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))  # noqa: E731
        for start in range(0, chips, TARGET_CHIPS):
            part = slice(start, min(start + TARGET_CHIPS, chips))
            ins = [np.ascontiguousarray(arrays[name][part]) for name in TARGET_INPUTS]
            outs = [np.zeros_like(outputs[name][part]) for name in TARGET_OUTPUTS]
            done = self._lib.harness_multi_proposal_target(
                *map(pointer, ins), len(ins[0]), channels // 2, height, width, int(stride),
                pointer(settings[0]), len(settings[0]), pointer(settings[1]), len(settings[1]), *map(pointer, outs))
            if done:
                raise RuntimeError(f"the fork's MultiProposalTarget failed (code {done}: -2 is a CUDA error)")
            for name, out in zip(TARGET_OUTPUTS, outs):
                outputs[name][part] = out
        return {"rois": outputs["rois"].reshape(-1, 5), "labels": outputs["labels"],
                "bbox_targets": outputs["bbox_targets"].reshape(-1, 4),
                "bbox_weights": outputs["bbox_weights"].reshape(-1, 4)}


def run_fork_targets(fork, inputs_file, out_file, workdir, stride, scales, ratios, nvcc="nvcc"):
    """The fork's MultiProposalTarget (``fork``: a ForkCheckout) with the anchors of ``stride``, ``scales``,
    ``ratios`` on the inputs of ``inputs_file`` (an .npz of TARGET_INPUTS), compiled into ``workdir``; its
    outputs written to ``out_file`` (.npz). Needs a CUDA GPU, ``nvcc`` and NumPy (no MXNet)."""
    with np.load(inputs_file) as data:
        inputs = {name: data[name] for name in TARGET_INPUTS}
    outputs = fork.multi_proposal_target(workdir, nvcc)(inputs, stride, scales, ratios)
    np.savez(out_file, **outputs)
    return outputs
