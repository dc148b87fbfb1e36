"""A local run's environment and folders, and how another shell sees it.

The nodes' Python is a stand-in shell script: these test hpcjob's side in seconds, without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .conftest import empty_script, run_local, stand_in_python


def test_passwords_do_not_reach_the_tasks(tmp_path: Path) -> None:
    python = stand_in_python(tmp_path, "env")  # prints the task's environment
    config = tmp_path / "clusters.toml"
    config.write_text('[clusters.prod]\nurl = "https://head"\nuser = "alice"\npassword = "env:PROD_PW"\n')
    env = {
        **os.environ,
        "HPCJOB_CONFIG": str(config),
        "PROD_PW": "rest-secret-1",
        "HPCJOB_SMB_PASSWORD": "smb-secret-2",
        "HPCJOB_EMULATOR_PASSWORD": "emu-secret-3",
        "HPCJOB_PASSWORD": "documented-secret-4",  # the config's own example, named by no profile here
        "HPCJOB_ADMIN_PASSWORD": "admin-secret-5",
        "HPCJOB_CREDENTIAL_PASSWORD": "caller-secret-6",
        "HPCJOB_AUTH_KEY": "key-secret-7",
        "KEEP_ME": "visible",
    }
    share = tmp_path / "share"
    where = ["--mount-point", str(share), "--python", str(python)]
    result = run_local("--quiet", "--run-id", "env-1", *where, str(empty_script(tmp_path)), env=env)
    assert result.returncode == 0, result.stderr
    seen = (share / "hpcjob" / "train" / "logs" / "env-1" / "LOCAL1.out").read_text()
    assert "KEEP_ME=visible" in seen and "CCP_NODES=1 LOCAL1 " in seen
    for name, value in env.items():
        if "secret" in value:
            assert value not in seen, name


def test_each_project_has_its_own_local_share(tmp_path: Path) -> None:
    """Two checkouts with the same script name never share a job folder (nor its checkpoints)."""
    python = stand_in_python(tmp_path, "true")

    def job_dir(project: str) -> str:
        script = empty_script(tmp_path, f"{project}/training/run_ddp.py")
        result = run_local("--json", "--python", str(python), str(script))
        assert result.returncode == 0, result.stderr
        return str(json.loads(result.stdout)["job_dir"])

    first, again, other = job_dir("clone-a"), job_dir("clone-a"), job_dir("clone-b")
    assert first == again  # the same checkout resumes from its own checkpoint
    assert first != other
    assert Path(first).name == Path(other).name == "run_ddp"
    assert Path(first).is_relative_to(Path(os.environ["XDG_DATA_HOME"]) / "hpcjob" / "local-share")


def test_status_and_cancel_of_a_local_run_from_another_shell(tmp_path: Path) -> None:
    python = stand_in_python(tmp_path, "exec sleep 60")  # runs until it is stopped
    command = [sys.executable, "-m", "hpcjob.cli"]
    job = ["-n", "2", "--run-id", "other-1", "--python", str(python), str(empty_script(tmp_path))]
    run = subprocess.Popen(
        [*command, "run", "--local", *job],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def hpcjob(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)

    deadline = time.monotonic() + 30
    while (shown := hpcjob("status", "other-1", "--json")).returncode != 0 or '"Running"' not in shown.stdout:
        assert time.monotonic() < deadline and run.poll() is None, (shown.stderr, run.communicate())
        time.sleep(0.2)
    assert [(t["node"], t["state"], t["exit_code"]) for t in json.loads(shown.stdout)["tasks"]] == [
        ("LOCAL1", "Running", None),
        ("LOCAL2", "Running", None),
    ]
    text = hpcjob("status", "other-1").stdout.splitlines()
    assert text[0] == "job other-1 (train) Running"
    assert [line.split() for line in text[1:]] == [
        ["TASK", "NODE", "STATE", "EXIT", "CODE", "ERROR"],
        ["1", "LOCAL1", "Running", "-"],
        ["2", "LOCAL2", "Running", "-"],
    ]
    # A running job's newest line of metrics over time (here written by hand: the script is a stand-in).
    record = json.loads(hpcjob("runs", "show", "other-1", "--json").stdout)
    metrics = Path(record["local_root"]) / record["job_folder"] / "logs" / "other-1" / "metrics"
    metrics.mkdir()
    step = {
        "t": time.time(),
        "event": "step",
        "node": "LOCAL2",
        "rank": 1,
        "epoch": 3,
        "step": 40,
        "loss": 0.5,
    }
    (metrics / "LOCAL2-0.jsonl").write_text(json.dumps(step) + "\n")
    assert json.loads(hpcjob("status", "other-1", "--json").stdout)["latest"] == step
    assert (
        hpcjob("status", "other-1")
        .stdout.splitlines()[-1]
        .startswith("latest: epoch 3 step 40: loss 0.5 (LOCAL2 rank 1, ")
    )
    assert hpcjob("logs", "other-1").stderr.startswith("latest: epoch 3 step 40: loss 0.5 (LOCAL2 rank 1, ")
    canceled = hpcjob("cancel", "other-1")
    assert (canceled.returncode, canceled.stdout) == (0, "run other-1 canceled\n"), canceled.stderr
    run.communicate(timeout=30)
    assert run.returncode == 130
    ended = json.loads(hpcjob("status", "other-1", "--json").stdout)
    assert ended["state"] == "Canceled" and ended["exit_code"] == 130
    assert hpcjob("cancel", "other-1").stdout == "run other-1 had already ended (Canceled)\n"
