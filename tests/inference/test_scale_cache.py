"""Per-scale detection caches (TEST.USE_CACHE, lib.inference.scale_cache) and main_test.py --vis: a second test
merges the cached scales without the network, a merge setting changes only the merge, a cache of another
checkpoint or setting is not used; AutoFocus caches its levels with their FocusPixel maps."""
import json
import os

import cv2
import numpy as np
import pytest

from detector_helpers import BLOB_IMAGES as LARGE_IMAGES, IMAGES, OracleDetector, stand_in_detector
from focus_helpers import IMAGE, TWO_LEVELS, focus_detector, two_level_oracle

from lib.config import with_overrides
from lib.dataset import load_roidb
from lib.dataset.image_io import read_roidb_image
from lib.inference import tester
from lib.inference.merge import scale_candidates, suppress
from lib.inference.scale_cache import ScaleCache
from lib.inference.streaming import ArrayImages


class Oracle(OracleDetector):
    """The oracle network, its parameters a checkpoint file (the cache's key); ``blind`` ones fail if run."""

    def __init__(self, cfg, model, blind=False):
        super().__init__(cfg)
        self.source = str(model)
        if blind:
            self.network.forward = Blind()


def model_file(tmp_path, content=b"the weights", name="model-0007.params"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def results(summary):
    with open(summary["results"]) as f:
        return json.load(f)


def cached(tiny_cfg, **overrides):
    return with_overrides(tiny_cfg, {"TEST.SOFT_NMS": False, "TEST.USE_CACHE": True, **overrides})


def test_a_second_test_merges_the_cached_scales_and_a_merge_setting_changes_only_the_merge(tiny, tmp_path):
    cfg, model, out = cached(tiny[0]), model_file(tmp_path), str(tmp_path / "results")
    first = tester.test(cfg, detector=Oracle(cfg, model), out_dir=out)
    found = results(first)  # before the next tests write theirs in its place
    assert (first["scale_cache"]["read"], first["scale_cache"]["written"]) == ([], [0, 1, 2])
    assert sorted(os.listdir(os.path.join(out, "scale_cache"))) == ["scale0.npz", "scale1.npz", "scale2.npz"]
    plain = with_overrides(cfg, {"TEST.USE_CACHE": False, "TEST.NUM_PROCESS": 0})
    expected = tester.test(plain, detector=OracleDetector(plain), out_dir=str(tmp_path / "plain"))
    assert "scale_cache" not in expected and found == results(expected)  # the pipeline's own merge

    second = tester.test(cfg, detector=Oracle(cfg, model, blind=True), out_dir=out)
    assert (second["scale_cache"]["read"], second["scale_cache"]["written"]) == ([0, 1, 2], [])
    assert results(second) == found
    assert (second["tested"], second["skipped"]) == (3, 1)  # the unreadable image, as when the cache was made
    assert second["skipped_images"][0].endswith("broken.jpg")

    merge = {"TEST.MAX_PER_IMAGE": 1, "TEST.VALID_RANGES": [[-1, 25], [-1, 25], [-1, 25]]}
    third = tester.test(cached(tiny[0], **merge), detector=Oracle(cached(tiny[0], **merge), model, blind=True),
                        out_dir=out)
    assert third["scale_cache"]["read"] == [0, 1, 2]
    plain = with_overrides(plain, merge)
    expected = tester.test(plain, detector=OracleDetector(plain), out_dir=str(tmp_path / "plain_merge"))
    assert results(third) == results(expected) != found
    assert 0 < len(results(third)) < len(found)


def test_a_cache_of_another_checkpoint_or_setting_is_not_used(tiny, tmp_path):
    cfg, model, out = cached(tiny[0], **{"TEST.NUM_PROCESS": 0}), model_file(tmp_path), str(tmp_path / "results")
    tester.test(cfg, detector=Oracle(cfg, model), out_dir=out)
    other_model = model_file(tmp_path, b"retrained", "model-0008.params")
    for changed, checkpoint in [(cfg, other_model), (with_overrides(cfg, {"TEST.SCORE_THRESH": 0.01}), model),
                                (with_overrides(cfg, {"TEST.RPN_POST_NMS_TOP_N": 40}), model)]:
        with pytest.raises(AssertionError, match="the network ran"):
            tester.test(changed, detector=Oracle(changed, checkpoint, blind=True), out_dir=out)
    # a new finest scale: the other two come from their caches, the new one runs and replaces its cache
    rescaled = with_overrides(cfg, {"TEST.SCALES": [[120, 160], [64, 96], [32, 48]]})
    detector = Oracle(rescaled, model)
    summary = tester.test(rescaled, detector=detector, out_dir=out)
    assert (summary["scale_cache"]["read"], summary["scale_cache"]["written"]) == ([1, 2], [0])
    roidb, _ = load_roidb(rescaled, rescaled.dataset.test_image_set, training=False)
    readable = [(int(e["height"]), int(e["width"])) for e in roidb if not e["image"].endswith("broken.jpg")]
    assert len(detector.canvases) == len(detector.planner.plan(readable, detector.levels[:1]))  # scale 0 alone ran
    plain = with_overrides(rescaled, {"TEST.USE_CACHE": False})
    assert results(summary) == results(tester.test(plain, detector=OracleDetector(plain),
                                                   out_dir=str(tmp_path / "plain")))


def test_vis_draws_each_scale_and_the_final_detections_of_every_image(tiny, tmp_path):
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0})
    detector, out = OracleDetector(cfg), str(tmp_path / "results")
    summary = tester.test(cfg, detector=detector, out_dir=out, vis=True, vis_thresh=0.5)
    ids = [image_id for name, image_id, *_ in IMAGES["val"] if name != "broken.jpg"]
    folders = ["final", "scale0", "scale1", "scale2"]
    assert sorted(os.listdir(os.path.join(out, "vis"))) == folders
    for folder in folders:
        assert sorted(os.listdir(os.path.join(out, "vis", folder))) == sorted(f"{i}.jpg" for i in ids)
    roidb, _ = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    entry = next(e for e in roidb if e["id"] == ids[1])
    image = read_roidb_image(entry)
    final = detector.detect([image])[0]
    assert len(final) == len(IMAGES["val"][1][4]) and summary["tested"] == 3

    def written(folder):
        with open(os.path.join(out, "vis", folder, f"{entry['id']}.jpg"), "rb") as f:
            return f.read()

    def encoded(picture):
        return cv2.imencode(".jpg", picture)[1].tobytes()

    assert written("final") == encoded(detector.draw(image, final, 0.5)) != encoded(image)
    for number, (boxes, scores) in enumerate(detector.scale_results([image])[0]):
        # each scale's detections suppressed and capped, whatever its valid range (the reference's intermediate
        # pictures): every scale shows both objects
        rows = suppress(scale_candidates(boxes, scores, (-1, -1), cfg.TEST.SCORE_THRESH), cfg.TEST)
        assert len(rows) == 2
        assert written(f"scale{number}") == encoded(detector.draw(image, rows, 0.5))


