"""Geo-referenced output: geotransforms read from GeoTIFF tags and world files (hand-worked pixel -> world
coordinates), and the GeoJSON the tester and main_test.py --images write beside the COCO results for
geo-referenced images only."""
import json
import os

import cv2
import numpy as np
import pytest
import tifffile

from lib.config import with_overrides
from lib.dataset.georeference import Georeference, find_world_file, read_georeference
from lib.inference import tester
from lib.inference.image_folder import detect_images
from lib.inference.geojson import detections_geojson
from detector_helpers import CATEGORY_IDS, IMAGES, OracleDetector

PIXELS = np.random.default_rng(5).integers(0, 255, (30, 40, 3), dtype=np.uint8)
UTM_33N = 32633


def geokeys(*keys):
    """A GeoKeyDirectory of (key id, value) SHORT entries."""
    return [1, 1, 0, len(keys)] + [v for key, value in keys for v in (key, 0, 1, value)]


def write_geotiff(path, pixels=PIXELS, scale=None, tiepoint=None, transformation=None, keys=(), **layout):
    """A TIFF with GeoTIFF tags (tifffile); ``layout``: tile=, bigtiff=, byteorder= of tifffile.imwrite."""
    tags = []
    if scale is not None:
        tags.append((33550, "d", len(scale), scale, False))
    if tiepoint is not None:
        tags.append((33922, "d", len(tiepoint), tiepoint, False))
    if transformation is not None:
        tags.append((34264, "d", 16, transformation, False))
    if keys:
        directory = geokeys(*keys)
        tags.append((34735, "H", len(directory), directory, False))
    tifffile.imwrite(path, np.ascontiguousarray(pixels[:, :, ::-1]), photometric="rgb", extratags=tags, **layout)
    return path


AREA, POINT = 1, 2  # GTRasterTypeGeoKey (1025): PixelIsArea, PixelIsPoint


@pytest.mark.parametrize("layout", [{}, {"tile": (16, 16), "bigtiff": True, "byteorder": ">"}],
                         ids=["strip tiff", "tiled big-endian bigtiff"])
@pytest.mark.parametrize("raster_type", [AREA, POINT])
def test_geotiff_tiepoint_and_pixel_scale_map_pixel_corners_to_the_ground(tmp_path, layout, raster_type):
    """Pixels of 2 x 3 m, raster point (10, 5) at easting 500,000, northing 4,000,000. PixelIsArea: raster
    coordinates are pixel corners, so corner (30, 25) lies 20 px east and 20 px south of the tiepoint:
    (500,040, 3,999,940). PixelIsPoint: raster (10, 5) is the centre of pixel (10, 5), i.e. corner
    (10.5, 5.5): corner (30, 25) is 19.5 px east and 19.5 px south: (500,039, 3,999,941.5)."""
    path = write_geotiff(str(tmp_path / "utm.tif"), scale=[2.0, 3.0, 0.0], tiepoint=[10, 5, 0, 500000, 4000000, 0],
                         keys=[(1024, 1), (1025, raster_type), (3072, UTM_33N)], **layout)
    geo = read_georeference(path)
    assert geo.epsg == UTM_33N and geo.source == path
    x, y = geo.world([30, 0], [25, 0])
    if raster_type == AREA:
        np.testing.assert_allclose([x, y], [[500040, 499980], [3999940, 4000015]])
    else:
        np.testing.assert_allclose([x, y], [[500039, 499979], [3999941.5, 4000016.5]])
    assert geo.flips  # north up: rows run south, northing grows north


def test_geotiff_transformation_matrix_and_crs_codes(tmp_path):
    """ModelTransformation (rotated pixels): X = 0.5 i + 0.1 j + 1000, Y = -0.2 i - 0.5 j + 2000 at the
    raster corner (i, j): corner (10, 20) -> (1007, 1988). A user-defined projection (32767) has no EPSG
    code; a geographic one gives GeographicTypeGeoKey's."""
    matrix = [0.5, 0.1, 0, 1000, -0.2, -0.5, 0, 2000, 0, 0, 0, 0, 0, 0, 0, 1]
    geo = read_georeference(write_geotiff(str(tmp_path / "m.tif"), transformation=matrix, keys=[(2048, 4326)]))
    np.testing.assert_allclose(geo.world(10, 20), (1007, 1988))
    assert geo.epsg == 4326
    custom = write_geotiff(str(tmp_path / "c.tif"), transformation=matrix, keys=[(1024, 1), (3072, 32767)])
    assert read_georeference(custom).epsg is None


@pytest.mark.parametrize("image, world", [("scene.jpg", "scene.jgw"), ("scene.png", "scene.PGW"),
                                          ("scene.tif", "scene.tifw"), ("scene.tiff", "scene.tfw"),
                                          ("scene.jpeg", "scene.wld")])
