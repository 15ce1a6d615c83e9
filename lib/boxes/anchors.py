"""RPN anchors: the per-cell base set and its copies over a feature map.

Anchor order (everything that indexes anchors must agree on it):

* ``base_anchors`` is ratio-major: row ``r * len(scales) + s`` has ``ratios[r]`` and ``scales[s]``.
  The RPN head's ``2A`` / ``4A`` output channels follow this anchor index ``a``.
* ``grid_anchors`` is ``(h, w, a)``: row ``(h * feat_w + w) * A + a`` is base anchor ``a`` shifted to
  feature cell ``(h, w)``, i.e. by ``(w * stride, h * stride)`` pixels.
* The RPN targets label anchors in that ``(h, w, a)`` order and hand the network
  ``labels.reshape(H, W, A).transpose(2, 0, 1).reshape(-1)`` (layout ``(A, H, W)`` flattened), and
  bbox targets as ``(4A, H, W)`` with channel ``4a + c``. The compiled proposal-target operator reads
  the RPN outputs in that same ``(A, H, W)`` layout and generates anchors with this module's rule
  (the same ANCHOR_RATIOS / ANCHOR_SCALES from the config).
"""
import numpy as np


def base_anchors(stride, ratios, scales):
    """float32 (len(ratios) * len(scales), 4) anchors centred on the stride x stride cell at the origin.

    Classic Faster R-CNN rule: for each ratio (height / width) keep the cell's area, take
    ``w = round(sqrt(stride**2 / ratio))`` and ``h = round(w * ratio)`` (NumPy rounding, half to
    even), then multiply both by each scale; the box is centred on ``((stride - 1) / 2,) * 2``.
    """
    ratios = np.asarray(ratios, dtype=np.float64).reshape(-1)
    scales = np.asarray(scales, dtype=np.float64).reshape(-1)
    if stride <= 0 or ratios.size == 0 or scales.size == 0 or np.any(ratios <= 0) or np.any(scales <= 0):
        raise ValueError(
            f"base_anchors: need stride > 0 and non-empty positive ratios/scales, "
            f"got stride={stride}, ratios={ratios.tolist()}, scales={scales.tolist()}"
        )
    centre = 0.5 * (stride - 1)
    ratio_widths = np.round(np.sqrt(stride * stride / ratios))
    ratio_heights = np.round(ratio_widths * ratios)
    widths = (ratio_widths[:, None] * scales[None, :]).reshape(-1)
    heights = (ratio_heights[:, None] * scales[None, :]).reshape(-1)
    return np.stack(
        [centre - 0.5 * (widths - 1), centre - 0.5 * (heights - 1), centre + 0.5 * (widths - 1), centre + 0.5 * (heights - 1)],
        axis=1,
    ).astype(np.float32)


def grid_anchors(base, feat_h, feat_w, stride):
    """float32 (feat_h * feat_w * A, 4) anchors for every feature cell, in (h, w, a) order."""
    base = np.asarray(base, dtype=np.float32)
    if base.ndim != 2 or base.shape[1] != 4:
        raise ValueError(f"grid_anchors: base must have shape (A, 4), got {base.shape}")
    if feat_h < 0 or feat_w < 0 or stride <= 0:
        raise ValueError(f"grid_anchors: need feat_h, feat_w >= 0 and stride > 0, got {feat_h}, {feat_w}, {stride}")
    shift_y, shift_x = np.meshgrid(np.arange(feat_h) * stride, np.arange(feat_w) * stride, indexing="ij")
    shifts = np.stack([shift_x, shift_y, shift_x, shift_y], axis=-1).reshape(-1, 1, 4).astype(np.float32)
    return (shifts + base[None, :, :]).reshape(-1, 4)
