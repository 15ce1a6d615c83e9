"""The training roidb (lib.dataset.roidb): images without boxes dropped, flipped copies appended, boxes
truncated to whole pixels before mirroring, the cache (reused, rebuilt on a content change, surviving
corruption) and proposals (attached, mirrored, pooled through NMS, bad files and boxes refused or counted).
"""
import logging
import os
import pickle

import numpy as np
import pytest

from dataset_helpers import GOOD, ann, by_id, dataset_cfg, image_record, npz_bytes, roidb_caches, \
    write_coco

from lib.boxes import flip_boxes
from lib.dataset import coco as coco_module
from lib.dataset import load_roidb
from lib.dataset.proposals import write_proposals


def test_training_roidb_drops_images_without_boxes_and_appends_flips(tmp_path, caplog):
    images = [image_record(i) for i in (1, 2, 3, 4)]
    write_coco(str(tmp_path / "data"), "train", images, [
        ann(1, 1, [10, 20, 30, 40]),
        ann(2, 1, [0, 0, 10, 10], iscrowd=1),
        ann(3, 2, [0, 0, 10, 10], iscrowd=1),  # image 2: only a crowd region
        ann(4, 3, [10, 10, 0, 5]),  # image 3: only a broken box; image 4: no annotation at all
    ])
    with caplog.at_level(logging.WARNING):
        roidb, dataset = load_roidb(dataset_cfg(tmp_path), "train")
    assert "dropped 3 of 4 training images without usable boxes (e.g. image ids 2, 3, 4)" in caplog.text
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False), (1, True)]
    assert "difficult" not in roidb[0]
    flipped = roidb[1]
    # width 100: x -> 99 - x, so (10, 20, 39, 59) -> (60, 20, 89, 59)
    np.testing.assert_array_equal(flipped["boxes"], [[60, 20, 89, 59]])
    np.testing.assert_array_equal(flipped["crowd_boxes"], [[90, 0, 99, 9]])
    np.testing.assert_array_equal(flipped["gt_classes"], roidb[0]["gt_classes"])
    assert flipped["image"] == roidb[0]["image"]

    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False)]


def test_flip_boxes_twice_is_identity_and_matches_mirrored_pixels():
    boxes = np.array([[0, 0, 0, 0], [3, 1, 7, 2], [0, 0, 9, 4]], np.float32)
    np.testing.assert_array_equal(flip_boxes(flip_boxes(boxes, 10), 10), boxes)
    mask = np.zeros((5, 10), bool)
    mask[1:3, 3:8] = True
    mirrored = mask[:, ::-1]
    x1, y1, x2, y2 = flip_boxes(boxes[1:2], 10)[0]
    cols = np.flatnonzero(mirrored.any(axis=0))
    assert (x1, x2) == (cols[0], cols[-1]) and (y1, y2) == (1, 2)


@pytest.mark.parametrize("integer", [True, False])
def test_training_boxes_are_truncated_to_whole_pixels_before_mirroring(tmp_path, integer):
    # [10.7, 5.2, w 20.2, h 15.3] -> inclusive (10.7, 5.2, 29.9, 19.5); the reference stores uint16:
    # (10, 5, 29, 19), mirrored in a 100 px image from those: (70, 5, 89, 19)
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10.7, 5.2, 20.2, 15.3])])
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.INTEGER_BOXES": integer}), "train")
    if integer:
        expected, mirrored = [[10, 5, 29, 19]], [[70, 5, 89, 19]]
    else:
        expected, mirrored = [[10.7, 5.2, 29.9, 19.5]], [[69.1, 5.2, 88.3, 19.5]]
    np.testing.assert_allclose(by_id(roidb)[1]["boxes"], expected, rtol=1e-6)
    np.testing.assert_allclose(by_id(roidb, flipped=True)[1]["boxes"], mirrored, rtol=1e-6)
    assert all(e["boxes"].dtype == np.float32 for e in roidb)
    test_roidb, _ = load_roidb(dataset_cfg(tmp_path), "train", training=False)  # evaluation keeps the annotation
    np.testing.assert_allclose(test_roidb[0]["boxes"], [[10.7, 5.2, 29.9, 19.5]], rtol=1e-6)


# ---------------------------------------------------------------- cache


