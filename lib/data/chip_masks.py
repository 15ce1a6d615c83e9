"""``gt_masks``: the polygons of a chip's gt boxes, encoded as the reference's iterator encodes them
(TRAIN.WITH_MASK), for the mask target operator (MaskRcnnTarget) to rasterise.

One row of ``MAX_POLYGON_LEN`` floats per row of ``gt_boxes`` (same box, same row; MAX_GT_PER_CHIP rows):

    [category, count, len_1 .. len_count, polygon_1 (x, y, ...), ..., polygon_count, -1, -1, ...]

``category`` is the box's class label - 1 (0-based foreground class, the reference's ``classes - 1``),
``len_i`` the number of coordinates of polygon i, the polygons in chip pixels, ``(p - chip origin) *
scale`` in float32 like the boxes, neither rounded nor clipped (a polygon may reach outside the chip).
Unused rows are all -1. A box with more polygons than fit keeps its first ones: the reference reserves
``2 + (all its polygons)`` header floats when deciding what fits, stops at the first polygon that does
not, and writes the header of the kept ones only (so the coordinates start at ``2 + count``). A box
without polygons (RLE-only annotation) is ``[category, 0, -1, ...]``: an empty mask.
"""
import numpy as np

from lib.data.chip_boxes import chip_origin
from symbols.mask import MAX_POLYGON_LEN  # floats per row: the network's gt_masks input (MaskRcnnTarget's)


def encode_polygons(counts, lengths, coords, categories, out):
    """Fill ``out`` (rows, MAX_POLYGON_LEN) with the layout above for boxes with ``counts`` (K,) polygons
    of ``lengths`` coordinates (ragged, lib/dataset/polygons.py) and ``categories`` (K,); boxes beyond
    the rows are left out, as the reference leaves them out (the caller drops their gt_boxes too).
    Vectorised over polygons and coordinates (a Python loop per box cost ~40 us a box)."""
    out[...] = -1
    rows, width = min(len(counts), len(out)), out.shape[1]
    counts = np.asarray(counts[:rows], np.int64)
    lengths = np.asarray(lengths[:int(counts.sum())], np.int64)
    box = np.repeat(np.arange(rows), counts)  # the box of each polygon
    box_coords = np.bincount(box, weights=lengths, minlength=rows).astype(np.int64)
    box_start = np.cumsum(box_coords) - box_coords  # the first coordinate of each box
    polygon_end = np.cumsum(lengths) - box_start[box]  # each polygon's end, counted from its box's start
    fits = 2 + counts[box] + polygon_end <= width  # a prefix of each box's polygons: the ends rise
    kept = np.bincount(box, weights=fits, minlength=rows).astype(np.int64)
    out[:rows, 0] = np.asarray(categories, np.float32)[:rows]
    out[:rows, 1] = kept
    first_polygon = np.cumsum(counts) - counts
    index_in_box = np.arange(len(lengths)) - first_polygon[box]
    out[box[fits], 2 + index_in_box[fits]] = lengths[fits]
    coord_polygon = np.repeat(np.arange(len(lengths)), lengths)
    written = fits[coord_polygon]
    coord_box = box[coord_polygon][written]
    column = 2 + kept[coord_box] + np.flatnonzero(written) - box_start[coord_box]
    out[coord_box, column] = np.asarray(coords, np.float32)[:len(coord_polygon)][written]
    return out


def chip_gt_masks(polygons, classes, im_scale, chip, out):
    """Encode into ``out`` the ``polygons`` (the three arrays of the chip's gt boxes, in gt_boxes order)
    of boxes with class labels ``classes``, moved into ``chip`` (scaled-image pixels) at ``im_scale``."""
    coords = polygons["mask_coords"].reshape(-1, 2)
    moved = ((coords - chip_origin(im_scale, chip)) * np.float32(im_scale)).reshape(-1)
    categories = np.asarray(classes, np.float32) - 1
    return encode_polygons(polygons["mask_counts"], polygons["mask_lengths"], moved, categories, out)
