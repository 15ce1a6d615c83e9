"""The SNIPER training iterator: chips mined per epoch, built by worker processes into shared memory.

Its names load on first use, so that the test pipeline's use of the shared-memory ring and the workers
(lib.inference.streaming) does not import the MXNet iterator (lib.data.loader)."""
import importlib

__all__ = ["ChipLoader", "LoaderStats", "AnchorTargeter", "AnchorTargetParams", "WorkerDiedError", "WorkerError",
           "WorkerStalledError"]
_HOMES = {"ChipLoader": "lib.data.loader", "LoaderStats": "lib.data.loader",
          "AnchorTargeter": "lib.data.anchor_target", "AnchorTargetParams": "lib.data.anchor_target",
          "WorkerDiedError": "lib.data.worker_pool", "WorkerError": "lib.data.worker_pool",
          "WorkerStalledError": "lib.data.worker_pool"}


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'lib.data' has no attribute {name!r}")
