"""ChipLoader: the SNIPER training iterator (spec section 4) as an mx.io.DataIter.

Each epoch's chips are mined afresh and shuffled (EpochPlan); a pool of worker processes builds the
chips straight into a ring of shared-memory batch slots (ChipWorker, BatchRing); a prefetching
thread keeps the pool busy on the next batches and hands finished ones out as NDArrays over the
shared memory (no copy), so batches are ready while the network runs. Every chip of an image file
goes to the same worker, which keeps recently decoded images (TRAIN.IMAGE_CACHE_MB, lib.data.image_cache)
so an image is decoded about once per epoch, not once per chip. With NUM_PROCESS = 0 everything runs in
the calling thread, with the same results.
"""
import logging
import queue
import sys
import threading
import weakref
from collections import Counter, deque

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call

from lib.data.batch_ring import BatchRing
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import EpochPlan, mine_epoch
from lib.data.opencv_threads import fork_guard, process_start
from lib.data.worker_pool import InlinePool, ProcessPool
from lib.errors import DataError

logger = logging.getLogger(__name__)

# A batch position whose replacement chips keep failing this many times stops the run: the data set
# is then mostly unreadable, which no amount of skipping fixes.
MAX_REPLACEMENTS = 20
_WAIT_SECONDS = 0.2
_END = object()


class _Stopped(Exception):
    """The prefetching thread was asked to stop."""


class LoaderStats:
    """What the loader did: chips built (of which negative), images decoded for them (the rest came from
    the workers' caches), time per stage (summed over workers), unreadable images."""

    def __init__(self):
        self.chips = 0
        self.negative_chips = 0
        self.decoded_images = 0
        self.decode_seconds = 0.0
        self.image_seconds = 0.0
        self.target_seconds = 0.0
        self.dropped_gt_boxes = 0
        self.bad_images = Counter()  # image path -> failed reads

    @property
    def bad_image_count(self):
        return sum(self.bad_images.values())

    def add_chip(self, timings, dropped, decoded, negative=False):
        self.chips += 1
        self.negative_chips += bool(negative)
        self.decoded_images += bool(decoded)
        decode, image, targets = timings
        self.decode_seconds += decode
        self.image_seconds += image
        self.target_seconds += targets
        if dropped and not self.dropped_gt_boxes:
            logger.warning("a chip holds more than MAX_GT_PER_CHIP boxes; the extra (invalid first) are dropped")
        self.dropped_gt_boxes += dropped

    def __repr__(self):
        decode, image, targets = (seconds / max(self.chips, 1) * 1e3
                                  for seconds in (self.decode_seconds, self.image_seconds, self.target_seconds))
        per_chip = (f", per chip: decode {decode:.1f} ms, crop/resize {image:.1f} ms, targets {targets:.1f} ms; "
                    f"{self.decoded_images} image decodes ({self.decoded_images / max(self.chips, 1):.2f} per chip)")
        return (f"{self.chips} chips ({self.negative_chips} negative){per_chip if self.chips else ''}; "
                f"{len(self.bad_images)} unreadable images "
                f"({self.bad_image_count} chips replaced); {self.dropped_gt_boxes} gt boxes over MAX_GT_PER_CHIP")

    def add_bad_image(self, path, error):
        if path not in self.bad_images:
            logger.warning("unreadable image %s (%s): its chips are replaced by chips of other images", path, error)
        self.bad_images[path] += 1


class _Batch:
    """A batch being built: its slot, how many chips are still missing, replacement attempts, and
    which positions hold negative chips."""

    __slots__ = ("index", "slot", "remaining", "attempts", "negative")

    def __init__(self, index, slot, size):
        self.index, self.slot, self.remaining, self.attempts = index, slot, size, Counter()
        self.negative = [False] * size


