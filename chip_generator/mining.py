"""Per-image chip mining for training (spec sections 1-3).

For every training scale: which boxes are valid, the positive chips covering them (greedy cover),
which boxes each chip trains on as valid, and, from RPN proposals, negative chips on background the
positive chips miss. The training iterator mines each image once per epoch (the chip stride is drawn
per epoch) and samples the chips it trains on with `sample_epoch_chips`, which also hands each chip the
boxes it trains on as valid, so that the chip builder never decides validity again.
The config is read once, into `MiningParams`.

The defaults are the reference's effective rules; each rule the project can do differently is a config
key (configs/default.py, docs/reference_differences.md):

* TRAIN.VALIDITY_RULES: which boxes are valid at a scale. ``reference``: sizes are ``x2 - x1`` truncated
  to whole pixels (no +1) and ``sqrt(w * h)`` is tested against the range; the positive chips are
  generated for the boxes with ``lo <= size < hi`` (finest scale: no lower bound, at least 2 px wide
  and high; coarsest: no upper bound) that fit in a chip (``max side < (chip - stride - 1) / scale``,
  not at the coarsest scale); boxes are then assigned to chips under a laxer rule: every scale but the
  coarsest drops the lower bound and requires 2 px. ``strict``: one rule for both, today's spec
  section 1: ``lo <= sqrt((w + 1)(h + 1)) <= hi``, the fit rule and the 2 px rule at the finest scale.
* Assignment (both rules): a box (gt or proposal) valid for assignment goes to the chip of its scale
  containing the largest part of it (measured in original pixels, the first chip in pick order on ties)
  when its visible part there is at least 1 px each way and its ``sqrt(w * h)`` (no +1) is ``<= hi``
  (coarsest scale: ``>= lo``); it is then "covered".
* TRAIN.CHIP_VALID_BOXES: ``assigned``: a positive chip trains on its assigned gts as valid, a negative
  chip on the gts counted in it; every other box it shows is ignored. ``visible``: every chip trains
  on every box valid at its scale that it shows.
* TRAIN.NEG_CHIP_RULES: ``reference``: the boxes (gts and proposals) valid for assignment but not
  covered are covered greedily by negative chips; each is counted once, in the negative chip
  containing most of it, when its visible part there is at least 1 px each way and ``< hi`` (coarsest:
  ``>= lo``). ``contained``: proposals in the valid range contained in no positive chip are covered and
  counted in every negative chip containing them; no gt is valid in a negative chip.
  A negative chip is kept when its count exceeds TRAIN.NEG_CHIP_MIN_PROPOSALS of its scale.
* TRAIN.CHIP_WINDOWS: the candidate windows (chip_generator.cover).
* TRAIN.CHIP_CROP ``truncate``: the scaled image is ``int(W * s)`` x ``int(H * s)`` px (``round`` rounds).
"""
from dataclasses import dataclass, field

import numpy as np

from chip_generator.cover import generate, validate_inputs
from lib.boxes import ignore_overlaps
from lib.scales import in_valid_range, pyramid, scaled_image_size


def neg_chip_proposals(cfg):
    """The proposal file training mines negative chips from: ``dataset.proposal`` with TRAIN.USE_NEG_CHIPS on,
    else '' (none is read: negative chips are off)."""
    return cfg.dataset.proposal if cfg.TRAIN.USE_NEG_CHIPS else ""


