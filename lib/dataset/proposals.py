"""Proposal files: per-image boxes for negative chip mining, as ``.npz`` read without pickle.

A proposal file is an uncompressed NumPy ``.npz`` of four plain arrays (no object arrays, so
``np.load(..., allow_pickle=False)`` reads it and nothing in it can run code):

- ``version``: int64 scalar, 1;
- ``image_ids``: int64 (N,), distinct;
- ``offsets``: int64 (N + 1,), increasing from 0: image ``image_ids[i]`` owns rows
  ``offsets[i]:offsets[i + 1]`` of ``boxes``;
- ``boxes``: float32 (total, 5) ``[x1, y1, x2, y2, score]`` (or (total, 4) without scores) in original,
  unflipped image pixels.

The reference's published proposal files are pickles, and unpickling runs whatever code the file
names. They are refused here; ``convert_pickle`` (``tools/convert_proposals.py``) converts one whose
source the user trusts, once, after a warning.
"""
import contextlib
import logging
import os
import pickle
import re
import zipfile

import numpy as np

from lib.atomic import atomic_open
from lib.errors import DataError, DataFileError

logger = logging.getLogger(__name__)

VERSION = 1
KEYS = ("version", "image_ids", "offsets", "boxes")
_PICKLE_FIRST_BYTES = (b"\x80", b"(", b"}", b"]")  # protocol 2+ opcode; protocol 0/1 dict/list/mark


def write_proposals(proposals, path):
    """``{image_id: (P, 4 or 5) array}`` to ``path`` (any name; the content is npz), atomically."""
    image_ids = sorted(proposals)
    arrays = [_box_array(proposals[image_id], image_id, path) for image_id in image_ids]
    widths = {a.shape[1] for a in arrays}
    if len(widths) > 1:
        raise DataError(f"proposals for {path}: some images have 4 columns and others 5")
    width = widths.pop() if widths else 5
    counts = [len(a) for a in arrays]
    with atomic_open(path, "wb") as f:  # a file object: np.savez would append '.npz' to a name
        np.savez(f, version=np.int64(VERSION), image_ids=np.asarray(image_ids, dtype=np.int64),
                 offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                 boxes=np.concatenate(arrays) if arrays else np.zeros((0, width), np.float32))


def read_proposals(path):
    """``{image_id: float32 (P, 4 or 5)}`` from a proposal file; errors name the file and say what is wrong
    (a legacy pickle: how to convert it)."""
    with open_proposals(path) as npz:
        version, image_ids, offsets, boxes = (npz[key] for key in KEYS)
    problem = _check(version, image_ids, offsets, boxes)
    if problem:
        raise DataError(f"proposal file {path}: {problem}")
    boxes = boxes.astype(np.float32, copy=False)
    return {int(image_id): boxes[start:end] for image_id, start, end in zip(image_ids, offsets[:-1], offsets[1:])}


def check_proposal_file(path):
    """Refuse, as ``read_proposals`` would, a proposal file that cannot be read, is a pickle or is not an .npz
    of the four arrays, reading its zip index only (cheap at any size): a training start's check."""
    with open_proposals(path):
        pass


@contextlib.contextmanager
def open_proposals(path):
    """The open ``np.load`` of a proposal file (its index read, an array when indexed) after the checks that
    need no array; an array that cannot be read inside the block is refused with the same message."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise DataFileError(f"cannot read proposal file {path} (dataset.proposal): {err.strerror or err}. Negative "
                            "chips (TRAIN.USE_NEG_CHIPS) need proposals of the training images: make them with "
                            "scripts/train_neg_props_and_sniper.sh, or set TRAIN.USE_NEG_CHIPS false") from None
    if head[:1] in _PICKLE_FIRST_BYTES:
        raise DataError(f"proposal file {path} is a pickle (the legacy format), which is not loaded because "
                        f"unpickling runs code from the file; if you trust its source, convert it once with "
                        f"tools/convert_proposals.py {path} {os.path.splitext(path)[0]}.npz")
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise DataError("a single .npy array, not an .npz of arrays")
        with npz:
            missing = [key for key in KEYS if key not in npz.files]
            if missing:
                raise DataError(f"lacks array(s) {', '.join(missing)}")
            yield npz
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise DataError(f"proposal file {path} is not a readable proposal .npz ({str(err).splitlines()[0]}); "
                        f"the format is described in lib/dataset/proposals.py") from None


def _check(version, image_ids, offsets, boxes):
    if version.shape != () or int(version) != VERSION:
        return f"version {version.tolist()} is not {VERSION}"
    if image_ids.ndim != 1 or image_ids.dtype.kind not in "iu":
        return f"image_ids must be integers (N,), got {image_ids.dtype} {image_ids.shape}"
    if len(np.unique(image_ids)) != len(image_ids):
        return "image_ids are not distinct"
    if boxes.ndim != 2 or boxes.shape[1] not in (4, 5) or boxes.dtype.kind != "f":
        return f"boxes must be float (total, 5) or (total, 4), got {boxes.dtype} {boxes.shape}"
    if (offsets.shape != (len(image_ids) + 1,) or offsets.dtype.kind not in "iu" or offsets[0] != 0
            or offsets[-1] != len(boxes) or np.any(np.diff(offsets) < 0)):
        return f"offsets must rise from 0 to {len(boxes)} (the number of boxes) in {len(image_ids) + 1} steps"
    return None


def _box_array(boxes, image_id, path):
    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.ndim != 2 or boxes.shape[1] not in (4, 5):
        raise DataError(f"{path}: image id {image_id} has proposals of shape {boxes.shape}, expected (P, 5)")
    return boxes


def image_id_of(key):
    """The int image id of a legacy proposal-file key: an int, a string of digits, or an image file name
    whose stem ends in the id (COCO's ``COCO_train2014_000000000009.jpg`` is image 9)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key)
    if isinstance(key, str):
        match = re.search(r"(\d+)$", os.path.splitext(os.path.basename(key))[0])
        if match:
            return int(match.group(1))
    raise DataError(f"key {key!r} is neither an image id nor an image file name ending in one")


def convert_pickle(source, target):
    """Convert a legacy pickled ``{image id or file name: (P, 4 or 5)}`` proposal file to ``target``.
    UNPICKLING RUNS CODE FROM ``source``: call this only for a file whose origin is trusted. Returns
    the number of images."""
    logger.warning("unpickling %s: a pickle can run arbitrary code when loaded; convert only files from a "
                   "source you trust", source)
    with open(source, "rb") as f:
        legacy = pickle.load(f)  # the one deliberate unpickling, behind the converter's explicit opt-in
    if not isinstance(legacy, dict):
        raise DataError(f"{source}: expected a dict {{image id: (P, 5) array}}, got {type(legacy).__name__}")
    proposals = {}
    for key, boxes in legacy.items():
        image_id = image_id_of(key)
        if image_id in proposals:
            raise DataError(f"{source}: keys for image id {image_id} appear twice (e.g. {key!r})")
        proposals[image_id] = _box_array(boxes, key, source)
    write_proposals(proposals, target)
    return len(proposals)
