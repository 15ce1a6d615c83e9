"""A small worker for the tests of tools/launch.py and lib/train/distributed.py (run by the launcher).

    python tests/distributed_worker.py train     # a few SGD steps of a tiny net; prints JSON lines
    python tests/distributed_worker.py mismatch  # rank 1 claims other job facts than rank 0
    python tests/distributed_worker.py sleep     # joins, prints "ready pid=P rank=R", then sleeps (signal tests)

Each rank starts from its own random weights and trains on its own data, so the workers agree only
if Workers did its job. It imports the project from the repository root on PYTHONPATH (set by the tests).
"""
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

from lib.config import load_config
from lib.train.distributed import Workers, create_kvstore, parameter_digest


def report(**fields):
    print(json.dumps(fields), flush=True)


def tiny_module(rank):
    net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc1")
    net = mx.sym.BatchNorm(net, name="bn")
    net = mx.sym.FullyConnected(net, num_hidden=2, name="fc2")
    net = mx.sym.SoftmaxOutput(net, name="softmax")
    module = mx.mod.Module(net, data_names=["data"], label_names=["softmax_label"], context=mx.cpu())
    module.bind(data_shapes=[("data", (8, 3))], label_shapes=[("softmax_label", (8,))])
    mx.random.seed(rank)  # a different start on every rank
    module.init_params(mx.init.Uniform(0.5))
    return module


def main(mode):
    kvstore = create_kvstore(load_config(None, [("default.kvstore", "dist_sync")]))
    workers = Workers(kvstore)
    with workers.exit_at_once_on_error():
        module = tiny_module(workers.rank)
        with workers.optimizer_on_workers():
            module.init_optimizer(kvstore=kvstore, optimizer="sgd",
                                  optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
        own_digest = parameter_digest(*module.get_params())
        batches = 5 + (workers.rank if mode == "mismatch" else 0)
        workers.join(module, batches=batches, begin_epoch=0)
        report(rank=workers.rank, count=workers.count, stage="joined", own_digest=own_digest,
               digest=parameter_digest(*module.get_params()), update_on_kvstore=module._update_on_kvstore)
        if mode == "sleep":
            print(f"ready pid={os.getpid()} rank={workers.rank}", flush=True)
            time.sleep(600)
        rng = np.random.default_rng(100 + workers.rank)
        for _ in range(3):
            batch = mx.io.DataBatch([mx.nd.array(rng.normal(size=(8, 3)))], [mx.nd.array(rng.integers(0, 2, 8))])
            module.forward_backward(batch)
            module.update()
        arg_params, aux_params = module.get_params()
        own_mean = aux_params["bn_moving_mean"].asnumpy().tolist()
        workers.average_aux_states(module)
        arg_params, aux_params = module.get_params()
        report(rank=workers.rank, stage="trained", digest=parameter_digest(arg_params, aux_params),
               own_moving_mean=own_mean, moving_mean=aux_params["bn_moving_mean"].asnumpy().tolist())


if __name__ == "__main__":
    main(sys.argv[1])
