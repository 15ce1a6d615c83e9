"""Where an image lies on the ground: its geotransform, from GeoTIFF tags or a world file beside it.

``read_georeference(path)`` gives a ``Georeference`` (an affine map from pixel corners to the image's
coordinate system, and the CRS's EPSG code when the GeoKeys name one) or None for an image that carries
neither. Sources, in the order GDAL reads them by default:

- GeoTIFF tags (TIFF and BigTIFF, read with tifffile from the tag directory alone, no pixel decoded):
  ``ModelTransformation``, or ``ModelTiepoint`` with ``ModelPixelScale``; ``GTRasterTypeGeoKey``
  PixelIsPoint puts raster (0, 0) at the first pixel's centre, PixelIsArea (the default) at its corner.
- A world file ``NAME.EXT`` + ``w`` (``.tifw``, ``.jpgw``), the first and last letters of the extension
  + ``w`` (``.tfw``, ``.jgw``, ``.pgw``) or ``.wld``: six lines A, D, B, E, C, F with
  ``X = A col + B row + C``, ``Y = D col + E row + F`` at the pixel centres (col, row).

The EPSG code comes from ``ProjectedCSTypeGeoKey``, else ``GeographicTypeGeoKey`` (user-defined: none).
pyvips exposes no GeoTIFF tag, and Pillow refuses to open images over 179 Mpx (its decompression-bomb
guard) and misreads big-endian BigTIFF headers; tifffile reads any TIFF's tags.

A georeference that cannot be read (a malformed world file, broken tags) is a ``DataFileError`` (an
IOError) naming the file: the caller skips the image's geo-referenced output, the rest of its output stands.
"""
import os
from dataclasses import dataclass

import numpy as np

from lib.errors import DataFileError

_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # TIFF and BigTIFF, either byte order
_MODEL_TAGS = {33550: "ModelPixelScale", 33922: "ModelTiepoint", 34264: "ModelTransformation"}
_GEOKEY_DIRECTORY = 34735
_PIXEL_IS_POINT = 2  # GTRasterTypeGeoKey
_USER_DEFINED = 32767  # a GeoKey code meaning "defined by other keys", not an EPSG code


@dataclass(frozen=True)
class Georeference:
    """``X = a + b u + c v``, ``Y = d + e u + f v`` for pixel-corner coordinates (u, v): (0, 0) the
    top-left corner of the top-left pixel, (width, height) the bottom-right corner of the last (GDAL's
    geotransform order). ``epsg``: the CRS's EPSG code or None; ``source``: the file it was read from."""
    affine: tuple
    epsg: object = None
    source: str = ""

    def world(self, u, v):
        """World coordinates (X, Y) of pixel-corner coordinates (arrays or numbers)."""
        a, b, c, d, e, f = self.affine
        return a + b * np.asarray(u) + c * np.asarray(v), d + e * np.asarray(u) + f * np.asarray(v)

    @property
    def flips(self):
        """Whether the map reverses orientation (north-up images do: rows run down, Y up)."""
        return self.affine[1] * self.affine[5] - self.affine[2] * self.affine[4] < 0


def read_georeference(path):
    """The Georeference of the image at ``path``, or None when it carries none (module docstring);
    DataFileError naming the file when one is there but cannot be read."""
    epsg, affine, source = None, None, path
    if _is_tiff(path):
        epsg, affine = _geotiff(path)
    if affine is None:
        world_file = find_world_file(path)
        if world_file is None:
            return None
        affine, source = read_world_file(world_file), world_file
    return Georeference(affine, epsg, source)


def _is_tiff(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) in _TIFF_MAGIC
    except OSError:
        return False  # the image's own reading reports it


