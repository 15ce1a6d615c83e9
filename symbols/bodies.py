"""The backbones `cfg.symbol` chooses from: what each body builds, at which stride, with which batch-norm.

A body is ``features(data, batch_norm, fp16, compiled_deformable) -> features`` (float16 with
``fp16``; deformable layers from lib/ops' compiled CPU operators with ``compiled_deformable``, see
symbols/deformable.py) at a fixed feature stride, which the config's network.RPN_FEAT_STRIDE and
RCNN_FEAT_STRIDE must state: the anchors of the loader and the proposal layers, and the pooling scale,
are computed from those keys. ``res4`` names the body's internal output the reference's mask network
feeds its RPN with (the stride-16 res4 of the ResNets; None: the body cannot train masks).
"""
from collections import namedtuple
from functools import partial

from symbols import mobilenetv2, resnet

Body = namedtuple("Body", ["features", "stride", "bn_eps", "res4"])

BODIES = {
    **{name: Body(partial(resnet.resnet_features, spec=spec), resnet.FEATURE_STRIDE, resnet.BN_EPS,
                  resnet.res4_output(spec))
       for name, spec in resnet.RESNETS.items()},
    **{name: Body(partial(mobilenetv2.mobilenetv2_features, spec=spec), mobilenetv2.FEATURE_STRIDE,
                  mobilenetv2.BN_EPS, None)
       for name, spec in mobilenetv2.MOBILENETS.items()},
}


def body_of(cfg):
    """The Body of ``cfg.symbol``; a ValueError naming the key for an unknown name or a stride mismatch."""
    if cfg.symbol not in BODIES:
        raise ValueError(f"config key symbol: unknown network {cfg.symbol!r} (choose from {', '.join(sorted(BODIES))})")
    body = BODIES[cfg.symbol]
    for key in ("RPN_FEAT_STRIDE", "RCNN_FEAT_STRIDE"):
        if cfg.network[key] != body.stride:
            raise ValueError(f"config key network.{key} = {cfg.network[key]!r}: the {cfg.symbol} features have "
                             f"stride {body.stride}")
    return body


def is_imagenet_parameter(name):
    """True for a body parameter an ImageNet checkpoint of one of the bodies provides (their names differ)."""
    return resnet.is_imagenet_parameter(name) or mobilenetv2.is_imagenet_parameter(name)
