"""Time tools/serve.py's endpoint against the Python API on the same images, then load it:

    python tools/benchmark_serve.py --model RUN_FOLDER --images IMAGE [IMAGE ...] [--requests 200 --clients 8]

A Markdown table on stdout: seconds per image of ``Detector(image)`` and of ``POST /detect`` one at a time on a
loopback port (the difference is the server's share: HTTP, decoding, JSON), then ``--requests`` requests from
``--clients`` concurrent clients against a queue of ``--queue``: answered and refused (503) counts, the queue's
peak, requests/s and the resident memory before and after.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import http.client
import itertools
import threading
import time

from lib.logger import report_user_errors
from lib.run.folder import add_model_arguments, config_from_model_arguments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--images", nargs="+", required=True, help="image files (JPEG or PNG) to send")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes over the images, one at a time")
    parser.add_argument("--requests", type=int, default=200, help="requests of the load test")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients of the load test")
    parser.add_argument("--queue", type=int, default=4, help="the server's --queue")
    return parser.parse_args(argv)


def post(address, data):
    connection = http.client.HTTPConnection(*address, timeout=600)
    try:
        connection.request("POST", "/detect", body=data, headers={"Content-Type": "application/octet-stream"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@report_user_errors
def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_model_arguments(args)
    import psutil

    from lib.benchmarking import markdown_table, measure
    from lib.dataset import read_image
    from lib.serving.server import DetectionServer
    from lib.serving.service import build_service

    service = build_service(cfg, args.queue).start()
    server = DetectionServer(service, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = server.server_address[:2]
    files = [open(path, "rb").read() for path in args.images]
    images = [read_image(path, cfg.dataset.MAX_IMAGE_PIXELS) for path in args.images]
    try:
        api = measure(lambda: [service.detector(image) for image in images], repeat=args.repeat)
        endpoint = measure(lambda: [post(address, data) for data in files], repeat=args.repeat)
        statuses, lock = [], threading.Lock()
        turns = itertools.cycle(files)

        def client(count):
            for _ in range(count):
                with lock:
                    data = next(turns)
                status = post(address, data)
                with lock:
                    statuses.append(status)

        before = psutil.Process().memory_info().rss
        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(args.requests // args.clients,)) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - start
        after = psutil.Process().memory_info().rss
        health = service.health_json()
    finally:
        server.shutdown()
        server.server_close()
        service.stop()
    count, answered, busy = len(images), statuses.count(200), statuses.count(503)
    print(markdown_table(["what", "value"], [
        ["Python API, s per image (median)", f"{api.median / count:.3f}"],
        ["POST /detect one at a time, s per image (median)", f"{endpoint.median / count:.3f}"],
        [f"load: {len(statuses)} requests, {args.clients} clients, queue {args.queue}",
         f"{answered} answered, {busy} refused (503), {len(statuses) - answered - busy} other"],
        ["load: answered per s", f"{answered / seconds:.2f}"],
        ["load: queue peak / capacity", f"{health['peak']} / {health['capacity']}"],
        ["load: resident memory before -> after", f"{before / 2**20:.0f} -> {after / 2**20:.0f} MB"],
    ]))


if __name__ == "__main__":
    main()
