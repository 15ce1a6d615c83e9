"""SGD with warm-up + step schedule, and the fp16 rescaling of spec section 7.

With fp16 the losses carry a gradient scale S, so the optimizer uses lr/S and wd*S: the update
lr/S * (S*g + wd*S*w) equals the fp32 update lr * (g + wd*w), applied to fp32 master weights.
"""
import mxnet as mx


def parse_lr_steps(text, iters_per_epoch, key="TRAIN.lr_step"):
    """Epoch list "5.33" or "8,11" -> increasing iteration numbers (at least 1)."""
    try:
        epochs = [float(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{key}: expected comma-separated epochs, got {text!r}") from None
    steps = sorted({max(1, int(round(epoch * iters_per_epoch))) for epoch in epochs})
    return steps


def make_optimizer_params(cfg, iters_per_epoch, num_update, fp16):
    """optimizer_params for Module.init_optimizer(optimizer='sgd'), ``num_update`` iterations in."""
    scale = cfg.TRAIN.fp16_loss_scale if fp16 else 1.0
    lr = cfg.TRAIN.lr / scale
    steps = parse_lr_steps(cfg.TRAIN.lr_step, iters_per_epoch)
    warmup_steps = cfg.TRAIN.warmup_step if cfg.TRAIN.warmup else 0
    scheduler = mx.lr_scheduler.MultiFactorScheduler(
        step=steps or [10 ** 12], factor=cfg.TRAIN.lr_factor, base_lr=lr,
        warmup_steps=warmup_steps, warmup_begin_lr=min(cfg.TRAIN.warmup_lr / scale, lr))
    return {
        "learning_rate": lr,
        "momentum": cfg.TRAIN.momentum,
        "wd": cfg.TRAIN.wd * scale,
        "lr_scheduler": scheduler,
        "rescale_grad": 1.0,
        "clip_gradient": None,
        "multi_precision": fp16,
        "begin_num_update": num_update,
    }
