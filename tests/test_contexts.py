"""lib/contexts.py: the ``gpus`` config key -> mx.Context list, with GPU ids checked against the machine."""
import mxnet as mx
import pytest

from lib.contexts import parse_contexts


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
