"""A headless Chromium for page tests, driven through chromedriver's W3C WebDriver protocol (JSON over HTTP,
spoken here with the standard library: no client package). ``browser_missing()`` says why none can run
(Debian: ``apt-get install chromium chromium-driver``); ``Browser(download_dir)`` starts chromedriver on a free
loopback port and one Chromium session, with the flags a root user in a container needs and a fresh profile;
``close()`` ends both."""
import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

# Every flag keeps Chromium off the network but the pages it is sent to (and runs as root in a container).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--window-size=1280,900"]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


def browser_paths():
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def browser_missing():
    """Why no page test can run here (None when Chromium and its driver are installed)."""
    chromium, driver = browser_paths()
    if chromium and driver:
        return None
    return f"no {'chromium' if not chromium else 'chromedriver'} on PATH (Debian: apt-get install chromium " \
           f"chromium-driver)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium session; ``call(method, path, body)`` is one WebDriver command of it."""

    def __init__(self, download_dir, timeout=60):
        chromium, driver = browser_paths()
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.port = free_port()
        self.driver = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.timeout = timeout
        self.session = None
        try:
            self._wait_for_driver()
            options = {"binary": chromium, "args": CHROMIUM_FLAGS + [f"--user-data-dir={self.profile}"],
                       "prefs": {"download.default_directory": str(download_dir),
                                 "download.prompt_for_download": False}}
            answer = self._request("POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": options}}})
            self.session = answer["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_for_driver(self):
        end = time.monotonic() + self.timeout
        while True:
            try:
                self._request("GET", "/status")
                return
            except OSError:
                if time.monotonic() > end or self.driver.poll() is not None:
                    raise
                time.sleep(0.1)

    def _request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)["value"]
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"webdriver {method} {path}: {err.read()[:500]!r}") from None

    def call(self, method, path, body=None):
        return self._request(method, f"/session/{self.session}{path}", body)

    def open(self, url):
        self.call("POST", "/url", {"url": url})

    def run(self, script, *args):
        """The value of JavaScript ``script`` (a function body: ``return ...``) in the page."""
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, script, timeout=60, *args):
        """The first truthy value of ``script``, polled; AssertionError naming it after ``timeout`` s."""
        end = time.monotonic() + timeout
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"the page never made true: {script}")
            time.sleep(0.1)

    def find(self, css):
        return self.call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type_into(self, element, text):
        """Keys typed into an element; for an ``<input type=file>``, the path of a file to choose."""
        self.call("POST", f"/element/{element}/value", {"text": text})

    def click(self, element):
        self.call("POST", f"/element/{element}/click", {})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", "/screenshot")))

    def close(self):
        try:
            if self.session is not None:
                self._request("DELETE", f"/session/{self.session}")
        except (OSError, RuntimeError):
            pass
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
            self.session = None
