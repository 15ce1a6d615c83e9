"""The configuration's core: defaults (configs/default.py) <- YAML file (its ``_BASE_`` chain first) <-
command-line overrides, each value checked against (and parsed to) the type of its default, and the frozen dict.

Every key must exist in the defaults, so a typo in a YAML file or on the command line fails at start-up,
naming the key, instead of silently training with a default. Nothing here knows a section's meaning: the
checks across keys are lib/config/validation.py's, and ``lib.config.load_config`` runs both.
"""
import copy
import difflib
import os
import re

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
    _parsed = None  # what validation parsed of the sections (lib.config.parsed), on a loaded config only

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
        return freeze(copied, self._parsed) if self._frozen else copied

    def __reduce__(self):
        return _rebuild, (plain(self), self._frozen, self._parsed)


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


def _rebuild(values, frozen, parsed=None):
    cfg = _to_attrdict(values)
    return freeze(cfg, parsed) if frozen else cfg


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


def freeze(cfg, parsed=None):
    """Make ``cfg`` and every section read-only in place (lists become tuples), holding ``parsed`` (what
    validation parsed of its sections, handed on with it: ``parsed_sections``); returns it."""
    for key, value in cfg.items():
        if isinstance(value, AttrDict):
            freeze(value)
        elif isinstance(value, list):
            dict.__setitem__(cfg, key, _tuples(value))
    object.__setattr__(cfg, "_frozen", True)
    object.__setattr__(cfg, "_parsed", parsed)
    return cfg


def parsed_sections(cfg):
    """What ``freeze`` was handed with ``cfg`` (None for a config restored from saved values)."""
    return cfg._parsed


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


def file_config(path):
    """``(cfg, derived)``: the defaults with the YAML file at ``path`` and its ``_BASE_`` chain merged in (an
    unfrozen, unchecked AttrDict; the defaults alone for no path), and the DERIVED_KEYS the files hold,
    ``{key: value}``, for the validator to compare with the record."""
    cfg = copy.deepcopy(DEFAULTS)
    derived = {}
    for file, loaded in _file_chain(path) if path else ():
        loaded.pop("name", None)  # a saved run config records its name; the file's own stem wins
        derived.update(_pop_derived(loaded))
        try:
            _merge(cfg, loaded)
        except ConfigError as err:
            raise ConfigError(f"{file}: {err}") from None
    return _to_attrdict(cfg), derived


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


def editable(cfg):
    """An unfrozen copy of a loaded ``cfg``, to build a variant on."""
    return _to_attrdict(plain(cfg))


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
