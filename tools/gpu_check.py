"""Settle the GPU path in one command: build features, kernels for this GPU, MultiProposalTarget on the GPU,
fp16 and fp32 ResNet-101 SNIPER training, the multi-GPU gradient sum, and inference speed.

    python tools/gpu_check.py [--out gpu_check.json]     # on a GPU machine with a CUDA build of MXNet
    python tools/gpu_check.py --cpu-smoke                # the same code path on CPUs (resnet_tiny, fp32)

No dataset, checkpoint or download is needed: a few synthetic images are generated under --workdir and
the weights are random. Every part runs in its own process with a time limit, so a crash or a missing
kernel is a failed check in the report, not a dead script. It writes --out (JSON) and a Markdown report
to stdout, and exits non-zero when a check failed. Checks (docs/gpu.md has the reasoning):

  mxnet        imports; on GPUs the build has CUDA and cuDNN (NCCL is reported)
  gpus         the CUDA driver and MXNet see GPUs; name, compute capability, memory
  kernels      libmxnet.so has machine code (SASS) for GPU 0, or PTX the driver can compile (JIT, slow
               first start), or neither (a CUDA 11 wheel has no Hopper code): read from the binary itself
  first_kernel one MXNet kernel runs on GPU 0 (its time includes any JIT compilation)
  ops_gpu      the loaded operator library registers a GPU forward for MultiProposalTarget
  proposal_target  MultiProposalTarget on GPU 0 equals its CPU result on the same inputs (bit for bit)
  train_fp32, train_fp16  ITERATIONS of training on GPU 0 from the same initial weights and chips:
               losses finite and falling (the last pass over the chips below the first)
  fp16_vs_fp32 the fp16 loss curve follows fp32: the first iteration within 2 %, the mean absolute
               difference over the run within 10 % of fp32's mean loss
  gradients    with 2 or more devices: one iteration over 2 devices x CHIPS/2 gives the summed gradients
               of 1 device running the same two halves (relative difference <= 1e-3)
  inference    images/s at each TEST scale and of the merged three-scale detection, fp32 and fp16,
               TEST.BATCH_IMAGES 1, 2 and 4, end to end (host pipeline in series with the network, as
               Detector runs) and network alone (host pipeline hidden, the bound overlapping it would give)
"""
import argparse
import ctypes
import importlib.util
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PREPARE = """
Preparing a GPU machine without network (docs/gpu.md has the plan and the measured sizes):
  here:  tools/gpu_machine_prep.sh fetch      # mxnet-cu117 1.9.1 + CUDA 11 runtime wheels -> .whl/, in pieces
  there: tools/gpu_machine_prep.sh install    # reassemble, pip install --target, numpy 2 shim, build the ops
         tools/gpu_machine_prep.sh check      # this script with the prepared environment
A CUDA 11 wheel of MXNet 1.9.1 carries machine code for sm_50..sm_86 and no PTX: on Hopper (H100/H200,
sm_90) or newer it cannot run, which the `kernels` check reports without starting a GPU run.
"""

