"""The ONNX exports of a config's detection network for a device run, float32 and float16, without their weights:

    python tools/onnx_gpu_model.py --cfg configs/faster/sniper_res101_e2e.yml --out .whl/onnx_gpu/model

writes ``OUT/float32`` and ``OUT/float16`` (tools/export_model.py --format onnx and --fp16): body.onnx and
head.onnx with every parameter as external data of ``<graph>-weights.bin`` (not kept), model.json, and
``weights.json`` naming each parameter's place (offset, length), shape, type and kind, from which
tools/onnx_gpu/device_run.py makes the weights on the device from a seed: a device call carries at most
64 MiB, the ResNet-101 weights are ~240 MB, and speed does not depend on their values.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import json
import os

import mxnet as mx
import onnx
from onnx.external_data_helper import set_external_data

from lib.config import add_config_arguments, config_from_arguments, with_overrides
from lib.dataset.base import numbered_classes
from lib.inference.mxnet_network import DATA_NAMES
from lib.inference.export import ONNX_FILES, export_onnx_params
from lib.logger import report_user_errors
from symbols import inference_symbol

WEIGHTS = "weights.bin"
PRECISIONS = {"float32": False, "float16": True}  # folder -> export_onnx_params' fp16
INPUT_NORMALISER_VARIANCE = 3600.0  # the ResNets' bn_data: pixels of standard deviation ~60 to ~1
FLOAT16_COPY = "__fp16"  # onnx_export.float16_model's name of a parameter's float16 copy


def weight_kind(name):
    """How device_run.py makes a parameter: "gauss" (N(0, 1 / fan-in)), "zeros", "ones" or a constant."""
    if name.startswith("bn_data") and name.endswith("moving_var"):
        return INPUT_NORMALISER_VARIANCE
    if name.endswith(("_gamma", "_moving_var")):
        return "ones"
    if name.endswith("_weight"):
        return "gauss"
    return "zeros"


def weightless(path, key):
    """Move the parameters of the model at ``path`` (graph ``key``) out to ``<key>-weights.bin`` (not written):
    their places in it, for device_run.py. The translation's constants (named ``...__n`` by
    onnx_export.GraphBuilder) stay in the graph."""
    model = onnx.load(path)
    places, offset = [], 0
    for tensor in model.graph.initializer:
        name = tensor.name[:-len(FLOAT16_COPY)] if tensor.name.endswith(FLOAT16_COPY) else tensor.name
        if "__" in name:
            continue
        length = len(tensor.raw_data)
        set_external_data(tensor, location=f"{key}-{WEIGHTS}", offset=offset, length=length)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        dtype = "float16" if tensor.data_type == onnx.TensorProto.FLOAT16 else "float32"
        places.append({"name": tensor.name, "shape": list(tensor.dims), "offset": offset, "length": length,
                       "kind": weight_kind(name), "dtype": dtype})
        offset += length
    onnx.save(model, path)
    return places


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, help="the model folder to write")
    parser.add_argument("--num_classes", type=int, default=81, help="when dataset.NUM_CLASSES is 0")
    args = parser.parse_args(argv)
    cfg = with_overrides(config_from_arguments(args), {"TEST.fp16": False, "gpus": ""})
    num_classes = cfg.dataset.NUM_CLASSES or args.num_classes
    module = mx.mod.Module(inference_symbol(cfg, num_classes), data_names=DATA_NAMES, label_names=None)
    module.bind([("data", (1, 3, 64, 64)), ("im_info", (1, 3)), ("im_ids", (1,)), ("chip_ids", (1,))],
                for_training=False)
    module.init_params(mx.init.Zero())
    for precision, fp16 in PRECISIONS.items():
        folder = os.path.join(args.out, precision)
        export_onnx_params(cfg, numbered_classes(num_classes), *module.get_params(), folder, "weights from a seed",
                           fp16=fp16)
        places = {key: weightless(os.path.join(folder, ONNX_FILES[key]), key) for key in ("body", "head")}
        with open(os.path.join(folder, "weights.json"), "w") as f:
            json.dump(places, f)
        print(f"wrote {folder}: {', '.join(sorted(os.listdir(folder)))}")


if __name__ == "__main__":
    main()
