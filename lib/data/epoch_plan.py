"""The chips of one epoch: mined afresh (new stride draw, new negative sample), shuffled, batched.

Every random stream is derived from (seed, epoch, purpose, index), so an epoch is a pure function
of the seed whatever the number of workers or the order in which they finish.
"""
import math
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from chip_generator.mining import draw_epoch_stride, mine_image_chips, sample_epoch_chips
from lib.errors import DataError

# Purposes of the derived random streams.
_STRIDE, _MINE, _SHUFFLE, _CHIP, _REPLACE = range(5)
# Images per mining task: small enough to balance the pool, big enough to amortise the messages.
MINE_CHUNK = 32
# How many random picks a replacement chip gets to avoid images already known to be unreadable.
_REPLACEMENT_TRIES = 100


class ChipRef(NamedTuple):
    """One chip to build: its image, scale, box in scaled-image pixels, and the miner's decision of
    which of the image's boxes it trains on as valid (the others it shows are ignored)."""

    image_index: int
    scale_index: int
    im_scale: float
    box: tuple  # (x1, y1, x2, y2), inclusive, in the scaled (and mirrored if flipped) image
    valid_boxes: tuple  # indices into the roidb entry's boxes
    negative: bool = False  # a background chip from negative chip mining

    def valid_mask(self, num_boxes):
        """bool (num_boxes,): which of the entry's boxes this chip trains on as valid."""
        mask = np.zeros(num_boxes, bool)
        mask[list(self.valid_boxes)] = True
        return mask


class ChipTable(NamedTuple):
    """Many chips as arrays (an epoch of COCO holds about a million: tuples would take gigabytes).

    The valid boxes of chip i are ``valid_boxes[valid_offsets[i]:valid_offsets[i + 1]]``.
    """

    image_index: np.ndarray  # int32 (n,)
    scale_index: np.ndarray  # int8 (n,)
    im_scale: np.ndarray  # float64 (n,)
    boxes: np.ndarray  # float32 (n, 4)
    negative: np.ndarray  # bool (n,): negative (background) chips
    valid_offsets: np.ndarray  # int64 (n + 1,)
    valid_boxes: np.ndarray  # int32 (total,)

    @classmethod
    def from_rows(cls, rows):
        """From ``(image index, scale index, im_scale, box, negative, valid box indices)`` rows."""
        columns = list(zip(*rows)) or [()] * 6
        counts = np.array([len(v) for v in columns[5]], np.int64)
        return cls(np.array(columns[0], np.int32), np.array(columns[1], np.int8), np.array(columns[2], np.float64),
                   np.array(columns[3], np.float32).reshape(-1, 4), np.array(columns[4], bool),
                   np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                   np.concatenate([np.zeros(0, np.int32)] + [np.asarray(v, np.int32) for v in columns[5]]))

    def __len__(self):
        return len(self.image_index)

    def valid_of(self, index):
        return self.valid_boxes[self.valid_offsets[index]:self.valid_offsets[index + 1]]

    @classmethod
    def concatenate(cls, tables):
        shifts = np.cumsum([0] + [len(t.valid_boxes) for t in tables[:-1]])
        offsets = [tables[0].valid_offsets[:1]] + [t.valid_offsets[1:] + shift for t, shift in zip(tables, shifts)]
        return cls(*(np.concatenate(columns) for columns in zip(*(t[:5] for t in tables))),
                   np.concatenate(offsets), np.concatenate([t.valid_boxes for t in tables]))

    def take(self, order):
        order = np.asarray(order, np.int64)
        starts, counts = self.valid_offsets[order], np.diff(self.valid_offsets)[order]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # positions of every kept valid box: its row's start plus its rank within the row
        flat = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        return ChipTable(*(column[order] for column in self[:5]), offsets, self.valid_boxes[flat])


def stream(seed, epoch, purpose, *index):
    """The random generator of one purpose (and index) of an epoch."""
    return np.random.default_rng([seed, epoch, purpose, *index])


def mine_images(roidb, params, stride, seed, epoch, indices):
    """Mine and sample the chips of roidb[indices] for an epoch (``params``: MiningParams): a ChipTable
    in image order."""
    rows = []
    for index in indices:
        rng = stream(seed, epoch, _MINE, index)
        image_chips = mine_image_chips(roidb[index], params, stride, rng)
        for scale_index, box, negative, valid in sample_epoch_chips(image_chips, rng, params.max_neg_chips):
            rows.append((index, scale_index, image_chips.scales[scale_index].im_scale, box, negative, valid))
    return ChipTable.from_rows(rows)


