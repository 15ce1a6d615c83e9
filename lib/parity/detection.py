"""The parity harness's test-side comparisons: the fork's test proposal operator against the project's layer
on shared canvases.

Batches of two to four images of different sizes share one canvas, as the reference's test iterator puts
them (the canvas is the batch's largest extent; each image's ``im_info`` is its own scaled size). The RPN
maps are made like a network's: smooth over the image with a few peaks, constant over the canvas padding
beyond it (a network sees zeros there), half of the cases with scores rounded to 1/64 so that many anchors
tie. Both sides get the same maps; a result is one image of one batch.
"""
import numpy as np

from lib.ops.proposal_layer import proposals
from lib.parity.tables import percent

STRIDE = 16
ANCHOR_SCALES, ANCHOR_RATIOS = (2, 4, 7, 10, 13, 16, 24), (0.5, 1, 2)  # the COCO configs'
POST_NMS_TOP_N = 300


def random_canvas_batch(rng):
    """(cls_prob (B, 2A, H, W), bbox_pred (B, 4A, H, W), im_info (B, 3)) of a batch of B in 2..4 images
    of different sizes on one canvas (the first fills it), scale 1 in ``im_info``."""
    canvas = int(rng.integers(160, 900)), int(rng.integers(160, 1300))
    batch = int(rng.choice((2, 2, 4)))
    sizes = [canvas] + [(int(rng.integers(48, canvas[0] + 1)), int(rng.integers(48, canvas[1] + 1)))
                        for _ in range(batch - 1)]
    feat = -(-canvas[0] // STRIDE), -(-canvas[1] // STRIDE)
    anchors = len(ANCHOR_SCALES) * len(ANCHOR_RATIOS)
    rows, cols = np.mgrid[0:feat[0], 0:feat[1]]
    logits = np.empty((batch, anchors) + feat)
    deltas = rng.normal(0, 0.2, (batch, 4 * anchors) + feat)
    for b, (height, width) in enumerate(sizes):
        logits[b] = rng.normal(0, 0.5, (anchors,) + feat)
        for _ in range(int(rng.integers(2, 10))):
            y, x, spread = rng.uniform(0, feat[0]), rng.uniform(0, feat[1]), rng.uniform(1, 6)
            logits[b] += rng.normal(0, 3, (anchors, 1, 1)) * np.exp(-((rows - y) ** 2 + (cols - x) ** 2) / spread ** 2)
        padding = (rows >= -(-height // STRIDE)) | (cols >= -(-width // STRIDE))
        logits[b][:, padding] = rng.normal(-1, 1, (anchors, 1))
        deltas[b][:, padding] = rng.normal(0, 0.2, (4 * anchors, 1))
    foreground = 1 / (1 + np.exp(-logits))
    if rng.random() < 0.5:
        foreground = np.round(foreground * 64) / 64
    cls_prob = np.concatenate([1 - foreground, foreground], axis=1).astype(np.float32)
    im_info = np.array([[height, width, 1.0] for height, width in sizes], np.float32)
    return cls_prob, deltas.astype(np.float32), im_info


def compare_result(fork_rois, fork_scores, rois, scores):
    """One image's outputs: (identical bit for bit, the fork padded it, largest coordinate difference).
    The project repeats its K kept boxes; the fork writes its K kept boxes, then random ones of score 0."""
    kept = len(np.unique(rois, axis=0))
    same = (np.array_equal(fork_rois[:kept], rois[:kept]) and np.array_equal(fork_scores[:kept], scores[:kept])
            and not fork_scores[kept:].any())
    difference = float(np.abs(fork_rois[:kept, 1:] - rois[:kept, 1:]).max()) if kept else 0.0
    return same, kept < len(rois), difference


def compare_test_proposals(fork_proposals, batches, seed):
    """Agreement of the test proposal layers over ``batches`` random shared-canvas batches; a table's rows."""
    rng = np.random.default_rng(seed)
    same, total, padded, worst = [0, 0], [0, 0], 0, 0.0
    for case in range(batches):
        cls_prob, bbox_pred, im_info = random_canvas_batch(rng)
        settings = dict(stride=STRIDE, scales=ANCHOR_SCALES, ratios=ANCHOR_RATIOS, post_nms_top_n=POST_NMS_TOP_N)
        fork_rois, fork_scores = fork_proposals(cls_prob, bbox_pred, im_info, seed=seed + case, **settings)
        rois, scores = proposals(cls_prob, bbox_pred, im_info, pre_nms_top_n=12000, nms_thresh=0.7, min_size=3,
                                 **settings)
        for b in range(len(im_info)):
            rows = slice(b * POST_NMS_TOP_N, (b + 1) * POST_NMS_TOP_N)
            identical, was_padded, difference = compare_result(fork_rois[rows], fork_scores[rows], rois[rows],
                                                               scores[rows, 0])
            slot = int(b > 0)
            same[slot] += identical
            total[slot] += 1
            padded += was_padded
            worst = max(worst, difference)
    return [["results identical, kept boxes and scores bit for bit: first image of a batch (fills the canvas)",
             percent(same[0], total[0])],
            ["the same: the batch's other images (smaller than the canvas)", percent(same[1], total[1])],
            ["largest coordinate difference of a kept box (px)", f"{worst:g}"],
            ["results with fewer than 300 kept boxes (the fork pads them with random boxes)",
             f"{padded} / {sum(total)}"]]
