"""Per-scale detection caches (TEST.USE_CACHE): merge again without the network.

The reference's test driver stores each scale's detections (and, for AutoFocus, the FocusPixel maps) in
its results folder and, with ``TEST.USE_CACHE[scale]``, reads them back instead of running that scale, so
that the aggregation (valid ranges, soft-NMS, the per-image cap) can be redone with other settings. Here a
test with ``TEST.USE_CACHE`` writes ``{results}/scale_cache/scale{n}.npz`` for every test scale it runs and
reads back every scale whose cache is valid: made by the same checkpoint (its bytes' SHA-256), for the same
test images (ids, files, sizes) and with the same settings before the cache (the whole config except the
merge's keys, ``MERGE_KEYS``, and keys that do not change detections, ``OPERATIONAL_KEYS``; per scale its
entry of the per-scale lists and, for AutoFocus, the regions it processed). A cache of another model,
config or scale set is never used: the scale runs again and its cache is replaced.

A scale's cache holds its Candidates (lib.inference.merge: detections above ``TEST.SCORE_THRESH``, before
the valid range) per unit, a unit being an image (whole-image and tiled test) or a processed region
(AutoFocus, with its FocusPixel map and the map's scale, from which the next scale's FocusChips are made
again), and the images that could not be read. The file is an ``.npz`` read with ``allow_pickle=False``::

    version ()          int64, CACHE_VERSION
    fingerprint ()      str, SHA-256 hex of what made it (above)
    units (U,)          int64, the image (index in the test set) of each unit
    offsets (U+1,)      int64, unit u owns rows offsets[u]:offsets[u+1] of:
    boxes (T, 4)        float64, original pixels
    scores (T,)         float32
    labels (T,)         int32
    map_offsets (U+1,), map_shapes (U, 2) int64, maps (M,) float32, map_scales (U,) float64   (AutoFocus)
    unreadable (K,)     int64 images, messages (K,) str: why each could not be read
"""
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from lib.atomic import atomic_path
from lib.config.core import plain
from lib.inference.merge import Candidates, concat_candidates

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
FOLDER = "scale_cache"
# applied after the cache: what a second run may change without the network
MERGE_KEYS = ("TEST.VALID_RANGES", "TEST.NMS", "TEST.SOFT_NMS", "TEST.SOFT_NMS_SIGMA", "TEST.MAX_PER_IMAGE")
# how the run is carried out or scored, not what the network detects (the checkpoint is hashed instead of named)
OPERATIONAL_KEYS = ("TEST.USE_CACHE", "TEST.NUM_PROCESS", "TEST.LOADER_TIMEOUT", "TEST.STALL_WARN",
                    "TEST.EVAL_MAX_DETS", "TEST.SIZE_BANDS", "TEST.MODEL", "TEST.TEST_EPOCH", "output_path", "name")
# one entry per scale: each scale's cache is keyed by its own (AutoFocus's pruning keys by its regions)
PER_SCALE_KEYS = ("TEST.SCALES", "TEST.BATCH_IMAGES", "TEST.DO_PRUNING", "TEST.CHIP_HYPERPARAMS")


@dataclass
class LevelResult:
    """What one test scale found: Candidates per unit (an image, or an AutoFocus region) in unit order,
    AutoFocus's FocusPixel map and its scale per unit, and the images that could not be read."""

    units: list = field(default_factory=list)
    candidates: list = field(default_factory=list)
    maps: list = field(default_factory=list)
    map_scales: list = field(default_factory=list)
    unreadable: dict = field(default_factory=dict)

    def add(self, image, candidates, focus_map=None, map_scale=None):
        self.units.append(image)
        self.candidates.append(candidates)
        if focus_map is not None:
            self.maps.append(np.asarray(focus_map, np.float32))
            self.map_scales.append(float(map_scale))

    def by_image(self):
        """{image: its units' Candidates concatenated in unit order}."""
        parts = {}
        for image, candidates in zip(self.units, self.candidates):
            parts.setdefault(image, []).append(candidates)
        return {image: concat_candidates(found) for image, found in parts.items()}


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def settings_before_the_cache(cfg):
    """The config as plain values without the merge's, the operational and the per-scale keys."""
    values = plain(cfg)
    for key in MERGE_KEYS + OPERATIONAL_KEYS + PER_SCALE_KEYS:
        *sections, name = key.split(".")
        node = values
        for section in sections:
            node = node[section]
        node.pop(name, None)
    return values


