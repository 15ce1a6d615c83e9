"""Negative chip mining end to end (spec section 3): RPN -> proposals -> SNIPER with negative chips.

Stages, every one a set of config overrides of a config file + overrides (``{out}`` is
``{output_path}/{config name}``, ``{rpn}`` is ``{TRAIN.model_prefix}_rpn``):

1. rpn: the RPN alone (TRAIN.ONLY_PROPOSAL) for ``rpn_epochs`` epochs (2 in the paper), without
   negative chips, under its own model prefix so it never touches the SNIPER checkpoints:
   ``{out}/{rpn}-{N:04d}.params``.
2. proposals: that RPN over the training images at TEST.SCALES (TEST.EXTRACT_PROPOSALS):
   ``{out}/proposals/{rpn}-{N:04d}_{image_set}.npz``.
3. sniper: SNIPER with TRAIN.USE_NEG_CHIPS and dataset.proposal set to that file:
   ``{out}/{TRAIN.model_prefix}-{end_epoch:04d}.params``.
4. eval: the tester on that checkpoint: ``{out}/results/{test_image_set}/test_summary.json``.

``NegChipPipeline.check_start`` refuses a doomed run before any stage starts, as main_train.py's start
checks do. A stage whose output exists is skipped (a warning says so when the output is older than its
input: delete it to redo the stage), so a run that was stopped continues where it was; an unfinished training
stage resumes from its last complete epoch. ``rpn_overrides`` apply to stages 1 and 2 only. The RPN
keeps the main run's TRAIN.lr_step steps that fall within its epochs, as the reference's script keeps the
main schedule (its 5.33-epoch step is never reached in 2 epochs: no decay), unless ``rpn_overrides`` set one. The command line is tools/train_neg_chips.py
(scripts/train_neg_props_and_sniper.sh); tools/ablation_synthetic.py runs the stages too.
"""
import json
import logging
import os

from lib.config import load_config, parsed
from lib.run.checkpoint import checkpoint_prefix, output_dir, params_path
from lib.run.folder import check_run_record
from lib.start_checks import check_class_count, check_devices, check_training_start

logger = logging.getLogger(__name__)

RPN_PREFIX_SUFFIX = "_rpn"
DEFAULT_RPN_EPOCHS = 2  # the paper's short RPN schedule


def _is_newer(path, than):
    return os.path.getmtime(path) >= os.path.getmtime(than)


def run_stage(name, output, inputs, run, what, done=os.path.isfile):
    """Run one stage (``run()``) unless ``done(output)``; log what happens. Returns ``output``.

    An output older than one of its ``inputs`` is kept, with a warning: redoing a training stage
    would throw away its run, so that is left to the user (delete the output).
    """
    if done(output):
        stale = [path for path in inputs if not _is_newer(output, path)]
        if stale:
            logger.warning("stage %s: %s is older than its input %s; kept as it is (delete it to redo the "
                           "stage)", name, output, stale[0])
        logger.info("stage %s: skipped, %s exists", name, output)
        return output
    logger.info("stage %s: %s -> %s", name, what, output)
    run()
    if not done(output):
        raise RuntimeError(f"stage {name} finished without writing {output}")
    logger.info("stage %s: done, %s", name, output)
    return output


def train_stage(cfg):
    """A stage runner training ``cfg``, resuming from its last complete epoch (from scratch when none)."""
    def run():
        from lib.train.trainer import train

        train(cfg, resume=True)
    return run


def eval_stage(cfg):
    """A stage runner testing ``cfg`` (its TEST.MODEL) on ``dataset.test_image_set``."""
    def run():
        from lib.inference.tester import test

        test(cfg)
    return run


def summary_path(cfg):
    """Where the tester writes its summary for ``cfg``."""
    from lib.inference.tester import results_dir

    return os.path.join(results_dir(cfg), "test_summary.json")


def evaluated(checkpoint):
    """``done`` test of an evaluation stage: a summary counts only when it is of ``checkpoint``
    (main_test.py with another epoch writes the same file)."""
    def done(path):
        if not os.path.isfile(path):
            return False
        with open(path) as f:
            return json.load(f).get("checkpoint") == checkpoint
    return done


