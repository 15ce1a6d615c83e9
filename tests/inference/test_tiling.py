"""The tiled test (TEST.TILE, lib.inference.tiling): tile geometry, the border and ownership rules
hand-worked, equivalence with the whole-image test, and canvases bounded by the tile size."""
import numpy as np
import pytest

from detector_helpers import BLOB_IMAGES as IMAGES, BLOB_SQUARES as SQUARES, NUM_CLASSES, ComponentNetwork, blob_image, \
    random_tiny_params, stand_in_detector

from lib.config import load_config
from lib.inference.detector import Detector
from lib.inference.merge import candidate_rows
from lib.inference.streaming import ArrayImages
from lib.inference.regions import Region
from lib.inference.tiling import Tiling, in_core, region_thresholded


def test_spans_cover_the_axis_with_whole_pixel_tiles_the_last_ending_at_the_edge():
    tiling = Tiling(400, 100)
    assert tiling.spans(0, 400, 1.0) == [(0, 400)]  # fits
    # 400 px tiles, stepping 400 - 100
    assert tiling.spans(0, 1000, 1.0) == [(0, 400), (300, 700), (600, 1000)]
    # scale 2: floor(400 / 2) = 200 px tiles, overlap ceil(100 / 2) = 50, step 150; the last from 800
    assert tiling.spans(0, 1000, 2.0) == [(0, 200), (150, 350), (300, 500), (450, 650), (600, 800), (750, 950),
                                          (800, 1000)]
    # scale 0.3: 1333 px tiles of at most 400 network pixels, overlap ceil(333.3) = 334
    spans = tiling.spans(0, 3000, 0.3)
    assert all((b - a) * 0.3 <= 400 for a, b in spans) and spans[-1][1] == 3000
    assert all(spans[i][1] - spans[i + 1][0] >= 100 / 0.3 for i in range(len(spans) - 1))


def test_tiles_carry_cores_split_at_the_middle_of_each_overlap():
    tiles = Tiling(400, 100).split(Region(0, (0.0, 0.0, 1000.0, 300.0)), 1.0)
    assert [t.box for t in tiles] == [(0, 0.0, 400, 300.0), (300, 0.0, 700, 300.0), (600, 0.0, 1000, 300.0)]
    inf = float("inf")
    assert [t.core for t in tiles] == [(-inf, -inf, 350.0, inf), (350.0, -inf, 650.0, inf), (650.0, -inf, inf, inf)]
    whole = Region(0, (0.0, 0.0, 400.0, 300.0))
    assert Tiling(400, 100).split(whole, 1.0) == [whole]


def test_a_detection_cut_by_an_inner_tile_border_is_dropped_for_the_tile_holding_it_whole():
    """Image 1000 x 300 at scale 1 in the tiles above. An object at x 380-420 is cut by tile 0's right
    edge (400): tile 0 sees 380-400 and drops it (its right edge on the inner edge), tile 1 (300-700)
    holds it whole, 80 px from its left edge, centred (400) in its core [350, 650): kept once. An object
    at 610-640 is whole in tiles 1 and 2 (10+ px from their edges): only tile 1 owns its centre (625 < 650).
    Edges on the image border are not inner: a box at 0-30 of tile 0 stays."""
    tiles = Tiling(400, 100).split(Region(0, (0.0, 0.0, 1000.0, 300.0)), 1.0)
    scores = np.array([[0.1, 0.9]] * 2, np.float32)
    size, valid, thresh = (300, 1000), (-1, -1), 0.001

    def kept(tile, boxes):  # boxes in the tile's own pixels
        rows = candidate_rows(region_thresholded(tile, (np.array(boxes, np.float64), scores[:len(boxes)]), size,
                                                 thresh), valid)
        return rows[:, :4].tolist()

    assert kept(tiles[0], [[380, 50, 400, 90], [0, 50, 30, 90]]) == [[0, 50, 30, 90]]
    assert kept(tiles[1], [[80, 50, 120, 90], [310, 50, 340, 90]]) == [[380, 50, 420, 90], [610, 50, 640, 90]]
    assert kept(tiles[2], [[10, 50, 40, 90]]) == []  # 610-640, 10 px from tile 2's edge, but tile 1's
    # 9.9 px from an inner edge is cut, 10 px is not (focus_chips.BORDER_MARGIN, as AutoFocus's chips)
    assert kept(tiles[1], [[9.9, 50, 120, 90], [10, 50, 120, 90]]) == [[310, 50, 420, 90]]
    np.testing.assert_array_equal(in_core(np.array([[340.0, 0, 360, 10], [330.0, 0, 350, 10]]), tiles[1].core),
                                  [True, False])  # centres 350 (the core's first column) and 340


