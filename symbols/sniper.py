"""SNIPER's Faster R-CNN: a backbone of symbols/backbones.py (its body, stride and head widths), RPN,
deformable PS-ROI-pooling R-CNN head (spec section 6), and optionally AutoFocus's FocusPixel branch.

One builder makes the training, test and RPN-only graphs, so they share every parameter name. What
a run derives (the class count from the dataset, the chips per device from the trainer) comes in as
arguments; everything else comes from the frozen config.
Training uses the batch-wide MultiProposalTarget operator of lib/ops; testing uses the reference's
proposal rules (lib/boxes/proposals.py as an operator) or MXNet's stock MultiProposal. Output names are part
of the contract with lib/train (metrics) and lib/inference.

AutoFocus (network.AUTO_FOCUS; Najibi, Singh, Davis, ICCV 2019): the FocusPixel branch reads the same
features as both heads (3x3 conv 256, 1x1 conv 256, 1x1 conv 2, ReLUs between) and predicts, per
feature cell, whether it belongs to a small object. Training adds the input ``scale_label`` (B, H*W)
(1 / 0 / -1 ignore, lib/data/focus_labels.py) and a softmax loss over the two channels normalised by
the number of labelled cells of the batch (as the reference: "valid" normalisation, only the fp16 loss
scale as weight); the test graph adds the channel softmax ``scale_prob`` (B, 2, H, W), channel 1 the
FocusPixel probability. Both are appended after the existing outputs (the reference puts ``scale_prob``
among them; outputs are read by name here).

Instance masks (TRAIN.WITH_MASK; the reference's resnet_mx_101_e2e_mask): the RPN reads res4 alone (the
reference's mask network does, so its ``rpn_conv_3x3`` has 1024 input channels), the proposal targets
come from MultiProposalTargetMask (the box head's rois plus up to 50 mask rois per chip and their gt
indices), MaskRcnnTarget rasterises the input ``gt_masks`` (chips, 100, 500) onto them, and the mask
branch of symbols/mask.py adds the outputs ``mask_prob`` (its loss) and ``mask_targets`` (blocked, for
the MaskLogLoss metric) after the others. ``mask_inference_symbol`` is the test graph of that branch
on given boxes.
"""
from collections import namedtuple

import mxnet as mx

from symbols.batch_norm import BatchNormPolicy
from symbols.backbones import backbone_of
from symbols.deformable import deformable_roi_pool
from symbols.mask import MASK_ROIS_PER_CHIP, MASK_SIZE, MAX_POLYGON_LEN, mask_logits, mask_loss, mask_probabilities, \
    proposal_target_mask_attrs

FOCUS_CHANNELS = 256  # the FocusPixel branch's two hidden convolutions

# The RPN head's outputs the losses and the proposal layers read.
RpnOutputs = namedtuple("RpnOutputs", ["cls_score_reshape", "cls_prob_map", "bbox_pred"])

POOLED_SIZE = 7
RPN_BBOX_LOSS_WEIGHT = 3.0  # RPN smooth-L1 is scaled by 3 / (chips * RPN_BATCH_SIZE)
RCNN_BBOX_NORMALISER = 188.0  # R-CNN smooth-L1 is scaled by 1 / (188 * TRAIN.RCNN_BBOX_LOSS_CHIPS or chips)
# The proposal-target operator (and its gt/im_info/valid_ranges inputs) form this context group: its
# library registers a CPU kernel only, so GPU training binds with group2ctxs={group: [mx.cpu(i), ...]}.
PROPOSAL_TARGET_GROUP = "proposal_target"


def training_symbol(cfg, num_classes, chips_per_device, rpn_only=False, compiled_deformable=False):
    """The training graph: outputs rpn_cls_prob, rpn_bbox_loss, then (unless ``rpn_only``) cls_prob,
    bbox_loss and rcnn_label (the proposal-target labels, gradient-blocked, for metrics), with
    network.AUTO_FOCUS scale_prob (the FocusPixel softmax loss on the input ``scale_label``), and with
    TRAIN.WITH_MASK mask_prob and mask_targets (the mask loss on the input ``gt_masks``).

    ``num_classes`` (background included) comes from the dataset and ``chips_per_device`` from the
    trainer, which hands the same number to the loader: the losses are normalised by it.
    ``compiled_deformable`` builds the deformable layers from lib/ops' compiled CPU operators (same
    parameters; ``symbols.use_compiled_deformable`` decides it from the contexts and the config).
    """
    features, rpn = _features_and_rpn(cfg, is_train=True, compiled_deformable=compiled_deformable)
    return _training_outputs(cfg, features, rpn, num_classes, chips_per_device, rpn_only, compiled_deformable)


