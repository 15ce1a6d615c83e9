"""Logging set-up shared by the entry points: console plus a log file in the output folder."""
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
