"""Configuration: defaults (configs/default.py) <- YAML file <- command-line overrides.

Every key must exist in the defaults, and every value is checked against (and parsed to) the type of
its default, so a typo in a YAML file or on the command line fails at start-up, naming the key, instead
of silently training with a default. A loaded config is frozen: writing a key raises, so no stage can
change a setting under another one's feet. What a run derives at run time (the class count, chips per
device) is passed on as arguments; a variant of a config is made with ``with_overrides``.
"""
import copy
import difflib
import math
import os
import re
import sys

import yaml

from configs.default import DEFAULTS
from lib.errors import ConfigError

# Keys that were renamed: using the old name is an error that names the new one.
RENAMED_KEYS = {"TRAIN.scale": "TRAIN.fp16_loss_scale"}
# Keys that a record now gives: refused as settings; a file may still hold them (the config.yaml of an
# older run folder) when its value is the record's.
DERIVED_KEYS = {"network.RPN_FEAT_STRIDE": "the backbone's stride (symbols/backbones.py, after `symbol`)",
                "network.RCNN_FEAT_STRIDE": "the backbone's stride (symbols/backbones.py, after `symbol`)"}
# The key of a YAML config naming the file it builds on (Detectron2's); a written config is always flat.
BASE_KEY = "_BASE_"
_KEY_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


class FrozenConfigError(AttributeError):
    """A write into a loaded (frozen) configuration."""


class AttrDict(dict):
    """A dict whose keys are also attributes (cfg.TRAIN.lr), nested dicts included; frozen once loaded."""

    _frozen = False

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def _refuse(self, *args, **kwargs):
        raise FrozenConfigError("the configuration is frozen once loaded; build a variant with "
                                "lib.config.with_overrides(cfg, {key: value}) instead of writing into it")

    def __setitem__(self, key, value):
        if self._frozen:
            self._refuse()
        super().__setitem__(key, value)

    def __setattr__(self, key, value):
        self[key] = value

    def __delitem__(self, key):
        if self._frozen:
            self._refuse()
        super().__delitem__(key)

    def __delattr__(self, key):
        del self[key]

    def __deepcopy__(self, memo):
        copied = AttrDict({k: copy.deepcopy(v, memo) for k, v in self.items()})
        return freeze(copied) if self._frozen else copied

    def __reduce__(self):
        return _rebuild, (plain(self), self._frozen)


def _guard(method):
    def guarded(self, *args, **kwargs):
        if self._frozen:
            self._refuse()
        return method(self, *args, **kwargs)
    guarded.__name__ = method.__name__
    return guarded


for _name in ("update", "pop", "popitem", "setdefault", "clear"):
    setattr(AttrDict, _name, _guard(getattr(dict, _name)))
del _name


def _rebuild(values, frozen):
    cfg = _to_attrdict(values)
    return freeze(cfg) if frozen else cfg


