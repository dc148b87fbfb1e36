"""Flags, environment, metrics and whole runs of run_ddp.py in a single process (no torchrun)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hpctorch import METRICS_PREFIX, Checkpoints
from hpctorch.checkpoint import MARKER, complete_saves
from torch.utils.data import DataLoader, Dataset, TensorDataset

import run_ddp
from neural_network import NeuralNetwork
from operations import (
    EpochMetrics,
    Totals,
    epoch_metrics,
    format_epoch_line,
    train_one_epoch,
)

REQUIRED_METRICS = {
    "epochs_completed",
    "train_loss",
    "test_loss",
    "accuracy",
    "samples_per_sec",
    "data_wait_fraction",
    "world_size",
    "wall_time_s",
}
SMALL_RUN = ["--train-samples", "1024", "--test-samples", "64", "--batch-size", "32"]


def metrics_lines(output: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len(METRICS_PREFIX) :])
        for line in output.splitlines()
        if line.startswith(METRICS_PREFIX)
    ]


# --- flags -------------------------------------------------------------------------------------


def test_defaults() -> None:
    args = run_ddp.parse_args([])
    assert (args.data, args.batch_size, args.num_workers, args.epochs, args.lr, args.seed) == (
        "synthetic",
        64,
        None,  # chosen from the node's CPUs for image folders, none for data in memory
        3,
        0.01,
        0,
    )
    assert (args.model, args.image_size, args.decode, args.bf16, args.channels_last, args.prefetch) == (
        "mlp",
        None,
        "cpu",
        False,
        False,
        4,
    )
    assert (args.train_samples, args.test_samples, args.pg_timeout, args.step_sleep) == (
        4096,
        1024,
        300.0,
        0.0,
    )
    assert args.checkpoint_dir == Path("checkpoints") and args.max_steps_per_epoch is None
    assert not (args.download or args.scale_lr or args.no_resume) and args.backend is None


@pytest.mark.parametrize(
    ("argv", "mentions"),
    [
        (["--data", "mnist"], "--data"),
        (["--data", "fashion-mnist"], "--data-root"),
        (["--data", "image-folder"], "--data-root"),
        (["--epochs", "0"], "--epochs"),
        (["--batch-size", "-4"], "--batch-size"),
        (["--train-samples", "ten"], "--train-samples"),
        (["--lr", "0"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--pg-timeout", "-1"], "--pg-timeout"),
        (["--max-steps-per-epoch", "0"], "--max-steps-per-epoch"),
        (["--step-sleep", "-0.5"], "--step-sleep"),
        (["--num-workers", "-1"], "--num-workers"),
        (["--seed", "-1"], "--seed"),
        (["--download"], "--download"),
        (["--backend", "mpi"], "--backend"),
    ],
)
def test_bad_flags_exit_2_with_one_error_line(
    argv: list[str], mentions: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        run_ddp.parse_args(argv)
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("run_ddp.py: error:") and mentions in errors[0]


def test_script_exits_2_on_bad_flags(training_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(training_dir / "run_ddp.py"), "--data", "image-folder"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1] == "run_ddp.py: error: --data image-folder needs --data-root"
    )


def test_nccl_without_cuda_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="nccl"):
        run_ddp.choose_device("auto", "nccl", 0)
    assert run_ddp.choose_device("auto", None, 0) == (torch.device("cpu"), "gloo")


# --- environment -------------------------------------------------------------------------------


def test_dist_env_from_torchrun_variables() -> None:
    assert run_ddp.read_dist_env({}) == run_ddp.DistEnv(0, 1, 0, under_torchrun=False)
    env = run_ddp.read_dist_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert env == run_ddp.DistEnv(3, 4, 1, under_torchrun=True)


@pytest.mark.parametrize(
    "environ",
    [
        {"RANK": "x", "WORLD_SIZE": "2"},
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"RANK": "0"},
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"},
    ],
)
def test_bad_dist_env(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="torchrun environment"):
        run_ddp.read_dist_env(environ)


# --- metrics -----------------------------------------------------------------------------------


def test_epoch_metrics_from_global_sums() -> None:
    # train_loss_sum, train_samples, data_wait_s, loop_s, test_loss_sum, correct, test_samples
    metrics, totals = epoch_metrics(2, [20.0, 10.0, 1.0, 4.0, 6.0, 3.0, 4.0], slowest_loop_s=2.0)
    assert metrics == EpochMetrics(
        2, train_loss=2.0, test_loss=1.5, accuracy=0.75, samples_per_sec=5.0, data_wait_fraction=0.25
    )
    assert totals == Totals(samples=10.0, train_time_s=2.0, data_wait_s=1.0, loop_s=4.0)
    combined = totals.add(Totals(30.0, 2.0, 0.0, 4.0))
    assert combined.samples_per_sec == 10.0 and combined.data_wait_fraction == 0.125


def test_epoch_line_format() -> None:
    line = format_epoch_line(EpochMetrics(2, 0.41234, 0.39991, 0.88123, 5230.14, 0.0321), epochs=3)
    assert (
        line == "epoch 2/3 train_loss=0.4123 test_loss=0.3999 accuracy=88.12% samples/s=5230.1 data_wait=3.2%"
    )


class SlowDataset(Dataset[tuple[torch.Tensor, int]]):
    """Every sample takes ``delay`` seconds to load."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay)
        return torch.zeros(1, 28, 28), index % 10