@dataclass(frozen=True)
class MiningParams:
    """What chip mining reads from the config (TRAIN section), parsed once per run."""

    levels: tuple  # lib.scales.ScaleLevel per training scale, finest first
    chip_size: int
    chip_stride: tuple  # (stride,) or [lo, hi) drawn once per epoch
    neg_min_proposals: tuple  # per level: a negative chip needs a count above this
    max_neg_chips: int  # negative chips per image and epoch; 0 when negative chips are off
    validity_rules: str  # TRAIN.VALIDITY_RULES
    chip_valid_boxes: str  # TRAIN.CHIP_VALID_BOXES
    neg_chip_rules: str  # TRAIN.NEG_CHIP_RULES
    chip_windows: str  # TRAIN.CHIP_WINDOWS
    truncate_image_size: bool  # TRAIN.CHIP_CROP == "truncate"

    @classmethod
    def from_config(cls, cfg):
        train = cfg.TRAIN
        stride = train.CHIP_STRIDE
        stride = tuple(stride) if isinstance(stride, (list, tuple)) else (stride,)
        if len(stride) == 2:
            if not all(float(v).is_integer() for v in stride) or not 0 < stride[0] < stride[1]:
                raise ValueError(f"config key TRAIN.CHIP_STRIDE: expected an int or [lo, hi) with 0 < lo < hi, "
                                 f"got {list(stride)!r}")
        elif len(stride) != 1 or isinstance(stride[0], bool) or not float(stride[0]).is_integer() or stride[0] <= 0:
            raise ValueError(f"config key TRAIN.CHIP_STRIDE: expected a positive integer, got {train.CHIP_STRIDE!r}")
        negative = len(train.NEG_CHIP_MIN_PROPOSALS) == len(train.SCALES)
        if not negative and neg_chip_proposals(cfg):  # with negative chips off the key is not read
            raise ValueError(f"config key TRAIN.NEG_CHIP_MIN_PROPOSALS = {list(train.NEG_CHIP_MIN_PROPOSALS)!r}: needs "
                             f"one value per training scale ({len(train.SCALES)})")
        return cls(levels=pyramid(train, "TRAIN"), chip_size=int(train.CHIP_SIZE),
                   chip_stride=tuple(int(v) for v in stride),
                   neg_min_proposals=tuple(int(v) for v in train.NEG_CHIP_MIN_PROPOSALS) if negative else (),
                   max_neg_chips=int(train.MAX_NEG_CHIPS) if train.USE_NEG_CHIPS and negative else 0,
                   validity_rules=train.VALIDITY_RULES, chip_valid_boxes=train.CHIP_VALID_BOXES,
                   neg_chip_rules=train.NEG_CHIP_RULES, chip_windows=train.CHIP_WINDOWS,
                   truncate_image_size=train.CHIP_CROP == "truncate")


@dataclass
class ScaleChips:
    """The chips of one image at one training scale; chip boxes are in scaled-image pixels."""

    im_scale: float
    image_size: tuple  # (height, width) of the resized image
    valid: np.ndarray  # bool (N,): entry["boxes"] the positive chips of this scale are generated for
    pos_chips: np.ndarray  # float32 (K, 4), pick order
    pos_valid: list  # K int64 arrays: indices into entry["boxes"] chip k trains on as valid
    neg_chips: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))  # float32 (M, 4)
    neg_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # boxes counted in each
    neg_valid: list = field(default_factory=list)  # M int64 arrays, as pos_valid


@dataclass
class ImageChips:
    """All chips of one roidb entry, one ScaleChips per training scale (finest first)."""

    scales: list


def draw_epoch_stride(params, rng):
    """The chip stride of an epoch: the configured one, or uniform in [lo, hi) when a pair."""
    if len(params.chip_stride) == 2:
        return int(rng.integers(*params.chip_stride))
    return params.chip_stride[0]