def _to_attrdict(value):
    if isinstance(value, dict):
        return AttrDict({k: _to_attrdict(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [_to_attrdict(v) for v in value]
    return value


def restore(values):
    """A config saved as plain values (``plain``; an exported model's model.json), frozen as loaded. It is not
    validated again: it was when it was saved, and validation needs the backbone registry (MXNet), which
    the ONNX Runtime back end does without."""
    return _rebuild(values, frozen=True)


def freeze(cfg):
    """Make ``cfg`` and every section read-only in place (lists become tuples); returns it."""
    for key, value in cfg.items():
        if isinstance(value, AttrDict):
            freeze(value)
        elif isinstance(value, list):
            dict.__setitem__(cfg, key, _tuples(value))
    object.__setattr__(cfg, "_frozen", True)
    return cfg


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def plain(value):
    """The config (or a section, or a value) as plain dicts and lists, e.g. for YAML."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _coerce(key, default, value):
    """Return ``value`` converted to the type of ``default``; raise ConfigError when it cannot be."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"config key {key}: expected true/false, got {value!r}")
    if isinstance(default, (int, float)):
        if isinstance(value, bool):
            raise ConfigError(f"config key {key}: expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            raise ConfigError(f"config key {key}: expected a number, got {value!r}") from None
        if not isinstance(number, (int, float)):
            raise ConfigError(f"config key {key}: expected a number, got {value!r}")
        if isinstance(default, int) and not float(number).is_integer():
            raise ConfigError(f"config key {key}: expected an integer, got {value!r}")
        return int(number) if isinstance(default, int) else float(number)
    if isinstance(default, str):
        if isinstance(value, (dict, list, tuple)):
            raise ConfigError(f"config key {key}: expected a string, got {value!r}")
        return "" if value is None else str(value)
    if isinstance(default, (list, tuple)):
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
                isinstance(v, (int, float)) for v in default):
            return value  # a single number where a numeric list is allowed, e.g. CHIP_STRIDE: 32
        raise ConfigError(f"config key {key}: expected a list, got {value!r}")
    raise ConfigError(f"config key {key}: unsupported default type {type(default).__name__}")


def flat_config(node, prefix=""):
    """``{dotted.key: plain value}`` of every key of a config (or of the defaults), e.g. to compare two."""
    flat = {}
    for key, value in node.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = plain(value)
    return flat


def _unknown(key):
    if key in DERIVED_KEYS:
        return ConfigError(f"config key {key} is no longer set: it is {DERIVED_KEYS[key]}")
    if key in RENAMED_KEYS:
        return ConfigError(f"config key {key} was renamed to {RENAMED_KEYS[key]}; use that name")
    known = list(flat_config(DEFAULTS))
    # case-insensitive first (TRAIN.LR for TRAIN.lr), then the closest spelling
    nearest = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    hint = f"; did you mean {nearest[0]}?" if nearest else ""
    return ConfigError(f"unknown config key {key}{hint}")


def _merge(base, update, prefix=""):
    for key, value in update.items():
        name = prefix + str(key)
        if key not in base:
            raise _unknown(name)
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {name} is a section; got {value!r}")
            _merge(base[key], value, name + ".")
        else:
            base[key] = _coerce(name, base[key], value)


def _parse_override(key, text, default):
    """Parse a --set value: YAML syntax for lists and numbers, plain text for strings."""
    if isinstance(default, str) or not isinstance(text, str):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config key {key}: cannot parse {text!r}: {err}") from None


def apply_overrides(cfg, overrides):
    """Apply ``[(dotted.key, value), ...]`` to an unfrozen ``cfg`` in place; a value is text to parse
    (command line) or already a Python value."""
    for key, value in overrides:
        node = cfg
        parts = key.split(".")
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], dict):
                raise _unknown(key)
            node = node[part]
        leaf = parts[-1]
        if leaf not in node:
            raise _unknown(key)
        if isinstance(node[leaf], dict):
            raise ConfigError(f"config key {key} is a section, set one of its keys")
        node[leaf] = _coerce(key, node[leaf], _parse_override(key, value, node[leaf]))
    return cfg


def load_config(path=None, overrides=()):
    """Build the frozen configuration: defaults, then the YAML file at ``path`` (its ``_BASE_`` chain first),
    then ``overrides`` (``[(dotted.key, value), ...]`` or a ``{dotted.key: value}`` dict; Python values or
    command-line text)."""
    overrides = list(overrides.items() if isinstance(overrides, dict) else overrides)
    cfg = copy.deepcopy(DEFAULTS)
    if not path:
        return _finish(_to_attrdict(cfg), overrides, "default")
    derived = {}
    for file, loaded in _file_chain(path):
        loaded.pop("name", None)  # a saved run config records its name; the file's own stem wins
        derived.update(_pop_derived(loaded))
        try:
            _merge(cfg, loaded)
        except ConfigError as err:
            raise ConfigError(f"{file}: {err}") from None
    cfg = _finish(_to_attrdict(cfg), overrides, os.path.splitext(os.path.basename(path))[0])
    _check_derived(cfg, derived, path)
    return cfg


def _file_chain(path, children=()):
    """``[(file, mapping), ...]`` of the YAML file at ``path`` and its ``_BASE_`` chain, the farthest base first
    (Detectron2's convention: ``_BASE_`` is a path relative to the file naming it, its keys overridden by that
    file's, sections merged key by key)."""
    if os.path.realpath(path) in children:
        raise ConfigError(f"config file {path}: its _BASE_ chain comes back to it (a cycle: "
                          f"{' -> '.join(children)} -> {os.path.realpath(path)})")
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except OSError as err:
        named_by = f" (the _BASE_ of {children[-1]})" if children else ""
        raise ConfigError(f"cannot read config file {path}{named_by}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(loaded).__name__}")
    base = loaded.pop(BASE_KEY, None)
    if base is None:
        return [(path, loaded)]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"config file {path}: {BASE_KEY} must be a file path, got {base!r}")
    chain = _file_chain(os.path.join(os.path.dirname(path), base), children + (os.path.realpath(path),))
    return chain + [(path, loaded)]


def config_file_values(path):
    """The keys the YAML file at ``path`` sets, its ``_BASE_`` chain merged in: a flat mapping (no ``_BASE_``)
    for a tool that writes a variant of the file (a written config never points at a base)."""
    merged = {}
    for _, loaded in _file_chain(path):
        _overlay(merged, loaded)
    return merged


def _overlay(base, update):
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _overlay(base[key], value)
        else:
            base[key] = value


def _pop_derived(loaded):
    """The DERIVED_KEYS a loaded file holds, ``{key: value}``, removed from it."""
    found = {}
    for key in DERIVED_KEYS:
        section, name = key.split(".")
        if isinstance(loaded.get(section), dict) and name in loaded[section]:
            found[key] = loaded[section].pop(name)
    return found