def test_train_one_epoch_caps_steps_and_measures_data_wait() -> None:
    device = torch.device("cpu")
    model = NeuralNetwork()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    fast = TensorDataset(torch.zeros(64, 1, 28, 28), torch.zeros(64, dtype=torch.int64))

    sleepy = train_one_epoch(
        model, DataLoader(fast, batch_size=4), optimizer, device, max_steps=3, step_sleep=0.05
    )
    assert (sleepy.steps, sleepy.samples) == (3, 12)
    assert sleepy.loop_s >= 0.15 and sleepy.data_wait_s / sleepy.loop_s < 0.5

    # 0.25 s a sample: the data wait outweighs three tiny steps even on a loaded machine (test workers).
    starved = train_one_epoch(model, DataLoader(SlowDataset(6, 0.25), batch_size=2), optimizer, device)
    assert (starved.steps, starved.samples) == (3, 6)
    assert starved.data_wait_s >= 1.4 and starved.data_wait_s / starved.loop_s > 0.5
    assert starved.data_wait_s <= starved.loop_s


# --- whole runs in one process -----------------------------------------------------------------


@pytest.fixture
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def newest_save(folder: Path) -> Path:
    """The newest complete save hpctorch keeps in `folder`."""
    return Path(complete_saves(str(folder))[-1][1])


