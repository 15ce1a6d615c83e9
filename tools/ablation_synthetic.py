"""Ablation on the synthetic dataset at a matched budget of iterations (spec section 9): single-scale
full-image training vs SNIPER with positive chips only vs SNIPER with negative chips.

    python tools/ablation_synthetic.py --cfg FILE [--set KEY VALUE ...] [--iterations N]
        [--out DIR] [--rpn-epochs N] [--variants single,sniper,sniper_neg] [--baseline-test own|shared]
        [--single-set KEY VALUE ...]

Long-running (hours on 2 CPU cores at the default budget): not a test. Every variant trains in its
own folder ``{out}/{variant}`` and every stage is resumable (lib/pipeline/neg_chips.py), so an
interrupted run continues where it stopped when started again with the same arguments.

Variants, each only config overrides of ``--cfg`` + ``--set``:
- single: one scale [800, 1333] (shorter side, longer-side cap), every box valid (range [-1, -1]), and a
  chip larger than any resized image (TRAIN.CHIP_SIZE 1344, the next multiple of 32 above 1333): the
  greedy cover then makes exactly one chip per image, the whole image, so this is full-image training
  (padded to 1344 x 1344; the pixel table shows both the padded input and the image content). Tested
  at its own scale [800, 1333] (``--baseline-test own``) or at the SNIPER test scales (``shared``).
  A 1344 x 1344 chip costs about 3x the time of a batch's share of 512 x 512 chips; ``--single-set
  TRAIN.BATCH_IMAGES N`` gives this variant alone a smaller batch (the table shows chips per iteration).
- sniper: the config's SNIPER scales, positive chips only (TRAIN.USE_NEG_CHIPS false).
- sniper_neg: SNIPER with negative chips, via the RPN -> proposals -> SNIPER pipeline (the RPN's
  ``--rpn-epochs`` epochs are extra, reported as "RPN iters").

Budget: TRAIN.end_epoch of a variant is ``--iterations`` divided by its iterations per epoch (epoch 0
as the loader mines it), rounded, at least 1; the learning rate steps at ``--lr-step-fraction`` of the
schedule and the warm-up (iterations) is the config's. The table reports the iterations actually run.
Pixels per epoch are those of lib/pixel_budget.py (one epoch as the loader samples it), relative
to the single-scale variant's image content, i.e. every training image resized to 800 x 1333.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import logging
import os
import sys

import numpy as np

from lib.config import ConfigError, add_config_arguments, load_config
from lib.config.core import parse_cli_overrides
from lib.logger import report_user_errors, setup_logging
from lib.pipeline.neg_chips import (DEFAULT_RPN_EPOCHS, NegChipPipeline, eval_stage, evaluated, run_stage,
                                    summary_path, train_stage)
from lib.pixel_budget import BASELINE_SCALE, epoch_pixel_budget
from lib.run.checkpoint import checkpoint_prefix, load_progress, params_path
from lib.start_checks import check_training_start

logger = logging.getLogger(__name__)

VARIANTS = ("single", "sniper", "sniper_neg")
TITLES = {"single": "(a) single scale, full image", "sniper": "(b) SNIPER, positive chips",
          "sniper_neg": "(c) SNIPER, + negative chips"}
SINGLE_CHIP_SIZE = 1344  # > 1333, the longer side of every image at the single scale; a multiple of 32
AP_KEYS = ("AP", "APs", "APm", "APl")


def single_scale_overrides(test_at_own_scale):
    """Full-image training at one resolution, as config overrides (see the module docstring)."""
    scale = json.dumps([BASELINE_SCALE])
    overrides = [("TRAIN.SCALES", scale), ("TRAIN.VALID_RANGES", "[[-1, -1]]"),
                 ("TRAIN.NEG_CHIP_MIN_PROPOSALS", "[0]"), ("TRAIN.CHIP_SIZE", str(SINGLE_CHIP_SIZE)),
                 ("TRAIN.USE_NEG_CHIPS", "false"), ("dataset.proposal", "")]
    if test_at_own_scale:
        # one level: TEST.BATCH_IMAGES needs one count (the configs give one per scale); one image per canvas
        overrides += [("TEST.SCALES", scale), ("TEST.VALID_RANGES", "[[-1, -1]]"), ("TEST.BATCH_IMAGES", "1")]
    return overrides


def iterations_per_epoch(cfg):
    """Batches of epoch 0 exactly as the trainer's loader mines it (same seed), without building chips."""
    from lib.contexts import parse_contexts
    from lib.data import ChipLoader
    from lib.dataset import load_roidb

    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    with ChipLoader(roidb, cfg, cfg.TRAIN.BATCH_IMAGES, num_ctx=len(parse_contexts(cfg.gpus)),
                    rpn_only=cfg.TRAIN.ONLY_PROPOSAL, num_workers=0) as loader:
        return loader.num_batches


