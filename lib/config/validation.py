"""The checks across keys and ranges of a loaded configuration that types alone cannot catch, each naming its
key: every stage's own parsing of its section run once at load (so what loads, runs), the variant keys'
choices, and the dataset format's own checks (its ``check_config``, found through lib.dataset.roidb.DATASETS).
"""
import math
from dataclasses import dataclass

from lib.config.core import DERIVED_KEYS
from lib.errors import ConfigError


def _check(condition, key, value, requirement):
    if not condition:
        raise ConfigError(f"config key {key} = {value!r}: {requirement}")


# Keys choosing between the reference's behaviour and a variant (configs/default.py, docs/reference_differences.md):
# their allowed values, the reference's first.
VARIANT_KEYS = {
    "network.CHANNEL_ORDER": ("RGB", "BGR"),
    "TRAIN.VALIDITY_RULES": ("reference", "strict"),
    "TRAIN.CHIP_VALID_BOXES": ("assigned", "visible"),
    "TRAIN.NEG_CHIP_RULES": ("reference", "contained"),
    "TRAIN.CHIP_WINDOWS": ("reference", "clipped"),
    "dataset.TEST_IMAGE_ORDER": ("reference", "file"),
    "TRAIN.CHIP_CROP": ("truncate", "round"),
    "TRAIN.EMPTY_IMAGES": ("drop", "negative"),
    "TRAIN.RPN_ANCHOR_BORDER": ("chip", "content"),
    "TRAIN.NEW_LAYER_INIT": ("reference", "msra"),
    "TRAIN.PROPOSAL_TARGET_RULES": ("reference", "exact"),
    "TEST.PROPOSAL_LAYER": ("reference", "stock"),
    "TEST.VOC_EVAL_RULES": ("reference", "exact"),
    "TEST.BACKEND": ("mxnet", "onnxruntime"),
    "TEST.ONNX_POOLING": ("auto", "compiled", "graph"),
}


@dataclass(frozen=True)
class ParsedSections:
    """The sections the stages read as parsed values, parsed once at load and handed on with the config
    (``lib.config.parsed``)."""

    mining: object  # chip_generator.mining.MiningParams: the training pyramid and the chip settings
    test_levels: tuple  # lib.scales.ScaleLevel per test scale (TEST.SCALES, TEST.VALID_RANGES), finest first
    test_batch_images: tuple  # TEST.BATCH_IMAGES as images per device, one count per test level
    lr_step_epochs: tuple  # TRAIN.lr_step as increasing epochs (fractions allowed)