@pytest.mark.usefixtures("no_torchrun")
def test_single_process_run_then_covered_then_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [*SMALL_RUN, "--checkpoint-dir", str(tmp_path)]
    assert run_ddp.main([*flags, "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("start world_size=1 backend=gloo device=cpu")
    assert out.count("epoch 1/1 ") == 1
    (first,) = metrics_lines(out)
    assert first.keys() >= REQUIRED_METRICS and first["epochs_completed"] == 1 and first["world_size"] == 1
    assert first["accuracy"] > 0.3 and 0 <= first["data_wait_fraction"] <= 1 and first["samples_per_sec"] > 0
    assert out.splitlines()[-1].startswith(METRICS_PREFIX)
    # One save after its epoch, through hpctorch, marked complete, numbered by the run's steps.
    save = newest_save(tmp_path)
    assert save.name == f"step-{1024 // 32:09d}" and (save / MARKER).is_file()
    written = (save / MARKER).stat().st_mtime_ns

    assert (first["epochs_trained"], first["resumed_from_epoch"]) == (1, 0) and first["steps"] == 1024 // 32
    assert "resumed_from" not in first

    assert run_ddp.main([*flags, "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "already covers 1 of 1 epoch(s)" in out and "epoch 1/1" not in out
    (covered,) = metrics_lines(out)
    # It trained nothing, and says so: none of the first run's figures as its own.
    assert covered["epochs_completed"] == 1 and covered["epochs_trained"] == covered["steps"] == 0
    assert covered["resumed_from"] == str(save)
    assert not covered.keys() & {
        "accuracy",
        "train_loss",
        "test_loss",
        "samples_per_sec",
        "data_wait_fraction",
    }
    assert newest_save(tmp_path) == save and (save / MARKER).stat().st_mtime_ns == written

    assert run_ddp.main([*flags, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {save} at epoch 1" in out
    assert "epoch 2/2 " in out and "epoch 1/2" not in out
    (resumed,) = metrics_lines(out)
    assert resumed["epochs_completed"] == 2 and resumed["resumed_from_epoch"] == 1
    assert (
        resumed["epochs_trained"] == 1 and resumed["steps"] == 1024 // 32 and resumed["samples_per_sec"] > 0
    )
    assert newest_save(tmp_path).name == f"step-{2 * 1024 // 32:09d}"  # the run's steps go on

    assert run_ddp.main([*flags, "--epochs", "1", "--no-resume"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" not in out and "epoch 1/1 " in out
    # A fresh start's save is the newest, though an older run's saves hold more steps.
    assert newest_save(tmp_path).name == f"step-{1024 // 32:09d}"


@pytest.mark.usefixtures("no_torchrun")
def test_a_run_saves_in_its_own_folder_and_starts_from_another_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "checkpoints" / "first", tmp_path / "checkpoints" / "second"
    monkeypatch.setenv("HPCJOB_CHECKPOINT_DIR", str(first))  # as hpcjob gives each run its own
    assert run_ddp.main([*SMALL_RUN, "--epochs", "1", "--max-steps-per-epoch", "4"]) == 0
    capsys.readouterr()
    saved = newest_save(first)
    written = (saved / MARKER).stat().st_mtime_ns

    monkeypatch.setenv("HPCJOB_CHECKPOINT_DIR", str(second))  # a new run: fresh, not the first's
    assert run_ddp.main([*SMALL_RUN, "--epochs", "1", "--max-steps-per-epoch", "4"]) == 0
    (fresh,) = metrics_lines(capsys.readouterr().out)
    assert fresh["epochs_trained"] == 1 and fresh["resumed_from_epoch"] == 0
    for save in second.iterdir():
        (save / MARKER).unlink()  # not complete any more: never resumed

    monkeypatch.setenv("HPCJOB_RESUME_FROM", str(first))  # `hpcjob run --resume-from FIRST`
    assert run_ddp.main([*SMALL_RUN, "--epochs", "2", "--max-steps-per-epoch", "4"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {saved} at epoch 1" in out
    (resumed,) = metrics_lines(out)
    assert (resumed["epochs_trained"], resumed["resumed_from"]) == (1, str(saved))
    # Its epoch went to its own folder; the first run's save is only read.
    assert newest_save(second).name == "step-000000008"
    assert [p.name for p in first.iterdir()] == [saved.name]
    assert (saved / MARKER).stat().st_mtime_ns == written

    # Its own save wins over the one it started from (a restart, a later attempt of the run).
    assert run_ddp.main([*SMALL_RUN, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {newest_save(second)} already covers 2 of 2" in out

    # The program's own option still names the folder; asked to resume from nothing, it says so.
    other = tmp_path / "mine"
    argv = [*SMALL_RUN, "--epochs", "1", "--checkpoint-dir", str(other), "--resume-from", str(tmp_path)]
    assert run_ddp.main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"error: rank 0: hpctorch: {tmp_path} holds no complete save (a folder with {MARKER}) to resume from"
    )
    assert run_ddp.main([*argv, "--no-resume", "--max-steps-per-epoch", "2"]) == 0
    assert newest_save(other).name == "step-000000002"


@pytest.mark.usefixtures("no_torchrun")
def test_single_process_runs_on_tiny_real_data(
    tmp_path: Path, tiny_fashion_mnist: Path, tiny_image_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for kind, root, classes in (
        ("fashion-mnist", tiny_fashion_mnist, 10),
        ("image-folder", tiny_image_folder, 3),
    ):
        argv = ["--data", kind, "--data-root", str(root), "--epochs", "1", "--batch-size", "4"]
        assert run_ddp.main([*argv, "--checkpoint-dir", str(tmp_path / kind)]) == 0
        out = capsys.readouterr().out
        assert f"classes={classes}" in out and len(metrics_lines(out)) == 1


@pytest.mark.usefixtures("no_torchrun")
def test_missing_data_fails_with_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run_ddp.main(
            ["--data", "fashion-mnist", "--data-root", str(tmp_path), "--checkpoint-dir", str(tmp_path)]
        )
        == 1
    )
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert (
        line.startswith("error: rank 0: FashionMNIST not found in ")
        and str(tmp_path / "FashionMNIST") in line
    )
    assert METRICS_PREFIX not in captured.out


@pytest.mark.usefixtures("no_torchrun")
def test_a_save_of_another_model_or_program_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    checkpoints = Checkpoints(folder=str(tmp_path / "other-model"))
    checkpoints.close(3, model, optimizer, extra={"epoch": 1, "totals": {}})
    argv = [*SMALL_RUN, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "other-model")]
    assert run_ddp.main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: rank 0: hpctorch: cannot resume from ") and "Missing key" in line

    # The right model, saved by another program: no epoch beside it.
    mine = NeuralNetwork()
    checkpoints = Checkpoints(folder=str(tmp_path / "no-epoch"))
    checkpoints.close(3, mine, torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9))
    argv = [*SMALL_RUN, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "no-epoch")]
    assert run_ddp.main(argv) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    saved = newest_save(tmp_path / "no-epoch")
    assert line == f"error: rank 0: hpctorch: {saved} was not saved by run_ddp.py (no epoch in it)"


@pytest.mark.usefixtures("no_torchrun")
def test_a_cpu_run_splits_the_cpus_and_writes_its_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # whatever the tests' OMP_NUM_THREADS gave: the run must choose its own
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("HPCJOB_PROCESSES_ON_HOST", "4096")  # more processes on this host than CPUs
    monkeypatch.setenv("HPCJOB_NODE", "LOCAL7")
    try:
        flags = [*SMALL_RUN, "--checkpoint-dir", str(tmp_path), "--epochs", "2"]
        assert run_ddp.main([*flags, "--metrics-dir", str(tmp_path / "metrics"), "--metrics-every", "0"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    lines = [json.loads(line) for line in (tmp_path / "metrics" / "LOCAL7-0.jsonl").read_text().splitlines()]
    assert [line["event"] for line in lines[:2]] == ["start", "first_step"]
    steps = [line for line in lines if line["event"] == "step"]  # every step (--metrics-every 0)
    assert [line["step"] for line in steps] == list(range(1, 2 * 1024 // 32 + 1))
    assert all(line["samples_per_sec"] > 0 and line["loss"] > 0 for line in steps)
    assert {line["epoch"] for line in steps} == {1, 2} and all("gpu_util_pct" not in line for line in steps)
    assert [line["epoch"] for line in lines if line["event"] == "epoch"] == [1, 2]
    assert all(line["node"] == "LOCAL7" and line["world_size"] == 1 for line in lines)
