"""Training pyramids fitted to a dataset's object sizes (front: tools/fit_scales.py).

SNIPER's scales and valid ranges are tuned for COCO; on other data (dense tiny objects, huge images,
only large objects) the published pyramid trains many objects at sizes the anchors cannot match, or
spends chips on scales no object needs. This module proposes a pyramid from the data and checks it
with the real chip miner (``lib.pixel_budget.epoch_pixel_budget``, the calls training makes).

The rule (docs/datasets.md#fitting-the-scales-to-your-data). Sizes are sqrt(area) in chip pixels:

* ``low`` = smallest anchor side / sqrt(2) (feature stride x ``min(ANCHOR_SCALES)`` / sqrt(2): a box
  that size, centred on the smallest square anchor, has IoU 0.5 with it, RPN's positive threshold),
  at least ``RPN_MIN_GT_SIZE`` (smaller boxes are dropped from the RPN targets): the least size any scale
  can train;
* ``comfortable`` = CHIP_SIZE / 10 and ``high`` = CHIP_SIZE / 2: the sizes the published middle scale
  trains (32 x 1.667 = 53 to 150 x 1.667 = 250 px in 512 px chips). Only the finest scale trains objects
  below ``comfortable`` (they cannot be enlarged further): a pyramid whose coarser scales train objects at
  the anchors' least size, with nothing finer for them, lost 0.13 AP on the synthetic set (BENCHMARKS.md).

A box is *kept* by a pyramid when the miner makes it valid in a positive chip at a scale where it is
well sized: at least ``comfortable``, or at least ``low`` at the finest scale (the ranges bound it above).
The candidates are built from the sizes:

1. the coarsest scale alone (longer side to CHIP_SIZE, the whole image in one chip) when the boxes it
   shows below ``comfortable`` are within the allowed loss;
2. otherwise the finest factor ``s1 = low / q`` makes the size quantile ``q`` (at the trims 0, a quarter
   and half of ``1 - keep``: the rest is left to the miner's own losses) exactly ``low`` (capped at
   ``max_factor``: then smaller anchor scales are proposed instead); each next factor is
   ``s * comfortable / high * overlap`` (overlap 1: adjacent ranges touch; 1.25: they overlap), until the
   boxes above the last range are at least ``comfortable`` at the coarsest scale (appended) or there are
   none (the last range opened). Range of factor ``s``: ``[comfortable / s, high / s]`` original pixels,
   the finest one open below; the coarsest's lower end is ``comfortable`` over its median factor.

Every candidate (and the input config's pyramid) is mined; the proposal is the candidate with the
fewest chip pixels that keeps at least ``keep`` of the trainable boxes (fewer scales on ties), else the
one keeping the most. Trainable: valid in a positive chip under some candidate (the miner never trains a
box under 2 px a side in original pixels, whatever the scale).
"""
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import yaml

from lib.atomic import atomic_open
from lib.benchmarking import markdown_table
from lib.config import with_overrides
from lib.config.core import RENAMED_KEYS, config_file_values, flat_config
from lib.contexts import device_count
from lib.pixel_budget import epoch_pixel_budget
from lib.scales import MAX_SCALE_FACTOR, box_sqrt_area
from lib.train.accumulation import updates_per_epoch
from lib.train.progress import SCHEDULE_WARMUPS, recommended_schedule
from symbols.backbones import feature_stride

DEFAULT_KEEP = 0.98
DEFAULT_MAX_IMAGES = 500  # images sampled for a fit (0: all)
DEFAULT_MAX_FACTOR = 4.0  # beyond this, smaller anchors are cheaper than enlarging images further
MAX_LEVELS = 5
OVERLAPS = (1.0, 1.25)  # factor step = low / high * overlap


class FitError(ValueError):
    """A dataset or config fit_scales cannot work with."""


@dataclass(frozen=True)
class SizeBand:
    """sqrt(area) in chip pixels of the objects a chip trains well (module docstring): from ``low`` at the
    finest scale, from ``comfortable`` at the others, up to ``high``."""

    low: float
    comfortable: float
    high: float

    @classmethod
    def from_config(cls, cfg, anchor_scales=None):
        scales = anchor_scales or cfg.network.ANCHOR_SCALES
        low = max(feature_stride(cfg) * min(scales) / math.sqrt(2), float(cfg.TRAIN.RPN_MIN_GT_SIZE))
        chip_size = cfg.TRAIN.CHIP_SIZE
        return cls(low=low, comfortable=max(chip_size / 10, low), high=chip_size / 2)


