"""Compiled operators (lib/ops/src, built by ``make`` into lib/ops/libsniper_ops.so).

Importing this package loads the library once with ``mx.library.load``, after which

    rois, labels, bbox_targets, bbox_weights = mx.sym.MultiProposalTarget(
        cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges,
        feature_stride=16, scales=(2, 4, 7, 10, 13, 16, 24), ratios=(0.5, 1, 2),
        rpn_pre_nms_top_n=6000, rpn_post_nms_top_n=300, threshold=0.7, rpn_min_size=3,
        fg_thresh=0.5, bbox_stds=(0.1, 0.1, 0.2, 0.2))

works, as do ``mx.nd.MultiProposalTarget`` and the aliases ``mx.sym.contrib.MultiProposalTarget`` /
``mx.nd.contrib.MultiProposalTarget``; ``proposal_target_attrs(cfg)`` gives the attributes from the
config. MXNet 1.9 puts a library operator under its registered name at the top of ``mx.nd`` /
``mx.sym`` (only names starting with ``_contrib_`` go to ``contrib``), so the contrib names are
Python aliases and a saved graph records the op as ``MultiProposalTarget``; ``import lib.ops``
before ``mx.sym.load``. Inputs are positional (a library operator has one variadic ``data``
argument, so ``cls_prob=...`` keywords are rejected); outputs are ``<name>_output0..3``.

Semantics, per chip b (spec section 5), in chip pixels:

* anchors = lib.boxes.anchors ``grid_anchors(base_anchors(stride, ratios, scales), H, W, stride)``,
  (h, w, a) order; fg score of anchor a at (h, w) is ``cls_prob[b, A + a, h, w]``, its deltas
  ``bbox_pred[b, 4a:4a+4, h, w]`` (stds 1);
* decode, clip to ``im_info[b, :2]`` (height, width), drop boxes narrower or shorter than
  ``rpn_min_size`` (not multiplied by ``im_info[b, 2]``: chips are already in scaled pixels) and boxes
  whose sqrt(area) is outside ``valid_ranges[b]`` (inclusive, -1 = open);
* keep the ``rpn_pre_nms_top_n`` best scores (ties: lower anchor index first), greedy NMS with IoU >
  ``threshold`` suppressing, keep at most ``R - g`` boxes, R = ``rpn_post_nms_top_n``, g = number of
  valid gts (non-padding, in the valid range, at most R);
* rois = [kept proposals, valid gts in row order, padding]; padding rows are
  ``[b, 0, 0, stride - 1, stride - 1]`` with label -1 and zero targets and weights;
* label = class of the gt (among all non-padding gts, valid or not) with the highest IoU if that IoU
  is > ``fg_thresh`` (first gt on ties), else 0; positives get ``encode(roi, gt) / bbox_stds`` and
  weights 1. A gt row is padding when its class is negative (the loader pads with -1).
* Backward writes zeros: nothing flows back into the RPN through this op.

Devices: the library registers a CPU forward/backward only (a GPU forward that copies to the host
exists behind ``-DSNIPER_WITH_CUDA``). Under GPU contexts without it, place the op on the CPU, e.g. build
it inside ``mx.AttrScope(ctx_group="proposal_target")`` and bind with
``group2ctx={"proposal_target": mx.cpu()}``, or copy the inputs with ``as_in_context(mx.cpu())``.

Two multi-core host replacements of MXNet 1.9.1's single-threaded CPU deformable kernels follow (the
network picks them with symbols/deformable.py; CPU only, float32, inputs positional as above):

``CompiledDeformablePSROIPooling(data, rois[, trans], spatial_scale, output_dim, group_size, pooled_size,
part_size=0, sample_per_part=1, trans_std=0, no_trans=False)`` -> ``output, top_count``, both (R,
output_dim, pooled, pooled): the attributes, inputs and outputs of ``_contrib_DeformablePSROIPooling``
(take output ``[0]``; without ``trans`` pass ``no_trans=True``). Per roi ``[b, x1, y1, x2, y2]``: the
corners are rounded, the box spans ``round(x1) * scale - 0.5 .. (round(x2) + 1) * scale - 0.5`` (at least
0.1 wide), bin (ph, pw) of part ``(floor(ph / pooled * part), ...)`` moves by ``trans[roi, 2 class (+1 for
y), part_h, part_w] * trans_std`` times the roi's width (height); its ``sample_per_part``^2 points are
dropped when more than half a cell outside the map, otherwise clamped onto it and sampled bilinearly
from channel ``(ctop * group + gh) * group + gw``; output = their mean (0 without any), top_count = how
many. Class of output channel ctop: ``ctop // (output_dim / classes)``, classes = trans.shape[1] / 2.
The backward gives data and trans the reference's gradients (the trans one treats the clamped point's
bilinear weights as functions of the unclamped position, as the reference does) and rois zeros.

``DeformableIm2Col(data, offset, kernel, stride=(1, 1), pad=(0, 0), dilate=(1, 1),
num_deformable_group=1)``: data (B, C, H, W), offset (B, 2 kh kw G, Ho, Wo) as
``_contrib_DeformableConvolution``'s -> columns (B, C kh kw, Ho, Wo): channel ``c kh kw + i kw + j`` at
(y, x) is channel c sampled at ``(y stride_h - pad_h + i dilate_h + dy, x stride_w - pad_w + j dilate_w
+ dx)``, (dy, dx) = offset channels ``2 (g kh kw + i kw + j)`` and ``+1`` of c's group g; points outside
``[0, H) x [0, W)`` give 0, the others are bilinear with the last row/column clamped. A 1x1 convolution
of the columns with the weight viewed as (F, C kh kw, 1, 1) (per ``num_group``) is the deformable
convolution. The backward gives data and offset the reference's col2im and coordinate gradients.

Both follow the reference's float32 operations and summation order: on the tests' inputs the
pooling's outputs and gradients and the convolution's data and offset gradients were bit-equal to
MXNet's (the tests allow 1e-4); the convolution's product is another BLAS call, and the pooling's
trans gradient sums in another order when part_size < pooled_size. Kernels run OpenMP loops over
rois, channels or blocks of sampling points with the calling engine worker's thread count
(OMP_NUM_THREADS, or MXNet's default of half the cores). MXNet passes library operators no gradient
request types: gradients are always written, never added (``grad_req="add"`` on their inputs, or
MXNET_EXEC_ENABLE_ADDTO=1, would be wrong).
"""
import os

