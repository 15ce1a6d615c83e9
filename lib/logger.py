"""Logging set-up shared by the entry points: console plus a log file in the output folder, the line
that ends every run's log (``logged_outcome``), and the one-line report of a user's mistake
(lib/errors.py: the console gets one line, the log file also the traceback)."""
import contextlib
import functools
import logging
import os
import sys
import time

from tqdm import tqdm

from lib.errors import USER_ERRORS, exit_code, one_line

# ``extra`` of a record for the log file only (the console would drown in it, e.g. the whole config).
FILE_ONLY = {"file_only": True}
# ``extra`` of a record whose traceback goes to the log file only (a user error: the console gets its line).
BRIEF = {"brief": True}


class TqdmSafeHandler(logging.StreamHandler):
    """Console handler that prints through ``tqdm.write``: a log line goes above a running progress bar
    instead of over it (the bar is redrawn below)."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001  (logging's own contract: report and go on)
            self.handleError(record)


class _ConsoleFormatter(logging.Formatter):
    """Drops the traceback of a ``BRIEF`` record: the console shows its message, the log file the rest."""

    def format(self, record):
        if getattr(record, "brief", False) and record.exc_info:
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        return super().format(record)


def _not_file_only(record):
    return not getattr(record, "file_only", False)


def setup_logging(output_dir=None, name="sniper", level=logging.INFO):
    """Log to stderr and, when ``output_dir`` is given, to ``output_dir/{name}_{time}.log``.

    Returns the log file path (or None).
    """
    root = logging.getLogger()
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    layout = ("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    fmt = logging.Formatter(*layout)
    console = TqdmSafeHandler(sys.stderr)
    console.setFormatter(_ConsoleFormatter(*layout))
    console.addFilter(_not_file_only)
    root.addHandler(console)
    path = None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, f"{name}_{time.strftime('%Y%m%d-%H%M%S')}.log")
        file_handler = logging.FileHandler(path)
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    return path


def log_config(source, overrides, text):
    """The console names the config file and the overrides; the log file also gets the whole config."""
    log = logging.getLogger(__name__)
    log.info("config %s with overrides %s", source, overrides)
    log.info("effective config:\n%s", text, extra=FILE_ONLY)


@contextlib.contextmanager
def logged_outcome(what):
    """Around an entry point's work, after ``setup_logging``: its log ends with "{what} finished", or with
    what stopped it (an error and its traceback, a one-line ``sys.exit`` message, Ctrl-C), so a log that
    just stops means the process was killed. A failure then exits with code 1 (Ctrl-C: 130): a user error
    (lib/errors.py) in one console line, its traceback in the log file only; any other error with its
    traceback printed once (by the log's console handler)."""
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
        raise SystemExit(130) from None
    except USER_ERRORS as err:
        log.error("%s stopped: %s", what, one_line(err), exc_info=True, extra=BRIEF)
        raise SystemExit(exit_code(err)) from None
    except Exception as err:  # noqa: BLE001  (logged with its traceback, then the process fails)
        log.exception("%s failed: %s: %s", what, type(err).__name__, err)
        raise SystemExit(1) from None
    log.info("%s finished", what)


def report_user_errors(main):
    """Decorate an entry point's ``main``: a user error raised before logging is set up (or by a tool
    that sets up none) exits with its one line, Ctrl-C with one line and code 130; a defect keeps its
    traceback."""
    @functools.wraps(main)
    def guarded(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except USER_ERRORS as err:
            print(one_line(err), file=sys.stderr)
            raise SystemExit(exit_code(err)) from None
        except KeyboardInterrupt:
            print("interrupted (Ctrl-C)", file=sys.stderr)
            raise SystemExit(130) from None
    return guarded
