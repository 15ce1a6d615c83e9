"""Multi-scale testing over a dataset (spec section 8) and RPN proposal extraction.

``test(cfg)`` runs the checkpoint over ``dataset.test_image_set``, writes the results (COCO JSON,
test-dev ready) and evaluates them when the set has annotations. ``extract_proposals(cfg)`` runs the
RPN-only network over ``dataset.image_set`` (the training images, unflipped) and writes the proposal
file (``lib.dataset.proposals``, an ``.npz``) that ``dataset.proposal`` reads for negative chip mining.

Images are batched as the reference batches them (lib.inference.batching) and prepared and merged in
``TEST.NUM_PROCESS`` worker processes around the network (lib.inference.pipeline). An image that cannot
be read, or whose file is not of its annotated size, is logged with its path, left out and counted as
skipped.
"""
import logging
import os
import time

import numpy as np
from tqdm import tqdm

from lib.atomic import write_json
from lib.dataset import load_roidb
from lib.dataset.proposals import write_proposals
from lib.inference.detector import Detector, checkpoint_file
from lib.inference.masks import image_segmentations
from lib.inference.pipeline import RoidbImages, metered
from lib.inference.regions import RegionPlan
from lib.run.checkpoint import output_dir

logger = logging.getLogger(__name__)


def results_dir(cfg):
    """``{output_path}/{cfg.name}/results/{test_image_set}``."""
    return os.path.join(output_dir(cfg), "results", cfg.dataset.test_image_set)


def proposal_file(cfg):
    """``TEST.PROPOSAL_SAVE_PATH`` (a file, or a folder: an existing one or a path ending in '/') or
    ``{output_path}/proposals``; a folder gets ``{image_set}.npz``."""
    path = cfg.TEST.PROPOSAL_SAVE_PATH or os.path.join(cfg.output_path, "proposals", "")
    if path.endswith(os.sep) or os.path.isdir(path):
        return os.path.join(path, f"{cfg.dataset.image_set}.npz")
    return path


def run_images(roidb, detector, num_workers, desc, speed=None, plan=None):
    """``detector`` over every roidb entry (lib.inference.pipeline, ``num_workers`` processes); returns
    (results by roidb index, skipped entries). Unreadable images are logged with their path and skipped.
    The bar counts network passes (a batch at one scale), the work an ETA must extrapolate, not images
    started. ``speed`` (a dict), when given, gets the seconds end to end and in the network; ``plan`` (a
    RegionPlan) the regions the run processed, for the mask pass."""
    started = time.perf_counter()
    outputs, skipped, network_seconds = _collect(
        lambda: detector.run(RoidbImages(roidb), num_workers=num_workers, plan=plan), roidb, desc)
    if speed is not None:
        speed.update(images_per_second(len(outputs), time.perf_counter() - started, network_seconds))
    return outputs, skipped


def mask_images(roidb, detector, results, plan, num_workers, speed=None):
    """The instance masks of ``results`` ({roidb index: (N, 6) rows}) of a TRAIN.WITH_MASK ``detector``
    on the regions of its run's ``plan`` (lib.inference.masks); returns (RLEs by roidb index, skipped
    entries): an image unreadable now is logged and skipped. ``speed`` gets the pass's seconds."""
    started = time.perf_counter()
    outputs, skipped, network_seconds = _collect(
        lambda: image_segmentations(detector.mask_head, RoidbImages(roidb), results, plan, num_workers), roidb,
        "masks")
    if speed is not None:
        speed.update(mask_seconds=round(time.perf_counter() - started, 3),
                     mask_network_seconds=round(network_seconds, 3))
    return outputs, skipped


def _collect(run, roidb, desc):
    """(results by roidb index, skipped entries, seconds in the network) of ``run()``'s ``(index, result or
    IOError)``, under a progress bar of its network passes."""
    outputs, skipped = {}, []
    with tqdm(total=0, desc=desc, unit="pass") as bar:
        def on_pass(meter):
            bar.total = meter.planned
            bar.update(1)

        with metered(on_pass) as meter:
            for index, result in run():
                if isinstance(result, Exception):
                    logger.error("skipping image id %s: %s", roidb[index]["id"], result)
                    skipped.append(roidb[index])
                else:
                    outputs[index] = result
                bar.set_postfix(images=f"{len(outputs) + len(skipped)}/{len(roidb)}", refresh=False)
    return outputs, skipped, meter.network_seconds


