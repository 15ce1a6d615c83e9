"""The instance-mask branch of the reference's mask network (symbols/faster/resnet_mx_101_e2e_mask.py of
SNIPER, TRAIN.WITH_MASK), with its parameter names and shapes.

Per mask roi (up to MASK_ROIS_PER_CHIP positive rois per chip, chosen by the MultiProposalTargetMask
operator of lib/ops): a plain 14x14 PS-ROI pooling of the R-CNN's 1x1-reduced features regresses part
offsets (``mask_offset``, learning rate x0.01, as the box head's ``offset``), a deformable 14x14 pooling
with them feeds four 3x3 convolutions (``mask_conv_3x3_{1..4}``, ReLUs), a 2x2 stride-2 deconvolution
without bias (``mask_deconv``, ReLU) to 28x28, and a 1x1 convolution ``mask_out`` with 2 x C channels
for the C foreground classes: channel c is the "background" logit of class c, channel C + c its
"object" logit. The loss picks the two logits of the roi's gt class (the MaskRcnnTarget operator's
class ids, 0-based) and takes a softmax loss per pixel against its 28x28 target (1 inside the gt
polygon, 0 outside, -1 ignored: rois without a mask), "valid"-normalised by the labelled pixels of the
batch, the fp16 loss scale as weight. With fp16 the four convolutions run in float16 (the reference casts
there); the deconvolution and what follows stay float32.

At test time ``mask_probabilities`` turns the logits into the per-class object probability
(R, C, 28, 28), the softmax of each class's logit pair (lib/inference/masks.py pastes them).
"""
import mxnet as mx

from symbols.backbones import feature_stride
from symbols.deformable import deformable_roi_pool

MASK_POOLED_SIZE = 14
MASK_SIZE = 2 * MASK_POOLED_SIZE  # after the stride-2 deconvolution
MASK_CONVS = 4
MASK_ROIS_PER_CHIP = 50  # MultiProposalTargetMask's max_masks, MaskRcnnTarget's num_proposals
# Floats per row of the training input gt_masks (the loader encodes its rows, lib/data/chip_masks.py): the
# reference's max_poly_len, MaskRcnnTarget's max_polygon_len.
MAX_POLYGON_LEN = 500
# What the fork's MultiProposalTargetMask fixes in its kernel (lib/ops): the config must agree.
MASK_PROPOSAL_FIXED = {"PROPOSAL_TARGET_RULES": "reference", "FG_THRESH": 0.5, "BBOX_STDS": [0.1, 0.1, 0.2, 0.2]}
MASK_OPERATOR_FIXED = ("rules", "fg_thresh", "bbox_stds")  # MultiProposalTarget's attributes for those keys


def proposal_target_mask_attrs(cfg, chips_per_device):
    """MultiProposalTargetMask's attributes from the config. The operator is the fork's (its rules, fg
    threshold and box-target stds are fixed): a config asking for others is refused, naming the key
    (non-zero TRAIN.BBOX_MEANS as for MultiProposalTarget)."""
    from lib.ops import proposal_target_attrs  # the attributes both proposal-target operators share

    for key, fixed in MASK_PROPOSAL_FIXED.items():
        value = cfg.TRAIN[key]
        if (list(value) if isinstance(fixed, list) else value) != fixed:
            raise ValueError(f"config key TRAIN.{key} = {value!r}: the mask network's proposal targets "
                             f"(MultiProposalTargetMask, the reference's) have {fixed!r}")
    return {
        **{key: value for key, value in proposal_target_attrs(cfg, feature_stride(cfg)).items()
           if key not in MASK_OPERATOR_FIXED},
        "batch_size": chips_per_device,
        "max_masks": MASK_ROIS_PER_CHIP,
        "max_gts": cfg.TRAIN.MAX_GT_PER_CHIP,
    }


def mask_logits(cfg, reduced, rois, head, num_fg_classes, fp16, compiled_deformable):
    """(R, 2 C, 28, 28) logits of the R ``rois`` (R, 5) on the reduced features ``reduced``."""
    hidden = deformable_roi_pool(reduced, rois, "mask_", MASK_POOLED_SIZE, 1.0 / feature_stride(cfg),
                                 head.rcnn_channels, head.samples_per_part, compiled_deformable)
    if fp16:
        hidden = mx.sym.Cast(hidden, dtype="float16", name="mask_pool_fp16")
    for index in range(1, MASK_CONVS + 1):
        hidden = mx.sym.Convolution(hidden, num_filter=head.mask_channels, kernel=(3, 3), pad=(1, 1),
                                    name=f"mask_conv_3x3_{index}")
        hidden = mx.sym.Activation(hidden, act_type="relu", name=f"mask_relu_{index}")
    if fp16:
        hidden = mx.sym.Cast(hidden, dtype="float32", name="mask_convs_fp32")
    hidden = mx.sym.Deconvolution(hidden, num_filter=head.mask_channels, kernel=(2, 2), stride=(2, 2),
                                  no_bias=True, name="mask_deconv")
    hidden = mx.sym.Activation(hidden, act_type="relu", name="mask_deconv_relu")
    return mx.sym.Convolution(hidden, num_filter=2 * num_fg_classes, kernel=(1, 1), name="mask_out")


def mask_loss(logits, targets, class_ids, num_fg_classes, grad_scale):
    """The per-pixel two-way softmax loss ``mask_prob`` (R, 2, 28, 28) of the gt class's logit pair.

    ``targets`` (R, 28, 28) hold 1 / 0 / -1 (ignored); ``class_ids`` (R, 28, 28) the roi's 0-based
    foreground class at every pixel (MaskRcnnTarget's layout, which ``pick`` takes as it is)."""
    background = mx.sym.pick(logits, index=class_ids, axis=1, keepdims=True, name="mask_background_logit")
    foreground = mx.sym.pick(logits, index=class_ids + num_fg_classes, axis=1, keepdims=True,
                             name="mask_object_logit")
    pair = mx.sym.concat(background, foreground, dim=1, name="pred_cat")
    return mx.sym.SoftmaxOutput(pair, label=targets, multi_output=True, normalization="valid", use_ignore=True,
                                ignore_label=-1, grad_scale=grad_scale, name="mask_prob")


def mask_probabilities(logits, num_fg_classes):
    """(R, C, 28, 28): per class, the softmax probability of the object logit against its background one."""
    pairs = mx.sym.Reshape(logits, shape=(-1, 2, num_fg_classes, MASK_SIZE, MASK_SIZE), name="mask_pairs")
    prob = mx.sym.softmax(pairs, axis=1, name="mask_pair_prob")
    prob = mx.sym.slice_axis(prob, axis=1, begin=1, end=2)
    return mx.sym.Reshape(prob, shape=(-1, num_fg_classes, MASK_SIZE, MASK_SIZE), name="mask_prob")
