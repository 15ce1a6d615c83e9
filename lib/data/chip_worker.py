"""What a data-loader worker does with a task: build one chip into a batch slot, or mine images.

The same ChipWorker runs inside worker processes and, with NUM_PROCESS = 0, in the main process.
Every random choice of a chip comes from a generator seeded by the task (epoch seed + position), so
results do not depend on which worker runs it.
"""
import time

import numpy as np

from lib.config import parsed
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.batch_ring import Field
from lib.data.chip_boxes import chip_valid_range, pack_gt_boxes, select_chip_boxes
from lib.data.chip_image import render_chip
from lib.data.chip_masks import MAX_POLYGON_LEN, chip_gt_masks
from lib.data.epoch_plan import mine_images
from lib.data.focus_labels import FocusLabelParams, focus_labels
from lib.data.image_cache import DecodedImageCache
from lib.dataset.image_io import read_roidb_image
from lib.dataset.large_images import open_windowed
from lib.dataset.polygons import select_polygons
from lib.scales import scaled_image_size


def batch_fields(cfg, targeter, rpn_only):
    """The arrays of a batch, per chip, in the order given to the network (data first, then labels)."""
    size, max_gt = int(cfg.TRAIN.CHIP_SIZE), int(cfg.TRAIN.MAX_GT_PER_CHIP)
    fields = [Field("data", (3, size, size))]
    if not rpn_only:  # the RPN-only graph needs neither the chip's range nor its size
        fields += [Field("valid_ranges", (2,)), Field("im_info", (3,))]
    fields += [
        Field("label", targeter.label_shape, is_label=True),
        Field("bbox_target", targeter.target_shape, is_label=True),
        Field("bbox_weight", targeter.target_shape, is_label=True),
    ]
    if not rpn_only:
        fields.append(Field("gt_boxes", (max_gt, 5), is_label=True))
    focus = focus_params(cfg, rpn_only)
    if focus is not None:  # AutoFocus: the FocusPixel labels of the chip's feature cells, row-major
        fields.append(Field("scale_label", (focus.map_size ** 2,), is_label=True))
    if with_masks(cfg, rpn_only):  # the polygons of the gt_boxes rows (lib.data.chip_masks)
        fields.append(Field("gt_masks", (max_gt, MAX_POLYGON_LEN), is_label=True))
    return fields


def with_masks(cfg, rpn_only):
    """Whether batches carry ``gt_masks`` (TRAIN.WITH_MASK; the RPN-only graph has no mask branch)."""
    return bool(cfg.TRAIN.WITH_MASK) and not rpn_only


def focus_params(cfg, rpn_only):
    """The FocusPixel label parameters when the training graph has the AutoFocus branch, else None (the
    RPN-only graph has none)."""
    return FocusLabelParams.from_config(cfg) if cfg.network.AUTO_FOCUS and not rpn_only else None