def validate(cfg):
    """Cross-key and range checks that types alone cannot catch, each naming its key; returns the
    ParsedSections."""
    from symbols.backbones import feature_stride

    _check(0 <= cfg.TRAIN.begin_epoch < cfg.TRAIN.end_epoch, "TRAIN.end_epoch", cfg.TRAIN.end_epoch,
           f"must be greater than TRAIN.begin_epoch ({cfg.TRAIN.begin_epoch})")
    try:
        parsed = _parse_sections(cfg)  # each section's own parsing is the rule, applied here once at load
    except ValueError as err:
        raise ConfigError(str(err)) from None

    for key, choices in VARIANT_KEYS.items():
        section, name = key.split(".")
        _check(cfg[section][name] in choices, key, cfg[section][name], f"must be one of {', '.join(choices)}")

    network, train = cfg.network, cfg.TRAIN
    if len(network.ANCHOR_RATIOS) * len(network.ANCHOR_SCALES) != network.NUM_ANCHORS:
        raise ConfigError(f"network.NUM_ANCHORS = {network.NUM_ANCHORS}, but ANCHOR_RATIOS x ANCHOR_SCALES give "
                          f"{len(network.ANCHOR_RATIOS) * len(network.ANCHOR_SCALES)} anchors")
    stride = feature_stride(cfg)
    _check(train.CHIP_SIZE % stride == 0, "TRAIN.CHIP_SIZE", train.CHIP_SIZE,
           f"must be a multiple of the {cfg.symbol} features' stride ({stride})")
    for key in ("lr", "warmup_lr"):
        _check(math.isfinite(train[key]) and train[key] > 0, f"TRAIN.{key}", train[key], "must be a positive number")
    _check(math.isfinite(train.wd) and train.wd >= 0, "TRAIN.wd", train.wd, "must be >= 0")
    _check(0 <= train.momentum < 1, "TRAIN.momentum", train.momentum, "must be in [0, 1)")
    _check(math.isfinite(train.fp16_loss_scale) and train.fp16_loss_scale > 0, "TRAIN.fp16_loss_scale",
           train.fp16_loss_scale, "must be a positive number")
    _check(cfg.default.frequent >= 1, "default.frequent", cfg.default.frequent, "must be at least 1")
    _check(cfg.dataset.MAX_IMAGE_PIXELS >= 1, "dataset.MAX_IMAGE_PIXELS", cfg.dataset.MAX_IMAGE_PIXELS,
           "must be at least 1")
    for section, key in (("TRAIN", "BATCH_IMAGES"), ("TRAIN", "CHIP_SIZE"), ("TRAIN", "RPN_POST_NMS_TOP_N"),
                         ("TEST", "RPN_POST_NMS_TOP_N"), ("TEST", "RPN_PRE_NMS_TOP_N"), ("TEST", "BATCH_PARTS")):
        _check(cfg[section][key] >= 1, f"{section}.{key}", cfg[section][key], "must be at least 1")
    _check(cfg.TEST.NUM_PROCESS >= 0, "TEST.NUM_PROCESS", cfg.TEST.NUM_PROCESS, "must be >= 0 (0: in the main process)")
    tile = cfg.TEST.TILE
    _check(isinstance(tile, (list, tuple)) and (not tile or len(tile) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in tile) and 0 <= tile[1] < tile[0]),
        "TEST.TILE", tile, "must be [] or [size, overlap] in network pixels, integers, 0 <= overlap < size")
    _check(train.NUM_PROCESS >= 0, "TRAIN.NUM_PROCESS", train.NUM_PROCESS, "must be >= 0 (0: build chips in the "
           "main process)")
    for section in ("TRAIN", "TEST"):
        timeout = cfg[section].LOADER_TIMEOUT
        _check(math.isfinite(timeout) and timeout >= 0, f"{section}.LOADER_TIMEOUT", timeout,
               "must be a number of seconds >= 0 (0: no limit)")
        warn = cfg[section].STALL_WARN
        _check(math.isfinite(warn) and warn >= 0, f"{section}.STALL_WARN", warn,
               "must be a number of seconds >= 0 (0: no warning)")
    _check(train.KEEP_CHECKPOINTS >= 0, "TRAIN.KEEP_CHECKPOINTS", train.KEEP_CHECKPOINTS,
           "must be >= 0 (0: keep every epoch)")
    _check(train.IMAGE_CACHE_MB >= 0, "TRAIN.IMAGE_CACHE_MB", train.IMAGE_CACHE_MB,
           "must be >= 0 (0: decode the image for every chip)")
    _check(train.GRAD_ACCUM_STEPS >= 1, "TRAIN.GRAD_ACCUM_STEPS", train.GRAD_ACCUM_STEPS, "must be >= 1 (1: none)")
    for key in ("EVAL_EVERY", "EVAL_IMAGES", "EARLY_STOP"):
        _check(train[key] >= 0, f"TRAIN.{key}", train[key], "must be >= 0 (0: off / all)")
    from lib.evaluation.coco_summary import SEGM_PREFIX  # the segm stats a mask network's evaluation adds

    metric = train.EVAL_METRIC
    _check(train.WITH_MASK or not metric.startswith(SEGM_PREFIX), "TRAIN.EVAL_METRIC", metric,
           f"segm metrics need a mask network (TRAIN.WITH_MASK true); choose a bbox metric such as "
           f"{metric[len(SEGM_PREFIX):]!r}")
    _check(train.RCNN_BBOX_LOSS_CHIPS >= 0, "TRAIN.RCNN_BBOX_LOSS_CHIPS", train.RCNN_BBOX_LOSS_CHIPS,
           "must be >= 0 (0: the chips per device)")
    _check(0 <= cfg.dataset.PROPOSAL_NMS <= 1, "dataset.PROPOSAL_NMS", cfg.dataset.PROPOSAL_NMS,
           "must be in [0, 1] (0: no NMS)")
    _validate_auto_focus(cfg, len(cfg.TEST.SCALES))
    _check_dataset(cfg)
    _check_chip_fits(cfg, parsed.mining.levels)
    return parsed


def _check_dataset(cfg):
    """A known dataset format, and that format's own checks of its keys."""
    from lib.dataset.roidb import DATASETS

    kind = cfg.dataset.dataset
    if kind not in DATASETS:
        raise ConfigError(f"config key dataset.dataset = {kind!r}: unknown dataset; expected one of "
                          f"{', '.join(sorted(DATASETS))}")
    DATASETS[kind].check_config(cfg)


def _check_chip_fits(cfg, levels):
    """Some training scale must let a box of its valid range fit in a chip: a box of sqrt(area) ``lo``
    (original pixels) is ``lo * factor`` pixels at a factor scale. A scale given in pixels (a side target)
    can shrink any box to fit, so only an all-factor pyramid is checked. ``levels``: the training pyramid
    as the chip mining parsed it."""
    size = cfg.TRAIN.CHIP_SIZE
    if not all(level.spec.factor > 0 for level in levels):
        return
    smallest = [max(level.valid_range[0], 0) * level.spec.factor for level in levels]
    if min(smallest) > size:
        raise ConfigError(f"config key TRAIN.CHIP_SIZE = {size}: no valid box fits in a chip at any training scale "
                          f"(the smallest valid boxes are {', '.join(f'{s:g}' for s in smallest)} pixels at "
                          f"TRAIN.SCALES {list(cfg.TRAIN.SCALES)}): raise CHIP_SIZE or lower TRAIN.VALID_RANGES")


