"""A run folder that describes itself, and models named by a run folder or a ``.params`` file.

Training writes ``config.yaml`` (the effective config, loadable by ``--cfg``) into the run folder
``{output_path}/{name}``, and into each checkpoint's companion ``PREFIX-EPOCH.progress.json`` a ``model``
entry with what inference needs: class names, dataset category ids, NUM_CLASSES, the network (``symbol``,
RPN-only or not), the test scales and valid ranges, pixel means and channel order, and where the
training's working directory lies relative to the run folder (``workdir``).

``load_run(model)`` turns a run folder (its newest checkpoint of ``TRAIN.model_prefix``) or a
``.params`` file into ``Run(cfg, params, info)``: the saved config, its relative paths resolved against
the run folder (through ``workdir``) rather than the current directory, ``output_path``/``name`` pointing
at the run folder itself (results land in it) and ``TEST.MODEL`` the checkpoint; then the caller's
overrides (test-time keys, relative to the current directory). The class names are the metadata's, handed
to the Detector as they are (the config is not rewritten with them).
"""
import json
import os
import re
import sys
from collections import namedtuple

from lib.atomic import atomic_open
from lib.config import ConfigError, add_config_arguments, load_config, with_overrides
from lib.config.core import dump_config, flat_config, parse_cli_overrides
from lib.contexts import device_count
from lib.run.checkpoint import CheckpointError, checkpoint_prefix, output_dir, params_epochs, params_path, \
    progress_path
from lib.run.lock import RunFolderError

CONFIG_FILE = "config.yaml"
BEST_FILE = "best.json"  # the best epoch of evaluation while training (lib/train/evaluation.py)
MODEL_KEY = "model"  # the entry of a checkpoint's progress.json
# Keys holding file system paths: resolved against the run folder when a run's config is loaded.
PATH_KEYS = ("dataset.root_path", "dataset.dataset_path", "dataset.proposal", "network.pretrained",
             "TEST.PROPOSAL_SAVE_PATH", "dataset.CLASSES_FILE")
# Keys a resumed run may change (docs/training.md#resuming): they extend the schedule, or change logging, evaluation
# cadence, checkpoint keeping and the loaders' machinery, not what its checkpoints were trained on or how its
# evaluations are scored; ``name``/``output_path`` locate the run folder, ``TEST.MODEL``/``TEST_EPOCH`` serve main_test.
# ``gpus`` may name other devices, as many (the batch is TRAIN.BATCH_IMAGES per device).
RESUME_MAY_CHANGE = ("TRAIN.end_epoch", "TRAIN.lr_step", "TRAIN.begin_epoch", "TRAIN.resume", "default.frequent",
                     "TRAIN.TENSORBOARD", "TRAIN.EVAL_EVERY", "TRAIN.EVAL_METRIC", "TRAIN.EARLY_STOP",
                     "TRAIN.KEEP_CHECKPOINTS",
                     "TRAIN.NUM_PROCESS", "TRAIN.LOADER_TIMEOUT", "TRAIN.STALL_WARN", "TRAIN.IMAGE_CACHE_MB",
                     "TEST.NUM_PROCESS", "TEST.LOADER_TIMEOUT", "TEST.STALL_WARN", "TEST.USE_CACHE", "TEST.MODEL",
                     "TEST.TEST_EPOCH", "name", "output_path")
_PARAMS_NAME = re.compile(r"(?P<prefix>.+)-(?P<epoch>\d{4})\.params")

Run = namedtuple("Run", "cfg params info")


class ModelError(CheckpointError):
    """A model path that is not a usable run folder or checkpoint (message says what to pass instead)."""


def write_run_config(cfg):
    """``config.yaml`` in the run folder: the effective config (its name included), loadable by ``--cfg``."""
    path = os.path.join(output_dir(cfg), CONFIG_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_open(path, "w") as f:
        f.write(f"# The effective config of run {cfg.name}. Relative paths are relative to the directory training\n"
                f"# ran in; main_test.py / demo.py --model resolve them against this folder.\n")
        f.write(dump_config(cfg))
    return path


def model_info(cfg, dataset, rpn_only):
    """The ``model`` entry of a checkpoint's companion JSON: what inference needs without the dataset."""
    classes = list(dataset.classes)
    category_ids = dataset.category_ids
    return {"symbol": cfg.symbol, "rpn_only": bool(rpn_only), "NUM_CLASSES": len(classes), "classes": classes,
            "category_ids": [int(c) for c in category_ids],
            "TEST.SCALES": list(cfg.TEST.SCALES), "TEST.VALID_RANGES": [list(r) for r in cfg.TEST.VALID_RANGES],
            "PIXEL_MEANS": list(cfg.network.PIXEL_MEANS), "CHANNEL_ORDER": cfg.network.CHANNEL_ORDER,
            "workdir": os.path.relpath(os.getcwd(), os.path.abspath(output_dir(cfg)))}


def companion_path(params):
    """``PREFIX-EPOCH.progress.json`` of ``PREFIX-EPOCH.params``, or None for a file not so named."""
    match = _PARAMS_NAME.fullmatch(params)
    return progress_path(match.group("prefix"), int(match.group("epoch"))) if match else None


def read_model_info(params):
    """The ``model`` entry saved with checkpoint ``params``, or None for a checkpoint without one."""
    path = companion_path(params)
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            info = json.load(f).get(MODEL_KEY)
    except (OSError, ValueError, AttributeError) as err:
        raise ModelError(f"{path} cannot be read as the checkpoint's metadata: {err}") from None
    if not isinstance(info, dict):
        return None
    missing = [key for key in ("symbol", "rpn_only", "NUM_CLASSES", "classes") if key not in info]
    if missing:
        raise ModelError(f"{path}: the '{MODEL_KEY}' metadata lacks {', '.join(missing)}")
    if len(info["classes"]) != info["NUM_CLASSES"]:
        raise ModelError(f"{path}: the '{MODEL_KEY}' metadata names {len(info['classes'])} classes for "
                         f"NUM_CLASSES {info['NUM_CLASSES']}")
    return info


def checkpoint_category_ids(source, num_classes):
    """The category id results are written with, per label, for a Detector loaded from ``source``: the run
    record's (COCO's original ids), else the labels themselves (a checkpoint without metadata, arrays)."""
    info = read_model_info(source) if isinstance(source, str) else None
    return list((info or {}).get("category_ids") or range(num_classes))


def checkpoint_classes(params, cfg):
    """The class names (background first) of detection checkpoint ``params`` used with the config ``cfg``,
    resolved once by an entry point that has a checkpoint file and a config: the run record's (the
    checkpoint's metadata), else, for a checkpoint from before checkpoints carried metadata, the config's
    (``lib.dataset.config_classes``)."""
    from lib.dataset import config_classes

    info = read_model_info(params)
    if info is not None:
        return list(info["classes"])
    classes = config_classes(cfg)
    if classes is None:
        raise ModelError(f"{params} has no metadata naming its classes and the test set's annotations "
                         f"are not on disk: set dataset.NUM_CLASSES (background included) to use it")
    return classes


def newest_checkpoint(folder, prefix):
    """The ``{prefix}-NNNN.params`` of the highest epoch in ``folder``, or None."""
    epochs = params_epochs(os.path.join(folder, prefix))
    return params_path(os.path.join(folder, prefix), epochs[-1]) if epochs else None


def best_checkpoint(folder):
    """The checkpoint ``{folder}/best.json`` names (evaluation while training), or None without one, when
    no evaluation had a defined metric (``"best": null``) or when it names a file no longer there."""
    path = os.path.join(folder, BEST_FILE)
    try:
        with open(path) as f:
            best = json.load(f)["best"]
        if best is None:
            return None
        name = best["params"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"{path} cannot be read as the run's best epoch: {err}") from None
    params = os.path.join(folder, os.path.basename(str(name)))
    return params if os.path.isfile(params) else None


def find_checkpoint(model, prefix=None):
    """``model`` (a run folder, meaning its best epoch when training evaluated, else its newest checkpoint,
    or a ``.params`` file) -> (params path,
    run folder); a folder's checkpoints are ``prefix`` (default: ``TRAIN.model_prefix`` of its config.yaml)."""
    if os.path.isdir(model):
        config = os.path.join(model, CONFIG_FILE)
        if prefix is None and not os.path.isfile(config):
            raise ModelError(f"{model} has no {CONFIG_FILE} (not a run folder, or a run from before they "
                             f"described themselves): pass --cfg FILE with it")
        prefix = prefix or load_config(config).TRAIN.model_prefix
        params = best_checkpoint(model) or newest_checkpoint(model, prefix)
        if params is None:
            raise ModelError(f"{model} holds no checkpoint {prefix}-NNNN.params yet")
        return params, model
    if os.path.isfile(model) and model.endswith(".params"):
        return model, os.path.dirname(model) or "."
    raise ModelError(f"model {model}: neither a run folder nor a .params file")


def _missing_info(params, what):
    return ModelError(f"{params} has no {what} (checkpoint written before run folders described themselves): "
                      f"pass --cfg FILE with the config it was trained with (from Python: "
                      f"Detector.from_config(cfg, path, classes))")


def resolved_paths(cfg, base):
    """``[(key, path)]``: the relative ``PATH_KEYS`` of ``cfg`` joined to ``base`` (a run's working directory)."""
    fixed = []
    for key in PATH_KEYS:
        section, name = key.split(".")
        value = cfg[section][name]
        if value and not os.path.isabs(value):
            fixed.append((key, os.path.join(base, value)))
    return fixed


def _shown(value):
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _trained_in(prefix):
    """The training's working directory recorded with the newest checkpoint of ``prefix`` whose metadata
    reads (a damaged one is resume's to skip), or None."""
    for epoch in reversed(params_epochs(prefix)):
        try:
            info = read_model_info(params_path(prefix, epoch))
        except ModelError:
            continue
        if info is not None and "workdir" in info:
            return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(prefix)), info["workdir"]))
    return None


