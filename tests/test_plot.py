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
        "training loss", "samples/s", "data wait (% of step time)", "GPU utilisation (%)",
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


def test_time_counts_from_the_run_s_start_and_data_wait_is_in_percent(tmp_path: Path) -> None:
    """The x axis starts where the run started (its first seconds, before the first step, are shown),
    and data wait reads as `hpcjob runs` shows it, in percent."""
    drawn = plot_runs({"a-1": timeline("GPU1", 0, False)}, tmp_path / "a.png")
    loss = drawn.points[("training loss", "GPU1 rank 0")]
    assert loss[0][0] == 1.0  # the rank started at t=100, its first step at t=101
    assert drawn.points[("data wait (% of step time)", "GPU1 rank 0")][0][1] == pytest.approx(1.0)
    started = plot_runs({"a-1": timeline("GPU1", 0, False)}, tmp_path / "b.png", starts={"a-1": 90.0})
    assert started.points[("training loss", "GPU1 rank 0")][0][0] == 11.0  # hpcjob started it at t=90


def test_each_node_and_rank_has_a_colour_of_its_own_in_every_panel_and_run(tmp_path: Path) -> None:
    ranks = [timeline(f"GPU{n}", rank, True) for n in (1, 2) for rank in range(6)]
    drawn = plot_runs({"a-1": [line for lines in ranks for line in lines], "b-2": timeline("GPU1", 0, True)},
                      tmp_path / "many.png")  # fmt: skip
    assert len(drawn.colours) == 12 and len(set(drawn.colours.values())) == 12


def test_runs_plot_without_a_run_draws_the_newest_with_every_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `status` does, `runs plot` alone takes this machine's newest run; a run of two attempts is
    drawn whole, each attempt's ranks from its own log folder."""
    import json

    from click.testing import CliRunner

    from hpcjob.cli import cli
    from hpcjob.store.runs import RunRecord, save_run

    save_run(RunRecord("old-1", "train", "local", "hpcjob/train", ("LOCAL1",), local_root=str(tmp_path)))
    newest = RunRecord("new-2", "train", "local", "hpcjob/train", ("LOCAL1",), local_root=str(tmp_path))
    for attempt, node in ((1, "LOCAL2"), (2, "LOCAL3")):
        metrics = tmp_path / "hpcjob/train/logs" / ("new-2" if attempt == 1 else "new-2/2") / "metrics"
        metrics.mkdir(parents=True)
        lines = timeline(node, 1, False)
        for line in lines:
            line["t"] += 100 * attempt
        (metrics / f"{node}-1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    save_run(newest.__class__(**{**newest.__dict__, "attempt": 2}))
    import hpcjob.store.plot

    drawn: dict[str, Any] = {}

    def plot(timelines: Any, *args: Any) -> Any:
        drawn.update(timelines)
        return plot_runs(timelines, *args)

    monkeypatch.setattr(hpcjob.store.plot, "plot_runs", plot)
    out = tmp_path / "newest.png"
    done = CliRunner().invoke(cli, ["runs", "plot", "-o", str(out)])
    assert list(drawn) == ["new-2"]
    assert {line["node"] for line in drawn["new-2"]} == {"LOCAL2", "LOCAL3"}  # both attempts' ranks
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"{out}: training loss, samples/s, data wait (% of step time)")
    assert out.read_bytes()[:4] == b"\x89PNG"