def valid_box_mask(boxes, valid_range, scale, chip_size, stride, level, num_levels, rules, assignment):
    """Boxes (original pixels) valid at scale ``level`` of ``num_levels`` (0 = finest) under ``rules``
    (module docstring): for generating the positive chips, or (``assignment``) for assigning boxes to
    chips. -1 is an open end of ``valid_range``."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    lo, hi = valid_range
    coarsest, finest = level == num_levels - 1, level == 0
    if rules == "strict":
        valid = in_valid_range(boxes, valid_range)
        widths, heights = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
        two_px = finest
    else:
        widths = (boxes[:, 2] - boxes[:, 0]).astype(np.int32)
        heights = (boxes[:, 3] - boxes[:, 1]).astype(np.int32)
        size = np.sqrt(widths.astype(np.float64) * heights)
        valid = np.ones(len(boxes), bool)
        if lo != -1 and (coarsest or not (finest or assignment)):
            valid &= size >= lo
        if hi != -1 and not coarsest:
            valid &= size < hi
        two_px = not coarsest and (finest or assignment)
    if not coarsest:
        valid &= np.maximum(widths, heights) < (chip_size - stride - 1) / scale
    if two_px:
        valid &= (widths >= 2) & (heights >= 2)
    return valid


def to_scaled_image(boxes, im_scale, image_size, dtype):
    """Boxes in original pixels -> scaled-image pixels (float32) for a greedy cover, clipped as the
    reference clips them: to [0, W - 2] x [0, H - 2] (its chip generator hands ``W - 1`` to a clipping
    function that subtracts 1 again), so that the truncated image size never pushes a box past its
    edge (which would make it fit in no chip). The product is computed in ``dtype``: the reference
    scales the gts of the positive cover in float32 and the boxes of the negative cover in float64 (a
    box edge on a window edge depends on it)."""
    height, width = image_size
    scaled = np.asarray(boxes, dtype).reshape(-1, 4) * dtype(im_scale)
    scaled[:, 0::2] = np.maximum(np.minimum(scaled[:, 0::2], width - 2), 0)
    scaled[:, 1::2] = np.maximum(np.minimum(scaled[:, 1::2], height - 2), 0)
    return scaled.astype(np.float32)


def _best_chips(boxes, chips, im_scale, valid_range, coarsest, strict_upper):
    """For each box (original pixels): the index of the chip (scaled pixels) containing the largest
    part of it, the first on ties, or -1 unless its visible part there is at least 1 px each way and
    its ``sqrt(w * h)`` (no +1, original pixels) is ``>= lo`` at the coarsest scale, else ``<= hi``
    (``< hi`` with ``strict_upper``); -1 is an open end."""
    if len(chips) == 0 or len(boxes) == 0:
        return np.full(len(boxes), -1, np.int64)
    chips = np.asarray(chips, np.float64) / im_scale
    boxes = np.asarray(boxes, np.float64)
    best = ignore_overlaps(boxes, chips).argmax(axis=1)
    owner = chips[best]
    width = np.minimum(owner[:, 2], boxes[:, 2]) - np.maximum(owner[:, 0], boxes[:, 0])
    height = np.minimum(owner[:, 3], boxes[:, 3]) - np.maximum(owner[:, 1], boxes[:, 1])
    size = np.sqrt(np.abs(width * height))
    lo, hi = valid_range
    if coarsest:
        accepted = size >= lo  # always with lo = -1
    elif hi == -1:
        accepted = np.ones(len(size), bool)
    else:
        accepted = size < hi if strict_upper else size <= hi
    return np.where((width >= 1) & (height >= 1) & accepted, best, -1)


def _members(owner, count):
    """Per chip k < count, the indices i with owner[i] == k."""
    return [np.flatnonzero(owner == k).astype(np.int64) for k in range(count)]


def _negatives_reference(pool, remaining, num_gts, im_scale, valid_range, coarsest, min_count, image_size, params,
                         stride, rng):
    """(chips, counts, valid gts per chip): the remaining boxes of ``pool`` (gts first, ``num_gts`` of
    them) covered greedily, each counted in the chip containing most of it."""
    index = np.flatnonzero(remaining)
    chips = generate(to_scaled_image(pool[index], im_scale, image_size, np.float64), image_size[1],
                     image_size[0], params.chip_size, stride, rng=rng, windows=params.chip_windows)
    best = _best_chips(pool[index], chips, im_scale, valid_range, coarsest, strict_upper=True)
    counts = np.bincount(best[best >= 0], minlength=len(chips)).astype(np.int64)
    keep = np.flatnonzero(counts > min_count)
    owner = np.full(len(pool), -1, np.int64)
    owner[index] = best
    members = _members(owner[:num_gts], len(chips))
    return chips[keep], counts[keep], [members[k] for k in keep]


def _negatives_contained(proposals, valid_range, pos_chips, image_size, im_scale, min_count, params, stride, rng):
    """(chips, counts, valid gts per chip): proposals in the valid range that no positive chip contains,
    covered greedily, each counted in every chip containing it."""
    scaled = to_scaled_image(proposals, im_scale, image_size, np.float32)
    remaining = in_valid_range(proposals, valid_range)
    if len(pos_chips):
        remaining &= ~(ignore_overlaps(scaled, pos_chips) >= 1.0).any(axis=1)
    candidates = scaled[remaining]
    chips = generate(candidates, image_size[1], image_size[0], params.chip_size, stride, rng=rng,
                     windows=params.chip_windows)
    if len(chips) == 0:
        return chips, np.zeros(0, np.int64), []
    counts = (ignore_overlaps(candidates, chips) >= 1.0).sum(axis=0).astype(np.int64)
    keep = counts > min_count
    return chips[keep], counts[keep], [np.zeros(0, np.int64) for _ in range(int(keep.sum()))]


def _mine_scale(boxes, proposals, height, width, level, index, params, stride, rng):
    """ScaleChips of one image at pyramid level ``index`` (see mine_image_chips)."""
    num_levels, chip_size = len(params.levels), params.chip_size
    coarsest = index == num_levels - 1
    im_scale = level.spec.image_scale(height, width)
    image_size = scaled_image_size(height, width, im_scale, params.truncate_image_size)
    rule = (level.valid_range, im_scale, chip_size, stride, index, num_levels, params.validity_rules)
    valid = valid_box_mask(boxes, *rule, assignment=False)
    pos_chips = generate(to_scaled_image(boxes[valid], im_scale, image_size, np.float32), image_size[1],
                         image_size[0], chip_size, stride, rng=rng, windows=params.chip_windows)
    # gts and proposals are assigned alike: an assigned proposal is covered (no negative chip for it)
    with_proposals = proposals is not None and len(proposals) > 0
    pool = np.concatenate([boxes, proposals]) if with_proposals else boxes
    assignable = valid_box_mask(pool, *rule, assignment=True)
    owner = np.full(len(pool), -1, np.int64)
    owner[assignable] = _best_chips(pool[assignable], pos_chips, im_scale, level.valid_range, coarsest,
                                    strict_upper=False)
    visible = params.chip_valid_boxes == "visible"
    scale_valid = np.flatnonzero(valid).astype(np.int64)
    chips = ScaleChips(im_scale=im_scale, image_size=image_size, valid=valid, pos_chips=pos_chips,
                       pos_valid=[scale_valid] * len(pos_chips) if visible else
                       _members(owner[:len(boxes)], len(pos_chips)))
    if with_proposals:
        min_count = params.neg_min_proposals[index]
        if params.neg_chip_rules == "reference":
            neg = _negatives_reference(pool, assignable & (owner < 0), len(boxes), im_scale, level.valid_range,
                                       coarsest, min_count, image_size, params, stride, rng)
        else:
            neg = _negatives_contained(proposals, level.valid_range, pos_chips, image_size, im_scale, min_count,
                                       params, stride, rng)
        chips.neg_chips, chips.neg_counts, chips.neg_valid = neg
        if visible:
            chips.neg_valid = [scale_valid] * len(chips.neg_chips)
    return chips


def mine_image_chips(entry, params, stride, rng):
    """Chips of one roidb entry at every training scale (ImageChips), with chip stride ``stride``.

    Negative chips are mined when the entry has "proposals" (original pixels, mirrored with the entry)
    and negative chips are on (``params.max_neg_chips`` > 0). ``rng`` (np.random.Generator) breaks ties
    in the greedy covers.
    """
    boxes = np.asarray(entry["boxes"], np.float32)
    proposals = entry.get("proposals") if params.max_neg_chips else None
    if proposals is not None:
        proposals = np.asarray(proposals, np.float32)
    for name, array in (("boxes", boxes), ("proposals", proposals)):
        try:
            if array is not None:
                validate_inputs(array, entry["width"], entry["height"], params.chip_size, stride)
        except ValueError as err:
            raise ValueError(f"image id {entry.get('id')} ({entry.get('image')}), {name}: {err}") from None
    return ImageChips(scales=[_mine_scale(boxes, proposals, entry["height"], entry["width"], level, index, params,
                                          stride, rng)
                              for index, level in enumerate(params.levels)])


def sample_epoch_chips(image_chips, rng, max_neg):
    """The chips one image contributes to an epoch: every positive chip, then at most ``max_neg``
    negative chips drawn without replacement from the pool of all scales. A list of
    ``(scale index, chip, negative, valid box indices)``: the boxes of the entry the chip trains on as
    valid (every other box it shows is an ignored one)."""
    scales = list(enumerate(image_chips.scales))
    positives = [(level, chip, False, valid.astype(np.int32))
                 for level, scale in scales for chip, valid in zip(scale.pos_chips, scale.pos_valid)]
    pool = [(level, chip, True, valid.astype(np.int32))
            for level, scale in scales for chip, valid in zip(scale.neg_chips, scale.neg_valid)]
    if max_neg <= 0 or not pool:
        return positives
    drawn = rng.choice(len(pool), size=min(max_neg, len(pool)), replace=False)
    return positives + [pool[i] for i in sorted(drawn)]