def pixels_per_epoch(cfg, seed):
    from lib.dataset import load_roidb

    roidb, _ = load_roidb(cfg, cfg.dataset.image_set, training=True)
    return epoch_pixel_budget(roidb, cfg, np.random.default_rng(seed))


def schedule(iterations, per_epoch, lr_step_fraction):
    """(end_epoch, schedule overrides) spending about ``iterations`` at ``per_epoch`` batches an epoch."""
    epochs = max(1, int(round(iterations / per_epoch)))
    return epochs, [("TRAIN.end_epoch", str(epochs)), ("TRAIN.begin_epoch", "0"),
                    ("TRAIN.lr_step", f"{epochs * lr_step_fraction:.4f}")]


def updates_done(cfg):
    """Iterations the finished training run of ``cfg`` made (from its last checkpoint's progress)."""
    return load_progress(checkpoint_prefix(cfg), cfg.TRAIN.end_epoch).get("num_update")


def read_stats(path):
    with open(path) as f:
        return json.load(f).get("stats", {})


class Ablation:
    def __init__(self, args):
        self.args = args
        self.common = parse_cli_overrides(args.set)
        self.single = parse_cli_overrides(args.single_set)
        # a bad key or value fails here, before any work
        load_config(args.cfg, self.common)
        load_config(args.cfg, self.common + single_scale_overrides(True) + self.single)

    def variant_overrides(self, variant, extra=()):
        return self.common + [("output_path", os.path.join(self.args.out, variant))] + list(extra)

    def variant_extra(self, variant):
        """The overrides that make a training variant (single or sniper) of the config."""
        if variant == "single":
            return single_scale_overrides(self.args.baseline_test == "own") + self.single
        return [("TRAIN.USE_NEG_CHIPS", "false"), ("dataset.proposal", "")]

    def check_start(self):
        """What can fail before any work, nothing written yet (lib.start_checks, as main_train.py): every
        variant's training start; the stages resume, so earlier epochs in its folder are fine."""
        for variant in self.args.variants:
            if variant == "sniper_neg":
                NegChipPipeline(self.args.cfg, self.variant_overrides(variant), self.args.rpn_epochs).check_start()
            else:
                cfg = load_config(self.args.cfg, self.variant_overrides(variant, self.variant_extra(variant)))
                check_training_start(cfg, resume=True)

    def run(self, variant):
        logger.info("variant %s: %s", variant, TITLES[variant])
        if variant == "sniper_neg":
            return self._run_neg()
        extra = self.variant_extra(variant)
        probe = load_config(self.args.cfg, self.variant_overrides(variant, extra))
        per_epoch = iterations_per_epoch(probe)
        epochs, timing = schedule(self.args.iterations, per_epoch, self.args.lr_step_fraction)
        cfg = load_config(self.args.cfg, self.variant_overrides(variant, extra + timing))
        checkpoint = params_path(checkpoint_prefix(cfg), epochs)
        run_stage(f"{variant} train", checkpoint, [], train_stage(cfg),
                  f"{epochs} epochs of {per_epoch} iterations")
        test_cfg = load_config(self.args.cfg, self.variant_overrides(variant, extra + timing + [
            ("TEST.MODEL", checkpoint), ("TEST.EXTRACT_PROPOSALS", "false")]))
        summary = run_stage(f"{variant} eval", summary_path(test_cfg), [checkpoint], eval_stage(test_cfg),
                            f"testing {checkpoint}", done=evaluated(checkpoint))
        return self._row(variant, cfg, epochs, summary)

    def _run_neg(self):
        args = self.args
        rpn_timing = [("TRAIN.lr_step", f"{args.rpn_epochs * args.lr_step_fraction:.4f}")]
        first = NegChipPipeline(args.cfg, self.variant_overrides("sniper_neg"), args.rpn_epochs, rpn_timing)
        first.run_rpn()
        first.run_proposals()
        per_epoch = iterations_per_epoch(first.sniper_cfg)  # with the negative chips of the proposals
        epochs, timing = schedule(args.iterations, per_epoch, args.lr_step_fraction)
        pipeline = NegChipPipeline(args.cfg, self.variant_overrides("sniper_neg", timing), args.rpn_epochs,
                                   rpn_timing)
        outputs = pipeline.run(evaluate=True)
        row = self._row("sniper_neg", pipeline.sniper_cfg, epochs, outputs["eval"])
        row["rpn_iterations"] = updates_done(pipeline.rpn_cfg)
        return row

    def _row(self, variant, cfg, epochs, summary):
        totals = pixels_per_epoch(cfg, self.args.seed)
        from lib.contexts import parse_contexts

        batch = cfg.TRAIN.BATCH_IMAGES * len(parse_contexts(cfg.gpus))
        return {"variant": variant, "epochs": epochs, "iterations": updates_done(cfg), "rpn_iterations": 0,
                "batch": batch,
                "positive_chips": int(totals["positive"].sum()), "negative_chips": int(totals["negative"].sum()),
                "input_pixels": int(totals["chip_pixels"]), "content_pixels": int(totals["content_pixels"]),
                "baseline_pixels": int(totals["baseline_pixels"]),
                "stats": {key: read_stats(summary).get(key) for key in AP_KEYS}, "summary": summary}


