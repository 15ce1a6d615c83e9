"""Imported first by every tool (``import _bootstrap  # noqa: F401``: a script's own folder is
``sys.path[0]``): puts the repository root on ``sys.path``, so that a tool imports ``lib``,
``symbols`` and ``chip_generator`` from any working directory, and re-runs the tool in the project's
virtualenv when another Python started it (lib/bootstrap.py)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lib.bootstrap import use_project_python  # noqa: E402

use_project_python()
