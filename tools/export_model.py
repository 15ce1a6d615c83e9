"""Export a trained model as a test graph that stock MXNet 1.9.1 loads without this repository, or as ONNX:

    python tools/export_model.py --model RUN_FOLDER|FILE.params --out PREFIX [--set KEY VALUE ...]
    python tools/export_model.py --cfg FILE [--model FILE.params] --out PREFIX [--set ...]   (older checkpoints)
    python tools/export_model.py --model RUN_FOLDER|FILE.params --format onnx --out DIR [--fp16]

``--format onnx`` writes ``DIR/body.onnx`` (image -> RPN maps and the R-CNN head's features), ``DIR/head.onnx``
(features and proposals -> class scores and box deltas; opset 19, onnx.checker passes) and ``DIR/model.json``
(classes, pixel means and channel order, test scales and valid ranges, NMS settings, stride, anchors, the
whole test config): ``Detector.from_onnx(DIR)`` or ``main_test.py --backend onnxruntime`` run the whole test
protocol on it with ONNX Runtime and no MXNet (lib/inference/onnx_network.py; README, "Deploy"). A network
trained with masks also gets ``DIR/mask.onnx`` (features and boxes -> 28x28 masks). ``--fp16`` writes the
layers in float16 (inputs and outputs stay float32), for ONNX Runtime's CUDA provider (on the CPU ONNX Runtime
casts them back to float32: about as fast as the float32 export).

writes ``PREFIX-symbol.json`` and ``PREFIX-0000.params`` (load them with
``mx.model.load_checkpoint(PREFIX, 0)`` and bind an ``mx.mod.Module`` with data names data, im_info,
im_ids, chip_ids and no labels), and ``PREFIX-model.json`` describing the inputs, outputs and classes. A
network trained with masks (TRAIN.WITH_MASK) also gets its mask graph, ``PREFIX-mask-symbol.json`` and
``PREFIX-mask-0000.params`` (data names data, mask_rois; described under ``masks`` in the model file).

The graph is built with MXNet's own operators only: the stock MultiProposal proposal layer
(TEST.PROPOSAL_LAYER stock; its proposals differ slightly from the reference layer's that main_test.py
uses by default, see docs/reference_differences.md) and the stock deformable convolution / PS-ROI pooling
(network.CPU_DEFORMABLE_OPS stock, the reference network's; the compiled ones differ in last bits:
tools/compare_deformable_ops.py). ``--set`` overrides keys of the
run's config.yaml, e.g. TEST.RPN_POST_NMS_TOP_N.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import sys

from lib.logger import report_user_errors, setup_logging
from lib.run.folder import add_model_arguments, config_from_model_arguments

logger = logging.getLogger("export_model")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, help="prefix of the exported files, e.g. export/sniper_tiny (mxnet), "
                                                     "or the folder of the ONNX export")
    parser.add_argument("--format", choices=("mxnet", "onnx"), default="mxnet",
                        help="mxnet: a stock MXNet graph of one scale (default); onnx: two ONNX graphs + model.json")
    parser.add_argument("--fp16", action="store_true",
                        help="--format onnx: the layers in float16 (inputs and outputs float32), for ONNX Runtime's "
                             "CUDA provider; on the CPU provider it is no faster than float32")
    args = parser.parse_args(argv)
    if args.fp16 and args.format != "onnx":
        parser.error("--fp16 is an option of --format onnx (the MXNet graph's float16 is TEST.fp16, on GPUs)")
    return args


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_model_arguments(args)
    setup_logging()
    from lib.inference.export import export_onnx, export_test_graph
    from lib.run.checkpoint import CheckpointError

    try:
        if args.format == "onnx":
            paths = export_onnx(cfg, args.out, fp16=args.fp16)
        else:
            paths = export_test_graph(cfg, args.out)
    except (CheckpointError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    logger.info("wrote %s", ", ".join(paths))


if __name__ == "__main__":
    main()
