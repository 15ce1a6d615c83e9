"""MobileNetV2 body of the reference's lightweight SNIPER: features at stride 32 from the last 1x1 conv.

The reference detector uses the whole ImageNet MobileNetV2 up to its last 1x1 convolution (1280
channels, stride 32) and no feature concatenation: a 3x3/2 convolution, seven sequences of inverted
residual blocks (t, c, n, s) = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
(6, 160, 3, 2), (6, 320, 1, 1), then the 1x1 convolution. A block is a 1x1 expansion to round(t x input
channels) (present even when t = 1), a 3x3 depthwise convolution carrying the stride, a linear 1x1
projection; every convolution is bias-free and followed by a BatchNorm (epsilon 1e-5, gamma learnt) and,
except the projection, ReLU6. Only the blocks after the first of a sequence add their input back (the
first one never does, even where the shapes would allow it).

Names follow the MXNet MobileNetV2 the reference was built from (`first-3x3-conv-conv2d`,
`seq-{i}-block{j}-{exp,depthwise,linear}-{conv2d,batchnorm}`, `last-1x1-conv-...`), the naming of its
ImageNet checkpoint (liangfu/mxnet-mobilenet-v2, `mobilenetv2-1_0`; inputs RGB minus the mean pixel,
as the project feeds them, with no input normaliser layer). The input goes straight into the first
convolution: unlike the ResNet there is no `bn_data`.
"""
from collections import namedtuple

import mxnet as mx

# (expansion t, output channels c, blocks n, stride of the first block s) of MobileNetV2 at width 1.
SEQUENCES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
             (6, 320, 1, 1))
FIRST_CHANNELS = 32
# multiplier scales the first conv and every sequence's channels (rounded); last_channels is the width of
# the final 1x1 convolution (1280 in the published network, which keeps it for multipliers <= 1).
MobileNetV2Spec = namedtuple("MobileNetV2Spec", ["multiplier", "last_channels"])

MOBILENETS = {
    "mobilenetv2": MobileNetV2Spec(multiplier=1.0, last_channels=1280),
    # For the synthetic CPU run: the same layers at a quarter of the width.
    "mobilenetv2_tiny": MobileNetV2Spec(multiplier=0.25, last_channels=256),
}

BN_EPS = 1e-5  # the reference's (and its ImageNet checkpoint's) value
FEATURE_STRIDE = 32
_PREFIXES = ("first-3x3-conv-", "seq-", "last-1x1-conv-")


def is_imagenet_parameter(name):
    """True for the body parameters an ImageNet MobileNetV2 checkpoint provides: all of them."""
    return name.startswith(_PREFIXES)


def _conv_bn(data, channels, kernel, stride, groups, name, batch_norm, relu6=True):
    pad = (kernel // 2, kernel // 2)
    conv = mx.sym.Convolution(data, num_filter=channels, kernel=(kernel, kernel), stride=(stride, stride),
                              pad=pad, num_group=groups, no_bias=True, name=f"{name}-conv2d")
    out = batch_norm(conv, f"{name}-batchnorm")
    return mx.sym.clip(out, 0, 6, name=f"{name}-relu6") if relu6 else out

def inverted_residual(data, in_channels, channels, expansion, stride, shortcut, name, batch_norm):
    """1x1 expansion (ReLU6), 3x3 depthwise with the stride (ReLU6), linear 1x1 projection (+ input)."""
    expanded = int(round(in_channels * expansion))
    body = _conv_bn(data, expanded, 1, 1, 1, f"{name}-exp", batch_norm)
    body = _conv_bn(body, expanded, 3, stride, expanded, f"{name}-depthwise", batch_norm)
    body = _conv_bn(body, channels, 1, 1, 1, f"{name}-linear", batch_norm, relu6=False)
    return mx.sym.elemwise_add(data, body, name=f"{name}-shortcut") if shortcut else body


def mobilenetv2_features(data, spec, batch_norm, fp16=False, compiled_deformable=False):
    """The stride-32 features: the last 1x1 convolution's ReLU6 output (`spec.last_channels` channels).
    The body has no deformable layer, so `compiled_deformable` changes nothing.

    With `fp16` everything after the first convolution's ReLU6 runs in float16 (where the reference
    casts) and the features are float16.
    """
    channels = int(round(FIRST_CHANNELS * spec.multiplier))
    body = _conv_bn(data, channels, 3, 2, 1, "first-3x3-conv", batch_norm)
    if fp16:
        body = mx.sym.Cast(body, dtype="float16", name="first-3x3-conv_fp16")
    for index, (expansion, width, blocks, stride) in enumerate(SEQUENCES):
        out_channels = int(round(width * spec.multiplier))
        for block in range(blocks):
            body = inverted_residual(body, channels, out_channels, expansion, stride if block == 0 else 1,
                                     shortcut=block > 0, name=f"seq-{index}-block{block}", batch_norm=batch_norm)
            channels = out_channels
    return _conv_bn(body, spec.last_channels, 1, 1, 1, "last-1x1-conv", batch_norm)