# What each run of a plan trains and times. Sizes of the GPU plan are the issue's: ResNet-101, 16 chips
# of 512 on GPU 0, 30 iterations; the smoke plan runs the same code small enough for the test suite.
PLANS = {
    "gpu": {
        "config": "configs/faster/sniper_res101_e2e.yml", "device": "gpu", "precisions": ["fp32", "fp16"],
        "iterations": 30, "distinct_batches": 5, "chips": 16, "loader_workers": 8, "synthetic_images": 16,
        "proposal_target_chips": 16,
        "image_size": [480, 640], "inference_batches": [1, 2, 4], "inference_images": 8, "runs": 2,
        "timeouts": {"environment": 120, "first_kernel": 600, "proposal_target": 300, "train": 600,
                     "gradients": 600, "inference": 900},
    },
    "cpu-smoke": {
        "config": "configs/faster/sniper_synthetic_tiny.yml", "device": "cpu", "precisions": ["fp32"],
        "iterations": 4, "distinct_batches": 2, "chips": 2, "loader_workers": 0, "synthetic_images": 3,
        "proposal_target_chips": 2,
        "image_size": [96, 128], "inference_batches": [1, 2], "inference_images": 2, "runs": 1,
        "timeouts": {"environment": 60, "first_kernel": 60, "proposal_target": 60, "train": 120,
                     "gradients": 120, "inference": 120},
    },
}
# Settings of every run on top of the plan's config: synthetic data, random weights, no negative chips,
# and a constant learning rate (the published warm-up starts 30x lower: 30 iterations would hardly move).
RUN_SETTINGS = {
    "dataset.dataset": "synthetic", "dataset.image_set": "train", "dataset.test_image_set": "val",
    "dataset.synthetic_val": 1, "dataset.synthetic_seed": 3, "dataset.NUM_CLASSES": 0, "dataset.proposal": "",
    "network.pretrained": "", "network.FIXED_PARAMS": [], "TRAIN.FROM_SCRATCH": True,
    "TRAIN.USE_NEG_CHIPS": False, "TRAIN.warmup": False, "TRAIN.lr": 0.005, "default.kvstore": "device",
}
FP16_FIRST_TOLERANCE = 0.02
FP16_MEAN_TOLERANCE = 0.10
GRADIENT_TOLERANCE = 1e-3
LOSS_NAMES = ("RPNLogLoss", "RPNL1Loss", "RCNNLogLoss", "RCNNL1Loss")
# the checks after the environment's, in report order
GPU_RUNS = ("first_kernel", "proposal_target", "train_fp32", "train_fp16", "fp16_vs_fp32", "gradients", "inference")


# --- the runs (each in its own process: ``--section NAME``) ------------------------------------------------

def run_config(plan, workdir, precision="fp32", devices=1):
    from lib.config import load_config, with_overrides

    fp16 = precision == "fp16"
    gpus = ",".join(str(i) for i in range(devices)) if plan["device"] == "gpu" else f"cpu:{devices}"
    settings = dict(RUN_SETTINGS, **{
        "gpus": gpus, "output_path": os.path.join(workdir, "output"),
        "dataset.dataset_path": os.path.join(workdir, "data", "synthetic"),
        "dataset.root_path": os.path.join(workdir, "data"), "dataset.synthetic_train": plan["synthetic_images"],
        "TRAIN.BATCH_IMAGES": plan["chips"] // devices, "TRAIN.NUM_PROCESS": plan["loader_workers"],
        "TRAIN.fp16": fp16, "TEST.fp16": fp16})
    return with_overrides(load_config(os.path.join(ROOT, plan["config"])), settings)


def seed(cfg):
    import mxnet as mx
    import numpy as np

    mx.random.seed(cfg.default.seed)
    np.random.seed(cfg.default.seed)


def fixed_batches(cfg, chips_per_device, num_ctx, count):
    """(roidb's dataset, the first ``count`` batches of epoch 0 copied out of the loader, the loader's
    shapes): every run of a check trains on the same chips."""
    import mxnet as mx
    from lib.data import ChipLoader
    from lib.dataset import load_roidb

    roidb, dataset = load_roidb(cfg, cfg.dataset.image_set, training=True)
    batches = []
    with ChipLoader(roidb, cfg, chips_per_device, num_ctx=num_ctx, seed=cfg.default.seed) as loader:
        for batch in loader:
            batches.append(mx.io.DataBatch([a.copy() for a in batch.data], [a.copy() for a in batch.label],
                                           pad=batch.pad, provide_data=loader.provide_data,
                                           provide_label=loader.provide_label))
            if len(batches) == count:
                break
        shapes = Shapes(loader.provide_data, loader.provide_label)
    return dataset, batches, shapes


