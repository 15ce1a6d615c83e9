"""Configuration: defaults (configs/default.py) <- YAML file <- command-line overrides.

Every key must exist in the defaults, and every value is checked against (and parsed to) the type of
its default, so a typo in a YAML file or on the command line fails at start-up, naming the key, instead
of silently training with a default.
"""
import copy
import os
import sys

import yaml

from configs.default import DEFAULTS


class ConfigError(ValueError):
    """A configuration key or value that does not fit the defaults."""


class AttrDict(dict):
    """A dict whose keys are also attributes (cfg.TRAIN.lr), nested dicts included."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        self[key] = value

    def __deepcopy__(self, memo):
        return AttrDict({k: copy.deepcopy(v, memo) for k, v in self.items()})


def _to_attrdict(value):
    if isinstance(value, dict):
        return AttrDict({k: _to_attrdict(v) for k, v in value.items()})
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
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key {key}: expected a string, got {value!r}")
        return "" if value is None else str(value)
    if isinstance(default, list):
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
                isinstance(v, (int, float)) for v in default):
            return value  # a single number where a numeric list is allowed, e.g. CHIP_STRIDE: 32
        raise ConfigError(f"config key {key}: expected a list, got {value!r}")
    raise ConfigError(f"config key {key}: unsupported default type {type(default).__name__}")


def _merge(base, update, prefix=""):
    for key, value in update.items():
        name = prefix + str(key)
        if key not in base:
            raise ConfigError(f"unknown config key {name}")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {name} is a section; got {value!r}")
            _merge(base[key], value, name + ".")
        else:
            base[key] = _coerce(name, base[key], value)


def _parse_override(key, text, default):
    """Parse a --set value: YAML syntax for lists and numbers, plain text for strings."""
    if isinstance(default, str):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config key {key}: cannot parse {text!r}: {err}") from None


def apply_overrides(cfg, overrides):
    """Apply ``[(dotted.key, value_text), ...]`` to ``cfg`` in place."""
    for key, text in overrides:
        node = cfg
        parts = key.split(".")
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], dict):
                raise ConfigError(f"unknown config key {key}")
            node = node[part]
        leaf = parts[-1]
        if leaf not in node:
            raise ConfigError(f"unknown config key {key}")
        if isinstance(node[leaf], dict):
            raise ConfigError(f"config key {key} is a section, set one of its keys")
        node[leaf] = _coerce(key, node[leaf], _parse_override(key, text, node[leaf]))
    return cfg


def load_config(path=None, overrides=()):
    """Build the configuration: defaults, then the YAML file at ``path``, then ``overrides``."""
    cfg = copy.deepcopy(DEFAULTS)
    name = "default"
    if path:
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(loaded).__name__}")
        try:
            _merge(cfg, loaded)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
        name = os.path.splitext(os.path.basename(path))[0]
    cfg = _to_attrdict(cfg)
    apply_overrides(cfg, overrides)
    cfg["name"] = name
    validate(cfg)
    return cfg


def validate(cfg):
    """Cross-key checks that types alone cannot catch."""
    from lib.scales import parse_scales, parse_valid_ranges

    for section in ("TRAIN", "TEST"):
        scales = parse_scales(cfg[section].SCALES, f"{section}.SCALES")
        ranges = parse_valid_ranges(cfg[section].VALID_RANGES, f"{section}.VALID_RANGES")
        if len(scales) != len(ranges):
            raise ConfigError(
                f"{section}.SCALES has {len(scales)} scales but {section}.VALID_RANGES has {len(ranges)} ranges")
    if len(cfg.network.ANCHOR_RATIOS) * len(cfg.network.ANCHOR_SCALES) != cfg.network.NUM_ANCHORS:
        raise ConfigError("network.NUM_ANCHORS must equal len(ANCHOR_RATIOS) * len(ANCHOR_SCALES)")
    if len(cfg.TRAIN.NEG_CHIP_MIN_PROPOSALS) != len(cfg.TRAIN.SCALES):
        raise ConfigError("TRAIN.NEG_CHIP_MIN_PROPOSALS needs one value per training scale")
    stride = cfg.TRAIN.CHIP_STRIDE
    strides = stride if isinstance(stride, list) else [stride]
    if not (1 <= len(strides) <= 2 and all(isinstance(s, (int, float)) and s > 0 for s in strides)):
        raise ConfigError(f"TRAIN.CHIP_STRIDE must be a positive number or [lo, hi), got {stride!r}")
    if cfg.TRAIN.CHIP_SIZE % cfg.network.RPN_FEAT_STRIDE:
        raise ConfigError("TRAIN.CHIP_SIZE must be a multiple of network.RPN_FEAT_STRIDE")


def dump_config(cfg):
    """The configuration as YAML text, for logs and for reproducing a run."""
    def plain(value):
        return {k: plain(v) for k, v in value.items()} if isinstance(value, dict) else value
    return yaml.safe_dump(plain(cfg), sort_keys=False, default_flow_style=None)


def parse_cli_overrides(pairs):
    """Turn argparse's ``--set K V K V`` list into ``[(K, V), ...]``."""
    if len(pairs) % 2:
        raise ConfigError(f"--set takes KEY VALUE pairs; got an odd number of words: {pairs}")
    return list(zip(pairs[0::2], pairs[1::2]))


def add_config_arguments(parser, cfg_help="YAML config, e.g. configs/faster/sniper_res101_e2e.yml"):
    """The ``--cfg FILE [--set KEY VALUE ...]`` options every entry point takes."""
    parser.add_argument("--cfg", required=True, help=cfg_help)
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY VALUE",
                        help="override config keys (dotted), e.g. --set TRAIN.BATCH_IMAGES 8 gpus 0,1")


def config_from_arguments(args):
    """The config of parsed ``--cfg``/``--set``; a bad file, key or value exits with a message naming it."""
    try:
        return load_config(args.cfg, parse_cli_overrides(args.set))
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