def format_table(rows):
    """The ablation table: AP columns from the COCO stats, pixels per epoch relative to full images
    at 800 x 1333 (the single-scale variant's content)."""
    header = (f"{'variant':<32}{'batch':>6}{'epochs':>7}{'iters':>7}{'RPN iters':>10}{'chips/ep':>9}{'neg/ep':>7}"
              f"{'input Mpx/ep':>13}{'x(a)':>6}{'content Mpx/ep':>15}{'x(a)':>6}"
              + "".join(f"{name:>7}" for name in ("AP", "AP_S", "AP_M", "AP_L")))
    lines = [header, "-" * len(header)]
    for row in rows:
        baseline = max(row["baseline_pixels"], 1)
        aps = "".join(f"{row['stats'][k]:>7.3f}" if row["stats"].get(k) is not None else f"{'-':>7}" for k in AP_KEYS)
        chips = row["positive_chips"] + row["negative_chips"]
        lines.append(f"{TITLES[row['variant']]:<32}{row['batch']:>6}{row['epochs']:>7}{row['iterations'] or 0:>7}"
                     f"{row['rpn_iterations'] or 0:>10}{chips:>9}{row['negative_chips']:>7}"
                     f"{row['input_pixels'] / 1e6:>13.1f}{row['input_pixels'] / baseline:>6.2f}"
                     f"{row['content_pixels'] / 1e6:>15.1f}{row['content_pixels'] / baseline:>6.2f}{aps}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, cfg_help="config YAML, e.g. configs/faster/sniper_synthetic_tiny.yml; --set "
                                          "applies to every variant")
    parser.add_argument("--iterations", type=int, default=3000, help="training iterations per variant")
    parser.add_argument("--out", default="output/ablation_synthetic", help="output folder")
    parser.add_argument("--single-set", action="extend", nargs="+", default=[], metavar="KEY VALUE",
                        help="overrides for the single-scale variant only, e.g. TRAIN.BATCH_IMAGES 2")
    parser.add_argument("--rpn-epochs", type=int, default=DEFAULT_RPN_EPOCHS, help="RPN epochs of sniper_neg")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma separated subset of {VARIANTS}")
    parser.add_argument("--baseline-test", choices=("own", "shared"), default="own",
                        help="test the single-scale variant at 800x1333 (own) or at the config's TEST.SCALES")
    parser.add_argument("--lr-step-fraction", type=float, default=5.33 / 7,
                        help="lr step at this fraction of each schedule (default 5.33/7, the paper's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pixel accounting's epoch draw")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--variants: unknown {unknown or 'empty list'}; choose from {VARIANTS}")
    if args.iterations < 1:
        parser.error(f"--iterations must be >= 1, got {args.iterations}")
    if not 0 < args.lr_step_fraction < 1:
        parser.error(f"--lr-step-fraction must be in (0, 1) (the step lies inside the run), got {args.lr_step_fraction}")
    args.variants = [v for v in VARIANTS if v in variants]
    return args


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    args = parse_args(argv)
    try:
        ablation = Ablation(args)
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
    ablation.check_start()
    setup_logging(args.out, name="ablation")
    logger.info("ablation of %s on variants %s at %d iterations each, overrides %s", args.cfg, args.variants,
                args.iterations, args.set)
    rows = [ablation.run(variant) for variant in args.variants]
    table = format_table(rows)
    with open(os.path.join(args.out, "ablation.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "ablation.txt"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
