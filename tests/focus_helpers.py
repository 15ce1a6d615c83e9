"""AutoFocus inference for tests: a stand-in network returning given rois, scores and FocusPixels per input size
(``FocusOracle``), the real Detector around it (``focus_detector``) and a hand-worked two-level case
(``IMAGE``, ``TWO_LEVELS``, ``two_level_oracle``)."""
import numpy as np

from lib.config import load_config


class FocusOracle:
    """A stand-in network for the AutoFocus driver: per resized input size (im_info), the rois, class-1
    scores and FocusPixel cells it returns (zero box deltas); it records every forward pass."""

    def __init__(self, outputs, rois_per_image=4):
        self.outputs, self.n, self.calls = outputs, rois_per_image, []

    def __call__(self, data, im_info):
        self.calls.append((data.copy(), im_info.copy()))
        batch, _, height, width = data.shape
        rois = np.zeros((batch, self.n, 5), np.float32)
        scores = np.zeros((batch, self.n, 3), np.float32)
        scores[:, :, 0] = 1
        focus = np.zeros((batch, 2, -(-height // 16), -(-width // 16)), np.float32)
        for slot, (h, w, _) in enumerate(im_info):
            boxes, probs, cells = self.outputs.get((int(h), int(w)), ([[0, 0, 1, 1]], [0.0], []))
            rows = np.resize(np.arange(len(boxes)), self.n)
            rois[slot, :, 1:] = np.array(boxes, np.float32)[rows]
            scores[slot, :, 1] = np.array(probs, np.float32)[rows]
            for r, c in cells:
                focus[slot, 1, r, c] = 1
        focus[:, 0] = 1 - focus[:, 1]
        return {"rois_output": rois.reshape(-1, 5), "cls_prob_reshape_output": scores,
                "bbox_pred_reshape_output": np.zeros((batch, self.n, 4), np.float32), "scale_prob_output": focus}


def focus_detector(oracle, scales, ranges, pruning, chip_params, overrides=()):
    from detector_helpers import StandInNetwork
    from lib.inference.detector import Detector

    cfg = load_config(None, {"symbol": "resnet_tiny", "network.AUTO_FOCUS": True, "TEST.AUTO_FOCUS": True,
                             "TEST.SCALES": scales, "TEST.VALID_RANGES": ranges, "TEST.DO_PRUNING": pruning,
                             "TEST.CHIP_HYPERPARAMS": chip_params, "TEST.BATCH_IMAGES": 1, "TEST.SOFT_NMS": False,
                             "TEST.fp16": False, **dict(overrides)})
    # a stand-in network: everything around it is the real Detector
    return Detector(cfg, ["__background__", "thing"], StandInNetwork(oracle), source="oracle")


IMAGE = np.random.default_rng(5).integers(0, 255, (160, 200, 3), dtype=np.uint8)
TWO_LEVELS = dict(scales=[1.0, 2.0], ranges=[[20, -1], [-1, 20]], chip_params=[[1, 0.5, 4], [-1, -1, -1]])


def two_level_oracle():
    return FocusOracle({
        # level 0, the whole 200 x 160 image at scale 1: a large and a small detection, a FocusPixel at
        # row 4, column 5, which grows to 4 x 4 cells: columns 3-6, rows 2-5 = (48, 32, 112, 96)
        (160, 200): ([[100, 100, 150, 150], [10, 10, 20, 20]], [0.9, 0.95], [(4, 5)]),
        # level 1, the 64 x 64 chip at scale 2 (128 x 128): (40, 40, 70, 70) -> (68, 52, 83, 67) in the image,
        # 20+ px from every chip edge; (2, 40, 30, 70) -> (49, 52, 63, 67), 1 px from the chip's left edge
        (128, 128): ([[40, 40, 70, 70], [2, 40, 30, 70]], [0.8, 0.7], []),
    })