def sorted_rows(rows):
    return rows[np.lexsort(rows.T[::-1])]




def test_tiled_detections_are_the_whole_image_detections_of_a_translation_equivariant_network():
    """Scales 1 and 2 (integer tile origins: a tile resized is the matching window of the image resized,
    interpolation weights included, but for the tile's edge pixels, which only blobs cut by the edge touch).
    Overlap 2 * (60 + 20) network pixels holds every object whole in the tile owning its centre, so tiles
    find each object once, with the whole image's box: the rows are equal up to their order (suppression of
    non-overlapping boxes keeps them all; exact: integer boxes divided by 1 or 2)."""
    scales, ranges = [2.0, 1.0], [[-1, -1], [-1, -1]]
    whole = stand_in_detector(SCALES=scales, VALID_RANGES=ranges)
    tiled = stand_in_detector(SCALES=scales, VALID_RANGES=ranges, TILE=[300, 160])
    expected = whole.detect(IMAGES)
    found = dict(tiled.run(ArrayImages(IMAGES)))
    assert len(expected[0]) == len(SQUARES)  # every square (found at both scales, the same box: NMS keeps one)
    for index, rows in enumerate(expected):
        np.testing.assert_array_equal(sorted_rows(found[index]), sorted_rows(rows))
    # the network never saw a canvas larger than a tile
    assert max(max(h, w) for _, _, h, w in tiled.network.forward.canvases) <= 300
    assert max(max(h, w) for _, _, h, w in whole.network.forward.canvases) == 1800


def test_worker_processes_give_the_in_process_tiled_detections():
    detector = stand_in_detector(SCALES=[2.0, 1.0], VALID_RANGES=[[-1, -1], [-1, -1]], TILE=[300, 160])
    in_process = dict(detector.run(ArrayImages(IMAGES)))
    with_workers = dict(detector.run(ArrayImages(IMAGES), num_workers=2))
    assert sorted(with_workers) == [0, 1]
    for index, rows in in_process.items():
        np.testing.assert_array_equal(with_workers[index], rows)  # same canvases, same stand-in: same rows


def test_where_every_image_fits_a_tile_the_tiled_test_is_the_whole_image_test():
    """The tiny network, randomly initialised, at the default's batching (two parts, two images per
    device, three scales): with tiles larger than every scaled image the pipeline runs the same batches on
    the same canvases, so the detections are equal (the same computation, not merely close)."""
    from lib.dataset.base import numbered_classes

    def tiny_cfg(**extra):
        return load_config(None, {"symbol": "resnet_tiny", "gpus": "", "TEST.fp16": False, "dataset.NUM_CLASSES": NUM_CLASSES,
                          "TEST.SCALES": [[96, 128], [64, 96], [32, 48]], "TEST.RPN_PRE_NMS_TOP_N": 500,
                          "TEST.RPN_POST_NMS_TOP_N": 50, **extra})

    args, auxs = random_tiny_params(tiny_cfg())
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 255, shape, dtype=np.uint8) for shape in [(40, 70, 3), (90, 30, 3), (12, 9, 3),
                                                                        (60, 60, 3), (33, 80, 3)]]
    whole = Detector.from_params(tiny_cfg(), numbered_classes(NUM_CLASSES), args, auxs)
    tiled = Detector.from_params(tiny_cfg(**{"TEST.TILE": [160, 32]}), numbered_classes(NUM_CLASSES), args, auxs)
    expected = whole.detect(images)
    found = dict(tiled.run(ArrayImages(images)))
    assert sum(len(rows) for rows in expected) > 0
    for index, rows in enumerate(expected):
        np.testing.assert_array_equal(found[index], rows)


