"""lib/contexts.py: the ``gpus`` config key -> mx.Context list, with GPU ids checked against the machine, and
the one float16 check the trainer and the detector share."""
import glob
import os

import mxnet as mx
import pytest

from lib.config import load_config
from lib.errors import ConfigError
from lib.contexts import fp16_enabled, parse_contexts


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this MXNet sees ``n`` GPUs."""
    def set_count(n):
        monkeypatch.setattr(mx.context, "num_gpus", lambda: n)
    return set_count


def test_existing_gpu_ids_become_gpu_contexts(gpus):
    gpus(2)
    assert parse_contexts("0,1") == [mx.gpu(0), mx.gpu(1)]
    assert parse_contexts(" 1 ") == [mx.gpu(1)]


@pytest.mark.parametrize("count, spec, message", [
    (2, "0,2", r"config key gpus = '0,2' names gpu\(2\), but this MXNet sees 2 GPUs \(ids 0\.\.1\)"),
    (1, "3", r"config key gpus = '3' names gpu\(3\), but this MXNet sees 1 GPU \(ids 0\.\.0\)"),
    (0, "0", r"config key gpus = '0' names gpu\(0\), but this MXNet sees 0 GPUs; use gpus ''"),
])
def test_gpu_ids_beyond_the_available_count_are_a_clear_error(gpus, count, spec, message):
    gpus(count)
    with pytest.raises(ValueError, match=message):
        parse_contexts(spec)


def test_cpu_specs_do_not_need_a_gpu(gpus):
    gpus(0)
    assert parse_contexts("") == [mx.cpu(0)]
    assert parse_contexts("cpu:2") == [mx.cpu(0), mx.cpu(1)]
    with pytest.raises(ValueError, match="'cpu:N' needs a positive N"):
        parse_contexts("cpu:0")


@pytest.mark.parametrize("section", ["TRAIN", "TEST"])
def test_fp16_is_refused_on_cpu_contexts_with_one_message(section, tiny_config):
    cfg = load_config(tiny_config, {f"{section}.fp16": True})
    message = (rf"^{section}\.fp16 is true but the contexts are CPUs; MXNet 1\.9 cannot run a float16 network on "
               rf"the CPU\. Set --set {section}\.fp16 false, or gpus to GPU ids\.$")
    with pytest.raises(ConfigError, match=message):  # a user error: one line from the API's callers too
        fp16_enabled(cfg, section, [mx.gpu(0), mx.cpu(0)])
    assert fp16_enabled(cfg, section, [mx.gpu(0), mx.gpu(1)]) is True
    assert fp16_enabled(load_config(tiny_config), section, [mx.cpu(0)]) is False


def test_fp16_defaults_follow_the_reference(gpus, tiny_config):
    """Both networks default to float16 (the reference trained and tested in float16 on GPUs); every
    configuration that names CPU contexts turns both off."""
    defaults = load_config(None)
    assert defaults.TRAIN.fp16 is True and defaults.TEST.fp16 is True
    gpus(8)
    configs = [load_config(path) for path in glob.glob(os.path.join(os.path.dirname(tiny_config), "*.yml"))]
    on_cpus = [cfg for cfg in configs if parse_contexts(cfg.gpus)[0].device_type == "cpu"]
    assert "sniper_synthetic_tiny" in [cfg.name for cfg in on_cpus]
    for cfg in on_cpus:
        assert cfg.TRAIN.fp16 is False and cfg.TEST.fp16 is False, cfg.name