def test_cache_is_reused_rebuilt_on_content_change_and_survives_corruption(tmp_path, monkeypatch, caplog):
    root = str(tmp_path / "data")
    write_coco(root, "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    cfg = dataset_cfg(tmp_path)
    first, _ = load_roidb(cfg, "train")
    cache_dir = tmp_path / "root" / "cache"
    assert sorted(os.listdir(cache_dir)) == [".roidb_cache_key", *roidb_caches(cache_dir)]  # no temporary leftovers
    assert len(roidb_caches(cache_dir)) == 1

    real_load = coco_module.CocoDataset.load_entries
    monkeypatch.setattr(coco_module.CocoDataset, "load_entries", lambda self: pytest.fail("cache not used"))
    cached, dataset = load_roidb(cfg, "train")
    np.testing.assert_array_equal(cached[0]["boxes"], first[0]["boxes"])
    assert dataset.classes == ["__background__", "two", "seven"]
    assert dataset.coco.getAnnIds() == [1]  # the COCO index comes back on demand
    monkeypatch.setattr(coco_module.CocoDataset, "load_entries", real_load)

    # same file name, same size, different content: a new roidb, never the stale one
    write_coco(root, "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 41])])
    changed, _ = load_roidb(cfg, "train")
    np.testing.assert_array_equal(changed[0]["boxes"], [[10, 20, 39, 60]])
    assert len(roidb_caches(cache_dir)) == 2

    # the option that changes the roidb is part of the key too
    load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert len(roidb_caches(cache_dir)) == 3

    newest = max((cache_dir / name for name in roidb_caches(cache_dir)), key=os.path.getmtime)
    newest.write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING):
        rebuilt, _ = load_roidb(dataset_cfg(tmp_path, **{"TRAIN.FLIP": "false"}), "train")
    assert "fails verification" in caplog.text
    np.testing.assert_array_equal(rebuilt[0]["boxes"], [[10, 20, 39, 60]])
    assert not [name for name in os.listdir(cache_dir) if name.startswith(".tmp")]


# ---------------------------------------------------------------- proposals


def test_proposals_attached_mirrored_and_missing_ids_counted(tmp_path, caplog):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])])
    proposals = {1: np.array([[5, 6, 20, 30, 0.9], [0, 0, 99, 79, 0.1]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train")
    assert "no proposals for 1 of 2 images (e.g. image ids 2)" in caplog.text
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], [[5, 6, 20, 30], [0, 0, 99, 79]])
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"], [[79, 6, 94, 30], [0, 0, 99, 79]])
    for flipped in (False, True):
        assert by_id(roidb, flipped)[2]["proposals"].shape == (0, 4)
    assert all(e["proposals"].dtype == np.float32 for e in roidb)

    test_roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train", training=False)
    assert "proposals" not in test_roidb[0]


@pytest.mark.parametrize("thresh", [0.7, 0.0])
def test_pooled_proposals_go_through_nms_before_mirroring(tmp_path, thresh):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    # (0, 0, 19, 19) vs (0, 0, 19, 21): IoU 400 / 440 = 0.91 > 0.7, the lower score goes; (0, 0, 19, 27):
    # IoU with the first 400 / 560 = 0.71 > 0.7 too; (50, 50, 69, 69) overlaps nothing
    proposals = {1: np.array([[0, 0, 19, 21, 0.5], [0, 0, 19, 19, 0.9], [50, 50, 69, 69, 0.1],
                              [0, 0, 19, 27, 0.3]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path, "dataset.PROPOSAL_NMS": thresh}),
                          "train")
    kept = [[0, 0, 19, 19], [50, 50, 69, 69]] if thresh else proposals[1][:, :4]
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], kept)
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"], flip_boxes(kept, 100))


