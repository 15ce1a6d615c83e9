"""Images without objects (TRAIN.EMPTY_IMAGES): dropped from the training roidb by default, kept for negative
chips, whose targets are then background only."""
import logging

import cv2
import numpy as np

from chip_generator.mining import MiningParams, mine_image_chips, sample_epoch_chips
from lib.config import load_config
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import BatchRing
from lib.data.chip_worker import ChipWorker, batch_fields
from lib.data.epoch_plan import ChipRef
from lib.dataset import load_roidb
from lib.dataset.proposals import write_proposals
from dataset_helpers import ann, by_id, dataset_cfg, image_record, write_coco


def empty_image_set(tmp_path):
    """Image 1 with a box, image 2 without any: and a proposal file covering both."""
    write_coco(str(tmp_path / "data"), "train", [image_record(1, 200, 160), image_record(2, 200, 160)],
               [ann(1, 1, [10, 20, 30, 40])])
    proposals = {image_id: np.array([[x, y, x + 19, y + 19, 0.5] for x in range(0, 180, 30) for y in range(0, 140, 30)],
                                    np.float32) for image_id in (1, 2)}
    path = tmp_path / "proposals.npz"
    write_proposals(proposals, str(path))
    return str(path)


def test_empty_images_dropped_by_default_kept_for_negative_chips(tmp_path, caplog):
    proposals = empty_image_set(tmp_path)
    on = {"dataset.proposal": proposals, "TRAIN.USE_NEG_CHIPS": "true", "dataset.PROPOSAL_NMS": "0"}
    with caplog.at_level(logging.WARNING):
        roidb, _ = load_roidb(dataset_cfg(tmp_path, **on), "train")
    assert "dropped 1 of 2 training images without usable boxes" in caplog.text
    assert sorted(by_id(roidb)) == [1]

    roidb, _ = load_roidb(dataset_cfg(tmp_path, **on, **{"TRAIN.EMPTY_IMAGES": "negative"}), "train")
    assert [(e["id"], e["flipped"]) for e in roidb] == [(1, False), (2, False), (1, True), (2, True)]
    empty = by_id(roidb)[2]
    assert empty["boxes"].shape == (0, 4) and empty["gt_classes"].shape == (0,)
    assert empty["proposals"].shape == (30, 4)  # 6 columns x 5 rows


def test_empty_images_still_dropped_without_negative_chips(tmp_path, caplog):
    proposals = empty_image_set(tmp_path)
    for off in ({"TRAIN.USE_NEG_CHIPS": "false", "dataset.proposal": proposals}, {"dataset.proposal": ""}):
        with caplog.at_level(logging.INFO):
            roidb, _ = load_roidb(dataset_cfg(tmp_path, **off, **{"TRAIN.EMPTY_IMAGES": "negative"}), "train")
        assert sorted(by_id(roidb)) == [1]
        assert "negative chips are off" in caplog.text


def test_an_empty_image_gives_negative_chips_only_whose_targets_are_background(tmp_path):
    # 30 proposals of 20 px (valid at the finest scale, [-1, 80]) tile a 200 x 160 image; at scale 3 the
    # image is 600 x 480 px, so a few 512 px negative chips cover them, each counting more than 5.
    cfg = load_config(None, [("TRAIN.NEG_CHIP_MIN_PROPOSALS", "[5, 5, 5]"), ("TRAIN.RPN_BATCH_SIZE", "256")])
    params = MiningParams.from_config(cfg)
    proposals = np.array([[x, y, x + 19, y + 19] for x in range(0, 180, 30) for y in range(0, 140, 30)], np.float32)
    entry = {"id": 2, "image": str(tmp_path / "empty.jpg"), "height": 160, "width": 200, "flipped": False,
             "boxes": np.zeros((0, 4), np.float32), "gt_classes": np.zeros(0, np.int32), "proposals": proposals}
    chips = mine_image_chips(entry, params, 56, np.random.default_rng(0))
    assert all(len(scale.pos_chips) == 0 for scale in chips.scales)
    assert len(chips.scales[0].neg_chips) >= 1
    sampled = sample_epoch_chips(chips, np.random.default_rng(0), params.max_neg_chips)
    assert sampled and all(negative and len(valid) == 0 for _, _, negative, valid in sampled)

    cv2.imwrite(entry["image"], np.full((160, 200, 3), 128, np.uint8))
    targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
    ring = BatchRing(batch_fields(cfg, targeter, rpn_only=False), batch_size=1, num_slots=1, shared=False)
    worker = ChipWorker([entry], cfg, ring, rpn_only=False)
    level, box, _, valid = sampled[0]
    ref = ChipRef(0, level, chips.scales[level].im_scale, tuple(float(v) for v in box), tuple(valid), True)
    assert worker.make_chip(0, 0, "test", ref, 0)[0] == "chip"
    arrays = {name: array[0] for name, array in ring.slot(0).items()}
    assert not (arrays["label"] == 1).any() and (arrays["label"] == 0).sum() == 256  # background only
    assert (arrays["gt_boxes"] == -1).all() and not arrays["bbox_weight"].any()  # -1: padding rows
