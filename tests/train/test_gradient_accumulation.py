"""Gradient accumulation (TRAIN.GRAD_ACCUM_STEPS): accumulated batches update as one larger batch, and an
epoch ending mid-group updates with the mean of its last batches."""
import mxnet as mx
import numpy as np

from lib.config import load_config
from lib.train.accumulation import GradientAccumulation, grad_req, updates_per_epoch
from lib.train.optimizer import make_optimizer_params


def small_network():
    """FC -> frozen batch-norm (global statistics, fixed gamma) -> FC -> softmax normalised per batch: each
    sample's gradient does not depend on the others, so a batch's gradient is a mean over its samples."""
    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=6, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=True, use_global_stats=True, name="bn")
    scores = mx.sym.FullyConnected(mx.sym.relu(hidden), num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(scores, mx.sym.var("softmax_label"), normalization="batch", name="softmax")


def trained(batches, batch_size, steps, seed=0):
    """Params after training on ``batches`` (data, labels) with GRAD_ACCUM_STEPS ``steps``, SGD with
    momentum and weight decay from make_optimizer_params (no warm-up, no fp16), the trainer's helpers."""
    cfg = load_config(None, [("TRAIN.GRAD_ACCUM_STEPS", str(steps)), ("TRAIN.warmup", "false"),
                             ("TRAIN.lr", "0.1"), ("TRAIN.lr_step", "")])
    module = mx.mod.Module(small_network(), context=mx.cpu())
    module.bind([("data", (batch_size, 5))], [("softmax_label", (batch_size,))], grad_req=grad_req(cfg))
    mx.random.seed(seed)
    module.init_params(mx.init.Normal(0.5))
    module.init_optimizer(kvstore="local", optimizer="sgd",
                          optimizer_params=make_optimizer_params(cfg, 10, 0, fp16=False))
    accumulation = GradientAccumulation(module, steps)
    updates = 0
    for data, labels in batches:
        module.forward_backward(mx.io.DataBatch([mx.nd.array(data)], [mx.nd.array(labels)]))
        updates += accumulation.after_backward()
    updates += accumulation.flush()
    arg_params, _ = module.get_params()
    return {k: v.asnumpy() for k, v in arg_params.items()}, updates


def test_accumulated_batches_update_as_one_larger_batch():
    rng = np.random.default_rng(0)
    data, labels = rng.normal(size=(24, 5)).astype(np.float32), rng.integers(0, 3, 24).astype(np.float32)
    # three updates of 8 samples: each once as 2 x 4 accumulated, once as one batch of 8
    small, small_updates = trained([(data[i:i + 4], labels[i:i + 4]) for i in range(0, 24, 4)], 4, 2)
    large, large_updates = trained([(data[i:i + 8], labels[i:i + 8]) for i in range(0, 24, 8)], 8, 1)
    assert small_updates == large_updates == 3 and updates_per_epoch(6, 2) == 3
    # float32 sums of the same 8 per-sample terms in another order (two GEMMs of 4 rows vs one of 8) and
    # the 1/2 rescale: differences of a few ulps, amplified by three momentum steps: 1e-5 is ample
    for name in large:
        np.testing.assert_allclose(small[name], large[name], rtol=1e-5, atol=1e-6, err_msg=name)
    unchanged, _ = trained([], 4, 2)
    assert any(not np.allclose(unchanged[n], large[n]) for n in large)  # the updates did change the weights


def test_an_epoch_ending_mid_group_updates_with_the_mean_of_its_last_batches():
    rng = np.random.default_rng(1)
    data, labels = rng.normal(size=(12, 5)).astype(np.float32), rng.integers(0, 3, 12).astype(np.float32)
    # 3 batches of 4 with N = 2: an update of batches 1+2, then one of batch 3 alone (its sum x 2 / 2)
    small, updates = trained([(data[i:i + 4], labels[i:i + 4]) for i in range(0, 12, 4)], 4, 2)
    assert updates == 2 == updates_per_epoch(3, 2)
    # the same as a batch of 8 then a batch of 4, each one plain update: compare the second step through
    # a 4-sample batch repeated twice (its mean is its own mean)
    reference, _ = trained([(data[:8], labels[:8]), (np.concatenate([data[8:]] * 2), np.concatenate([labels[8:]] * 2))],
                           8, 1)
    for name in reference:
        np.testing.assert_allclose(small[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