def inference_symbol(cfg, num_classes, rpn_only=False, compiled_deformable=False):
    """The test graph: outputs rois, cls_prob_reshape, bbox_pred_reshape, im_ids, chip_ids, im_info, and
    with network.AUTO_FOCUS scale_prob; with ``rpn_only`` rois, rois_score, im_ids, chip_ids, im_info
    (proposal extraction). ``compiled_deformable`` as for ``training_symbol``."""
    features, rpn = _features_and_rpn(cfg, is_train=False, compiled_deformable=compiled_deformable)
    return _test_outputs(cfg, features, rpn, num_classes, rpn_only, compiled_deformable)


def mask_inference_symbol(cfg, num_classes, compiled_deformable=False):
    """The mask branch at test time on given boxes: inputs ``data`` and ``mask_rois`` (R, 5) as
    [chip index, x1, y1, x2, y2] in the chip's pixels; output ``mask_prob`` (R, C, 28, 28), per foreground
    class the probability that the pixel belongs to the object (C = ``num_classes`` - 1). Its parameters
    are those of the TRAIN.WITH_MASK training graph (the body, conv_new_1 and the mask branch)."""
    fp16 = bool(cfg.TEST.fp16)
    features = _body_features(cfg, is_train=False, fp16=fp16, compiled_deformable=compiled_deformable)
    num_classes = _checked_num_classes(num_classes)
    head = backbone_of(cfg).head
    logits = mask_logits(cfg, _reduced_features(features, head), mx.sym.var("mask_rois"), head, num_classes - 1,
                         fp16, compiled_deformable)
    return mask_probabilities(logits, num_classes - 1)


def _features_and_rpn(cfg, is_train, compiled_deformable):
    """The body's features (float32) and the RPN head on them. With ``TRAIN.fp16`` (training) or
    ``TEST.fp16`` (testing) the body runs in float16 after its first layer up to the features (spec
    section 7): the input, the first layer and everything after the features stay float32."""
    fp16 = bool(cfg.TRAIN.fp16 if is_train else cfg.TEST.fp16)
    features = _body_features(cfg, is_train, fp16, compiled_deformable)
    head = backbone_of(cfg).head
    num_anchors = cfg.network.NUM_ANCHORS
    rpn_input = features
    if cfg.TRAIN.WITH_MASK:  # the reference's mask network: the RPN on res4 alone
        rpn_input = features.get_internals()[backbone_of(cfg).res4]
        if fp16:
            rpn_input = mx.sym.Cast(rpn_input, dtype="float32", name="res4_fp32")

    rpn = mx.sym.Convolution(rpn_input, num_filter=head.rpn_channels, kernel=(3, 3), pad=(1, 1),
                             name="rpn_conv_3x3")
    rpn = mx.sym.Activation(rpn, act_type="relu", name="rpn_relu")
    rpn_cls_score = mx.sym.Convolution(rpn, num_filter=2 * num_anchors, kernel=(1, 1), name="rpn_cls_score")
    rpn_bbox_pred = mx.sym.Convolution(rpn, num_filter=4 * num_anchors, kernel=(1, 1), name="rpn_bbox_pred")
    # (B, 2A, H, W) -> (B, 2, A*H, W): channel 0 holds the A background scores, matching the
    # iterator's labels in (a, h, w) order and MultiProposal's (background A, foreground A) layout.
    rpn_cls_score_reshape = mx.sym.Reshape(rpn_cls_score, shape=(0, 2, -1, 0), name="rpn_cls_score_reshape")
    rpn_cls_act = mx.sym.SoftmaxActivation(rpn_cls_score_reshape, mode="channel", name="rpn_cls_act")
    rpn_cls_prob_map = mx.sym.Reshape(rpn_cls_act, shape=(0, 2 * num_anchors, -1, 0),
                                      name="rpn_cls_prob_reshape")
    return features, RpnOutputs(rpn_cls_score_reshape, rpn_cls_prob_map, rpn_bbox_pred)


