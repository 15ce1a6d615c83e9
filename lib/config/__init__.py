"""Configuration: defaults (configs/default.py) <- YAML file (its ``_BASE_`` chain first) <- command-line
overrides, then checked and frozen.

The core (lib/config/core.py) reads, merges and type-checks the keys and holds the frozen dict; the
validation (lib/config/validation.py) checks across keys, each dataset format adding its own checks. A loaded
config is frozen: writing a key raises, so no stage can change a setting under another one's feet. The
sections validation parses (the training pyramid and chip settings, the test pyramid) travel with it as
parsed values (``parsed``), so no stage parses them again. What a run derives at run time (the class count,
chips per device) is passed on as arguments; a variant of a config is made with ``with_overrides``.
"""
import os
import sys

from lib.config.core import apply_overrides, editable, file_config, freeze, parse_cli_overrides, parsed_sections
from lib.config.validation import check_derived, validate
from lib.errors import ConfigError


def load_config(path=None, overrides=()):
    """Build the frozen configuration: defaults, then the YAML file at ``path`` (its ``_BASE_`` chain first),
    then ``overrides`` (``[(dotted.key, value), ...]`` or a ``{dotted.key: value}`` dict; Python values or
    command-line text)."""
    overrides = list(overrides.items() if isinstance(overrides, dict) else overrides)
    cfg, derived = file_config(path)
    cfg = _finish(cfg, overrides, os.path.splitext(os.path.basename(path))[0] if path else "default")
    check_derived(cfg, derived, path)
    return cfg


def with_overrides(cfg, overrides, name=None):
    """A new frozen config: ``cfg`` with ``overrides`` (a ``{dotted.key: value}`` dict or
    ``[(key, value), ...]``; values are Python values or command-line text) applied and checked; ``name``
    renames it (the run folder ``{output_path}/{name}`` follows)."""
    items = overrides.items() if isinstance(overrides, dict) else overrides
    return _finish(editable(cfg), items, name or cfg.name)


def _finish(cfg, overrides, name):
    apply_overrides(cfg, list(overrides))
    cfg["name"] = name
    return freeze(cfg, validate(cfg))


def parsed(cfg):
    """The ParsedSections (lib.config.validation) of a loaded ``cfg``: its sections as parsed at load."""
    sections = parsed_sections(cfg)
    if sections is None:
        raise ConfigError("this configuration holds no parsed sections: it was restored from saved values, not "
                          "loaded (lib.config.load_config or with_overrides)")
    return sections


def test_pyramid(cfg):
    """``(levels, images per device per level)`` of ``cfg.TEST``: as parsed at load, or, for a config restored
    from an export's saved values (never validated again: ``lib.config.core.restore``), parsed here."""
    sections = parsed_sections(cfg)
    if sections is not None:
        return sections.test_levels, sections.test_batch_images
    from lib.config.validation import images_per_device
    from lib.scales import pyramid

    levels = pyramid(cfg.TEST, "TEST")
    return levels, images_per_device(cfg.TEST, len(levels))


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
