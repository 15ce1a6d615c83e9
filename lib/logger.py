"""Logging set-up shared by the entry points: console plus a log file in the output folder, and the
line that ends every run's log (``logged_outcome``)."""
import contextlib
import logging
import os
import sys
import time

from tqdm import tqdm


class TqdmSafeHandler(logging.StreamHandler):
    """Console handler that prints through ``tqdm.write``: a log line goes above a running progress bar
    instead of over it (the bar is redrawn below)."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001  (logging's own contract: report and go on)
            self.handleError(record)


def setup_logging(output_dir=None, name="sniper", level=logging.INFO):
    """Log to stderr and, when ``output_dir`` is given, to ``output_dir/{name}_{time}.log``.

    Returns the log file path (or None).
    """
    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    console = TqdmSafeHandler(sys.stderr)
    console.setFormatter(fmt)
    root.addHandler(console)
    path = None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, f"{name}_{time.strftime('%Y%m%d-%H%M%S')}.log")
        file_handler = logging.FileHandler(path)
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    return path


@contextlib.contextmanager
def logged_outcome(what):
    """Around an entry point's work, after ``setup_logging``: its log ends with "{what} finished", or with
    what stopped it (an error and its traceback, a one-line ``sys.exit`` message, Ctrl-C), so a log that
    just stops means the process was killed. A failure then exits with code 1, its traceback printed
    once (by the log's console handler)."""
    log = logging.getLogger(__name__)
    try:
        yield
    except SystemExit as err:
        if err.code in (None, 0):
            log.info("%s finished", what)
            raise
        log.error("%s stopped: %s", what, err.code)
        raise SystemExit(err.code if isinstance(err.code, int) else 1) from None
    except KeyboardInterrupt:
        log.error("%s interrupted (Ctrl-C)", what)
        raise
    except Exception as err:  # noqa: BLE001  (logged with its traceback, then the process fails)
        log.exception("%s failed: %s: %s", what, type(err).__name__, err)
        raise SystemExit(1) from None
    log.info("%s finished", what)
