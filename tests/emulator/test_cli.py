"""``python -m hpcjob.emulator``: URL and CA file on stdout, password from the environment, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

PASSWORD = "cli-Pw-1"
LOSS_OPTIONS = ("--detection-delay", "0.5", "--job-retry-count", "1")


def test_command_line_head_node(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(
        json.dumps(
            [
                {"Name": "LOCALHOST", "Cores": 2, "Groups": ["ComputeNodes", "GPUNodes"]},
                {"Name": "NODE2", "State": "Offline"},
            ]
        )
    )
    env = dict(os.environ, HPCJOB_EMULATOR_PASSWORD=PASSWORD)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcjob.emulator",
            "--port",
            "0",
            "--nodes-file",
            str(nodes),
            "--user",
            "alice",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        ca_file = process.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:") and url.endswith("/hpc")
        assert Path(ca_file).read_text().startswith("-----BEGIN CERTIFICATE-----")
        session = requests.Session()
        session.trust_env = False
        nodes_answer = session.get(
            url + "/cluster/nodes", auth=("alice", PASSWORD), verify=ca_file, timeout=5
        )
        assert [(n["Name"], n["State"], n["Cores"]) for n in nodes_answer.json()] == [
            ("LOCALHOST", "Online", 2),
            ("NODE2", "Offline", 4),
        ]
        job = session.post(
            url + "/jobs/jobFile",
            json='<Job><Tasks><Task CommandLine="sleep 600"/></Tasks></Job>',
            auth=("alice", PASSWORD),
            verify=ca_file,
            timeout=5,
        ).json()
        session.post(f"{url}/jobs/{job}/submit", auth=("alice", PASSWORD), verify=ca_file, timeout=5)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert not Path(ca_file).exists()
        _, err = process.communicate()
        assert PASSWORD not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    leftovers = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True, check=False)
    own = [pid for pid in leftovers.stdout.split() if _environ_has(pid, "HPCJOB_TASK_MARKER=")]
    assert own == []


def _environ_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_the_password_must_come_from_the_environment() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HPCJOB_EMULATOR_PASSWORD"}
    result = subprocess.run(
        [sys.executable, "-m", "hpcjob.emulator", "--user", "alice"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "HPCJOB_EMULATOR_PASSWORD" in result.stderr
    assert result.stdout == ""


def test_no_task_outlives_an_emulator_killed_with_sigkill() -> None:
    env = dict(os.environ, HPCJOB_EMULATOR_PASSWORD=PASSWORD)
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcjob.emulator", "--user", "alice"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        ca_file = process.stdout.readline().strip()
        session = requests.Session()
        session.trust_env = False
        job = session.post(
            url + "/jobs/jobFile",
            json='<Job><Tasks><Task CommandLine="sleep 613"/></Tasks></Job>',
            auth=("alice", PASSWORD),
            verify=ca_file,
            timeout=5,
        ).json()
        session.post(f"{url}/jobs/{job}/submit", auth=("alice", PASSWORD), verify=ca_file, timeout=5)
        deadline = time.monotonic() + 15
        while not _sleepers("613") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sleepers("613"), "the task never started"
    finally:
        process.kill()  # as the OOM killer does: no handler of the emulator runs
        process.wait()
    deadline = time.monotonic() + 10
    while _sleepers("613") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleepers("613") == []


def _sleepers(seconds: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"^sleep {seconds}$"], capture_output=True, text=True, check=False)
    return [pid for pid in found.stdout.split() if _environ_has(pid, "HPCJOB_TASK_MARKER=")]


def test_nodes_are_lost_and_restored_from_stdin() -> None:
    """--stdin-commands: `lose NODE`, `restore NODE`, one answer line each; the head node notices the
    loss after --detection-delay."""
    env = dict(os.environ, HPCJOB_EMULATOR_PASSWORD=PASSWORD)
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcjob.emulator", "--user", "alice", "--stdin-commands", *LOSS_OPTIONS],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        url = process.stdout.readline().strip()
        ca_file = process.stdout.readline().strip()
        for _ in range(3):  # the comment and the two profile lines
            process.stdout.readline()
        session = requests.Session()
        session.trust_env = False

        def health() -> str:
            node = session.get(f"{url}/cluster/nodes/NODE002", auth=("alice", PASSWORD), verify=ca_file)
            return str(node.json()["Health"])

        def say(line: str) -> str:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(line + "\n")
            process.stdin.flush()
            return process.stdout.readline().strip()

        assert say("lose NODE002") == "ok: NODE002 evicted"
        deadline = time.monotonic() + 10
        while health() != "Error":
            assert time.monotonic() < deadline, "the loss was never noticed"
            time.sleep(0.1)
        assert say("lose NODE002 unreachable") == "error: the node NODE002 is already lost (evicted)"
        assert say("restore NODE002") == "ok: NODE002 restored"
        assert health() == "OK"
        assert say("lose NODE009") == "error: The node NODE009 was not found."
        assert say("steal NODE002").startswith("error: not a command: 'steal NODE002'")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_negative_detection_delay_is_refused() -> None:
    env = dict(os.environ, HPCJOB_EMULATOR_PASSWORD=PASSWORD)
    result = subprocess.run(
        [sys.executable, "-m", "hpcjob.emulator", "--user", "alice", "--detection-delay", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("hpcjob: error: argument --detection-delay: '-1' is not a number")
    assert result.stderr.count("\n") == 1


def test_the_unknown_group_node_switch_reaches_the_head_node() -> None:
    """--unknown-group-node error: a node the cluster does not know refuses the group request (REST 404);
    a value that is not skip or error is one line, exit 2."""
    env = dict(os.environ, HPCJOB_EMULATOR_PASSWORD=PASSWORD)
    command = [sys.executable, "-m", "hpcjob.emulator", "--user", "alice", "--unknown-group-node"]
    refused = subprocess.run(
        [*command, "ignore"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--unknown-group-node" in refused.stderr and "'ignore'" in refused.stderr
    process = subprocess.Popen(
        [*command, "error"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        ca_file = process.stdout.readline().strip()
        session = requests.Session()
        session.trust_env = False
        session.auth = ("alice", PASSWORD)
        session.verify = ca_file
        assert session.post(f"{url}/cluster/nodeGroups", json={"Name": "Data"}).status_code == 200
        answer = session.patch(
            f"{url}/cluster/nodeGroups/Data/nodes",
            json={"Operation": "add", "NodeNames": ["NODE002", "NOPE"]},
        )
        assert (answer.status_code, answer.text) == (404, "The node NOPE was not found.")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