class ChipWorker:
    """Callable on tasks; returns small messages (the arrays go straight into the ring)."""

    def __init__(self, roidb, cfg, ring, rpn_only):
        self.roidb = roidb
        self.ring = ring
        self.rpn_only = rpn_only
        self.mining = parsed(cfg).mining  # the training pyramid and chip settings, as parsed at load
        self.targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
        # the config's doubles, as the reference subtracts them (lib.data.pixels rounds once, to float32)
        self.pixel_means = tuple(float(mean) for mean in cfg.network.PIXEL_MEANS)
        self.channel_order = cfg.network.CHANNEL_ORDER
        self.crop = cfg.TRAIN.CHIP_CROP
        self.min_gt_size = float(cfg.TRAIN.RPN_MIN_GT_SIZE)
        self.round_gt = bool(cfg.TRAIN.RPN_ROUND_GT)
        self.border_of_content = cfg.TRAIN.RPN_ANCHOR_BORDER == "content"
        # filled only in the process that builds chips (a forked worker starts with the parent's empty one)
        self.images = DecodedImageCache(int(cfg.TRAIN.IMAGE_CACHE_MB * (1 << 20)))
        self.focus = focus_params(cfg, rpn_only)
        self.with_masks = with_masks(cfg, rpn_only)

    def __call__(self, task):
        if task[0] == "chip":
            return self.make_chip(*task[1:])
        if task[0] == "mine":
            return ("mined", task[1], mine_images(self.roidb, self.mining, *task[2:]))
        raise ValueError(f"unknown data loader task {task[0]!r}")

    def describe(self, task):
        """What a task is about, for the message of a stalled worker."""
        if task[0] == "chip":
            return f"building a chip of image {self.roidb[task[4].image_index]['image']}"
        indices = task[5]
        return f"mining the chips of roidb entries {indices[0]}..{indices[-1]}"

    def make_chip(self, slot, position, tag, chip, seed):
        """Build ``chip`` (a ChipRef) into ``slot`` at ``position``; ``tag`` is echoed back."""
        entry = self.roidb[chip.image_index]
        start = time.perf_counter()
        try:
            image, decoded_now = open_windowed(entry), False  # a large image: the chip's window only
            if image is None:
                image, decoded_now = self.images.get(entry["image"], lambda _: read_roidb_image(entry))
            decoded = time.perf_counter()
            # a large image's pixels are decoded here, where a file cut short shows
            arrays = self.ring.slot(slot)
            content = render_chip(image, chip.box, chip.im_scale, entry["flipped"], self.pixel_means,
                                  self.channel_order, self.crop, arrays["data"][position])
        except IOError as err:
            return ("bad_image", tag, position, entry["image"], str(err))
        rendered = time.perf_counter()

        rows, boxes, classes, valid = self.select_boxes(entry, chip)
        size = self.mining.chip_size
        border_of = content if self.border_of_content else (size, size)  # TRAIN.RPN_ANCHOR_BORDER
        rng = np.random.default_rng(seed)
        self.targeter(boxes[valid], boxes[~valid], *border_of, rng,
                      out=(arrays["label"][position], arrays["bbox_target"][position],
                           arrays["bbox_weight"][position]))
        dropped = 0
        if not self.rpn_only:
            arrays["im_info"][position] = (*self.input_extent(entry, chip), chip.im_scale)
            valid_range = self.mining.levels[chip.scale_index].valid_range
            arrays["valid_ranges"][position] = chip_valid_range(valid_range, chip.im_scale, size)
            dropped = pack_gt_boxes(boxes, classes, arrays["gt_boxes"][position])
        if self.with_masks:
            chip_gt_masks(select_polygons(entry, rows), classes, chip.im_scale, chip.box, arrays["gt_masks"][position])
        if self.focus is not None:  # from every gt box of the image, whatever the chip's valid boxes
            arrays["scale_label"][position] = focus_labels(entry["boxes"], chip.im_scale, chip.box, self.focus).ravel()
        done = time.perf_counter()
        return ("chip", tag, position, (decoded - start, rendered - decoded, done - rendered), dropped, decoded_now)

    def chip_boxes(self, entry, chip):
        """(boxes in chip pixels, classes, valid) of the entry's boxes ``chip`` shows (lib.data.chip_boxes)."""
        return tuple(self.select_boxes(entry, chip)[1:])

    def select_boxes(self, entry, chip):
        """``ChipBoxes`` (rows in the entry, boxes in chip pixels, classes, valid) of the boxes ``chip`` shows."""
        return select_chip_boxes(entry["boxes"], entry["gt_classes"], chip.valid_mask(len(entry["boxes"])),
                                 chip.im_scale, chip.box, self.min_gt_size, self.mining.chip_size, self.round_gt)

    def input_extent(self, entry, chip):
        """(height, width) the network is told a chip has (``im_info``; the proposals are clipped to it): the
        whole input, or at the coarsest scale the whole scaled image, as the reference has it."""
        if chip.scale_index == len(self.mining.levels) - 1:
            return scaled_image_size(entry["height"], entry["width"], chip.im_scale, self.mining.truncate_image_size)
        return self.mining.chip_size, self.mining.chip_size