def _body_features(cfg, is_train, fp16, compiled_deformable):
    """The body's features, cast back to float32 after a float16 body."""
    body = backbone_of(cfg)
    if cfg.TRAIN.WITH_MASK and body.res4 is None:
        raise ValueError(f"config key TRAIN.WITH_MASK: the {cfg.symbol} body has no res4 for the mask network's "
                         f"RPN; use a ResNet (symbol resnet101, resnet50 or resnet_tiny)")
    batch_norm = BatchNormPolicy(cfg.network.BN_MOMENTUM, training=is_train, eps=body.bn_eps,
                                 frozen_prefixes=cfg.network.FIXED_PARAMS)
    if compiled_deformable and fp16:
        raise ValueError("fp16 with the compiled deformable operators: they are float32 host kernels")
    features = body.features(mx.sym.var("data"), batch_norm=batch_norm, fp16=fp16,
                             compiled_deformable=compiled_deformable)
    if fp16:
        features = mx.sym.Cast(features, dtype="float32", name="features_fp32")
    return features


def _training_outputs(cfg, features, rpn, num_classes, chips_per_device, rpn_only, compiled_deformable):
    backbone = backbone_of(cfg)
    head = backbone.head
    loss_scale = float(cfg.TRAIN.fp16_loss_scale) if cfg.TRAIN.fp16 else 1.0
    rpn_cls_prob = mx.sym.SoftmaxOutput(rpn.cls_score_reshape, label=mx.sym.var("label"), multi_output=True,
                                        normalization="valid", use_ignore=True, ignore_label=-1,
                                        grad_scale=loss_scale, name="rpn_cls_prob")
    rpn_bbox_loss = _smooth_l1_loss(
        rpn.bbox_pred, mx.sym.var("bbox_target"), mx.sym.var("bbox_weight"),
        RPN_BBOX_LOSS_WEIGHT / (chips_per_device * cfg.TRAIN.RPN_BATCH_SIZE) * loss_scale, "rpn_bbox_loss")
    if rpn_only:
        return mx.sym.Group([rpn_cls_prob, rpn_bbox_loss])

    from lib import ops  # registers mx.sym.MultiProposalTarget(Mask), MaskRcnnTarget

    num_classes = _checked_num_classes(num_classes)
    proposal_inputs = (mx.sym.BlockGrad(rpn.cls_prob_map), mx.sym.BlockGrad(rpn.bbox_pred), mx.sym.var("im_info"),
                       mx.sym.var("gt_boxes"), mx.sym.var("valid_ranges"))
    with mx.AttrScope(ctx_group=PROPOSAL_TARGET_GROUP):
        if cfg.TRAIN.WITH_MASK:
            targets = mx.sym.MultiProposalTargetMask(*proposal_inputs, name="proposal_target",
                                                     **proposal_target_mask_attrs(cfg, chips_per_device))
        else:
            targets = mx.sym.MultiProposalTarget(*proposal_inputs, name="proposal_target",
                                                 **ops.proposal_target_attrs(cfg, backbone.stride))
    # rois (B*R, 5), labels (B*R,), box targets and weights (B*R, 4), R = TRAIN.RPN_POST_NMS_TOP_N
    rois, rcnn_label, rcnn_bbox_target, rcnn_bbox_weight = (mx.sym.BlockGrad(targets[i]) for i in range(4))
    if cfg.TRAIN.WITH_MASK:  # the mask operator's labels are (B*R, 1), as the fork's
        rcnn_label = mx.sym.Reshape(rcnn_label, shape=(-1,), name="label_reshape")
    reduced = _reduced_features(features, head)
    cls_score, bbox_pred = _rcnn_head(reduced, rois, backbone, num_classes, compiled_deformable)
    if head.cls_normalisation == "valid":
        cls_normalisation = dict(normalization="valid", grad_scale=loss_scale)
    else:
        rois_per_batch = cfg.TRAIN.RPN_POST_NMS_TOP_N * chips_per_device
        cls_normalisation = dict(normalization="null", grad_scale=loss_scale / rois_per_batch)
    cls_prob = mx.sym.SoftmaxOutput(cls_score, label=rcnn_label, use_ignore=True, ignore_label=-1, name="cls_prob",
                                    **cls_normalisation)
    normaliser_chips = cfg.TRAIN.RCNN_BBOX_LOSS_CHIPS or chips_per_device  # the reference: 16 at any batch
    bbox_loss = _smooth_l1_loss(bbox_pred, rcnn_bbox_target, rcnn_bbox_weight,
                                loss_scale / (RCNN_BBOX_NORMALISER * normaliser_chips), "bbox_loss")
    outputs = [rpn_cls_prob, rpn_bbox_loss, cls_prob, bbox_loss, mx.sym.BlockGrad(rcnn_label, name="rcnn_label")]
    if cfg.network.AUTO_FOCUS:
        # (B, 2, H, W) -> (B, 2, H*W) against scale_label (B, H*W), cells in row-major order
        focus_score = mx.sym.Reshape(_focus_branch(features), shape=(0, 2, -1), name="conv_new_out_reshape")
        outputs.append(mx.sym.SoftmaxOutput(focus_score, label=mx.sym.var("scale_label"), multi_output=True,
                                            normalization="valid", use_ignore=True, ignore_label=-1,
                                            grad_scale=loss_scale, name="scale_prob"))
    if cfg.TRAIN.WITH_MASK:
        outputs += _mask_training_outputs(cfg, reduced, targets, head, num_classes - 1, chips_per_device,
                                          loss_scale, compiled_deformable)
    return mx.sym.Group(outputs)


