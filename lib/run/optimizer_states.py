"""Optimizer states saved and loaded without pickle.

MXNet's own ``save_optimizer_states`` pickles the updater's state dict, and unpickling a crafted file
runs code. The states are arrays, so a ``.states`` file here is an ``mx.nd.save`` dict (which holds
only arrays): ``{position}:{slot}`` for each state array and ``meta``, the UTF-8 bytes of a JSON
document with what exact resume needs besides the arrays:

- ``states``: one ``[key, kind, slots]`` per updater key (a parameter index or name, as MXNet keys
  them), ``kind`` one of ``none``, ``array``, ``tuple``, ``list``; ``slots`` says which tuple/list
  items are arrays (``true``) or ``None`` (``false``). SGD's state is ``None`` (no momentum), the
  momentum array, or with ``multi_precision`` ``(momentum or None, float32 master weight)``.
- ``num_update`` and ``index_update_count`` (per device: ``[key, count]`` pairs): the optimizer's update
  counters, which drive the learning-rate schedule.
"""
import json

import mxnet as mx
import numpy as np

from lib.errors import reason

FORMAT = "sniper-optimizer-states"
VERSION = 1
META = "meta"


def state_arrays(module):
    """The ``.states`` content of ``module``'s optimizer: ``{name: NDArray}`` for ``mx.nd.save``."""
    updater = _updater(module)
    arrays, layout = {}, []
    for position, (key, state) in enumerate(updater.states.items()):
        if state is None:
            layout.append([key, "none", []])
        elif isinstance(state, mx.nd.NDArray):
            arrays[f"{position}:0"] = state
            layout.append([key, "array", []])
        elif isinstance(state, (tuple, list)) and all(s is None or isinstance(s, mx.nd.NDArray) for s in state):
            for slot, item in enumerate(state):
                if item is not None:
                    arrays[f"{position}:{slot}"] = item
            layout.append([key, type(state).__name__, [item is not None for item in state]])
        else:
            raise TypeError(f"optimizer state of {key!r} is a {type(state).__name__}; only None, arrays and "
                            f"tuples/lists of them can be saved")
    optimizer = updater.optimizer
    meta = {"format": FORMAT, "version": VERSION, "num_update": optimizer.num_update, "states": layout,
            "index_update_count": [[device, list(counts.items())]
                                   for device, counts in optimizer._all_index_update_counts.items()]}
    arrays[META] = mx.nd.array(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), dtype=np.uint8)
    return arrays


def read_optimizer_states(path):
    """``(states, meta)`` of a ``.states`` file: the updater's state dict and the JSON document.
    Anything else (a truncated file, a pickle of an older version) is a ValueError naming the file."""
    try:
        blob = mx.nd.load(path)
        meta = json.loads(blob.pop(META).asnumpy().tobytes().decode()) if isinstance(blob, dict) else {}
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"no {FORMAT} version {VERSION} description")
        states = {}
        for position, (key, kind, slots) in enumerate(meta["states"]):
            if kind == "none":
                states[key] = None
            elif kind == "array":
                states[key] = blob.pop(f"{position}:0")
            elif kind in ("tuple", "list"):
                items = [blob.pop(f"{position}:{slot}") if present else None for slot, present in enumerate(slots)]
                states[key] = tuple(items) if kind == "tuple" else items
            else:
                raise ValueError(f"unknown state kind {kind!r} of {key!r}")
        if blob:
            raise ValueError(f"arrays {sorted(blob)[:3]} are not described")
        int(meta["num_update"])
        for _, counts in meta["index_update_count"]:
            dict(counts)
    except (mx.base.MXNetError, ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        detail = reason(err)
        raise ValueError(f"optimizer states {path} cannot be read (truncated, or not a pickle-free states file of "
                         f"this project: {detail})") from None
    return states, meta


def load_optimizer_states(module, path):
    """Restore ``module``'s optimizer states and update counters from ``path``."""
    states, meta = read_optimizer_states(path)
    updater = _updater(module)
    updater.states = states
    updater.states_synced = dict.fromkeys(states, False)  # moved to each weight's device at its next update
    optimizer = updater.optimizer
    optimizer.num_update = int(meta["num_update"])
    optimizer._all_index_update_counts = {device: dict(counts) for device, counts in meta["index_update_count"]}
    optimizer._index_update_count = optimizer._all_index_update_counts.setdefault(0, {})


def _updater(module):
    """The updater that holds the states: the kvstore's when it updates, else the module's own."""
    if not module.optimizer_initialized:
        raise RuntimeError("the module's optimizer is not initialised: no states to save or load")
    updater = module._kvstore._updater if module._update_on_kvstore else module._updater
    if updater is None:
        raise RuntimeError("the optimizer runs on the kvstore servers: its states cannot be saved or loaded here")
    return updater