@dataclass(frozen=True)
class Pyramid:
    """A candidate training pyramid in config form (finest first)."""

    scales: tuple  # factors, the last may be a longer side in pixels (> MAX_SCALE_FACTOR)
    valid_ranges: tuple  # ((lo, hi), ...) original pixels, -1 open
    anchor_scales: tuple  # network.ANCHOR_SCALES it needs
    label: str


@dataclass
class Evaluation:
    """What mining one epoch with a pyramid gives."""

    pyramid: Pyramid
    kept: float  # share of boxes valid in a positive chip at a well-sized scale
    valid: float  # share of boxes valid in some positive chip (any size)
    chips_per_image: float
    pixel_ratio: float  # chip pixels / single-scale 800 x 1333 pixels
    chip_pixels: int
    chip_sizes: tuple  # sqrt(area) in chip pixels of the valid (box, scale) pairs: 1st, 50th, 99th percentile


@dataclass
class Fit:
    band: SizeBand  # the proposal's (its anchors)
    current: Evaluation
    evaluations: list  # every candidate, the current pyramid first
    proposal: Evaluation
    meets_keep: bool
    trainable: float  # share of boxes some candidate makes valid (the keep target is relative to it)
    max_boxes: int  # most boxes in one image
    training_entries: int  # of the whole training set, flipped copies included (the fit samples its images)


def _round_up(value, digits=3):
    """``value`` rounded up to ``digits`` significant digits (a factor never ends below the one computed)."""
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return round(math.ceil(value / step - 1e-9) * step, 10)


def object_sizes(roidb, chip_size):
    """(sqrt(area) of every box, the coarsest scale's factor ``chip_size / longer side`` of its image)."""
    sizes, coarse = [], []
    for entry in roidb:
        boxes = np.asarray(entry["boxes"], np.float32).reshape(-1, 4)
        sizes.append(box_sqrt_area(boxes))
        coarse.append(np.full(len(boxes), chip_size / max(entry["height"], entry["width"])))
    if not sizes or not sum(len(s) for s in sizes):
        raise FitError("the training set has no boxes to fit scales to")
    return np.concatenate(sizes), np.concatenate(coarse)


def _smaller_anchors(anchor_scales, needed_side, stride):
    """Anchor scales with one in front whose side is at most ``needed_side`` (steps of 0.5)."""
    smallest = max(math.floor(2 * needed_side / stride) / 2, 0.5)
    return (smallest,) + tuple(s for s in anchor_scales if s > smallest)


def build_pyramid(sizes, coarse, trim, overlap, cfg, max_factor):
    """The candidate of the module docstring's rule for the size quantile ``trim`` and ``overlap``."""
    chip_size, stride = cfg.TRAIN.CHIP_SIZE, feature_stride(cfg)
    band, anchors = SizeBand.from_config(cfg), tuple(cfg.network.ANCHOR_SCALES)
    label = f"trim {trim:.3f}, overlap {overlap:g}"
    if np.mean(sizes * coarse < band.comfortable) <= trim:
        return Pyramid((float(chip_size),), ((-1, -1),), anchors, label)
    quantile = max(float(np.quantile(sizes, trim)), 1.0)
    factor = band.low / quantile
    if factor > max_factor:  # smaller anchors instead of larger images
        factor = max_factor
        anchors = _smaller_anchors(anchors, quantile * factor * math.sqrt(2), stride)
        band = SizeBand.from_config(cfg, anchors)
    factors = [_round_up(factor)]
    median_coarse = float(np.median(coarse))
    coarsest = False
    while True:
        top = band.high / factors[-1]
        above = sizes > top
        if not above.any():
            break
        if np.mean(above & (sizes * coarse < band.comfortable)) <= trim / 2 or len(factors) == MAX_LEVELS - 1:
            coarsest = True
            break
        following = _round_up(factors[-1] * band.comfortable / band.high * overlap)
        if following <= median_coarse:
            coarsest = True
            break
        factors.append(following)
    ranges = [[math.floor(band.comfortable / s), math.ceil(band.high / s)] for s in factors]
    ranges[0][0] = -1
    scales = list(factors)
    if coarsest:
        ranges.append([min(math.floor(band.comfortable / median_coarse), ranges[-1][1]), -1])
        scales.append(float(chip_size))
    else:
        ranges[-1][1] = -1
    return Pyramid(tuple(scales), tuple(tuple(r) for r in ranges), anchors, label)


