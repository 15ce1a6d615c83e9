"""The program's word for "the user's mistake, not the program's": one line on the console, exit 1.

A ``UserError`` is raised where a config key, a data or model file, or the machine cannot serve the run,
with a message that says what is wrong, where (file, key, id) and what to do. The entry points catch
it at the top (``lib.logger.logged_outcome`` once logging is set up, ``report_user_errors`` around the
whole program before that): the console gets the one line, the log file (when there is one) also the
traceback. Any other exception is a defect of the program and keeps its traceback on the console.
The subclasses also derive from the built-in type their raise sites used before (``ValueError``,
``OSError``), so existing ``except ValueError`` handlers keep working.
"""


class UserError(Exception):
    """A mistake of the user's or of the environment: reported in one line, no traceback on the console."""


class ConfigError(UserError, ValueError):
    """A configuration key or value that does not fit the defaults (raised at load, naming the key)."""


class DataError(UserError, ValueError):
    """An annotation, proposal or image set that cannot be used as it is (the message names the file and id)."""


class DataFileError(UserError, OSError):
    """A data file that cannot be read at all (missing permission, not a file, truncated)."""


class MachineError(UserError, RuntimeError):
    """The machine cannot serve the run as configured (no GPU, a data loader worker killed or stalled)."""


class Interrupted(UserError):
    """Ctrl-C, re-raised where the program knows how far it got and how to continue."""

    exit_code = 130  # the shell's code for a process ended by SIGINT


# What the OS itself raises for a path the user gave that is not there or already there: one line too.
USER_ERRORS = (UserError, FileNotFoundError, FileExistsError)


def one_line(err):
    """The console line of a user error: ``error: MESSAGE`` (Ctrl-C: its message alone)."""
    return str(err) if isinstance(err, Interrupted) else f"error: {err}"


def reason(err):
    """The line of an exception's message that says what went wrong: MXNet's messages start with its C++
    "Traceback (most recent call last):" and end with the reason."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback"):
        lines = lines[-1:]
    return lines[0] if lines else type(err).__name__


def exit_code(err):
    return getattr(err, "exit_code", 1)