def mine_epoch(roidb, params, pool, seed, epoch):
    """All chips of an epoch (ChipTable), mined over ``pool`` in chunks of images, and the stride."""
    stride = draw_epoch_stride(params, stream(seed, epoch, _STRIDE))
    chunks = [range(start, min(start + MINE_CHUNK, len(roidb))) for start in range(0, len(roidb), MINE_CHUNK)]
    for number, chunk in enumerate(chunks):
        pool.submit(("mine", number, stride, seed, epoch, chunk))
    mined = [None] * len(chunks)
    with tqdm(total=len(roidb), desc=f"mining chips, epoch {epoch}", unit="image", leave=False,
              disable=len(chunks) < 4) as progress:
        for _ in chunks:
            message = None
            while message is None:
                message = pool.get()
            _, number, table = message
            mined[number] = table
            progress.update(len(chunks[number]))
    return ChipTable.concatenate(mined), stride


class EpochPlan:
    """The shuffled chips of an epoch split into batches; the last batch is padded by wrapping.

    With ``num_shards`` > 1 (distributed training) every shard holds one slice of each global batch of
    ``batch_size * num_shards`` chips: shard ``k`` of batch ``b`` is positions ``k * batch_size ..``
    of the unsharded plan's batch ``b`` with that global batch size, chip seeds included. So the
    shards are disjoint, together they are exactly the single-machine epoch, and all have the same
    number of batches (a sync kvstore deadlocks otherwise); a shard past the last chip wraps too.
    """

    def __init__(self, chips, stride, batch_size, seed, epoch, shuffle, num_shards=1, shard_index=0):
        if not len(chips):
            raise DataError(f"epoch {epoch}: no chips were mined; the roidb has no box valid at any training "
                            f"scale (check TRAIN.SCALES, TRAIN.VALID_RANGES and TRAIN.CHIP_SIZE)")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"EpochPlan: shard_index must be in [0, {num_shards}), got {shard_index}")
        count = len(chips)
        self.num_negative = int(chips.negative.sum())
        self.chips = chips.take(stream(seed, epoch, _SHUFFLE).permutation(count) if shuffle else np.arange(count))
        self.num_chips, self.stride = count, stride
        self.seed, self.epoch, self.batch_size = seed, epoch, batch_size
        self.num_shards, self.shard_index = num_shards, shard_index
        self.num_batches = math.ceil(count / (batch_size * num_shards))
        # the shard's last batch: chips past the end of the epoch are wrapped copies
        last_end = self._global_index(self.num_batches - 1, 0) + batch_size
        self.pad = min(batch_size, max(0, last_end - count))

    def batch_pad(self, batch):
        return self.pad if batch == self.num_batches - 1 else 0

    def _global_index(self, batch, position):
        """Position of a chip of this shard in the single-machine epoch."""
        return (batch * self.num_shards + self.shard_index) * self.batch_size + position

    def chip(self, index):
        """The ChipRef at position ``index`` of the shuffled epoch."""
        c = self.chips
        return ChipRef(int(c.image_index[index]), int(c.scale_index[index]), float(c.im_scale[index]),
                       tuple(float(v) for v in c.boxes[index]), tuple(int(v) for v in c.valid_of(index)),
                       bool(c.negative[index]))

    def chip_at(self, batch, position):
        """(ChipRef, rng seed) of a batch position."""
        index = self._global_index(batch, position)
        return self.chip(index % self.num_chips), (self.seed, self.epoch, _CHIP, index)

    def replacement(self, batch, position, attempt, roidb, bad_images):
        """(ChipRef, rng seed) standing in for a chip whose image could not be read: a random chip of
        another image, avoiding images already known to be bad when possible."""
        index = self._global_index(batch, position)
        rng = stream(self.seed, self.epoch, _REPLACE, index, attempt)
        for _ in range(_REPLACEMENT_TRIES):
            pick = int(rng.integers(self.num_chips))
            if roidb[int(self.chips.image_index[pick])]["image"] not in bad_images:
                break
        return self.chip(pick), (self.seed, self.epoch, _CHIP, index, attempt)
