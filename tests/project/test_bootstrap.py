"""Programs started by a Python that is not the project's virtualenv (lib/bootstrap.py): they re-run
themselves with ``.venv/bin/python``, from any working directory, with the same arguments and exit code.

The foreign Python is the interpreter the virtualenv was made from (``.venv/bin/python`` links to it):
it runs as itself, without the project's packages. A missing virtualenv is simulated by copying the
bootstrap files and the program into a temporary folder, which the bootstrap then takes as the
repository root (it finds the root from its own location), with no ``.venv`` in it.
"""
import os
import shutil
import subprocess
import sys

import pytest

from lib.bootstrap import REEXEC_GUARD, VENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
FOREIGN = os.path.realpath(sys.executable)


def run(python, *argv, cwd=None):
    return subprocess.run([python, *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != REEXEC_GUARD})


def foreign_has(module):
    return run(FOREIGN, "-c", f"import {module}").returncode == 0


@pytest.fixture(scope="module", autouse=True)
def foreign_python():
    prefix = run(FOREIGN, "-c", "import sys; print(sys.prefix)").stdout.strip()
    if os.path.realpath(prefix) == os.path.realpath(VENV):
        pytest.skip(f"{FOREIGN} is the virtualenv's own interpreter (a venv made with --copies)")


def test_a_foreign_python_continues_in_the_virtualenv_with_the_callers_environment(tmp_path):
    script = tmp_path / "program.py"  # a script (Python < 3.10 cannot re-run a -c command: no sys.orig_argv)
    script.write_text(f"import os, sys\nsys.path.insert(0, {ROOT!r})\nfrom lib.bootstrap import use_project_python\n"
                      f"use_project_python()\nimport mxnet\nprint(sys.prefix, os.environ.get({REEXEC_GUARD!r}))\n")
    result = run(FOREIGN, str(script), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    prefix, guard = result.stdout.split()
    assert os.path.realpath(prefix) == os.path.realpath(VENV) and guard == "None"


@pytest.mark.parametrize("program", ["main_train.py", "main_test.py", "demo.py", "tools/pixel_budget.py",
                                     "tools/launch.py"])
def test_programs_run_from_any_folder_with_a_foreign_python(program, tmp_path):
    result = run(FOREIGN, os.path.join(ROOT, program), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {os.path.basename(program)}")


@pytest.mark.parametrize("argv, code, message", [
    (["--cfg", TINY, "--set", "TRAIN.NO_SUCH_KEY", "1"], 1, "config error: unknown config key TRAIN.NO_SUCH_KEY"),
    (["--cfg", TINY, "--no-such-option"], 2, "unrecognized arguments: --no-such-option"),
    # joining a dist_sync job imports MXNet: only the virtualenv has it
    (["--cfg", TINY, "--set", "default.kvstore", "dist_sync"], 1, "start the workers with tools/launch.py"),
])
def test_the_exit_code_and_message_are_the_virtualenvs(argv, code, message, tmp_path):
    program = os.path.join(ROOT, "main_train.py")
    argv = [*argv, "--set", "output_path", str(tmp_path / "output")]  # not the repository's (a run may be there)
    foreign, own = run(FOREIGN, program, *argv), run(sys.executable, program, *argv)
    assert foreign.returncode == own.returncode == code
    assert foreign.stderr == own.stderr and message in foreign.stderr and "Traceback" not in foreign.stderr


def copy_into(root, *paths):
    for path in paths:
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), os.path.join(root, path))


@pytest.mark.parametrize("program", ["main_train.py", "tools/pixel_budget.py"])
def test_without_the_virtualenv_one_line_says_to_run_make(program, tmp_path):
    if foreign_has("mxnet"):
        pytest.skip(f"{FOREIGN} has MXNet: it runs the programs without the virtualenv")
    copy_into(tmp_path, "lib/__init__.py", "lib/bootstrap.py", "tools/_bootstrap.py", program)
    result = run(FOREIGN, str(tmp_path / program), "--help")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"{tmp_path / '.venv'} does not exist: run `make` in {tmp_path} first\n"


def test_a_virtualenv_that_does_not_run_as_one_stops_instead_of_looping(tmp_path):
    copy_into(tmp_path, "lib/__init__.py", "lib/bootstrap.py", "main_train.py")
    os.makedirs(tmp_path / ".venv" / "bin")
    os.symlink(FOREIGN, tmp_path / ".venv" / "bin" / "python")  # no pyvenv.cfg: not a virtualenv
    result = run(FOREIGN, str(tmp_path / "main_train.py"), "--help")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"{tmp_path / '.venv' / 'bin' / 'python'} does not run in its virtualenv")


def test_the_python_api_under_a_python_without_mxnet_says_in_one_line_which_to_use(tmp_path):
    if foreign_has("mxnet"):
        pytest.skip(f"{FOREIGN} has MXNet: the API runs there")
    result = subprocess.run([FOREIGN, "-c", "import lib.inference"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"ImportError: lib.inference needs MXNet, which this Python ({FOREIGN}) lacks: run your script with "
        f"{os.path.join(VENV, 'bin', 'python')} (the project's interpreter)")
