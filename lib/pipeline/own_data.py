"""The own-data comparison of issue 25 (front: tools/compare_own_data.py): on each given set, the config as it is
against the config tools/fit_scales.py writes from it, and on sets with images without objects those images
dropped (the reference) against kept as sources of negative chips (TRAIN.EMPTY_IMAGES negative); every run
trained for the same epochs and tested, one table row each: AP, AP50, AP_S, chips per epoch, wall time.

Sets (``DataSet.parse``): ``NAME`` is the config's own dataset, ``NAME=FOLDER`` a COCO-layout folder with the
image sets ``train`` and ``val`` (as tools/make_variant_set.py writes them). The fitted config of a set is
``{out}/{NAME}/{config stem}_fitted.yml``: ``lib.scales_fit.fit_dataset`` with tools/fit_scales.py's defaults,
written once; the common overrides apply to both configs. Rows (``plan_rows``), each in its own run folder
under ``{out}/{NAME}/{config}[_{mode}]/``:

- plain (sets not named as having empty images): the config trained for ``epochs`` (its lr steps at the same
  fractions of the run), then tested on the last epoch;
- ``drop`` / ``negative`` (sets with empty images): the negative chip pipeline (RPN, proposals, SNIPER with
  negative chips, test: ``lib.pipeline.neg_chips.NegChipPipeline``) with TRAIN.EMPTY_IMAGES drop / negative.

Every stage is resumable (lib.pipeline.neg_chips), and a finished row's result is kept in its folder
(``comparison_row.json``, wall time included), so a stopped comparison continues where it stopped when started
again; the wall time of a row that was resumed counts from its restart. Each row is tested under its own
config's TEST keys: on a set with more than 100 objects in an image the fitted config scores more detections
(TEST.EVAL_MAX_DETS 0, the maxDets column); common overrides ``TEST.EVAL_MAX_DETS 0 TEST.MAX_PER_IMAGE N`` score
every row alike.
"""
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass

from lib.atomic import write_json
from lib.benchmarking import markdown_table
from lib.config import ConfigError, load_config, parsed, with_overrides
from lib.contexts import parse_contexts
from lib.evaluation.coco_summary import defined, scored_max_dets
from lib.pipeline.neg_chips import (DEFAULT_RPN_EPOCHS, NegChipPipeline, eval_stage, evaluated, run_stage,
                                    summary_path, train_stage)
from lib.run.checkpoint import checkpoint_prefix, output_dir, params_path
from lib.start_checks import check_training_start
from lib.train.progress import format_duration

logger = logging.getLogger(__name__)

CONFIGS = ("embedded", "fitted")
EMPTY_MODES = ("drop", "negative")  # TRAIN.EMPTY_IMAGES of the rows of a set with empty images
ROW_FILE = "comparison_row.json"
STATS = ("AP", "AP50", "APs")


@dataclass(frozen=True)
class DataSet:
    name: str
    folder: str = ""  # "": the config's own dataset

    @classmethod
    def parse(cls, text):
        """``NAME`` or ``NAME=FOLDER`` (module docstring)."""
        name, _, folder = text.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
            raise ValueError(f"--data {text!r}: NAME or NAME=FOLDER, NAME of letters, digits, '_', '-', '.'")
        return cls(name, folder)

    def overrides(self):
        if not self.folder:
            return []
        return [("dataset.dataset", "coco"), ("dataset.dataset_path", self.folder), ("dataset.image_set", "train"),
                ("dataset.test_image_set", "val")]


@dataclass(frozen=True)
class Row:
    data: DataSet
    config: str  # one of CONFIGS
    empty: str = ""  # "": plain training; one of EMPTY_MODES: the negative chip pipeline with it

    @property
    def label(self):
        return f"{self.config}_{self.empty}" if self.empty else self.config