def candidate_pyramids(roidb, cfg, keep=DEFAULT_KEEP, max_factor=DEFAULT_MAX_FACTOR):
    """Distinct candidates of the rule over the trims and overlaps."""
    if not 0 < max_factor <= MAX_SCALE_FACTOR:
        raise FitError(f"max factor must be in (0, {MAX_SCALE_FACTOR:g}], got {max_factor!r}")
    sizes, coarse = object_sizes(roidb, cfg.TRAIN.CHIP_SIZE)
    loss = 1.0 - keep
    seen, candidates = set(), []
    for trim in (0.0, loss / 4, loss / 2):
        for overlap in OVERLAPS:
            pyramid = build_pyramid(sizes, coarse, trim, overlap, cfg, max_factor)
            key = (pyramid.scales, pyramid.valid_ranges, pyramid.anchor_scales)
            if key not in seen:
                seen.add(key)
                candidates.append(pyramid)
    return candidates


def pyramid_overrides(cfg, pyramid):
    """The config keys a pyramid sets: scales and ranges (training and test), the per-scale lists
    (each scale keeps the input's value of the same rank from the finest or the coarsest end), anchors."""
    levels = len(pyramid.scales)

    def per_level(values):
        values = list(values)
        return [values[min(i, len(values) - 1)] if i < levels - 1 else values[-1] for i in range(levels)]

    def scales():  # a new list per key: YAML would otherwise write anchors and aliases
        return [float(s) for s in pyramid.scales]

    def ranges():
        return [list(r) for r in pyramid.valid_ranges]

    overrides = {"TRAIN.SCALES": scales(), "TRAIN.VALID_RANGES": ranges(),
                 "TRAIN.NEG_CHIP_MIN_PROPOSALS": per_level(cfg.TRAIN.NEG_CHIP_MIN_PROPOSALS),
                 "TEST.SCALES": scales(), "TEST.VALID_RANGES": ranges()}
    if isinstance(cfg.TEST.BATCH_IMAGES, (list, tuple)):
        overrides["TEST.BATCH_IMAGES"] = per_level(cfg.TEST.BATCH_IMAGES)
    if tuple(pyramid.anchor_scales) != tuple(cfg.network.ANCHOR_SCALES):
        overrides["network.ANCHOR_SCALES"] = list(pyramid.anchor_scales)
        overrides["network.NUM_ANCHORS"] = len(pyramid.anchor_scales) * len(cfg.network.ANCHOR_RATIOS)
    return overrides


def evaluate(roidb, cfg, pyramid, seed=0):
    """Mine one epoch of ``roidb`` with ``pyramid`` (no negative chips: the miner has no proposals here)."""
    cfg = with_overrides(cfg, dict(pyramid_overrides(cfg, pyramid), **{"TRAIN.USE_NEG_CHIPS": False}))
    band = SizeBand.from_config(cfg)
    counts = {"boxes": 0, "kept": 0, "valid": 0}
    chip_sizes = []

    def measure(entry, image_chips):
        sizes = box_sqrt_area(entry["boxes"])
        kept, valid = np.zeros(len(sizes), bool), np.zeros(len(sizes), bool)
        for level, scale in enumerate(image_chips.scales):  # finest first
            index = np.unique(np.concatenate(scale.pos_valid)) if scale.pos_valid else np.zeros(0, np.int64)
            seen = sizes[index] * scale.im_scale
            chip_sizes.append(seen)
            valid[index] = True
            kept[index[seen >= (band.comfortable if level else band.low)]] = True
        counts["boxes"] += len(sizes)
        counts["kept"] += int(kept.sum())
        counts["valid"] += int(valid.sum())

    totals = epoch_pixel_budget(roidb, cfg, np.random.default_rng(seed), on_image=measure)
    boxes, chips = max(counts["boxes"], 1), int(totals["positive"].sum() + totals["negative"].sum())
    seen = np.concatenate(chip_sizes) if chip_sizes else np.zeros(0)
    percentiles = tuple(float(v) for v in np.percentile(seen, (1, 50, 99))) if len(seen) else (0.0, 0.0, 0.0)
    return Evaluation(pyramid=pyramid, kept=counts["kept"] / boxes, valid=counts["valid"] / boxes,
                      chips_per_image=chips / max(len(roidb), 1),
                      pixel_ratio=totals["chip_pixels"] / max(totals["baseline_pixels"], 1),
                      chip_pixels=int(totals["chip_pixels"]), chip_sizes=percentiles)