def _mask_training_outputs(cfg, reduced, targets, head, num_fg_classes, chips_per_device, loss_scale,
                           compiled_deformable):
    """[mask_prob, mask_targets]: the mask loss on MultiProposalTargetMask's mask rois (B*50, 5) and their
    gt indices (B*50, 1), -1 for none, whose 28x28 targets MaskRcnnTarget rasterises from ``gt_masks``."""
    mask_rois, mask_ids = mx.sym.BlockGrad(targets[4]), mx.sym.BlockGrad(targets[5])
    with mx.AttrScope(ctx_group=PROPOSAL_TARGET_GROUP):
        mask_targets, class_ids = mx.sym.MaskRcnnTarget(
            mask_rois, mx.sym.var("gt_masks"), mask_ids, name="mask_target", batch_size=chips_per_device,
            mask_size=MASK_SIZE, num_proposals=MASK_ROIS_PER_CHIP, max_polygon_len=MAX_POLYGON_LEN,
            max_num_gts=cfg.TRAIN.MAX_GT_PER_CHIP, num_classes=num_fg_classes)
    mask_targets, class_ids = mx.sym.BlockGrad(mask_targets), mx.sym.BlockGrad(class_ids)
    logits = mask_logits(cfg, reduced, mask_rois, head, num_fg_classes, bool(cfg.TRAIN.fp16), compiled_deformable)
    return [mask_loss(logits, mask_targets, class_ids, num_fg_classes, loss_scale),
            mx.sym.BlockGrad(mask_targets, name="mask_targets")]


def _test_outputs(cfg, features, rpn, num_classes, rpn_only, compiled_deformable):
    im_info, im_ids, chip_ids = mx.sym.var("im_info"), mx.sym.var("im_ids"), mx.sym.var("chip_ids")
    test = cfg.TEST
    proposals = _test_proposals(cfg, rpn, im_info, rpn_only)
    if rpn_only:
        return mx.sym.Group([proposals[0], proposals[1], im_ids, chip_ids, im_info])
    num_classes = _checked_num_classes(num_classes)
    backbone = backbone_of(cfg)
    cls_score, bbox_pred = _rcnn_head(_reduced_features(features, backbone.head), proposals[0], backbone, num_classes,
                                      compiled_deformable)
    cls_prob = mx.sym.softmax(cls_score, axis=-1, name="cls_prob")
    per_image = test.RPN_POST_NMS_TOP_N
    cls_prob = mx.sym.Reshape(cls_prob, shape=(-1, per_image, num_classes), name="cls_prob_reshape")
    bbox_pred = mx.sym.Reshape(bbox_pred, shape=(-1, per_image, 4), name="bbox_pred_reshape")
    outputs = [proposals[0], cls_prob, bbox_pred, im_ids, chip_ids, im_info]
    if cfg.network.AUTO_FOCUS:
        outputs.append(mx.sym.SoftmaxActivation(_focus_branch(features), mode="channel", name="scale_prob"))
    return mx.sym.Group(outputs)


