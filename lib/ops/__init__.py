"""Compiled operators (lib/ops/src, built by ``make`` into lib/ops/libsniper_ops.so).

Importing this package loads the library once with ``mx.library.load``, after which

    rois, labels, bbox_targets, bbox_weights = mx.sym.MultiProposalTarget(
        cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges, **proposal_target_attrs(cfg, feature_stride))

works, as do ``mx.nd.MultiProposalTarget`` and the aliases ``mx.sym.contrib.MultiProposalTarget`` /
``mx.nd.contrib.MultiProposalTarget``. Every attribute is required (rules, feature_stride, scales,
ratios, rpn_pre_nms_top_n, rpn_post_nms_top_n, threshold, rpn_min_size, fg_thresh, bbox_stds): the
operator refuses a missing one, so the config stays their one source. MXNet 1.9 puts a library
operator under its registered name at the top of ``mx.nd`` / ``mx.sym`` (only names starting with
``_contrib_`` go to ``contrib``), so the contrib names are Python aliases and a saved graph records
the op as ``MultiProposalTarget``; ``import lib.ops`` before ``mx.sym.load``. Inputs are positional
(a library operator has one variadic ``data`` argument, so ``cls_prob=...`` keywords are rejected);
outputs are ``<name>_output0..3``.

Semantics, per chip b (spec section 5), in chip pixels, R = ``rpn_post_nms_top_n``; a gt row is
real when its class is >= 0 (the loader pads with -1); ``valid_ranges[b]`` = (lo, hi) with -1 an
open end (0 and 512, the reference loader's open ends, are plain numbers).

Common to both rule sets: anchors ``grid_anchors(base_anchors(stride, ratios, scales), H, W, stride)``
(lib.boxes); the fg score of anchor a at (h, w) is ``cls_prob[b, A + a, h, w]``, its deltas
``bbox_pred[b, 4a:4a+4, h, w]`` (stds 1); decode and clip to ``im_info[b, :2]`` (height, width; 512 x
512 except at the coarsest scale); ``rpn_min_size`` is in chip pixels (not scaled by im_info[b, 2]);
the best ``rpn_pre_nms_top_n`` surviving boxes (0: all) enter a greedy NMS at ``threshold``; a roi's
label is the class of the first gt with its highest overlap if that overlap is > ``fg_thresh``, else 0
(all real gts label, whether the loader counts them valid or not); positives get weights 1. Backward
writes zeros: nothing flows back into the RPN through this op.

``rules="reference"`` (default, ``TRAIN.PROPOSAL_TARGET_RULES``): the published SNIPER's GPU operator
(multi_proposal_target.cu of its MXNet fork), reproduced to the bit on the parity harness:

* areas without the +1, ``(x2 - x1) * (y2 - y1)``, while intersections keep it, in every overlap
  (NMS and labels), in float32 compared with the double thresholds; this overlap exceeds the true IoU,
  so NMS suppresses more and the effective fg threshold of 0.5 is a true IoU of 0.41 / 0.46 / 0.48 for
  16 / 32 / 64 px rois;
* a box is dropped only when both ``x2 - x1`` and ``y2 - y1`` are < rpn_min_size, or when its area is
  ``< lo^2`` or ``>= hi^2``; decoding has no dw/dh cap;
* anchors in (a, h, w) order; among equal scores NMS takes the kernel's preferred array position
  (kernel_tie_order.h), its selections swapping elements as the kernel does;
* rois = the kept boxes, then ``[m, m, m + 200, m + 200]``, m = (b*A*H*W + slot) % 100, up to R; real gt
  j of n then overwrites slot R - n + j when ``lo^2 <= area <= hi^2`` (a gt out of that range leaves
  the slot's box; with n > R the first n - R gts have no slot); every roi, padding boxes included, is
  labelled (none is -1);
* targets: ``10 (gcx - cx) / (w + 1e-7)``, ``10 (gcy - cy) / (h + 1e-7)``, ``5 log(gw / (w + 1e-7))``,
  ``5 log(gh / (h + 1e-7))`` (10, 5 = 1 / bbox_stds) with the gt centre ``x1 + 0.5 gw`` (+0.5 px) and the
  roi centre ``x1 + 0.5 (w - 1)``; non-positive rows keep targets 1.0 with weights 0.
* Differences from the fork, all outside what the training loader sends: it takes the first n gt rows
  (n = number of real rows) where this takes the real rows (the same when padding rows trail); its
  buffers hold 16 chips; its ``rpn_pre_nms_top_n``, ``threshold``, ``rpn_min_size`` are fixed (6000
  ignored, 0.7, 3), here attributes.

``rules="exact"``: true IoU with +1 areas (float32 labels, double NMS), boxes dropped when either side
``x2 - x1 + 1`` is < rpn_min_size or sqrt of the +1 area lies outside the inclusive valid range;
anchors in (h, w, a) order, equal scores by that index; dw/dh capped at log(1000/16); rois = kept
proposals (at most R - g), the g in-range real gts in row order (at most R), then padding
``[b, 0, 0, stride - 1, stride - 1]`` labelled -1 with zero targets and weights; targets
``encode(roi, gt) / bbox_stds`` (lib.boxes), 0 on non-positives. With ``rpn_pre_nms_top_n=6000`` this is
the project's earlier operator.

dev/oracles/proposal_target.py states both in NumPy; docs/reference_differences.md lists what differs.

The two operators of the reference's mask training (``symbols/faster/resnet_mx_101_e2e_mask.py``)
follow the fork's GPU forwards (``multi_proposal_target_mask.cu``, ``mask_rcnn_target.cu``; its CPU
forwards are empty, so the GPU code is what trained), with the fork's attribute names and defaults
(every one optional), outputs and shapes; their inputs go by position or by the fork's names
(``cls_prob=...``: the Python fronts here map them). dev/oracles/mask_target.py transcribes both.

``MultiProposalTargetMask(cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges, rpn_pre_nms_top_n=6000,
rpn_post_nms_top_n=300, threshold=0.7, max_gts=100, max_masks=50, scales=(2, 4, 7, 10, 13, 16, 24),
ratios=(0.5, 1, 2), feature_stride=16, batch_size=16, rpn_min_size=4, bbox_scale=1, max_crowd=10,
workspace=128)`` -> ``rois (B*R, 5), label (B*R, 1), bbox_target (B*R, 4), bbox_weight (B*R, 4),
mask_rois (B*max_masks, 5), mask_ids (B*max_masks, 1)``; gt_boxes must be (B, max_gts, 5). Per chip:

* anchors by the fork's float32 GenerateAnchors (``floor(x + 0.5)``), element a*H*W + h*W + w, decoded
  without a dw/dh cap and clipped; a box is dropped when both ``x2 - x1`` and ``y2 - y1`` are < 3 (fixed:
  ``rpn_min_size`` is not read, as in the fork) or its area ``(x2 - x1)(y2 - y1)`` is ``< lo^2`` or
  ``>= hi^2`` (-1: open end);
* every anchor sorted by score (dropped ones at -1) with the host's ``std::sort`` (libstdc++: its order
  of equal scores), the first ``rpn_pre_nms_top_n`` positions (0: all) enter a greedy NMS keeping at most
  R: a box is suppressed when its overlap (+1 intersection, no-+1 areas, float32) with a kept one is
  ``> threshold``;
* rois = the kept boxes, then ``[t % 100, t % 100, t % 100 + 200, t % 100 + 200]`` for slot t; gt row t
  (t < min(R, max_gts), class != -1, ``lo^2 <= area < hi^2``) overwrites slot R - 1 - t;
* labels, targets, weights as ``rules="reference"`` above (fg threshold 0.5, factors 10, 10, 5, 5), with
  the gts taken as the first n rows, n = the rows whose class is not -1;
* mask rois: over the whole batch, the rows (chip after chip) with label > 0, at most B * max_masks (a
  chip may take more than max_masks), each with its matched gt row in mask_ids; the remaining rows i
  are ``[i % B, i % 200, i % 200, i % 200 + 100, i % 200 + 100]`` with id -1.

``rpn_pre_nms_top_n`` and ``threshold`` are fixed at 6000 and 0.7 in the fork's kernel, read here;
``batch_size``, ``rpn_min_size``, ``bbox_scale``, ``max_crowd``, ``workspace`` have no effect (in the fork
batch_size sized host buffers, the others were never read).

``MaskRcnnTarget(rois, mask_polys, mask_ids, mask_size=28, ignore_label=-1, num_proposals=50,
max_polygon_len=500, max_num_gts=100, batch_size=10, num_classes=80, workspace=512)`` -> ``mask_targets,
mask_cls``, both (B*num_proposals, M, M), M = mask_size; rois (B*num_proposals, 5), mask_polys (B,
max_num_gts, max_polygon_len) in the loader's encoding (per gt row: category, n, the n segment lengths,
the segments' x1, y1, x2, y2, ...; -1 padding), mask_ids (B*num_proposals, 1). Roi i = [b, x1, y1, x2, y2]
with id g != -1: the polygons of row (b, g) on an M x M grid over the roi, each side ``max(1, x2 - x1)``
(no +1) spanning M cells, rasterised by COCO's ``rleFrPoly`` rule (a cell is in when its square lies
inside: a rectangle from cell 7 to 21 fills cells 7..20) and united; targets 1 / 0 row-major (y, x),
mask_cls = the row's category (its first number, the loader's class - 1) in every cell. A roi with id -1,
or an id, image index or encoding outside its input (where the fork reads out of bounds or crashes),
keeps ``ignore_label`` targets and class 0. batch_size, num_classes, workspace have no effect (the
inputs' shapes size everything).

Devices: the library registers a CPU forward/backward only (a GPU forward that copies to the host
exists behind ``-DSNIPER_WITH_CUDA`` for these three operators). Under GPU contexts without it, place
the op on the CPU, e.g. build it inside ``mx.AttrScope(ctx_group="proposal_target")`` and bind with
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
OPERATOR_NAMES = ("MultiProposalTarget", "CompiledDeformablePSROIPooling", "DeformableIm2Col",
                  "MultiProposalTargetMask", "MaskRcnnTarget")
# The reference fork's input names of the operators its mask symbol calls by keyword.
KEYWORD_INPUTS = {"MultiProposalTargetMask": ("cls_prob", "bbox_pred", "im_info", "gt_boxes", "valid_ranges"),
                  "MaskRcnnTarget": ("rois", "mask_polys", "mask_ids")}
PROPOSAL_TARGET_RULES = ("reference", "exact")


def proposal_target_attrs(cfg, feature_stride):
    """MultiProposalTarget attributes from the config (the training graph's only source of them) and the
    backbone's ``feature_stride`` (its record's, symbols.backbones.feature_stride), so its anchors are the
    RPN targets' anchors. The operator encodes targets with zero means: a config
    with non-zero TRAIN.BBOX_MEANS would train targets the checkpoint code then mis-corrects.
    TRAIN.PROPOSAL_TARGET_RULES picks the rule set, TRAIN.RPN_PRE_NMS_TOP_N = 0 sends every box to NMS."""
    if any(cfg.TRAIN.BBOX_MEANS):
        raise ValueError(f"config key TRAIN.BBOX_MEANS = {list(cfg.TRAIN.BBOX_MEANS)}: the MultiProposalTarget "
                         f"operator encodes box targets with zero means; set it to [0, 0, 0, 0]")
    rules = cfg.TRAIN.PROPOSAL_TARGET_RULES
    if rules not in PROPOSAL_TARGET_RULES:
        raise ValueError(f"config key TRAIN.PROPOSAL_TARGET_RULES = {rules!r}: must be one of "
                         f"{', '.join(PROPOSAL_TARGET_RULES)}")
    if cfg.TRAIN.RPN_PRE_NMS_TOP_N < 0:
        raise ValueError(f"config key TRAIN.RPN_PRE_NMS_TOP_N = {cfg.TRAIN.RPN_PRE_NMS_TOP_N}: must be >= 0 "
                         f"(0: every proposal enters NMS)")
    return {
        "rules": rules,
        "feature_stride": feature_stride,
        "scales": tuple(cfg.network.ANCHOR_SCALES),
        "ratios": tuple(cfg.network.ANCHOR_RATIOS),
        "rpn_pre_nms_top_n": cfg.TRAIN.RPN_PRE_NMS_TOP_N,
        "rpn_post_nms_top_n": cfg.TRAIN.RPN_POST_NMS_TOP_N,
        "threshold": cfg.TRAIN.RPN_NMS_THRESH,
        "rpn_min_size": cfg.TRAIN.RPN_MIN_SIZE,
        "fg_thresh": cfg.TRAIN.FG_THRESH,
        "bbox_stds": tuple(cfg.TRAIN.BBOX_STDS),
    }


def _accepting_input_keywords(function, op_name, input_names):
    """``function`` (a library operator's generated front, inputs positional only) also taking its inputs
    by the fork's names, as the reference's symbol files pass them."""
    def operator(*inputs, **kwargs):
        given_twice = [name for name in input_names[:len(inputs)] if name in kwargs]
        if given_twice:
            raise TypeError(f"{op_name}: input {given_twice[0]} given both by position and by name")
        inputs += tuple(kwargs.pop(name) for name in input_names[len(inputs):] if name in kwargs)
        if len(inputs) != len(input_names):
            raise TypeError(f"{op_name}: takes the {len(input_names)} inputs {', '.join(input_names)} "
                            f"(by position or by name), got {len(inputs)}")
        return function(*inputs, **kwargs)
    operator.__name__ = op_name
    operator.__doc__ = f"{op_name}({', '.join(input_names)}, **attributes): see lib/ops/__init__.py."
    return operator


def load_library(path=LIBRARY_PATH):
    """Load the operator library once (later calls, or a second copy of this module, are no-ops)."""
    if not os.path.exists(path):
        raise ImportError(f"lib.ops: compiled operator library {path} is missing; run `make` in the repository root")
    if all(hasattr(mx.nd, name) for name in OPERATOR_NAMES):
        return
    mx.library.load(os.path.abspath(path), verbose=False)
    for namespace in (mx.nd, mx.sym):
        for name, input_names in KEYWORD_INPUTS.items():
            setattr(namespace, name, _accepting_input_keywords(getattr(namespace, name), name, input_names))
        for name in OPERATOR_NAMES:
            setattr(namespace.contrib, name, getattr(namespace, name))


load_library()