class _Scheduler:
    """Keeps the pool busy on the next batches of an epoch and hands finished batches out in order.

    Driven by one thread at a time (the prefetching thread, or the caller with NUM_PROCESS = 0).
    """

    def __init__(self, pool, plan, roidb, file_keys, slots, stats):
        self.pool, self.plan, self.roidb, self.slots, self.stats = pool, plan, roidb, slots, stats
        self.file_keys = file_keys
        self.building = {}
        self.next_dispatch = 0
        self.next_deliver = 0
        self.pending = 0

    def next_batch(self, stopped=lambda: False):
        """The next finished _Batch, or None at the end of the epoch; raises _Stopped when ``stopped()``."""
        if self.next_deliver >= self.plan.num_batches:
            return None
        while True:
            self._dispatch()
            batch = self.building.get(self.next_deliver)
            if batch is not None and batch.remaining == 0:
                del self.building[self.next_deliver]
                self.next_deliver += 1
                return batch
            if stopped():
                raise _Stopped()
            message = self.pool.get()
            if message is not None:
                self._handle(message)

    def drain(self):
        """Wait for every submitted chip and free the slots of undelivered batches (a mid-epoch reset)."""
        while self.pending:
            message = self.pool.get()
            if message is not None:
                self._handle(message, replace=False)
        for batch in self.building.values():
            self.slots.release(batch.slot)
        self.building.clear()

    def _dispatch(self):
        plan = self.plan
        while self.next_dispatch < plan.num_batches and self.slots.has_free():
            batch = _Batch(self.next_dispatch, self.slots.take(), plan.batch_size)
            self.building[batch.index] = batch
            self.next_dispatch += 1
            for position in range(plan.batch_size):
                self._submit(batch, position, *plan.chip_at(batch.index, position))

    def _submit(self, batch, position, chip, seed):
        self.pending += 1
        batch.negative[position] = chip.negative
        self.pool.submit(("chip", batch.slot, position, batch.index, chip, seed),
                         key=int(self.file_keys[chip.image_index]))

    def _handle(self, message, replace=True):
        kind, index, position = message[:3]
        self.pending -= 1
        batch = self.building[index]
        if kind == "chip":
            batch.remaining -= 1
            self.stats.add_chip(*message[3:], negative=batch.negative[position])
            return
        path, error = message[3:]
        self.stats.add_bad_image(path, error)
        if not replace:
            batch.remaining -= 1
            return
        batch.attempts[position] += 1
        if batch.attempts[position] > MAX_REPLACEMENTS:
            raise DataError(f"{MAX_REPLACEMENTS} replacement chips in a row came from unreadable images "
                            f"(last: {path}: {error}); {len(self.stats.bad_images)} images failed so far: check "
                            f"the image folder")
        chip, seed = self.plan.replacement(index, position, batch.attempts[position], self.roidb, self.stats.bad_images)
        self._submit(batch, position, chip, seed)


def _refcounts(arrays):
    return [sys.getrefcount(array) for array in arrays]


class _OutputArrays:
    """NDArray batches the ring's slots are copied into; a set is reused once nothing outside the
    loader holds its arrays, so a caller may keep a batch as long as it likes."""

    def __init__(self, fields, batch_size):
        self.fields, self.batch_size = fields, batch_size
        self._sets = []

    def acquire(self):
        for arrays, baseline in self._sets:
            if _refcounts(arrays) == baseline:
                return arrays  # copying into it waits for the engine's pending reads (SyncCopyFromCPU)
        arrays = tuple(mx.nd.empty((self.batch_size,) + tuple(f.shape), dtype=f.dtype) for f in self.fields)
        self._sets.append((arrays, _refcounts(arrays)))
        return arrays


class _Slots:
    """The ring's slots seen from the consumer side: free, being built, or lent out as a batch.

    With ``lend``, a finished slot is handed to the caller as zero-copy NDArrays over the shared
    memory (no copy of the 3 MB per chip), and comes back once nothing outside the loader holds them
    and the engine has finished reading them. A slot is lent only while another one remains free or
    in construction, so a caller that keeps every batch gets copies instead of stalling the workers.
    """

    def __init__(self, ring, lend):
        self.free = deque(range(ring.num_slots))
        self.lent = []
        self.views = None
        if lend:
            self.views = []
            for index in range(ring.num_slots):
                arrays = ring.new_views(index)
                views = tuple(mx.nd.from_numpy(arrays[f.name], zero_copy=True) for f in ring.fields)
                self.views.append((views, _refcounts(views)))

    def has_free(self):
        if not self.free:
            self._reclaim()
        return bool(self.free)

    def take(self):
        return self.free.popleft()

    def release(self, slot):
        self.free.append(slot)

    def lend(self, slot, others_building):
        """The slot's NDArrays if it may be lent (it then counts as lent), else None."""
        if self.views is None or not (others_building or self.has_free()):
            return None
        self.lent.append(slot)
        return self.views[slot][0]

    def _reclaim(self):
        for slot in list(self.lent):
            views, baseline = self.views[slot]
            if _refcounts(views) == baseline:
                for array in views:  # pending engine reads (e.g. a copy to the GPU) finish first
                    check_call(_LIB.MXNDArrayWaitToWrite(array.handle))
                self.lent.remove(slot)
                self.free.append(slot)

    def close(self):
        self.views = None


