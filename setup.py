"""Builds the project's Cython extensions in place (called by `make`).

Every ``*.pyx`` under ``lib/`` and ``chip_generator/`` becomes an extension named after its path.
A module with a C/C++ core names its sources and language in ``# distutils:`` directives at the top
of the ``.pyx``, so adding an extension never needs an edit here.
"""
import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import setup

sources = sorted(glob.glob("lib/**/*.pyx", recursive=True) + glob.glob("chip_generator/**/*.pyx", recursive=True))
setup(
    name="sniper-extensions",
    ext_modules=cythonize(
        sources,
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False, "cdivision": True},
        quiet=True,
    ),
    include_dirs=[np.get_include()],
    zip_safe=False,
)