def test_canvases_of_a_20000_px_image_stay_within_the_tile(monkeypatch):
    """The plan alone (no pixels): a 20,000 x 20,000 image at the tiny default's scales (3.0, 1.667, longer
    side 512) in 1024 px tiles: every forward pass is at most BATCH_IMAGES x 3 x 1024 x 1024 floats, and the
    tiles cover each scaled image (the count hand-worked for scale 3: tiles of floor(1024 / 3) = 341 px
    stepping 341 - ceil(320 / 3) = 234 px, ceil((20000 - 341) / 234) + 1 = 86 a side)."""
    from lib.inference.regions import whole_region
    from lib.inference.tiling import Tiling

    tiling = Tiling(1024, 320)
    tiles = tiling.split(whole_region(ArrayImages([]), 0, (20000, 20000), 3.0), 3.0)
    assert len(tiles) == 86 * 86
    assert all(max(t.extent) * 3.0 <= 1024 for t in tiles)
    detector = stand_in_detector(SCALES=[3.0, 1.667, 512.0], VALID_RANGES=[[-1, 90], [32, 180], [75, -1]],
                                 TILE=[1024, 320], BATCH_IMAGES=[2, 2, 4])
    shapes = []

    class Sized(ArrayImages):  # the plan needs the size only
        def sizes(self):
            return [(20000, 20000)]

    def record(network, source, batches, *args, **kwargs):
        shapes.extend(network.forward_shape(batch) for batch in batches)
        return iter(())

    monkeypatch.setattr("lib.inference.regions.run_pipeline", record)
    assert list(detector.strategy.run(Sized([]))) == []
    assert len(shapes) > 86 * 86 // 2
    assert max(b * h * w for b, h, w in shapes) <= 4 * 1024 * 1024
    assert max(max(h, w) for _, h, w in shapes) <= 1024


@pytest.mark.parametrize("tile, message", [([512], "TEST.TILE"), ([512, 512], "overlap < size"),
                                           ([512.5, 10], "integers")])
def test_tile_setting_errors_name_the_key(tile, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, {"TEST.TILE": tile})


class FocusComponentNetwork(ComponentNetwork):
    """The blob finder with a FocusPixel map: a 16 px cell is a FocusPixel when it holds a blob pixel."""

    def __call__(self, data, im_info):
        outputs = super().__call__(data, im_info)
        batch, _, height, width = data.shape
        cells = np.zeros((batch, 2, -(-height // 16), -(-width // 16)), np.float32)
        for slot in range(batch):
            mask = np.zeros((cells.shape[2] * 16, cells.shape[3] * 16), bool)
            mask[:height, :width] = data[slot].sum(axis=0) > 0
            cells[slot, 1] = mask.reshape(cells.shape[2], 16, cells.shape[3], 16).any(axis=(1, 3))
        cells[:, 0] = 1 - cells[:, 1]
        outputs["scale_prob_output"] = cells
        return outputs


def test_autofocus_on_a_large_image_tiles_the_coarse_scale_and_only_the_focus_chips_of_the_fine_one():
    """AutoFocus with TEST.TILE: the coarse scale (1.0) of the 900 x 420 image runs in 300 px tiles, the fine
    scale (2.0) only on the FocusChips around the blobs, themselves tiled where larger than a tile. Every
    canvas fits the tile, the fine scale processes a fraction of the whole image's pixels, and each square
    is found with its own box (the blob finder is exact at both scales)."""
    from lib.inference.autofocus import AutoFocusStats

    detector = stand_in_detector({"network.AUTO_FOCUS": True}, SCALES=[1.0, 2.0], VALID_RANGES=[[-1, -1]] * 2,
                                 TILE=[300, 160], AUTO_FOCUS=True, DO_PRUNING=[False, True],
                                 CHIP_HYPERPARAMS=[[1, 0.5, 4], [-1, -1, -1]])
    detector.network.forward = FocusComponentNetwork()
    stats = AutoFocusStats()
    found = dict(detector.strategy.run(ArrayImages(IMAGES[:1]), 0, stats=stats))[0]
    assert max(max(h, w) for _, _, h, w in detector.network.forward.canvases) <= 300
    coarse, fine = stats.levels
    assert coarse.regions == 6 * 2  # 900 x 420 at scale 1: tiles of 300 px stepping 300 - 160
    assert fine.pixels < 0.6 * fine.full_pixels
    expected = sorted_rows(np.array([[x, y, x + side, y + side] for x, y, side in SQUARES], np.float64))
    np.testing.assert_array_equal(sorted_rows(found[:, :4].astype(np.float64)), expected)
