"""The parity harness's test-side comparisons: the reference's test batches (its two test iterators) against
the project's plan and canvases, and the fork's test proposal operator against the project's layer on shared
canvases.

Test batches: random images (PNG files), the reference's COCO test settings (scales, 2 / 2 / 4 images a
batch, 2 parts); the reference's iterators run as its detection and proposal-extraction wrappers drive them.

Batches of two to four images of different sizes share one canvas, as the reference's test iterator puts
them (the canvas is the batch's largest extent; each image's ``im_info`` is its own scaled size). The RPN
maps are made like a network's: smooth over the image with a few peaks, constant over the canvas padding
beyond it (a network sees zeros there), half of the cases with scores rounded to 1/64 so that many anchors
tie. Both sides get the same maps; a result is one image of one batch.
"""
import contextlib
import io
import os

import cv2
import numpy as np

from lib.config import load_config, parsed
from lib.boxes.proposals import proposals
from lib.inference.batching import plan_level
from lib.inference.streaming import prepare_image
from dev.parity.chip_targets import random_scene_image, reference_config
from lib.benchmarking import percent

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


# ------------------------------------------------------------------------------------------------ test batches

# The reference's COCO test settings: resolution scales (short, long), images per batch, CONCURRENT_JOBS.
TEST_SCALES = ((1400, 2000), (800, 1280), (480, 512))
TEST_BATCH_IMAGES = (2, 2, 4)
TEST_PARTS = 2


def random_test_set(rng, count, folder):
    """``count`` roidb entries of random images (PNG files in ``folder``): 120-2000 px wide, 90-1000 px
    high, a third of them portrait."""
    entries = []
    for index in range(count):
        width, height = int(rng.integers(120, 2001)), int(rng.integers(90, 1001))
        if rng.random() < 1 / 3:
            width, height = height, width
        entries.append({"image": random_scene_image(rng, width, height, folder, f"test{index}"), "width": width,
                        "height": height, "flipped": False, "inference_crops": np.array([[0, 0, width, height]])})
    return entries


def reference_batches(iterator, roidb, ref_cfg, scale, batch_images, parts):
    """The reference's batches of one scale: its ``imdb_*_wrapper`` split of the set into ``parts``, each
    part iterated by ``iterator`` (its test iterator class). [(members, data (B, 3, h, w), im_info (B, 3))],
    members as indices into ``roidb`` (padding repeats included)."""
    batches, per_part = [], int(np.ceil(len(roidb) / parts))
    for start in range(0, len(roidb), per_part):
        part = [dict(entry) for entry in roidb[start:start + per_part]]
        with contextlib.redirect_stdout(io.StringIO()):  # its "Iterator has N samples"
            batches_of = iterator(roidb=part, config=ref_cfg, test_scale=list(scale), batch_size=batch_images,
                                  threads=1, nGPUs=1, pad_rois_to=400, crop_size=None, num_classes=2)
        while batches_of.iter_next():
            data, im_info, im_ids = batches_of.batch.data[:3]
            batches.append(([start + int(i) for i in im_ids], data, im_info))
    return batches


def compare_scale_batches(theirs, plan, roidb, pixel_means):
    """Counts over one scale: [batches, identical batches, images, identical factors, identical im_info,
    identical pixels] and the sum of the images' mean absolute pixel differences."""
    last = {index: b for b, (members, _, _) in enumerate(theirs) for index in members}
    counts, difference = np.zeros(6, np.int64), 0.0
    counts[0] = len(theirs)
    for b, ((members, data, im_info), batch) in enumerate(zip(theirs, plan)):
        kept = tuple(dict.fromkeys(i for i in members if last[i] == b))
        counts[1] += kept == batch.images and tuple(data.shape[2:]) == tuple(batch.canvas)
        if kept != batch.images:
            continue
        for index, scale in zip(kept, batch.scales):
            slot = members.index(index)
            out = np.empty((3,) + tuple(batch.canvas), np.float32)
            image = cv2.imread(roidb[index]["image"], cv2.IMREAD_COLOR)
            resized = prepare_image(image, scale, pixel_means, "RGB", out) if out.size else None
            counts[2] += 1
            counts[3] += np.float32(scale) == np.float32(im_info[slot, 2])
            counts[4] += resized is not None and tuple(resized) == tuple(im_info[slot, :2].astype(int))
            if out.shape == data.shape[1:]:
                counts[5] += np.array_equal(out, data[slot])
                difference += float(np.abs(out - data[slot]).mean())
    return counts, difference


def compare_test_batches(iterators, images, seed, workdir):
    """The reference's test batches (its detection iterator and its proposal-extraction iterator) against
    ``lib.inference.batching.plan_level`` and the pipeline's ``prepare_image`` on ``images`` random images;
    a table's rows, one column per iterator. ``iterators``: ``ReferenceCheckout.test_iterators``' pair."""
    from lib.inference.batching import plan_level

    cfg = load_config(None, [("TEST.SCALES", str([list(s) for s in TEST_SCALES])),
                             ("TEST.BATCH_IMAGES", str(list(TEST_BATCH_IMAGES))),
                             ("TEST.BATCH_PARTS", str(TEST_PARTS))])
    os.makedirs(workdir, exist_ok=True)
    roidb = random_test_set(np.random.default_rng(seed), images, workdir)
    sizes = [(entry["height"], entry["width"]) for entry in roidb]
    ref_cfg = reference_config(cfg)
    columns = []
    for iterator, extraction in zip(iterators, (False, True)):
        counts, difference = np.zeros(6, np.int64), 0.0
        for index, (level, scale, batch_images) in enumerate(zip(parsed(cfg).test_levels, TEST_SCALES,
                                                                 TEST_BATCH_IMAGES)):
            theirs = reference_batches(iterator, roidb, ref_cfg, scale, batch_images, TEST_PARTS)
            plan = plan_level(sizes, level.spec, batch_images, TEST_PARTS, index, extraction=extraction)
            scale_counts, scale_difference = compare_scale_batches(theirs, plan, roidb, cfg.network.PIXEL_MEANS)
            counts += scale_counts
            difference += scale_difference
        columns.append([percent(counts[1], counts[0]), percent(counts[3], counts[2]), percent(counts[4], counts[2]),
                        f"{percent(counts[5], counts[2])} / {difference / max(counts[2], 1):.3f}"])
    return [[name, *values] for name, values in zip(
        ["batches identical: images, order and canvas (3 scales)", "resize factors identical (image results)",
         "`im_info` extents identical (image results)",
         "canvas pixels identical (image results) / mean absolute difference"], zip(*columns))]
