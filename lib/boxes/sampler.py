"""Random subsampling of labelled anchors to a fixed-size minibatch (RPN targets)."""
import numpy as np


def subsample(labels, batch_size, fg_fraction, rng):
    """Copy of labels (1 / 0 / -1) with surplus positives and negatives set to -1.

    Keeps at most ``int(fg_fraction * batch_size)`` positives, then at most ``batch_size`` minus the
    kept positives negatives; which ones survive is drawn uniformly with ``rng`` (a
    ``numpy.random.Generator`` or ``RandomState``, passed in so data-loader workers stay reproducible).
    """
    if batch_size < 0 or not 0.0 <= fg_fraction <= 1.0:
        raise ValueError(f"subsample: need batch_size >= 0 and 0 <= fg_fraction <= 1, got {batch_size}, {fg_fraction}")
    labels = np.array(labels, copy=True)
    max_fg = int(fg_fraction * batch_size)
    fg = np.flatnonzero(labels == 1)
    if fg.size > max_fg:
        labels[rng.choice(fg, fg.size - max_fg, replace=False)] = -1
    max_bg = batch_size - min(fg.size, max_fg)
    bg = np.flatnonzero(labels == 0)
    if bg.size > max_bg:
        labels[rng.choice(bg, bg.size - max_bg, replace=False)] = -1
    return labels