def _geotiff(path):
    """(EPSG code or None, affine or None) from a TIFF's GeoKeys and model tags."""
    try:
        import tifffile
    except ImportError as err:
        raise DataFileError(f"cannot read the GeoTIFF tags of {path}: tifffile is not installed "
                            f"(requirements.txt): {err}") from None
    try:
        with tifffile.TiffFile(path) as tiff:
            tags = tiff.pages[0].tags
            model = {name: tags[code].value for code, name in _MODEL_TAGS.items() if code in tags}
            keys = tiff.geotiff_metadata if _GEOKEY_DIRECTORY in tags else {}
    except Exception as err:  # tifffile raises many types for a damaged tag directory
        raise DataFileError(f"cannot read the GeoTIFF tags of {path}: {err}") from None
    keys = {**(keys or {}), **model}
    code = keys.get("ProjectedCSTypeGeoKey", keys.get("GeographicTypeGeoKey"))
    epsg = int(code) if isinstance(code, (int, np.integer)) and 0 < int(code) < _USER_DEFINED else None
    try:
        affine = _model_affine(keys)
    except (TypeError, ValueError) as err:
        raise DataFileError(f"GeoTIFF tags of {path}: {err}") from None
    if affine is not None and int(keys.get("GTRasterTypeGeoKey", 1)) == _PIXEL_IS_POINT:
        affine = _from_centres(affine)
    return epsg, affine


def _model_affine(keys):
    """The raster-to-model affine of the GeoTIFF model tags (raster coordinates as the tags define them)."""
    if "ModelTransformation" in keys:
        m = np.asarray(keys["ModelTransformation"], np.float64).ravel()
        if m.size != 16:
            raise ValueError(f"ModelTransformation has {m.size} values, not 16")
        return float(m[3]), float(m[0]), float(m[1]), float(m[7]), float(m[4]), float(m[5])
    if "ModelTiepoint" not in keys or "ModelPixelScale" not in keys:
        return None
    tie = np.asarray(keys["ModelTiepoint"], np.float64).ravel()
    scale = np.asarray(keys["ModelPixelScale"], np.float64).ravel()
    if tie.size != 6:  # several tiepoints without a transformation are ground control points
        raise ValueError(f"{tie.size / 6:g} tiepoints (ground control points?), not the one tiepoint of an affine "
                         f"georeference (GCP warping is not supported)")
    if scale.size < 2:
        raise ValueError(f"ModelPixelScale has {scale.size} value(s), not (x, y[, z])")
    i, j, x, y = tie[0], tie[1], tie[3], tie[4]
    return x - i * scale[0], scale[0], 0.0, y + j * scale[1], 0.0, -scale[1]


def _from_centres(affine):
    """An affine of pixel-centre coordinates (raster (0, 0) at the first pixel's centre) as one of pixel
    corners: the centre of pixel (col, row) is the corner coordinate (col + 1/2, row + 1/2)."""
    a, b, c, d, e, f = affine
    return a - (b + c) / 2, b, c, d - (e + f) / 2, e, f


def find_world_file(path):
    """The world file beside the image ``path`` (module docstring), or None."""
    stem, ext = os.path.splitext(path)
    ext = ext[1:]
    names = [f"{ext}w", f"{ext[:1]}{ext[-1:]}w", "wld"] if ext else ["wld"]
    for name in dict.fromkeys(names):
        for candidate in (f"{stem}.{name.lower()}", f"{stem}.{name.upper()}"):
            if os.path.isfile(candidate):
                return candidate
    return None


def read_world_file(path):
    """The corner affine of a world file (six numbers: A, D, B, E, C, F; centre of the first pixel)."""
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise DataFileError(f"cannot read world file {path}: {err}") from None
    if len(lines) != 6:
        raise DataFileError(f"world file {path} has {len(lines)} lines: expected six numbers, one a line "
                            f"(A, D, B, E, C, F)")
    try:
        a, d, b, e, c, f = (float(value) for value in lines)
    except ValueError as err:
        raise DataFileError(f"world file {path}: {err} (expected six numbers, one a line: A, D, B, E, C, "
                            f"F)") from None
    return _from_centres((c, a, b, f, d, e))
