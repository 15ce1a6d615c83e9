"""Detections of geo-referenced images as GeoJSON, next to the COCO results (main_test.py, --images too).

For every tested image that carries a geotransform (lib.dataset.georeference: GeoTIFF tags or a world
file), ``write_geojson`` writes ``{out_dir}/geojson/{file stem}.geojson`` (``{stem}_{image id}`` when two
images share a stem): a FeatureCollection with one Polygon per detection, the box's outline in the image's
coordinate system, and the properties ``category``, ``category_id``, ``score`` and ``image_id`` of its
COCO result. The box covers its pixels whole, as the COCO results' ``[x, y, w, h]`` does: from the
top-left corner of pixel (x1, y1) to the bottom-right corner of pixel (x2, y2), that is pixel-corner
coordinates x1 .. x2 + 1 and y1 .. y2 + 1. Rings run counterclockwise on the ground (RFC 7946). When the
GeoKeys give an EPSG code the collection names it in a ``crs`` member (``urn:ogc:def:crs:EPSG::CODE``,
which GDAL and QGIS read); coordinates stay in that system, not reprojected to WGS 84.
"""
import logging
import os

from lib.atomic import write_json
from lib.dataset.georeference import read_georeference
from lib.evaluation.metrics import coco_results

logger = logging.getLogger(__name__)

GEOJSON_FOLDER = "geojson"


def detections_geojson(results, georeference, names, name=""):
    """A FeatureCollection of one image's COCO result entries (``evaluator.coco_results``) mapped by its
    ``georeference``; ``names``: category id -> name."""
    features = []
    for result in results:
        x, y, w, h = result["bbox"]
        u, v = [x, x, x + w, x + w], [y, y + h, y + h, y]  # top-left, bottom-left, bottom-right, top-right
        if not georeference.flips:  # pixel order is the ground's: go the other way round
            u, v = u[::-1], v[::-1]
        xs, ys = georeference.world(u + u[:1], v + v[:1])
        features.append({"type": "Feature",
                         "geometry": {"type": "Polygon", "coordinates": [[[float(a), float(b)]
                                                                          for a, b in zip(xs, ys)]]},
                         "properties": {"category": names.get(result["category_id"]),
                                        "category_id": result["category_id"], "score": result["score"],
                                        "image_id": result["image_id"]}})
    collection = {"type": "FeatureCollection", "name": name}
    if georeference.epsg is not None:
        collection["crs"] = {"type": "name", "properties": {"name": f"urn:ogc:def:crs:EPSG::{georeference.epsg}"}}
    collection["features"] = features
    return collection


def write_geojson(entries, detections, category_ids, classes, out_dir):
    """The GeoJSON of every geo-referenced one of the tested ``entries`` (roidb entries: ``image``, ``id``)
    with its ``detections`` ((N, 6) rows) into ``{out_dir}/geojson/``. An image whose georeference cannot
    be read is logged and counted, its other results stand. Returns what goes into the test summary:
    ``{"geojson": {"folder", "images", "unreadable"}}``, or {} when no image carries a georeference."""
    names = {int(c): n for c, n in zip(category_ids[1:], classes[1:])}
    folder = os.path.join(out_dir, GEOJSON_FOLDER)
    written, unreadable = set(), 0
    for entry, rows in zip(entries, detections):
        try:
            georeference = read_georeference(entry["image"])
        except OSError as err:
            logger.warning("no GeoJSON for image id %s: %s", entry["id"], err)
            unreadable += 1
            continue
        if georeference is None:
            continue
        stem = os.path.splitext(os.path.basename(entry["image"]))[0]
        name = stem if stem not in written else f"{stem}_{entry['id']}"
        written.add(name)
        results = coco_results([rows], [entry["id"]], category_ids)
        write_json(detections_geojson(results, georeference, names, name), os.path.join(folder, f"{name}.geojson"))
    if not written and not unreadable:
        return {}
    logger.info("wrote the GeoJSON of %d geo-referenced images to %s%s", len(written), folder,
                f" ({unreadable} with an unreadable georeference skipped)" if unreadable else "")
    return {"geojson": {"folder": folder, "images": len(written), "unreadable": unreadable}}
