"""Fixtures shared by the test files: configs, the tiny synthetic dataset, the repository's paths."""
import os

import pytest

from lib.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


def build_cfg(overrides=(), path=None):
    """A frozen config: ``path`` (default: the defaults alone) with ``overrides``, a ``{key: value}``
    dict or ``[(key, value), ...]``; values are Python values or command-line text."""
    items = overrides.items() if isinstance(overrides, dict) else overrides
    return load_config(path, list(items))


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory):
    """``make(train, val, seed=3) -> folder``: small synthetic COCO-format datasets, each made once per
    session and shared by the tests that ask for the same one."""
    from lib.dataset import ensure_synthetic_dataset

    made = {}

    def make(train, val, seed=3):
        key = (train, val, seed)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"synthetic_{train}_{val}_{seed}") / "synthetic"
            made[key] = ensure_synthetic_dataset(str(folder), train=train, val=val, seed=seed)
        return made[key]
    return make
