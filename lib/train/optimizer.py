"""SGD with warm-up + step schedule, and the fp16 rescaling of spec section 7.

With fp16 the losses carry a gradient scale S, so the optimizer uses lr/S and wd*S: the update
lr/S * (S*g + wd*S*w) equals the fp32 update lr * (g + wd*w), applied to fp32 master weights.
``master_params`` reads those master weights back for checkpoints.
"""
import mxnet as mx
import numpy as np

from lib.config import parsed


def lr_steps(cfg, iters_per_epoch):
    """The ``TRAIN.lr_step`` epochs (as parsed at load) as increasing iteration numbers (at least 1)."""
    return sorted({max(1, int(round(epoch * iters_per_epoch))) for epoch in parsed(cfg).lr_step_epochs})


def make_optimizer_params(cfg, iters_per_epoch, num_update, fp16):
    """optimizer_params for Module.init_optimizer(optimizer='sgd'), ``num_update`` iterations in."""
    scale = cfg.TRAIN.fp16_loss_scale if fp16 else 1.0
    lr = cfg.TRAIN.lr / scale
    steps = lr_steps(cfg, iters_per_epoch)
    warmup_steps = cfg.TRAIN.warmup_step if cfg.TRAIN.warmup else 0
    scheduler = mx.lr_scheduler.MultiFactorScheduler(
        step=steps or [10 ** 12], factor=cfg.TRAIN.lr_factor, base_lr=lr,
        warmup_steps=warmup_steps, warmup_begin_lr=min(cfg.TRAIN.warmup_lr / scale, lr))
    return {
        "learning_rate": lr,
        "momentum": cfg.TRAIN.momentum,
        "wd": cfg.TRAIN.wd * scale,
        "lr_scheduler": scheduler,
        "rescale_grad": 1.0 / cfg.TRAIN.GRAD_ACCUM_STEPS,  # the mean of the accumulated batches' gradients
        "clip_gradient": None,
        "multi_precision": fp16,
        "begin_num_update": num_update,
    }


def master_params(module):
    """``module.get_params()`` with every float16 weight replaced by its float32 master copy.

    With ``multi_precision`` the SGD state of a float16 weight is ``(momentum, float32 master)``: the
    updates accumulate in the master and the float16 weight is only its rounding. Checkpoints store the
    masters, so every stored weight is float32 and the test network loads what training computed. Before
    the first update (no state yet) the master equals the float16 weight, which is returned as float32.
    """
    arg_params, aux_params = module.get_params()
    states = _optimizer_states(module)
    params = {}
    for name, value in arg_params.items():
        if value.dtype == np.float16:
            state = states.get(name)
            has_master = isinstance(state, (tuple, list)) and len(state) == 2 and state[1] is not None
            value = state[1].copyto(mx.cpu()) if has_master else value.astype(np.float32)
        params[name] = value
    return params, aux_params


def _optimizer_states(module):
    """Optimizer state by parameter name: the kvstore's updater keys them by name; Module's own updater
    by ``index * num_devices + device`` (device 0's copy here: the devices' updates are identical)."""
    if not module.optimizer_initialized:
        return {}
    names = module._exec_group.param_names
    if module._update_on_kvstore:
        states = module._kvstore._updater.states
        return {name: states[name] for name in names if name in states}
    states, num_devices = module._updater.states, len(module._context)
    return {name: states[i * num_devices] for i, name in enumerate(names) if i * num_devices in states}
