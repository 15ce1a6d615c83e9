"""lib/atomic.py: a target file is replaced whole or not at all, and no temporary file is left behind."""
import errno
import json
import os
import subprocess
import sys

import pytest

from lib import atomic
from lib.atomic import atomic_open, atomic_path, remove_stale_temporaries, write_bytes, write_json


class Crash(Exception):
    pass


@pytest.fixture
def old_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"old": true}')
    return path


def test_an_exception_inside_the_write_leaves_the_old_file_and_no_temporary(old_file):
    with pytest.raises(Crash):
        with atomic_open(str(old_file), "w") as f:
            f.write('{"new": ')  # half of the new content reaches the temporary file
            f.flush()
            raise Crash
    assert old_file.read_text() == '{"old": true}'
    assert os.listdir(old_file.parent) == ["results.json"]

    with pytest.raises(Crash):  # the same for writers that take a file name (MXNet's savers)
        with atomic_path(str(old_file)) as tmp:
            assert os.path.dirname(tmp) == str(old_file.parent) and tmp.endswith("results.json")
            with open(tmp, "w") as f:
                f.write("partial")
            raise Crash
    assert old_file.read_text() == '{"old": true}'
    assert os.listdir(old_file.parent) == ["results.json"]


def test_an_unserialisable_object_does_not_truncate_the_target(old_file):
    with pytest.raises(TypeError):
        write_json({"fine": 1, "bad": object()}, str(old_file))
    assert old_file.read_text() == '{"old": true}'
    assert os.listdir(old_file.parent) == ["results.json"]


def test_a_finished_write_replaces_the_target_after_an_fsync(old_file, tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: events.append("replace") or real_replace(a, b))
    write_json({"new": [1, 2]}, str(old_file))
    assert json.loads(old_file.read_text()) == {"new": [1, 2]}
    assert events[:2] == ["fsync", "replace"]  # the content is on disk before the rename can be

    nested = tmp_path / "a" / "b" / "cache.bin"  # missing folders are created
    write_bytes(b"\x00\x01", str(nested))
    assert nested.read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a", "results.json"]
    assert os.listdir(nested.parent) == ["cache.bin"]


def test_the_new_file_gets_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    write_json([], str(tmp_path / "x.json"))
    assert os.stat(tmp_path / "x.json").st_mode & 0o777 == 0o666 & ~umask


class FullDisk:
    """A file whose writes stop after ``room`` bytes with ENOSPC, as a full disk's do."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, data):
        self.f.write(data[:self.room])
        self.f.flush()
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_full_disk_names_the_file_and_the_bytes_needed_and_keeps_the_old_file(old_file, monkeypatch):
    real_open = open
    monkeypatch.setattr(atomic, "open", lambda path, mode: FullDisk(real_open(path, mode), room=10), raising=False)
    new = {"new": "x" * 100}
    with pytest.raises(OSError) as info:
        write_json(new, str(old_file))
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert str(old_file) in message and f"{len(json.dumps(new))} bytes needed" in message and "10 written" in message
    assert old_file.read_text() == '{"old": true}'
    assert os.listdir(old_file.parent) == ["results.json"]


def test_too_little_free_space_is_found_before_writing(old_file, monkeypatch):
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: type("usage", (), {"free": 5})())
    with pytest.raises(OSError, match=r"results.json: 18 bytes needed, 0 written, 5 bytes free"):
        write_bytes(b"x" * 18, str(old_file))
    assert old_file.read_text() == '{"old": true}'
    assert os.listdir(old_file.parent) == ["results.json"]


def test_temporaries_of_killed_writers_are_removed_and_those_of_running_ones_kept(tmp_path, caplog):
    # a writer killed by SIGKILL in the middle of its write leaves its temporary file behind
    script = (f"import sys, os; sys.path.insert(0, {os.getcwd()!r}); from lib.atomic import atomic_open\n"
              f"with atomic_open({str(tmp_path / 'model-0001.params')!r}) as f:\n"
              f"    f.write(b'partial'); f.flush(); os.kill(os.getpid(), 9)")
    killed = subprocess.run([sys.executable, "-c", script])
    assert killed.returncode == -9
    (leftover,) = os.listdir(tmp_path)
    assert leftover.startswith(".tmp-") and leftover.endswith("-model-0001.params")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f".tmp-{running.pid}-0-model-0002.params"
        busy.write_bytes(b"being written")
        (tmp_path / "model-0001.states").write_bytes(b"kept")
        with caplog.at_level("WARNING"):
            removed = remove_stale_temporaries(str(tmp_path))
    finally:
        running.kill()
        running.wait()
    assert removed == [str(tmp_path / leftover)]
    assert sorted(os.listdir(tmp_path)) == sorted([busy.name, "model-0001.states"])
    assert f"removed {tmp_path / leftover} (7 bytes)" in caplog.text
