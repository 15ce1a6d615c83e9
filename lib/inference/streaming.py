"""The test pipeline: images prepared ahead of the network in worker processes, merged behind it.

Worker processes (lib.data.worker_pool, as the training loader's) decode each image, resize it by its
scale factor and write it, mean subtracted, into its place on a batch canvas in a shared-memory ring
(lib.data.batch_ring). The calling thread runs the network on finished canvases, batch after batch in the
plan's order (lib.inference.batching), and hands each image's per-scale results back to the workers, which
combine them (valid ranges, suppression, cap) while the network runs on. So the network never waits for
decoding, and merging is off its path. With ``num_workers`` 0 everything runs in the calling thread, with
the same results. Inside ``metered()`` every run counts its network passes (planned and done) and the
seconds spent in the network, for progress bars that count the work and for images/s.
"""
import contextlib
import gc
import sys
import time
from collections import OrderedDict, deque

import cv2
import numpy as np

from lib.data.batch_ring import BatchRing, Field
from lib.data.opencv_threads import fork_guard, process_start
from lib.data.pixels import network_pixels
from lib.data.worker_pool import InlinePool, ProcessPool
from lib.dataset.image_io import read_roidb_image
from lib.dataset.large_images import open_windowed


class PipelineMeter:
    """The network work of the pipeline runs inside ``metered()``: passes planned (growing as runs start,
    e.g. AutoFocus's later scales) and done, and seconds in the network (forward and outputs to NumPy)."""

    def __init__(self, on_pass=None):
        self.planned = self.done = 0
        self.network_seconds = 0.0
        self.on_pass = on_pass  # called with the meter after every pass

    def passed(self, seconds):
        """Count one network pass of ``seconds``."""
        self.done += 1
        self.network_seconds += seconds
        if self.on_pass is not None:
            self.on_pass(self)


_METERS = []


@contextlib.contextmanager
def metered(on_pass=None):
    """A PipelineMeter of the pipeline runs made inside the block (calling thread)."""
    meter = PipelineMeter(on_pass)
    _METERS.append(meter)
    try:
        yield meter
    finally:
        _METERS.remove(meter)


class RoidbImages:
    """Test roidb entries read from their files; a file whose size is not the annotated one is refused,
    with training's message (the canvases are planned from the annotated sizes)."""

    cut_to_canvas = False  # an image larger than its canvas is an error

    def __init__(self, roidb):
        self.roidb = roidb

    def sizes(self):
        return [(int(entry["height"]), int(entry["width"])) for entry in self.roidb]

    def read(self, index):
        return read_roidb_image(self.roidb[index])

    def windowed(self, index):
        """The entry's file opened for window reads when it is a large image (lib.dataset.large_images)."""
        return open_windowed(self.roidb[index])

    def describe(self, index):
        return f"image {self.roidb[index]['image']}"


class ArrayImages:
    """Images already in memory (BGR uint8 (H, W, 3))."""

    cut_to_canvas = False

    def __init__(self, images):
        self.images = images

    def sizes(self):
        return [tuple(image.shape[:2]) for image in self.images]

    def read(self, index):
        return self.images[index]

    def describe(self, index):
        return f"image {index} (in memory)"


def prepare_image(image, scale, pixel_means, channel_order, out, cut=False):
    """Resize ``image`` by ``scale`` as the reference does (``cv2.resize`` with the factors fx = fy, which
    samples differently from an explicit output size) into the top-left corner of ``out`` (3, h, w) in
    the network's pixels, zeros elsewhere; returns the resized (height, width). A resized image larger
    than ``out`` is an error, or with ``cut`` loses what does not fit (AutoFocus chips: the reference
    plans their canvases from the chips' fractional extents, crops whole pixels and cuts the rest)."""
    resized = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    height, width = resized.shape[:2]
    if not cut and (height > out.shape[1] or width > out.shape[2]):
        raise ValueError(f"an image resized to {width}x{height} does not fit its {out.shape[2]}x{out.shape[1]} "
                         f"canvas")
    fitted = resized[:out.shape[1], :out.shape[2]]
    network_pixels(fitted, pixel_means, channel_order, out)
    out[:, fitted.shape[0]:, :] = 0
    out[:, :fitted.shape[0], fitted.shape[1]:] = 0
    return height, width


