"""The training loop: roidb -> chip loader -> symbol -> mx.mod.Module over the configured contexts.

A hand-written loop over Module's forward_backward/update (rather than Module.fit) so that a
non-finite loss stops the run at the iteration where it appears, before the update, and so that
checkpoints are written atomically with their optimizer state.
"""
import contextlib
import logging
import os
import signal
import threading
import time

import mxnet as mx
import numpy as np
from tqdm import tqdm

from lib.atomic import remove_stale_temporaries
from lib.contexts import fp16_enabled, parse_contexts
from lib.data import ChipLoader
from lib.dataset import load_roidb
from lib.errors import Interrupted, UserError
from lib.paths import shown_path
from lib.run.folder import MODEL_KEY, check_resume_config, model_info, write_run_config
from lib.run import checkpoint
from lib.train.accumulation import GradientAccumulation, grad_req, updates_per_epoch
from lib.train.distributed import Workers, create_kvstore
from lib.train.evaluation import TrainingEvaluation
from lib.train.metrics import loss_values, make_metrics
from lib.train.optimizer import make_optimizer_params, master_params
from lib.run.optimizer_states import load_optimizer_states, state_arrays
from lib.train.pretrained import initial_params
from lib.train.progress import RunProgress, record_every, schedule_warnings
from lib.train.tensorboard import TensorBoardLog
from lib.run.lock import clear_later_epochs, run_lock
from symbols import PROPOSAL_TARGET_GROUP, get_fixed_param_names, training_symbol, use_compiled_deformable

logger = logging.getLogger(__name__)


class TrainingDiverged(UserError, RuntimeError):
    """A loss became NaN or infinite; the last good checkpoint is left in place."""


def _begin_epoch(cfg, prefix, resume):
    if resume or cfg.TRAIN.resume:
        epoch = checkpoint.last_readable_epoch(prefix)
        logger.info("resuming from epoch %d (%s)", epoch, shown_path(prefix) if epoch else "no complete checkpoint yet")
        return epoch
    return cfg.TRAIN.begin_epoch


def _seed(cfg):
    mx.random.seed(cfg.default.seed)
    np.random.seed(cfg.default.seed)


def _check_finite(metric, epoch, iteration):
    for name, value in loss_values(metric).items():
        if not np.isfinite(value):
            raise TrainingDiverged(f"epoch {epoch} iteration {iteration}: {name} is {value}; stopping before the "
                                   f"update, the last complete checkpoint is kept")


def train(cfg, resume=False, kvstore=None, overwrite=False):
    """Train per ``cfg``; ``resume`` continues from the last complete epoch. ``kvstore``: one already
    made by ``lib.train.distributed.create_kvstore`` (default: made here from cfg.default.kvstore).

    The run holds its folder (lib.run.lock: RunFolderError when another run does); without
    ``resume``, epochs of this prefix beyond TRAIN.begin_epoch already on disk are refused, or with
    ``overwrite`` moved aside first. Returns ``(prefix, history)``: the checkpoint prefix and one
    ``{metric: value}`` dict per epoch. With a distributed kvstore each worker trains on its shard of
    every epoch and rank 0 alone writes checkpoints, so it alone holds the folder.
    """
    kvstore = create_kvstore(cfg) if kvstore is None else kvstore
    workers = Workers(kvstore)
    if workers.rank:
        return _train(cfg, resume, kvstore, workers)
    with run_lock(checkpoint.output_dir(cfg)):
        if not (resume or cfg.TRAIN.resume):
            clear_later_epochs(checkpoint.checkpoint_prefix(cfg), cfg.TRAIN.begin_epoch, overwrite)
        return _train(cfg, resume, kvstore, workers)


