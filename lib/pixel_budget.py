"""Pixels SNIPER processes in one epoch, against single-scale 800 x 1333 training of the same images
(spec section 9: the paper's "about 30% more pixels" on COCO); tools/pixel_budget.py prints it and
tools/ablation_synthetic.py reports it per variant.

One epoch as the training iterator samples it: the stride drawn once, every image's chips mined,
all positive chips plus at most TRAIN.MAX_NEG_CHIPS negative ones (when negative chips are on and
the roidb has proposals). Every chip costs CHIP_SIZE x CHIP_SIZE pixels, the padded network input;
the chip content (smaller at the coarsest scale) is counted too. The baseline resizes every image of
the same roidb to shorter side 800, longer side at most 1333.
"""
import numpy as np
from tqdm import tqdm

from chip_generator.mining import draw_epoch_stride, mine_image_chips, sample_epoch_chips
from lib.config import parsed
from lib.scales import parse_scales

BASELINE_SCALE = [800, 1333]  # (shorter side, longer side cap) of the single-scale baseline


def epoch_pixel_budget(roidb, cfg, rng, on_image=None):
    """Dict of epoch totals: images, chips per scale (positive, negative), padded and content chip
    pixels, and the baseline's pixels. ``on_image(entry, image_chips)`` sees every image's mined chips
    (lib/scales_fit.py measures box coverage from the same mining)."""
    baseline = parse_scales([BASELINE_SCALE], "baseline")[0]
    params = parsed(cfg).mining
    num_scales = len(params.levels)
    stride = draw_epoch_stride(params, rng)
    totals = {"images": len(roidb), "stride": stride, "positive": np.zeros(num_scales, np.int64),
              "negative": np.zeros(num_scales, np.int64), "chip_pixels": 0, "content_pixels": 0,
              "baseline_pixels": 0}
    for entry in tqdm(roidb, desc="mining chips", leave=False):
        chips = mine_image_chips(entry, params, stride, rng)
        if on_image is not None:
            on_image(entry, chips)
        sampled = sample_epoch_chips(chips, rng, params.max_neg_chips)
        for level, chip, negative, _ in sampled:
            totals["negative" if negative else "positive"][level] += 1
            size = params.chip_size  # a window 1 px larger than a chip is cut to it
            totals["content_pixels"] += int(min(chip[2] - chip[0] + 1, size) * min(chip[3] - chip[1] + 1, size))
        totals["chip_pixels"] += len(sampled) * params.chip_size ** 2
        scale = baseline.image_scale(entry["height"], entry["width"])
        totals["baseline_pixels"] += int(round(entry["height"] * scale)) * int(round(entry["width"] * scale))
    return totals
