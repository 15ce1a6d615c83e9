"""Run strategies (lib.inference.whole_images, tiling, autofocus; chosen once by lib.inference.strategy):
the choice from ``TEST``, and the strategies' independence of the Detector that calls them."""
import ast
import os

import pytest

from detector_helpers import StandInNetwork
from lib.bootstrap import ROOT
from lib.config import load_config
from lib.inference.autofocus import AutoFocus
from lib.inference.batching import BatchPlanner
from lib.inference.strategy import strategy_for
from lib.inference.tiling import Tiles, Tiling
from lib.inference.whole_images import Proposals, WholeImages

# what the Detector hands work to: none of them may know the Detector
STRATEGY_MODULES = ("whole_images", "tiling", "autofocus", "strategy", "scale_cache", "masks", "regions", "streaming",
                    "batching")
FOCUS = {"network.AUTO_FOCUS": True, "TEST.AUTO_FOCUS": True, "TEST.DO_PRUNING": [False, True, True],
         "TEST.CHIP_HYPERPARAMS": [[1, 0.5, 4], [1, 0.5, 4], [-1, -1, -1]]}


@pytest.mark.parametrize("overrides, rpn_only, kind", [
    ({}, False, WholeImages),
    ({"TEST.TILE": [512, 128]}, False, Tiles),
    (FOCUS, False, AutoFocus),
    ({**FOCUS, "TEST.TILE": [512, 128]}, False, AutoFocus),  # AutoFocus tiles its own regions
    ({"TEST.TILE": [512, 128]}, True, Proposals),  # proposal extraction: whole images, as the reference
    (FOCUS, True, Proposals),
])
def test_the_strategy_is_chosen_once_from_the_test_section(overrides, rpn_only, kind):
    cfg = load_config(None, {"symbol": "resnet_tiny", **overrides})
    network = StandInNetwork(None)
    planner = BatchPlanner(cfg, 1, extraction=rpn_only)
    strategy = strategy_for(cfg, network, planner, rpn_only)
    assert type(strategy) is kind
    assert strategy.network is network and strategy.planner is planner and strategy.levels == planner.levels
    assert strategy.tiling == (Tiling(512, 128) if kind is Tiles else None)


def test_proposal_extraction_has_no_levels_to_merge():
    cfg = load_config(None, {"symbol": "resnet_tiny"})
    strategy = strategy_for(cfg, StandInNetwork(None), BatchPlanner(cfg, 1, extraction=True), rpn_only=True)
    with pytest.raises(RuntimeError, match="proposals, not detections"):
        next(strategy.run_levels(None))


def test_no_strategy_module_imports_the_detector():
    for name in STRATEGY_MODULES:
        path = os.path.join(ROOT, "lib", "inference", f"{name}.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert "lib.inference.detector" not in imported, name
