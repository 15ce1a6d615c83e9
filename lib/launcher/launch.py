"""A distributed training job on MXNet's parameter server (ps-lite): scheduler, servers, workers.

tools/launch.py is its command line; docs/distributed.md the set-up. The scheduler and servers are
``python -c "import mxnet"`` processes (after starting their heartbeat): MXNet turns into a ps-lite scheduler or server on import when
DMLC_ROLE says so. Every worker runs the given command with the DMLC_* variables set. The launcher
prefixes each process's output with its name; when any process fails (or a scheduler/server ends
while workers still run), it stops all of them and exits with that process's code, since the others
would wait for it forever. The same holds for a process that stops without ending (SIGSTOP, a hung
host): every process beats (lib/launcher/heartbeat.py) and one silent for ``heartbeat_timeout``
seconds stops the job, named. Ctrl-C, SIGTERM or SIGHUP stop all of them; a child also gets SIGTERM if
the launcher itself is killed. A hostfile has one host per line: ``SSH_DESTINATION [NODE_ADDRESS]``
(the address the other nodes reach that host at; without it ps-lite picks the host's first network
interface, or the one named by ``interface``). Remote processes run in ``workdir`` and end when their
ssh connection closes.

Standard library only: the launcher needs no MXNet of its own.
"""
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from lib.launcher import heartbeat

LOOPBACK = "127.0.0.1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_HEARTBEAT_TIMEOUT = 300.0
# A process silent this long (at most a fifth of the timeout) is warned about once, long before the job stops.
DEFAULT_STALL_WARN = 60.0
_POLL_SECONDS = 0.2
_STOP_GRACE_SECONDS = 5.0  # SIGTERM, then SIGKILL
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)

# Runs on a remote host under its login shell's ``sh -c``: $1 is the working directory, the rest the
# command. sshd makes the session its own process group; when the connection closes (the launcher
# stopped the job, or died), stdin ends and the watcher signals the whole group.
_REMOTE_SCRIPT = """cd "$1" || exit 1
shift
exec 3<&0
"$@" </dev/null 3<&- &
child=$!
{ cat >/dev/null; kill -TERM 0; } <&3 >/dev/null 2>&1 &
exec 3<&-
wait "$child"
"""


class LaunchError(ValueError):
    """Bad arguments or hostfile: reported without a traceback."""