def _train(cfg, resume, kvstore, workers):
    contexts = parse_contexts(cfg.gpus)
    fp16 = fp16_enabled(cfg, "TRAIN", contexts)
    compiled_deformable = use_compiled_deformable(cfg, contexts)
    _seed(cfg)
    rpn_only = cfg.TRAIN.ONLY_PROPOSAL
    prefix = checkpoint.checkpoint_prefix(cfg)
    begin_epoch = _begin_epoch(cfg, prefix, resume)
    if workers.rank == 0 and begin_epoch > 0:  # continues checkpoints of this folder: trained with these settings?
        check_resume_config(cfg)
    if workers.rank == 0:  # the writer of the run's files clears what a killed write left behind
        for folder in sorted({checkpoint.output_dir(cfg), os.path.dirname(prefix)}):
            remove_stale_temporaries(folder)
    evaluation = TrainingEvaluation(cfg, begin_epoch, workers.count,  # TRAIN.EVAL_EVERY: its keys checked first
                                    writer=workers.rank == 0)
    roidb, dataset = load_roidb(cfg, cfg.dataset.image_set, training=True)
    chips_per_device = cfg.TRAIN.BATCH_IMAGES  # the one read: the loader and the loss normalisation share it
    loader = ChipLoader(roidb, cfg, chips_per_device, num_ctx=len(contexts), rpn_only=rpn_only,
                        seed=cfg.default.seed, begin_epoch=begin_epoch, num_shards=workers.count,
                        shard_index=workers.rank)
    symbol = training_symbol(cfg, dataset.num_classes, chips_per_device, rpn_only=rpn_only,
                             compiled_deformable=compiled_deformable)
    module = bind_module(cfg, symbol, loader, contexts)
    stds, means = cfg.TRAIN.BBOX_STDS, cfg.TRAIN.BBOX_MEANS
    if begin_epoch > 0:
        arg_params, aux_params = checkpoint.load_training_checkpoint(prefix, begin_epoch, stds, means)
        progress = checkpoint.load_progress(prefix, begin_epoch)
    else:
        arg_params, aux_params = initial_params(cfg, symbol, dict(loader.provide_data + loader.provide_label))
        progress = {}
    module.init_params(arg_params=arg_params, aux_params=aux_params, allow_missing=False)
    # Chips are re-mined every epoch, so batches per epoch vary a little: the schedule (warm-up, lr
    # steps in epochs) counts in updates of the first epoch (one per TRAIN.GRAD_ACCUM_STEPS batches),
    # remembered across resumes.
    iters_per_epoch = progress.get("iters_per_epoch",
                                   updates_per_epoch(loader.num_batches, cfg.TRAIN.GRAD_ACCUM_STEPS))
    num_update = progress.get("num_update", begin_epoch * iters_per_epoch)
    if workers.rank == 0:
        for warning in schedule_warnings(cfg, iters_per_epoch, num_update):
            logger.warning("%s", warning)
    with workers.optimizer_on_workers():
        module.init_optimizer(kvstore=kvstore, optimizer="sgd",
                              optimizer_params=make_optimizer_params(cfg, iters_per_epoch, num_update, fp16))
    if begin_epoch > 0:
        load_optimizer_states(module, checkpoint.states_path(prefix, begin_epoch))
    workers.join(module, begin_epoch=begin_epoch, roidb_entries=len(roidb), batch_size=loader.batch_size,
                 batches=loader.num_batches, iters_per_epoch=iters_per_epoch, num_update=num_update)
    mx.nd.waitall()  # parameter copies into the executors land before BatchNorm's untracked writes (below)
    metric = make_metrics(symbol.list_outputs(), module.label_names, rpn_only=rpn_only)
    logger.info("training %s on %s: %d roidb entries, %d batches of %d chips x %d workers per epoch, epochs %d..%d",
                cfg.name, contexts, len(roidb), loader.num_batches, loader.batch_size, workers.count,
                begin_epoch + 1, cfg.TRAIN.end_epoch)
    if workers.rank == 0:
        write_run_config(cfg)  # the run folder describes itself (lib.run.folder)
    model = model_info(cfg, dataset, rpn_only)
    history = []
    metrics_log = os.path.join(checkpoint.output_dir(cfg), "metrics.jsonl") if workers.rank == 0 else None
    events = TensorBoardLog(os.path.join(checkpoint.output_dir(cfg), "tensorboard"),
                            enabled=workers.rank == 0 and cfg.TRAIN.TENSORBOARD)
    progress = RunProgress(metrics_log, begin_epoch, cfg.TRAIN.end_epoch, num_update, events=events)
    with loader, contextlib.closing(events), _interruption_said(prefix, progress):
        for epoch in range(begin_epoch, cfg.TRAIN.end_epoch):
            if epoch > begin_epoch:
                loader.reset()
            progress.start_epoch(epoch, loader.num_batches)
            updates = _train_epoch(cfg, module, loader, metric, epoch, workers.count, progress)
            progress.end_epoch_updates(updates)
            num_update += updates
            history.append(loss_values(metric))
            logger.info("data loader: %s (totals of this run after epoch %d)", loader.stats, epoch + 1)
            # BatchNorm writes its moving statistics outside the engine's dependency tracking on the CPU:
            # without these waits a copy (get_params, set_params) can race the last batch's update.
            mx.nd.waitall()
            workers.average_aux_states(module)
            mx.nd.waitall()
            arg_params, aux_params = master_params(module)
            workers.log_digest(epoch + 1, arg_params, aux_params)
            if workers.rank == 0:
                checkpoint.save_checkpoint(prefix, epoch + 1, symbol, arg_params, aux_params, stds, means,
                                           states=state_arrays(module),
                                           progress={"iters_per_epoch": iters_per_epoch, "num_update": num_update,
                                                     "metrics": history[-1], MODEL_KEY: model})
                stop = evaluation.after_epoch(epoch + 1, checkpoint.params_path(prefix, epoch + 1), progress)
                best = evaluation.best()  # kept with the newest TRAIN.KEEP_CHECKPOINTS epochs, as TEST_EPOCH's
                checkpoint.prune_checkpoints(prefix, cfg.TRAIN.KEEP_CHECKPOINTS,
                                             also=(cfg.TEST.TEST_EPOCH,) + ((best["epoch"],) if best else ()))
                if stop:
                    break
    return prefix, history


