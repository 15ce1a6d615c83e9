"""The SNIPER network: `training_symbol` / `inference_symbol`, the choice of deformable operators for a
device list (`use_compiled_deformable`) and the parameters the trainer keeps fixed."""
from symbols.batch_norm import matches_prefix
from symbols.backbones import backbone_of, is_imagenet_parameter
from symbols.deformable import use_compiled_deformable
from symbols.sniper import PROPOSAL_TARGET_GROUP, inference_symbol, training_symbol

__all__ = ["training_symbol", "inference_symbol", "get_fixed_param_names", "is_imagenet_parameter",
           "use_compiled_deformable", "PROPOSAL_TARGET_GROUP"]

BN_AFFINE_SUFFIXES = ("_gamma", "_beta")


def get_fixed_param_names(symbol, cfg):
    """Arguments of `symbol` not to be updated: the layers named by cfg.network.FIXED_PARAMS prefixes
    (their batch-norms also use stored statistics), with network.FIXED_INPUT_NORMALISER the backbone's
    input-normaliser prefixes (the ResNets' `bn_data`; the reference trains its beta) and, with
    network.FIXED_BN_AFFINE, every batch-norm's gamma and beta (their statistics still come from the batch)."""
    prefixes = tuple(cfg.network.FIXED_PARAMS) + (backbone_of(cfg).fixed_prefixes
                                                  if cfg.network.FIXED_INPUT_NORMALISER else ())
    return [name for name in symbol.list_arguments() if matches_prefix(name, prefixes) or
            (cfg.network.FIXED_BN_AFFINE and name.endswith(BN_AFFINE_SUFFIXES))]