def test_a_world_file_beside_the_image_gives_its_geotransform(tmp_path, image, world):
    """A, D, B, E, C, F = 0.5, 0.1, 0.2, -0.5, 100.25, 200.75: the centre of pixel (0, 0) is (100.25,
    200.75), so its top-left corner lies half a pixel up-left: (100.25 - 0.25 - 0.1, 200.75 - 0.05 + 0.25)
    = (99.9, 200.95); corner (40, 30) = (99.9 + 20 + 6, 200.95 + 4 - 15) = (125.9, 189.95)."""
    path = str(tmp_path / image)
    cv2.imwrite(path, PIXELS)
    (tmp_path / world).write_text("0.5\n0.1\n0.2\n-0.5\n100.25\n200.75\n")
    assert find_world_file(path) == str(tmp_path / world)
    geo = read_georeference(path)
    np.testing.assert_allclose(geo.world([0, 40], [0, 30]), [[99.9, 125.9], [200.95, 189.95]])
    assert geo.epsg is None and geo.source == str(tmp_path / world)


def test_geotiff_tags_win_over_a_world_file_whose_crs_the_geokeys_still_give(tmp_path):
    (tmp_path / "both.tfw").write_text("1\n0\n0\n-1\n0.5\n-0.5\n")
    tagged = write_geotiff(str(tmp_path / "both.tif"), scale=[2.0, 2.0, 0.0], tiepoint=[0, 0, 0, 10, 20, 0])
    np.testing.assert_allclose(read_georeference(tagged).world(1, 1), (12, 18))
    (tmp_path / "keys.tfw").write_text("1\n0\n0\n-1\n0.5\n-0.5\n")  # pixel corner (u, v) -> (u, -v)
    keys_only = read_georeference(write_geotiff(str(tmp_path / "keys.tif"), keys=[(1024, 1), (3072, UTM_33N)]))
    np.testing.assert_allclose(keys_only.world(3, 4), (3, -4))
    assert keys_only.epsg == UTM_33N and keys_only.source == str(tmp_path / "keys.tfw")


def test_images_without_a_georeference_and_unreadable_ones(tmp_path):
    png, tif = str(tmp_path / "plain.png"), str(tmp_path / "plain.tif")
    cv2.imwrite(png, PIXELS)
    write_geotiff(tif)
    assert read_georeference(png) is None and read_georeference(tif) is None
    (tmp_path / "plain.pgw").write_text("0.5\n0\n0\n-0.5\n")
    with pytest.raises(IOError, match=r"world file .*plain.pgw has 4 lines: expected six numbers"):
        read_georeference(png)
    (tmp_path / "plain.pgw").write_text("0.5\n0\n0\n-0.5\nten\n20\n")
    with pytest.raises(IOError, match=r"plain.pgw: could not convert string to float: 'ten'"):
        read_georeference(png)
    gcps = write_geotiff(str(tmp_path / "gcps.tif"), scale=[1.0, 1.0, 0.0], tiepoint=[0, 0, 0, 5, 5, 0] * 3)
    with pytest.raises(IOError, match=r"gcps.tif: 3 tiepoints \(ground control points\?\)"):
        read_georeference(gcps)


