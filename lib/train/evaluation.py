"""Evaluation while training: the AP of a checkpoint every TRAIN.EVAL_EVERY epochs, the best epoch kept.

After every ``EVAL_EVERY``-th epoch (and the last) the checkpoint just written is tested on
``dataset.test_image_set`` (its first ``EVAL_IMAGES`` images when > 0, the same ones every time) with the
tester, into ``{run folder}/evaluations/epoch_NNNN/``; the stats are logged and appended to
``metrics.jsonl`` (``{"eval": stats}``, TensorBoard ``eval/NAME``): the bbox stats, and a mask network's segm
stats (nested under "segm") beside them as ``segm_AP``, ``segm_AP50``, ... (``flat_stats``; ``EVAL_METRIC`` may
name them, refused at load without TRAIN.WITH_MASK). ``{run folder}/best.json`` names the best epoch by ``EVAL_METRIC``
(``{"metric", "best": {"epoch", "value", "params"}, "history": [{"epoch", "value", "stats"}]}``):
``--model RUN_FOLDER`` tests that checkpoint (lib/run/folder.py). ``EARLY_STOP`` > 0 ends training after
that many evaluations in a row without improvement.

A metric can be undefined on the val set: COCO's -1 (no ground truth in what it scores, e.g. APs on a set
without small objects), NaN (VOC's mAP without ground truth), or absent (a set without annotations). Such a
value is no value: it is kept as ``null`` in best.json's history, never picks the best epoch, never counts
towards EARLY_STOP, and the first evaluation it happens at says so in one warning naming the metrics that
are defined on the set. A resumed run continues the history of the epochs
it keeps, each value taken again from its stats under the current metric (a fresh start over an old run folder
drops the old history). Rank 0 alone evaluates; early stopping is refused with several workers (the others would wait
for a batch that never comes).
"""
import json
import logging
import os

from lib.atomic import write_bytes, write_json
from lib.errors import UserError
from lib.evaluation.coco_summary import SEGM_PREFIX, defined, parse_bands, scored_max_dets, stat_names
from lib.paths import shown_path
from lib.run.folder import BEST_FILE
from lib.run.checkpoint import output_dir
from lib.run.lock import EVALUATIONS_FOLDER

logger = logging.getLogger(__name__)

VOC_METRIC = "mAP"  # a VOC set has one metric (AP at IoU 0.5)


class EvaluationError(UserError, ValueError):
    """Evaluation-while-training keys that cannot work (named)."""


def metric_names(cfg):
    """The metrics TRAIN.EVAL_METRIC may name: the COCO stats of the test settings (with TRAIN.WITH_MASK also
    their segm twins, ``segm_AP`` ...), and VOC's mAP."""
    names = tuple(stat_names(parse_bands(cfg.TEST.SIZE_BANDS), scored_max_dets(cfg.TEST)))
    segm = tuple(SEGM_PREFIX + name for name in names) if cfg.TRAIN.WITH_MASK else ()
    return names + segm + (VOC_METRIC,)


def flat_stats(stats):
    """The numbers of the tester's stats: the bbox ones as they are, the segm ones (``stats["segm"]``)
    as ``segm_NAME``."""
    numbers = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
    segm = stats.get("segm")
    if isinstance(segm, dict):
        numbers.update({SEGM_PREFIX + k: v for k, v in segm.items() if isinstance(v, (int, float))})
    return numbers


def metric_value(stats, metric):
    """``stats[metric]`` of ``flat_stats`` (COCO), or a VOC set's mAP whatever ``metric`` asks; None when
    undefined (``defined``; no stats at all: a set without annotations)."""
    numbers = flat_stats(stats)
    if not numbers:
        return None
    value = numbers.get(metric, numbers.get(VOC_METRIC))
    if value is None:
        raise EvaluationError(f"config key TRAIN.EVAL_METRIC = {metric!r}: the evaluation gives "
                              f"{', '.join(sorted(numbers))}")
    return float(value) if defined(value) else None


def undefined_warning(metric, numbers, image_set):
    """The one line said when ``metric`` is undefined on the val set, naming the metrics defined there."""
    usable = [name for name, value in numbers.items() if defined(value)]
    return (f"TRAIN.EVAL_METRIC {metric} is undefined on {image_set} (COCO's -1 or NaN: no ground truth it scores, "
            f"or no annotations): it picks no best epoch and stops nothing (TRAIN.EARLY_STOP); defined there: "
            f"{', '.join(usable) or 'none'}")