class Blind:
    def __call__(self, data, im_info):
        raise AssertionError("the network ran")


def test_tiled_levels_merge_as_the_tiled_test_and_come_back_from_their_caches(tmp_path):
    detector = stand_in_detector(SCALES=[2.0, 1.0], VALID_RANGES=[[-1, 40], [30, -1]], TILE=[300, 160])
    expected = dict(detector.run(ArrayImages(LARGE_IMAGES)))

    def levels():
        cache = ScaleCache(str(tmp_path), {"run": "the same"}, [{"scale": 2.0}, {"scale": 1.0}])
        return cache, dict(detector.run_levels(ArrayImages(LARGE_IMAGES), cache=cache))

    first, found = levels()
    assert first.written == [0, 1] and all(len(rows) for rows in expected.values())
    for index, rows in expected.items():  # the same tiles on the same canvases: the same rows
        np.testing.assert_array_equal(detector.merge_levels(found[index]), rows)
    detector.network.forward = Blind()
    again, found = levels()
    assert again.read == [0, 1]
    for index, rows in expected.items():
        np.testing.assert_array_equal(detector.merge_levels(found[index]), rows)


def autofocus_run(detector, cache):
    return dict(detector.strategy.focus(ArrayImages([IMAGE]), cache=cache))[0]


def test_autofocus_levels_come_from_their_caches_and_a_pruned_level_is_keyed_by_its_regions(tmp_path):
    def cache():
        return ScaleCache(str(tmp_path), {"run": "the same"}, [{"scale": 1.0}, {"scale": 2.0}])

    first = cache()
    dets = autofocus_run(focus_detector(two_level_oracle(), pruning=[False, True], **TWO_LEVELS), first)
    assert len(dets) == 2 and first.written == [0, 1]
    again = cache()
    np.testing.assert_array_equal(autofocus_run(focus_detector(Blind(), pruning=[False, True], **TWO_LEVELS), again),
                                  dets)
    assert again.read == [0, 1]  # the FocusChips of level 1 made again from level 0's cached FocusPixel map
    # wider chips (dilation 2): level 0 from its cache, level 1 processes other regions and runs
    oracle, wider = two_level_oracle(), dict(TWO_LEVELS, chip_params=[[2, 0.5, 4], [-1, -1, -1]])
    third = cache()
    autofocus_run(focus_detector(oracle, pruning=[False, True], **wider), third)
    assert (third.read, third.written) == ([0], [1])
    assert len(oracle.calls) == 1 and oracle.calls[0][0].shape != (1, 3, 160, 200)
