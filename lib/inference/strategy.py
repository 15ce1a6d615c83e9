"""The one place a test's run strategy is chosen, once, from ``TEST`` (lib.inference.whole_images states
what a strategy is): proposal extraction for an RPN-only network, else AutoFocus with TEST.AUTO_FOCUS
(which tiles its regions itself with TEST.TILE), else tiles with TEST.TILE, else whole images."""
from lib.inference.autofocus import AutoFocus
from lib.inference.tiling import Tiles
from lib.inference.whole_images import Proposals, WholeImages


def strategy_for(cfg, network, planner, rpn_only=False):
    """The run strategy of ``cfg``'s TEST section for ``network`` (an RPN-only one when ``rpn_only``) and the
    BatchPlanner ``planner`` (lib.inference.batching)."""
    if rpn_only:
        kind = Proposals
    elif cfg.TEST.AUTO_FOCUS:
        kind = AutoFocus
    elif cfg.TEST.TILE:
        kind = Tiles
    else:
        kind = WholeImages
    return kind(cfg, network, planner)
