"""Instance polygons of a roidb entry, as three flat NumPy arrays beside its boxes (TRAIN.WITH_MASK).

A box has any number of polygons (COCO splits an occluded object into parts); Python lists of lists
would cost a pickle object per polygon in the roidb cache and in every copy of an entry, so they are
stored ragged:

* ``mask_counts`` int32 (N,): polygons of box n, in the order of ``boxes`` (0: no polygon, e.g. an
  annotation whose segmentation is RLE only: the mask branch then learns an empty mask, as in the
  reference);
* ``mask_lengths`` int32 (S,): coordinates of each polygon (even, at least 6), box after box;
* ``mask_coords`` float32 (C,): the polygons' ``x0, y0, x1, y1, ...``, one after the other, in original
  image pixels (COCO's continuous coordinates, as the annotation file has them).
"""
import numpy as np

POLYGON_KEYS = ("mask_counts", "mask_lengths", "mask_coords")


def pack_polygons(per_box):
    """``[[polygon (2K,) ...] per box]`` -> the three arrays of an entry (module docstring)."""
    lengths = [len(polygon) for polygons in per_box for polygon in polygons]
    coords = [np.asarray(polygon, np.float32) for polygons in per_box for polygon in polygons]
    return {
        "mask_counts": np.array([len(polygons) for polygons in per_box], np.int32),
        "mask_lengths": np.array(lengths, np.int32),
        "mask_coords": np.concatenate(coords) if coords else np.zeros(0, np.float32),
    }


def _spans(starts, stops):
    """Concatenated ``arange(start, stop)`` of every pair, without a Python loop."""
    sizes = stops - starts
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(sizes)
    return np.arange(total) - np.repeat(ends - sizes, sizes) + np.repeat(starts, sizes)


def select_polygons(entry, rows):
    """The three arrays of the boxes ``rows`` (indices or a bool mask over the boxes), in that order."""
    counts, lengths = entry["mask_counts"], entry["mask_lengths"]
    rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, np.int64).reshape(-1)
    first_polygon = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    polygons = _spans(first_polygon[rows], first_polygon[rows + 1])
    first_coord = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    coords = _spans(first_coord[polygons], first_coord[polygons + 1])
    return {"mask_counts": counts[rows], "mask_lengths": lengths[polygons], "mask_coords": entry["mask_coords"][coords]}


def box_polygons(polygons, index):
    """The polygons of box ``index`` as a list of (2K,) float32 arrays (for tests and tools)."""
    counts, lengths = polygons["mask_counts"], polygons["mask_lengths"]
    first = int(np.sum(counts[:index]))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return [polygons["mask_coords"][starts[i]:ends[i]] for i in range(first, first + int(counts[index]))]


def flip_polygons(coords, width):
    """``mask_coords`` mirrored in an image ``width`` pixels wide: x -> width - 1 - x, the reference's
    formula (that of inclusive boxes, so a mirrored polygon keeps its place in its mirrored box)."""
    flipped = np.array(coords, np.float32)
    flipped[0::2] = np.float32(width - 1) - flipped[0::2]
    return flipped
