"""No module reaches into another's private names (the developers' guide): read with ``ast``, every
``x._name`` (not a dunder) in lib/, dev/, symbols/, tools/, chip_generator/ and the programs, where ``x`` is
not ``self``, ``cls`` or ``super()`` and ``_name`` is defined by another project module but not by the
module reading it, and every ``from <project module> import _name``, is a violation.

Names a project module does not define are a third party's: the training and run code call MXNet's own
privates (``module._exec_group``, ``module._context`` ...), which MXNet 1.9 offers no public way to, and
that is left to them; ``THIRD_PARTY`` names those the project also happens to define (lib/train/optimizer.py
reads a Module's ``_updater`` and ``_kvstore``). A package's own modules may import its private parts (the
compiled ``chip_generator._chips``).
"""
import ast
import os

from lib.bootstrap import ROOT

FOLDERS = ("lib", "dev", "symbols", "tools", "chip_generator")
PROGRAMS = ("main_train.py", "main_test.py", "demo.py")
PACKAGES = FOLDERS + ("configs",)
OWNERS = ("self", "cls")
THIRD_PARTY = {"_updater", "_kvstore"}  # MXNet Module attributes (lib/train/optimizer.py)


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def project_files():
    files = [os.path.join(ROOT, name) for name in PROGRAMS]
    for folder in FOLDERS:
        for parent, dirs, names in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            files += [os.path.join(parent, name) for name in sorted(names) if name.endswith(".py")]
    return files


def defined_names(tree):
    """The private names a module defines: functions, classes, assignments at any depth, attributes it sets
    on ``self`` or ``cls``, ``__slots__`` entries and its keyword-argument names are not counted."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
    return {name for name in names if is_private(name)}


def owner_is_itself(value):
    """``self``, ``cls`` or ``super()``: a class's own private names."""
    if isinstance(value, ast.Name):
        return value.id in OWNERS
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def violations(trees, project_private, root=ROOT):
    found = []
    for path, tree in trees.items():
        own = defined_names(tree) | THIRD_PARTY
        where = os.path.relpath(path, root)
        package = os.path.dirname(where).replace(os.sep, ".")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr in project_private
                    and node.attr not in own and not owner_is_itself(node.value)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                  and node.module.split(".")[0] in PACKAGES and node.module != package):
                found += [f"{where}:{node.lineno}: from {node.module} import {alias.name}" for alias in node.names
                          if is_private(alias.name)]
    return found


def parsed(paths):
    trees = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            trees[path] = ast.parse(f.read(), path)
    return trees


def test_no_module_reaches_into_another_modules_private_names():
    trees = parsed(project_files())
    project_private = set().union(*(defined_names(tree) for tree in trees.values()))
    assert violations(trees, project_private) == []


def test_the_check_finds_a_reach_and_an_import_and_leaves_third_party_and_own_names(tmp_path):
    """Hand-made modules: b reads a's private attribute and imports a's private function (two violations); its
    own ``self._count``, ``other._count`` of a name it defines itself, MXNet's ``module._exec_group`` and its
    package's own private part (``from lib import _own``, b standing in lib/) pass."""
    a, b = tmp_path / "a.py", tmp_path / "lib" / "b.py"
    b.parent.mkdir()
    a.write_text("def _helper():\n    pass\n\nclass Meter:\n    def __init__(self):\n        self._passed = 0\n")
    b.write_text("from lib.a import _helper\nfrom lib import _own\n\n"
                 "class Counter:\n    def __init__(self, other):\n        self._count = other._count\n\n"
                 "def read(meter, module):\n    return meter._passed, module._exec_group, _helper()\n")
    trees = parsed([str(a), str(b)])
    project_private = set().union(*(defined_names(tree) for tree in trees.values()))
    found = [line.split(": ", 1)[1] for line in violations(trees, project_private, str(tmp_path))]
    assert sorted(found) == ["from lib.a import _helper", "meter._passed"]