def images_per_second(images, seconds, network_seconds):
    """The speed entry of test_summary.json: images/s end to end (reading, resizing, network, merging)
    and network-only (forward passes alone)."""
    return {"images_per_s": images / seconds if seconds > 0 else None,
            "network_images_per_s": images / network_seconds if network_seconds > 0 else None,
            "seconds": round(seconds, 3), "network_seconds": round(network_seconds, 3)}


def test(cfg, detector=None, checkpoint=None, out_dir=None, max_images=0):
    """Detect on ``dataset.test_image_set`` with ``detector``, or one loaded from ``checkpoint`` (default:
    ``TEST.MODEL`` or epoch ``TEST.TEST_EPOCH`` of the config's run), write the results and evaluate
    them; returns a summary dict (COCO stats or VOC APs, image counts, skipped images), also written as
    ``test_summary.json``. ``out_dir`` replaces ``results_dir(cfg)``; ``max_images`` > 0 tests (and scores)
    the set's first that many images only (evaluation while training)."""
    image_set = cfg.dataset.test_image_set
    roidb, dataset = load_roidb(cfg, image_set, training=False)
    if max_images:
        roidb = roidb[:max_images]
    detector = detector or Detector.from_config(cfg, checkpoint or checkpoint_file(cfg), dataset.classes)
    logger.info("testing %d images of %s at scales %s on %s", len(roidb), image_set, cfg.TEST.SCALES,
                detector.contexts)
    speed = {}
    plan = RegionPlan() if detector.mask_head is not None else None
    found, skipped = run_images(roidb, detector, cfg.TEST.NUM_PROCESS, "testing", speed, plan)
    logger.info("speed: %s images/s end to end, %s images/s in the network alone (%.1f s, of which %.1f s in the "
                "network)", _rate(speed["images_per_s"]), _rate(speed["network_images_per_s"]), speed["seconds"],
                speed["network_seconds"])
    segmentations = None
    if detector.mask_head is not None:  # instance masks of the final detections (lib.inference.masks)
        segmentations, unreadable = mask_images(roidb, detector, found, plan, cfg.TEST.NUM_PROCESS, speed)
        skipped += unreadable
        found = {index: found[index] for index in segmentations}
        logger.info("masks of %d images in %.1f s (%.1f s in the network)", len(segmentations),
                    speed["mask_seconds"], speed["mask_network_seconds"])
    tested = sorted(found)
    out_dir = out_dir or results_dir(cfg)
    summary = {"image_set": image_set, "checkpoint": detector.source,
               "images": len(roidb), "tested": len(tested), "skipped": len(skipped),
               "skipped_images": [entry["image"] for entry in skipped], "speed": speed}
    summary.update(dataset.evaluate([roidb[i] for i in tested], [found[i] for i in tested], out_dir,
                                    segmentations=None if segmentations is None else [segmentations[i] for i in tested],
                                    scoring=cfg.TEST))
    if skipped:
        logger.warning("%d of %d images could not be read and were skipped (listed in %s)", len(skipped),
                       len(roidb), os.path.join(out_dir, "test_summary.json"))
    write_json(summary, os.path.join(out_dir, "test_summary.json"))
    logger.info("tested %d of %d images of %s, %d skipped", len(tested), len(roidb), image_set, len(skipped))
    return summary


def _rate(value):
    return "-" if value is None else f"{value:.2f}"


def extract_proposals(cfg, detector=None):
    """RPN proposals of every image of ``dataset.image_set`` at ``TEST.SCALES`` (the best
    ``TEST.NUM_PROPOSALS`` per scale, pooled), saved as ``{image_id: float32 (P, 5)}`` in original
    unflipped pixels to ``proposal_file(cfg)`` (lib.dataset.proposals); returns the path."""
    image_set = cfg.dataset.image_set
    roidb, _ = load_roidb(cfg, image_set, training=False)
    detector = detector or Detector.from_config(cfg, checkpoint_file(cfg), rpn_only=True)
    found, skipped = run_images(roidb, detector, cfg.TEST.NUM_PROCESS, "proposals")
    proposals = {roidb[i]["id"]: found[i] for i in sorted(found)}
    path = proposal_file(cfg)
    write_proposals(proposals, path)
    counts = [len(p) for p in proposals.values()] or [0]
    logger.info("wrote proposals of %d images (%d skipped, %.0f per image on average) to %s",
                len(proposals), len(skipped), np.mean(counts), path)
    return path
