"""Atomic checkpoint writes, round trips and the resume arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from neural_network import NeuralNetwork
from operations import (
    CHECKPOINT_NAME,
    Checkpoint,
    CheckpointError,
    EpochMetrics,
    Totals,
    epochs_to_run,
    load_checkpoint,
    save_checkpoint,
)


def _trained_state() -> tuple[NeuralNetwork, torch.optim.SGD]:
    torch.manual_seed(0)
    model = NeuralNetwork(num_classes=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = nn.CrossEntropyLoss()(model(torch.rand(8, 1, 28, 28)), torch.arange(8) % 4)
    loss.backward()
    optimizer.step()  # creates momentum buffers, so the optimizer state is not empty
    return model, optimizer


def _checkpoint(epoch: int) -> Checkpoint:
    model, optimizer = _trained_state()
    metrics = EpochMetrics(epoch, 0.5, 0.6, 0.75, 1234.5, 0.125)
    return Checkpoint(epoch, model.state_dict(), optimizer.state_dict(), metrics, Totals(10, 2, 0.5, 4), 4)


def test_save_leaves_only_the_checkpoint_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / CHECKPOINT_NAME  # the folder is created on demand
    original = _checkpoint(2)
    save_checkpoint(original, path)
    assert [p.name for p in path.parent.iterdir()] == [CHECKPOINT_NAME]

    loaded = load_checkpoint(path)
    assert loaded is not None
    assert loaded.epoch == 2 and loaded.num_classes == 4
    assert loaded.metrics == original.metrics and loaded.totals == original.totals
    assert loaded.model.keys() == original.model.keys()
    assert all(torch.equal(loaded.model[k], original.model[k]) for k in original.model)
    assert all(tensor.device.type == "cpu" for tensor in loaded.model.values())

    # The restored state really drives a fresh model and optimizer.
    model = NeuralNetwork(num_classes=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    model.load_state_dict(loaded.model)
    optimizer.load_state_dict(loaded.optimizer)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    expected = [state["momentum_buffer"] for state in original.optimizer["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(buffers, expected, strict=True))


def test_checkpoint_file_layout(tmp_path: Path) -> None:
    # Plain torch.load with weights_only must be enough to inspect a checkpoint.
    save_checkpoint(_checkpoint(1), tmp_path / CHECKPOINT_NAME)
    raw = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert raw["epoch"] == 1 and raw["metrics"]["accuracy"] == 0.75
    assert set(raw) >= {"model", "optimizer", "epoch", "metrics"}
    assert "linear_relu_stack.0.weight" in raw["model"]


def test_overwrite_replaces_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(_checkpoint(1), path)
    save_checkpoint(_checkpoint(2), path)
    loaded = load_checkpoint(path)
    assert loaded is not None and loaded.epoch == 2
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


def test_failed_write_keeps_the_old_checkpoint_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(_checkpoint(1), path)

    def half_write(obj: Any, handle: Any) -> None:
        handle.write(b"partial data")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(_checkpoint(2), path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]
    loaded = load_checkpoint(path)
    assert loaded is not None and loaded.epoch == 1


def test_missing_checkpoint_is_none(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME) is None


@pytest.mark.parametrize("content", [b"garbage", None])
def test_unusable_checkpoint_is_a_one_line_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / CHECKPOINT_NAME
    if content is None:
        torch.save({"epoch": 3}, path)  # readable, but not written by run_ddp.py
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("completed", "epochs", "expected"),
    [(0, 3, [1, 2, 3]), (1, 3, [2, 3]), (2, 3, [3]), (3, 3, []), (5, 3, [])],
)
def test_epochs_to_run(completed: int, epochs: int, expected: list[int]) -> None:
    assert list(epochs_to_run(completed, epochs)) == expected
