"""The ONNX export of a config's detection network for a device run, without its weights:

    python tools/onnx_gpu_model.py --cfg configs/faster/sniper_res101_e2e.yml --out .whl/onnx_gpu/model

writes body.onnx and head.onnx with every initializer as external data of ``weights.bin`` (not kept),
model.json, and ``weights.json`` naming each initializer's place (offset, length), shape and kind, from which
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
INPUT_NORMALISER_VARIANCE = 3600.0  # the ResNets' bn_data: pixels of standard deviation ~60 to ~1


def weight_kind(name):
    """How device_run.py makes a parameter: "gauss" (N(0, 1 / fan-in)), "zeros", "ones" or a constant."""
    if name.startswith("bn_data") and name.endswith("moving_var"):
        return INPUT_NORMALISER_VARIANCE
    if name.endswith(("_gamma", "_moving_var")):
        return "ones"
    if name.endswith("_weight"):
        return "gauss"
    return "zeros"


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
    export_onnx_params(cfg, numbered_classes(num_classes), *module.get_params(), args.out, "weights from a seed")
    places = {}
    for key in ("body", "head"):
        path = os.path.join(args.out, ONNX_FILES[key])
        model = onnx.load(path)
        places[key], offset = [], 0
        for tensor in model.graph.initializer:
            if "__" in tensor.name:  # the translation's constants (onnx_export.GraphBuilder) stay in the graph
                continue
            length = len(tensor.raw_data)
            set_external_data(tensor, location=f"{key}-{WEIGHTS}", offset=offset, length=length)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            places[key].append({"name": tensor.name, "shape": list(tensor.dims), "offset": offset, "length": length,
                                "kind": weight_kind(tensor.name)})
            offset += length
        onnx.save(model, path)
    with open(os.path.join(args.out, "weights.json"), "w") as f:
        json.dump(places, f)
    print(f"wrote {args.out}: {', '.join(sorted(os.listdir(args.out)))}")


if __name__ == "__main__":
    main()
