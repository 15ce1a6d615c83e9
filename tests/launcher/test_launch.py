"""The launcher (lib/launcher/launch.py, tools/launch.py) without a job: hostfile, --env, the nodes it
plans, the remote command line, the command line's checks.

The launcher running real jobs (local and over a stand-in ssh) is tested in test_distributed.py.
"""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from lib.bootstrap import ROOT
from lib.launcher.launch import LaunchError, Host, parse_env, parse_hostfile, plan_nodes, remote_command

LAUNCH = os.path.join(ROOT, "tools", "launch.py")


def test_hostfile_lines_comments_and_addresses(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1\n\n  ubuntu@node2   10.0.0.2  # second\n")
    assert parse_hostfile(str(path)) == [Host("node1"), Host("ubuntu@node2", "10.0.0.2")]


@pytest.mark.parametrize("text, message", [
    ("node1\nnode2 10.0.0.2 extra\n", r"hosts:2: expected 'SSH_DESTINATION \[NODE_ADDRESS\]'"),
    ("# nothing\n\n", "lists no host"),
])
def test_bad_hostfiles_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(LaunchError, match=message):
        parse_hostfile(str(path))


def test_missing_hostfile():
    with pytest.raises(LaunchError, match="cannot read hostfile /nonexistent/hosts"):
        parse_hostfile("/nonexistent/hosts")


def test_env_items_take_values_from_the_launcher_or_the_item():
    assert parse_env(["A", "B=x=y", "C="], {"A": "1"}) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(LaunchError, match="--env D: not set"):
        parse_env(["D"], {})
    with pytest.raises(LaunchError, match="expected NAME or NAME=VALUE"):
        parse_env(["=1"], {})


def test_local_plan_is_all_loopback():
    nodes = plan_nodes(["train", "--x"], num_workers=2, num_servers=1, port=9000, python="py")
    assert [(n.role, n.index) for n in nodes] == [("scheduler", 0), ("server", 0), ("worker", 0), ("worker", 1)]
    for node in nodes:
        assert node.host is None
        assert node.env["DMLC_ROLE"] == node.role
        assert node.env["DMLC_PS_ROOT_URI"] == node.env["DMLC_NODE_HOST"] == "127.0.0.1"
        assert (node.env["DMLC_PS_ROOT_PORT"], node.env["DMLC_NUM_SERVER"], node.env["DMLC_NUM_WORKER"]) == \
            ("9000", "1", "2")
        assert "DMLC_INTERFACE" not in node.env
    assert nodes[0].argv == nodes[1].argv and nodes[0].argv[:2] == ["py", "-c"]
    assert nodes[0].argv[2].endswith("; from lib.launcher.heartbeat import start_heartbeat; start_heartbeat(); "
                                     "import mxnet")
    assert nodes[2].argv == ["train", "--x"]
    # the default 300 s heartbeat timeout: a beat every 30 s; none asked for without a timeout
    assert all(node.env["SNIPER_HEARTBEAT_SECONDS"] == "30" for node in nodes)
    assert not any("SNIPER_HEARTBEAT_SECONDS" in node.env for node in plan_nodes(
        ["train"], num_workers=1, num_servers=1, port=9000, python="py", heartbeat_timeout=0))


def test_ssh_plan_goes_round_robin_and_uses_host_addresses():
    hosts = [Host("a", "10.0.0.1"), Host("b")]
    nodes = plan_nodes(["train"], num_workers=3, num_servers=2, port=9000, python="py", hosts=hosts,
                       scheduler_address="10.0.0.9", interface="eth1", extra_env={"X": "1"})
    placed = [(n.role, n.index, n.host.destination if n.host else None) for n in nodes]
    assert placed == [("scheduler", 0, None), ("server", 0, "a"), ("server", 1, "b"),
                      ("worker", 0, "a"), ("worker", 1, "b"), ("worker", 2, "a")]
    hosts_of = {(n.role, n.index): n.env.get("DMLC_NODE_HOST") for n in nodes}
    assert hosts_of == {("scheduler", 0): "10.0.0.9", ("server", 0): "10.0.0.1", ("server", 1): None,
                        ("worker", 0): "10.0.0.1", ("worker", 1): None, ("worker", 2): "10.0.0.1"}
    assert all(n.env["DMLC_INTERFACE"] == "eth1" and n.env["X"] == "1" for n in nodes)
    assert all(n.env["DMLC_PS_ROOT_URI"] == "10.0.0.9" for n in nodes)


def run_like_sshd(line, **kwargs):
    """What sshd does with a command line: a login shell runs it in a new session, stdin a pipe."""
    return subprocess.Popen(["sh", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def test_remote_command_runs_in_the_workdir_with_the_env_and_keeps_the_exit_code(tmp_path):
    line = remote_command(str(tmp_path), {"GREETING": "it's a \"test\" $HOME"},
                          ["sh", "-c", 'pwd; printf "%s\\n" "$GREETING"; exit 7'])
    process = run_like_sshd(line)
    try:
        output = process.stdout.read()
        assert process.wait(30) == 7
    finally:
        process.stdin.close()  # the connection closes: the watcher ends too
        os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    assert output.splitlines() == [str(tmp_path), "it's a \"test\" $HOME"]


def test_remote_command_ends_when_the_connection_closes(tmp_path):
    process = run_like_sshd(remote_command(str(tmp_path), {}, ["sh", "-c", "echo started; sleep 60"]))
    try:
        assert process.stdout.readline() == "started\n"
        group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == process.pid]
        assert len(group) >= 3  # the shell, the command (sh and its sleep), the watcher
        process.stdin.close()
        gone, alive = psutil.wait_procs(group, timeout=10)
        assert not alive
        process.wait(5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.parametrize("argv, message", [
    (["-n", "2"], "no training command given"),
    (["-n", "0", "cmd"], "-n and -s must be at least 1"),
    (["-n", "1", "--launcher", "ssh", "cmd"], "--launcher ssh needs -H HOSTFILE and --scheduler-address"),
    (["-n", "1", "-H", "hosts", "cmd"], "-H is for --launcher ssh"),
])
def test_bad_arguments_stop_the_launcher_before_anything_starts(argv, message):
    result = subprocess.run([sys.executable, LAUNCH, *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and message in result.stderr and "scheduler at" not in result.stderr


def test_a_bad_hostfile_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, LAUNCH, "--launcher", "ssh", "-H", str(tmp_path / "none"),
                             "--scheduler-address", "127.0.0.1", "-n", "1", "cmd"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1
    assert result.stderr == f"launch.py: cannot read hostfile {tmp_path / 'none'}: No such file or directory\n"


def test_servers_default_to_the_worker_count_and_a_start_failure_is_reported():
    result = subprocess.run([sys.executable, LAUNCH, "-n", "3", "--python", "/nonexistent/python", "--", "true"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "3 servers, 3 workers" in result.stderr
    assert "cannot start scheduler 0 (/nonexistent/python): No such file or directory" in result.stderr
