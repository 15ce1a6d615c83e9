"""What each child process of the GPU check does (``tools/gpu_check.py --section NAME``): the plans, and one
function per run returning a JSON-ready dict. Heavy imports happen inside the runs, so that a run that
cannot start (no MXNet, a CUDA library missing) fails in its own process, which dev.gpu_check.report
turns into a failed check.
"""
import ctypes
import importlib.util
import json
import os
import platform
import time

from lib.benchmarking import PeakMemory, measure
from lib.bootstrap import ROOT

# What each run of a plan trains and times. Sizes of the GPU plan are the issue's: ResNet-101, 16 chips
# of 512 on GPU 0, 30 iterations; the smoke plan runs the same code small enough for the test suite.
PLANS = {
    "gpu": {
        "config": "configs/faster/sniper_res101_e2e.yml", "device": "gpu", "precisions": ["fp32", "fp16"],
        "iterations": 30, "distinct_batches": 5, "chips": 16, "loader_workers": 8, "synthetic_images": 16,
        "proposal_target_chips": 16,
        "image_size": [480, 640], "inference_batches": [1, 2, 4], "inference_images": 8, "runs": 2,
        "host_workers": 4,
        "timeouts": {"environment": 120, "first_kernel": 600, "proposal_target": 300, "train": 600,
                     "gradients": 600, "inference": 900},
    },
    "cpu-smoke": {
        "config": "configs/faster/sniper_synthetic_tiny.yml", "device": "cpu", "precisions": ["fp32"],
        "iterations": 4, "distinct_batches": 2, "chips": 2, "loader_workers": 0, "synthetic_images": 3,
        "proposal_target_chips": 2,
        "image_size": [96, 128], "inference_batches": [1, 2], "inference_images": 2, "runs": 1,
        "host_workers": 1,
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
LOSS_NAMES = ("RPNLogLoss", "RPNL1Loss", "RCNNLogLoss", "RCNNL1Loss")


def run_config(plan, workdir, precision="fp32", devices=1):
    """The config of one run: the plan's file with RUN_SETTINGS, ``precision`` for both networks, and
    ``devices`` contexts of the plan's kind sharing the plan's chips."""
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
        return {d.name: d.shape for d in self.provide_data + self.provide_label}


def initial_weights(cfg, symbol, shapes):
    from lib.train.pretrained import initial_params

    seed(cfg)
    return initial_params(cfg, symbol, shapes)


class DeviceMemory(PeakMemory):
    """PeakMemory that also keeps the peak device memory in use on GPU ``device_id`` (``.device``: total -
    free, the CUDA context and MXNet's pool included), in bytes, sampled every 50 ms."""

    def __init__(self, device_id):
        super().__init__(interval=0.05)
        self.device_id, self.device = device_id, 0

    def _sample(self):
        import mxnet as mx

        super()._sample()
        free, total = mx.context.gpu_memory_info(self.device_id)
        self.device = max(self.device, total - free)


def section_environment(plan, workdir):
    """MXNet build, GPUs, kernels in the wheel for them, the operator library's registration; prepares the
    synthetic dataset the other runs share. The binary and the GPUs are read before MXNet is imported, so
    they are reported also when the import fails (a CUDA library missing, say)."""
    import numpy as np

    from dev.cuda_kernels import architectures, runnable_code

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
    from symbols.backbones import feature_stride

    cfg = run_config(plan, workdir)
    attrs = ops.proposal_target_attrs(cfg, feature_stride(cfg))
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
        return [o.asnumpy() for o in mx.nd.MultiProposalTarget(*arrays, **attrs)]
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
    on_gpu = contexts[0].device_type == "gpu"
    with (DeviceMemory(contexts[0].device_id) if on_gpu else PeakMemory()) as memory:
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
            "chips_per_second": round(plan["chips"] * len(timed) / sum(timed), 2),
            "peak_memory_mib": round((memory.device if on_gpu else memory.rss) / 2 ** 20, 1)}


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
    from lib.inference.detector import Detector
    from lib.inference.mxnet_network import DATA_NAMES
    from lib.inference.streaming import ArrayImages
    from lib.dataset.base import numbered_classes
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
        detector = Detector.from_params(cfg, numbered_classes(num_classes), *weights, contexts=[context],
                                        source="random weights")
        for index, level in enumerate(detector.levels):
            detector.scale_results(images[:batch_images], [level])  # warm-up: memory, cuDNN's search
            end_to_end = best_time(lambda: detector.scale_results(images, [level]), plan["runs"])
            height, width = detector.planner.plan([image.shape[:2] for image in images], [level])[0].canvas
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
        # all scales merged: host work in the calling thread, then overlapped by the pipeline's workers
        for workers in (0, plan["host_workers"]):
            merged = best_time(lambda: list(detector.run(ArrayImages(images), num_workers=workers)), plan["runs"])
            rows.append({"scale": "all", "spec": f"merged, {workers} host workers", "precision": precision,
                         "batch_images": batch_images,
                         "end_to_end_images_per_second": round(len(images) / merged, 2)})
    return {"rows": rows}


def best_time(run, runs):
    """Seconds of the fastest of ``runs`` calls (the caller has warmed up)."""
    return measure(run, repeat=runs, warmup=0).best


SECTIONS = {
    "environment": section_environment, "first_kernel": section_first_kernel,
    "proposal_target": section_proposal_target, "train": section_train, "gradients": section_gradients,
    "inference": section_inference,
}


def run_child(section, plan, workdir, result_path, precision=None):
    """One run: ``SECTIONS[section]`` with the JSON ``plan``; its result as JSON in ``result_path``."""
    from lib.logger import setup_logging

    setup_logging()
    result = SECTIONS[section](json.loads(plan), workdir, *([precision] if precision else []))
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0
