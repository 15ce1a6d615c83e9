"""The download of the reference's published files (lib/downloads.py) against a file server on loopback: a
good archive installs in the project's formats, a corrupted, cut-short, unverified or escaping one installs
nothing and leaves no partial file."""
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading
from dataclasses import replace

import mxnet as mx
import numpy as np
import pytest

from lib.dataset import proposals as proposal_files
from lib.downloads import ARTIFACTS, DownloadError, install
from lib.errors import DataError, DataFileError

BOXES = {9: np.array([[1, 2, 30, 40, 0.9], [5, 5, 8, 9, 0.1]], np.float32), 25: np.zeros((0, 5), np.float32)}


def archive_bytes(members):
    """A .tar.gz of ``{name: bytes}``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def params_bytes(tmp_path):
    path = str(tmp_path / "made.params")
    mx.nd.save(path, {"arg:conv0_weight": mx.nd.ones((2, 3)), "aux:bn_data_moving_var": mx.nd.ones(3)})
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def server(tmp_path):
    """(base URL, served {name: bytes}, requests seen): an HTTP server on 127.0.0.1; ``cut/NAME`` sends NAME's
    Content-Length but only half of its bytes, then closes the connection."""
    files, seen = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            cut = self.path.startswith("/cut/")
            data = files.get(self.path[len("/cut/" if cut else "/"):])
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2] if cut else data)
            self.close_connection = True

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", files, seen
    httpd.shutdown()
    httpd.server_close()


def artifact(url, data=b"", **kwargs):
    return replace(ARTIFACTS["proposals"], url=url, sha256=hashlib.sha256(data).hexdigest() if data else "", **kwargs)


def every_file(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def test_a_verified_archive_installs_in_the_projects_formats(server, tmp_path):
    base, files, _ = server
    files["good.tar.gz"] = good = archive_bytes({
        "proposals/COCO_train2014_rpn.pkl": pickle.dumps(BOXES), "pretrained_model/net-0000.params": params_bytes(
            tmp_path), "proposals/README": b"proposals of the RPN"})
    dest = tmp_path / "data"
    installed = install(artifact(f"{base}/good.tar.gz", good), str(dest), progress=False)
    assert every_file(dest) == ["pretrained_model/net-0000.params", "proposals/COCO_train2014_rpn.npz",
                                "proposals/README"]
    assert sorted(installed) == sorted(str(dest / name) for name in every_file(dest))
    converted = proposal_files.read_proposals(str(dest / "proposals" / "COCO_train2014_rpn.npz"))
    assert sorted(converted) == [9, 25]
    np.testing.assert_array_equal(converted[9], BOXES[9])
    assert (dest / "proposals" / "README").read_bytes() == b"proposals of the RPN"


def test_a_corrupted_or_cut_short_download_installs_nothing(server, tmp_path):
    base, files, _ = server
    files["good.tar.gz"] = good = archive_bytes({"proposals/a.pkl": pickle.dumps(BOXES)})
    files["bad.tar.gz"] = bytearray(good)
    files["bad.tar.gz"][len(good) // 2] ^= 0xFF
    dest = tmp_path / "data"
    dest.mkdir()
    (dest / "kept.txt").write_text("already here")
    with pytest.raises(DownloadError, match="SHA-256 .* is not the expected .*was not installed"):
        install(artifact(f"{base}/bad.tar.gz", good), str(dest), progress=False)
    assert every_file(dest) == ["kept.txt"]
    with pytest.raises(DownloadError, match=f"ended after {len(good) // 2} of {len(good)} bytes"):
        install(artifact(f"{base}/cut/good.tar.gz", good), str(dest), progress=False)
    assert every_file(dest) == ["kept.txt"]
    with pytest.raises(DownloadError, match="cannot download .*missing.tar.gz"):
        install(artifact(f"{base}/missing.tar.gz", good), str(dest), progress=False)
    assert every_file(dest) == ["kept.txt"]


def test_an_unknown_checksum_is_refused_unless_no_verify_and_then_nothing_is_unpickled(server, tmp_path, monkeypatch):
    base, files, seen = server
    files["good.tar.gz"] = archive_bytes({"proposals/a.pkl": pickle.dumps(BOXES)})
    dest = tmp_path / "data"
    with pytest.raises(DataError, match="no SHA-256 is recorded .* --sha256 HEX .* --no-verify"):
        install(artifact(f"{base}/good.tar.gz"), str(dest), progress=False)
    assert seen == [] and not dest.exists()  # refused before downloading

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    monkeypatch.setattr(proposal_files.pickle, "load", refuse)
    install(artifact(f"{base}/good.tar.gz"), str(dest), verify=False, progress=False)
    assert every_file(dest) == ["proposals/a.pkl"]  # installed as it came, not converted


def test_a_member_escaping_its_folder_is_refused(server, tmp_path):
    base, files, _ = server
    files["evil.tar.gz"] = evil = archive_bytes({"proposals/a.txt": b"fine", "../outside.txt": b"escaped"})
    dest = tmp_path / "data"
    with pytest.raises(DataFileError, match="outside its folder"):
        install(artifact(f"{base}/evil.tar.gz", evil), str(dest), progress=False)
    assert every_file(tmp_path) == []
