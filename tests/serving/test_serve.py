"""tools/serve.py and lib/serving: the endpoint through a real HTTP client on a loopback port (answers equal to
the Python API's), the bounded queue under load, every bad input refused in one JSON line while the server
goes on, and the demo page in a real headless Chromium (tests/browser_helpers.py)."""
import base64
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import cv2
import numpy as np
import psutil
import pytest
from pycocotools import mask as mask_utils

from browser_helpers import Browser, browser_missing
from detector_helpers import BLOB_SQUARES, WITHOUT_MXNET, blob_image, stand_in_detector
from lib.bootstrap import ROOT
from lib.config import with_overrides
from lib.dataset import load_roidb
from lib.drawing import class_palette
from lib.errors import UserError
from lib.inference import Detector
from lib.inference.detections import Detections
from lib.run import checkpoint
from lib.run.checkpoint import output_dir
from lib.run.folder import MODEL_KEY, model_info, write_run_config
from lib.serving.server import DetectionServer, check_bind
from lib.serving.service import DetectionService, detections_json

def quick_stand_in(**test_overrides):
    """The stand-in detector at one scale, the image's own size (a request takes milliseconds)."""
    return stand_in_detector(**{"SCALES": "[1.0]", "VALID_RANGES": "[[-1, -1]]", **test_overrides})


IMAGE = blob_image(300, 420, BLOB_SQUARES[:2] + [(100, 200, 30), (300, 150, 80), (250, 30, 14)])


def png(image):
    return cv2.imencode(".png", image)[1].tobytes()


@contextlib.contextmanager
def serving(detector, queue_size=2, token=None, max_upload=1 << 20, **service_args):
    """A DetectionServer of ``detector`` on a free loopback port, serving from a thread."""
    service = DetectionService(detector, range(len(detector.classes)), queue_size=queue_size, **service_args).start()
    server = DetectionServer(service, "127.0.0.1", 0, token, max_upload)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        service.stop()
        thread.join(10)


def request(server, method, path, body=None, headers=None, timeout=60):
    """``(status, JSON body, headers)`` of one request through http.client."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        kind = response.getheader("Content-Type", "")
        return response.status, json.loads(data) if kind.startswith("application/json") else data, response
    finally:
        connection.close()


def detect(server, body, content_type="image/png", **headers):
    return request(server, "POST", "/detect", body, {"Content-Type": content_type, **headers})


def multipart(data, filename="photo.png", field="image"):
    boundary = "b0undary7"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def assert_same_detections(answer, dets):
    """The JSON detections are the Detections, row by row (floats to float32 precision)."""
    items = answer["detections"]
    assert len(items) == len(dets)
    if not items:
        return
    np.testing.assert_allclose([d["box"] for d in items], dets.boxes, rtol=1e-6, atol=1e-3)
    np.testing.assert_allclose([d["score"] for d in items], dets.scores, rtol=1e-5, atol=1e-7)
    assert [d["label"] for d in items] == dets.labels.tolist()
    assert [d["class"] for d in items] == list(dets.names)


# -- the endpoint of tools/serve.py on a run folder of the tiny network ---------------------------------
@pytest.fixture(scope="module")
def run_folder(tiny, tmp_path_factory):
    """A run folder as training leaves it (config.yaml, a checkpoint with its metadata: classes cat4, cat9,
    COCO ids 4, 9) of the tiny random network."""
    cfg = with_overrides(tiny[0], {"output_path": str(tmp_path_factory.mktemp("serve") / "out"),
                                   "TEST.NUM_PROCESS": 0})
    _, dataset = load_roidb(cfg, cfg.dataset.test_image_set, training=False)
    write_run_config(cfg)
    checkpoint.save_checkpoint(checkpoint.checkpoint_prefix(cfg), 1, None, *tiny[1:], stds=(1, 1, 1, 1),
                               means=(0, 0, 0, 0), progress={MODEL_KEY: model_info(cfg, dataset, False)})
    return output_dir(cfg), os.path.join(cfg.dataset.dataset_path, "images", "val")


def test_serve_answers_what_the_python_api_finds_on_the_same_image(run_folder):
    folder, images = run_folder
    every_score = ["--set", "TEST.SCORE_THRESH", "0"]  # a random network scores below the default threshold
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--model", folder,
                                "--port", "0", *every_score], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline()  # "serving CHECKPOINT on http://127.0.0.1:PORT/ (Ctrl-C stops)"
        assert " on http://127.0.0.1:" in line, line + process.stderr.read()[-3000:]
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])

        class Address:
            server_address = ("127.0.0.1", port)
        detector = Detector.from_checkpoint(folder, {"TEST.SCORE_THRESH": 0})
        for name in ("a.png", "b.png"):
            data = open(os.path.join(images, name), "rb").read()
            expected = detector(cv2.imread(os.path.join(images, name)))
            assert len(expected) > 0
            for body, content_type in ((data, "image/png"), multipart(data)):
                status, answer, _ = detect(Address, body, content_type)
                assert status == 200, answer
                assert_same_detections(answer, expected)
                height, width = cv2.imread(os.path.join(images, name)).shape[:2]
                assert answer["image"] == {"height": height, "width": width}
                assert set(answer["timing"]) == {"queued_s", "decode_s", "detect_s"}
                # COCO results entries: the run's category ids, inclusive boxes as x, y, w, h
                first, box = answer["coco"][0], answer["detections"][0]["box"]
                assert first["category_id"] == {1: 4, 2: 9}[answer["detections"][0]["label"]]
                assert first["bbox"] == pytest.approx([box[0], box[1], box[2] - box[0] + 1, box[3] - box[1] + 1],
                                                      abs=0.051)
        status, model, _ = request(Address, "GET", "/model")
        assert status == 200 and model["backend"] == "mxnet" and model["masks"] is False
        assert [(c["label"], c["name"], c["category_id"]) for c in model["classes"]] == [(1, "cat4", 4),
                                                                                           (2, "cat9", 9)]
        assert model["scales"] == [[96, 128], [64, 96], [32, 48]]
        status, health, _ = request(Address, "GET", "/health")
        assert status == 200 and health["answered"] == 4 and health["in"] == 0
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in err, err[-3000:]


def test_serve_runs_an_onnx_export_without_mxnet_and_answers_as_its_detector(run_folder, tmp_path):
    """``--model ONNX_FOLDER``: the export of the run, served in a process where MXNet cannot be imported,
    answers what ``Detector.from_onnx`` of that folder finds, and names its back end."""
    pytest.importorskip("onnxruntime", reason="onnx and onnxruntime are pinned for Python >= 3.11")
    folder, images = run_folder
    export = tmp_path / "onnx"
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "--model", folder,
                             "--format", "onnx", "--out", str(export), "--set", "TEST.SCORE_THRESH", "0"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    no_mxnet = WITHOUT_MXNET + f"""