import mxnet as mx

LIBRARY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsniper_ops.so")
OPERATOR_NAMES = ("MultiProposalTarget", "CompiledDeformablePSROIPooling", "DeformableIm2Col")


def proposal_target_attrs(cfg):
    """MultiProposalTarget attributes from the config (the training graph's only source of them), so
    its anchors are the RPN targets' anchors. The operator encodes targets with zero means: a config
    with non-zero TRAIN.BBOX_MEANS would train targets the checkpoint code then mis-corrects."""
    if any(cfg.TRAIN.BBOX_MEANS):
        raise ValueError(f"config key TRAIN.BBOX_MEANS = {list(cfg.TRAIN.BBOX_MEANS)}: the MultiProposalTarget "
                         f"operator encodes box targets with zero means; set it to [0, 0, 0, 0]")
    return {
        "feature_stride": cfg.network.RPN_FEAT_STRIDE,
        "scales": tuple(cfg.network.ANCHOR_SCALES),
        "ratios": tuple(cfg.network.ANCHOR_RATIOS),
        "rpn_pre_nms_top_n": cfg.TRAIN.RPN_PRE_NMS_TOP_N,
        "rpn_post_nms_top_n": cfg.TRAIN.RPN_POST_NMS_TOP_N,
        "threshold": cfg.TRAIN.RPN_NMS_THRESH,
        "rpn_min_size": cfg.TRAIN.RPN_MIN_SIZE,
        "fg_thresh": cfg.TRAIN.FG_THRESH,
        "bbox_stds": tuple(cfg.TRAIN.BBOX_STDS),
    }


def load_library(path=LIBRARY_PATH):
    """Load the operator library once (later calls, or a second copy of this module, are no-ops)."""
    if not os.path.exists(path):
        raise ImportError(f"lib.ops: compiled operator library {path} is missing; run `make` in the repository root")
    if all(hasattr(mx.nd, name) for name in OPERATOR_NAMES):
        return
    mx.library.load(os.path.abspath(path), verbose=False)
    for namespace in (mx.nd, mx.sym):
        for name in OPERATOR_NAMES:
            setattr(namespace.contrib, name, getattr(namespace, name))


load_library()
