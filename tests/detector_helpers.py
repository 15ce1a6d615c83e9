"""Detectors for tests: the tiny COCO-format set of known images (``IMAGES``, ``write_tiny_coco``) behind
conftest's ``tiny`` fixture, the tiny network with random parameters (``random_tiny_params``), an oracle
network that returns each image's gt boxes (``OracleNetwork``, ``OracleDetector``), a stand-in network around
any forward function (``StandInNetwork``) and a translation-equivariant stand-in
network (``ComponentNetwork``, ``stand_in_detector``) with its black images of white squares (``blob_image``,
``BLOB_IMAGES``); ``WITHOUT_MXNET``, the first lines of a child process's script in which MXNet cannot
be imported (the ONNX Runtime back end must never need it)."""
import json
import os

import cv2
import mxnet as mx
import numpy as np

from lib.config import load_config
from lib.inference.detector import Detector
from lib.inference.mxnet_network import DATA_NAMES
from lib.dataset.base import numbered_classes
from lib.scales import pyramid
from symbols import inference_symbol

# A child process's script starts with these lines to make importing mxnet fail there.
WITHOUT_MXNET = """import sys
class NoMxnet:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mxnet":
            raise ImportError("mxnet is not importable here")
sys.meta_path.insert(0, NoMxnet())
"""

NUM_CLASSES = 3  # background and the two categories of the tiny datasets below
CATEGORY_IDS = [0, 4, 9]  # COCO ids of contiguous labels 1, 2
# image set -> [(file name, image id, height, width, [(x1, y1, x2, y2 inclusive), label])]; every image has
# its own size, which is how the oracle network below recognises it. "broken.jpg" cannot be decoded.
IMAGES = {
    "val": [("a.png", 7, 60, 80, [((10, 12, 29, 35), 1), ((40, 5, 75, 50), 2)]),
            ("b.png", 8, 90, 50, [((3, 4, 12, 15), 2), ((20, 30, 44, 80), 1)]),
            ("c.png", 9, 40, 40, [((0, 0, 39, 39), 1)]),
            ("broken.jpg", 10, 30, 30, [((2, 2, 20, 20), 1)])],
    "train": [("t1.png", 1, 50, 70, [((5, 5, 30, 30), 1)]),
              ("t2.png", 2, 66, 40, [((10, 10, 25, 40), 2)]),
              ("broken.jpg", 3, 30, 30, [((2, 2, 20, 20), 1)])],
}


def write_tiny_coco(root):
    rng = np.random.default_rng(0)
    for image_set, images in IMAGES.items():
        os.makedirs(os.path.join(root, "images", image_set))
        records, annotations = [], []
        for name, image_id, height, width, objects in images:
            path = os.path.join(root, "images", image_set, name)
            if name == "broken.jpg":
                with open(path, "wb") as f:
                    f.write(b"not an image")
            else:
                cv2.imwrite(path, rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
            records.append({"id": image_id, "file_name": name, "height": height, "width": width})
            for (x1, y1, x2, y2), label in objects:
                w, h = x2 - x1 + 1, y2 - y1 + 1
                annotations.append({"id": len(annotations) + 100 * image_id, "image_id": image_id, "iscrowd": 0,
                                    "category_id": CATEGORY_IDS[label], "bbox": [x1, y1, w, h], "area": w * h})
        os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
        with open(os.path.join(root, "annotations", f"instances_{image_set}.json"), "w") as f:
            json.dump({"images": records, "annotations": annotations,
                       "categories": [{"id": c, "name": f"cat{c}"} for c in CATEGORY_IDS[1:]]}, f)


def random_tiny_params(cfg, num_classes=NUM_CLASSES):
    """``(arg_params, aux_params)`` of the test network of ``cfg`` (the tiny one) for ``num_classes``,
    initialised from N(0, 0.05) with MXNet's seed 0."""
    module = mx.mod.Module(inference_symbol(cfg, num_classes), data_names=DATA_NAMES, label_names=None)
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Normal(0.05))
    return module.get_params()


def save_test_params(path, arg_params, aux_params):
    """Write ``arg_params`` and ``aux_params`` as a test-ready checkpoint file (what ``TEST.MODEL`` names)."""
    mx.nd.save(path, {**{f"arg:{k}": v for k, v in arg_params.items()},
                      **{f"aux:{k}": v for k, v in aux_params.items()}})


class StandInNetwork:
    """A network for tests behind the Detector's network seam (lib.inference.mxnet_network states it):
    ``forward`` is a callable ``(data, im_info) -> outputs by name``, on the CPU."""

    def __init__(self, forward, contexts=(mx.cpu(),)):
        self.forward, self.contexts = forward, list(contexts)

    def release_buffers(self):
        """Nothing to free."""


