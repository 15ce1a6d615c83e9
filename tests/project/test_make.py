"""The Makefile's user side: `make help`, the closing "ready; next:" line, and the choice of the interpreter (the
newest supported one on the PATH that runs; an explicit PYTHON checked against the venv's; one line otherwise)."""
import os
import re
import subprocess
import sys

from lib.bootstrap import ROOT

HOOK_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS", "MAKELEVEL")}
VERSION = "%d.%d" % sys.version_info[:2]


def make(*args, env=None):
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env or HOOK_ENV, timeout=600)


def fake_python(folder, name, body):
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_help_lists_every_target_a_user_calls():
    with open(os.path.join(ROOT, "Makefile")) as f:
        phony = re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", f.read(), re.M).group(1).replace("\\\n", " ").split()
    internal = {"all", "venv", "build", "extensions", "python-check"}  # steps of `make`, not called alone
    result = make("help")
    assert result.returncode == 0 and result.stderr == ""
    listed = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", result.stdout))
    assert set(phony) - internal <= listed, sorted(set(phony) - internal - listed)
    assert listed <= set(phony)  # and names no target that does not exist
    assert "make PYTHON=" in result.stdout and "make MXNET=" in result.stdout


def test_make_ends_with_the_ready_line_naming_the_venv_python():
    result = make()
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"ready (.venv: Python {VERSION}, MXNet ") and "; next: make test, make train" in last


def test_an_explicit_python_of_another_version_than_the_venv_is_refused(tmp_path):
    other = fake_python(tmp_path, "python9.9", "echo 9.9")
    result = make(f"PYTHON={other}", "python-check")
    assert result.returncode != 0
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == [f"error: .venv was made by Python {VERSION}, PYTHON={other} is Python 9.9: remove it first "
                     f"(rm -rf .venv) or run make PYTHON=python{VERSION}"]
    assert make(f"PYTHON={sys.executable}", "python-check").returncode == 0  # the venv's own version


def test_an_unsupported_or_broken_interpreter_is_refused_with_how_to_get_one(tmp_path):
    venv = f"VENV={tmp_path / 'venv'}"  # none yet: the interpreter that would make it is checked
    for python, says in ((fake_python(tmp_path, "python3.14", "echo 3.14"), "is Python 3.14"),
                         (fake_python(tmp_path, "python3.12", "exit 1"), "does not run")):
        result = make(venv, f"PYTHON={python}", "venv")
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode != 0 and len(errors) == 1, result.stderr
        assert errors[0].startswith(f"error: {python} {says}; this project needs Python 3.8-3.13: install one with "
                                    "pyenv (pyenv install 3.13), uv (uv python install 3.13)")
        assert not os.path.exists(tmp_path / "venv")


def test_the_default_python_is_the_newest_supported_one_that_runs(tmp_path):
    """A pyenv shim of a version not selected exists on the PATH but fails: it is skipped."""
    fake_python(tmp_path, "python3.13", "exit 127")  # the shim of an unselected version
    fake_python(tmp_path, "python3.12", f'exec {sys.executable} "$@"')
    fake_python(tmp_path, "python3.11", f'exec {sys.executable} "$@"')
    env = {**HOOK_ENV, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = make("--eval", "show-python: ; @echo $(PYTHON)", "show-python", env=env)
    assert result.returncode == 0 and result.stdout.strip() == "python3.12", result.stderr
