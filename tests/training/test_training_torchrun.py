"""A real two-process torchrun of run_ddp.py on the CPU (gloo), then a resumed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hpctorch.checkpoint import complete_saves

PREFIX = "HPCJOB_METRICS "
SMALL = ["--train-samples", "1024", "--test-samples", "256", "--batch-size", "32"]


def torchrun(training_dir: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    }
    env["OMP_NUM_THREADS"] = "1"  # two workers on two cores; torchrun would set it too, noisily
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        str(training_dir / "run_ddp.py"),
        *SMALL,
        "--pg-timeout",
        "60",
        *flags,
    ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def metrics(output: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(PREFIX) :]) for line in output.splitlines() if line.startswith(PREFIX)]


@pytest.mark.slow
def test_two_process_run_and_resume(training_dir: Path, tmp_path: Path) -> None:
    first = torchrun(training_dir, tmp_path, "--epochs", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert sum(line.startswith("start world_size=2 backend=gloo device=cpu") for line in lines) == 1
    for epoch in (1, 2):  # rank 0 alone prints
        assert sum(line.startswith(f"epoch {epoch}/2 train_loss=") for line in lines) == 1
    (result,) = metrics(first.stdout)
    assert result["world_size"] == 2 and result["epochs_completed"] == 2
    assert result["accuracy"] > 0.5  # chance is 0.1
    assert result["samples_per_sec"] > 0 and 0 <= result["data_wait_fraction"] < 1

    folder = tmp_path / "checkpoints"  # --checkpoint-dir default, relative to cwd
    # hpctorch's saves after each epoch (both kept), each marked complete once every rank's files are in.
    assert [step for step, _ in complete_saves(str(folder))] == [16, 32]
    assert sorted(p.name for p in (folder / "step-000000032").iterdir()) == [
        ".hpcjob-complete", ".metadata", "__0_0.distcp", "__1_0.distcp"
    ]  # fmt: skip

    second = torchrun(training_dir, tmp_path, "--epochs", "3")
    assert second.returncode == 0, second.stdout + second.stderr
    lines = second.stdout.splitlines()
    assert sum(line.startswith("resumed from checkpoints/step-000000032 at epoch 2") for line in lines) == 1
    assert not any(line.startswith(("epoch 1/3", "epoch 2/3")) for line in lines)
    assert sum(line.startswith("epoch 3/3 ") for line in lines) == 1
    (resumed,) = metrics(second.stdout)
    assert resumed["epochs_completed"] == 3 and resumed["resumed_from_epoch"] == 2
    assert resumed["accuracy"] > 0.5
    assert [step for step, _ in complete_saves(str(folder))] == [32, 48]  # the newest two kept
