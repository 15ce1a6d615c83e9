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

import numpy as np

from lib.parity.reference import Checkout, compile_shared_library

PROPOSAL_SOURCE = "src/operator/multi_proposal.cc"
# What its includes ask for besides multi_proposal-inl.h: empty here (the stand-in defines what is used).
EMPTY_INCLUDES = ("dmlc/logging.h", "dmlc/parameter.h", "mxnet/operator.h", "mshadow/tensor.h", "thrust/sort.h",
                  "thrust/execution_policy.h", "thrust/functional.h", "operator_common.h", "mshadow_op.h")

# The stand-in for the fork's multi_proposal-inl.h: the operator's parameters as a plain struct, and the
# few MXNet / mshadow types its Forward and Backward use (tensors as a pointer and a shape).
PROPOSAL_STANDIN = r"""
#include <algorithm>
#include <cmath>
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
typedef float real_t;
template <class xpu> struct Stream {};
template <class xpu, int dim, class T = float> struct Tensor {
  T* dptr_;
  int shape_[4];
  int size(int i) const { return shape_[i]; }
};
namespace expr {}
}
namespace mxnet {
using mshadow::cpu;
using mshadow::real_t;
enum OpReqType { kNullOp, kWriteTo };
struct Context {};
struct OpContext {
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


class ForkCheckout(Checkout):
    """The reference's MXNet fork at ``path``."""

    def __init__(self, path):
        super().__init__(path, PROPOSAL_SOURCE, "the reference's MXNet fork (SNIPER-mxnet)", "--fork")

    def multi_proposal(self, workdir):
        """Its MultiProposal compiled into ``workdir``: a ForkProposals."""
        self.copy(PROPOSAL_SOURCE, workdir)
        for name in EMPTY_INCLUDES:
            os.makedirs(os.path.dirname(os.path.join(workdir, name)), exist_ok=True)
            open(os.path.join(workdir, name), "w").close()
        files = {"multi_proposal-inl.h": PROPOSAL_STANDIN, "harness_proposal.cpp": PROPOSAL_WRAPPER}
        for name, text in files.items():
            with open(os.path.join(workdir, name), "w") as f:
                f.write(text)
        library = compile_shared_library(workdir, os.path.join(workdir, "harness_proposal.cpp"),
                                         os.path.join(workdir, "harness_proposal.so"), f"the fork's {PROPOSAL_SOURCE}")
        return ForkProposals(library)


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
