"""Fixtures shared by the test files (pytest passes them by name; test files never import this module):
the tiny config's path, small synthetic datasets and the tiny network on a tiny COCO-format set."""
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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(cfg, arg_params, aux_params): the tiny network, randomly initialised, on the tiny COCO-format set
    of tests/detector_helpers.py (``IMAGES``), made once per test module."""
    from detector_helpers import random_tiny_params, write_tiny_coco
    from lib.config import load_config

    root = tmp_path_factory.mktemp("tiny")
    write_tiny_coco(str(root / "data"))
    cfg = load_config(None, [
        ("symbol", "resnet_tiny"), ("output_path", str(root / "output")), ("dataset.dataset_path", str(root / "data")),
        ("dataset.root_path", str(root)), ("dataset.image_set", "train"), ("dataset.test_image_set", "val"),
        ("dataset.NUM_CLASSES", "3"), ("gpus", ""), ("TEST.fp16", "false"),
        ("dataset.TEST_IMAGE_ORDER", "file"),  # the tests name the images by their place in IMAGES
        ("TEST.SCALES", "[[96, 128], [64, 96], [32, 48]]"),
        ("TEST.RPN_PRE_NMS_TOP_N", "500"), ("TEST.RPN_POST_NMS_TOP_N", "50"), ("TEST.NUM_PROPOSALS", "20"),
    ])
    return (cfg, *random_tiny_params(cfg))