class NegChipPipeline:
    """The four stages of one run, each with its config (``rpn_cfg``, ``extract_cfg``, ``sniper_cfg``,
    ``eval_cfg``) and its output path; the ``run_*`` methods skip a stage whose output exists."""

    def __init__(self, cfg_file, overrides=(), rpn_epochs=DEFAULT_RPN_EPOCHS, rpn_overrides=()):
        if isinstance(rpn_epochs, bool) or not isinstance(rpn_epochs, int) or rpn_epochs < 1:
            raise ValueError(f"rpn_epochs (--rpn-epochs) must be an integer >= 1, got {rpn_epochs!r}")
        overrides, rpn_overrides = list(overrides), list(rpn_overrides)
        base = load_config(cfg_file, overrides)
        rpn_prefix = base.TRAIN.model_prefix + RPN_PREFIX_SUFFIX
        inside = [str(epoch) for epoch in parsed(base).lr_step_epochs if epoch < rpn_epochs]
        self.rpn_cfg = load_config(cfg_file, overrides + [("TRAIN.lr_step", ",".join(inside))] + rpn_overrides + [
            ("TRAIN.ONLY_PROPOSAL", "true"), ("TRAIN.USE_NEG_CHIPS", "false"), ("dataset.proposal", ""),
            ("TRAIN.model_prefix", rpn_prefix), ("TRAIN.begin_epoch", "0"), ("TRAIN.end_epoch", str(rpn_epochs))])
        self.rpn_checkpoint = params_path(checkpoint_prefix(self.rpn_cfg), rpn_epochs)
        self.proposal_file = os.path.join(output_dir(base), "proposals",
                                          f"{rpn_prefix}-{rpn_epochs:04d}_{base.dataset.image_set}.npz")
        self.extract_cfg = load_config(cfg_file, overrides + rpn_overrides + [
            ("TEST.EXTRACT_PROPOSALS", "true"), ("TEST.MODEL", self.rpn_checkpoint),
            ("TEST.PROPOSAL_SAVE_PATH", self.proposal_file)])
        sniper = [("TRAIN.ONLY_PROPOSAL", "false"), ("TRAIN.USE_NEG_CHIPS", "true"),
                  ("dataset.proposal", self.proposal_file)]
        self.sniper_cfg = load_config(cfg_file, overrides + sniper)
        self.sniper_checkpoint = params_path(checkpoint_prefix(self.sniper_cfg), self.sniper_cfg.TRAIN.end_epoch)
        self.eval_cfg = load_config(cfg_file, overrides + sniper + [
            ("TEST.EXTRACT_PROPOSALS", "false"), ("TEST.MODEL", self.sniper_checkpoint)])
        self.summary_file = summary_path(self.eval_cfg)
        self.output_dir = output_dir(base)

    def check_start(self):
        """What can fail before any work (lib.start_checks), before anything is written: every training check
        of the RPN stage; the devices and class count of the SNIPER stage (its proposal file is the proposals
        stage's output, the evaluation runs on its devices)."""
        check_training_start(self.rpn_cfg, resume=True, evaluates=True)  # it resumes; its proposals are a test
        check_devices(self.sniper_cfg, ("TRAIN", "TEST"))
        check_class_count(self.sniper_cfg)
        check_run_record(self.sniper_cfg)  # a finished stage is skipped: its record must name these settings

    def run(self, evaluate=False):
        """Every stage in order; returns ``{stage: output path}`` (and ``summary``, the tester's dict,
        with ``evaluate``)."""
        outputs = {"rpn": self.run_rpn(), "proposals": self.run_proposals(), "sniper": self.run_sniper()}
        if evaluate:
            outputs["eval"] = self.run_eval()
            with open(outputs["eval"]) as f:
                outputs["summary"] = json.load(f)
        return outputs

    def run_rpn(self):
        return run_stage("rpn", self.rpn_checkpoint, [], train_stage(self.rpn_cfg),
                         f"training the RPN alone for {self.rpn_cfg.TRAIN.end_epoch} epochs")

    def run_proposals(self):
        from lib.inference.tester import extract_proposals

        return run_stage("proposals", self.proposal_file, [self.rpn_checkpoint],
                         lambda: extract_proposals(self.extract_cfg),
                         f"extracting proposals of {self.extract_cfg.dataset.image_set} with {self.rpn_checkpoint} "
                         f"at scales {self.extract_cfg.TEST.SCALES}")

    def run_sniper(self):
        return run_stage("sniper", self.sniper_checkpoint, [self.proposal_file], train_stage(self.sniper_cfg),
                         f"training SNIPER with negative chips from {self.proposal_file} for "
                         f"{self.sniper_cfg.TRAIN.end_epoch} epochs")

    def run_eval(self):
        return run_stage("eval", self.summary_file, [self.sniper_checkpoint], eval_stage(self.eval_cfg),
                         f"evaluating {self.sniper_checkpoint} on {self.eval_cfg.dataset.test_image_set}",
                         done=evaluated(self.sniper_checkpoint))
