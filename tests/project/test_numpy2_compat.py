"""tools/numpy2_compat: the names MXNet 1.9.1 reads that NumPy 2 removed, restored only where missing and only
under NumPy 2, and installed into the venv so that every interpreter gets it without PYTHONPATH."""
import builtins
import importlib.util
import math
import os
import subprocess
import sys
import sysconfig
import types
import warnings

import numpy as np
import pytest

from lib.bootstrap import ROOT

SOURCE = os.path.join(ROOT, "tools", "numpy2_compat", "sniper_numpy2_compat.py")


def load_source():
    """The module as a fresh copy from its source file, without running its start-up hook's effects twice."""
    spec = importlib.util.spec_from_file_location("compat_under_test", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compat = load_source()
REMOVED = tuple(compat.restored_names(np))


def numpy2_namespace(version="2.0.0"):
    """A NumPy 2 as MXNet meets it: this NumPy's names without the removed ones (NumPy 2 has ``trapezoid``)."""
    fake = types.ModuleType("numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated names warn when read
        for name in dir(np):
            if name not in REMOVED and not name.startswith("__") and hasattr(np, name):
                setattr(fake, name, getattr(np, name))
    fake.trapezoid = getattr(np, "trapezoid", None) or np.trapz
    fake.__version__ = version
    return fake


def test_each_removed_name_comes_back_as_numpy_1_had_it():
    fake = numpy2_namespace()
    assert sorted(compat.restore(fake)) == sorted(REMOVED)
    for name in ("bool", "int", "float", "complex", "object", "str"):
        assert getattr(fake, name) is getattr(builtins, name)
    assert fake.PZERO == 0.0 and math.copysign(1, fake.PZERO) == 1
    assert fake.NZERO == 0.0 and math.copysign(1, fake.NZERO) == -1
    assert fake.PINF == fake.Inf == fake.Infinity == fake.infty == math.inf and fake.NINF == -math.inf
    assert math.isnan(fake.NaN) and math.isnan(fake.NAN)
    assert fake.float_ is np.float64 and fake.complex_ is np.complex128
    assert fake.unicode_ is np.str_ and fake.string_ is np.bytes_
    assert fake.alltrue([True, False]) == False and fake.sometrue([False, True]) == True  # noqa: E712
    assert fake.product([2, 3, 4]) == 24 and list(fake.cumproduct([2, 3, 4])) == [2, 6, 24]
    assert fake.round_(2.567, 1) == pytest.approx(2.6)
    assert fake.msort(np.array([[3, 1], [1, 2]])).tolist() == [[1, 1], [3, 2]]  # sorted along axis 0
    assert fake.in1d([[1, 2], [3, 4]], [2, 3]).tolist() == [False, True, True, False]  # flattened
    assert fake.in1d([1, 2], [2], invert=True).tolist() == [True, False]
    assert fake.trapz([1, 2, 3]) == 4.0  # trapezoid rule, unit spacing: (1 + 2) / 2 + (2 + 3) / 2
    assert fake.compat.basestring is str
    for name in ("fv", "ipmt", "irr", "mirr", "nper", "npv", "pmt", "ppmt", "pv", "rate"):
        with pytest.raises(RuntimeError, match=f"numpy.{name} was removed"):
            getattr(fake, name)(0.05, 10, 100)


def test_only_missing_names_are_set():
    fake = numpy2_namespace()
    fake.PINF, fake.in1d = "kept", "kept too"
    restored = compat.restore(fake)
    assert fake.PINF == "kept" and fake.in1d == "kept too"
    assert "PINF" not in restored and "in1d" not in restored and "NINF" in restored
    assert compat.restore(fake) == []  # a second pass has nothing left to do


def test_nothing_changes_under_numpy_1():
    fake = numpy2_namespace(version="1.26.4")
    before = dict(vars(fake))
    assert compat.restore(fake) == [] and vars(fake) == before


def test_the_hook_restores_before_mxnet_is_found(monkeypatch):
    """BeforeMXNet finds nothing itself; looking up ``mxnet`` restores NumPy's names and removes the hook."""
    fake = numpy2_namespace()
    monkeypatch.setitem(sys.modules, "numpy", fake)
    monkeypatch.setattr(sys, "meta_path", [compat.BeforeMXNet, *sys.meta_path])
    assert compat.BeforeMXNet.find_spec("cv2") is None and not hasattr(fake, "PINF")
    assert compat.BeforeMXNet.find_spec("mxnet") is None and fake.PINF == math.inf
    assert compat.BeforeMXNet not in sys.meta_path


def test_install_writes_the_module_and_its_start_up_line(tmp_path):
    subprocess.run([sys.executable, SOURCE, str(tmp_path)], check=True)
    assert (tmp_path / "sniper_numpy2_compat.py").read_bytes() == open(SOURCE, "rb").read()
    assert (tmp_path / "sniper_numpy2_compat.pth").read_text() == "import sniper_numpy2_compat\n"
    result = subprocess.run([sys.executable, SOURCE, str(tmp_path / "missing")], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "SITE_PACKAGES_DIR" in result.stderr


def venv_child(code, cwd):
    """``code`` in a fresh interpreter of this venv, from ``cwd``, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not os.path.isfile(os.path.join(sysconfig.get_paths()["purelib"], "sniper_numpy2_compat.pth")),
                    reason="this interpreter's environment was not made by `make` (no start-up hook installed)")
def test_mxnet_imports_in_a_child_without_pythonpath(tmp_path):
    """The installed hook works in any interpreter of the venv: MXNet imports and computes under this lane's
    NumPy (2.x on Python 3.12+), and the checkout is importable from another folder."""
    code = ("import sys, numpy, mxnet as mx\n"
            "assert 'sniper_numpy2_compat' in sys.modules\n"
            "print(numpy.__version__, mx.nd.array([1, 2]).asnumpy().sum(), mx.np.array([3.0]).asnumpy()[0])\n"
            "import lib.bootstrap; print(lib.bootstrap.ROOT)\n")
    result = venv_child(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    version, total, three, root = result.stdout.split()
    assert version == np.__version__ and float(total) == 3.0 and float(three) == 3.0
    assert os.path.realpath(root) == os.path.realpath(ROOT)
