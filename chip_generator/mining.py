"""Per-image chip mining for training (spec sections 1-3).

For every training scale: which boxes are valid, the positive chips covering them (greedy cover) with
each valid box assigned to its best chip, and, from RPN proposals, negative chips on background the
positive chips miss. The training iterator mines each image once per epoch (the chip stride is drawn
per epoch) and samples the chips it trains on with `sample_epoch_chips`, which also hands each chip the
boxes it trains on as valid, so that the chip builder never decides validity again.
The config is read once, into `MiningParams`.
"""
from dataclasses import dataclass, field

import numpy as np

from chip_generator.cover import generate, validate_inputs
from lib.boxes import ignore_overlaps
from lib.scales import in_valid_range, pyramid


@dataclass(frozen=True)
class MiningParams:
    """What chip mining reads from the config (TRAIN section), parsed once per run."""

    levels: tuple  # lib.scales.ScaleLevel per training scale, finest first
    chip_size: int
    chip_stride: tuple  # (stride,) or [lo, hi) drawn once per epoch
    neg_min_proposals: tuple  # per level: a negative chip needs more proposals than this
    max_neg_chips: int  # negative chips per image and epoch; 0 when negative chips are off

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
        return cls(levels=pyramid(train, "TRAIN"), chip_size=int(train.CHIP_SIZE),
                   chip_stride=tuple(int(v) for v in stride),
                   neg_min_proposals=tuple(int(v) for v in train.NEG_CHIP_MIN_PROPOSALS),
                   max_neg_chips=int(train.MAX_NEG_CHIPS) if train.USE_NEG_CHIPS else 0)


@dataclass
class ScaleChips:
    """The chips of one image at one training scale; chip boxes are in scaled-image pixels."""

    im_scale: float
    image_size: tuple  # (height, width) of the resized image
    valid: np.ndarray  # bool (N,): entry["boxes"] valid at this scale
    pos_chips: np.ndarray  # float32 (K, 4)
    pos_assigned: list  # K int64 arrays: indices into entry["boxes"] of the valid boxes assigned to chip k
    neg_chips: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))  # float32 (M, 4)
    neg_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # proposals inside each


@dataclass
class ImageChips:
    """All chips of one roidb entry, one ScaleChips per training scale (finest first)."""

    scales: list


def draw_epoch_stride(params, rng):
    """The chip stride of an epoch: the configured one, or uniform in [lo, hi) when a pair."""
    if len(params.chip_stride) == 2:
        return int(rng.integers(*params.chip_stride))
    return params.chip_stride[0]


def valid_box_mask(boxes, valid_range, scale, chip_size, stride, level, num_levels):
    """Boxes (original pixels) trained at scale `level` of `num_levels` (0 = finest), spec section 1:
    sqrt(area) in the valid range; except at the coarsest scale also small enough to fit in a chip
    at this scale, and at the finest scale at least 2 px wide and high."""
    valid = in_valid_range(boxes, valid_range)
    widths = boxes[:, 2] - boxes[:, 0] + 1
    heights = boxes[:, 3] - boxes[:, 1] + 1
    if level < num_levels - 1:
        valid &= np.maximum(widths, heights) < (chip_size - stride - 1) / scale
    if level == 0:
        valid &= (widths >= 2) & (heights >= 2)
    return valid


def _to_scaled_image(boxes, im_scale, image_size):
    """Boxes in original pixels -> scaled-image pixels, clipped to the image so rounding of the image
    size never pushes a box past its edge (which would make it fit in no chip)."""
    height, width = image_size
    scaled = np.asarray(boxes, np.float32).reshape(-1, 4) * np.float32(im_scale)
    np.clip(scaled[:, 0::2], 0, width - 1, out=scaled[:, 0::2])
    np.clip(scaled[:, 1::2], 0, height - 1, out=scaled[:, 1::2])
    return scaled


def _contained(boxes, chips):
    """(N, K) bool: box n lies entirely inside chip k."""
    return ignore_overlaps(boxes, chips) >= 1.0


def _assign_to_chips(scaled_boxes, box_indices, chips):
    """For each chip, the entries of `box_indices` whose box overlaps that chip most (ties: first chip)."""
    assigned = [np.zeros(0, np.int64) for _ in range(len(chips))]
    if len(chips) == 0 or len(box_indices) == 0:
        return assigned
    overlaps = ignore_overlaps(scaled_boxes[box_indices], chips)
    best = overlaps.argmax(axis=1)
    seen = overlaps[np.arange(len(best)), best] > 0
    for k in range(len(chips)):
        assigned[k] = box_indices[seen & (best == k)].astype(np.int64)
    return assigned


def _negative_chips(proposals, scaled_proposals, pos_chips, valid_range, image_size, chip_size, stride,
                    min_proposals, rng):
    """Spec section 3 at one scale: cover the valid-range proposals no positive chip contains and keep
    the chips holding more than `min_proposals` of them. Returns (chips, proposal counts)."""
    remaining = in_valid_range(proposals, valid_range)
    if len(pos_chips):
        remaining &= ~_contained(scaled_proposals, pos_chips).any(axis=1)
    candidates = scaled_proposals[remaining]
    chips = generate(candidates, image_size[1], image_size[0], chip_size, stride, rng=rng)
    if len(chips) == 0:
        return chips, np.zeros(0, np.int64)
    counts = _contained(candidates, chips).sum(axis=0).astype(np.int64)
    keep = counts > min_proposals
    return chips[keep], counts[keep]


def _mine_scale(boxes, proposals, height, width, level, index, params, stride, rng):
    """ScaleChips of one image at pyramid level ``index`` (see mine_image_chips)."""
    chip_size = params.chip_size
    im_scale = level.spec.image_scale(height, width)
    image_size = (max(int(round(height * im_scale)), 1), max(int(round(width * im_scale)), 1))
    valid = valid_box_mask(boxes, level.valid_range, im_scale, chip_size, stride, index, len(params.levels))
    scaled_boxes = _to_scaled_image(boxes, im_scale, image_size)
    pos_chips = generate(scaled_boxes[valid], image_size[1], image_size[0], chip_size, stride, rng=rng)
    chips = ScaleChips(im_scale=im_scale, image_size=image_size, valid=valid, pos_chips=pos_chips,
                       pos_assigned=_assign_to_chips(scaled_boxes, np.flatnonzero(valid), pos_chips))
    if proposals is not None and len(proposals):
        chips.neg_chips, chips.neg_counts = _negative_chips(
            proposals, _to_scaled_image(proposals, im_scale, image_size), pos_chips, level.valid_range, image_size,
            chip_size, stride, params.neg_min_proposals[index], rng)
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
    valid = [np.flatnonzero(scale.valid).astype(np.int32) for scale in image_chips.scales]
    positives = [(level, chip, False, valid[level])
                 for level, scale in enumerate(image_chips.scales) for chip in scale.pos_chips]
    pool = [(level, chip, True, valid[level])
            for level, scale in enumerate(image_chips.scales) for chip in scale.neg_chips]
    if max_neg <= 0 or not pool:
        return positives
    drawn = rng.choice(len(pool), size=min(max_neg, len(pool)), replace=False)
    return positives + [pool[i] for i in sorted(drawn)]
