"""lib/atomic.py: a target file is replaced whole or not at all, and no temporary file is left behind."""
import json
import os
import pickle

import pytest

from lib import atomic
from lib.atomic import atomic_open, atomic_path, write_json, write_pickle


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
    with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
        write_pickle(lambda: None, str(old_file))
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

    nested = tmp_path / "a" / "b" / "proposals.pkl"  # missing folders are created
    write_pickle({7: [1.5]}, str(nested))
    with open(nested, "rb") as f:
        assert pickle.load(f) == {7: [1.5]}
    assert sorted(os.listdir(tmp_path)) == ["a", "results.json"]
    assert os.listdir(nested.parent) == ["proposals.pkl"]


def test_the_new_file_gets_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    write_json([], str(tmp_path / "x.json"))
    assert os.stat(tmp_path / "x.json").st_mode & 0o777 == 0o666 & ~umask