class OracleNetwork:
    """An oracle for the test network of ``cfg``: the proposal layer returns each image's gt boxes (scaled,
    repeated to a fixed count as the proposal layer pads), the regressor zero deltas, the classifier the gt
    class of ``num_classes``. It recognises an image by its resized size (``im_info``) at a level of the test
    pyramid, and records every canvas batch's shape in ``canvases``."""

    contexts = (mx.cpu(),)

    def __init__(self, cfg, num_classes, images=IMAGES, rois_per_image=12):
        self.num_classes, self.rois_per_image = num_classes, rois_per_image
        self.gts = {}
        for records in images.values():
            for name, _, h, w, objects in records:
                for level in pyramid(cfg.TEST, "TEST") if name != "broken.jpg" else ():
                    s = level.spec.image_scale(h, w)
                    resized = cv2.resize(np.zeros((h, w), np.uint8), None, fx=s, fy=s).shape
                    assert self.gts.setdefault(resized, (objects, s)) == (objects, s), "ambiguous test images"
        self.canvases = []

    def forward(self, data, im_info):
        self.canvases.append(data.shape)
        n = self.rois_per_image
        rois = np.zeros((len(data), n, 5), np.float32)
        scores = np.zeros((len(data), n, self.num_classes), np.float32)
        for slot, (height, width, _) in enumerate(im_info):
            objects, s = self.gts.get((int(height), int(width)), ([((0, 0, 1, 1), 0)], 1.0))  # padding slots
            rows = np.resize(np.arange(len(objects)), n)
            rois[slot, :, 1:] = np.array([box for box, _ in objects], np.float32)[rows] * s
            scores[slot, np.arange(n), np.array([label for _, label in objects])[rows]] = 1
        return {"rois_output": rois.reshape(-1, 5), "cls_prob_reshape_output": scores,
                "bbox_pred_reshape_output": np.zeros((len(data), n, 4), np.float32)}

    def release_buffers(self):
        """Nothing to free."""


class OracleDetector(Detector):
    """The tester's Detector with the network replaced by an OracleNetwork. Everything around the network
    (batching, canvases, decoding, mapping back to original pixels, merging, results, evaluation) is the
    real code; ``canvases`` are the network's."""

    def __init__(self, cfg, images=IMAGES, rois_per_image=12):
        classes = numbered_classes(NUM_CLASSES if cfg.dataset.dataset == "coco" else 21)
        network = OracleNetwork(cfg, len(classes), images, rois_per_image)
        super().__init__(cfg, classes, network, source="oracle")
        self.canvases = network.canvases


class ComponentNetwork:
    """A translation-equivariant stand-in for the network: every bright blob of the canvas (pixels above
    the mean, inside the image's ``im_info`` extent) is a detection of class 1, its box the blob's
    bounding box in canvas pixels, its score a function of its size; padded to a fixed roi count by
    repeats, as the proposal layer pads."""

    ROIS = 16

    def __init__(self):
        self.canvases = []

    def __call__(self, data, im_info):
        self.canvases.append(data.shape)
        rois = np.zeros((len(data), self.ROIS, 5), np.float32)
        scores = np.zeros((len(data), self.ROIS, 2), np.float32)
        for slot, (height, width, _) in enumerate(im_info):
            mask = (data[slot, :, :int(height), :int(width)].sum(axis=0) > 0).astype(np.uint8)
            count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=4)
            boxes = [[x, y, x + w, y + h] for x, y, w, h, _ in stats[1:]] or [[0, 0, 1, 1]]
            rows = np.resize(np.arange(len(boxes)), self.ROIS)
            rois[slot, :, 1:] = np.array(boxes, np.float32)[rows]
            sides = np.array([b[2] - b[0] for b in boxes], np.float32)[rows]
            scores[slot, :, 1] = 0.5 + 0.4 * np.tanh(sides / 100) if count > 1 else 0
            scores[slot, :, 0] = 1 - scores[slot, :, 1]
        return {"rois_output": rois.reshape(-1, 5), "cls_prob_reshape_output": scores,
                "bbox_pred_reshape_output": np.zeros((len(data), self.ROIS, 4), np.float32)}


def stand_in_detector(other_keys=(), **test_overrides):
    """A Detector of the tiny config (``TEST`` keys ``test_overrides``, then ``other_keys``) whose network is
    a ComponentNetwork."""
    cfg = load_config(None, {"symbol": "resnet_tiny", "TEST.fp16": False, "TEST.BATCH_IMAGES": 2,
                             "TEST.SOFT_NMS": False, **{f"TEST.{key}": value for key, value in test_overrides.items()},
                             **dict(other_keys)})
    return Detector(cfg, ["__background__", "blob"], StandInNetwork(ComponentNetwork()), source="stand-in")


def blob_image(height, width, squares):
    """Black image with white squares ``(x, y, side)``."""
    image = np.zeros((height, width, 3), np.uint8)
    for x, y, side in squares:
        image[y:y + side, x:x + side] = 255
    return image


# objects of 12-60 px, some on the tile borders of both scales, none touching another
BLOB_SQUARES = [(5, 5, 20), (190, 40, 30), (380, 100, 40), (590, 200, 25), (640, 20, 60), (150, 330, 12),
                (700, 300, 50), (290, 250, 24)]
BLOB_IMAGES = [blob_image(420, 900, BLOB_SQUARES), blob_image(380, 260, BLOB_SQUARES[:2] + [(100, 300, 30)])]
