"""Two rules of the reference's training roidb, applied to loaded entries (configs/default.py keys
dataset.INTEGER_BOXES and dataset.PROPOSAL_NMS; docs/reference_differences.md).

* The reference's COCO loader stores boxes as uint16: every coordinate truncated toward zero to a
  whole pixel, before the mirrored copies are made from them.
* It runs NMS over each image's proposals of all test scales pooled (IoU above 0.7 suppressed, higher
  scores first) before mining negative chips from them, which removes the near-duplicates that the
  per-scale proposal sets share.
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


def suppress_pooled_proposals(proposals, thresh):
    """Rows of ``proposals`` (P, 5) ``[x1, y1, x2, y2, score]`` kept by NMS at ``thresh``, highest score
    first; ``thresh`` 0 keeps them all, in file order."""
    if not thresh or len(proposals) == 0:
        return proposals
    return proposals[nms(proposals, thresh)]