class Shapes:
    """A loader's data and label descriptions, which is all ``bind_module`` reads of a loader."""

    def __init__(self, provide_data, provide_label):
        self.provide_data, self.provide_label = list(provide_data), list(provide_label)

    def split(self, parts):
        import mxnet as mx

        def part(descs):
            return [mx.io.DataDesc(d.name, (d.shape[0] // parts,) + tuple(d.shape[1:]), d.dtype) for d in descs]
        return Shapes(part(self.provide_data), part(self.provide_label))

    def all(self):
        return dict((d.name, d.shape) for d in self.provide_data + self.provide_label)


def initial_weights(cfg, symbol, shapes):
    from lib.train.pretrained import initial_params

    seed(cfg)
    return initial_params(cfg, symbol, shapes)


class PeakMemory:
    """Peak device memory in use (total - free, the CUDA context and MXNet's pool included), sampled every
    50 ms; on CPUs the process's peak resident size."""

    def __init__(self, context):
        self.context, self.peak, self._stop = context, 0, threading.Event()

    def __enter__(self):
        if self.context.device_type == "gpu":
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        import mxnet as mx

        while not self._stop.wait(0.05):
            free, total = mx.context.gpu_memory_info(self.context.device_id)
            self.peak = max(self.peak, total - free)

    def __exit__(self, *exc):
        self._stop.set()
        if self.context.device_type == "gpu":
            self._thread.join()
        else:
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @property
    def mib(self):
        return round(self.peak / 2 ** 20, 1)


def section_environment(plan, workdir):
    """MXNet build, GPUs, kernels in the wheel for them, the operator library's registration; prepares the
    synthetic dataset the other runs share. The binary and the GPUs are read before MXNet is imported, so
    they are reported also when the import fails (a CUDA library missing, say)."""
    import numpy as np

    from lib.cuda_kernels import architectures, runnable_code

    library = os.path.join(importlib.util.find_spec("mxnet").submodule_search_locations[0], "libmxnet.so")
    archs = architectures(library)
    gpus = driver_gpus()
    for gpu in gpus:
        gpu["kernels"] = runnable_code(archs, gpu["compute_capability"])
    env = {"python": platform.python_version(), "numpy": np.__version__, "libmxnet": library,
           "libmxnet_archs": archs, "gpus": gpus}
    try:
        import mxnet as mx
    except Exception as err:  # noqa: BLE001  (reported, not raised: the check says why it cannot run)
        return dict(env, import_error=f"{type(err).__name__}: {err}")

    from lib.dataset import ensure_synthetic_dataset
    from lib.ops import LIBRARY_PATH
    from lib.ops.registry import registered_operators

    features = mx.runtime.Features()
    cfg = run_config(plan, workdir)
    ensure_synthetic_dataset(cfg.dataset.dataset_path, train=cfg.dataset.synthetic_train,
                             val=cfg.dataset.synthetic_val, seed=cfg.dataset.synthetic_seed)
    return dict(env, mxnet=mx.__version__, mxnet_gpus=mx.context.num_gpus(),
                features={name: features.is_enabled(name) for name in ("CUDA", "CUDNN", "NCCL", "CUDA_RTC")},
                ops_library=LIBRARY_PATH, ops_registered=registered_operators(LIBRARY_PATH))


def driver_gpus():
    """GPUs as the CUDA driver API reports them (libcuda.so.1 comes with the driver, no toolkit needed)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    if cuda.cuInit(0) != 0:
        return []
    count, version = ctypes.c_int(), ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    cuda.cuDriverGetVersion(ctypes.byref(version))
    gpus = []
    for index in range(count.value):
        device, major, minor, memory = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGet(ctypes.byref(device), index)
        cuda.cuDeviceGetName(name, 256, device)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # ..._MINOR
        cuda.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
        gpus.append({"index": index, "name": name.value.decode(), "compute_capability": 10 * major.value + minor.value,
                     "memory_gib": round(memory.value / 2 ** 30, 1), "driver": version.value})
    return gpus


def section_first_kernel(plan, workdir):
    import mxnet as mx

    context = device(plan, 0)
    start = time.perf_counter()
    value = (mx.nd.ones((64, 64), ctx=context) * 2).sum().asscalar()
    first = time.perf_counter() - start
    start = time.perf_counter()
    (mx.nd.ones((64, 64), ctx=context) * 2).sum().asscalar()
    return {"value": float(value), "first_seconds": round(first, 3),
            "second_seconds": round(time.perf_counter() - start, 4)}


def device(plan, index):
    import mxnet as mx

    return mx.gpu(index) if plan["device"] == "gpu" else mx.cpu(index)


def section_proposal_target(plan, workdir):
    """The operator on the plan's device and on the CPU, same random inputs, chips of 512."""
    import mxnet as mx
    import numpy as np

    from lib import ops

    cfg = run_config(plan, workdir)
    rng = np.random.default_rng(5)
    chips, feat = plan["proposal_target_chips"], 32
    anchors = cfg.network.NUM_ANCHORS
    scores = rng.random((chips, 2 * anchors, feat, feat), np.float32)
    deltas = rng.normal(0, 0.2, (chips, 4 * anchors, feat, feat)).astype(np.float32)
    im_info = np.tile(np.float32([[512, 512, 1.0]]), (chips, 1))
    corners = rng.uniform(0, 400, (chips, 100, 2)).astype(np.float32)
    sizes = rng.uniform(8, 110, (chips, 100, 2)).astype(np.float32)
    classes = np.where(np.arange(100) < 20, rng.integers(1, 5, (chips, 100)), -1).astype(np.float32)
    gt_boxes = np.concatenate([corners, corners + sizes, classes[..., None]], axis=2)
    valid_ranges = np.tile(np.float32([[0, -1]]), (chips, 1))
    inputs = (scores, deltas, im_info, gt_boxes, valid_ranges)

    def outputs(context):
        arrays = [mx.nd.array(x, ctx=context) for x in inputs]
        return [o.asnumpy() for o in mx.nd.MultiProposalTarget(*arrays, **ops.proposal_target_attrs(cfg))]
    on_device, on_cpu = outputs(device(plan, 0)), outputs(mx.cpu())
    mismatched = [i for i, (a, b) in enumerate(zip(on_device, on_cpu)) if not np.array_equal(a, b)]
    return {"outputs": [list(o.shape) for o in on_cpu], "mismatched_outputs": mismatched,
            "foreground_rois": int((on_cpu[1] > 0).sum())}


def section_train(plan, workdir, precision):
    from lib.contexts import fp16_enabled, parse_contexts
    from lib.train.metrics import loss_values, make_metrics
    from lib.train.optimizer import make_optimizer_params
    from lib.train.trainer import bind_module
    from symbols import training_symbol

    cfg = run_config(plan, workdir, precision)
    contexts = parse_contexts(cfg.gpus)
    fp16 = fp16_enabled(cfg, "TRAIN", contexts)
    dataset, batches, shapes = fixed_batches(cfg, plan["chips"], 1, plan["distinct_batches"])
    symbol = training_symbol(cfg, dataset.num_classes, plan["chips"])
    module = bind_module(cfg, symbol, shapes, contexts)
    arg_params, aux_params = initial_weights(cfg, symbol, shapes.all())
    module.init_params(arg_params=arg_params, aux_params=aux_params, allow_missing=False)
    module.init_optimizer(kvstore=cfg.default.kvstore, optimizer="sgd",
                          optimizer_params=make_optimizer_params(cfg, plan["iterations"], 0, fp16))
    metric = make_metrics(symbol.list_outputs(), module.label_names)
    losses, times = [], []
    with PeakMemory(contexts[0]) as memory:
        for iteration in range(plan["iterations"]):
            batch = batches[iteration % len(batches)]
            start = time.perf_counter()
            module.forward_backward(batch)
            module.update()
            metric.reset()
            module.update_metric(metric, batch.label)  # reads the outputs: waits for the iteration
            values = loss_values(metric)
            times.append(time.perf_counter() - start)
            losses.append({name: float(values[name]) for name in LOSS_NAMES})
    timed = times[2:] or times  # the first iterations include cuDNN's algorithm search
    return {"precision": precision, "fp16": fp16, "chips": plan["chips"], "distinct_batches": len(batches),
            "losses": losses, "iteration_seconds": [round(t, 4) for t in times],
            "chips_per_second": round(plan["chips"] * len(timed) / sum(timed), 2), "peak_memory_mib": memory.mib}


def section_gradients(plan, workdir):
    """Summed gradients of one iteration on 2 devices x CHIPS/2 against 1 device running the two halves."""
    import numpy as np

    from lib.contexts import parse_contexts
    from lib.train.trainer import bind_module
    from symbols import training_symbol

    cfg = run_config(plan, workdir, devices=2)
    contexts = parse_contexts(cfg.gpus)
    half = plan["chips"] // 2
    dataset, (batch,), shapes = fixed_batches(cfg, half, 2, 1)
    symbol = training_symbol(cfg, dataset.num_classes, half)
    weights = initial_weights(cfg, symbol, shapes.split(2).all())

    def gradients(module, parts):
        summed = {}
        for part in parts:
            module.forward_backward(part)
            for name, grads in zip(module._exec_group.param_names, module._exec_group.grad_arrays):
                if grads[0] is None:  # a fixed parameter (bn_data)
                    continue
                total = sum(g.asnumpy().astype(np.float64) for g in grads)
                summed[name] = summed.get(name, 0) + total
        return summed

    two = bind_module(cfg, symbol, shapes, contexts)
    two.init_params(arg_params=weights[0], aux_params=weights[1])
    together = gradients(two, [batch])
    one = bind_module(cfg, symbol, shapes.split(2), contexts[:1])
    one.init_params(arg_params=weights[0], aux_params=weights[1])
    halves = [slice_batch(batch, shapes.split(2), k * half, (k + 1) * half) for k in range(2)]
    apart = gradients(one, halves)
    errors = {name: float(np.linalg.norm(together[name] - apart[name]) / max(np.linalg.norm(apart[name]), 1e-12))
              for name in apart}
    worst = max(errors, key=errors.get)
    return {"devices": [str(c) for c in contexts], "parameters": len(errors), "max_relative_difference": errors[worst],
            "worst_parameter": worst}


def slice_batch(batch, shapes, start, stop):
    import mxnet as mx

    return mx.io.DataBatch([a[start:stop] for a in batch.data], [a[start:stop] for a in batch.label],
                           provide_data=shapes.provide_data, provide_label=shapes.provide_label)


def section_inference(plan, workdir, precision):
    import mxnet as mx
    import numpy as np

    from lib.config import with_overrides
    from lib.dataset import load_roidb
    from lib.inference.detector import DATA_NAMES, Detector
    from lib.train.pretrained import initial_params
    from symbols import inference_symbol

    base = run_config(plan, workdir, precision)
    num_classes = load_roidb(base, base.dataset.test_image_set, training=False)[1].num_classes
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (*plan["image_size"], 3), dtype=np.uint8) for _ in range(plan["inference_images"])]
    symbol = inference_symbol(base, num_classes)
    seed(base)
    weights = initial_params(base, symbol, {"data": (1, 3, 64, 64), "im_info": (1, 3), "im_ids": (1,),
                                            "chip_ids": (1,)})
    context = device(plan, 0)
    rows = []
    for batch_images in plan["inference_batches"]:
        cfg = with_overrides(base, {"TEST.BATCH_IMAGES": batch_images})
        detector = Detector(cfg, num_classes, *weights, contexts=[context], source="random weights")
        for index, level in enumerate(detector.levels):
            detector.scale_detections(images[:batch_images], level.spec)  # warm-up: memory, cuDNN's search
            end_to_end = best_time(lambda: detector.scale_detections(images, level.spec), plan["runs"])
            height, width = canvas(images[0].shape, level.spec, detector.stride)
            data = [mx.nd.random.uniform(-128, 128, (batch_images, 3, height, width), ctx=context),
                    mx.nd.array(np.tile([[height, width, 1.0]], (batch_images, 1)), ctx=context),
                    mx.nd.zeros((batch_images,), ctx=context), mx.nd.zeros((batch_images,), ctx=context)]
            descs = [mx.io.DataDesc(name, array.shape) for name, array in zip(DATA_NAMES, data)]
            network_batch = mx.io.DataBatch(data, provide_data=descs)
            batches = -(-len(images) // batch_images)

            def network_only():
                for _ in range(batches):
                    detector.module.forward(network_batch, is_train=False)
                    for output in detector.module.get_outputs():
                        output.wait_to_read()
            network_only()
            network = best_time(network_only, plan["runs"])
            rows.append({"scale": index, "spec": str(cfg.TEST.SCALES[index]), "canvas": [height, width],
                         "precision": precision, "batch_images": batch_images,
                         "end_to_end_images_per_second": round(len(images) / end_to_end, 2),
                         "network_images_per_second": round(batches * batch_images / network, 2)})
        merged = best_time(lambda: detector.detect(images), plan["runs"])
        rows.append({"scale": "all", "spec": "merged", "precision": precision, "batch_images": batch_images,
                     "end_to_end_images_per_second": round(len(images) / merged, 2)})
    return {"rows": rows}


def canvas(image_shape, spec, stride):
    """The network input size Detector pads an image of ``image_shape`` to at scale ``spec``."""
    scale = spec.image_scale(*image_shape[:2])
    height, width = (max(1, int(round(side * scale))) for side in image_shape[:2])
    return -(-height // stride) * stride, -(-width // stride) * stride


def best_time(run, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


SECTIONS = {
    "environment": section_environment, "first_kernel": section_first_kernel,
    "proposal_target": section_proposal_target, "train": section_train, "gradients": section_gradients,
    "inference": section_inference,
}


# --- the driver: runs the sections in child processes, judges them, reports ----------------------------

def run_section(name, plan, workdir, precision=None):
    """Run section ``name`` in a child process; its result dict, or ``{"error": ...}``."""
    arguments = ["--precision", precision] if precision else []
    tag = f"{name}_{precision}" if precision else name
    result_path = os.path.join(workdir, f"{tag}.json")
    log_path = os.path.join(workdir, f"{tag}.log")
    if os.path.exists(result_path):
        os.remove(result_path)
    command = [sys.executable, os.path.abspath(__file__), "--section", name, "--plan", json.dumps(plan),
               "--workdir", workdir, "--result", result_path, *arguments]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        # its own process group, so that a run past its time is stopped with its data-loader workers
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            code = child.wait(timeout=plan["timeouts"][name])
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = "timeout"
    seconds = round(time.perf_counter() - start, 1)
    if code == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            return dict(json.load(f), seconds=seconds)
    with open(log_path) as f:
        tail = f.read().strip().splitlines()[-12:]
    reason = f"timed out after {plan['timeouts'][name]} s" if code == "timeout" else f"exit code {code}"
    return {"error": f"{reason}; log {log_path}", "log_tail": tail, "seconds": seconds}


class Report:
    def __init__(self, plan_name):
        self.plan, self.checks, self.results = plan_name, [], {}

    def check(self, name, status, detail):
        self.checks.append({"check": name, "status": status, "detail": detail})

    def skip_unreported(self, names, reason):
        reported = {c["check"] for c in self.checks}
        for name in names:
            if name not in reported:
                self.check(name, "skip", reason)

    def failed(self):
        return [c["check"] for c in self.checks if c["status"] == "fail"]


def judge_environment(report, env, plan):
    """The environment's checks; True when MXNet can run the remaining sections on the plan's device."""
    if "error" in env:
        report.check("mxnet", "fail", f"environment run failed: {env['error']} {' | '.join(env['log_tail'][-3:])}")
        return False
    if "import_error" in env:
        report.check("mxnet", "fail", f"import mxnet failed: {env['import_error']}")
    else:
        features = env["features"]
        usable = plan["device"] != "gpu" or (features["CUDA"] and features["CUDNN"])
        report.check("mxnet", "pass" if usable else "fail",
                     f"MXNet {env['mxnet']} on Python {env['python']}, numpy {env['numpy']}; "
                     + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in features.items()))
    if plan["device"] != "gpu":
        report.check("gpus", "skip", f"CPU plan; the driver reports {len(env['gpus'])} GPU(s)")
        return "import_error" not in env
    gpus, archs = env["gpus"], env["libmxnet_archs"]
    report.check("gpus", "pass" if gpus else "fail", "; ".join(
        f"gpu{g['index']} {g['name']} sm_{g['compute_capability']} {g['memory_gib']} GiB (driver {g['driver']})"
        for g in gpus) + (f"; MXNet sees {env['mxnet_gpus']}" if "mxnet_gpus" in env else "")
        if gpus else "no GPU found by the CUDA driver (libcuda.so.1)")
    inventory = (f"libmxnet.so: SASS {', '.join(f'sm_{a}' for a in archs['sass']) or 'none'}; PTX "
                 f"{', '.join(f'compute_{a}' for a in archs['ptx']) or 'none'}")
    if not gpus:
        report.check("kernels", "skip", f"{inventory}; no GPU to run them")
        return False
    kernels = gpus[0]["kernels"]
    report.check("kernels", {"sass": "pass", "ptx-jit": "warn", "none": "fail"}[kernels],
                 f"{inventory}; gpu0 sm_{gpus[0]['compute_capability']} "
                 + {"sass": "runs its machine code", "ptx-jit": "runs only through the driver's PTX JIT (slow start)",
                    "none": "can run none of its kernels"}[kernels])
    if "import_error" in env:
        return False
    registered = env["ops_registered"].get("MultiProposalTarget", {}).get("forward", [])
    report.check("ops_gpu", "pass" if "gpu" in registered else "fail",
                 f"{env['ops_library']} registers MultiProposalTarget forward on {', '.join(registered)}")
    return kernels != "none" and env["mxnet_gpus"] > 0 and env["features"]["CUDA"]


def judge_training(report, runs):
    for precision, run in runs.items():
        name = f"train_{precision}"
        if "error" in run:
            report.check(name, "fail", f"{run['error']} {' | '.join(run['log_tail'][-3:])}")
            continue
        totals = [sum(step.values()) for step in run["losses"]]
        finite = all(map(_finite, totals))
        cycle = run["distinct_batches"]
        first, last = totals[:cycle], totals[-cycle:]
        falling = finite and len(totals) >= 2 * cycle and sum(last) / len(last) < sum(first) / len(first)
        report.check(name, "pass" if finite and falling else "fail",
                     f"summed loss {_mean(first):.4f} (first pass over the {cycle} batches) -> {_mean(last):.4f} "
                     f"(last); {run['chips_per_second']} chips/s, peak memory {run['peak_memory_mib']} MiB"
                     + ("" if finite else "; NON-FINITE losses"))
    if set(runs) != {"fp16", "fp32"} or any("error" in r for r in runs.values()):
        report.check("fp16_vs_fp32", "skip" if "fp16" not in runs else "fail",
                     "fp16 runs on GPUs only" if "fp16" not in runs else "a run failed")
        return
    half, full = ([sum(s.values()) for s in runs[p]["losses"]] for p in ("fp16", "fp32"))
    first = abs(half[0] - full[0]) / abs(full[0])
    mean = _mean([abs(a - b) for a, b in zip(half, full)]) / abs(_mean(full))
    close = first <= FP16_FIRST_TOLERANCE and mean <= FP16_MEAN_TOLERANCE
    report.check("fp16_vs_fp32", "pass" if close else "fail",
                 f"first iteration {100 * first:.2f} % apart (<= {100 * FP16_FIRST_TOLERANCE:.0f} %), mean absolute "
                 f"difference {100 * mean:.2f} % of fp32's mean loss (<= {100 * FP16_MEAN_TOLERANCE:.0f} %)")


def _finite(value):
    return value == value and abs(value) != float("inf")


def _mean(values):
    return sum(values) / len(values)


def check_plan(plan_name, plan, workdir, out):
    os.makedirs(workdir, exist_ok=True)
    report = Report(plan_name)
    env = report.results["environment"] = run_section("environment", plan, workdir)
    runnable = judge_environment(report, env, plan)
    if not runnable:
        report.skip_unreported(GPU_RUNS, "not run: see the failed checks above")
        return finish(report, out)
    first = report.results["first_kernel"] = run_section("first_kernel", plan, workdir)
    ran = "error" not in first and first["value"] == 2 * 64 * 64
    report.check("first_kernel", "pass" if ran else "fail",
                 first.get("error", f"sum of 2 * ones(64, 64) = {first.get('value')}; {first.get('first_seconds')} s "
                                    f"for the first kernel (JIT compilation included), {first.get('second_seconds')} "
                                    f"s for the next"))
    if not ran:
        report.skip_unreported(GPU_RUNS, "not run: no kernel ran")
        return finish(report, out)
    target = report.results["proposal_target"] = run_section("proposal_target", plan, workdir)
    if "error" in target:
        report.check("proposal_target", "fail", target["error"])
    else:
        equal = not target["mismatched_outputs"]
        report.check("proposal_target", "pass" if equal else "fail",
                     f"{plan['device']} vs cpu: outputs {target['outputs']}, "
                     + ("identical" if equal else f"outputs {target['mismatched_outputs']} differ")
                     + f"; {target['foreground_rois']} foreground rois")
    runs = {p: run_section("train", plan, workdir, p) for p in plan["precisions"]}
    report.results["train"] = runs
    judge_training(report, runs)
    gradients = report.results["gradients"] = run_gradients(plan, env, workdir)
    if gradients is None:
        report.check("gradients", "skip", "needs 2 GPUs")
    elif "error" in gradients:
        report.check("gradients", "fail", gradients["error"])
    else:
        ok = gradients["max_relative_difference"] <= GRADIENT_TOLERANCE
        report.check("gradients", "pass" if ok else "fail",
                     f"{' + '.join(gradients['devices'])} vs {gradients['devices'][0]} alone: max relative difference "
                     f"{gradients['max_relative_difference']:.2e} ({gradients['worst_parameter']}) over "
                     f"{gradients['parameters']} parameters (<= {GRADIENT_TOLERANCE:g})")
    inference = {p: run_section("inference", plan, workdir, p) for p in plan["precisions"]}
    report.results["inference"] = inference
    errors = {p: r["error"] for p, r in inference.items() if "error" in r}
    report.check("inference", "fail" if errors else "pass",
                 "; ".join(f"{p}: {e}" for p, e in errors.items()) or
                 f"{sum(len(r['rows']) for r in inference.values())} timings (table below)")
    return finish(report, out)


def run_gradients(plan, env, workdir):
    if plan["device"] == "gpu" and len(env["gpus"]) < 2:
        return None
    return run_section("gradients", plan, workdir)


def finish(report, out):
    result = {"plan": report.plan, "checks": report.checks, "failed": report.failed(), **report.results}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(markdown(result))
    print(f"\nwrote {out}")
    return 1 if result["failed"] else 0


def markdown(result):
    lines = [f"## gpu_check ({result['plan']})", "", "| check | status | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {c['status']} | {c['detail']} |" for c in result["checks"]]
    train = {p: r for p, r in result.get("train", {}).items() if "error" not in r}
    if train:
        lines += ["", "| training | chips/s | peak memory (MiB) | summed loss, first -> last iteration |",
                  "| --- | --- | --- | --- |"]
        for precision, run in train.items():
            totals = [sum(step.values()) for step in run["losses"]]
            lines.append(f"| {precision}, {run['chips']} chips | {run['chips_per_second']} | {run['peak_memory_mib']} "
                         f"| {totals[0]:.4f} -> {totals[-1]:.4f} |")
    rows = [row for r in result.get("inference", {}).values() if "rows" in r for row in r["rows"]]
    if rows:
        lines += ["", "| scale | precision | TEST.BATCH_IMAGES | images/s end to end | images/s network only |",
                  "| --- | --- | --- | --- | --- |"]
        for row in rows:
            lines.append(f"| {row['spec']} | {row['precision']} | {row['batch_images']} | "
                         f"{row['end_to_end_images_per_second']} | {row.get('network_images_per_second', '')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, epilog=PREPARE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="resnet_tiny, fp32, CPU contexts, a few iterations")
    parser.add_argument("--out", default="gpu_check.json", help="JSON report (default: %(default)s)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, "output", "gpu_check"),
                        help="synthetic data, logs and per-run results (default: %(default)s)")
    parser.add_argument("--iterations", type=int, help="training iterations per precision (plan's default)")
    parser.add_argument("--chips", type=int, help="chips per iteration on GPU 0 (even; plan's default)")
    parser.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=["fp32", "fp16"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.section:
        return run_child(args)
    plan_name = "cpu-smoke" if args.cpu_smoke else "gpu"
    plan = dict(PLANS[plan_name])
    for key in ("iterations", "chips"):
        if getattr(args, key) is not None:
            plan[key] = getattr(args, key)
    if plan["chips"] < 2 or plan["chips"] % 2:
        parser.error(f"--chips must be an even number >= 2, got {plan['chips']}")
    if plan["iterations"] < 2 * plan["distinct_batches"]:
        parser.error(f"--iterations must be at least {2 * plan['distinct_batches']} (two passes over the chips)")
    if importlib.util.find_spec("mxnet") is None:
        sys.exit("gpu_check: MXNet is not importable; `tools/gpu_check.py --help` says how to prepare a machine")
    return check_plan(plan_name, plan, os.path.abspath(args.workdir), args.out)


def run_child(args):
    """``--section NAME``: one run, its result as JSON in ``--result``."""
    from lib.logger import setup_logging

    setup_logging()
    precision = [args.precision] if args.precision else []
    result = SECTIONS[args.section](json.loads(args.plan), args.workdir, *precision)
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
