"""Gradient accumulation (TRAIN.GRAD_ACCUM_STEPS): one optimizer update per N batches, for small GPUs.

The module is bound with ``grad_req='add'``, so every backward adds its gradients to the previous
ones; after N batches the optimizer updates once, with ``rescale_grad`` 1/N
(``lib.train.optimizer.make_optimizer_params``): the gradient of the N batches' mean loss, which is the
gradient of one N-times larger batch whenever each loss is normalised per batch (the RPN and R-CNN
classification losses over their valid labels, the R-CNN box loss with TRAIN.RCNN_BBOX_LOSS_CHIPS 0).
With the reference's fixed RCNN_BBOX_LOSS_CHIPS 16, the box loss of the larger batch would be N times
stronger than here; batch-norm layers that compute batch statistics see N small batches, not one large
one (the published networks freeze them). The gradients are then zeroed. An epoch whose batch count N
does not divide ends with an update of the remaining ``k`` batches, their sum scaled by N/k (their mean).
The schedule (lr steps, warm-up) counts updates: ``updates_per_epoch(batches, N)`` of them per epoch.
"""
import math


def updates_per_epoch(batches, steps):
    """Optimizer updates of an epoch of ``batches`` batches, one per ``steps`` (the last may be partial)."""
    return math.ceil(batches / steps)


def grad_req(cfg):
    """The Module's ``grad_req`` for TRAIN.GRAD_ACCUM_STEPS: 'add' when accumulating."""
    return "add" if cfg.TRAIN.GRAD_ACCUM_STEPS > 1 else "write"


class GradientAccumulation:
    """Call ``after_backward()`` after each ``forward_backward`` and ``flush()`` at the end of an epoch;
    both return whether the optimizer updated."""

    def __init__(self, module, steps):
        self.module, self.steps, self.pending = module, steps, 0

    def _gradients(self):
        # Module has no public zero_grad: its executor group holds each parameter's per-device gradients.
        return [grad for grads in self.module._exec_group.grad_arrays for grad in grads if grad is not None]

    def _update(self):
        if self.pending < self.steps:  # a partial group: the mean of its batches, as a full one gives
            for grad in self._gradients():
                grad *= self.steps / self.pending
        self.module.update()
        if self.steps > 1:
            for grad in self._gradients():
                grad[:] = 0
        self.pending = 0

    def after_backward(self):
        self.pending += 1
        if self.pending == self.steps:
            self._update()
            return True
        return False

    def flush(self):
        if self.pending:
            self._update()
            return True
        return False
