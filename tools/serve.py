"""Show a trained detector: a demo page and an HTTP endpoint on this machine.

    python tools/serve.py --model RUN_FOLDER [--port 8080] [--set KEY VALUE ...]
    python tools/serve.py --model RUN_FOLDER --host 0.0.0.0 --token SECRET    (reachable from other machines)
    python tools/serve.py --model ONNX_FOLDER    (an export of tools/export_model.py --format onnx: no MXNet needed)

prints the address (http://127.0.0.1:PORT/ by default): the page takes an image (chosen or dropped) and draws
its detections; ``POST /detect`` with an image body (image/jpeg, image/png, ..., or a multipart/form-data
upload) answers JSON (boxes, scores, classes, masks as COCO RLE for a mask network, the image size, timing and
the COCO results entries); ``GET /health`` and ``GET /model`` describe the service and the model. One model,
one inference worker, ``--queue`` requests waiting at most (more: 503). ``--model``/``--cfg``/``--set`` work as
for demo.py and main_test.py (``--backend onnxruntime``: the run's checkpoint exported and run on ONNX Runtime).
Images larger than 36 Mpx need the tiled test (TEST.TILE; the tiny config has it).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

from lib.inference.onnx_network import DESCRIPTION, add_backend_argument, with_backend
from lib.logger import report_user_errors, setup_logging
from lib.run.folder import add_model_arguments, config_from_model_arguments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    add_backend_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (beyond the loopback: --token)")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free one)")
    parser.add_argument("--token", default=None,
                        help="required of every request (Authorization: Bearer TOKEN; the page: /?token=TOKEN)")
    parser.add_argument("--queue", type=int, default=4, help="requests that may wait while one is tested")
    parser.add_argument("--max-upload-mb", type=float, default=50.0, help="largest upload accepted")
    return with_backend(parser.parse_args(argv))


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    args = parse_args(argv)
    if args.queue < 0 or args.max_upload_mb <= 0:
        sys.exit(f"error: --queue {args.queue} must be >= 0 and --max-upload-mb {args.max_upload_mb} > 0")
    from lib.serving.server import DetectionServer, check_bind
    from lib.serving.service import build_service

    check_bind(args.host, args.token)  # before the model loads
    onnx_folder = args.model if args.model and os.path.isfile(os.path.join(args.model, DESCRIPTION)) else None
    cfg = None if onnx_folder else config_from_model_arguments(args)
    setup_logging()
    service = build_service(cfg, args.queue, onnx_folder).start()
    try:
        server = DetectionServer(service, args.host, args.port, args.token, int(args.max_upload_mb * (1 << 20)))
    except OSError as err:
        service.stop()
        sys.exit(f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err} (another --port?)")
    print(f"serving {onnx_folder or cfg.TEST.MODEL} on {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        service.stop()


if __name__ == "__main__":
    main()
