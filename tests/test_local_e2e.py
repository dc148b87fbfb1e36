"""`hpcjob run --local` end to end: real torchrun processes, real rendezvous on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow
TRAIN = REPO / "training" / "run_ddp.py"
SMALL = ["--train-samples", "512", "--test-samples", "256", "--batch-size", "32"]


def hpcjob_run(share: Path, run_id: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hpcjob.cli",
        "run",
        "--local",
        "--json",
        "--mount-point",
        str(share),
        "--run-id",
        run_id,
        *args,
    ]


def leftover_processes(run_id: str) -> list[int]:
    """Processes whose command line or environment carries the run id: any task, torchrun or worker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if not zombie and (run_id.encode() in cmdline or run_id.encode() in environ):
            found.append(int(entry))
    return found


def test_two_nodes_train_and_report(tmp_path: Path) -> None:
    run_id = "e2e-ok-1"
    result = subprocess.run(
        hpcjob_run(
            tmp_path, run_id, "-n", "2", "--tag", "exp=base line", str(TRAIN), "--epochs", "2", *SMALL
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["state"] == "Finished" and summary["exit_code"] == 0
    assert [(n["node"], n["state"], n["exit_code"]) for n in summary["nodes"]] == [
        ("LOCAL1", "Finished", 0),
        ("LOCAL2", "Finished", 0),
    ]
    metrics = summary["metrics"]
    assert metrics["world_size"] == 2 and metrics["epochs_completed"] == 2
    assert metrics["accuracy"] > 0.2  # ten classes: better than chance
    job_dir = tmp_path / "hpcjob" / "run_ddp"
    assert summary["job_dir"] == str(job_dir)
    assert list((job_dir / "checkpoints" / run_id).glob("step-*/.hpcjob-complete"))  # the run's own folder
    outputs = [(job_dir / "logs" / run_id / f"LOCAL{i}.out").read_text() for i in (1, 2)]
    assert sum(out.count("HPCJOB_METRICS") for out in outputs) == 1  # rank 0's, on either node
    assert "] epoch 2/2" in result.stderr  # live progress, prefixed by node
    assert "is deprecated" not in result.stderr  # the flight recorder's size under the name torch reads
    assert "HPCJOB_METRICS" not in result.stderr  # the summary shows them once, the log keeps the line
    assert "LOCAL1 hosts the rendezvous, at 127.0.0.1 (lo)" in result.stderr
    assert leftover_processes(run_id) == []
    logs = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "logs", run_id, "--follow"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert logs.returncode == 0  # the run has ended: --follow returns at once with its exit code
    assert "] epoch 2/2" in logs.stdout and "[LOCAL1 err]" in logs.stdout and "[LOCAL2 err]" in logs.stdout
    # The run's history: found by its tag, with its end and metrics; `runs show` gives it whole.
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcjob.cli",
            "runs",
            "--json",
            "--tag",
            "exp=base line",
            "--state",
            "finished",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert (entry["run_id"], entry["job_state"], entry["exit_code"]) == (run_id, "Finished", 0)
    assert entry["samples_per_sec"] == metrics["samples_per_sec"] > 0 and entry["tags"] == {
        "exp": "base line"
    }
    assert entry["node_hours"] == pytest.approx(2 * summary["wall_time_s"] / 3600)
    assert "--tag 'exp=base line'" in entry["command"] and entry["plan"]["run_id"] == run_id
    shown = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", run_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"run {run_id} (run_ddp) on local" in shown.stdout
    assert f"checkpoints: {tmp_path}/hpcjob/run_ddp/checkpoints/{run_id}\n" in shown.stdout
    assert "LOCAL2" in shown.stdout and "accuracy" in shown.stdout
    # Its metrics over time, drawn from the timeline the training program wrote: no GPU, no GPU panels.
    picture = tmp_path / "run.png"
    plotted = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "plot", run_id, "-o", str(picture)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plotted.returncode == 0, plotted.stderr
    assert plotted.stdout == f"{picture}: training loss, samples/s, data wait (% of step time)\n"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FAILING = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    sys.exit(3)
dist.all_reduce(t)  # rank 0 waits here for a peer that is gone
time.sleep(600)
"""


def test_a_failing_rank_fails_the_job_with_its_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "code" / "fail.py"
    script.parent.mkdir()
    script.write_text(FAILING)
    run_id = "e2e-fail-1"
    start = time.monotonic()
    result = subprocess.run(
        hpcjob_run(tmp_path / "share", run_id, "-n", "2", "--grace-period", "5", str(script)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["state"] == "Failed" and summary["exit_code"] == 3
    assert summary["root_cause"]["rank"] == 1 and summary["root_cause"]["exit_code"] == 3
    assert {n["state"] for n in summary["nodes"]} <= {"Failed", "Canceled"}
    assert elapsed < 60  # the surviving node was stopped, not left waiting for its peer
    assert leftover_processes(run_id) == []


def test_ctrl_c_cancels_and_a_new_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    run_id = "e2e-cancel-1"
    args = ["-n", "2", str(TRAIN), *SMALL, "--step-sleep", "0.05"]
    process = subprocess.Popen(
        hpcjob_run(tmp_path, run_id, *args, "--epochs", "50"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = tmp_path / "hpcjob" / "run_ddp" / "checkpoints" / run_id
    deadline = time.monotonic() + 180
    while not list(folder.glob("step-*/.hpcjob-complete")) and process.poll() is None:
        assert time.monotonic() < deadline, "no complete save within 180 s"
        time.sleep(0.2)
    assert list(folder.glob("step-*/.hpcjob-complete")), process.communicate(timeout=30)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Canceled"
    assert {n["state"] for n in summary["nodes"]} == {"Canceled"}
    assert leftover_processes(run_id) == []

    resumed = subprocess.run(  # asked to: a new run starts fresh unless --resume-from names one
        hpcjob_run(tmp_path, "e2e-resume-1", "--resume-from", run_id, *args, "--epochs", "3"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert json.loads(resumed.stdout)["metrics"]["epochs_completed"] == 3
