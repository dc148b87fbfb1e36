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
