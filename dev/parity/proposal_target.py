"""The parity harness's proposal-target comparison: the fork's MultiProposalTarget (its CUDA source: the operator
the published training ran) against the project's (``TRAIN.PROPOSAL_TARGET_RULES: reference``) on random chips.

The fork's operator needs a CUDA GPU and nvcc, the project's MXNet: so the inputs are written to a file here,
the fork's outputs computed from it on a GPU machine (``dev.parity.fork.ForkProposalTarget``), and compared
here (``dev/parity_proposal_target.py``). Chips are 512 px training chips as the loader makes them: 32 x 32
RPN maps of the COCO anchors, scores (half of the chips rounded to 1/64: many ties) and deltas, the
valid range of one of the three training scales in chip pixels with open ends 0 and 512, ``im_info`` (512,
512, s) or at the coarsest scale the scaled image (smaller than the chip, the maps flat beyond it as a
network's over the zero padding), 1-30 whole-pixel gts of at least 10 px, the -1 rows last.
"""
import numpy as np

from lib.config import load_config
from dev.parity.fork import TARGET_INPUTS, TARGET_OUTPUTS
from lib.benchmarking import percent

CHIP, STRIDE = 512, 16
TRAIN_RANGES = ((-1, 80), (32, 150), (120, -1))  # the COCO training ranges, finest scale first


def random_target_inputs(rng, chips):
    """{name: array} of TARGET_INPUTS for ``chips`` random chips (module docstring). Drawn without
    transcendental functions, so that another NumPy or C library draws the same arrays from ``rng``."""
    cfg = load_config(None)
    anchors = len(cfg.network.ANCHOR_SCALES) * len(cfg.network.ANCHOR_RATIOS)
    feat = CHIP // STRIDE
    foreground = rng.random((chips, anchors, feat, feat))
    deltas = rng.uniform(-0.5, 0.5, (chips, 4 * anchors, feat, feat))
    im_info = np.zeros((chips, 3))
    valid_ranges = np.zeros((chips, 2))
    gt_boxes = np.full((chips, 100, 5), -1.0)
    for c in range(chips):
        level = int(rng.integers(0, 3))
        scale = float(rng.uniform(*((2.0, 3.0), (1.2, 1.7), (0.4, 1.0))[level]))
        height, width = (CHIP, CHIP) if level < 2 else (int(rng.integers(200, CHIP)), int(rng.integers(200, CHIP)))
        im_info[c] = (height, width, scale)
        lo, hi = TRAIN_RANGES[level]
        valid_ranges[c] = (0 if lo < 0 else lo * scale, CHIP if hi < 0 else hi * scale)
        if level == 2:  # the network over the zero padding: one value per anchor beyond the image
            rows, cols = -(-height // STRIDE), -(-width // STRIDE)
            beyond = np.zeros((feat, feat), bool)
            beyond[rows:, :] = beyond[:, cols:] = True
            foreground[c][:, beyond] = rng.random((anchors, 1))
            deltas[c][:, beyond] = rng.uniform(-0.5, 0.5, (4 * anchors, 1))
        count = int(rng.integers(1, 31))
        corner = np.floor(rng.uniform(0, [width - 12, height - 12], (count, 2)))
        size = 10 + np.floor(390 * rng.random((count, 2)) ** 2)  # more small boxes than large ones
        gt_boxes[c, :count, :2] = corner
        gt_boxes[c, :count, 2:4] = np.minimum(corner + size, [width - 1, height - 1])
        gt_boxes[c, :count, 4] = rng.integers(1, 81, count)
    tied = rng.random(chips) < 0.5
    foreground[tied] = np.round(foreground[tied] * 64) / 64
    cls_prob = np.concatenate([1 - foreground, foreground], axis=1)
    arrays = (cls_prob, deltas, im_info, gt_boxes, valid_ranges)
    return {name: array.astype(np.float32) for name, array in zip(TARGET_INPUTS, arrays)}


def project_targets(inputs):
    """The project's MultiProposalTarget (the default config's attributes) on ``inputs``: {name: array} of
    TARGET_OUTPUTS in the fork's shapes."""
    import mxnet as mx

    import lib.ops

    attrs = lib.ops.proposal_target_attrs(load_config(None), STRIDE)
    outputs = mx.nd.MultiProposalTarget(*(mx.nd.array(inputs[name]) for name in TARGET_INPUTS), **attrs)
    rois, labels, targets, weights = (out.asnumpy() for out in outputs)
    chips = len(inputs["cls_prob"])
    return {"rois": rois.reshape(-1, 5), "labels": labels.reshape(chips, -1), "bbox_targets": targets.reshape(-1, 4),
            "bbox_weights": weights.reshape(-1, 4)}


def compare_proposal_targets(inputs, theirs, mine):
    """Per chip agreement of the fork's outputs ``theirs`` and the project's ``mine`` ({name: array} of
    TARGET_OUTPUTS); a table's rows."""
    chips = len(inputs["cls_prob"])
    per_chip, mine = ({name: np.asarray(outputs[name], np.float32).reshape(chips, 300, -1) for name in TARGET_OUTPUTS}
                      for outputs in (theirs, mine))
    same = {name: [np.array_equal(per_chip[name][c], mine[name][c]) for c in range(chips)] for name in TARGET_OUTPUTS}
    box_diff = float(np.abs(per_chip["rois"] - mine["rois"]).max())
    positive = per_chip["bbox_weights"][..., 0] == 1
    target_diff = float(np.abs(per_chip["bbox_targets"] - mine["bbox_targets"])[positive].max(initial=0))
    close = [np.abs(per_chip["rois"][c] - mine["rois"][c]).max() <= 1e-3 for c in range(chips)]
    all_four = [all(same[name][c] for name in TARGET_OUTPUTS) for c in range(chips)]
    return [["chips with rois, labels, targets and weights all identical, slot by slot",
             percent(sum(all_four), chips)],
            ["chips with identical rois (bit for bit) / within 1e-3 px; largest difference (px)",
             f"{percent(sum(same['rois']), chips)} / {percent(sum(close), chips)}; {box_diff:g}"],
            ["chips with identical labels / weights",
             f"{percent(sum(same['labels']), chips)} / {percent(sum(same['bbox_weights']), chips)}"],
            ["chips with identical targets; largest difference on a positive",
             f"{percent(sum(same['bbox_targets']), chips)}; {target_diff:g}"]]