def _test_proposals(cfg, rpn, im_info, rpn_only):
    """The test RPN proposal layer named ``rois``: the reference's rules (lib.ops.proposal_layer,
    a host operator) or MXNet's stock MultiProposal (``TEST.PROPOSAL_LAYER``). Either reads the minimum
    size in the pixels of ``im_info``'s extent: the detector hands it scale 1."""
    test, network, stride = cfg.TEST, cfg.network, backbone_of(cfg).stride
    settings = dict(scales=tuple(network.ANCHOR_SCALES), ratios=tuple(network.ANCHOR_RATIOS))
    if test.PROPOSAL_LAYER == "reference":
        from lib.ops.proposal_layer import proposal_symbol

        return proposal_symbol(rpn.cls_prob_map, rpn.bbox_pred, im_info, "rois", stride,
                               pre_nms_top_n=test.RPN_PRE_NMS_TOP_N, post_nms_top_n=test.RPN_POST_NMS_TOP_N,
                               nms_thresh=test.RPN_NMS_THRESH, min_size=test.RPN_MIN_SIZE, **settings)
    return mx.sym.contrib.MultiProposal(
        cls_prob=rpn.cls_prob_map, bbox_pred=rpn.bbox_pred, im_info=im_info, name="rois",
        feature_stride=stride, rpn_pre_nms_top_n=test.RPN_PRE_NMS_TOP_N,
        rpn_post_nms_top_n=test.RPN_POST_NMS_TOP_N, threshold=test.RPN_NMS_THRESH,
        rpn_min_size=test.RPN_MIN_SIZE, output_score=rpn_only, **settings)


def _focus_branch(features):
    """AutoFocus's FocusPixel scores (B, 2, H, W) on the heads' features: 3x3 and 1x1 convs, then 2 channels."""
    hidden = mx.sym.Convolution(features, num_filter=FOCUS_CHANNELS, kernel=(3, 3), pad=(1, 1), name="conv_new_2")
    hidden = mx.sym.Activation(hidden, act_type="relu", name="conv_new_2_relu")
    hidden = mx.sym.Convolution(hidden, num_filter=FOCUS_CHANNELS, kernel=(1, 1), name="conv_new_3")
    hidden = mx.sym.Activation(hidden, act_type="relu", name="conv_new_3_relu")
    return mx.sym.Convolution(hidden, num_filter=2, kernel=(1, 1), name="conv_new_out")


def _reduced_features(features, head):
    """The 1x1 reduction both R-CNN heads (boxes, masks) pool from."""
    reduced = mx.sym.Convolution(features, num_filter=head.rcnn_channels, kernel=(1, 1), name="conv_new_1")
    return mx.sym.Activation(reduced, act_type="relu", name="conv_new_1_relu")


def _rcnn_head(reduced, rois, backbone, num_classes, compiled_deformable):
    """Deformable PS-ROI pooling 7x7 of the reduced features, two FC layers, classifier and class-agnostic box."""
    head = backbone.head
    hidden = deformable_roi_pool(reduced, rois, "", POOLED_SIZE, 1.0 / backbone.stride, head.rcnn_channels,
                                 head.samples_per_part, compiled_deformable)
    for index in (1, 2):
        hidden = mx.sym.FullyConnected(hidden, num_hidden=head.fc_channels, name=f"fc_new_{index}")
        hidden = mx.sym.Activation(hidden, act_type="relu", name=f"fc_new_{index}_relu")
    cls_score = mx.sym.FullyConnected(hidden, num_hidden=num_classes, name="cls_score")
    bbox_pred = mx.sym.FullyConnected(hidden, num_hidden=4, name="bbox_pred")
    return cls_score, bbox_pred


def _smooth_l1_loss(pred, target, weight, grad_scale, name):
    """Weighted smooth-L1 (sigma 1) whose gradient is scaled by `grad_scale`."""
    loss = weight * mx.sym.smooth_l1(pred - target, scalar=1.0)
    return mx.sym.MakeLoss(loss, grad_scale=grad_scale, name=name)


def _checked_num_classes(num_classes):
    if num_classes is None or int(num_classes) != num_classes or num_classes < 2:
        raise ValueError(f"the R-CNN head needs the class count (background included, at least 2), got "
                         f"{num_classes!r}; load_roidb derives it from the dataset")
    return int(num_classes)