import runpy
sys.argv = ["serve.py", "--model", {str(export)!r}, "--port", "0"]
sys.path.insert(0, {os.path.join(ROOT, "tools")!r})  # as when run as a script: _bootstrap beside it
runpy.run_path({os.path.join(ROOT, "tools", "serve.py")!r}, run_name="__main__")
"""
    process = subprocess.Popen([sys.executable, "-c", no_mxnet], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ROOT})
    try:
        line = process.stdout.readline()
        assert " on http://127.0.0.1:" in line, line + process.stderr.read()[-3000:]
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])

        class Address:
            server_address = ("127.0.0.1", port)
        detector = Detector.from_onnx(str(export))
        data = open(os.path.join(images, "a.png"), "rb").read()
        expected = detector(cv2.imread(os.path.join(images, "a.png")))
        assert len(expected) > 0
        status, answer, _ = detect(Address, data, "image/png")
        assert status == 200, answer
        assert_same_detections(answer, expected)
        status, model, _ = request(Address, "GET", "/model")
        assert status == 200 and model["backend"] == "onnxruntime"
        assert [(c["name"], c["category_id"]) for c in model["classes"]] == [("cat4", 4), ("cat9", 9)]
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err[-3000:]


def test_serve_refuses_to_listen_beyond_the_loopback_without_a_token():
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "secret")
    for host in ("0.0.0.0", "192.168.1.20", "myhost.example"):
        with pytest.raises(UserError, match="--token"):
            check_bind(host, None)
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--model", "nowhere",
                             "--host", "0.0.0.0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --host 0.0.0.0 is reachable")


# -- JSON of masks ---------------------------------------------------------------------------------------
def test_masks_are_answered_as_coco_rle_that_decode_to_the_detectors_masks():
    masks = np.zeros((2, 5, 7), bool)
    masks[0, 1:4, 2:6] = True
    masks[1, 0, 0] = masks[1, 4, 6] = True
    dets = Detections(np.array([[2, 1, 5, 3], [0, 0, 6, 4]], np.float32), np.array([0.9, 0.4], np.float32),
                      np.array([2, 1]), ("b", "a"), masks)
    answer = detections_json(dets, (5, 7), [0, 11, 22], image_id=3)
    rles = [d["mask"] for d in answer["detections"]]
    decoded = mask_utils.decode([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])
    np.testing.assert_array_equal(np.transpose(decoded, (2, 0, 1)), masks)
    assert [e["segmentation"] for e in answer["coco"]] == rles
    assert [(e["image_id"], e["category_id"], e["bbox"]) for e in answer["coco"]] == \
        [(3, 22, [2.0, 1.0, 4.0, 3.0]), (3, 11, [0.0, 0.0, 7.0, 5.0])]


# -- the queue under load --------------------------------------------------------------------------------
class Gate:
    """Wraps a stand-in network: every forward pass waits until the gate is open."""

    def __init__(self, forward):
        self.forward, self.open = forward, threading.Event()

    def __call__(self, data, im_info):
        assert self.open.wait(60)
        return self.forward(data, im_info)


def test_a_full_queue_answers_503_at_once_and_admits_again_once_it_drains():
    detector = quick_stand_in()
    detector.network.forward = gate = Gate(detector.network.forward)
    with serving(detector, queue_size=2) as server:
        results = []
        clients = [threading.Thread(target=lambda: results.append(detect(server, png(IMAGE))[:2])) for _ in range(3)]
        for client in clients:  # one tested (waiting at the gate), two queued
            client.start()
        deadline = time.monotonic() + 30
        while server.service.health_json()["in"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(4):  # refused at once, the gate still shut
            status, answer, response = detect(server, png(IMAGE))
            assert status == 503 and "busy: 3 requests" in answer["error"] and response.getheader("Retry-After")
        gate.open.set()
        for client in clients:
            client.join(30)
        assert [status for status, _ in results] == [200, 200, 200]
        assert detect(server, png(IMAGE))[0] == 200
        health = server.service.health_json()
    assert (health["busy"], health["answered"], health["peak"], health["in"]) == (4, 4, 3, 0)


def test_load_every_request_answered_none_lost_queue_bound_held_memory_flat():
    detector = quick_stand_in()
    expected = detector(IMAGE)
    with serving(detector, queue_size=3) as server:
        statuses = Counter()
        lock = threading.Lock()

        def client(count):
            for _ in range(count):
                status, answer, _ = detect(server, png(IMAGE))
                if status == 200:
                    assert_same_detections(answer, expected)
                with lock:
                    statuses[status] += 1

        def burst(requests, clients=8):
            threads = [threading.Thread(target=client, args=(requests // clients,)) for _ in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            assert not any(thread.is_alive() for thread in threads)

        burst(40)  # warm-up: the allocator's and MXNet's pools reach their size (a leaked decoded image: 0.4 MB each)
        before = psutil.Process().memory_info().rss
        burst(200)
        after = psutil.Process().memory_info().rss
        health = server.service.health_json()
    assert sum(statuses.values()) == 240 and set(statuses) <= {200, 503}
    assert statuses[200] == health["answered"] and statuses[503] == health["busy"]  # none lost, none doubled
    assert health["peak"] <= 4 and health["in"] == 0 and health["failed"] == 0
    assert after - before < 16 << 20, f"resident memory grew by {(after - before) >> 20} MB over 200 requests"


def test_an_answer_late_or_failed_is_one_json_line_and_its_place_is_held_until_the_worker_is_done():
    detector = quick_stand_in()
    detector.network.forward = gate = Gate(detector.network.forward)
    with serving(detector, queue_size=0, timeout=0.5) as server:
        status, answer, _ = detect(server, png(IMAGE))
        assert status == 504 and "no answer within 0.5 s" in answer["error"]
        assert server.service.health_json()["in"] == 1  # still being tested: the one place stays taken
        assert detect(server, png(IMAGE))[0] == 503
        gate.open.set()
        deadline = time.monotonic() + 30
        while server.service.health_json()["in"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        forward = detector.network.forward
        detector.network.forward = lambda data, im_info: 1 / 0  # a defect inside the network
        status, answer, _ = detect(server, png(IMAGE))
        assert status == 500 and answer["error"] == "upload: the detector failed: division by zero"
        detector.network.forward = forward
        assert detect(server, png(IMAGE))[0] == 200
        health = server.service.health_json()
    assert (health["answered"], health["failed"], health["busy"], health["in"]) == (2, 1, 1, 0)


# -- bad input -------------------------------------------------------------------------------------------
def bomb_png():
    """A small PNG whose header declares 50,000 x 50,000 pixels (2.5 Gpx, over dataset.MAX_IMAGE_PIXELS)."""
    data = bytearray(png(np.zeros((8, 8, 3), np.uint8)))
    data[16:24] = (50_000).to_bytes(4, "big") * 2
    return bytes(data)


def raw_request(server, head, body=b""):
    """The status line and JSON of a hand-written request (headers http.client would not send)."""
    with contextlib.closing(__import__("socket").create_connection(server.server_address[:2], timeout=30)) as s:
        s.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_bad_input_is_refused_in_one_json_line_and_the_server_goes_on():
    detector = quick_stand_in()
    good = png(IMAGE)
    truncated = good[:len(good) // 2]
    with serving(detector, max_upload=100_000) as server:
        cases = [
            (detect(server, b"this is not an image"), 400, "cannot decode image upload"),
            (detect(server, *multipart(b"GIF89a nonsense", "x.gif")), 400, "cannot decode image x.gif"),
            (detect(server, truncated), 400, "truncated image upload"),
            (detect(server, bomb_png()), 413, "50000x50000 pixels"),
            (detect(server, b""), 400, "empty body"),
            (detect(server, good, "text/plain"), 415, "content type text/plain is not an image"),
            (detect(server, good, "application/json"), 415, "not an image"),
            (detect(server, b"x" * 200_000), 413, "upload of 200000 bytes, more than the limit of 100000"),
            (detect(server, b"--zz\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n--zz--\r\n",
                    "multipart/form-data; boundary=zz"), 400, "without a file part"),
            (request(server, "GET", "/nothing"), 404, "no such page /nothing"),
            (request(server, "POST", "/other", good, {"Content-Type": "image/png"}), 404, "no such endpoint"),
        ]
        for (status, answer, _), expected, fragment in cases:
            assert status == expected and fragment in answer["error"] and "\n" not in answer["error"], answer
        # a declared length far over the limit with a few bytes sent: refused from its headers, not awaited
        assert raw_request(server, "POST /detect HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                   "Content-Length: 10000000000", b"\x89PNG") == \
            (413, {"error": "upload of 10000000000 bytes, more than the limit of 100000 (--max-upload-mb)"})
        status, answer = raw_request(server, "POST /detect HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                             "Transfer-Encoding: chunked", b"5\r\nhello\r\n0\r\n\r\n")
        assert status == 411 and "Content-Length is required" in answer["error"]
        status, answer, _ = detect(server, good)  # still serving
        assert status == 200 and len(answer["detections"]) == len(detector(IMAGE))
        health = server.service.health_json()
    assert health["in"] == 0 and health["answered"] == 1 and health["failed"] == 0


def test_a_token_is_required_of_every_request_when_given():
    with serving(quick_stand_in(), token="s3cret") as server:
        assert detect(server, png(IMAGE))[:1] == (401,)
        assert request(server, "GET", "/model")[0] == 401
        assert detect(server, png(IMAGE), Authorization="Bearer wrong")[0] == 401
        assert detect(server, png(IMAGE), Authorization="Bearer s3cret")[0] == 200
        status, page, _ = request(server, "GET", "/?token=s3cret")
        assert status == 200 and b"<canvas" in page
        assert request(server, "GET", "/health", headers={"Authorization": "Bearer s3cret"})[0] == 200


# -- large images: the tiled test through window reads ---------------------------------------------------
def test_an_image_over_36_megapixels_is_tested_in_tiles_from_a_temporary_file():
    squares = [(100, 100, 60), (3000, 2000, 90), (6020, 5900, 70)]
    large = blob_image(6100, 6100, squares)
    tiled = {"SCALES": "[0.25]", "VALID_RANGES": "[[-1, -1]]", "TILE": "[512, 64]"}
    detector = stand_in_detector(**tiled)
    with serving(detector) as server:
        status, answer, _ = detect(server, png(large))
    assert status == 200, answer
    assert answer["image"] == {"height": 6100, "width": 6100}
    found = sorted(d["box"] for d in answer["detections"] if d["score"] > 0.5)  # found at scale 0.25: +-4 px
    np.testing.assert_allclose(found, sorted([x, y, x + side - 1, y + side - 1] for x, y, side in squares), atol=5)
    with serving(stand_in_detector(SCALES="[0.25]", VALID_RANGES="[[-1, -1]]")) as server:
        status, answer, _ = detect(server, png(large))
    assert status == 413 and "TEST.TILE" in answer["error"]


# -- the page in a real browser --------------------------------------------------------------------------
class BlobMasks:
    """A stand-in mask head: each detection's mask is the bright pixels inside its box."""

    def masks(self, source, detections, plan):
        found = {}
        for index, (boxes, _) in detections.items():
            bright = source.read(index).sum(axis=2) > 0
            masks = np.zeros((len(boxes),) + bright.shape, bool)
            for mask, (x1, y1, x2, y2) in zip(masks, np.round(boxes).astype(int)):
                mask[y1:y2 + 1, x1:x2 + 1] = bright[y1:y2 + 1, x1:x2 + 1]
            found[index] = masks
        return found


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_the_page_in_a_headless_browser_draws_filters_and_downloads(tmp_path):
    detector = quick_stand_in()
    detector.mask_head = BlobMasks()
    image = IMAGE.copy()
    image[IMAGE.sum(axis=2) > 0] = (200, 160, 120)  # BGR: a mask's tint is visible on it
    cv2.imwrite(str(tmp_path / "blobs.png"), image)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with serving(detector) as server:
        _, expected, _ = detect(server, png(image))
        scores = sorted(d["score"] for d in expected["detections"])
        browser = Browser(downloads)
        try:
            browser.open(server.url)
            browser.wait("return document.getElementById('classes').children.length > 0")
            browser.type_into(browser.find("#file"), str(tmp_path / "blobs.png"))
            browser.wait("return document.getElementById('timing').textContent.startsWith('test ')")
            shown = lambda: int(browser.run("return document.getElementById('canvas').dataset.shown"))  # noqa: E731
            assert shown() == sum(s >= 0.5 for s in scores) > 0
            # a box of the best detection is drawn in the class's colour, its mask tinted half way to it
            best = expected["detections"][0]
            x1, y1, x2, y2 = [round(v) for v in best["box"]]
            pixel = "const d = document.getElementById('canvas').getContext('2d').getImageData(arguments[0], " \
                    "arguments[1], 1, 1).data; return [d[0], d[1], d[2]];"
            colour = [int(c) for c in class_palette(2)[1][::-1]]  # lib.drawing's colour of label 1, as RGB
            assert browser.run(pixel, x2, (y1 + y2) // 2) == colour
            inside = browser.run(pixel, (x1 + x2) // 2, (y1 + y2) // 2)
            np.testing.assert_allclose(inside, [(under + c) // 2 for under, c in zip((120, 160, 200), colour)], atol=2)
            counts = "return [...document.querySelectorAll('#classes .count')].map(e => e.textContent)"
            assert browser.run(counts) == [str(shown())]
            # the slider filters without a new request
            requests = server.service.health_json()["admitted"]
            middle = (scores[len(scores) // 2 - 1] + scores[len(scores) // 2]) / 2
            slide = "const s = document.getElementById('slider'); s.value = arguments[0]; " \
                    "s.dispatchEvent(new Event('input'));"
            browser.run(slide, f"{middle:.4f}")
            assert 0 < shown() == sum(s >= float(f"{middle:.4f}") for s in scores) < len(scores)
            browser.run(slide, "1")
            assert shown() == 0 and browser.run(pixel, x2, (y1 + y2) // 2) != colour
            browser.run(slide, "0")
            assert shown() == len(scores) and server.service.health_json()["admitted"] == requests
            browser.click(browser.find("#download"))
            path = downloads / "blobs_detections.json"
            deadline = time.monotonic() + 30
            while not path.exists():
                assert time.monotonic() < deadline, os.listdir(downloads)
                time.sleep(0.1)
            time.sleep(0.2)
            assert json.loads(path.read_text()) == expected["coco"]
            # an image dropped on the page is tested in its turn
            dropped = blob_image(200, 240, [(20, 30, 40)])
            browser.run("const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0)); "
                        "const files = new DataTransfer(); "
                        "files.items.add(new File([bytes], 'dropped.png', {type: 'image/png'})); "
                        "document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: files}));",
                        base64.b64encode(png(dropped)).decode())
            browser.wait("return document.getElementById('summary').textContent.includes('(240 x 200 px)')")
            assert shown() == len(detector(dropped)) == 1
            browser.screenshot(str(tmp_path / "page.png"))
            assert cv2.imread(str(tmp_path / "page.png")).shape[1] == 1280
        finally:
            browser.close()
