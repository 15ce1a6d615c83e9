"""The backbones ``cfg.symbol`` chooses from, one record each, registered in this one table.

A record says everything that depends on the backbone: what its body builds (``features(data,
batch_norm, fp16, compiled_deformable) -> features``, float16 with ``fp16``; deformable layers from
lib/ops' compiled CPU operators with ``compiled_deformable``, see symbols/deformable.py), the features'
stride (the anchors of the loader and the proposal layers, the pooling scale and the FocusPixel cells
all follow it), its batch-norm epsilon, its heads, the parameter prefixes always kept fixed, which body
parameters an ImageNet checkpoint provides, the published test network's parameter manifest (under
tests/data, when there is one), the GluonCV model its ImageNet weights are converted from
(tools/convert_gluoncv_resnet.py, when there is one) and ``res4``, the internal output the reference's mask
network feeds its RPN with (the stride-16 res4 of the ResNets; None: the backbone cannot train masks). Adding a backbone is one ``register`` call here.
"""
from collections import namedtuple
from functools import partial

from symbols import mobilenetv2, resnet

# Head widths: RPN 3x3 conv, R-CNN 1x1 reduction before pooling, the two fully connected layers; the
# bilinear samples per pooled bin side; and how the R-CNN classification loss is normalised. The tiny
# heads take 2x2 samples instead of the published 4x4: MXNet's CPU deformable PS-ROI pooling is
# single-threaded and was half of a CPU training step (BENCHMARKS.md, "Network on the CPU"); sampling
# does not change any parameter shape. cls_normalisation "valid" divides the R-CNN softmax loss by the
# batch's labelled rois (the reference ResNets); "rois" by all rois of the batch, TRAIN.RPN_POST_NMS_TOP_N
# per chip, ignored ones included (the reference MobileNetV2: 1 / (300 x chips), no normalisation).
# mask_channels: the width of the mask branch's convolutions and deconvolution (TRAIN.WITH_MASK).
HeadSpec = namedtuple("HeadSpec", ["rpn_channels", "rcnn_channels", "fc_channels", "samples_per_part",
                                   "cls_normalisation", "mask_channels"])
PUBLISHED_RESNET_HEAD = HeadSpec(rpn_channels=512, rcnn_channels=256, fc_channels=1024, samples_per_part=4,
                                 cls_normalisation="valid", mask_channels=256)
TINY_RESNET_HEAD = HeadSpec(rpn_channels=64, rcnn_channels=16, fc_channels=128, samples_per_part=2,
                            cls_normalisation="valid", mask_channels=16)
PUBLISHED_MOBILENET_HEAD = HeadSpec(rpn_channels=256, rcnn_channels=256, fc_channels=512, samples_per_part=4,
                                    cls_normalisation="rois", mask_channels=256)
TINY_MOBILENET_HEAD = HeadSpec(rpn_channels=64, rcnn_channels=16, fc_channels=128, samples_per_part=2,
                               cls_normalisation="rois", mask_channels=16)

Backbone = namedtuple("Backbone", ["name", "features", "stride", "bn_eps", "head", "fixed_prefixes",
                                   "is_imagenet_parameter", "manifest", "gluoncv_model", "res4"])

BACKBONES = {}


def register(backbone):
    """Add ``backbone`` to the table ``cfg.symbol`` is looked up in (a name is registered once)."""
    if backbone.name in BACKBONES:
        raise ValueError(f"backbone {backbone.name!r} is registered twice")
    BACKBONES[backbone.name] = backbone
    return backbone


def _resnet(name, head, manifest=None, gluoncv_model=None):
    return register(Backbone(name, partial(resnet.resnet_features, spec=resnet.RESNETS[name]), resnet.FEATURE_STRIDE,
                             resnet.BN_EPS, head, (resnet.INPUT_NORMALISER,), resnet.is_imagenet_parameter, manifest,
                             gluoncv_model, resnet.res4_output(resnet.RESNETS[name])))


def _mobilenet(name, head, manifest=None):
    return register(Backbone(name, partial(mobilenetv2.mobilenetv2_features, spec=mobilenetv2.MOBILENETS[name]),
                             mobilenetv2.FEATURE_STRIDE, mobilenetv2.BN_EPS, head, (),
                             mobilenetv2.is_imagenet_parameter, manifest, None, None))


_resnet("resnet101", PUBLISHED_RESNET_HEAD, "sniper_res101_test_params.json", "resnet101_v2")
_resnet("resnet50", PUBLISHED_RESNET_HEAD, gluoncv_model="resnet50_v2")
_resnet("resnet_tiny", TINY_RESNET_HEAD)
_mobilenet("mobilenetv2", PUBLISHED_MOBILENET_HEAD, "sniper_mobilenetv2_test_params.json")
_mobilenet("mobilenetv2_tiny", TINY_MOBILENET_HEAD)


class UnknownBackboneError(ValueError):
    """A ``symbol`` no backbone is registered under."""


def backbone_of(cfg_or_name):
    """The Backbone of a config's ``symbol`` (or of a name); one line listing the registered ones otherwise."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else cfg_or_name.symbol
    if name not in BACKBONES:
        raise UnknownBackboneError(f"config key symbol: unknown backbone {name!r} (registered: "
                                   f"{', '.join(sorted(BACKBONES))})")
    return BACKBONES[name]


def feature_stride(cfg):
    """The stride of ``cfg.symbol``'s features, in input pixels per feature cell."""
    return backbone_of(cfg).stride


def is_imagenet_parameter(name):
    """True for a body parameter an ImageNet checkpoint of one of the backbones provides (their names differ)."""
    return any(backbone.is_imagenet_parameter(name) for backbone in BACKBONES.values())
