"""Rules of the reference's roidb, applied to loaded entries (configs/default.py keys
dataset.INTEGER_BOXES, dataset.PROPOSAL_NMS and dataset.TEST_IMAGE_ORDER; docs/reference_differences.md).

* The reference's COCO loader stores boxes as uint16: every coordinate truncated toward zero to a
  whole pixel, before the mirrored copies are made from them.
* It runs NMS over each image's proposals of all test scales pooled (IoU above 0.7 suppressed, higher
  scores first) before mining negative chips from them, which removes the near-duplicates that the
  per-scale proposal sets share.
* Its COCO image order is ``coco.imgs.keys()`` under Python 2: the slot order of a dict the image ids
  were inserted into in file order (``python2_dict_order``), which decides how its test set is split and
  batched.
"""
import numpy as np

from lib.boxes import flip_boxes, nms


def truncate_to_whole_pixels(roidb):
    """The training roidb with every box coordinate of the unflipped entries truncated toward zero, and
    the flipped entries mirrored from those (so a mirrored box is exactly the mirror of the integer one)."""
    unflipped = {entry["id"]: dict(entry, boxes=np.trunc(entry["boxes"]).astype(np.float32))
                 for entry in roidb if not entry["flipped"]}
    return [dict(entry, boxes=flip_boxes(unflipped[entry["id"]]["boxes"], entry["width"])) if entry["flipped"]
            else unflipped[entry["id"]] for entry in roidb]


_SIZE_T = (1 << 64) - 1
_PERTURB_SHIFT = 5


def python2_dict_order(keys):
    """Positions into ``keys`` (integers, in insertion order; a repeat keeps its first place) in the order
    CPython 2.7 iterates a dict they were inserted into: open addressing over a power-of-two table
    (first slot ``hash & mask``, then ``i = 5 i + perturb + 1`` with ``perturb`` the hash shifted right by 5
    after each probe, in size_t), the table resized to the smallest power of two above 4x the entries
    (2x above 50000) once it is two-thirds full, entries re-inserted in slot order; an int's hash is
    itself (-1: -2)."""
    table, used, seen = [None] * 8, 0, set()

    def insert(slots, position):
        mask = len(slots) - 1
        hashed = (-2 if keys[position] == -1 else int(keys[position])) & _SIZE_T
        slot, perturb = hashed & mask, hashed
        while slots[slot & mask] is not None:
            slot = (5 * slot + perturb + 1) & _SIZE_T
            perturb >>= _PERTURB_SHIFT
        slots[slot & mask] = position

    for position, key in enumerate(keys):
        if key in seen:
            continue
        seen.add(key)
        insert(table, position)
        used += 1
        if used * 3 >= len(table) * 2:
            wanted, size = (2 if used > 50000 else 4) * used, 8
            while size <= wanted:
                size <<= 1
            old, table = table, [None] * size
            for position_in_old in old:
                if position_in_old is not None:
                    insert(table, position_in_old)
    return [position for position in table if position is not None]


def suppress_pooled_proposals(proposals, thresh):
    """Rows of ``proposals`` (P, 5) ``[x1, y1, x2, y2, score]`` kept by NMS at ``thresh``, highest score
    first; ``thresh`` 0 keeps them all, in file order."""
    if not thresh or len(proposals) == 0:
        return proposals
    return proposals[nms(proposals, thresh)]
