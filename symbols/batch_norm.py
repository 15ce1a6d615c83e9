"""How the bodies' batch-norms behave, and the name-prefix rule that selects frozen layers.

Shared by every body (symbols/resnet.py, symbols/mobilenetv2.py): the mode (batch or stored
statistics, momentum) is a property of the run, the epsilon one of the body (the value its ImageNet
weights were trained with).
"""
import mxnet as mx


class BatchNormPolicy:
    """How every BatchNorm of the network behaves.

    Frozen layers (and all layers at test time) use their stored statistics; the others normalise with
    batch statistics and update the running ones with `momentum`. `eps` is the body's own value.
    """

    def __init__(self, momentum, training, eps, frozen_prefixes=()):
        self.momentum = momentum
        self.training = training
        self.eps = eps
        self.frozen_prefixes = tuple(frozen_prefixes)

    def __call__(self, data, name, fix_gamma=False, frozen=False):
        use_global_stats = frozen or not self.training or matches_prefix(name, self.frozen_prefixes)
        return mx.sym.BatchNorm(data=data, fix_gamma=fix_gamma, eps=self.eps, momentum=self.momentum,
                                use_global_stats=use_global_stats, name=name)


def matches_prefix(name, prefixes):
    """True if `name` is one of `prefixes` or a parameter/layer under one (`stage1` covers `stage1_*`)."""
    return any(name == prefix or name.startswith(prefix + "_") for prefix in prefixes)