class _Signalled(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class Host:
    destination: str  # what ssh connects to: host or user@host
    address: str = ""  # DMLC_NODE_HOST for the nodes on it; "" lets ps-lite choose


@dataclass
class Node:
    role: str  # scheduler, server or worker
    index: int
    argv: list
    env: dict
    host: Host = None  # None: this machine
    process: subprocess.Popen = field(default=None, repr=False)
    heard: float = None  # monotonic time of the last heartbeat or output line, once it has beaten
    beat: tuple = None  # (pid, rank) its last heartbeat gave (rank -1: not known yet)

    @property
    def name(self):
        where = f" on {self.host.destination}" if self.host else ""
        return f"{self.role} {self.index}{where}"

    @property
    def described(self):
        """The name with the pid and rank its heartbeats gave."""
        if not self.beat:
            return self.name
        pid, rank = self.beat
        where = f" on {self.host.destination}" if self.host else ""
        return f"{self.role} {self.index} ({'' if rank < 0 else f'rank {rank}, '}pid {pid}){where}"


def parse_hostfile(path):
    """Hosts of a hostfile: one ``SSH_DESTINATION [NODE_ADDRESS]`` per line, ``#`` comments."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise LaunchError(f"cannot read hostfile {path}: {err.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise LaunchError(f"{path}:{number}: expected 'SSH_DESTINATION [NODE_ADDRESS]', got {line.strip()!r}")
        hosts.append(Host(*fields))
    if not hosts:
        raise LaunchError(f"hostfile {path} lists no host")
    return hosts


def parse_env(items, environ):
    """``--env NAME`` (value taken from this environment) or ``--env NAME=VALUE`` -> dict."""
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name.isidentifier():
            raise LaunchError(f"--env {item!r}: expected NAME or NAME=VALUE")
        if not sep:
            if name not in environ:
                raise LaunchError(f"--env {name}: not set in the launcher's environment")
            value = environ[name]
        env[name] = value
    return env


def free_port(address):
    """A TCP port free on ``address`` now (the scheduler binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def heartbeat_interval(timeout):
    """Seconds between heartbeats for a ``timeout``: ten beats per timeout, at most every 30 s."""
    return min(max(timeout / 10, 0.1), 30.0)


def plan_nodes(command, num_workers, num_servers, port, python, hosts=None, scheduler_address=LOOPBACK,
               interface="", extra_env=None, heartbeat_timeout=DEFAULT_HEARTBEAT_TIMEOUT):
    """The scheduler, servers and workers of a job; ``hosts`` None puts all on this machine (loopback).

    The scheduler runs on this machine; servers and workers go round-robin over ``hosts``. With a
    ``heartbeat_timeout`` (0: none) every process is asked to beat (the scheduler and servers from the
    repository at the launcher's path, which every host has).
    """
    common = {"DMLC_PS_ROOT_URI": scheduler_address, "DMLC_PS_ROOT_PORT": str(port),
              "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers),
              "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    if heartbeat_timeout:
        common[heartbeat.ENV] = f"{heartbeat_interval(heartbeat_timeout):g}"
    if interface:
        common["DMLC_INTERFACE"] = interface

    def node(role, index, argv, host):
        env = dict(common, DMLC_ROLE=role)
        address = LOOPBACK if hosts is None else (host.address if host else scheduler_address)
        if address:
            env["DMLC_NODE_HOST"] = address
        return Node(role, index, list(argv), env, host)

    server_argv = [python, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); from lib.launcher.heartbeat import "
                                 f"start_heartbeat; start_heartbeat(); import mxnet"]
    nodes = [node("scheduler", 0, server_argv, None)]
    nodes += [node("server", i, server_argv, hosts[i % len(hosts)] if hosts else None) for i in range(num_servers)]
    nodes += [node("worker", i, command, hosts[i % len(hosts)] if hosts else None) for i in range(num_workers)]
    return nodes


def remote_command(workdir, env, argv):
    """The command line ssh runs on a host: ``argv`` in ``workdir`` with ``env``, ended with the connection."""
    inner = [workdir, "env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    return shlex.join(["sh", "-c", _REMOTE_SCRIPT, "sh", *inner])


def _child_setup(launcher_pid):
    """In the child before exec: SIGTERM when the launcher dies, even by SIGKILL (Linux)."""
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher_pid:  # the launcher died before prctl
        os._exit(1)


class Job:
    """The running processes of a job, their output, and stopping them all."""

    def __init__(self, nodes, ssh=("ssh",), workdir=None, heartbeat_timeout=0, stall_warn=DEFAULT_STALL_WARN):
        self.nodes = nodes
        self.heartbeat_timeout = heartbeat_timeout
        self.stall_warn = min(stall_warn, heartbeat_timeout / 5)
        self._warned = set()  # nodes warned about in their current silence
        self.ssh = list(ssh)
        self.workdir = workdir or os.getcwd()
        self._lock = threading.RLock()  # a signal may interrupt the main thread while it holds it
        self._pumps = []

    def say(self, message):
        with self._lock:
            print(f"launch.py: {message}", file=sys.stderr, flush=True)

    def start(self):
        """Start every node, then the threads copying their output (none run while forking)."""
        pid = os.getpid()
        for node in self.nodes:
            if node.host is None:
                environ = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
                argv, env, stdin = node.argv, {**environ, **node.env}, subprocess.DEVNULL
            else:
                argv = [*self.ssh, node.host.destination, remote_command(self.workdir, node.env, node.argv)]
                env, stdin = None, subprocess.PIPE  # the open pipe keeps the remote side alive
            try:
                node.process = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                preexec_fn=lambda: _child_setup(pid))
            except OSError as err:
                raise LaunchError(f"cannot start {node.name} ({argv[0]}): {err.strerror}") from None
        for node in self.nodes:
            pump = threading.Thread(target=self._pump, args=(node,), name=f"output of {node.name}", daemon=True)
            pump.start()
            self._pumps.append(pump)

    def _pump(self, node):
        prefix = f"[{node.name}] ".encode()
        out = sys.stdout.buffer
        for line in iter(node.process.stdout.readline, b""):
            beats = list(heartbeat.PATTERN.finditer(line))
            if beats:
                node.beat = tuple(int(value) for value in beats[-1].groups())
                line = heartbeat.PATTERN.sub(b"", line)
            if beats or node.heard is not None:
                node.heard = time.monotonic()
            if beats and not line.strip():
                continue
            with self._lock:
                out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                out.flush()

    def wait(self, server_grace=20.0):
        """Wait for the workers; return the job's exit code (0 when all workers succeeded).

        The scheduler and servers end on their own once the workers have left ps-lite, which the
        workers do just before they exit: one that ends while workers still run after
        ``server_grace`` seconds has left them waiting for nothing.
        """
        workers = [node for node in self.nodes if node.role == "worker"]
        others = [node for node in self.nodes if node.role != "worker"]
        ended = {}  # scheduler/server -> when it ended (with code 0)
        while True:
            self._warn_quiet_nodes()
            silent = self._silent_node()
            if silent is not None:
                node, seconds = silent
                self.say(f"{node.described} sent no heartbeat for {seconds:.0f} s (--heartbeat-timeout "
                         f"{self.heartbeat_timeout:g} s): it is stopped, hung or cut off, and the others would wait "
                         f"for it forever; stopping the job")
                return 1
            for node in self.nodes:
                code = node.process.poll()
                if code is None or (code == 0 and node.role == "worker"):
                    continue
                if code != 0:
                    self.say(f"{node.name} failed ({_describe(code, node.host)}); stopping the job")
                    return code if code > 0 else 128 - code
                running = sum(w.process.poll() is None for w in workers)
                if running and time.monotonic() - ended.setdefault(node.name, time.monotonic()) > server_grace:
                    self.say(f"{node.name} ended but {running} workers still run; stopping the job")
                    return 1
            if all(w.process.poll() == 0 for w in workers):
                break
            time.sleep(_POLL_SECONDS)
        deadline = time.monotonic() + server_grace
        while any(node.process.poll() is None for node in others) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        late = [node.name for node in others if node.process.poll() is None]
        if late:
            self.say(f"all workers finished; {', '.join(late)} still running after {server_grace:.0f} s, stopping them")
        return 0

    def _warn_quiet_nodes(self):
        """One line for each running node that has gone quiet for ``stall_warn`` s, once per silence."""
        if not self.heartbeat_timeout:
            return
        now = time.monotonic()
        for node in self.nodes:
            quiet = node.heard is not None and now - node.heard > self.stall_warn and node.process.poll() is None
            if not quiet:
                self._warned.discard(node.name)
            elif node.name not in self._warned:
                self._warned.add(node.name)
                self.say(f"warning: {node.described} has sent no heartbeat for {now - node.heard:.0f} s (stopped, "
                         f"hung or cut off?); the job stops at --heartbeat-timeout {self.heartbeat_timeout:g} s")

    def _silent_node(self):
        """(node, seconds) of a running node that has beaten and then been silent too long, or None."""
        if not self.heartbeat_timeout:
            return None
        now = time.monotonic()
        for node in self.nodes:
            heard = node.heard
            if heard is not None and now - heard > self.heartbeat_timeout and node.process.poll() is None:
                return node, now - heard
        return None

    def stop(self):
        """Stop every process group the job started (SIGTERM, then SIGKILL) and reap them."""
        for node in self.nodes:
            if node.process is None:
                continue
            if node.process.stdin:
                node.process.stdin.close()  # a remote node's watcher ends it
            _signal_group(node.process, signal.SIGTERM)
            _signal_group(node.process, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                node.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(node.process, signal.SIGKILL)  # also whatever the node left in its group
            node.process.wait()
        for pump in self._pumps:
            pump.join(1.0)


def _signal_group(process, signum):
    try:
        os.killpg(process.pid, signum)  # the child leads its own session and process group
    except (ProcessLookupError, PermissionError):
        pass


def _describe(code, host):
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if host and code == 255:
        return "exit code 255: ssh could not connect, or lost the connection"
    return f"exit code {code}"


def _raise_signalled(signum, _frame):
    raise _Signalled(signum)


def launch(command, num_workers, num_servers, hostfile=None, scheduler_address=None, port=0, interface="",
           env_items=(), python=sys.executable, ssh="ssh -o BatchMode=yes", workdir=None,
           heartbeat_timeout=DEFAULT_HEARTBEAT_TIMEOUT, stall_warn=DEFAULT_STALL_WARN):
    """Run a job until its workers finish; returns its exit code (0 when every worker succeeded).

    Without ``hostfile`` every process runs on this machine over 127.0.0.1; with it, over ssh on the
    hosts it lists, the scheduler on this machine at ``scheduler_address``. ``env_items`` are
    ``NAME`` or ``NAME=VALUE`` items for every process. A process that has sent heartbeats and then none
    for ``heartbeat_timeout`` seconds (0: never) stops the job; one silent for ``stall_warn`` seconds (at most a
    fifth of the timeout) is warned about once. A bad hostfile, item or address raises
    LaunchError before anything starts. Installs its own SIGINT/SIGTERM/SIGHUP handlers: it is the body
    of a program (tools/launch.py).
    """
    hosts = parse_hostfile(hostfile) if hostfile else None
    address = scheduler_address if hosts else LOOPBACK
    try:
        port = port or free_port(address)
    except OSError as err:
        raise LaunchError(f"cannot bind the scheduler address {address}: {err.strerror}") from None
    if not heartbeat_timeout >= 0:
        raise LaunchError(f"--heartbeat-timeout must be a number of seconds >= 0, got {heartbeat_timeout}")
    nodes = plan_nodes(command, num_workers, num_servers, port, python, hosts, address, interface,
                       parse_env(env_items, os.environ), heartbeat_timeout)
    job = Job(nodes, shlex.split(ssh), workdir, heartbeat_timeout, stall_warn)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: it may come in ignored
        signal.signal(signum, _raise_signalled)
    code = 1
    try:
        job.say(f"scheduler at {address}:{port}, {num_servers} servers, {num_workers} workers")
        job.start()
        code = job.wait()
        if code == 0:
            job.say("all workers finished")
    except LaunchError as err:
        job.say(str(err))
    except _Signalled as sig:
        job.say(f"{sig}; stopping the job")
        code = 128 + sig.signum
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # let the clean-up finish
        job.stop()
    return code