class _Resources:
    """Everything that must be released, kept apart from the loader so a finalizer can close it."""

    def __init__(self):
        self.pool = None
        self.ring = None
        self.slots = None
        self.thread = None
        self.stop = threading.Event()
        self.ready = None

    def stop_thread(self):
        if self.thread is None:
            return
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.ready.get_nowait()  # unblock a put
            except queue.Empty:
                pass
            self.thread.join(_WAIT_SECONDS)
        self.thread = None
        self.stop.clear()

    def close(self):
        self.stop_thread()
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.slots is not None:
            self.slots.close()
            self.slots = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class ChipLoader(mx.io.DataIter):
    """SNIPER training batches of 512 x 512 chips for mx.mod.Module.

    ``chips_per_device`` is given by the caller (the trainer reads TRAIN.BATCH_IMAGES once and hands
    the same number to the loss normalisation); a batch holds ``chips_per_device * num_ctx`` chips and
    splits evenly over the contexts. ``seed`` (default
    cfg.default.seed) fixes every epoch: the same seed gives the same batches whatever
    ``num_workers`` (default cfg.TRAIN.NUM_PROCESS; 0 builds chips in the calling thread).
    ``begin_epoch`` makes a resumed run draw the epochs it would have drawn. ``prefetch`` batches are
    kept ready. Distributed training gives each of ``num_shards`` workers its ``shard_index``: the
    shards split every epoch into disjoint parts with the same number of batches (see EpochPlan).
    Call ``close()`` (or use ``with``) to stop the workers; it is also done at exit.
    """

    def __init__(self, roidb, cfg, chips_per_device, num_ctx=1, rpn_only=False, seed=None, begin_epoch=0,
                 num_workers=None, prefetch=2, num_shards=1, shard_index=0):
        num_workers = cfg.TRAIN.NUM_PROCESS if num_workers is None else num_workers
        for name, value, least in (("chips_per_device", chips_per_device, 1), ("num_ctx", num_ctx, 1),
                                   ("num_workers (TRAIN.NUM_PROCESS)", num_workers, 0), ("prefetch", prefetch, 1),
                                   ("num_shards", num_shards, 1), ("shard_index", shard_index, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"ChipLoader: {name} must be an integer >= {least}, got {value!r}")
        if shard_index >= num_shards:
            raise ValueError(f"ChipLoader: shard_index must be below num_shards ({num_shards}), got {shard_index}")
        if not roidb:
            raise ValueError("ChipLoader: the roidb is empty")
        super().__init__(chips_per_device * num_ctx)
        self.roidb, self.cfg, self.rpn_only = roidb, cfg, rpn_only
        self.seed = int(cfg.default.seed if seed is None else seed)
        self.num_workers = num_workers
        self.num_shards, self.shard_index = num_shards, shard_index
        self.stats = LoaderStats()
        # one number per image file (a flipped entry shares its file): the key that routes its chips
        files = {}
        self._file_keys = np.array([files.setdefault(entry["image"], len(files)) for entry in roidb], np.int64)
        self.epoch = begin_epoch - 1
        self._prefetch = prefetch
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        try:
            worker = ChipWorker(roidb, cfg, None, rpn_only)
            self._mining = worker.mining
            self._fields = batch_fields(cfg, worker.targeter, rpn_only)
            self._data_fields = [f for f in self._fields if not f.is_label]
            self._label_fields = [f for f in self._fields if f.is_label]
            # workers: prefetch batches ready + one being consumed + one being built
            num_slots = prefetch + 2 if num_workers else 1
            worker.ring = self._resources.ring = BatchRing(self._fields, self.batch_size, num_slots,
                                                           shared=num_workers > 0)
            if num_workers:
                with fork_guard():
                    self._resources.pool = ProcessPool(worker, num_workers, process_start, "chip-loader",
                                                       cfg.TRAIN.LOADER_TIMEOUT, "TRAIN.LOADER_TIMEOUT",
                                                       routed=cfg.TRAIN.IMAGE_CACHE_MB > 0,
                                                       warn_after=cfg.TRAIN.STALL_WARN)
            else:
                self._resources.pool = InlinePool(worker)
            self._resources.ring.unlink()  # the workers hold the mapping now
            self._resources.slots = _Slots(self._resources.ring, lend=num_workers > 0)
            self._outputs = _OutputArrays(self._fields, self.batch_size)
            self._scheduler = None
            self._exhausted = False
            self._error = None
            self._start_epoch()
        except BaseException:
            self.close()
            raise

    # -- mx.io.DataIter interface ------------------------------------------------------------------
    @property
    def provide_data(self):
        return [mx.io.DataDesc(f.name, (self.batch_size,) + tuple(f.shape), f.dtype) for f in self._data_fields]

    @property
    def provide_label(self):
        return [mx.io.DataDesc(f.name, (self.batch_size,) + tuple(f.shape), f.dtype) for f in self._label_fields]

    @property
    def num_batches(self):
        """Batches in the current epoch."""
        return self._plan.num_batches

    @property
    def num_chips(self):
        """Chips in the current epoch."""
        return self._plan.num_chips

    @property
    def ring_bytes(self):
        """Bytes of the shared batch ring (the memory the loader holds beside its workers)."""
        return self._resources.ring.nbytes

    def chip_ref(self, batch, position):
        """The ChipRef at a position of a batch of the current epoch (tools, debugging); a chip whose
        image turned out unreadable was replaced by another in the batch itself."""
        return self._plan.chip_at(batch, position)[0]

    @property
    def pids(self):
        """Process ids of the workers (empty with NUM_PROCESS = 0)."""
        pool = self._resources.pool
        return list(pool.pids) if pool is not None else []

    def reset(self):
        """Start the next epoch: chips re-mined with a new stride draw and negative sample, reshuffled."""
        self._check_open()
        self._resources.stop_thread()
        self._scheduler.drain()
        self._start_epoch()

    def next(self):
        self._check_open()
        if self._error is not None:
            raise self._error
        if self._exhausted:
            raise StopIteration
        item = self._next_threaded() if self._resources.thread is not None else self._build_next()
        if item is _END:
            self._exhausted = True
            raise StopIteration
        return item

    def close(self):
        """Stop the prefetching thread and the workers and free the shared memory. Idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _check_open(self):
        if not self._finalizer.alive:
            raise RuntimeError("ChipLoader is closed")

    def _start_epoch(self):
        self.epoch += 1
        pool = self._resources.pool
        chips, stride = mine_epoch(self.roidb, self._mining, pool, self.seed, self.epoch)
        self._plan = EpochPlan(chips, stride, self.batch_size, self.seed, self.epoch, self.cfg.TRAIN.SHUFFLE,
                               self.num_shards, self.shard_index)
        shard = f" (shard {self.shard_index} of {self.num_shards})" if self.num_shards > 1 else ""
        logger.info("epoch %d: %d chips (%d negative, stride %d) in %d batches of %d%s", self.epoch,
                    self._plan.num_chips, self._plan.num_negative, stride, self._plan.num_batches, self.batch_size,
                    shard)
        self._scheduler = _Scheduler(pool, self._plan, self.roidb, self._file_keys, self._resources.slots, self.stats)
        self._exhausted = False
        if self.num_workers:
            resources = self._resources
            resources.ready = queue.Queue(maxsize=self._prefetch)
            resources.thread = threading.Thread(target=self._prefetch_loop, name="chip-loader-prefetch", daemon=True)
            resources.thread.start()

    def _build_next(self, stopped=lambda: False):
        """The next DataBatch, or _END: the slot's own NDArrays when it may be lent, else a copy."""
        batch = self._scheduler.next_batch(stopped)
        if batch is None:
            return _END
        slots = self._resources.slots
        arrays = slots.lend(batch.slot, others_building=bool(self._scheduler.building))
        if arrays is None:
            arrays = self._outputs.acquire()
            slot = self._resources.ring.slot(batch.slot)
            for array, field in zip(arrays, self._fields):
                array._sync_copyfrom(slot[field.name])
            slots.release(batch.slot)
        count = len(self._data_fields)
        return mx.io.DataBatch(data=list(arrays[:count]), label=list(arrays[count:]),
                               pad=self._plan.batch_pad(batch.index), index=None,
                               provide_data=self.provide_data, provide_label=self.provide_label)

    def _prefetch_loop(self):
        resources = self._resources
        try:
            while True:
                item = self._build_next(resources.stop.is_set)
                self._put(item)
                if item is _END:
                    return
                del item  # so the caller alone decides when the batch's arrays can be reused
        except _Stopped:
            return
        except BaseException as err:  # handed to the caller's next()
            self._put(err)

    def _put(self, item):
        resources = self._resources
        while not resources.stop.is_set():
            try:
                resources.ready.put(item, timeout=_WAIT_SECONDS)
                return
            except queue.Full:
                pass

    def _next_threaded(self):
        resources = self._resources
        while True:
            try:
                item = resources.ready.get(timeout=_WAIT_SECONDS)
                break
            except queue.Empty:
                if not resources.thread.is_alive() and resources.ready.empty():
                    raise RuntimeError("the ChipLoader prefetching thread ended without a batch") from None
        if isinstance(item, BaseException):
            self._error = item
            raise item
        return item
