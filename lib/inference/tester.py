"""Multi-scale testing over a dataset (spec section 8) and RPN proposal extraction.

``test(cfg)`` runs the checkpoint over ``dataset.test_image_set``, writes the results (COCO JSON,
test-dev ready; GeoJSON too for geo-referenced images, lib.inference.geojson) and evaluates them when the
set has annotations. ``extract_proposals(cfg)`` runs the RPN-only network over ``dataset.image_set`` (the
training images, unflipped) and writes the proposal file (``lib.dataset.proposals``, an ``.npz``) that
``dataset.proposal`` reads for negative chip mining.

Images are batched as the reference batches them (lib.inference.batching) and prepared and merged in
``TEST.NUM_PROCESS`` worker processes around the network (lib.inference.streaming). An image that cannot
be read, or whose file is not of its annotated size, is logged with its path, left out and counted as
skipped. With ``TEST.USE_CACHE`` each scale's detections are cached in the results folder and read back
by the next test of the same checkpoint, images and settings (lib.inference.scale_cache), which then only
merges; ``vis`` draws each scale's and the final detections of every image (``main_test.py --vis``).
"""
import logging
import os
import time

import numpy as np
from tqdm import tqdm

from lib.atomic import write_json
from lib.dataset import load_roidb
from lib.dataset.image_io import read_roidb_image
from lib.dataset.proposals import write_proposals
from lib.drawing import write_picture
from lib.inference.detector import Detector
from lib.inference.geojson import write_geojson
from lib.inference.masks import image_segmentations
from lib.inference.merge import candidate_rows, suppress
from lib.inference.streaming import RoidbImages, metered
from lib.inference.regions import RegionPlan
from lib.inference.scale_cache import ScaleCache
from lib.paths import shown_path
from lib.run.checkpoint import checkpoint_file, output_dir
from lib.run.lock import RESULTS_FOLDER

logger = logging.getLogger(__name__)

SUMMARY_FILE = "test_summary.json"  # a test's summary in its results folder


def results_dir(cfg):
    """``{output_path}/{cfg.name}/results/{test_image_set}``."""
    return os.path.join(output_dir(cfg), RESULTS_FOLDER, cfg.dataset.test_image_set)


def proposal_file(cfg):
    """``TEST.PROPOSAL_SAVE_PATH`` (a file, or a folder: an existing one or a path ending in '/') or
    ``{output_path}/proposals``; a folder gets ``{image_set}.npz``."""
    path = cfg.TEST.PROPOSAL_SAVE_PATH or os.path.join(cfg.output_path, "proposals", "")
    if path.endswith(os.sep) or os.path.isdir(path):
        return os.path.join(path, f"{cfg.dataset.image_set}.npz")
    return path


def run_images(roidb, detector, num_workers, desc, speed=None, run=None, plan=None):
    """``detector`` over every roidb entry (lib.inference.streaming, ``num_workers`` processes); returns
    (results by roidb index, skipped entries). Unreadable images are logged with their path and skipped.
    The bar counts network passes (a batch at one scale), the work an ETA must extrapolate, not images
    started. ``speed`` (a dict), when given, gets the seconds end to end and in the network. ``run``
    (default ``detector.run``) is what yields ``(index, result or IOError)`` for ``(source, num_workers,
    plan)``; ``plan`` (a RegionPlan) receives the regions the run processed, for the mask pass."""
    started = time.perf_counter()
    outputs, skipped, network_seconds = _collect(
        lambda: (run or detector.run)(RoidbImages(roidb), num_workers=num_workers, plan=plan), roidb, desc)
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


