"""lib/paths.py: the paths messages show, relative to the current folder when they lie inside it."""
import os

from lib.paths import shown_path


def test_a_path_inside_the_current_folder_is_shown_relative_and_one_outside_absolute(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "out" / "run").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert shown_path(str(work / "out" / "run" / "best.json")) == os.path.join("out", "run", "best.json")
    assert shown_path("out/./run/../run") == os.path.join("out", "run")
    assert shown_path(str(work)) == "."
    assert shown_path(str(tmp_path / "elsewhere" / "x.png")) == str(tmp_path / "elsewhere" / "x.png")
    assert shown_path(str(tmp_path)) == str(tmp_path)  # the parent itself, not '..'
    assert shown_path(tmp_path / "workshop") == str(tmp_path / "workshop")  # a sibling sharing a prefix; PathLike