class _CtrlC:
    """Python raises KeyboardInterrupt in whatever bytecode the main thread runs; raised inside a finaliser
    (MXNet's NDArray.__del__ runs all the time) it is printed and dropped, and training went on. The handler
    also remembers the signal, and the epoch loop raises it again after the batch it interrupted."""
    pending = False

    @classmethod
    def handle(cls, signum, frame):
        cls.pending = True
        raise KeyboardInterrupt

    @classmethod
    def raise_if_pending(cls):
        if cls.pending:
            raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def remembered(cls):
        if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
            yield
            return
        cls.pending = False
        previous = signal.signal(signal.SIGINT, cls.handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
            cls.pending = False


@contextlib.contextmanager
def _interruption_said(prefix, progress):
    """Ctrl-C in the epoch loop: one line saying where the run stopped and how to continue it."""
    try:
        with _CtrlC.remembered():
            yield
    except KeyboardInterrupt:
        done = checkpoint.last_complete_epoch(prefix)
        where = f"in epoch {progress.epoch + 1}" if progress.epoch is not None else "before the first epoch"
        raise Interrupted(f"training interrupted (Ctrl-C) {where}; the last complete checkpoint is epoch {done}: "
                          f"the same command with --resume continues from epoch {done + 1}") from None


def bind_module(cfg, symbol, loader, contexts):
    """The training Module of ``symbol`` on ``contexts``, bound to ``loader``'s shapes (dev/gpu_check
    binds its runs with it too, so they train the trainer's module)."""
    # The compiled proposal-target operator has a host kernel only: on GPUs it runs on the CPU. Device i
    # gets cpu(i): its own CPU worker thread (the engine runs one per CPU device id), so the devices'
    # operators never queue behind each other; with CPU contexts that is each context itself.
    group2ctxs = {PROPOSAL_TARGET_GROUP: [mx.cpu(i) for i in range(len(contexts))]}
    module = mx.mod.Module(symbol, data_names=[d.name for d in loader.provide_data],
                           label_names=[d.name for d in loader.provide_label], context=contexts,
                           fixed_param_names=get_fixed_param_names(symbol, cfg), group2ctxs=group2ctxs,
                           logger=logger)
    module.bind(data_shapes=loader.provide_data, label_shapes=loader.provide_label, for_training=True,
                grad_req=grad_req(cfg))
    return module


def _train_epoch(cfg, module, loader, metric, epoch, num_workers, progress):
    """One epoch; returns the number of updates. Speeds count the chips of all ``num_workers``; every
    periodic line goes to ``progress`` (RunProgress: ETAs, metrics.jsonl) too."""
    metric.reset()
    tic = time.time()
    window_tic, window_samples = tic, 0
    num_batches = loader.num_batches
    bar = tqdm(total=num_batches, desc=f"epoch {epoch + 1}/{cfg.TRAIN.end_epoch}", unit="batch", leave=False,
               disable=None)  # no bar when stderr is not a terminal: the log lines carry the progress
    accumulation = GradientAccumulation(module, cfg.TRAIN.GRAD_ACCUM_STEPS)
    updates = 0
    every = record_every(cfg.default.frequent, num_batches)
    for iteration, batch in enumerate(loader):
        _CtrlC.raise_if_pending()
        module.forward_backward(batch)
        module.update_metric(metric, batch.label)
        _check_finite(metric, epoch + 1, iteration)
        updates += accumulation.after_backward()
        window_samples += loader.batch_size - batch.pad
        bar.update(1)
        if (iteration + 1) % every == 0 or iteration + 1 == num_batches:
            now = time.time()
            speed = window_samples * num_workers / max(now - window_tic, 1e-9)
            values = loss_values(metric)
            lr = module._optimizer.learning_rate
            eta = progress.record(iteration + 1, lr, values, speed, updates_done=updates)
            bar.set_postfix({k: f"{v:.3f}" for k, v in values.items()})
            logger.info("epoch[%d] batch[%d/%d] speed %.2f chips/s lr %.2e %s %s", epoch + 1, iteration + 1,
                        num_batches, speed, lr, " ".join(f"{k}={v:.4f}" for k, v in values.items()), eta)
            window_tic, window_samples = now, 0
    _CtrlC.raise_if_pending()
    updates += accumulation.flush()
    bar.close()
    logger.info("epoch[%d] done in %.1f s", epoch + 1, time.time() - tic)
    return updates
