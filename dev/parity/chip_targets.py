"""The parity harness's training-target comparison: what the reference's training iterator hands the network
for a chip against what the project's loader writes for the same chip.

On random scenes (an image written as a PNG, whole-pixel gts, proposals; each scene also mirrored, the
entry flipped as ``lib.dataset.roidb.flip_entry`` flips it) both miners cut their chips (the covers taking
the candidates unshuffled, as in the mining table; the chips pair up when the miners agree, which that table
measures). For each chip pair:

* the reference: its ``MNIteratorE2E._get_batch`` arithmetic for one chip, i.e. ``anchor_worker.worker`` on
  the arguments it builds (``im_info`` (512, 512, s), the crop in original pixels, the chip's boxes of
  ``props_in_chips``), its ``valid_ranges`` and ``im_info`` network inputs, and ``im_worker.worker`` for the
  pixels (negative chips included, with their counted boxes);
* the project: ``lib.data.chip_worker.ChipWorker.make_chip`` writing the chip into a one-slot batch.

RPN sampling is off on both sides (a batch size no chip reaches), so the labels are compared before
sampling; box targets where both sides label an anchor positive.
"""
import os
from types import SimpleNamespace

import cv2
import numpy as np

from chip_generator.mining import mine_image_chips
from lib.config import load_config, parsed
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import ChipRef
from lib.dataset.roidb import flip_entry
from lib.boxes import flip_boxes
from lib.benchmarking import percent

NO_SAMPLING = 10 ** 7  # an RPN batch no chip reaches: every label as assigned