def plan_rows(sets, configs=CONFIGS, empty_sets=()):
    """The rows, set after set: each config plain, or on a set in ``empty_sets`` with each of EMPTY_MODES."""
    return [Row(data, config, empty) for data in sets for config in configs
            for empty in (EMPTY_MODES if data.name in empty_sets else ("",))]


def chips_per_epoch(metrics_path, chips_per_batch):
    """Mean chips per epoch of a training run from its metrics.jsonl: every epoch's batches (its records'
    ``batches``; the last batch, padded, counts whole) x ``chips_per_batch``. NaN without records."""
    batches = {}
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            if "eval" not in record:
                batches[record["epoch"]] = record["batches"]
    return chips_per_batch * sum(batches.values()) / len(batches) if batches else math.nan


def row_result(row, cfg, summary_file, seconds):
    """A finished row as a dict: the trained ``cfg``'s pyramid, epochs and chips per epoch, the test summary's
    STATS (None where absent or undefined: COCO's -1, NaN), the maxDets it was scored at and the wall time."""
    with open(summary_file) as f:
        stats = json.load(f).get("stats") or {}
    chips = cfg.TRAIN.BATCH_IMAGES * len(parse_contexts(cfg.gpus))
    return {"set": row.data.name, "config": row.config, "empty": row.empty, "scales": list(cfg.TRAIN.SCALES),
            "epochs": cfg.TRAIN.end_epoch,
            **{name: stats[name] if defined(stats.get(name)) else None for name in STATS},
            "max_dets": scored_max_dets(cfg.TEST),
            "chips_per_epoch": chips_per_epoch(os.path.join(output_dir(cfg), "metrics.jsonl"), chips),
            "seconds": seconds, "summary": summary_file}


def format_table(results):
    """The comparison as a Markdown table (one line per row result)."""
    header = ["set", "config", "empty images", "scales", "epochs", "AP", "AP50", "AP_S", "maxDets", "chips/epoch",
              "wall time"]
    rows = [[r["set"], r["config"], r["empty"] or "-", ", ".join(f"{s:g}" for s in r["scales"]), r["epochs"],
             *(r[name] for name in STATS), r["max_dets"], r["chips_per_epoch"], format_duration(r["seconds"])]
            for r in results]
    return markdown_table(header, rows, [None, None, None, None, "d", ".3f", ".3f", ".3f", "d", ".0f", None])


