"""The multi-scale test on images without annotations: a folder, or a text file listing image paths.

``main_test.py --images FOLDER|LIST [--draw]`` runs the checkpoint over every image (the tester's
pipeline and progress bar), logs images/s, and writes into ``{run folder}/results/images_{NAME}/`` (or
``--out``): ``detections_results.json`` (COCO results format) and ``image_info.json`` (a COCO
``image_info`` file: ids, file names, sizes), with ``--draw`` one ``drawn/{file name}.jpg`` per image,
and for geo-referenced images ``geojson/{file name}.geojson`` (lib.inference.geojson).
Image ids are the file names' digits when all are distinct numbers (COCO's ``000000000139.jpg``), else
1..N in sorted order. Sizes come from the file headers (Pillow, without decoding); a file that cannot be
read, or whose header declares more than dataset.MAX_IMAGE_PIXELS, is logged and skipped, as in the tester.
"""
import logging
import os
import re
import time

from PIL import Image, UnidentifiedImageError

from lib.atomic import write_json
from lib.dataset.image_io import check_pixel_limit, read_image
from lib.drawing import write_picture
from lib.evaluation.metrics import coco_results
from lib.inference.geojson import write_geojson
from lib.run.folder import checkpoint_category_ids
from lib.paths import shown_path

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
IMAGE_INFO_FILE = "image_info.json"  # the ids, file names and sizes of the images tested (the viewer reads it)


def list_images(source):
    """Image paths of a folder (its files with an image extension, sorted, not recursive) or of a text file
    (one path per line, relative ones to the file's folder; blank lines and ``#`` comments skipped)."""
    if os.path.isdir(source):
        names = sorted(n for n in os.listdir(source) if n.lower().endswith(IMAGE_EXTENSIONS))
        paths = [os.path.join(source, n) for n in names if os.path.isfile(os.path.join(source, n))]
    elif os.path.isfile(source):
        base = os.path.dirname(os.path.abspath(source))
        try:
            with open(source) as f:
                lines = [line.strip() for line in f]
        except (OSError, UnicodeDecodeError) as err:
            raise FileNotFoundError(f"--images {source}: cannot read the image list: {err}") from None
        paths = [os.path.join(base, line) for line in lines if line and not line.startswith("#")]
    else:
        raise FileNotFoundError(f"--images {source}: neither a folder nor an image list file")
    if not paths:
        raise FileNotFoundError(f"--images {source}: no images ({', '.join(IMAGE_EXTENSIONS)})")
    return paths


def image_ids(paths):
    """Ids from the file names' digits when they are distinct numbers, else 1..N."""
    stems = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    if all(re.fullmatch(r"\d{1,18}", s) for s in stems) and len({int(s) for s in stems}) == len(stems):
        return [int(s) for s in stems]
    return list(range(1, len(paths) + 1))


def image_entries(paths, max_pixels):
    """(test entries without boxes, unreadable paths with their reason): what the tester's pipeline reads.
    An image whose header declares more than ``max_pixels`` (dataset.MAX_IMAGE_PIXELS) is unreadable."""
    entries, unreadable = [], []
    for image_id, path in zip(image_ids(paths), paths):
        try:
            height, width = header_size(path)
            check_pixel_limit(path, (height, width), max_pixels)
        except (OSError, UnidentifiedImageError) as err:
            unreadable.append((path, str(err)))
            continue
        entries.append({"image": path, "id": image_id, "height": height, "width": width, "flipped": False})
    for path, reason in unreadable:
        logger.error("skipping %s: %s", path, reason)
    return entries, unreadable


def header_size(path):
    """(height, width) of an image file from its header (Pillow decodes no pixel). Pillow's own
    decompression-bomb limit (an error from 179 Mpx) is lifted for the call: the limit is
    dataset.MAX_IMAGE_PIXELS, checked on the size returned."""
    pillow_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        with Image.open(path) as image:
            width, height = image.size
    finally:
        Image.MAX_IMAGE_PIXELS = pillow_limit
    return height, width


def output_folder(cfg, source):
    from lib.run.checkpoint import output_dir
    from lib.run.lock import RESULTS_FOLDER

    name = os.path.basename(os.path.normpath(source))
    return os.path.join(output_dir(cfg), RESULTS_FOLDER, f"images_{os.path.splitext(name)[0] or 'images'}")


def detect_images(cfg, source, out_dir=None, draw=False, thresh=0.5, detector=None):
    """Detect on every image of ``source`` (module docstring); returns a summary dict."""
    from lib.inference.detector import Detector
    from lib.run.checkpoint import checkpoint_file
    from lib.inference.tester import run_images
    from lib.run.folder import checkpoint_classes

    paths = list_images(source)
    entries, unreadable = image_entries(paths, cfg.dataset.MAX_IMAGE_PIXELS)
    if detector is None:
        params = checkpoint_file(cfg)
        detector = Detector.from_config(cfg, params, checkpoint_classes(params, cfg))
    out_dir = out_dir or output_folder(cfg, source)
    start = time.perf_counter()
    found, skipped = run_images(entries, detector, cfg.TEST.NUM_PROCESS, "testing images")
    seconds = time.perf_counter() - start
    tested = sorted(found)
    category_ids = checkpoint_category_ids(detector.source, len(detector.classes))
    results = coco_results([found[i] for i in tested], [entries[i]["id"] for i in tested], category_ids)
    write_json(results, os.path.join(out_dir, "detections_results.json"))
    write_json({"images": [{"id": e["id"], "file_name": os.path.basename(e["image"]), "width": e["width"],
                            "height": e["height"]} for e in entries],
                "categories": [{"id": int(c), "name": n} for c, n in zip(category_ids[1:], detector.classes[1:])]},
               os.path.join(out_dir, IMAGE_INFO_FILE))
    geojson = write_geojson([entries[i] for i in tested], [found[i] for i in tested], category_ids, detector.classes,
                            out_dir)
    if draw:
        for i in tested:
            name = os.path.splitext(os.path.basename(entries[i]["image"]))[0] + ".jpg"
            image = read_image(entries[i]["image"], cfg.dataset.MAX_IMAGE_PIXELS)
            write_picture(detector.draw(image, found[i], thresh), os.path.join(out_dir, "drawn", name))
    speed = len(tested) / max(seconds, 1e-9)
    logger.info("tested %d of %d images of %s in %.1f s (%.2f images/s); %d detections written to %s",
                len(tested), len(paths), source, seconds, speed, len(results), shown_path(out_dir))
    summary = {"source": source, "images": len(paths), "tested": len(tested),
               "skipped": len(unreadable) + len(skipped), "seconds": seconds, "images_per_s": speed,
               "results": os.path.join(out_dir, "detections_results.json"), "checkpoint": detector.source, **geojson}
    write_json(summary, os.path.join(out_dir, "test_summary.json"))
    return summary