def _check_derived(cfg, derived, path):
    from symbols.backbones import feature_stride

    for key, value in derived.items():
        if value != feature_stride(cfg):
            raise ConfigError(f"{path}: config key {key} = {value!r}, but it is no longer set: it is "
                              f"{DERIVED_KEYS[key]}, {feature_stride(cfg)} for symbol {cfg.symbol}; remove the key")


def with_overrides(cfg, overrides, name=None):
    """A new frozen config: ``cfg`` with ``overrides`` (a ``{dotted.key: value}`` dict or
    ``[(key, value), ...]``; values are Python values or command-line text) applied and checked; ``name``
    renames it (the run folder ``{output_path}/{name}`` follows)."""
    items = overrides.items() if isinstance(overrides, dict) else overrides
    return _finish(_to_attrdict(plain(cfg)), items, name or cfg.name)


def _finish(cfg, overrides, name):
    apply_overrides(cfg, list(overrides))
    dict.__setitem__(cfg, "name", name)
    validate(cfg)
    return freeze(cfg)


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
}


def validate(cfg):
    """Cross-key and range checks that types alone cannot catch, each naming its key."""
    from symbols.backbones import feature_stride

    _check(0 <= cfg.TRAIN.begin_epoch < cfg.TRAIN.end_epoch, "TRAIN.end_epoch", cfg.TRAIN.end_epoch,
           f"must be greater than TRAIN.begin_epoch ({cfg.TRAIN.begin_epoch})")
    try:
        _parse_sections(cfg)  # each section's own parsing is the rule, applied here once at load
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
    if cfg.dataset.dataset == "synthetic":
        _check(cfg.dataset.synthetic_train > 0, "dataset.synthetic_train", cfg.dataset.synthetic_train,
               "the synthetic dataset needs at least one training image")
        _check(cfg.dataset.synthetic_val >= 0, "dataset.synthetic_val", cfg.dataset.synthetic_val, "must be >= 0")
    _check_dataset_kind(cfg)
    _check_chip_fits(cfg)


def _check_dataset_kind(cfg):
    from lib.dataset.roidb import DATASETS

    kind = cfg.dataset.dataset
    if kind not in DATASETS:
        raise ConfigError(f"config key dataset.dataset = {kind!r}: unknown dataset; expected one of "
                          f"{', '.join(sorted(DATASETS))}")


def _check_chip_fits(cfg):
    """Some training scale must let a box of its valid range fit in a chip: a box of sqrt(area) ``lo``
    (original pixels) is ``lo * factor`` pixels at a factor scale. A scale given in pixels (a side target)
    can shrink any box to fit, so only an all-factor pyramid is checked."""
    from lib.scales import pyramid

    size = cfg.TRAIN.CHIP_SIZE
    levels = pyramid(cfg.TRAIN, "TRAIN")
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
    their key)."""
    from chip_generator.mining import MiningParams
    from lib.scales import pyramid
    from symbols.backbones import backbone_of

    backbone_of(cfg)
    pyramid(cfg.TEST, "TEST")
    MiningParams.from_config(cfg)  # the training pyramid included
    images_per_device(cfg.TEST, len(cfg.TEST.SCALES))
    lr_step_epochs(cfg.TRAIN)


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


def dump_config(cfg):
    """The configuration as YAML text, for logs and for reproducing a run (loadable by ``--cfg``)."""
    return yaml.safe_dump(plain(cfg), sort_keys=False, default_flow_style=None)


def parse_cli_overrides(words):
    """``--set`` words -> ``[(KEY, VALUE), ...]``: ``KEY VALUE`` pairs and ``KEY=VALUE`` words, mixed."""
    pairs, index = [], 0
    while index < len(words):
        word = words[index]
        key, equals, value = word.partition("=")
        if equals and _KEY_WORD.fullmatch(key) or equals and key in DEFAULTS:
            pairs.append((key, value))
            index += 1
            continue
        if index + 1 >= len(words):
            raise ConfigError(f"--set {word}: a key needs a value (KEY VALUE or KEY=VALUE)")
        pairs.append((word, words[index + 1]))
        index += 2
    return pairs


def add_config_arguments(parser, cfg_help="YAML config, e.g. configs/faster/sniper_res101_e2e.yml", required=True):
    """The ``--cfg FILE [--set KEY VALUE | KEY=VALUE ...]`` options every entry point takes; ``--set``
    may be given several times, every occurrence adds to the overrides."""
    parser.add_argument("--cfg", required=required, help=cfg_help)
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY VALUE",
                        help="override config keys (dotted), as KEY VALUE pairs or KEY=VALUE words, "
                             "e.g. --set TRAIN.BATCH_IMAGES 8 gpus=0,1")


def config_from_arguments(args, extra_overrides=()):
    """The config of parsed ``--cfg``/``--set`` (then ``extra_overrides``); a bad file, key or value
    exits with a one-line message naming it."""
    try:
        return load_config(args.cfg, parse_cli_overrides(args.set) + list(extra_overrides))
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")

