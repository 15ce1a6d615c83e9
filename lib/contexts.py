"""Device list from the config: ``gpus: "0,1"`` for GPUs, ``""`` or ``"cpu:N"`` for N CPU contexts; and
whether a float16 network (``TRAIN.fp16``, ``TEST.fp16``) may run on them. MXNet is imported only where a
context is made: the run record (lib/run/folder.py) counts devices for the ONNX Runtime back end too, without it."""
from lib.errors import ConfigError, MachineError

NO_CPU_FP16 = "MXNet 1.9 cannot run a float16 network on the CPU"


class MissingGPUError(MachineError, ValueError):
    """``gpus`` names GPU ids that this MXNet does not see (a ValueError as before, a MachineError for the console)."""


def parse_contexts(spec):
    """Return the list of mx.Context named by ``spec`` (a clear ValueError for anything else, including
    GPU ids that this MXNet does not see: ``mx.context.num_gpus()``)."""
    import mxnet as mx

    spec = str(spec).strip()
    if spec in ("", "cpu"):
        return [mx.cpu(0)]
    if spec.startswith("cpu:"):
        count = spec[4:]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"gpus: 'cpu:N' needs a positive N, got {spec!r}")
        return [mx.cpu(i) for i in range(int(count))]
    try:
        ids = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"gpus: expected '0,1,...', '' or 'cpu:N', got {spec!r}") from None
    if any(i < 0 for i in ids):
        raise ValueError(f"gpus: device ids must be >= 0, got {spec!r}")
    available = mx.context.num_gpus()
    missing = [i for i in ids if i >= available]
    if missing:
        seen = f"{available} GPU" + ("" if available == 1 else "s")
        seen += f" (ids 0..{available - 1})" if available else ""
        raise MissingGPUError(f"config key gpus = {spec!r} names gpu({missing[0]}), but this MXNet sees {seen}; "
                              f"use gpus '' (or 'cpu:N') for CPU")
    return [mx.gpu(i) for i in ids]


def fp16_enabled(cfg, section, contexts):
    """``cfg[section].fp16`` (section "TRAIN" or "TEST"), refused with a clear error on CPU contexts:
    MXNet 1.9 has no float16 GEMM/convolution kernels on the CPU, so the float16 body would fail on
    its first convolution. The trainer and the detector share this check and its message."""
    if not cfg[section].fp16:
        return False
    if any(ctx.device_type == "cpu" for ctx in contexts):
        raise ConfigError(f"{section}.fp16 is true but the contexts are CPUs; {NO_CPU_FP16}. "
                          f"Set --set {section}.fp16 false, or gpus to GPU ids.")
    return True


def device_count(spec):
    """How many contexts ``gpus`` = ``spec`` names, without asking this machine whether they exist (a GPU
    config planned on a CPU machine, e.g. by tools/fit_scales.py); refusing a bad spec is parse_contexts'."""
    spec = str(spec).strip()
    if spec.startswith("cpu:") and spec[4:].isdigit():
        return max(int(spec[4:]), 1)
    return max(sum(1 for part in spec.split(",") if part.strip() not in ("", "cpu")), 1)
