"""The SNIPER network: `training_symbol` / `inference_symbol`, the choice of deformable operators for a
device list (`use_compiled_deformable`) and the parameters the trainer keeps fixed."""
from symbols.deformable import use_compiled_deformable
from symbols.resnet import INPUT_NORMALISER, is_imagenet_parameter, matches_prefix
from symbols.sniper import PROPOSAL_TARGET_GROUP, inference_symbol, training_symbol

__all__ = ["training_symbol", "inference_symbol", "get_fixed_param_names", "is_imagenet_parameter",
           "use_compiled_deformable", "PROPOSAL_TARGET_GROUP"]


def get_fixed_param_names(symbol, cfg):
    """Arguments of `symbol` not to be updated: the layers named by cfg.network.FIXED_PARAMS prefixes
    (their batch-norms also use stored statistics) and the `bn_data` input normaliser."""
    prefixes = tuple(cfg.network.FIXED_PARAMS) + (INPUT_NORMALISER,)
    return [name for name in symbol.list_arguments() if matches_prefix(name, prefixes)]