class ScaleCache:
    """The scale caches of one test: ``load(number, regions=None) -> LevelResult or None`` (None: absent or
    made by something else), ``save(number, result, regions=None)``; ``regions`` are the AutoFocus regions
    a scale processed (lib.inference.regions), part of its key. ``read`` / ``written`` list the scales."""

    def __init__(self, folder, fingerprint, level_keys):
        self.folder, self.fingerprint, self.level_keys = folder, fingerprint, level_keys
        self.read, self.written = [], []

    @classmethod
    def for_test(cls, detector, roidb, out_dir):
        """The caches of testing ``roidb`` with ``detector`` under ``out_dir``, or None (with a warning) when
        the detector's parameters are not a checkpoint file whose bytes can key them."""
        source = detector.source
        if not (isinstance(source, str) and os.path.isfile(source)):
            logger.warning("TEST.USE_CACHE: the network's parameters (%s) are not a checkpoint file: the scales "
                           "are neither read from nor written to a cache", source)
            return None
        cfg, test = detector.cfg, detector.cfg.TEST
        images = [(int(e["id"]), e["image"], int(e["height"]), int(e["width"])) for e in roidb]
        fingerprint = {"version": CACHE_VERSION, "checkpoint": file_sha256(source), "classes": detector.classes,
                       "images": _digest(images), "config": settings_before_the_cache(cfg),
                       "contexts": [str(context) for context in detector.contexts]}
        level_keys = [{"scale": scale, "images_per_batch": count}
                      for scale, count in zip(test.SCALES, detector.planner.batch_counts(detector.levels))]
        return cls(os.path.join(out_dir, FOLDER), fingerprint, level_keys)

    def path(self, number):
        return os.path.join(self.folder, f"scale{number}.npz")

    def key(self, number, regions=None):
        key = {"run": self.fingerprint, "scale": self.level_keys[number]}
        if regions is not None:
            key["regions"] = _digest([(r.image, r.box, r.shrink, r.core) for r in regions])
        return _digest(key)

    def load(self, number, regions=None):
        path = self.path(number)
        if not os.path.isfile(path):
            return None
        try:
            with np.load(path, allow_pickle=False) as npz:
                stored = {name: npz[name] for name in npz.files}
            if int(stored["version"]) != CACHE_VERSION or str(stored["fingerprint"]) != self.key(number, regions):
                logger.info("TEST.USE_CACHE: %s was made by another checkpoint, config, image set or scale: "
                            "scale %d runs again", path, number)
                return None
            result = _unpack(stored)
        except (OSError, ValueError, KeyError) as err:
            logger.warning("TEST.USE_CACHE: %s cannot be read (%s): scale %d runs again", path, err, number)
            return None
        logger.warning("TEST.USE_CACHE: the detections of scale %d (%s) come from %s, not from the network",
                       number, self.level_keys[number]["scale"], path)
        self.read.append(number)
        return result

    def save(self, number, result, regions=None):
        path = self.path(number)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **_pack(result), version=np.int64(CACHE_VERSION),
                         fingerprint=np.array(self.key(number, regions)))
        logger.info("TEST.USE_CACHE: saved the detections of scale %d to %s", number, path)
        self.written.append(number)


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _pack(result):
    everything = concat_candidates(result.candidates)
    arrays = {"units": np.asarray(result.units, np.int64),
              "offsets": _offsets([len(c.scores) for c in result.candidates]),
              "boxes": np.asarray(everything.boxes, np.float64).reshape(-1, 4),
              "scores": everything.scores.astype(np.float32), "labels": everything.labels.astype(np.int32),
              "unreadable": np.asarray(sorted(result.unreadable), np.int64),
              "messages": np.array([result.unreadable[i] for i in sorted(result.unreadable)], dtype=str)}
    if result.maps:
        arrays.update(map_offsets=_offsets([m.size for m in result.maps]),
                      map_shapes=np.array([m.shape for m in result.maps], np.int64).reshape(-1, 2),
                      maps=np.concatenate([m.ravel() for m in result.maps]).astype(np.float32),
                      map_scales=np.asarray(result.map_scales, np.float64))
    return arrays


def _unpack(stored):
    units, offsets = stored["units"], stored["offsets"]
    if len(offsets) != len(units) + 1 or offsets[-1] != len(stored["scores"]):
        raise ValueError("its offsets do not match its detections")
    result = LevelResult(unreadable={int(i): str(m) for i, m in zip(stored["unreadable"], stored["messages"])})
    for unit, image in enumerate(units):
        rows = slice(offsets[unit], offsets[unit + 1])
        focus_map = map_scale = None
        if "maps" in stored:
            start, stop = stored["map_offsets"][unit:unit + 2]
            focus_map = stored["maps"][start:stop].reshape(stored["map_shapes"][unit])
            map_scale = stored["map_scales"][unit]
        result.add(int(image), Candidates(stored["boxes"][rows], stored["scores"][rows], stored["labels"][rows]),
                   focus_map, map_scale)
    return result


def cached_levels(fresh_levels, count, source, num_workers=0, cache=None):
    """Yield ``(index, [Candidates per test scale] or IOError)`` per image of ``source`` for the whole-image
    or tiled test of ``count`` scales: the scales ``cache`` (a ScaleCache, or None) holds are read back, the
    others run in one pipeline, ``fresh_levels(source, numbers, num_workers)`` (a run strategy's,
    lib.inference.whole_images), and are cached. Images come once every scale is there, in set order."""
    levels = {number: cache.load(number) for number in range(count)} if cache is not None else {}
    missing = [number for number in range(count) if levels.get(number) is None]
    if missing:
        fresh = {number: LevelResult() for number in missing}
        for index, found in sorted(fresh_levels(source, missing, num_workers), key=lambda item: item[0]):
            for position, number in enumerate(missing):
                if isinstance(found, Exception):
                    fresh[number].unreadable[index] = str(found)
                else:
                    fresh[number].add(index, found[position])
        for number in missing:
            if cache is not None:
                cache.save(number, fresh[number])
        levels.update(fresh)
    unreadable = {index: message for number in range(count) for index, message in levels[number].unreadable.items()}
    per_level = [levels[number].by_image() for number in range(count)]
    for index in range(len(source.sizes())):
        if index in unreadable:
            yield index, IOError(unreadable[index])
        else:
            yield index, [found.get(index, concat_candidates([])) for found in per_level]
