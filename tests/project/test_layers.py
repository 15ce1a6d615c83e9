"""Imports point down: the layer order of the project's modules, enforced by reading every module's imports.

Each module belongs to one unit: a package of lib/ or dev/ (``lib.run``, ``lib.config``, ``dev.parity``), a
module directly in one of them (``lib.scales``), a top-level package (``symbols``, ``chip_generator``,
``configs``) or the programs (``main_train.py``, ``main_test.py``, ``demo.py``, ``setup.py``, ``tools/``, dev/'s
scripts). ``LAYERS`` lists the units from the top down; a module imports (at module level or inside a function
alike) only its own unit and units of lower layers, and the units of one layer do not import each other. A new
module of lib/ needs its place here.
"""
import ast
import os

import pytest

from lib.bootstrap import ROOT

# From the top down (ARCHITECTURE.md, "Imports point down"). lib/config validates a loaded config with the
# registries and section parsers below it (backbones, dataset formats, pyramids, chip mining); the modules
# below it take a loaded config as a value and never import it.
LAYERS = (
    ("programs",),
    ("dev.parity", "dev.gpu_check", "lib.pipeline", "dev.commit_comparison"),
    ("lib.scales_fit", "dev.oracles"),
    ("lib.train", "lib.pixel_budget", "lib.gluoncv_resnet", "lib.downloads", "lib.serving"),
    ("lib.inference", "lib.start_checks"),
    ("lib.run", "lib.data"),
    ("lib.config",),
    ("symbols", "lib.dataset"),
    ("lib.ops", "lib.evaluation", "chip_generator"),
    ("lib.scales", "lib.boxes", "lib.logger", "lib.drawing", "lib.contexts"),
    ("lib.errors", "lib.atomic", "lib.bootstrap", "lib.paths", "lib.benchmarking", "dev.cuda_kernels",
     "lib.launcher", "configs", "lib", "dev"),
)
PACKAGES = ("lib", "dev", "symbols", "chip_generator", "configs")
DEV_PROGRAMS = ("dev.compare_commits", "dev.config_snapshot", "dev.parity_compare",  # dev/'s scripts
                "dev.parity_proposal_target")
PROGRAMS = ("main_train", "main_test", "demo", "setup", "tools", "_bootstrap")  # _bootstrap: tools/_bootstrap.py
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def module_files(folder, prefix):
    """``{dotted module name: path}`` of the Python files under ``folder`` (a package's ``__init__`` by the
    package's name)."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(files):
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(parent, name), folder)[:-3].split(os.sep)
                found[".".join([prefix, *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))] = \
                    os.path.join(parent, name)
    return found


def project_modules():
    modules = {}
    for package in PACKAGES + ("tools",):
        modules.update(module_files(os.path.join(ROOT, package), package))
    for program in PROGRAMS[:4]:
        modules[program] = os.path.join(ROOT, f"{program}.py")
    return modules


def unit_of(module):
    """The unit of a dotted module name; None for a module outside the project (numpy, mxnet, ...)."""
    parts = module.split(".")
    if module in DEV_PROGRAMS:
        return "programs"
    if parts[0] in ("lib", "dev") and len(parts) > 1:
        return ".".join(parts[:2])
    if parts[0] in PACKAGES:
        return parts[0]
    return "programs" if parts[0] in PROGRAMS else None


def imported_modules(source, module, is_package, known):
    """``[(dotted name, line)]`` that ``source`` (of ``module``) imports anywhere in it, functions included;
    ``from PACKAGE import NAME`` names the submodule when ``known`` has one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base, node.lineno)
                      for alias in node.names]
    return list(dict.fromkeys(found))


def upward_imports(module, path, source, known):
    """The lines of ``module`` whose imports do not point down the layers."""
    unit = unit_of(module)
    wrong = []
    for target, line in imported_modules(source, module, path.endswith("__init__.py"), known):
        other = unit_of(target)
        if other is None or other == unit:
            continue
        if other not in RANK:
            wrong.append(f"{path}:{line}: {module} imports {target}, whose unit {other} has no layer")
        elif RANK[other] <= RANK[unit]:
            where = "the same layer as" if RANK[other] == RANK[unit] else "above"
            wrong.append(f"{path}:{line}: {module} imports {target}: {other} is {where} {unit}")
    return wrong


def test_every_module_has_a_layer():
    units = {unit_of(module) for module in project_modules()}
    assert units - set(RANK) == set(), "place these units in LAYERS"
    assert set(RANK) - units == set(), "LAYERS names units the project no longer has"


def test_every_import_points_down_the_layers():
    modules = project_modules()
    wrong = []
    for module, path in modules.items():
        with open(path) as f:
            wrong += upward_imports(module, os.path.relpath(path, ROOT), f.read(), modules)
    assert wrong == []


def test_the_product_never_imports_its_checking_machinery():
    """lib/, symbols/ and chip_generator/ are the product: what checks it (dev/) may use them, never the reverse."""
    modules = project_modules()
    wrong = []
    for module, path in modules.items():
        if module.split(".")[0] in ("lib", "symbols", "chip_generator", "configs"):
            with open(path) as f:
                source = f.read()
            wrong += [f"{os.path.relpath(path, ROOT)}:{line}: {target}"
                      for target, line in imported_modules(source, module, path.endswith("__init__.py"), modules)
                      if target.split(".")[0] == "dev"]
    assert wrong == []


@pytest.mark.parametrize("module, source, upward", [
    ("lib.config", "def parse(cfg):\n    from lib.train.optimizer import lr_steps\n", True),  # lazy, above
    ("lib.ops", "import os\nimport symbols.backbones\n", True),
    ("lib.run.folder", "from lib import data\n", True),  # same layer
    ("lib.dataset.coco", "from .base import Dataset\nfrom lib.evaluation import metrics\n", False),
    ("symbols.sniper", "from lib import ops\nimport numpy\n", False),
])
def test_the_check_sees_lazy_relative_and_package_imports(module, source, upward):
    modules = project_modules()
    assert bool(upward_imports(module, "x.py", source, modules)) == upward


def test_no_test_module_imports_another():
    """Test files share fixtures through conftest.py (by name) and helpers through helper modules."""
    wrong = []
    for module, path in module_files(os.path.join(ROOT, "tests"), "tests").items():  # every folder of tests/
        with open(path) as f:
            source = f.read()
        wrong += [f"{os.path.relpath(path, ROOT)}:{line}: imports {target}" for target, line in
                  imported_modules(source, module.rsplit(".", 1)[-1], False, set())
                  if target.split(".")[0] == "conftest" or target.split(".")[0].startswith("test_")]
    assert wrong == []