def _validate_auto_focus(cfg, num_test_scales):
    """AutoFocus keys: label thresholds in order, one DO_PRUNING / CHIP_HYPERPARAMS entry per test scale,
    usable chip parameters wherever the next scale is pruned."""
    train, test = cfg.TRAIN, cfg.TEST
    if cfg.network.AUTO_FOCUS:
        low, small, high = train.AUTO_FOCUS_DC_LOW, train.AUTO_FOCUS_SMALL_THRESH, train.AUTO_FOCUS_DC_HIGH
        _check(0 <= low < small <= high, "TRAIN.AUTO_FOCUS_SMALL_THRESH", small,
               f"needs 0 <= AUTO_FOCUS_DC_LOW ({low}) < AUTO_FOCUS_SMALL_THRESH <= AUTO_FOCUS_DC_HIGH ({high})")
    if not test.AUTO_FOCUS:
        return
    _check(cfg.network.AUTO_FOCUS, "TEST.AUTO_FOCUS", True, "needs the FocusPixel branch (network.AUTO_FOCUS: true)")
    for key in ("DO_PRUNING", "CHIP_HYPERPARAMS"):
        _check(len(test[key]) == num_test_scales, f"TEST.{key}", test[key],
               f"needs one entry per test scale ({num_test_scales})")
    _check(all(isinstance(v, bool) for v in test.DO_PRUNING), "TEST.DO_PRUNING", test.DO_PRUNING,
           "entries must be true/false")
    _check(not test.DO_PRUNING[0], "TEST.DO_PRUNING", test.DO_PRUNING,
           "the first (coarsest) scale processes whole images: its entry must be false")
    for index, params in enumerate(test.CHIP_HYPERPARAMS):
        key = f"TEST.CHIP_HYPERPARAMS[{index}]"
        _check(isinstance(params, (list, tuple)) and len(params) == 3 and
               all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in params), key, params,
               "must be three numbers [dilation, threshold, minimum chip size in feature cells]")
        if index + 1 < num_test_scales and test.DO_PRUNING[index + 1]:
            dilation, threshold, min_size = params
            _check(float(dilation).is_integer() and dilation >= 1, key, params, "dilation must be an integer >= 1")
            _check(0 < threshold <= 1, key, params, "the FocusPixel threshold must be in (0, 1]")
            _check(float(min_size).is_integer() and min_size >= 1, key, params,
                   "the minimum chip size must be an integer >= 1 (feature cells)")


def _parse_sections(cfg):
    """The parsing every stage does with its section, once: the backbone of ``symbol``, the training and
    test pyramids, the chip-mining parameters, the test batches and the lr schedule (ValueErrors naming
    their key); returns the ParsedSections."""
    from chip_generator.mining import MiningParams
    from lib.scales import pyramid
    from symbols.backbones import backbone_of

    backbone_of(cfg)
    test_levels = pyramid(cfg.TEST, "TEST")
    mining = MiningParams.from_config(cfg)  # the training pyramid included
    test_batch_images = images_per_device(cfg.TEST, len(test_levels))
    return ParsedSections(mining=mining, test_levels=test_levels, test_batch_images=test_batch_images,
                          lr_step_epochs=tuple(lr_step_epochs(cfg.TRAIN)))


def images_per_device(test_cfg, num_levels):
    """``TEST.BATCH_IMAGES`` as one count per level (a single number applies to every level)."""
    value = test_cfg.BATCH_IMAGES
    counts = tuple(value) if isinstance(value, (list, tuple)) else (value,) * num_levels
    if len(counts) != num_levels or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                                            for c in counts):
        raise ValueError(f"config key TEST.BATCH_IMAGES = {value!r}: expected a positive integer or one per "
                         f"test scale ({num_levels})")
    return counts


def lr_step_epochs(train):
    """``TRAIN.lr_step`` "5.33" or "8,11" (or "" / "none" for no step) -> the epochs at which the lr drops,
    each inside the run (0 < epoch < TRAIN.end_epoch: a later step would never be taken)."""
    text = train.lr_step
    no_step = "'' or none for no step (shell: --set TRAIN.lr_step none, or --set TRAIN.lr_step '')"
    if str(text).strip().lower() == "none":
        return []
    try:
        epochs = [float(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"config key TRAIN.lr_step: expected comma-separated epochs, got {text!r}; "
                         f"{no_step}") from None
    outside = [epoch for epoch in epochs if not 0 < epoch < train.end_epoch]
    if outside:
        raise ValueError(f"config key TRAIN.lr_step = {text!r}: step {outside[0]:g} is not inside the run "
                         f"(0 < step < TRAIN.end_epoch {train.end_epoch}); {no_step}")
    return epochs


def check_derived(cfg, derived, path):
    """The DERIVED_KEYS a file held (``derived``, from ``lib.config.core.file_config``) must be the record's."""
    from symbols.backbones import feature_stride

    for key, value in derived.items():
        if value != feature_stride(cfg):
            raise ConfigError(f"{path}: config key {key} = {value!r}, but it is no longer set: it is "
                              f"{DERIVED_KEYS[key]}, {feature_stride(cfg)} for symbol {cfg.symbol}; remove the key")