def test_a_detection_is_the_polygon_of_its_pixels_counterclockwise_on_the_ground():
    """Box x1..x2 = 10..29, y1..y2 = 20..39 inclusive: pixel corners 10..30 x 20..40; with 2 m pixels
    from (1000, 5000) north up: X 1020..1060, Y 4960..4920."""
    result = {"image_id": 7, "category_id": 9, "bbox": [10.0, 20.0, 20.0, 20.0], "score": 0.75}
    north_up = detections_geojson([result], Georeference((1000, 2, 0, 5000, 0, -2), UTM_33N), {9: "ship"}, "x")
    assert north_up["crs"] == {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::32633"}}
    feature = north_up["features"][0]
    assert feature["properties"] == {"category": "ship", "category_id": 9, "score": 0.75, "image_id": 7}
    ring = feature["geometry"]["coordinates"][0]
    assert ring == [[1020, 4960], [1020, 4920], [1060, 4920], [1060, 4960], [1020, 4960]]
    south_up = detections_geojson([result], Georeference((0, 1, 0, 0, 0, 1)), {9: "ship"})["features"][0]
    assert "crs" not in detections_geojson([], Georeference((0, 1, 0, 0, 0, 1)), {})
    for ring in (feature["geometry"]["coordinates"][0], south_up["geometry"]["coordinates"][0]):
        xs, ys = np.array(ring).T
        assert (xs[:-1] * ys[1:] - xs[1:] * ys[:-1]).sum() > 0  # shoelace: counterclockwise


# ---------------------------------------------------------------- the tester and main_test.py --images

# the oracle's images (recognised by size): a GeoTIFF, a JPEG with a world file, a PNG with neither
GEO_SET = [("geo.tif",) + IMAGES["val"][0][1:], ("world.jpg",) + IMAGES["val"][1][1:],
           ("plain.png",) + IMAGES["val"][2][1:]]


def write_geo_images(folder):
    """The three images; the GeoTIFF's pixels are 2 m from (500,000, 4,000,000) in UTM 33N, the JPEG's
    0.5 units with its first pixel's centre at (10.25, 20.75), i.e. its top-left corner at (10, 21)."""
    os.makedirs(folder, exist_ok=True)
    for name, _, height, width, _ in GEO_SET:
        pixels = np.random.default_rng(len(name)).integers(0, 255, (height, width, 3), dtype=np.uint8)
        if name.endswith(".tif"):
            write_geotiff(os.path.join(folder, name), pixels, scale=[2.0, 2.0, 0.0],
                          tiepoint=[0, 0, 0, 500000, 4000000, 0], keys=[(1024, 1), (3072, UTM_33N)])
        else:
            cv2.imwrite(os.path.join(folder, name), pixels)
    with open(os.path.join(folder, "world.jgw"), "w") as f:
        f.write("0.5\n0\n0\n-0.5\n10.25\n20.75\n")


def expected_rings(name):
    """The oracle's boxes of an image as the polygons of their pixels, mapped by hand."""
    objects = dict((n, objects) for n, _, _, _, objects in GEO_SET)[name]
    if name == "geo.tif":
        def world(u, v):
            return [500000 + 2 * u, 4000000 - 2 * v]
    else:
        def world(u, v):
            return [10 + 0.5 * u, 21 - 0.5 * v]
    return sorted([world(x1, y1), world(x1, y2 + 1), world(x2 + 1, y2 + 1), world(x2 + 1, y1), world(x1, y1)]
                  for (x1, y1, x2, y2), _ in objects)


def check_geojson(folder, category_ids, names):
    assert sorted(os.listdir(folder)) == ["geo.geojson", "world.geojson"]  # not the PNG
    for name, crs in (("geo.tif", "urn:ogc:def:crs:EPSG::32633"), ("world.jpg", None)):
        collection = json.load(open(os.path.join(folder, os.path.splitext(name)[0] + ".geojson")))
        assert collection["type"] == "FeatureCollection"
        assert collection.get("crs", {}).get("properties", {}).get("name") == crs
        rings = sorted(f["geometry"]["coordinates"][0] for f in collection["features"])
        np.testing.assert_allclose(rings, expected_rings(name))
        objects = dict((n, objects) for n, _, _, _, objects in GEO_SET)[name]
        assert sorted((f["properties"]["category_id"], f["properties"]["category"])
                      for f in collection["features"]) == sorted((category_ids[label], names[label])
                                                                 for _, label in objects)
        assert all(f["properties"]["score"] == pytest.approx(1.0) for f in collection["features"])


def test_the_tester_writes_geojson_beside_the_coco_results_for_geo_referenced_images(tiny, tmp_path):
    root = tmp_path / "data"
    write_geo_images(str(root / "images" / "geo"))
    os.makedirs(root / "annotations")
    with open(root / "annotations" / "image_info_geo.json", "w") as f:
        json.dump({"images": [{"id": i, "file_name": n, "height": h, "width": w} for n, i, h, w, _ in GEO_SET],
                   "categories": [{"id": c, "name": f"cat{c}"} for c in CATEGORY_IDS[1:]]}, f)
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "output_path": str(tmp_path / "out"),
                                   "dataset.root_path": str(tmp_path), "dataset.dataset_path": str(root),
                                   "dataset.test_image_set": "geo"})
    summary = tester.test(cfg, detector=OracleDetector(cfg, images={"geo": GEO_SET}))
    out_dir = tester.results_dir(cfg)
    assert summary["geojson"] == {"folder": os.path.join(out_dir, "geojson"), "images": 2, "unreadable": 0}
    check_geojson(summary["geojson"]["folder"], CATEGORY_IDS, [None, "cat4", "cat9"])


def test_main_test_images_writes_geojson_and_skips_what_it_cannot_read(tiny, tmp_path, caplog):
    """--images: the same GeoJSON; a malformed world file is a logged, counted skip of that image's GeoJSON
    only; an image larger than Pillow's own limit is sized (the project's limit applies), one over
    dataset.MAX_IMAGE_PIXELS is skipped with its size named."""
    from PIL import Image

    folder = str(tmp_path / "images")
    write_geo_images(folder)
    cfg = with_overrides(tiny[0], {"TEST.SOFT_NMS": False, "TEST.NUM_PROCESS": 0})
    detector = OracleDetector(cfg, images={"geo": GEO_SET})
    summary = detect_images(cfg, folder, str(tmp_path / "out"), detector=detector)
    assert (summary["tested"], summary["geojson"]["images"]) == (3, 2)
    check_geojson(str(tmp_path / "out" / "geojson"), [0, 1, 2], detector.classes)

    with open(os.path.join(folder, "plain.pgw"), "w") as f:
        f.write("not a world file\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # every image is a "decompression bomb" to Pillow now
        summary = detect_images(with_overrides(cfg, {"dataset.MAX_IMAGE_PIXELS": 4600}), folder,
                                str(tmp_path / "again"), detector=detector)
    assert (summary["tested"], summary["skipped"]) == (2, 1)  # geo.tif, 80 x 60 = 4800 px: over the limit
    assert summary["geojson"] == {"folder": str(tmp_path / "again" / "geojson"), "images": 1, "unreadable": 1}
    assert "geo.tif declares 80x60 pixels" in caplog.text and "plain.pgw has 1 lines" in caplog.text
