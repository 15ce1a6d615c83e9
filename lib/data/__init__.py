"""The SNIPER training iterator: chips mined per epoch, built by worker processes into shared memory."""
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.loader import ChipLoader, LoaderStats
from lib.data.worker_pool import WorkerDiedError, WorkerError, WorkerStalledError

__all__ = ["ChipLoader", "LoaderStats", "AnchorTargeter", "AnchorTargetParams", "WorkerDiedError", "WorkerError",
           "WorkerStalledError"]