def test(cfg, detector=None, checkpoint=None, out_dir=None, max_images=0, vis=False, vis_thresh=0.5):
    """Detect on ``dataset.test_image_set`` with ``detector``, or one loaded from ``checkpoint`` (default:
    ``TEST.MODEL`` or epoch ``TEST.TEST_EPOCH`` of the config's run), write the results and evaluate
    them; returns a summary dict (COCO stats or VOC APs, image counts, skipped images), also written as
    ``test_summary.json``. ``out_dir`` replaces ``results_dir(cfg)``; ``max_images`` > 0 tests (and scores)
    the set's first that many images only (evaluation while training). With ``TEST.USE_CACHE`` the scales
    come from their caches where valid (lib.inference.scale_cache); ``vis`` draws the detections scoring
    at least ``vis_thresh`` (``draw_levels``)."""
    image_set = cfg.dataset.test_image_set
    roidb, dataset = load_roidb(cfg, image_set, training=False)
    if max_images:
        roidb = roidb[:max_images]
    detector = detector or Detector.from_config(cfg, checkpoint or checkpoint_file(cfg), dataset.classes)
    logger.info("testing %d images of %s at scales %s on %s", len(roidb), image_set, cfg.TEST.SCALES,
                detector.contexts)
    out_dir = out_dir or results_dir(cfg)
    speed, cache, levels = {}, None, None
    plan = RegionPlan() if detector.mask_head is not None else None
    if cfg.TEST.USE_CACHE or vis:  # each scale's detections, merged here
        cache = ScaleCache.for_test(detector, roidb, out_dir) if cfg.TEST.USE_CACHE else None
        levels, skipped = run_images(roidb, detector, cfg.TEST.NUM_PROCESS, "testing", speed, plan=plan,
                                     run=lambda source, num_workers, plan: detector.run_levels(source, num_workers,
                                                                                               cache, plan))
        found = {index: detector.merge_levels(per_level) for index, per_level in levels.items()}
    else:
        found, skipped = run_images(roidb, detector, cfg.TEST.NUM_PROCESS, "testing", speed, plan=plan)
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
    summary = {"image_set": image_set, "checkpoint": detector.source,
               "images": len(roidb), "tested": len(tested), "skipped": len(skipped),
               "skipped_images": [entry["image"] for entry in skipped], "speed": speed}
    if cache is not None:
        summary["scale_cache"] = {"folder": cache.folder, "read": cache.read, "written": cache.written}
    if vis:
        draw_levels(detector, [roidb[i] for i in tested], [levels[i] for i in tested], [found[i] for i in tested],
                    os.path.join(out_dir, VIS_FOLDER), vis_thresh)
    summary.update(dataset.evaluate([roidb[i] for i in tested], [found[i] for i in tested], out_dir,
                                    segmentations=None if segmentations is None else [segmentations[i] for i in tested],
                                    scoring=cfg.TEST))
    summary.update(write_geojson([roidb[i] for i in tested], [found[i] for i in tested], dataset.category_ids,
                                 dataset.classes, out_dir))
    if skipped:
        logger.warning("%d of %d images could not be read and were skipped (listed in %s)", len(skipped),
                       len(roidb), shown_path(os.path.join(out_dir, SUMMARY_FILE)))
    write_json(summary, os.path.join(out_dir, SUMMARY_FILE))
    logger.info("tested %d of %d images of %s, %d skipped", len(tested), len(roidb), image_set, len(skipped))
    return summary


VIS_FOLDER = "vis"


def draw_levels(detector, entries, levels, found, folder, thresh):
    """For each entry, ``{folder}/scale{n}/{id}.jpg``: scale n's detections (its Candidates suppressed and
    capped as the final ones, before its valid range: what the reference's VISUALIZE_INTERMEDIATE_SCALES
    draws), and ``{folder}/final/{id}.jpg``: the final detections; those scoring at least ``thresh``."""
    test_cfg = detector.cfg.TEST
    for entry, per_level, final in zip(tqdm(entries, desc="drawing", unit="image"), levels, found):
        try:
            image = read_roidb_image(entry)
        except IOError as err:
            logger.error("not drawing image id %s: %s", entry["id"], err)
            continue
        name = f"{entry['id']}.jpg"
        for number, candidates in enumerate(per_level):
            rows = suppress(candidate_rows(candidates, (-1, -1)), test_cfg)
            write_picture(detector.draw(image, rows, thresh), os.path.join(folder, f"scale{number}", name))
        write_picture(detector.draw(image, final, thresh), os.path.join(folder, "final", name))
    logger.info("drew the detections of %d images at every scale and merged into %s", len(entries), shown_path(folder))


def _rate(value):
    return "-" if value is None else f"{value:.2f}"


def extract_proposals(cfg, detector=None):
    """RPN proposals of every image of ``dataset.image_set`` at ``TEST.SCALES`` (the best
    ``TEST.NUM_PROPOSALS`` per scale, pooled), saved as ``{image_id: float32 (P, 5)}`` in original
    unflipped pixels to ``proposal_file(cfg)`` (lib.dataset.proposals); returns the path."""
    image_set = cfg.dataset.image_set
    roidb, _ = load_roidb(cfg, image_set, training=False)
    detector = detector or Detector.from_config(cfg, checkpoint_file(cfg), None, rpn_only=True)
    found, skipped = run_images(roidb, detector, cfg.TEST.NUM_PROCESS, "proposals")
    proposals = {roidb[i]["id"]: found[i] for i in sorted(found)}
    path = proposal_file(cfg)
    write_proposals(proposals, path)
    counts = [len(p) for p in proposals.values()] or [0]
    logger.info("wrote proposals of %d images (%d skipped, %.0f per image on average) to %s",
                len(proposals), len(skipped), np.mean(counts), shown_path(path))
    return path