class TestWorker:
    """What a pipeline worker does with a task: prepare an image on its canvas, or combine an image's
    per-scale results. Returns small messages; the pixels go straight into the ring.

    An image's scales are prepared by separate tasks close together in the plan's order; the last
    ``RECENT_IMAGES`` decoded images are kept, so that a worker decodes an image once for all of them
    when it gets them (the only worker in-process, about every second one of two workers).
    """

    RECENT_IMAGES = 4

    def __init__(self, source, ring, pixel_means, channel_order, combine):
        self.source, self.ring, self.combine = source, ring, combine
        self.pixel_means = tuple(float(mean) for mean in pixel_means)  # doubles, as network_pixels needs
        self.channel_order = channel_order
        self.recent = OrderedDict()

    def read(self, index):
        image = self.recent.pop(index, None)
        if image is None:
            image = self.source.read(index)
            while len(self.recent) >= self.RECENT_IMAGES:
                self.recent.popitem(last=False)
        self.recent[index] = image
        return image

    def describe(self, task):
        """What a task is about, for the message of a stalled worker."""
        if task[0] == "prepare":
            return f"preparing {self.source.describe(task[4])}"
        return f"merging the detections of {self.source.describe(task[1])}"

    def __call__(self, task):
        if task[0] == "prepare":
            return self.prepare(*task[1:])
        if task[0] == "combine":
            return ("combined", task[1], self.combine(task[2]))
        raise ValueError(f"unknown test pipeline task {task[0]!r}")

    def prepare(self, slot, position, tag, index, scale, shape):
        try:
            image = self.read(index)
        except IOError as err:
            return ("bad_image", tag, position, index, str(err))
        canvas = canvas_view(self.ring, slot, shape)
        return ("prepared", tag, position, prepare_image(image, scale, self.pixel_means, self.channel_order,
                                                         canvas[position], cut=self.source.cut_to_canvas))


def canvas_view(ring, slot, shape):
    """The (B, 3, h, w) float32 canvas batch of ``shape`` (B, h, w) at the start of a ring slot (fresh
    array flags, so it may be handed to MXNet without copying)."""
    count = shape[0] * 3 * shape[1] * shape[2]
    flat = ring.new_views(slot)["data"].reshape(-1)
    return flat[:count].reshape(shape[0], 3, shape[1], shape[2])


@contextlib.contextmanager
def settled_engine():
    """Wrap forking while MXNet is in use. Forking deadlocks when an MXNet engine thread waits for the GIL:
    MXNet's fork handler stops the engine, which waits for that thread, while the forking thread holds the
    GIL. Freeing a Python operator's state (the test proposal layer) or a zero-copy NDArray queues such
    work; so garbage is collected, the engine drained (waitall releases the GIL) and the collector kept off
    until the workers exist. A process that never imported MXNet (the ONNX Runtime back end) has no engine
    to drain."""
    enabled = gc.isenabled()
    gc.collect()
    mxnet = sys.modules.get("mxnet")
    if mxnet is not None:
        mxnet.nd.waitall()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Building:
    """A batch whose images are being prepared: its slot, forward shape and the resized sizes so far."""

    __slots__ = ("batch", "slot", "shape", "remaining", "resized")

    def __init__(self, batch, slot, shape):
        self.batch, self.slot, self.shape = batch, slot, shape
        self.remaining = len(batch.images)
        self.resized = [None] * len(batch.images)


class NetworkPass:
    """A network (lib.inference.mxnet_network states the interface) as ``run_pipeline`` drives it: the forward
    shapes of the BatchPlanner ``planner`` (lib.inference.batching), the network's ``forward`` and
    ``image_result(outputs, batch_size, slot, scale, resized, size)``, which reads one image's result at one
    level from a forward pass's outputs (lib.inference.whole_images)."""

    def __init__(self, network, planner, image_result):
        self.network, self.planner, self.image_result = network, planner, image_result

    def forward_shape(self, batch):
        return self.planner.forward_shape(batch)

    def forward(self, data, im_info):
        return self.network.forward(data, im_info)


