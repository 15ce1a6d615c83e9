"""Optimizer states without pickle (issue 14 items 1 and 8): an exact round trip through a ``.states`` file,
float16 master weights included; crafted pickles are refused without being run; resume skips damaged
checkpoints."""
import logging
import pickle

import mxnet as mx
import numpy as np
import pytest

from lib.run import checkpoint
from lib.train.optimizer import master_params
from lib.run.optimizer_states import load_optimizer_states, read_optimizer_states, state_arrays
from fp16_helpers import BATCH, W16, mixed_precision_module, numpy_sgd


class WritesMarker:
    """Unpickling this runs ``open(marker, "w")``: what a crafted file could do with any code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def steps(module, count):
    batch = mx.io.DataBatch([mx.nd.array(BATCH)])
    for _ in range(count):
        module.forward_backward(batch)
        module.update()
    mx.nd.waitall()


@pytest.mark.parametrize("num_contexts", [1, 2], ids=["module-updater", "kvstore-updater"])
def test_resumed_float16_module_continues_bit_for_bit(tmp_path, num_contexts):
    contexts = [mx.cpu(i) for i in range(num_contexts)]
    straight = mixed_precision_module(contexts)
    steps(straight, 2)
    path = str(tmp_path / "model-0001.states")
    checkpoint.save_ndarrays(path, state_arrays(straight))
    with open(path, "rb") as f:
        assert f.read(1) != b"\x80"  # an MXNet array file, not a pickle
    states, meta = read_optimizer_states(path)
    # the float16 weight's (momentum, float32 master) and the float32 weight's momentum: per device in the
    # module's updater, once in the kvstore's
    pairs = [s for s in states.values() if isinstance(s, tuple)]
    assert len(states) == 2 * (1 if num_contexts > 1 else num_contexts) and len(pairs) == 1
    assert all(m.dtype == np.float32 and w.dtype == np.float32 and w.shape == W16.shape for m, w in pairs)
    assert meta["num_update"] == 2

    rounded, _ = straight.get_params()  # the float16 weight as the module holds it; its master is a state
    resumed = mixed_precision_module(contexts, arg_params=rounded)
    load_optimizer_states(resumed, path)
    updater = resumed._kvstore._updater if num_contexts > 1 else resumed._updater
    assert updater.optimizer.num_update == 2
    steps(straight, 3)
    steps(resumed, 3)
    expected, _ = master_params(straight)
    got, _ = master_params(resumed)
    for name in expected:
        np.testing.assert_array_equal(got[name].asnumpy(), expected[name].asnumpy(), err_msg=name)
    np.testing.assert_allclose(got["half_weight"].asnumpy(), numpy_sgd(W16, 5), rtol=1e-6, atol=1e-7)
    assert updater.optimizer.num_update == 5


def test_a_pickled_states_file_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "model-0001.states"
    path.write_bytes(pickle.dumps({0: WritesMarker(marker)}))
    module = mixed_precision_module([mx.cpu(0)])
    with pytest.raises(ValueError, match="model-0001.states cannot be read .*pickle-free"):
        load_optimizer_states(module, str(path))
    assert not marker.exists()
    # what MXNet's own loader, used before, does with the same file
    module._updater.set_states(path.read_bytes())
    assert marker.exists()


def save_epochs(prefix, epochs):
    module = mixed_precision_module([mx.cpu(0)])
    steps(module, 1)
    params, aux = master_params(module)
    for epoch in epochs:
        checkpoint.save_checkpoint(prefix, epoch, None, params, aux, [1] * 4, [0] * 4, states=state_arrays(module),
                                   progress={"num_update": epoch})


def truncate(path):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def test_resume_falls_back_past_damaged_epochs_naming_their_files(tmp_path, caplog):
    prefix = str(tmp_path / "model")
    save_epochs(prefix, [1, 2, 3])
    truncate(checkpoint.states_path(prefix, 3))
    truncate(checkpoint.params_path(prefix, 2))
    assert checkpoint.last_complete_epoch(prefix) == 3  # complete by their names
    with caplog.at_level(logging.WARNING):
        assert checkpoint.last_readable_epoch(prefix) == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "resuming from epoch 1" in warning
    assert checkpoint.states_path(prefix, 3) in warning and checkpoint.params_path(prefix, 2) in warning
    assert checkpoint.params_path(prefix, 3) not in warning  # only the damaged files are named

    (tmp_path / "model-0001.progress.json").write_text('{"num_update": ')
    with pytest.raises(ValueError, match=r"no readable checkpoint of .*model-0001.progress.json"):
        checkpoint.last_readable_epoch(prefix)
    assert checkpoint.last_readable_epoch(str(tmp_path / "other")) == 0  # no checkpoint at all: from scratch


def test_a_disk_too_full_for_a_checkpoint_names_it_and_keeps_the_previous_one(tmp_path, monkeypatch):
    prefix = str(tmp_path / "model")
    save_epochs(prefix, [1])
    before = {name: (tmp_path / name).read_bytes() for name in sorted(p.name for p in tmp_path.iterdir())}
    real_save = mx.nd.save

    def full_disk_save(path, arrays):  # MXNet's saver on a full disk: part of the file, then a generic error
        real_save(path, arrays)
        truncate(path)
        monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda folder: type("usage", (), {"free": 0})())
        raise mx.base.MXNetError("FileStream.Write incomplete")

    monkeypatch.setattr(mx.nd, "save", full_disk_save)
    module = mixed_precision_module([mx.cpu(0)])
    steps(module, 1)
    params, aux = master_params(module)
    needed = sum(a.asnumpy().nbytes for a in state_arrays(module).values())
    with pytest.raises(OSError, match=rf"model-0001.states: {needed} bytes needed, \d+ written, 0 bytes free"):
        checkpoint.save_checkpoint(prefix, 1, None, params, aux, [1] * 4, [0] * 4, states=state_arrays(module))
    assert {name: (tmp_path / name).read_bytes() for name in sorted(p.name for p in tmp_path.iterdir())} == before
