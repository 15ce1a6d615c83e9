"""The HTTP front of a DetectionService (standard library only): the demo page, ``POST /detect``,
``GET /health`` and ``GET /model``.

Every answer is JSON but the page; every refusal is a status with ``{"error": one line}``, and the server
goes on serving. An upload is refused by its headers before its body is read (wrong content type 415, no
length 411, over ``max_upload`` bytes 413), then admitted into the service's bounded queue or refused at
once (503, ``Retry-After``), then read and checked. A refused body is drained (up to the upload limit, or
for a moment: a lingering close) so that the client reads the answer rather than a reset connection.
Bound beyond the loopback interface the server requires a token (``check_bind``), sent as
``Authorization: Bearer TOKEN`` (the page passes on the ``?token=`` of its address).
"""
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
import time
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from lib.errors import UserError
from lib.serving.service import Refused

logger = logging.getLogger(__name__)

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")
IMAGE_TYPES = ("image/", "application/octet-stream")
LINGER_S = 2.0  # how long a refused upload's remaining bytes are read and dropped before the connection closes


def is_loopback(host):
    """Whether ``host`` (a name or an address) is this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host, token):
    """Refuse (UserError) to listen beyond the loopback interface without a token."""
    if not is_loopback(host) and not token:
        raise UserError(f"--host {host} is reachable from other machines: give --token SECRET as well (clients then "
                        f"send 'Authorization: Bearer SECRET'; the page is opened as http://HOST:PORT/?token=SECRET)")


def check_content_type(content_type):
    """Refuse (Refused 415) a content type that is neither an image's nor multipart/form-data."""
    kind = content_type.split(";")[0].strip().lower()
    if not (kind.startswith(IMAGE_TYPES) or kind == "multipart/form-data"):
        raise Refused(415, f"content type {content_type or '(none)'} is not an image: send image/jpeg, image/png, "
                           f"... or multipart/form-data with the image as a file")
    return kind


def upload_of(body, content_type):
    """``(image bytes, file name)`` of a request body: the body itself for an image content type, the first
    file part (or the part named ``image``) of a multipart/form-data one; Refused 400/415 otherwise."""
    if check_content_type(content_type) != "multipart/form-data":
        return body, "upload"
    message = BytesParser(policy=policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    parts = list(message.iter_parts()) if message.is_multipart() else []
    for part in parts:
        if part.get_filename() or part.get_param("name", header="content-disposition") == "image":
            return part.get_payload(decode=True) or b"", part.get_filename() or "upload"
    raise Refused(400, "multipart/form-data without a file part: send the image as a file (field 'image')")


class DetectionHandler(BaseHTTPRequestHandler):
    """One request (HTTP/1.0: a connection each); ``self.server`` is the DetectionServer."""

    server_version = "sniper-serve"
    timeout = 30  # s of silence from a client before its connection is dropped

    # -- answers ------------------------------------------------------------------------------------------
    def _send(self, status, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, status, message, unread=0):
        """The one-line JSON error; ``unread`` body bytes (-1: unknown) are drained first."""
        logger.info("%s %s -> %d %s", self.command, self.path, status, message)
        headers = [("Retry-After", "1")] if status == 503 else []
        self.close_connection = True
        if 0 < unread <= self.server.max_upload:
            self._drop(unread)
            unread = 0
        self._send(status, {"error": message}, headers=headers)
        if unread:
            self._linger()

    def _drop(self, count):
        while count > 0:
            chunk = self.rfile.read(min(count, 1 << 16))
            if not chunk:
                return
            count -= len(chunk)

    def _linger(self):
        """Read and drop what the client still sends for a moment, so that it sees the answer, not a reset."""
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_WR)
            end = time.monotonic() + LINGER_S
            self.connection.settimeout(0.2)
            while time.monotonic() < end and self.connection.recv(1 << 16):
                pass
        except OSError:
            pass

    def _authorised(self):
        token = self.server.token
        if not token:
            return True
        given = self.headers.get("Authorization", "")
        given = given[7:] if given.startswith("Bearer ") else parse_qs(urlsplit(self.path).query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), token.encode())

    # -- routes -------------------------------------------------------------------------------------------
    def do_GET(self):
        route = urlsplit(self.path).path
        if not self._authorised():
            return self._refuse(401, "a token is required: send 'Authorization: Bearer TOKEN' (page: ?token=TOKEN)")
        if route in ("/", "/index.html"):
            return self._send(200, self.server.page, "text/html; charset=utf-8")
        if route == "/health":
            return self._send(200, self.server.service.health_json())
        if route == "/model":
            return self._send(200, self.server.service.model_json())
        return self._refuse(404, f"no such page {route}: GET /, /health, /model; POST /detect")

    def do_POST(self):
        route = urlsplit(self.path).path
        length = self.headers.get("Content-Length")
        unread = int(length) if length and length.isdigit() else -1
        if not self._authorised():
            return self._refuse(401, "a token is required: send 'Authorization: Bearer TOKEN'", unread)
        if route != "/detect":
            return self._refuse(404, f"no such endpoint {route}: POST /detect", unread)
        try:
            check_content_type(self.headers.get("Content-Type", ""))
        except Refused as err:
            return self._refuse(err.status, str(err), unread)
        if length is None or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._refuse(411, "a Content-Length is required (no chunked uploads)", -1)
        if unread < 0:
            return self._refuse(400, f"Content-Length {length!r} is not a byte count", -1)
        if unread > self.server.max_upload:
            return self._refuse(413, f"upload of {unread} bytes, more than the limit of {self.server.max_upload} "
                                     f"(--max-upload-mb)", unread)
        service = self.server.service
        if not service.admit():
            return self._refuse(503, f"busy: {service.capacity} requests are in already; try again", unread)
        queued = False
        try:
            body = self.rfile.read(unread)
            if len(body) < unread:
                raise Refused(400, f"the body ended after {len(body)} of its {unread} bytes")
            data, name = upload_of(body, self.headers.get("Content-Type", ""))
            image_id = parse_qs(urlsplit(self.path).query).get("image_id", ["0"])[0]
            if not image_id.isdigit():
                raise Refused(400, f"image_id {image_id!r} is not a number")
            job = service.submit(data, name, int(image_id))
            queued = True
            self._send(200, job.wait(service.timeout))
        except Refused as err:
            self._refuse(err.status, str(err))
        except OSError as err:  # the client went silent or away while sending: nobody to answer
            logger.info("POST /detect from %s: the upload stopped: %s", self.address_string(), err)
            self.close_connection = True
        finally:
            if not queued:
                service.leave()

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        logger.debug("%s %s", self.address_string(), format % args)


class DetectionServer(ThreadingHTTPServer):
    """A thread per connection in front of one DetectionService; ``url`` is where it listens."""

    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds before accept: a burst is answered (503), not delayed

    def __init__(self, service, host="127.0.0.1", port=0, token=None, max_upload=50 << 20):
        check_bind(host, token)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.service, self.token, self.max_upload = service, token, max_upload
        with open(PAGE, "rb") as f:
            self.page = f.read()
        super().__init__((host, port), DetectionHandler)

    def handle_error(self, request, client_address):
        """A client that went away is a line in the log; anything else is a defect, logged with its traceback
        (the server goes on)."""
        if isinstance(sys.exc_info()[1], OSError):
            logger.info("connection from %s ended: %s", client_address[0], sys.exc_info()[1])
        else:
            logger.exception("request from %s failed", client_address[0])

    @property
    def url(self):
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"
