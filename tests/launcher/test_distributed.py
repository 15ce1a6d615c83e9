"""Distributed training: epoch shards, Workers over a real ps-lite job, tools/launch.py running and
stopping jobs (on 127.0.0.1, locally and through a stand-in for ssh), and two workers training the
tiny config in step. Every process a test starts is gone when it ends, also on failure."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import psutil
import pytest

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.data import ChipLoader
from lib.data.epoch_plan import ChipTable, EpochPlan
from lib.dataset import ensure_synthetic_dataset, load_roidb
from lib.train.distributed import Workers, create_kvstore, parameter_digest

LAUNCH = os.path.join(ROOT, "tools", "launch.py")
WORKER = os.path.join(ROOT, "tests", "distributed_worker.py")
TINY = os.path.join(ROOT, "configs", "faster", "sniper_synthetic_tiny.yml")
# the stock wheels have ps-lite; `make mxnet-gpu`'s build does not (docs/gpu.md), and its dist_sync refuses
needs_dist_kvstore = pytest.mark.skipif(not mx.runtime.Features().is_enabled("DIST_KVSTORE"),
                                        reason="this MXNet build has no distributed kvstore")


# -- epoch shards ------------------------------------------------------------------------------------
def chip_table(count):
    return ChipTable.from_rows([(index, 0, 1.0, (0, 0, 0, 0), False, ()) for index in range(count)])


def test_shards_hand_worked():
    # 10 chips, 2 shards of 4: global batches of 8; the second one holds chips 8, 9 then wraps.
    plans = [EpochPlan(chip_table(10), 32, 4, seed=1, epoch=0, shuffle=False, num_shards=2, shard_index=k)
             for k in range(2)]

    def images(plan, batch):
        return [plan.chip_at(batch, position)[0].image_index for position in range(4)]

    assert [plan.num_batches for plan in plans] == [2, 2]
    assert [images(plans[0], 0), images(plans[1], 0)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [images(plans[0], 1), images(plans[1], 1)] == [[8, 9, 0, 1], [2, 3, 4, 5]]
    assert [[plan.batch_pad(b) for b in range(2)] for plan in plans] == [[0, 2], [0, 4]]
    # chip seeds follow the position in the epoch, not the wrapped chip
    assert plans[1].chip_at(1, 3)[1][-1] == 15


@pytest.mark.parametrize("count, shards, batch", [(1, 2, 3), (29, 2, 2), (50, 3, 4), (64, 4, 4)])
def test_shards_are_the_single_machine_epoch_split(count, shards, batch):
    chips = chip_table(count)
    single = EpochPlan(chips, 32, batch * shards, seed=5, epoch=2, shuffle=True)
    plans = [EpochPlan(chips, 32, batch, seed=5, epoch=2, shuffle=True, num_shards=shards, shard_index=k)
             for k in range(shards)]
    assert {plan.num_batches for plan in plans} == {single.num_batches}
    real = []
    for b in range(single.num_batches):
        for k, plan in enumerate(plans):
            for position in range(batch):
                assert plan.chip_at(b, position) == single.chip_at(b, k * batch + position)
                if position < batch - plan.batch_pad(b):
                    real.append(plan.chip_at(b, position)[1][-1])
    assert sorted(real) == list(range(count))  # every chip once, none twice
    assert sum(plan.pad for plan in plans) == single.pad


@pytest.fixture(scope="module")
def tiny_roidb(tmp_path_factory):
    dataset = ensure_synthetic_dataset(str(tmp_path_factory.mktemp("data") / "synthetic"), train=2, val=0, seed=3)
    cfg = load_config(None, [("dataset.dataset_path", dataset), ("dataset.image_set", "train"),
                             ("dataset.root_path", str(tmp_path_factory.mktemp("root"))), ("TRAIN.FLIP", "false")])
    return load_roidb(cfg, "train")[0], cfg


def test_sharded_loaders_give_the_single_machine_batches(tiny_roidb):
    roidb, cfg = tiny_roidb

    def batches(chips, **kwargs):
        with ChipLoader(roidb, cfg, chips, num_workers=0, seed=7, **kwargs) as loader:
            return [([a.asnumpy() for a in batch.data + batch.label], batch.pad) for batch in loader]

    single = batches(4)
    shards = [batches(2, num_shards=2, shard_index=k) for k in range(2)]
    assert len(shards[0]) == len(shards[1]) == len(single) >= 2
    for b, (arrays, pad) in enumerate(single):
        assert shards[0][b][1] + shards[1][b][1] == pad
        for field, expected in enumerate(arrays):
            np.testing.assert_array_equal(np.concatenate([shards[0][b][0][field], shards[1][b][0][field]]), expected)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_shards": 0}, "num_shards must be an integer >= 1, got 0"),
    ({"num_shards": 2, "shard_index": 2}, r"shard_index must be below num_shards \(2\), got 2"),
    ({"shard_index": -1}, "shard_index must be an integer >= 0, got -1"),
])
def test_bad_shards_are_refused(tiny_roidb, kwargs, message):
    roidb, cfg = tiny_roidb
    with pytest.raises(ValueError, match=message):
        ChipLoader(roidb, cfg, 4, num_workers=0, **kwargs)


# -- Workers outside a job ---------------------------------------------------------------------------
@pytest.mark.parametrize("kvstore, env, message", [
    ("local", {"DMLC_ROLE": "worker"}, "DMLC_ROLE=worker.*add --set default.kvstore dist_sync"),
    ("dist_async", {}, "'dist_async' is not supported"),
    ("dist_sync", {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2"},
     "DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER not set.*tools/launch.py"),
])
def test_kvstore_misconfigurations_are_explained(monkeypatch, kvstore, env, message):
    for name in [n for n in os.environ if n.startswith("DMLC_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        create_kvstore(load_config(None, [("default.kvstore", kvstore)]))


def test_a_single_machine_is_rank_0_of_1_and_its_collective_steps_do_nothing():
    workers = Workers("device")
    assert (workers.rank, workers.count, workers.distributed) == (0, 1, False)
    workers.join(None, batches=3)  # the module is not even looked at
    workers.average_aux_states(None)
    with workers.optimizer_on_workers():
        assert "MXNET_UPDATE_ON_KVSTORE" not in os.environ or os.environ["MXNET_UPDATE_ON_KVSTORE"] != "0"
    with pytest.raises(RuntimeError, match="raised as usual"):
        with workers.exit_at_once_on_error():
            raise RuntimeError("raised as usual")


def test_parameter_digest_sees_every_value_and_name_but_not_dict_order():
    import mxnet as mx

    arg = {"a": mx.nd.array([1.0, 2.0]), "b": mx.nd.array([[3.0]])}
    aux = {"m": mx.nd.array([0.5])}
    digest = parameter_digest(arg, aux)
    assert parameter_digest(dict(reversed(list(arg.items()))), aux) == digest
    assert parameter_digest({"a": mx.nd.array([1.0, 2.0 + 1e-6]), "b": arg["b"]}, aux) != digest
    assert parameter_digest({"c": arg["a"], "b": arg["b"]}, aux) != digest
    assert parameter_digest(arg, {}) != digest and parameter_digest(aux, arg) != digest


# -- jobs on 127.0.0.1 ---------------------------------------------------------------------------------
class Launched:
    """tools/launch.py running in its own session. Every process under it is remembered while it
    runs; on leaving the ``with`` block the launcher is stopped and anything left is killed."""

    def __init__(self, tmp_path, args, timeout):
        self.log = tmp_path / "launch.log"
        self.deadline = time.monotonic() + timeout
        self.seen = {}
        env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", PYTHONPATH=ROOT)  # for WORKER
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, LAUNCH, *args], stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=ROOT, env=env, start_new_session=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for process in self.leftovers(timeout=5):
            process.kill()

    def output(self):
        return self.log.read_text(errors="replace")

    def _watch(self):
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        if time.monotonic() > self.deadline:
            raise AssertionError(f"the job took too long; its output:\n{self.output()[-5000:]}")

    def wait_for(self, pattern, count=1):
        while len(re.findall(pattern, self.output())) < count:
            self._watch()
            assert self.process.poll() is None, f"launcher ended early:\n{self.output()[-5000:]}"
            time.sleep(0.2)

    def finish(self):
        while self.process.poll() is None:
            self._watch()
            time.sleep(0.2)
        return self.process.returncode

    def leftovers(self, timeout):
        return psutil.wait_procs(list(self.seen.values()), timeout=timeout)[1]

    def reports(self):
        """The JSON lines of tests/distributed_worker.py, by stage and rank."""
        found = {}
        for line in self.output().splitlines():
            match = re.match(r"\[worker \d+[^\]]*\] (\{.*\})$", line)
            if match:
                report = json.loads(match.group(1))
                found[report["stage"], report["rank"]] = report
        return found


@pytest.fixture()
def fake_ssh(tmp_path):
    """Stands in for ssh: drops the options and the destination and runs the remote command line
    with sh, in the session the launcher made for it (sshd too gives each connection its own)."""
    path = tmp_path / "fake_ssh"
    path.write_text('#!/bin/sh\n'
                    'while [ $# -gt 0 ]; do\n'
                    '  case "$1" in -o|-p|-i|-l) shift 2 ;; -*) shift ;; *) break ;; esac\n'
                    'done\n'
                    'shift\n'
                    'exec /bin/sh -c "$*"\n')
    path.chmod(0o755)
    hosts = tmp_path / "hosts"
    hosts.write_text("alpha 127.0.0.1\nbeta 127.0.0.1\n")
    return ["--launcher", "ssh", "-H", str(hosts), "--scheduler-address", "127.0.0.1",
            "--ssh", f"{path} -o BatchMode=yes", "--env", "OMP_NUM_THREADS=1", "--workdir", ROOT]


@needs_dist_kvstore
@pytest.mark.slow
def test_over_ssh_workers_start_alike_and_train_in_step(tmp_path, fake_ssh):
    with Launched(tmp_path, [*fake_ssh, "-n", "2", "-s", "1", sys.executable, WORKER, "train"], timeout=60) as job:
        assert job.finish() == 0, job.output()
        assert not job.leftovers(timeout=10)
    output, reports = job.output(), job.reports()
    assert "[worker 0 on alpha]" in output and "[worker 1 on beta]" in output
    joined = [reports["joined", rank] for rank in (0, 1)]
    trained = [reports["trained", rank] for rank in (0, 1)]
    assert joined[0]["own_digest"] != joined[1]["own_digest"]  # different random starts...
    assert joined[0]["digest"] == joined[1]["digest"] == joined[0]["own_digest"]  # ...replaced by rank 0's
    assert not joined[0]["update_on_kvstore"] and not joined[1]["update_on_kvstore"]
    assert trained[0]["digest"] == trained[1]["digest"] != joined[0]["digest"]  # trained, in step
    own = np.array([report["own_moving_mean"] for report in trained])
    assert np.abs(own[0] - own[1]).max() > 1e-4  # each rank's batch-norm saw its own data...
    for report in trained:  # ...and all end with the mean
        np.testing.assert_allclose(report["moving_mean"], own.mean(axis=0), rtol=1e-5, atol=1e-7)


@needs_dist_kvstore
def test_a_failing_worker_stops_the_whole_job(tmp_path):
    # rank 1 refuses to join; rank 0 then waits for it forever, as would the servers
    with Launched(tmp_path, ["-n", "2", "-s", "1", sys.executable, WORKER, "mismatch"], timeout=60) as job:
        assert job.finish() == 1
        assert not job.leftovers(timeout=10)
    output = job.output()
    assert "RuntimeError: worker rank 1 differs from rank 0: batches 6 (rank 0: 5)" in output
    assert re.search(r"launch.py: worker [01] failed \(exit code 1\); stopping the job", output)


@needs_dist_kvstore
def test_a_stopped_worker_fails_the_job_within_the_limit_naming_it(tmp_path):
    with Launched(tmp_path, ["--heartbeat-timeout", "3", "-n", "2", "-s", "1", sys.executable, WORKER, "sleep"],
                  timeout=90) as job:
        job.wait_for(r"\] ready", count=2)
        # longer than the limit: every process (scheduler, server, sleeping workers) beats on its own
        time.sleep(6)
        assert job.process.poll() is None, job.output()
        pid, rank = (int(v) for v in re.search(r"\[worker \d\] ready pid=(\d+) rank=(\d)", job.output()).groups())
        os.kill(pid, signal.SIGSTOP)
        assert job.finish() == 1
        assert not job.leftovers(timeout=15), job.output()
    output = job.output()
    found = re.search(rf"launch.py: worker \d \(rank {rank}, pid {pid}\) sent no heartbeat for (\d+) s "
                      r"\(--heartbeat-timeout 3 s\): it is stopped, hung or cut off", output)
    assert found, output[-3000:]
    assert 3 <= int(found.group(1)) < 90
    assert "@@sniper-heartbeat" not in output  # the beats themselves are not shown


@needs_dist_kvstore
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9 over ssh"])
def test_stopping_or_killing_the_launcher_leaves_no_process(tmp_path, fake_ssh, how):
    args = fake_ssh if how.endswith("ssh") else []
    with Launched(tmp_path, [*args, "-n", "2", "-s", "1", sys.executable, WORKER, "sleep"], timeout=60) as job:
        job.wait_for(r"\] ready", count=2)
        job._watch()
        assert len(job.seen) >= 4
        if how == "ctrl-c":
            os.killpg(job.process.pid, signal.SIGINT)  # what the terminal sends to its foreground group
            assert job.finish() == 128 + signal.SIGINT
            assert "launch.py: SIGINT; stopping the job" in job.output()
        else:
            job.process.kill()  # no chance to clean up: the children notice on their own
            job.process.wait()
        assert not job.leftovers(timeout=15), job.output()


# -- two workers train the tiny config -----------------------------------------------------------------
@needs_dist_kvstore
def test_two_workers_train_the_tiny_config_in_step(tmp_path):
    overrides = ["dataset.dataset_path", str(tmp_path / "data"), "dataset.root_path", str(tmp_path),
                 "dataset.synthetic_train", "4", "dataset.synthetic_val", "2", "TRAIN.FLIP", "false",
                 "TRAIN.end_epoch", "2", "TRAIN.lr_step", "", "TRAIN.BATCH_IMAGES", "2", "gpus", "cpu:1",
                 "TRAIN.NUM_PROCESS", "0",
                 "default.frequent", "2",
                 "output_path", str(tmp_path / "out"), "default.kvstore", "dist_sync"]
    cfg = load_config(TINY, list(zip(overrides[::2], overrides[1::2])))
    # made once up front, as a job on a shared filesystem should (the workers would race to make it)
    ensure_synthetic_dataset(cfg.dataset.dataset_path, train=4, val=2, seed=cfg.dataset.synthetic_seed)
    command = [sys.executable, os.path.join(ROOT, "main_train.py"), "--cfg", TINY, "--set", *overrides]
    with Launched(tmp_path, ["-n", "2", "-s", "1", *command], timeout=150) as job:
        assert job.finish() == 0, job.output()[-5000:]
        assert not job.leftovers(timeout=10)
    out = tmp_path / "out" / "sniper_synthetic_tiny"
    logs = {rank: next(out.glob(f"train_rank{rank}_*.log")).read_text() for rank in (0, 1)}
    digests = {rank: re.findall(r"epoch\[(\d)\] parameter digest (\w+) \(rank \d of 2\)", log)
               for rank, log in logs.items()}
    assert digests[0] == digests[1] and len(digests[0]) == 2 and digests[0][0][1] != digests[0][1][1]
    for rank, log in logs.items():
        assert f"(shard {rank} of 2)" in log
        assert ("saved checkpoint" in log) == (rank == 0)
        losses = [float(a) + float(b) for a, b in re.findall(r"RPNLogLoss=([\d.]+) .*RCNNLogLoss=([\d.]+)", log)]
        assert len(losses) >= 6 and losses[-1] < 0.8 * losses[0], losses  # epoch 2's mean vs the first batches
    assert sorted(p.name for p in out.glob("*.params")) == ["SNIPER-0001.params", "SNIPER-0002.params"]