def random_scene_image(rng, width, height, folder, name):
    """A smooth random image with some edges (uint8 BGR) written to ``folder/name.png``; its path."""
    small = rng.integers(0, 256, (max(2, height // 40), max(2, width // 40), 3)).astype(np.uint8)
    image = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    image = np.clip(image.astype(np.int16) + rng.integers(-20, 21, image.shape), 0, 255).astype(np.uint8)
    path = os.path.join(folder, f"{name}.png")
    cv2.imwrite(path, image)
    return path


# The project's own variants of the chip inputs (docs/reference_differences.md), compared as a second column.
TARGET_VARIANTS = (("TRAIN.RPN_ANCHOR_BORDER", "content"), ("TRAIN.RPN_ROUND_GT", "false"),
                   ("TRAIN.CHIP_CROP", "round"), ("network.CHANNEL_ORDER", "BGR"))


def project_config(scales, ranges, stride, overrides=()):
    """The project's config for the scene: the mining table's scales and ranges, sampling off, ``overrides``
    ((key, value) pairs)."""
    settings = [("TRAIN.SCALES", str(list(scales))), ("TRAIN.VALID_RANGES", str([list(r) for r in ranges])),
                ("TRAIN.CHIP_STRIDE", str(stride)), ("TRAIN.USE_NEG_CHIPS", "true"),
                ("TRAIN.RPN_BATCH_SIZE", str(NO_SAMPLING)), ("TRAIN.RPN_FG_FRACTION", "1.0")]
    return load_config(None, settings + list(overrides))


def reference_config(cfg):
    """What the reference's workers read of their config, from the project's ``cfg`` (the same values)."""
    train, network = cfg.TRAIN, cfg.network
    return SimpleNamespace(
        TRAIN=SimpleNamespace(VALID_RANGES=[list(r) for r in train.VALID_RANGES], SCALES=tuple(train.SCALES),
                              CPP_CHIPS=True, USE_NEG_CHIPS=True, RPN_BATCH_SIZE=NO_SAMPLING, RPN_FG_FRACTION=1.0,
                              RPN_POSITIVE_OVERLAP=train.RPN_POSITIVE_OVERLAP,
                              RPN_NEGATIVE_OVERLAP=train.RPN_NEGATIVE_OVERLAP, AUTO_FOCUS=False,
                              AUTO_FOCUS_DC_LOW=-1, AUTO_FOCUS_DC_HIGH=-1, AUTO_FOCUS_SMALL_THRESH=-1),
        network=SimpleNamespace(ANCHOR_SCALES=tuple(network.ANCHOR_SCALES), ANCHOR_RATIOS=tuple(network.ANCHOR_RATIOS),
                                RPN_FEAT_STRIDE=16, PIXEL_MEANS=np.array(network.PIXEL_MEANS)))


class OneSlotRing:
    """The loader's batch ring reduced to one slot of one chip (``ChipWorker`` writes into it)."""

    def __init__(self, fields):
        self.arrays = {f.name: np.zeros((1,) + tuple(f.shape), f.dtype) for f in fields}

    def slot(self, index):
        return self.arrays


def reference_chips(workers, ref_cfg, entry, stride):
    """The reference's chips of ``entry`` as its iterator keeps them: [(crop, members, negative)], positive
    chips first (``props_in_chips``), then every negative chip with its counted boxes (``neg_props_in_chips``)."""
    worker = workers.chip_worker(ref_cfg, 512)
    worker.chip_stride = stride
    worker.chip_generator = type(worker.chip_generator)(chip_stride=stride, use_cpp=True)
    entry["crops"] = worker.chip_extractor(entry)
    props_in_chips, neg_chips, neg_props = worker.box_assigner(entry)
    return ([(crop, members, False) for crop, members in zip(entry["crops"], props_in_chips)] +
            [(crop, members, True) for crop, members in zip(neg_chips, neg_props)])


def reference_anchor_worker(workers, ref_cfg):
    """The reference's ``anchor_worker`` for 512 px chips; its feature map size, ``512 / 16`` in Python 2,
    set as the integer Python 2 made of it."""
    worker = workers.anchor_worker(ref_cfg, 512)
    worker.feat_width = worker.feat_height = 512 // ref_cfg.network.RPN_FEAT_STRIDE
    return worker


def reference_chip_inputs(workers, anchor_worker, ref_cfg, entry, crop, members):
    """What the reference's iterator builds for one chip: (labels (A*H*W,), {(c, h, w): target} of the
    positive anchors, gt_boxes (100, 5), valid_ranges (2,), im_info (3,), pixels (3, 512, 512))."""
    chip, im_scale, height, width, level = crop
    gtids = np.flatnonzero(entry["max_overlaps"] == 1)
    classes = entry["max_classes"][gtids]
    arguments = [[512, 512, im_scale], chip, im_scale, np.asarray(members, np.int32), gtids,
                 entry["boxes"][gtids].copy(), entry["boxes"].copy(), classes.reshape(-1, 1)]
    labels, targets, positions, gt_boxes = anchor_worker.worker(arguments)[:4]
    positions = np.asarray(positions, np.int64).reshape(3, -1)
    lo, hi = ref_cfg.TRAIN.VALID_RANGES[level]
    valid_ranges = np.array([0 if lo < 0 else lo * im_scale, 512 if hi < 0 else hi * im_scale])
    pixels = workers.im_worker(crop_size=512, cfg=ref_cfg).worker([entry["image"], crop, entry["flipped"]])
    return (np.asarray(labels, np.float32).reshape(-1), dict(zip(zip(*positions), np.asarray(targets, np.float32))),
            np.asarray(gt_boxes, np.float32), valid_ranges, np.array([height, width, im_scale]),
            np.asarray(pixels, np.float32))


def project_chip_inputs(worker, chip):
    """The same from the project's loader: ``worker`` (a ChipWorker over a OneSlotRing) builds ``chip``."""
    worker.make_chip(0, 0, None, chip, 0)
    arrays = {name: array[0] for name, array in worker.ring.arrays.items()}
    weights = arrays["bbox_weight"]
    positive = np.argwhere(weights == 1)
    targets = dict(zip(map(tuple, positive), arrays["bbox_target"][tuple(positive.T)]))
    return (arrays["label"], targets, arrays["gt_boxes"], arrays["valid_ranges"], arrays["im_info"], arrays["data"])


def project_chips(cfg, entry, stride, unshuffled):
    """The project's chips of ``entry`` as ChipRefs in the reference's order: per scale its positive chips,
    then (after every positive chip) every negative chip; ``unshuffled`` is the covers' context."""
    with unshuffled():
        scales = mine_image_chips(entry, parsed(cfg).mining, stride, np.random.default_rng(0)).scales
    positive = [ChipRef(0, level, s.im_scale, tuple(float(v) for v in box), tuple(int(i) for i in valid))
                for level, s in enumerate(scales) for box, valid in zip(s.pos_chips, s.pos_valid)]
    negative = [ChipRef(0, level, s.im_scale, tuple(float(v) for v in box), tuple(int(i) for i in valid), True)
                for level, s in enumerate(scales) for box, valid in zip(s.neg_chips, s.neg_valid)]
    return positive + negative


class TargetTally:
    """Agreement counts over chip pairs."""

    def __init__(self):
        self.counts = dict.fromkeys(("chips", "paired", "anchors", "labels", "positives", "targets", "gt_boxes",
                                     "valid_ranges", "im_info", "pixels_same"), 0)
        self.pixel_diff = self.target_diff = 0.0

    def add(self, theirs, mine):
        c = self.counts
        c["paired"] += 1
        c["anchors"] += len(theirs[0])
        c["labels"] += int(np.sum(theirs[0] == mine[0]))
        both = set(theirs[1]) & set(mine[1])
        c["positives"] += len(both)
        differences = [abs(float(theirs[1][k]) - float(mine[1][k])) for k in both]
        c["targets"] += sum(d <= 1e-4 for d in differences)
        self.target_diff = max([self.target_diff] + differences)
        c["gt_boxes"] += np.array_equal(theirs[2], mine[2])
        c["valid_ranges"] += np.array_equal(theirs[3].astype(np.float32), mine[3])
        c["im_info"] += np.array_equal(theirs[4].astype(np.float32), mine[4])
        difference = np.abs(theirs[5] - mine[5])
        c["pixels_same"] += not difference.any()
        self.pixel_diff += float(difference.mean())

    def rows(self):
        c = self.counts
        return [["chips paired (the same chip, scale and position on both sides)", percent(c["paired"], c["chips"])],
                ["anchor labels before sampling identical (anchors)", percent(c["labels"], c["anchors"])],
                ["RPN box targets within 1e-4 (anchors positive on both sides) / largest difference",
                 f"{percent(c['targets'], c['positives'])} / {self.target_diff:.1g}"],
                ["`gt_boxes` arrays identical (chips)", percent(c["gt_boxes"], c["paired"])],
                ["`valid_ranges` identical (chips)", percent(c["valid_ranges"], c["paired"])],
                ["`im_info` identical (chips)", percent(c["im_info"], c["paired"])],
                ["chip pixels identical (chips) / mean absolute difference",
                 f"{percent(c['pixels_same'], c['paired'])} / {self.pixel_diff / max(c['paired'], 1):.3f}"]]


def compare_chip_targets(workers, scenes, seed, workdir, random_scene, scales, ranges, unshuffled, overrides=()):
    """Agreement of the chips' network inputs and RPN targets over ``scenes`` random scenes and their
    mirrored copies (``random_scene(rng)`` -> gts, proposals, width, height, stride), the project's config with
    ``overrides``; a table's rows."""
    rng = np.random.default_rng(seed)
    tally = TargetTally()
    os.makedirs(workdir, exist_ok=True)
    for index in range(scenes):
        gts, proposals, width, height, stride = random_scene(rng)
        ref_cfg = reference_config(project_config(scales, ranges, stride))
        cfg = project_config(scales, ranges, stride, overrides)
        anchor_worker = reference_anchor_worker(workers, ref_cfg)
        image = random_scene_image(rng, width, height, workdir, f"scene{index}")
        unflipped = {"image": image, "width": width, "height": height, "flipped": False, "boxes": gts,
                     "gt_classes": rng.integers(1, 5, len(gts)).astype(np.int32), "proposals": proposals,
                     "crowd_boxes": np.zeros((0, 4), np.float32)}
        flipped = dict(flip_entry(unflipped), proposals=flip_boxes(proposals, width))
        for entry in (unflipped, flipped):
            boxes = np.concatenate([entry["boxes"], entry["proposals"]])
            theirs = dict(entry, boxes=boxes, max_overlaps=np.r_[np.ones(len(gts)), np.zeros(len(proposals))],
                          max_classes=np.r_[entry["gt_classes"], np.zeros(len(proposals), np.int32)])
            their_chips = reference_chips(workers, ref_cfg, theirs, stride)
            targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
            worker = ChipWorker([entry], cfg, OneSlotRing(batch_fields(cfg, targeter, rpn_only=False)), rpn_only=False)
            mine = {(chip.scale_index, chip.negative, chip.box): chip for chip in project_chips(cfg, entry, stride,
                                                                                              unshuffled)}
            for crop, members, negative in their_chips:
                tally.counts["chips"] += 1
                box = tuple(float(v) for v in np.round(np.asarray(crop[0], np.float64) * crop[1]))
                chip = mine.get((crop[4], negative, box))
                if chip is not None:
                    tally.add(reference_chip_inputs(workers, anchor_worker, ref_cfg, theirs, crop, members),
                              project_chip_inputs(worker, chip))
    return tally.rows()
