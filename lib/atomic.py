"""Atomic file writes: the content goes to a temporary file beside the target, is fsynced, and is then
renamed onto the target (``os.replace``), so a reader, a crash or a killed run never sees a half-written
file: the target holds either its old content or the complete new one. On an exception inside the
write the temporary file is removed and the target is left untouched; a full disk is reported as such,
naming the target and the bytes it needed.

The temporary name ends with the target's own name (``.tmp-{pid}-{n}-{name}``), so writers that
look at the suffix (MXNet's savers) see the one they expect. Only ``kill -9`` (or a power cut) can
leave one behind; ``remove_stale_temporaries`` clears those of dead processes.
"""
import contextlib
import errno
import itertools
import json
import logging
import os
import re
import shutil

logger = logging.getLogger(__name__)

_counter = itertools.count()  # distinct temporary names for concurrent writes from one process
_TEMPORARY = re.compile(r"\.tmp-(\d+)-\d+-.+")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)  # a file or a folder
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def disk_full_error(path, needed, written, directory):
    """The OSError(ENOSPC) that names ``path``, the bytes it needed and what the disk had."""
    free = shutil.disk_usage(directory).free
    needed = f"{needed} bytes needed" if needed is not None else "size unknown"
    return OSError(errno.ENOSPC, f"no space left on device for {path}: {needed}, {written} written, {free} "
                                 f"bytes free in {directory}; the previous file (if any) is unchanged")


@contextlib.contextmanager
def atomic_path(path, size=None):
    """Yield a temporary path for a writer that takes a file name (``mx.nd.save``, ``symbol.save``);
    when the block ends without an exception, that file is fsynced and renamed onto ``path``.

    The block must create the file. The folder of ``path`` is created if needed. ``size``, the bytes the
    file will need when the caller knows them, is checked against the free space first (MXNet's savers
    report a full disk only as a generic error) and named if the write fails for lack of space.
    """
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if size is not None and shutil.disk_usage(directory).free < size:
        raise disk_full_error(path, size, 0, directory)
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{next(_counter)}-{name}")
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except OSError as err:
        if err.errno not in _DISK_FULL:
            raise
        raise disk_full_error(path, size, _size(tmp), directory) from err
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    try:  # make the rename itself durable (not every file system lets a folder be fsynced)
        _fsync(directory)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_open(path, mode="wb", size=None):
    """``open(tmp, mode)`` for writing; the file replaces ``path`` when the block ends cleanly."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a new file: mode must contain 'w', got {mode!r}")
    with atomic_path(path, size) as tmp:
        with open(tmp, mode) as f:
            yield f


def write_bytes(data, path):
    """``data`` (bytes) at ``path``, atomically."""
    with atomic_open(path, "wb", size=len(data)) as f:
        f.write(data)


def write_json(obj, path):
    """``obj`` as JSON text (ASCII) at ``path``, atomically."""
    write_bytes(json.dumps(obj).encode(), path)


def remove_stale_temporaries(folder):
    """Remove the temporary files that writers killed mid-write left in ``folder`` (not recursive); those
    of a process still running are kept. Each removal is logged; returns the removed paths."""
    removed = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        match = _TEMPORARY.fullmatch(name)
        if not match or _running(int(match.group(1))):
            continue
        path = os.path.join(folder, name)
        size = _size(path)
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        logger.warning("removed %s (%d bytes), left by an interrupted write of process %s", path, size,
                       match.group(1))
        removed.append(path)
    return removed


def _running(pid):
    if pid == os.getpid():
        return False  # this process has no write in progress when it asks
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
