"""Data-parallel training on several machines over MXNet's parameter server (kvstore ``dist_sync``).

``tools/launch.py`` starts a ps-lite scheduler, the servers and one training process per worker
(docs/distributed.md). Every worker trains on its own shard of each epoch's chips. The servers only
sum the workers' gradients; each worker then applies the same SGD step to the same weights, so the
workers stay identical and each holds the optimizer state that checkpoints save and resume (MXNet
1.9 cannot save the state of an optimizer that runs on the servers). Rank 0 writes the checkpoints.
"""
import contextlib
import hashlib
import logging
import os
import sys

import mxnet as mx
import numpy as np

from lib.config import ConfigError
from lib.launcher import heartbeat

logger = logging.getLogger(__name__)

SYNC_KVSTORES = ("dist_sync", "dist_device_sync")
DMLC_VARIABLES = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER")
# Extra kvstore keys beside Module's own (which are the parameter names).
_JOB_KEY = "sniper:job"
_AUX_PREFIX = "sniper:aux:"
# The servers carry values as float32: integers are sent in exact 20-bit pieces.
_PIECE = 1 << 20


def create_kvstore(cfg):
    """The kvstore of ``cfg.default.kvstore``: a joined KVStore for ``dist_*``, else its name for Module.

    Creating a distributed kvstore joins the job started by tools/launch.py and waits for every node.
    """
    kind = cfg.default.kvstore
    role = os.environ.get("DMLC_ROLE")
    if not kind.startswith("dist"):
        if role == "worker":
            raise ConfigError(f"this process is a worker of a distributed job (DMLC_ROLE=worker) but "
                              f"default.kvstore is {kind!r}: add --set default.kvstore dist_sync")
        return kind
    if kind not in SYNC_KVSTORES:
        raise ConfigError(f"default.kvstore: {kind!r} is not supported; use one of {', '.join(SYNC_KVSTORES)} "
                          f"(asynchronous updates would let the workers drift apart)")
    missing = [name for name in DMLC_VARIABLES if not os.environ.get(name)]
    if missing:
        raise ConfigError(f"default.kvstore is {kind!r} but {', '.join(missing)} not set: start the workers "
                          f"with tools/launch.py (see docs/distributed.md)")
    if role != "worker":
        raise ConfigError(f"default.kvstore is {kind!r} but DMLC_ROLE is {role!r}; training runs as a worker")
    heartbeat.start_heartbeat()  # when tools/launch.py watches for stalled processes
    kvstore = mx.kv.create(kind)
    heartbeat.set_rank(kvstore.rank)
    logger.info("joined the %s job as worker rank %d of %d", kind, kvstore.rank, kvstore.num_workers)
    return kvstore


class Workers:
    """This process's place among the training workers, and the steps they must take together.

    With a single-machine kvstore (a name such as ``'device'``) this is rank 0 of 1 and every
    collective step is a no-op. A collective step must be called by every worker in the same order.
    """

    def __init__(self, kvstore):
        self.kvstore = None if isinstance(kvstore, str) else kvstore
        self.rank = self.kvstore.rank if self.kvstore else 0
        self.count = self.kvstore.num_workers if self.kvstore else 1

    @property
    def distributed(self):
        return self.kvstore is not None

    @contextlib.contextmanager
    def optimizer_on_workers(self):
        """Around Module.init_optimizer: the servers only sum gradients, each worker runs the optimizer."""
        if not self.distributed:
            yield
            return
        before = os.environ.get("MXNET_UPDATE_ON_KVSTORE")
        os.environ["MXNET_UPDATE_ON_KVSTORE"] = "0"
        try:
            yield
        finally:
            if before is None:
                del os.environ["MXNET_UPDATE_ON_KVSTORE"]
            else:
                os.environ["MXNET_UPDATE_ON_KVSTORE"] = before

    @contextlib.contextmanager
    def exit_at_once_on_error(self):
        """Around a distributed worker's whole run: on an error, log it and leave with ``os._exit``.

        A normal exit runs ps-lite's exit barrier, which waits for the other workers while they wait
        for this one's gradients: nothing would ever end. Leaving at once lets tools/launch.py see
        the failure and stop the job.
        """
        if not self.distributed:
            yield
            return
        try:
            yield
        except SystemExit as err:
            if err.code in (None, 0):
                raise
            if not isinstance(err.code, int):
                logger.error("%s", err.code)
            _leave(err.code if isinstance(err.code, int) else 1)
        except BaseException:  # KeyboardInterrupt included: the job cannot go on without this worker
            logger.exception("worker rank %d of %d failed; leaving at once so that the job stops", self.rank,
                             self.count)
            _leave(1)

    def join(self, module, **job):
        """After Module.init_optimizer: check that this worker runs rank 0's ``job`` (integer facts such
        as the resume epoch and the batches per epoch: a difference would deadlock or silently
        diverge), then start from rank 0's parameters and batch-norm statistics."""
        if not self.distributed:
            return
        names = sorted(job)
        mine = np.array([value for name in names for value in _pieces(name, job[name])], np.float32)
        rank0 = mx.nd.array(mine)
        self.kvstore.init(_JOB_KEY, rank0)  # only rank 0's value is stored
        self.kvstore.pull(_JOB_KEY, out=rank0)
        theirs = rank0.asnumpy()
        differ = [f"{name} {job[name]} (rank 0: {_unpiece(theirs[2 * i:2 * i + 2])})"
                  for i, name in enumerate(names) if not np.array_equal(mine[2 * i:2 * i + 2], theirs[2 * i:2 * i + 2])]
        if differ:
            raise RuntimeError(f"worker rank {self.rank} differs from rank 0: {'; '.join(differ)}. Every worker needs "
                               f"the same config, the same dataset and, to resume, the same output_path (a "
                               f"shared filesystem); see docs/distributed.md")
        arg_params, aux_params = module.get_params()
        arg_names, aux_names = sorted(arg_params), sorted(aux_params)
        # Module initialised its keys (the parameter names) with rank 0's values.
        self.kvstore.pull(arg_names, out=[arg_params[name] for name in arg_names])
        aux_keys = [_AUX_PREFIX + name for name in aux_names]
        self.kvstore.init(aux_keys, [aux_params[name] for name in aux_names])
        self.kvstore.pull(aux_keys, out=[aux_params[name] for name in aux_names])
        module.set_params(arg_params, aux_params)

    def average_aux_states(self, module):
        """Average the batch-norm running statistics over the workers, each of which saw only its
        shard (as Module averages them over devices), so all workers and the checkpoint agree."""
        if not self.distributed:
            return
        arg_params, aux_params = module.get_params()
        names = sorted(aux_params)
        keys, arrays = [_AUX_PREFIX + name for name in names], [aux_params[name] for name in names]
        self.kvstore.push(keys, arrays)
        self.kvstore.pull(keys, out=arrays)  # the sum over the workers
        for array in arrays:
            array /= self.count
        module.set_params(arg_params, aux_params)

    def log_digest(self, epoch, arg_params, aux_params):
        """Log a digest of the parameters: equal on every rank while the workers are in step."""
        if self.distributed:
            logger.info("epoch[%d] parameter digest %s (rank %d of %d)", epoch,
                        parameter_digest(arg_params, aux_params), self.rank, self.count)


def parameter_digest(arg_params, aux_params):
    """A short hex digest of the names and exact values of all parameters."""
    digest = hashlib.sha1()
    for kind, params in (("arg", arg_params), ("aux", aux_params)):
        for name in sorted(params):
            digest.update(f"{kind}:{name}".encode())
            digest.update(np.ascontiguousarray(params[name].asnumpy()).tobytes())
    return digest.hexdigest()[:16]


def _leave(code):
    logging.shutdown()  # flush the log file
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _pieces(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < _PIECE * _PIECE:
        raise ValueError(f"job fact {name} must be an integer in [0, 2**40), got {value!r}")
    return divmod(int(value), _PIECE)


def _unpiece(pieces):
    return int(pieces[0]) * _PIECE + int(pieces[1])
