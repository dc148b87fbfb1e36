"""run_ddp.py's state through hpctorch's checkpoints, and the resume arithmetic."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hpctorch import Checkpoints
from torch import nn

import run_ddp
from neural_network import NeuralNetwork
from operations import Totals, epochs_to_run


def _trained_state(seed: int) -> tuple[NeuralNetwork, torch.optim.SGD]:
    torch.manual_seed(seed)
    model = NeuralNetwork(num_classes=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=run_ddp.MOMENTUM)
    loss = nn.CrossEntropyLoss()(model(torch.rand(8, 1, 28, 28)), torch.arange(8) % 4)
    loss.backward()
    optimizer.step()  # creates momentum buffers, so the optimizer state is not empty
    return model, optimizer


def test_the_model_optimizer_and_counters_come_back_exactly(tmp_path: Path) -> None:
    model, optimizer = _trained_state(0)
    totals = Totals(10.0, 2.0, 0.5, 4.0)
    Checkpoints(folder=str(tmp_path)).close(7, model, optimizer, extra={"epoch": 2, "totals": asdict(totals)})

    other, other_optimizer = _trained_state(1)  # other weights and momentum, overwritten in place
    checkpoints = Checkpoints(folder=str(tmp_path))
    resumed = run_ddp.resume(checkpoints, other, other_optimizer)
    assert (resumed.epoch, resumed.step, Path(str(resumed.path)).name) == (2, 7, "step-000000007")
    assert Totals(**checkpoints.extra["totals"]) == totals
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
    saved, loaded = optimizer.state_dict(), other_optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys()
    for index, state in saved["state"].items():
        assert torch.equal(loaded["state"][index]["momentum_buffer"], state["momentum_buffer"])


def test_a_fresh_folder_resumes_nothing(tmp_path: Path) -> None:
    model, optimizer = _trained_state(0)
    assert run_ddp.resume(Checkpoints(folder=str(tmp_path)), model, optimizer) == run_ddp.Resumed()


@pytest.mark.parametrize(
    ("completed", "epochs", "expected"),
    [(0, 3, [1, 2, 3]), (1, 3, [2, 3]), (2, 3, [3]), (3, 3, []), (5, 3, [])],
)
def test_epochs_to_run(completed: int, epochs: int, expected: list[int]) -> None:
    assert list(epochs_to_run(completed, epochs)) == expected
