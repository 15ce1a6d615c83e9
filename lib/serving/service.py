"""The detection service behind ``tools/serve.py``: one loaded Detector, one inference worker, a bounded queue.

A request is admitted only while fewer than ``capacity`` requests (the one being tested and ``queue_size``
waiting) are in; beyond that it is refused at once (``Refused`` 503), so the backlog, and the uploads it
holds, never grow with the load. Before an upload is queued its bytes are checked without decoding
(lib.dataset.image_io: a JPEG/PNG header over the pixel limit, a file cut short); the worker decodes one image
at a time and tests it with the Detector as the Python API does (``detector(image)``), so the answer equals
the API's. An image over ``LARGE_IMAGE_PIXELS`` goes through a temporary file and the tiled test's window
reads (lib.dataset.large_images, lib.inference.tiling), whose memory follows the tile, not the image.
"""
import logging
import os
import queue
import tempfile
import threading
import time

import numpy as np

from lib.dataset.image_io import check_image_bytes, check_pixel_limit, declared_size, decode_image
from lib.dataset.large_images import LARGE_IMAGE_PIXELS, is_large
from lib.drawing import class_palette
from lib.errors import DataFileError, reason
from lib.evaluation.metrics import coco_results

logger = logging.getLogger(__name__)


class Refused(Exception):
    """A request answered with an HTTP error ``status`` and a one-line ``message``."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Job:
    """One admitted upload on its way through the worker: ``result`` (the JSON-ready answer) or ``error``
    (a Refused) once ``done`` is set."""

    def __init__(self, data, name, image_id):
        self.data, self.name, self.image_id = data, name, image_id
        self.created = time.perf_counter()
        self.done = threading.Event()
        self.result = self.error = None

    def wait(self, timeout):
        if not self.done.wait(timeout):
            raise Refused(504, f"{self.name}: no answer within {timeout:g} s (the detector is still busy)")
        if self.error is not None:
            raise self.error
        return self.result


def rle_masks(masks):
    """COCO RLEs (JSON-ready: ``{"size": [h, w], "counts": str}``) of boolean (N, H, W) masks."""
    from pycocotools import mask as mask_utils

    if not len(masks):
        return []
    encoded = mask_utils.encode(np.asfortranarray(np.transpose(masks, (1, 2, 0)).astype(np.uint8)))
    return [{"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")} for rle in encoded]


def detections_json(dets, size, category_ids, image_id=0):
    """The answer's ``image``, ``detections`` (box ``x1, y1, x2, y2`` inclusive original pixels, score, label,
    class name and, for a mask network, the mask as a COCO RLE, best first: the Detections as they are) and
    ``coco`` (the same rows as COCO results entries, the results file's rounding)."""
    masks = None if dets.masks is None else rle_masks(dets.masks)
    items = [{"box": [float(v) for v in box], "score": float(score), "label": int(label), "class": name}
             for box, score, label, name in zip(dets.boxes, dets.scores, dets.labels, dets.names)]
    for item, rle in zip(items, masks or ()):
        item["mask"] = rle
    coco = coco_results([dets.to_array()], [image_id], category_ids, None if masks is None else [masks])
    return {"image": {"height": int(size[0]), "width": int(size[1])}, "detections": items, "coco": coco}


def hex_colour(bgr):
    blue, green, red = bgr
    return f"#{red:02x}{green:02x}{blue:02x}"


class DetectionService:
    """``detector`` (a lib.inference Detector, any back end) served to many threads by one worker thread.

    ``category_ids[label]`` is the id COCO results name a label by; ``queue_size`` requests may wait while
    one is tested; ``max_pixels`` (default the config's dataset.MAX_IMAGE_PIXELS) refuses larger images;
    ``timeout`` s is how long a request waits for its answer. ``start()`` starts the worker, ``stop()``
    ends it after the job at hand."""

    def __init__(self, detector, category_ids, backend="mxnet", queue_size=4, max_pixels=None, timeout=300.0):
        if detector.rpn_only:
            raise ValueError("the service needs a detection network, not an RPN-only one")
        self.detector = detector
        self.category_ids = list(category_ids)
        self.backend = backend
        self.capacity = queue_size + 1
        self.max_pixels = detector.cfg.dataset.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
        self.timeout = timeout
        self._jobs = queue.Queue()  # bounded by the admission count, never by blocking a put
        self._lock = threading.Lock()
        self.stats = {"admitted": 0, "in": 0, "peak": 0, "busy": 0, "answered": 0, "refused": 0, "failed": 0}
        self._worker = threading.Thread(target=self._work, name="inference worker", daemon=True)

    # -- admission --------------------------------------------------------------------------------------
    def admit(self):
        """Take a place in the queue: True, or False (counted) when ``capacity`` requests are in already."""
        with self._lock:
            if self.stats["in"] >= self.capacity:
                self.stats["busy"] += 1
                return False
            self.stats["in"] += 1
            self.stats["admitted"] += 1
            self.stats["peak"] = max(self.stats["peak"], self.stats["in"])
            return True

    def leave(self):
        """Give an admitted request's place back (the worker does so once it has answered a queued one)."""
        with self._lock:
            self.stats["in"] -= 1

    def _count(self, key):
        with self._lock:
            self.stats[key] += 1

    def submit(self, data, name, image_id=0):
        """Queue the image file bytes ``data`` of an admitted request (its place then belongs to the worker,
        which gives it back) and return its Job; a Refused (400, 413) when the bytes can be refused undecoded
        (the place still the caller's)."""
        try:
            self.check(data, name)
        except Refused:
            self._count("refused")
            raise
        job = Job(data, name, image_id)
        self._jobs.put(job)
        return job

    def check(self, data, name):
        """Refuse (Refused) what is wrong with an upload before it is decoded."""
        if not data:
            raise Refused(400, f"{name}: empty body; send an image file")
        size = declared_size(data)
        try:
            if size is not None:
                check_pixel_limit(name, size, self.max_pixels)
        except DataFileError as err:
            raise Refused(413, str(err)) from None
        if size is not None and is_large(*size) and not self.detector.cfg.TEST.TILE:
            raise Refused(413, f"{name}: {size[1]}x{size[0]} pixels, more than {LARGE_IMAGE_PIXELS} need the "
                               f"tiled test: start the server with --set TEST.TILE \"[1536, 336]\"")
        try:
            check_image_bytes(data, name, self.max_pixels)
        except DataFileError as err:
            raise Refused(400, str(err)) from None

    # -- the worker -------------------------------------------------------------------------------------
    def start(self):
        self._worker.start()
        return self

    def stop(self):
        self._jobs.put(None)
        self._worker.join()

    def _work(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.result = self._answer(job)
                self._count("answered")
            except Refused as err:
                job.error = err
                self._count("refused")
            except Exception as err:  # a defect or a machine fault: logged whole, answered, the service goes on
                logger.exception("testing %s failed", job.name)
                job.error = Refused(500, f"{job.name}: the detector failed: {reason(err)}")
                self._count("failed")
            finally:
                job.data = None  # the upload is freed whether the client still waits or not
                self.leave()
                job.done.set()

    def _answer(self, job):
        start = time.perf_counter()
        size = declared_size(job.data)
        if size is not None and is_large(*size):
            decoded = time.perf_counter()
            dets = self._detect_file(job, size)
        else:
            try:
                image = decode_image(job.data, job.name, self.max_pixels)
            except DataFileError as err:
                raise Refused(400, str(err)) from None
            try:  # the formats whose header check_image_bytes does not read
                check_pixel_limit(job.name, image.shape[:2], self.max_pixels)
            except DataFileError as err:
                raise Refused(413, str(err)) from None
            size = image.shape[:2]
            decoded = time.perf_counter()
            dets = self.detector(image)
        done = time.perf_counter()
        answer = detections_json(dets, size, self.category_ids, job.image_id)
        answer["timing"] = {"queued_s": round(start - job.created, 4), "decode_s": round(decoded - start, 4),
                            "detect_s": round(done - decoded, 4)}
        return answer

    def _detect_file(self, job, size):
        """Detections of an image over LARGE_IMAGE_PIXELS, read by windows from a temporary copy of the upload
        (tiled test; boxes only: its masks would each be as large as the image)."""
        from lib.inference.detections import Detections
        from lib.inference.streaming import RoidbImages

        with tempfile.TemporaryDirectory(prefix="serve-") as folder:
            path = os.path.join(folder, "upload.png" if job.data.startswith(b"\x89PNG") else "upload.jpg")
            with open(path, "wb") as f:
                f.write(job.data)
            entry = {"image": path, "height": size[0], "width": size[1], "id": job.image_id}
            ((_, rows),) = self.detector.run(RoidbImages([entry]))
        if isinstance(rows, Exception):
            raise Refused(400, f"{job.name}: {rows}")
        return Detections.from_array(rows, self.detector.classes)

    # -- what the model is ------------------------------------------------------------------------------
    def model_json(self):
        """``GET /model``: the classes (label, name, category id, the drawings' colour), the test pyramid and
        the limits."""
        classes = self.detector.classes
        palette = class_palette(len(classes))
        test = self.detector.cfg.TEST
        return {"backend": self.backend, "source": os.path.basename(str(self.detector.source)),
                "classes": [{"label": label, "name": classes[label], "category_id": int(self.category_ids[label]),
                             "colour": hex_colour(palette[label])} for label in range(1, len(classes))],
                "scales": [list(s) if isinstance(s, (list, tuple)) else s for s in test.SCALES],
                "valid_ranges": [list(r) for r in test.VALID_RANGES], "tile": list(test.TILE),
                "masks": self.detector.mask_head is not None, "score_thresh": test.SCORE_THRESH,
                "max_pixels": self.max_pixels, "queue_capacity": self.capacity}

    def health_json(self):
        with self._lock:
            stats = dict(self.stats)
        return {"status": "ok", "capacity": self.capacity, **stats}


def build_service(cfg, queue_size=4, onnx_folder=None):
    """The DetectionService of the config's checkpoint (``TEST.MODEL``, which ``--model`` sets) on its back end
    (``TEST.BACKEND``), or of an ONNX export folder (tools/export_model.py --format onnx) on ONNX Runtime, which
    needs no MXNet: the one place that builds the served Detector."""
    from lib.inference import Detector

    if onnx_folder:
        detector = Detector.from_onnx(onnx_folder)
        category_ids = detector.network.description.get("category_ids") or list(range(len(detector.classes)))
        backend = "onnxruntime"
    else:
        from lib.run.checkpoint import checkpoint_file
        from lib.run.folder import checkpoint_category_ids, checkpoint_classes

        params = checkpoint_file(cfg)
        detector = Detector.from_config(cfg, params, checkpoint_classes(params, cfg))
        category_ids, backend = checkpoint_category_ids(params, len(detector.classes)), cfg.TEST.BACKEND
    if not detector.cfg.TEST.TILE:
        logger.warning("TEST.TILE is not set: images are tested whole (memory grows with the image) and images "
                       "over %d px are refused; --set TEST.TILE \"[1536, 336]\" tiles them", LARGE_IMAGE_PIXELS)
    return DetectionService(detector, category_ids, backend, queue_size)
