"""Paths as messages show them: relative to the current folder when they lie inside it (``output/run/x.png``
rather than a long absolute path that differs between machines), else absolute. Standard library only."""
import os


def shown_path(path):
    """``path`` for a message: relative to the current folder when under it, else absolute ('.' for it)."""
    absolute = os.path.abspath(os.fspath(path))
    relative = os.path.relpath(absolute)
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative
