"""Fixtures shared by the test files (pytest passes them by name; test files never import this module):
the tiny config's path and small synthetic datasets."""
import os

import pytest

from lib.bootstrap import ROOT


@pytest.fixture(scope="session")
def tiny_config():
    """Path of the tiny synthetic config, configs/faster/sniper_synthetic_tiny.yml."""
    return os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")


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