@pytest.mark.parametrize("content, error, message", [
    (None, IOError, "cannot read proposal file"),
    (b"not an npz", ValueError, "not a readable proposal .npz"),
    (pickle.dumps({1: np.zeros((3, 5))}), ValueError, "is a pickle .* tools/convert_proposals.py"),
    (npz_bytes(**{**GOOD, "boxes": np.zeros((3, 2), np.float32)}), ValueError, r"boxes must be .* \(3, 2\)"),
    (npz_bytes(**{k: v for k, v in GOOD.items() if k != "offsets"}), ValueError, "lacks array.* offsets"),
    (npz_bytes(**{**GOOD, "offsets": np.array([0, 2])}), ValueError, "offsets must rise from 0 to 1"),
    (npz_bytes(**{**GOOD, "image_ids": np.array([1, 1]), "offsets": np.array([0, 1, 1])}), ValueError,
     "not distinct"),
    (npz_bytes(**{**GOOD, "image_ids": np.array([[1]], dtype=object)}), ValueError, "Object arrays cannot"),
])
def test_bad_proposal_files_are_errors_naming_them(tmp_path, content, error, message):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    path = tmp_path / "proposals.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(error, match=message) as info:
        load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path}), "train")
    assert "proposals.npz" in str(info.value)


def test_unusable_proposals_are_dropped_counted_by_reason_and_warned_once(tmp_path, caplog):
    write_coco(str(tmp_path / "data"), "train", [image_record(1), image_record(2)],
               [ann(1, 1, [10, 20, 30, 40]), ann(2, 2, [0, 0, 10, 10])])  # images 100 x 80 (w x h)
    inside = [[5, 6, 20, 30, 0.9], [99, 79, 120, 100, 0.5], [-10, -10, 0, 0, 0.5], [98.5, 0, 99.9, 5, 0.3],
              [7, 7, 7, 7, 0.2]]  # the last one pixel: inclusive boxes
    outside = [[99.5, 0, 130, 10, 0.8], [0, 79.5, 10, 90, 0.8], [-20, 5, -0.5, 10, 0.7], [5, -9, 9, -1, 0.7],
               [150, 150, 200, 200, 0.6], [np.nan, 0, 5, 5, 0.5], [20, 5, 10, 15, 0.5], [5, 20, 15, 19.5, 0.4]]
    proposals = {1: np.array(inside[:2] + outside + inside[2:], np.float32),
                 2: np.array([inside[0], [300, 10, 320, 20, 0.4]], np.float32)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": path, "dataset.PROPOSAL_NMS": 0}),
                              "train")
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], np.array(inside, np.float32)[:, :4])
    np.testing.assert_array_equal(by_id(roidb, flipped=True)[1]["proposals"],
                                  flip_boxes(np.array(inside)[:, :4], 100))
    np.testing.assert_array_equal(by_id(roidb)[2]["proposals"], [inside[0][:4]])
    warnings = [r.getMessage() for r in caplog.records if "proposal file" in r.getMessage()]
    assert len(warnings) == 1  # once for the file, the flipped copies not counted again
    assert "dropped 9 proposals (1 not finite, 2 inverted or empty, 6 outside their image)" in warnings[0]
    assert "in 2 images" in warnings[0] and "image id 1: 8" in warnings[0] and "image id 2: 1" in warnings[0]


def test_an_inverted_proposal_is_a_counted_skip_not_a_stop_of_mining(tmp_path):
    from chip_generator.mining import MiningParams, mine_image_chips

    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    proposals = {1: np.array([[40, 10, 20, 30, 0.9], [50, 40, 70, 60, 0.8]], np.float32)}  # the first: x2 < x1
    write_proposals(proposals, str(tmp_path / "proposals.npz"))
    cfg = dataset_cfg(tmp_path, **{"dataset.proposal": tmp_path / "proposals.npz", "dataset.PROPOSAL_NMS": 0,
                                   "TRAIN.USE_NEG_CHIPS": True})
    roidb, _ = load_roidb(cfg, "train")
    np.testing.assert_array_equal(by_id(roidb)[1]["proposals"], [[50, 40, 70, 60]])
    mine_image_chips(by_id(roidb)[1], MiningParams.from_config(cfg), 32, np.random.default_rng(0))  # no error


def test_proposal_file_is_not_read_without_negative_chips(tmp_path):
    write_coco(str(tmp_path / "data"), "train", [image_record(1)], [ann(1, 1, [10, 20, 30, 40])])
    missing = tmp_path / "never_written.pkl"
    roidb, _ = load_roidb(dataset_cfg(tmp_path, **{"dataset.proposal": missing, "TRAIN.USE_NEG_CHIPS": False}),
                          "train")
    assert roidb and all("proposals" not in entry for entry in roidb)
