"""`hpcjob runs plot`'s picture from timelines: the panels and lines it draws, GPU panels only where a
GPU was watched, several runs told apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcjob.job.spec import SpecError
from hpcjob.store.plot import plot_runs


def timeline(node: str, rank: int, gpu: bool, steps: int = 4) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [
        {"t": 100.0, "event": "start", "node": node, "rank": rank, "first_epoch": 1}
    ]
    for step in range(1, steps + 1):
        line = {"t": 100.0 + step, "event": "step", "node": node, "rank": rank, "epoch": 1, "step": step * 5,
                "loss": 2.0 / step, "samples_per_sec": 1000.0 + step, "data_wait_fraction": 0.01}  # fmt: skip
        if gpu:
            line.update(gpu_util_pct=90.0, gpu_memory_mib=2048.0)
        lines.append(line)
    return lines


def test_two_runs_side_by_side_with_gpu_panels(tmp_path: Path) -> None:
    out = tmp_path / "cmp.png"
    drawn = plot_runs(
        {"a-1": timeline("GPU1", 0, True) + timeline("GPU2", 1, True), "b-2": timeline("GPU1", 0, True)}, out
    )
    assert list(drawn.panels) == [
        "training loss", "samples/s", "data wait (share of step time)", "GPU utilisation (%)",
        "GPU memory (MiB)",
    ]  # fmt: skip
    assert drawn.panels["GPU memory (MiB)"] == ["a-1: GPU1 rank 0", "a-1: GPU2 rank 1", "b-2: GPU1 rank 0"]
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_without_a_gpu_its_series_are_left_out_not_drawn_as_zeros(tmp_path: Path) -> None:
    drawn = plot_runs({"c-3": timeline("LOCAL1", 0, False)}, tmp_path / "c.png")
    assert "GPU utilisation (%)" not in drawn.panels
    assert drawn.panels["training loss"] == ["LOCAL1 rank 0"]


def test_a_run_too_short_for_step_lines_is_drawn_from_its_epochs(tmp_path: Path) -> None:
    epochs = [{"t": 100.0 + e, "event": "epoch", "node": "LOCAL1", "rank": 0, "epoch": e,
               "train_loss": 1.0 / e, "samples_per_sec": 900.0, "data_wait_fraction": 0.02}
              for e in (1, 2)]  # fmt: skip
    drawn = plot_runs({"e-5": epochs}, tmp_path / "e.png")
    assert drawn.panels["training loss"] == ["LOCAL1 rank 0"] and "GPU memory (MiB)" not in drawn.panels


def test_a_run_without_a_timeline_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no metrics over time in these runs"):
        plot_runs({"d-4": [{"t": 1.0, "event": "start"}]}, tmp_path / "d.png")
    assert not (tmp_path / "d.png").exists()


def test_runs_with_a_cost_get_cost_against_samples_per_s_and_per_1000_samples(tmp_path: Path) -> None:
    from hpcjob.store.plot import COST_AGAINST_SPEED, COST_PER_1000, RunCost

    costs = [RunCost("a-1", 1.5, 1000.0, 0.05), RunCost("b-2", 2.5, 1500.0, 0.04), RunCost("c-3", 0.2)]
    drawn = plot_runs({"a-1": timeline("GPU1", 0, True), "b-2": [], "c-3": []}, tmp_path / "cost.png", costs)
    assert drawn.panels[COST_AGAINST_SPEED] == ["a-1", "b-2"]  # c-3 measured no samples/s
    assert drawn.panels[COST_PER_1000] == ["a-1", "b-2"] and "training loss" in drawn.panels
    alone = plot_runs({"b-2": []}, tmp_path / "alone.png", costs[1:2])  # no timeline: the cost alone
    assert list(alone.panels) == [COST_AGAINST_SPEED, COST_PER_1000]
