"""A small mixed-precision module for tests of the fp16 optimizer step and of its states: one float16
weight between casts (as the body) and one float32 weight, the loss scaled by ``LOSS_SCALE``, the batch
``BATCH``, and the float32 SGD the spec asks for (``numpy_sgd``)."""
import mxnet as mx
import numpy as np

from lib.config import load_config
from lib.train.optimizer import make_optimizer_params

LOSS_SCALE = 100.0
LR, WD, MOMENTUM = 0.01, 0.01, 0.9
# Rows of the batch; the loss is sum(x * w16) + sum(x * w32), so dloss/dw = column sums of x. Multiples of
# 1/4 keep S * gradient exact in float16, so the float16 gradient carries no rounding of its own.
BATCH = np.array([[0.25, -0.5, 1.0, 0.75, -1.25, 0.5],
                  [0.5, 0.25, -0.75, 1.0, 0.25, -0.5],
                  [-0.25, 0.75, 0.5, -1.0, 1.5, 0.25],
                  [1.0, -0.25, 0.25, 0.5, -0.5, 1.25]], np.float32)
W16 = np.array([[0.3, -0.7, 1.1, 0.05, -2.0, 0.6]], np.float16)
W32 = np.array([[0.2, 0.4, -0.9, 1.3, -0.1, 0.8]], np.float32)


def mixed_precision_module(contexts, arg_params=None):
    """A module with one float16 weight (between casts, as the body) and one float32 weight, the loss
    scaled by S, bound, initialised (``arg_params``, default W16 and W32) and given the trainer's fp16
    optimizer settings."""
    data = mx.sym.var("data")
    half_weight = mx.sym.var("half_weight", shape=W16.shape)
    half = mx.sym.sum(mx.sym.broadcast_mul(mx.sym.Cast(data, dtype="float16"), half_weight))
    full = mx.sym.sum(mx.sym.broadcast_mul(data, mx.sym.var("full_weight", shape=W32.shape)))
    loss = mx.sym.MakeLoss(mx.sym.Cast(half, dtype="float32") + full, grad_scale=LOSS_SCALE)
    module = mx.mod.Module(loss, data_names=["data"], label_names=None, context=contexts)
    module.bind([("data", BATCH.shape)], for_training=True)
    module.init_params(arg_params=arg_params or {"half_weight": mx.nd.array(W16, dtype="float16"),
                                                 "full_weight": mx.nd.array(W32)})
    cfg = load_config(None, {"TRAIN.lr": LR, "TRAIN.wd": WD, "TRAIN.momentum": MOMENTUM, "TRAIN.warmup": False,
                             "TRAIN.fp16_loss_scale": LOSS_SCALE, "TRAIN.lr_step": ""})
    module.init_optimizer(kvstore="device", optimizer="sgd",
                          optimizer_params=make_optimizer_params(cfg, iters_per_epoch=10, num_update=0, fp16=True))
    return module


def numpy_sgd(weight, steps):
    """The float32 update the spec asks for: lr and wd as configured, on the unscaled gradient."""
    weight, momentum = weight.astype(np.float32), np.zeros_like(weight, np.float32)
    grad = BATCH.sum(axis=0, keepdims=True)
    for _ in range(steps):
        momentum = np.float32(MOMENTUM) * momentum - np.float32(LR) * (grad + np.float32(WD) * weight)
        weight = weight + momentum
    return weight