def run_pipeline(network, source, batches, num_levels, combine, pixel_means, channel_order, num_workers,
                 prefetch=2, timeout=0, warn_after=0):
    """Yield ``(index, result)`` per image of ``source`` as it completes: ``combine([per-level result,
    ...])``, or the IOError that made the image unreadable (then the image has no result).

    ``batches`` (TestBatch) run in their order on ``network``, which has ``forward_shape(batch)`` ->
    (B, h, w), ``forward(data, im_info) -> outputs`` and ``image_result(outputs, batch_size, slot, scale,
    resized, size) -> per-level result``. A worker silent for ``timeout`` s (TEST.LOADER_TIMEOUT; 0: no
    limit) stops the run with a WorkerStalledError naming it and its image; one silent for ``warn_after``
    s (TEST.STALL_WARN) is warned about once before that.
    """
    shapes = [network.forward_shape(batch) for batch in batches]
    for meter in _METERS:
        meter.planned += len(batches)
    largest = max((b * 3 * h * w for b, h, w in shapes), default=1)
    slots = prefetch + 2 if num_workers else 1
    try:
        ring = BatchRing([Field("data", (largest,))], batch_size=1, num_slots=slots, shared=num_workers > 0)
    except MemoryError as err:
        raise MemoryError(f"{err} (for the test pipeline: {slots} canvases of {largest * 4 / 2**20:.0f} MB; "
                          f"TEST.NUM_PROCESS 0 needs no shared memory)") from None
    worker = TestWorker(source, ring, pixel_means, channel_order, combine)
    pool = None
    try:
        if num_workers:
            with settled_engine(), fork_guard():
                pool = ProcessPool(worker, num_workers, process_start, "test-pipeline", timeout,
                                   "TEST.LOADER_TIMEOUT", warn_after=warn_after)
        else:
            pool = InlinePool(worker)
        ring.unlink()  # the workers hold the mapping now
        yield from _Scheduler(network, batches, shapes, source.sizes(), num_levels, pool, ring).run()
    finally:
        if pool is not None:
            pool.close()
        ring.close()


class _Scheduler:
    """Keeps the workers preparing the next batches, runs the network on the finished ones in order, and
    sends every image whose levels are all done to be combined."""

    def __init__(self, network, batches, shapes, sizes, num_levels, pool, ring):
        self.network, self.batches, self.shapes, self.sizes = network, batches, shapes, sizes
        self.pool, self.ring = pool, ring
        self.free = deque(range(ring.num_slots))
        self.building = {}
        self.results = {}  # image -> per-level results so far
        self.missing = {}  # image -> levels still to run
        for batch in batches:
            for image in batch.images:
                self.missing[image] = self.missing.get(image, 0) + 1
        self.num_levels = num_levels
        self.unreadable = set()
        self.combining = 0
        self.done = deque()

    def run(self):
        next_dispatch = next_run = 0
        while next_run < len(self.batches) or self.combining or self.done:
            while self.done:
                yield self.done.popleft()
            while next_dispatch < len(self.batches) and self.free:
                self._dispatch(next_dispatch)
                next_dispatch += 1
            building = self.building.get(next_run)
            if building is not None and building.remaining == 0:
                self._run_network(self.building.pop(next_run))
                next_run += 1
                continue
            if next_run < len(self.batches) or self.combining:
                message = self.pool.get()
                if message is not None:
                    self._handle(message)

    def _dispatch(self, index):
        batch, shape = self.batches[index], self.shapes[index]
        building = self.building[index] = _Building(batch, self.free.popleft(), shape)
        for position, (image, scale) in enumerate(zip(batch.images, batch.scales)):
            if image in self.unreadable:
                building.remaining -= 1
            else:
                self.pool.submit(("prepare", building.slot, position, index, image, scale, shape))

    def _handle(self, message):
        kind = message[0]
        if kind == "combined":
            self.combining -= 1
            self.done.append((message[1], message[2]))
            return
        building = self.building[message[1]]
        building.remaining -= 1
        if kind == "prepared":
            building.resized[message[2]] = message[3]
            return
        image, error = message[3], message[4]
        if image not in self.unreadable:
            self.unreadable.add(image)
            self.results.pop(image, None)
            self.done.append((image, IOError(error)))

    def _run_network(self, building):
        batch, (size, height, width) = building.batch, building.shape
        im_info = np.tile(np.array([[height, width, 1.0]], np.float32), (size, 1))
        for position, resized in enumerate(building.resized):
            if resized is not None:
                im_info[position, :2] = resized
        started = time.perf_counter()
        outputs = self.network.forward(canvas_view(self.ring, building.slot, building.shape), im_info)
        seconds = time.perf_counter() - started
        for meter in _METERS:
            meter.passed(seconds)
        self.free.append(building.slot)
        for position, (image, scale) in enumerate(zip(batch.images, batch.scales)):
            if image in self.unreadable:
                continue
            result = self.network.image_result(outputs, size, position, scale, building.resized[position],
                                               self.sizes[image])
            self.results.setdefault(image, [None] * self.num_levels)[batch.level] = result
            self.missing[image] -= 1
            if not self.missing[image]:
                self.combining += 1
                self.pool.submit(("combine", image, self.results.pop(image)))
