"""Launch a distributed training job on MXNet's parameter server (ps-lite): scheduler, servers, workers.

    # 2 workers and 1 server on this machine (loopback only):
    python tools/launch.py -n 2 -s 1 -- \\
        .venv/bin/python main_train.py --cfg CFG --set default.kvstore dist_sync
    # 4 workers and 4 servers over the hosts of a hostfile, scheduler on this machine:
    python tools/launch.py --launcher ssh -H hosts.txt --scheduler-address 10.0.0.1 -n 4 -- \\
        .venv/bin/python main_train.py --cfg CFG --set default.kvstore dist_sync

Every worker runs the command with the DMLC_* variables set; each process's output is prefixed with
its name. When any process fails, all are stopped and the launcher exits with its code; so are they
when a process falls silent (no heartbeat for --heartbeat-timeout seconds: stopped, hung, cut off),
naming it; Ctrl-C, SIGTERM or SIGHUP stop them all. A hostfile has one ``SSH_DESTINATION [NODE_ADDRESS]`` per line.
Remote processes run in ``--workdir`` (default: this directory). See docs/distributed.md and
lib/launcher/launch.py.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import os
import sys

from lib.launcher.launch import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_STALL_WARN, LaunchError, launch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num-workers", type=int, required=True, help="number of workers")
    parser.add_argument("-s", "--num-servers", type=int, help="number of servers (default: as many as workers)")
    parser.add_argument("--launcher", choices=("local", "ssh"), default="local",
                        help="local: every process on this machine over 127.0.0.1; ssh: over the hostfile's hosts")
    parser.add_argument("-H", "--hostfile", help="ssh: one 'SSH_DESTINATION [NODE_ADDRESS]' per line")
    parser.add_argument("--scheduler-address", help="ssh: this machine's address as the hosts reach it "
                                                    "(the scheduler listens there)")
    parser.add_argument("--port", type=int, default=0, help="the scheduler's port (default: a free one)")
    parser.add_argument("--interface", default="", help="ssh: network interface for ps-lite (DMLC_INTERFACE) on "
                                                        "hosts without a NODE_ADDRESS")
    parser.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="pass an environment variable to every process (repeatable)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the scheduler and servers "
                                                                 "(default: this one; same path on every host)")
    parser.add_argument("--ssh", default="ssh -o BatchMode=yes", help="ssh command and options")
    parser.add_argument("--workdir", default=os.getcwd(), help="ssh: directory the remote processes run in")
    parser.add_argument("--heartbeat-timeout", type=float, default=DEFAULT_HEARTBEAT_TIMEOUT, metavar="SECONDS",
                        help="stop the job when a process that sent heartbeats is silent this long (stopped, hung "
                             f"or cut off; default {DEFAULT_HEARTBEAT_TIMEOUT:g}; 0: never)")
    parser.add_argument("--stall-warn", type=float, default=DEFAULT_STALL_WARN, metavar="SECONDS",
                        help="warn once about a process silent this long, at most a fifth of --heartbeat-timeout "
                             f"(default {DEFAULT_STALL_WARN:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command run by every worker")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no training command given")
    if args.num_servers is None:
        args.num_servers = args.num_workers
    if args.num_workers < 1 or args.num_servers < 1:
        parser.error("-n and -s must be at least 1")
    if args.launcher == "ssh" and not (args.hostfile and args.scheduler_address):
        parser.error("--launcher ssh needs -H HOSTFILE and --scheduler-address")
    if args.launcher == "local" and args.hostfile:
        parser.error("-H is for --launcher ssh")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        code = launch(args.command, args.num_workers, args.num_servers, args.hostfile, args.scheduler_address,
                      args.port, args.interface, args.env, args.python, args.ssh, args.workdir,
                      args.heartbeat_timeout, args.stall_warn)
    except LaunchError as err:
        sys.exit(f"launch.py: {err}")
    sys.exit(code)


if __name__ == "__main__":
    main()
