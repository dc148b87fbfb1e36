"""Elastic jobs (--min-nodes): a 3-node `run --local` loses one node's processes mid-epoch and goes on
with the other two from the last checkpoint; the same loss (in epoch 1: sooner) fails a job that needs all
three, naming the node. Real torchrun agents re-form the c10d rendezvous; the training program writes its
timeline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcjob.backends.local.procs import MARKER_VAR, marked_processes

from .conftest import REPO

pytestmark = pytest.mark.slow
TRAIN = REPO / "training" / "run_ddp.py"
# About 1.5 s an epoch on three nodes here: time to kill a node inside epoch 2.
SLOW_EPOCHS = ["--epochs", "3", "--train-samples", "1200", "--batch-size", "40", "--step-sleep", "0.05"]


def start(share: Path, run_id: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--json", "--quiet", "-n", "3",
         "--mount-point", str(share), "--run-id", run_id, "--rdzv-last-call", "2", "--rdzv-keep-alive", "1",
         *options,
         str(TRAIN), *SLOW_EPOCHS, "--metrics-every", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def kill_node_when_training(share: Path, run_id: str, node: int, epoch: int) -> None:
    """SIGKILL every process of local node `node` once its rank is inside `epoch` (its timeline says so)
    and, past epoch 1, the save of the epoch before is complete (it is written in the background)."""
    job = share / "hpcjob" / "run_ddp"
    timeline = job / "logs" / run_id / "metrics" / f"LOCAL{node}-0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in timeline.open()] if timeline.is_file() else []
        steps = [line for line in lines if line["event"] == "step"]
        saved = epoch == 1 or any((job / "checkpoints" / run_id).glob("step-*/.hpcjob-complete"))
        if saved and steps and steps[-1].get("epoch") == epoch:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"LOCAL{node} never reached epoch {epoch} with a complete save before it")
    for pid, _ in marked_processes(f"{MARKER_VAR}={run_id}/{node}\0".encode()):
        os.kill(pid, signal.SIGKILL)


def test_a_lost_node_and_the_job_goes_on_from_the_last_checkpoint(tmp_path: Path) -> None:
    run_id = "elastic-1"
    job = start(tmp_path, run_id, "--min-nodes", "2", "--max-restarts", "2", "--tag", "kind=elastic")
    kill_node_when_training(tmp_path, run_id, 3, epoch=2)
    out, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Finished"
    assert [(n["node"], n["exit_code"]) for n in summary["nodes"]] == [
        ("LOCAL1", 0),
        ("LOCAL2", 0),
        ("LOCAL3", 137),
    ]
    [event] = summary["events"]
    assert re.fullmatch(
        r"LOCAL3 lost at epoch 2, step \d+ \(exit code 137\); "
        r"continued on 2 node\(s\) from the step-\d+ save \(epoch 1\)",
        event,
    ), event
    metrics = summary["metrics"]
    # At most one epoch of work lost: the restart resumed from epoch 1's checkpoint, on 2 nodes.
    assert (
        metrics["epochs_completed"] == 3 and metrics["resumed_from_epoch"] == 1 and metrics["world_size"] == 2
    )
    assert "going on with 2 node(s) (elastic job: at least 2)" in err
    shown = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", run_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and event in shown.stdout, shown.stderr


def test_the_same_loss_fails_a_job_that_needs_every_node_and_names_it(tmp_path: Path) -> None:
    run_id = "rigid-1"
    job = start(tmp_path, run_id, "--min-nodes", "3", "--max-restarts", "2")
    kill_node_when_training(tmp_path, run_id, 3, epoch=1)
    out, err = job.communicate(timeout=240)
    summary = json.loads(out)
    assert job.returncode != 0 and summary["state"] == "Failed", err[-3000:]
    assert summary["root_cause"]["node"] == "LOCAL3" and summary["events"] == []
