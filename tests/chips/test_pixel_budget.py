"""The pixel budget of an epoch (lib/pixel_budget.py) on a hand-worked two-image roidb."""
import numpy as np

from lib.config import load_config
from lib.pixel_budget import epoch_pixel_budget


def test_epoch_pixel_budget_hand_worked():
    cfg = load_config(None, [("TRAIN.CHIP_STRIDE", "32"), ("TRAIN.USE_NEG_CHIPS", "false")])
    roidb = [
        # sqrt(area) 10: valid at the finest scale only -> one 512 x 512 chip at 3x.
        {"id": 1, "width": 640, "height": 480, "flipped": False,
         "boxes": np.array([[100, 100, 109, 109]], np.float32)},
        # sqrt(area) 200: coarsest scale only -> the whole image resized to 512 x 384.
        {"id": 2, "width": 640, "height": 480, "flipped": False,
         "boxes": np.array([[100, 100, 299, 299]], np.float32)},
    ]
    totals = epoch_pixel_budget(roidb, cfg, np.random.default_rng(0))
    assert totals["stride"] == 32
    assert totals["positive"].tolist() == [1, 0, 1] and totals["negative"].tolist() == [0, 0, 0]
    assert totals["chip_pixels"] == 2 * 512 * 512
    assert totals["content_pixels"] == 512 * 512 + 512 * 384
    # Baseline: 480 -> 800 (x 5/3), 640 -> 1067, for both images.
    assert totals["baseline_pixels"] == 2 * 800 * 1067
