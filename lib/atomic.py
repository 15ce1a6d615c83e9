"""Atomic file writes: the content goes to a temporary file beside the target, is fsynced, and is then
renamed onto the target (``os.replace``), so a reader, a crash or a killed run never sees a half-written
file: the target holds either its old content or the complete new one. On an exception inside the
write the temporary file is removed and the target is left untouched.

The temporary name ends with the target's own name (``.tmp-{pid}-{n}-{name}``), so writers that
look at the suffix (MXNet's savers) see the one they expect.
"""
import contextlib
import itertools
import json
import os
import pickle

_counter = itertools.count()  # distinct temporary names for concurrent writes from one process


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)  # a file or a folder
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path for a writer that takes a file name (``mx.nd.save``, ``symbol.save``);
    when the block ends without an exception, that file is fsynced and renamed onto ``path``.

    The block must create the file. The folder of ``path`` is created if needed.
    """
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{next(_counter)}-{name}")
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    try:  # make the rename itself durable (not every file system lets a folder be fsynced)
        _fsync(directory)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    """``open(tmp, mode)`` for writing; the file replaces ``path`` when the block ends cleanly."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a new file: mode must contain 'w', got {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, mode) as f:
            yield f


def write_json(obj, path):
    """``obj`` as JSON text (ASCII) at ``path``, atomically."""
    with atomic_open(path, "wb") as f:
        f.write(json.dumps(obj).encode())


def write_pickle(obj, path):
    """``obj`` pickled (highest protocol) at ``path``, atomically."""
    with atomic_open(path, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