def check_resume_config(cfg):
    """Before continuing the checkpoints of ``cfg``'s run folder (a resume; a start at TRAIN.begin_epoch > 0):
    its ``config.yaml`` (the settings they were trained with) must be ``cfg`` but for ``RESUME_MAY_CHANGE``,
    paths compared as the files they name (the saved ones relative to the training's working directory, taken
    as the current one without metadata); else one RunFolderError naming every key that differs, before
    anything is written."""
    folder = output_dir(cfg)
    path = os.path.join(folder, CONFIG_FILE)
    advice = ("start a new run (another name or output_path; network.pretrained can take its checkpoint), or "
              "--overwrite to move this run's epochs aside")
    if not os.path.isfile(path):
        raise RunFolderError(f"{folder} holds checkpoints but no {CONFIG_FILE}: --resume cannot check that they "
                             f"were trained with these settings; {advice}")
    try:
        saved = load_config(path)
    except ConfigError as err:
        raise RunFolderError(f"{path} (the settings of the checkpoints --resume continues) cannot be loaded: "
                             f"{err}; {advice}") from None
    was = flat_config(saved)
    was.update((key, os.path.normpath(value))
               for key, value in resolved_paths(saved, _trained_in(checkpoint_prefix(cfg)) or os.getcwd()))
    now = flat_config(cfg)
    now.update((key, os.path.normpath(os.path.abspath(value))) for key, value in resolved_paths(cfg, os.getcwd()))
    differ = [key for key in now if key not in RESUME_MAY_CHANGE and now[key] != was.get(key)
              and not (key == "gpus" and device_count(now[key]) == device_count(was.get(key)))]  # other ids, as many
    if differ:
        changes = "; ".join(f"{key} {_shown(was.get(key))} -> {_shown(now[key])}" for key in differ)
        raise RunFolderError(f"--resume: the checkpoints in {folder} were trained with other settings "
                             f"({path}): {changes}; put them back (keys that may change on resume: "
                             f"docs/training.md#resuming), or {advice}")


