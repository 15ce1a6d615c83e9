"""Pre-activation (v2) bottleneck ResNet body: res4 at stride 16, deformable dilated res5 at stride 16,
concatenated into the features both heads read.

Parameter names follow MXNet's classic symbolic ResNet (`bn_data`, `conv0`, `bn0`,
`stageN_unitM_{bn1,conv1,bn2,conv2,bn3,conv3,sc}`) so that ImageNet checkpoints with that naming, the
published SNIPER checkpoint and weights converted by tools/convert_gluoncv_resnet.py load by name.
Every depth is the same builder with a different `ResNetSpec`.
"""
from collections import namedtuple

import mxnet as mx

from symbols.batch_norm import matches_prefix
from symbols.deformable import deformable_convolution

# units: bottleneck units per stage 1..4; widths: conv0 channels then the output channels of stages 1..4
# (a unit's inner 1x1/3x3 convolutions are a quarter of its output width).
ResNetSpec = namedtuple("ResNetSpec", ["units", "widths"])

RESNETS = {
    "resnet101": ResNetSpec(units=(3, 4, 23, 3), widths=(64, 256, 512, 1024, 2048)),
    "resnet50": ResNetSpec(units=(3, 4, 6, 3), widths=(64, 256, 512, 1024, 2048)),
    # For the synthetic CPU run and the tests: same graph, one unit per stage, narrow widths.
    "resnet_tiny": ResNetSpec(units=(1, 1, 1, 1), widths=(16, 32, 64, 128, 256)),
}

BN_EPS = 2e-5  # the classic symbolic ResNet's value, which its checkpoints were trained with
FEATURE_STRIDE = 16  # res4 and the dilated res5
DEFORMABLE_GROUPS = 4
RES5_DILATION = 2
INPUT_NORMALISER = "bn_data"


def is_imagenet_parameter(name):
    """True for the body parameters an ImageNet checkpoint provides: all but the deformable offsets."""
    return matches_prefix(name, (INPUT_NORMALISER, "conv0", "bn0")) or \
        (name.startswith("stage") and "_offset_" not in name)


def residual_unit(data, width, stride, project, name, batch_norm, dilation=1, deformable=False,
                  compiled_deformable=False):
    """BN-ReLU-conv bottleneck: 1x1 (width/4), 3x3 (width/4, carries the stride), 1x1 (width).

    `project` adds the 1x1 shortcut convolution `sc` (on the pre-activated input) for units whose
    input and output shapes differ. A deformable unit predicts its 3x3 sampling offsets with a
    dilated 3x3 convolution `offset` (2 coordinates x 9 taps x DEFORMABLE_GROUPS outputs), with MXNet's
    stock operator or, with `compiled_deformable`, lib/ops' compiled CPU one (symbols/deformable.py).
    """
    inner = width // 4
    act1 = mx.sym.Activation(batch_norm(data, name + "_bn1"), act_type="relu", name=name + "_relu1")
    conv1 = mx.sym.Convolution(act1, num_filter=inner, kernel=(1, 1), no_bias=True, name=name + "_conv1")
    act2 = mx.sym.Activation(batch_norm(conv1, name + "_bn2"), act_type="relu", name=name + "_relu2")
    conv3x3 = dict(num_filter=inner, kernel=(3, 3), stride=(stride, stride), pad=(dilation, dilation),
                   dilate=(dilation, dilation), no_bias=True, name=name + "_conv2")
    if deformable:
        offset = mx.sym.Convolution(act2, num_filter=2 * 9 * DEFORMABLE_GROUPS, kernel=(3, 3),
                                    pad=(dilation, dilation), dilate=(dilation, dilation),
                                    name=name + "_offset")
        conv2 = deformable_convolution(act2, offset, in_channels=inner, num_deformable_group=DEFORMABLE_GROUPS,
                                       compiled=compiled_deformable, **conv3x3)
    else:
        conv2 = mx.sym.Convolution(act2, **conv3x3)
    act3 = mx.sym.Activation(batch_norm(conv2, name + "_bn3"), act_type="relu", name=name + "_relu3")
    conv3 = mx.sym.Convolution(act3, num_filter=width, kernel=(1, 1), no_bias=True, name=name + "_conv3")
    if project:
        shortcut = mx.sym.Convolution(act1, num_filter=width, kernel=(1, 1), stride=(stride, stride),
                                      no_bias=True, name=name + "_sc")
    else:
        shortcut = data
    return mx.sym.elemwise_add(conv3, shortcut, name=name + "_plus")


def _stage(data, index, spec, stride, batch_norm, dilation=1, deformable=False, compiled_deformable=False):
    for unit in range(1, spec.units[index - 1] + 1):
        first = unit == 1
        data = residual_unit(data, spec.widths[index], stride if first else 1, project=first,
                             name=f"stage{index}_unit{unit}", batch_norm=batch_norm,
                             dilation=dilation, deformable=deformable, compiled_deformable=compiled_deformable)
    return data


def resnet_body(data, spec, batch_norm, fp16=False, compiled_deformable=False):
    """Returns (res4, res5): the stage-3 and stage-4 outputs, both at stride 16.

    The input goes through the `bn_data` normaliser (fixed gamma, stored statistics: it reproduces
    the pretraining input normalisation, so it is never trained) and conv0 in float32; with `fp16`
    the rest of the body runs in float16 and both outputs are float16.
    res5 keeps stride 16 (stride 1, dilation 2) and uses deformable 3x3 convolutions. Both are raw
    residual sums: the published network has no parameters for a final BN-ReLU. `compiled_deformable`
    builds the deformable convolutions from lib/ops' compiled CPU operator (same parameters).
    """
    body = batch_norm(data, INPUT_NORMALISER, fix_gamma=True, frozen=True)
    body = mx.sym.Convolution(body, num_filter=spec.widths[0], kernel=(7, 7), stride=(2, 2), pad=(3, 3),
                              no_bias=True, name="conv0")
    if fp16:
        body = mx.sym.Cast(body, dtype="float16", name="conv0_fp16")
    body = mx.sym.Activation(batch_norm(body, "bn0"), act_type="relu", name="relu0")
    body = mx.sym.Pooling(body, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max", name="pool0")
    body = _stage(body, 1, spec, 1, batch_norm)
    body = _stage(body, 2, spec, 2, batch_norm)
    res4 = _stage(body, 3, spec, 2, batch_norm)
    res5 = _stage(res4, 4, spec, 1, batch_norm, dilation=RES5_DILATION, deformable=True,
                  compiled_deformable=compiled_deformable)
    return res4, res5


def res4_output(spec):
    """The name of res4 (the stage-3 output) among a body's internal outputs."""
    return f"stage3_unit{spec.units[2]}_plus_output"


def resnet_features(data, spec, batch_norm, fp16=False, compiled_deformable=False):
    """The SNIPER features: res4 and res5 concatenated (1024 + 2048 channels for ResNet-50/101)."""
    res4, res5 = resnet_body(data, spec, batch_norm, fp16=fp16, compiled_deformable=compiled_deformable)
    return mx.sym.concat(res4, res5, dim=1, name="res4_res5")