def training_images(roidb, max_images, seed=0):
    """The unflipped entries, at most ``max_images`` of them drawn at random (0: all)."""
    entries = [entry for entry in roidb if not entry.get("flipped")]
    if max_images and len(entries) > max_images:
        picked = np.random.default_rng(seed).choice(len(entries), max_images, replace=False)
        entries = [entries[i] for i in sorted(picked)]
    return entries


def fit_dataset(cfg, keep=DEFAULT_KEEP, max_images=DEFAULT_MAX_IMAGES, max_factor=DEFAULT_MAX_FACTOR, seed=0):
    """``fit_pyramid`` on ``training_images`` of the config's training set (``dataset.image_set``)."""
    from lib.dataset import load_roidb

    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    fit = fit_pyramid(training_images(roidb, max_images, seed), cfg, keep, max_factor, seed)
    return dataclasses.replace(fit, training_entries=len(roidb))


def schedule_text(cfg, fit):
    """The fitted pyramid's updates an epoch (its chips per image over the training entries, in batches of
    TRAIN.BATCH_IMAGES x the devices of ``gpus``, TRAIN.GRAD_ACCUM_STEPS a update) and the epochs giving the
    recommended number of updates (lib.train.progress.recommended_schedule), as the --set to train them."""
    chips = fit.proposal.chips_per_image * fit.training_entries
    batch = cfg.TRAIN.BATCH_IMAGES * device_count(cfg.gpus)
    per_epoch = updates_per_epoch(math.ceil(chips / batch), cfg.TRAIN.GRAD_ACCUM_STEPS)
    updates, epochs, step = recommended_schedule(cfg, per_epoch)
    return (f"schedule: about {chips:.0f} chips an epoch ({fit.training_entries} training images, flips "
            f"included) = {per_epoch} updates of {batch} chips (x {cfg.TRAIN.GRAD_ACCUM_STEPS} accumulated); the "
            f"recommended {updates} updates ({SCHEDULE_WARMUPS} x TRAIN.warmup_step {cfg.TRAIN.warmup_step}) "
            f"take {epochs} epochs: --set TRAIN.end_epoch {epochs} TRAIN.lr_step {step:g}")


def fit_pyramid(roidb, cfg, keep=DEFAULT_KEEP, max_factor=DEFAULT_MAX_FACTOR, seed=0):
    """Fit (module docstring) on training entries ``roidb`` under ``cfg``: every candidate evaluated."""
    if cfg.TEST.AUTO_FOCUS or cfg.network.AUTO_FOCUS:
        raise FitError("fit_scales does not fit AutoFocus configs (TEST.DO_PRUNING and CHIP_HYPERPARAMS are "
                       "per scale); fit the plain config and add AutoFocus to the result")
    if not 0 < keep <= 1:
        raise FitError(f"keep must be in (0, 1], got {keep!r}")
    current = Pyramid(tuple(cfg.TRAIN.SCALES), tuple(tuple(r) for r in cfg.TRAIN.VALID_RANGES),
                      tuple(cfg.network.ANCHOR_SCALES), "current config")
    evaluations = [evaluate(roidb, cfg, p, seed) for p in [current] + candidate_pyramids(roidb, cfg, keep, max_factor)]
    trainable = max(e.valid for e in evaluations)  # boxes too small for the miner at any scale do not count
    passing = [e for e in evaluations if e.kept >= keep * trainable]
    if passing:
        proposal = min(passing, key=lambda e: (e.chip_pixels, len(e.pyramid.scales)))
    else:
        proposal = max(evaluations, key=lambda e: (e.kept, -e.chip_pixels))
    return Fit(band=SizeBand.from_config(cfg, proposal.pyramid.anchor_scales), current=evaluations[0],
               evaluations=evaluations, proposal=proposal, meets_keep=bool(passing), trainable=trainable,
               max_boxes=max(len(e["boxes"]) for e in roidb), training_entries=len(roidb))


