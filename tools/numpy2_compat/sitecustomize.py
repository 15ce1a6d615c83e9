"""Lets MXNet 1.9.1's Python package import and run under NumPy 2 (a GPU image ships NumPy 2 and no way
to install 1.x): put this folder first on PYTHONPATH and Python imports it at start-up.

MXNet 1.9.1 reads NumPy names that NumPy 2 removed, at import time (mxnet/numpy/utils.py, fallback.py,
numpy_dispatch_protocol.py, ndarray/numpy/_op.py): the builtin-type aliases, the IEEE constants, a few
renamed functions, ``numpy.compat`` and the financial functions (whose NumPy 1.2x stubs only raised
when called). Each is restored only where it is missing, so NumPy 1.x is untouched. The list was found by
importing and training with MXNet 1.9.1 under NumPy 2.5 on Python 3.12 (docs/gpu.md). Python 3.12 has
no ``distutils`` either; MXNet imports it, and setuptools (present on such images) provides it.

Another ``sitecustomize`` later on ``sys.path`` (this one shadows it) is run afterwards. It acts only in
processes that inherit ``PYTHONPATH``: a child started with another one (or over ssh, as the distributed
launcher's) does not get it.
"""
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings

try:
    import numpy as np
except ImportError:  # an interpreter without NumPy (a tool's own python3, say) has nothing to restore
    np = None


def _removed(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"numpy.{name} was removed from NumPy (numpy_financial has it)")
    return call


def _in1d(ar1, ar2, assume_unique=False, invert=False):
    return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert)


RESTORED = {} if np is None else {
    "bool": bool, "int": int, "float": float, "complex": complex, "object": object, "str": str,
    "PZERO": 0.0, "NZERO": -0.0, "PINF": np.inf, "NINF": -np.inf, "Inf": np.inf, "Infinity": np.inf,
    "NaN": np.nan, "NAN": np.nan, "infty": np.inf,
    "float_": np.float64, "complex_": np.complex128, "unicode_": np.str_, "string_": np.bytes_,
    "alltrue": np.all, "sometrue": np.any, "product": np.prod, "cumproduct": np.cumprod,
    "round_": np.round, "msort": lambda a: np.sort(a, axis=0), "in1d": _in1d,
    "trapz": getattr(np, "trapezoid", None), "compat": types.SimpleNamespace(basestring=str),
    **{name: _removed(name) for name in ("fv", "ipmt", "irr", "mirr", "nper", "npv", "pmt", "ppmt", "pv", "rate")},
}


def restore_aliases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy 2 warns on looking up some removed names
        for name, value in RESTORED.items():
            try:
                getattr(np, name)
            except AttributeError:
                setattr(np, name, value)


def run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


restore_aliases()
run_next_sitecustomize()
