"""Lets MXNet 1.9.1's Python package import and run under NumPy 2, in every interpreter of an environment.

MXNet 1.9.1 (the last release; the project is retired) reads NumPy names that NumPy 2 removed, at import time
(mxnet/numpy/utils.py, fallback.py, numpy_dispatch_protocol.py, ndarray/numpy/_op.py): the builtin-type
aliases, the IEEE constants, a few renamed functions, ``numpy.compat`` and the financial functions (whose NumPy
1.2x stubs only raised when called). Python 3.13 has no NumPy 1.x, so the Python 3.12+ lane needs them back.

``python sniper_numpy2_compat.py SITE_DIR`` copies this file into a site-packages folder with a ``.pth`` file
that imports it at every start-up of that environment's interpreters: the main process, loader and test
workers, the distributed launcher's children, the ssh launcher's, a user's script; no ``PYTHONPATH`` needed.
The import only hooks ``import mxnet`` (nothing else is imported at start-up, so pip and other tools pay
nothing); that import first restores each missing name. Under NumPy 1.x nothing changes.
MXNet also imports ``distutils``, which Python 3.12 dropped: setuptools (in the venv) provides it.
"""
import os
import shutil
import sys
import types
import warnings

MODULE = "sniper_numpy2_compat"  # the installed module's name, also when this file runs as __main__


def _removed(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"numpy.{name} was removed from NumPy (numpy_financial has it)")
    return call


def restored_names(np):
    """``{name: value}`` of what NumPy 2 removed and MXNet 1.9.1 reads, each as NumPy 1.x had it."""
    def in1d(ar1, ar2, assume_unique=False, invert=False):
        return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert)

    return {
        "bool": bool, "int": int, "float": float, "complex": complex, "object": object, "str": str,
        "PZERO": 0.0, "NZERO": -0.0, "PINF": np.inf, "NINF": -np.inf, "Inf": np.inf, "Infinity": np.inf,
        "NaN": np.nan, "NAN": np.nan, "infty": np.inf,
        "float_": np.float64, "complex_": np.complex128, "unicode_": np.str_, "string_": np.bytes_,
        "alltrue": np.all, "sometrue": np.any, "product": np.prod, "cumproduct": np.cumprod,
        "round_": np.round, "msort": lambda a: np.sort(a, axis=0), "in1d": in1d,
        "trapz": lambda *args, **kwargs: np.trapezoid(*args, **kwargs), "compat": types.SimpleNamespace(basestring=str),
        **{name: _removed(name) for name in ("fv", "ipmt", "irr", "mirr", "nper", "npv", "pmt", "ppmt", "pv", "rate")},
    }


def restore(np):
    """Set on the module ``np`` each name of ``restored_names`` it lacks; nothing under NumPy 1.x. Returns the
    names set."""
    if int(np.__version__.split(".")[0]) < 2:
        return []
    added = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy 2 warns on looking up some removed names
        for name, value in restored_names(np).items():
            try:
                getattr(np, name)
            except AttributeError:
                setattr(np, name, value)
                added.append(name)
    return added


class BeforeMXNet:
    """A ``sys.meta_path`` entry that finds nothing: when ``mxnet`` is first looked up it restores NumPy's names,
    then steps aside and lets the ordinary finders import MXNet."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "mxnet":
            sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not cls]
            import numpy
            restore(numpy)
        return None


def hook():
    if "mxnet" in sys.modules:  # already imported (the module imported late): restore for its later uses
        import numpy
        restore(numpy)
    elif BeforeMXNet not in sys.meta_path:
        sys.meta_path.insert(0, BeforeMXNet)


def install(site_dir):
    """Copy this module into ``site_dir`` with the ``.pth`` file that imports it at start-up."""
    shutil.copyfile(os.path.abspath(__file__), os.path.join(site_dir, MODULE + ".py"))
    with open(os.path.join(site_dir, MODULE + ".pth"), "w") as f:
        f.write(f"import {MODULE}\n")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit(f"usage: {sys.argv[0]} SITE_PACKAGES_DIR (an existing folder; given: {' '.join(sys.argv[1:])})")
    install(sys.argv[1])
else:
    hook()