class OwnDataComparison:
    """The rows of the comparison (module docstring) under ``out``; ``run()`` -> their results in order."""

    def __init__(self, cfg_file, overrides, sets, out, epochs=0, configs=CONFIGS, empty_sets=(),
                 rpn_epochs=DEFAULT_RPN_EPOCHS):
        names = [data.name for data in sets]
        if not sets or len(set(names)) != len(names):
            raise ValueError(f"--data: give one or more sets with distinct names, got {names}")
        missing = [data.folder for data in sets if data.folder and not os.path.isdir(data.folder)]
        if missing:
            raise FileNotFoundError(f"--data: no folder {missing[0]} (make one with tools/make_variant_set.py)")
        unknown = sorted(set(configs) - set(CONFIGS)) + sorted(set(empty_sets) - set(names))
        if unknown or not configs:
            raise ValueError(f"unknown {unknown or 'empty list of configs'}: configs are {', '.join(CONFIGS)}, "
                             f"empty-image sets among {', '.join(names)}")
        self.cfg_file, self.overrides, self.out, self.rpn_epochs = cfg_file, list(overrides), out, rpn_epochs
        base = load_config(cfg_file, self.overrides)  # a bad key or value fails here, before any work
        self.epochs = epochs or base.TRAIN.end_epoch
        steps = [step * self.epochs / base.TRAIN.end_epoch for step in parsed(base).lr_step_epochs]
        self.schedule = [("TRAIN.begin_epoch", "0"), ("TRAIN.end_epoch", str(self.epochs)),
                         ("TRAIN.lr_step", ",".join(f"{step:.4f}" for step in steps))]
        self.rows = plan_rows(sets, configs, empty_sets)

    def config_file(self, row):
        """The YAML a row trains: the config, or the set's fitted config (fitted and written first)."""
        if row.config == "embedded":
            return self.cfg_file
        from lib.scales_fit import fit_dataset, report, write_fitted_config

        path = self.fitted_config(row)
        if not os.path.isfile(path):
            cfg = load_config(self.cfg_file, self.overrides + row.data.overrides())
            fit = fit_dataset(cfg)
            logger.info("set %s: the fit of %s\n%s", row.data.name, self.cfg_file, report(fit))
            write_fitted_config(self.cfg_file, cfg, fit, path)
        return path

    def row_overrides(self, row):
        folder = os.path.join(self.out, row.data.name, row.label)
        return self.overrides + row.data.overrides() + self.schedule + [("output_path", folder)]

    def check_start(self):
        """What can fail before any work, before anything is written (lib.start_checks), for every row not
        yet done: output folder, devices, run folder, class count (and the negative chip pipeline's own
        checks). A fitted config not yet written is checked as the config it is fitted from: the fit changes
        scales and anchors, none of what is checked."""
        for row in self.rows:
            if os.path.isfile(self.kept_result(row)):
                continue
            fitted = row.config != "embedded" and os.path.isfile(self.fitted_config(row))
            cfg_file, overrides = self.fitted_config(row) if fitted else self.cfg_file, self.row_overrides(row)
            if row.empty:
                NegChipPipeline(cfg_file, overrides + [("TRAIN.EMPTY_IMAGES", row.empty)],
                                self.rpn_epochs).check_start()
            else:
                check_training_start(load_config(cfg_file, overrides), resume=True)  # the stages resume

    def kept_result(self, row):
        return os.path.join(self.out, row.data.name, row.label, ROW_FILE)

    def fitted_config(self, row):
        stem = os.path.splitext(os.path.basename(self.cfg_file))[0]
        return os.path.join(self.out, row.data.name, f"{stem}_fitted.yml")

    def run_row(self, row):
        """Train and test one row (or read its kept result); returns the result dict."""
        kept = self.kept_result(row)
        if os.path.isfile(kept):
            with open(kept) as f:
                result = json.load(f)
            if result["epochs"] != self.epochs:
                raise ConfigError(f"{kept}: that run trained {result['epochs']} epochs, not {self.epochs}: give "
                                  f"another output folder (--out) for another length")
            return result
        cfg_file, overrides = self.config_file(row), self.row_overrides(row)  # the fit is not the row's time
        logger.info("row %s / %s: training and testing", row.data.name, row.label)
        start = time.perf_counter()
        if row.empty:
            pipeline = NegChipPipeline(cfg_file, overrides + [("TRAIN.EMPTY_IMAGES", row.empty)], self.rpn_epochs)
            cfg, summary_file = pipeline.sniper_cfg, pipeline.run(evaluate=True)["eval"]
        else:
            cfg = load_config(cfg_file, overrides)
            checkpoint = params_path(checkpoint_prefix(cfg), cfg.TRAIN.end_epoch)
            run_stage("train", checkpoint, [], train_stage(cfg), f"{cfg.TRAIN.end_epoch} epochs of {cfg.name}")
            test_cfg = with_overrides(cfg, {"TEST.MODEL": checkpoint})
            summary_file = run_stage("test", summary_path(test_cfg), [checkpoint], eval_stage(test_cfg),
                                     f"testing {checkpoint}", done=evaluated(checkpoint))
        result = row_result(row, cfg, summary_file, time.perf_counter() - start)
        write_json(result, kept)
        return result

    def run(self, on_row=None):
        """Every row in order; ``on_row(results so far)`` after each (the front prints the table)."""
        results = []
        for row in self.rows:
            results.append(self.run_row(row))
            if on_row is not None:
                on_row(results)
        return results
