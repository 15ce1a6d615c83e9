"""Run the project's programs in the project's virtualenv, whichever Python 3 started them.

``make`` installs the pinned packages into ``<root>/.venv``; ``python main_train.py`` with the user's
own interpreter would stop at ``import mxnet``. So every program (main_train.py, main_test.py,
demo.py, tools/NAME.py through tools/_bootstrap.py) calls :func:`use_project_python` before any
third-party import: outside the virtualenv it replaces the process by the same command run with
``<root>/.venv/bin/python`` (``os.execv``: same arguments, same environment, and the exit code is
that program's). Without the virtualenv it says, in one line, to run ``make``, unless the interpreter
already has MXNet (an environment the user manages).

Standard library only: this runs under interpreters that have no third-party package.
"""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")
# Set while re-running: a virtualenv whose python does not run as that virtualenv stops instead of looping.
REEXEC_GUARD = "SNIPER_VENV_REEXEC"


def _command():
    """The arguments that started this interpreter, after its path (``sys.orig_argv`` from Python 3.10)."""
    if hasattr(sys, "orig_argv"):
        return sys.orig_argv[1:]
    if sys.argv and os.path.isfile(sys.argv[0]):  # python SCRIPT (or python -m MODULE) ARGS
        return sys.argv
    return None


def require_mxnet(module):
    """For the Python API (``import lib.inference`` in the user's own interpreter): without MXNet, an
    ImportError in one line naming the interpreter to run instead (the programs re-run themselves)."""
    if importlib.util.find_spec("mxnet") is not None:
        return
    python = os.path.join(VENV, "bin", "python")
    if os.access(python, os.X_OK):
        raise ImportError(f"{module} needs MXNet, which this Python ({sys.executable}) lacks: run your script with "
                          f"{python} (the project's interpreter)")
    raise ImportError(f"{module} needs MXNet, which this Python ({sys.executable}) lacks: run `make` in {ROOT}, "
                      f"then use {python}")


def use_project_python():
    """Return when running in ``<root>/.venv`` (or, without it, under an interpreter that has MXNet);
    else re-run this command with the virtualenv's python, or exit with a message saying to run ``make``."""
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        os.environ.pop(REEXEC_GUARD, None)  # the program's own children see the caller's environment
        return
    python = os.path.join(VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        if importlib.util.find_spec("mxnet") is not None:
            return
        sys.exit(f"{VENV} does not exist: run `make` in {ROOT} first")
    if os.environ.get(REEXEC_GUARD):
        sys.exit(f"{python} does not run in its virtualenv (sys.prefix {sys.prefix}): run `make` in {ROOT} again")
    command = _command()
    if command is None:
        sys.exit(f"this Python is not the project's: run the command with {python}")
    os.environ[REEXEC_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python, *command])
