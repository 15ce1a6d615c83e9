"""A training process killed (SIGKILL) at any moment while it saves an epoch leaves a run folder that
resumes from its last complete epoch, with that epoch's params, optimizer states and progress all of
the same epoch, never a mix of two."""
import os
import signal
import subprocess
import sys
import time

import numpy as np

from lib.bootstrap import ROOT
from lib.run import checkpoint
from lib.run.optimizer_states import read_optimizer_states


# Saves epochs from argv[2] on, forever; every array and counter of epoch E holds the value E. The arrays
# are large enough (4 MB each) that a save takes a while and kills land inside it.
WRITER = r"""
import json, sys
import mxnet as mx, numpy as np
from lib.run import checkpoint
from lib.run.optimizer_states import FORMAT, META, VERSION
prefix, epoch = sys.argv[1], int(sys.argv[2])
while True:
    value = np.full(1 << 20, epoch, np.float32)
    meta = {"format": FORMAT, "version": VERSION, "num_update": epoch, "states": [[0, "array", []]],
            "index_update_count": []}
    states = {"0:0": mx.nd.array(value), META: mx.nd.array(np.frombuffer(json.dumps(meta).encode(), np.uint8),
                                                         dtype=np.uint8)}
    checkpoint.save_checkpoint(prefix, epoch, None, {"w": mx.nd.array(value)}, {"m": mx.nd.array(value[:8])},
                               stds=(1, 1, 1, 1), means=(0, 0, 0, 0), states=states, progress={"epoch": epoch})
    print(epoch, flush=True)
    epoch += 1
"""


def check_consistent(prefix):
    """The epoch a resume would start from, after checking each of its files is of that epoch."""
    epoch = checkpoint.last_readable_epoch(prefix)
    if epoch:
        args, aux = checkpoint.load_params(checkpoint.params_path(prefix, epoch))
        states, meta = read_optimizer_states(checkpoint.states_path(prefix, epoch))
        assert np.all(args["w"].asnumpy() == epoch) and np.all(aux["m"].asnumpy() == epoch)
        assert np.all(states[0].asnumpy() == epoch) and meta["num_update"] == epoch
        assert checkpoint.load_progress(prefix, epoch) == {"epoch": epoch}
    return epoch


def test_repeated_kills_while_saving_never_leave_a_mix_of_two_epochs(tmp_path):
    prefix = str(tmp_path / "run" / "model")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    rng = np.random.default_rng(0)
    resumed_from, kills = [], 0
    for attempt in range(6):
        start = check_consistent(prefix) + 1  # as --resume does
        resumed_from.append(start - 1)
        child = subprocess.Popen([sys.executable, "-c", WRITER, prefix, str(start)], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == str(start), child.stderr.read()[-2000:]  # one epoch saved
        time.sleep(float(rng.uniform(0.0, 0.3)))  # then somewhere inside a later save
        child.send_signal(signal.SIGKILL)
        child.wait()
        kills += child.returncode == -signal.SIGKILL
    assert kills == 6
    final = check_consistent(prefix)
    assert final >= 6 and resumed_from == sorted(resumed_from)  # every resume moved on, none went back
