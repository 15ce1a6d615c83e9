"""Running the reference's Python 2 modules under Python 3: a 2to3 rewrite at load time, stub modules in
place of the imports a comparison does not exercise, and Python 2's ``round``."""
import contextlib
import sys
import types
import warnings
from decimal import ROUND_HALF_UP, Decimal

# Python 3.13 removed lib2to3; fissix (requirements.txt, from 3.13 on) is the same package, maintained outside.
if sys.version_info >= (3, 13):
    from fissix.refactor import RefactoringTool, get_fixers_from_package
    FIXERS = "fissix.fixes"
else:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, PendingDeprecationWarning))
        from lib2to3.refactor import RefactoringTool, get_fixers_from_package
    FIXERS = "lib2to3.fixes"


def convert_source(text, name="<reference>"):
    """Python 2 source -> Python 3 source with lib2to3's standard fixers (print statements, xrange,
    cPickle, dict views, integer division stays ``/``: code that relies on it must be checked by hand)."""
    tool = RefactoringTool(get_fixers_from_package(FIXERS))
    if not text.endswith("\n"):
        text += "\n"
    return str(tool.refactor_string(text, name))


def py2_round(value, digits=0):
    """Python 2's ``round``: correctly rounded, exact ties away from zero, always a float (also for a
    NumPy scalar, which Python 3 would round with NumPy's own rule)."""
    return float(Decimal(float(value)).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP))


def stub_module(name, **attributes):
    """A module ``name`` holding only ``attributes`` (a stand-in for an import the comparison never calls)."""
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def overlay_module(name, base, **replacements):
    """A module ``name`` that is ``base`` except for ``replacements`` (every other attribute read from
    ``base``): a real package the reference imports with a few of its functions changed."""
    return stub_module(name, __getattr__=lambda attribute: getattr(base, attribute), **replacements)


@contextlib.contextmanager
def _modules(stubs):
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_python2_module(source, name, stubs=(), package=None, overrides=None):
    """Execute Python 2 ``source`` converted to Python 3 as module ``name``; ``stubs`` (name -> module)
    answer its imports while it loads (package-relative ones as ``package.sub``); ``overrides`` replace
    globals after loading (``round`` -> py2_round by default)."""
    module = types.ModuleType(name)
    module.__package__ = package
    module.__dict__["round"] = py2_round
    code = compile(convert_source(source, name), name, "exec")
    with _modules(dict(stubs)):
        exec(code, module.__dict__)
    module.__dict__.update(overrides or {})
    return module