class TrainingEvaluation:
    """Evaluates checkpoints as training writes them (module docstring); ``due(epoch)`` / ``after_epoch``."""

    def __init__(self, cfg, begin_epoch, num_workers=1, test=None, writer=True):
        train = cfg.TRAIN
        if train.EVAL_METRIC not in metric_names(cfg):
            raise EvaluationError(f"config key TRAIN.EVAL_METRIC = {train.EVAL_METRIC!r}: expected one of "
                                  f"{', '.join(metric_names(cfg))}")
        if train.EARLY_STOP and not train.EVAL_EVERY:
            raise EvaluationError("config key TRAIN.EARLY_STOP needs TRAIN.EVAL_EVERY > 0")
        if train.EARLY_STOP and num_workers > 1:
            raise EvaluationError("config key TRAIN.EARLY_STOP: not with several workers (only rank 0 evaluates)")
        if test is None:
            from lib.inference.tester import test
        self.cfg, self.test = cfg, test
        self.every, self.images, self.metric = train.EVAL_EVERY, train.EVAL_IMAGES, train.EVAL_METRIC
        self.patience, self.end_epoch = train.EARLY_STOP, train.end_epoch
        self.path = os.path.join(output_dir(cfg), BEST_FILE)
        self.undefined_said = False
        saved = self._saved_history()
        self.history = [h for h in saved if h["epoch"] <= begin_epoch]
        if writer and os.path.isfile(self.path) and self.history != saved:
            self._write()  # the epochs this run retrains (or a fresh start) lose their old evaluations

    def _write(self):
        if self.history:
            write_json({"metric": self.metric, "best": self.best(), "history": self.history}, self.path)
        else:
            os.remove(self.path)

    def _saved_history(self):
        if not os.path.isfile(self.path):
            return []
        try:
            with open(self.path) as f:
                saved = json.load(f)
            # each value again from its stats: another TRAIN.EVAL_METRIC (a resume may change it), or an older
            # file that kept COCO's -1 as a value
            return [dict(h, value=metric_value(h["stats"], self.metric)) for h in saved["history"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            logger.warning("%s cannot be read (%s): the evaluation history starts afresh", self.path, err)
            return []

    @property
    def enabled(self):
        return self.every > 0

    def due(self, epoch):
        """Whether the checkpoint of (1-based) ``epoch`` is evaluated."""
        return self.enabled and (epoch % self.every == 0 or epoch == self.end_epoch)

    def best(self):
        """The history entry with the highest defined metric (the earliest on ties), or None."""
        scored = [h for h in self.history if h["value"] is not None]
        return max(scored, key=lambda h: (h["value"], -h["epoch"])) if scored else None

    def evaluations_without_improvement(self):
        """Evaluations with a defined metric after the best one (undefined ones count for nothing)."""
        best = self.best()
        return 0 if best is None else sum(h["epoch"] > best["epoch"] and h["value"] is not None
                                          for h in self.history)

    def after_epoch(self, epoch, params, progress=None):
        """Evaluate checkpoint ``params`` of ``epoch`` when due; returns True when training should stop."""
        if not self.due(epoch):
            return False
        out_dir = os.path.join(output_dir(self.cfg), evaluation_folder(epoch))
        summary = self.test(self.cfg, checkpoint=params, out_dir=out_dir, max_images=self.images)
        stats = summary.get("stats") or {}
        numbers = flat_stats(stats)
        value = metric_value(numbers, self.metric)
        if value is None and not self.undefined_said:
            logger.warning("%s", undefined_warning(self.metric, numbers, self.cfg.dataset.test_image_set))
            self.undefined_said = True
        self.history.append({"epoch": epoch, "value": value, "stats": numbers,
                             "params": os.path.basename(params)})
        self._write()
        best = self.best()
        if progress is not None:
            progress.record_evaluation(numbers)
        logger.info("evaluation after epoch %d on %d images of %s: %s %s; best %s",
                    epoch, summary.get("tested", 0), self.cfg.dataset.test_image_set, self.metric,
                    "undefined" if value is None else f"{value:.4f}",
                    f"epoch {best['epoch']} ({best['value']:.4f}, {best['params']})" if best else "none yet")
        stale = self.evaluations_without_improvement()
        if self.patience and stale >= self.patience:
            logger.info("early stop after epoch %d: %d evaluations without a better %s (TRAIN.EARLY_STOP %d)",
                        epoch, stale, self.metric, self.patience)
            return True
        return False


def evaluation_folder(epoch):
    """The folder of the evaluation after (1-based) ``epoch``, relative to the run folder."""
    return os.path.join(EVALUATIONS_FOLDER, f"epoch_{epoch:04d}")


def whole_set_evaluation(cfg, params):
    """(epoch, folder) of the evaluation while training that tested checkpoint ``params`` on the whole test
    set (TRAIN.EVAL_IMAGES 0; best.json's history names the checkpoint, the folder's summary the same file),
    or None."""
    from lib.inference.tester import SUMMARY_FILE

    best_path = os.path.join(output_dir(cfg), BEST_FILE)
    if not cfg.TRAIN.EVAL_EVERY or cfg.TRAIN.EVAL_IMAGES or not os.path.isfile(best_path):
        return None
    try:
        with open(best_path) as f:
            history = json.load(f)["history"]
        epoch = next(h["epoch"] for h in history if h["params"] == os.path.basename(params))
        folder = os.path.join(output_dir(cfg), evaluation_folder(epoch))
        with open(os.path.join(folder, SUMMARY_FILE)) as f:
            tested = json.load(f)["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None
    return (epoch, folder) if os.path.realpath(tested) == os.path.realpath(params) else None


def final_test(cfg, params, test=None):
    """``main_train.py --eval``: checkpoint ``params`` tested on the whole test set into the results folder
    (lib.inference.tester.results_dir); returns its summary. When the evaluation while training already
    tested that checkpoint on the whole set (``whole_set_evaluation``), its results are copied there instead of
    testing the checkpoint a second time."""
    from lib.inference.tester import SUMMARY_FILE, results_dir

    if test is None:
        from lib.inference.tester import test
    evaluated = whole_set_evaluation(cfg, params)
    if evaluated is None:
        return test(cfg, checkpoint=params)
    epoch, folder = evaluated
    out = results_dir(cfg)
    for parent, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(parent, name), "rb") as f:
                write_bytes(f.read(), os.path.join(out, os.path.relpath(parent, folder), name))
    logger.info("%s was tested on the whole %s after epoch %d (%s): its results copied to %s, not tested again",
                os.path.basename(params), cfg.dataset.test_image_set, epoch, shown_path(folder), shown_path(out))
    with open(os.path.join(out, SUMMARY_FILE)) as f:
        return json.load(f)