def report(fit):
    """The candidates as a Markdown table, the proposal marked."""
    rows = []
    for e in fit.evaluations:
        p = e.pyramid
        rows.append(["*" if e is fit.proposal else "", p.label, str(list(p.scales)),
                     str([list(r) for r in p.valid_ranges]), 100 * e.kept, 100 * e.valid, e.chips_per_image,
                     e.pixel_ratio, "/".join(f"{v:.0f}" for v in e.chip_sizes)])
    header = ["", "candidate", "scales", "valid ranges", "kept %", "valid %", "chips/img", "px vs 800x1333",
              "chip px p1/p50/p99"]
    return markdown_table(header, rows, [None, None, None, None, ".1f", ".1f", ".2f", ".2f", None])


def dense_overrides(cfg, max_boxes):
    """A set with more than 100 boxes in an image is scored at every detection the test keeps
    (TEST.EVAL_MAX_DETS 0), which keeps at least twice that many (TEST.MAX_PER_IMAGE, in hundreds)."""
    if max_boxes <= 100:
        return {}
    return {"TEST.EVAL_MAX_DETS": 0,
            "TEST.MAX_PER_IMAGE": max(cfg.TEST.MAX_PER_IMAGE, 100 * math.ceil(2 * max_boxes / 100))}


def _set_nested(mapping, dotted, value):
    *sections, leaf = dotted.split(".")
    for section in sections:
        node = mapping.get(section)
        if not isinstance(node, dict):
            node = mapping[section] = {}
        mapping = node
    mapping[leaf] = value


def fitted_config_path(config_path):
    """``configs/x.yml`` -> ``configs/x_fitted.yml`` (beside the input)."""
    stem, ext = config_path.rsplit(".", 1) if "." in config_path.rsplit("/", 1)[-1] else (config_path, "yml")
    return f"{stem}_fitted.{ext}"


def write_fitted_config(config_path, cfg, fit, out_path=None, overrides=()):
    """The input YAML (its ``_BASE_`` chain merged in: the written file is flat) with the ``--set`` keys it was fitted with (``overrides``: ``[(key, value)]``, written as
    ``cfg`` holds them: the fitted file trains on the data the fit read), then the proposal's keys (and
    ``dense_overrides``) set, written (atomically) beside it; returns the path."""
    loaded = config_file_values(config_path)
    values = flat_config(cfg)
    carried = list(dict.fromkeys(RENAMED_KEYS.get(key, key) for key, _ in overrides))
    for key in carried:
        _set_nested(loaded, key, values[key])
    for key, value in {**pyramid_overrides(cfg, fit.proposal.pyramid), **dense_overrides(cfg, fit.max_boxes)}.items():
        _set_nested(loaded, key, value)
    e = fit.proposal
    header = (f"# Written by tools/fit_scales.py from {config_path}: the pyramid keeps {100 * e.kept:.1f}% of the\n"
              f"# training boxes well sized (chip px >= {fit.band.low:.1f} at the finest scale, >= "
              f"{fit.band.comfortable:.1f} at the others),\n# {e.chips_per_image:.2f} chips per image, "
              f"{e.pixel_ratio:.2f}x the pixels of single-scale 800x1333 training.\n")
    if carried:
        header += (f"# Fitted with --set {' '.join(carried)}:\n# their values are written below, so this file trains "
                   f"on the data the fit read.\n")
    path = out_path or fitted_config_path(config_path)
    text = header + yaml.safe_dump(loaded, sort_keys=False, default_flow_style=None)
    with atomic_open(path, "w") as f:
        f.write(text)
    return path