def check_run_record(cfg):
    """``check_resume_config`` at a start that may continue checkpoints (main_train.py --resume, the pipelines'
    stages, whose finished ones are skipped), before its log file: when the folder holds checkpoints of
    ``cfg``'s prefix and its ``config.yaml`` is theirs (a pipeline's stages share the folder, the record is the
    last started stage's). The trainer checks again whatever it resumes."""
    path = os.path.join(output_dir(cfg), CONFIG_FILE)
    if not params_epochs(checkpoint_prefix(cfg)) or not os.path.isfile(path):
        return
    try:
        prefix = load_config(path).TRAIN.model_prefix
    except ConfigError:
        prefix = cfg.TRAIN.model_prefix  # check_resume_config names the unreadable record
    if prefix == cfg.TRAIN.model_prefix:
        check_resume_config(cfg)


def load_run(model, overrides=()):
    """``Run(cfg, params, info)`` of a run folder or ``.params`` file (see the module docstring; the class
    names are ``info["classes"]``, of the detection network unless ``info["rpn_only"]``);
    ``overrides``: ``[(key, value), ...]`` or ``{key: value}`` applied last."""
    params, folder = find_checkpoint(os.fspath(model))
    folder = os.path.abspath(folder)
    info = read_model_info(params)
    if info is None:
        raise _missing_info(params, f"metadata (a PREFIX-NNNN.progress.json beside it with '{MODEL_KEY}')")
    config = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(config):
        raise _missing_info(params, f"{CONFIG_FILE} beside it")
    cfg = load_config(config)
    fixed = resolved_paths(cfg, os.path.normpath(os.path.join(folder, info.get("workdir", "."))))
    fixed += [("output_path", os.path.dirname(folder)), ("TEST.MODEL", os.path.abspath(params))]
    items = list(overrides.items() if isinstance(overrides, dict) else overrides)
    return Run(with_overrides(cfg, fixed + items, name=os.path.basename(folder)), os.path.abspath(params), info)


# -- the command line of main_test.py and demo.py ------------------------------------------------------
def add_model_arguments(parser):
    """``--model RUN_FOLDER|FILE.params`` beside ``--cfg``/``--set`` (then optional)."""
    add_config_arguments(parser, required=False,
                         cfg_help="YAML config (not needed with --model RUN_FOLDER or a checkpoint of one: its "
                                  "config.yaml is used; with --model an older checkpoint's config)")
    parser.add_argument("--model", default=None,
                        help="a run folder (its best epoch when training evaluated, else its newest checkpoint) or "
                             "a .params file of one; without --cfg its config.yaml, classes and class count are "
                             "used, --set overrides test-time keys")


def config_from_model_arguments(args):
    """The config of parsed ``--cfg``/``--set``/``--model`` (``TEST.MODEL`` the model's checkpoint); a
    bad file, key, value or model exits with a one-line message."""
    try:
        overrides = parse_cli_overrides(args.set)
        if args.model is None:
            if not args.cfg:
                raise ModelError("give --model RUN_FOLDER (or a .params file of one) or --cfg FILE")
            cfg = load_config(args.cfg, overrides)
        elif args.cfg:  # an explicit config: the checkpoint's metadata names the classes when it has them
            cfg = load_config(args.cfg, overrides)
            params, _ = find_checkpoint(args.model, cfg.TRAIN.model_prefix)
            cfg = with_overrides(cfg, {"TEST.MODEL": params})
        else:
            cfg = load_run(args.model, overrides).cfg
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    except ModelError as err:
        sys.exit(f"model error: {err}")
    return cfg
