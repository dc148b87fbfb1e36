"""Pictures of runs: each rank's metrics over time (the training program's timeline), one line per node
and rank, several runs side by side; and what the runs cost: against their samples/s, and per 1,000
samples. matplotlib is the `plot` extra; it is imported only here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcjob.extras import missing_extra
from hpcjob.job.spec import SpecError

# (the timeline's field, the panel's title, the factor its values are drawn at); a panel no run has
# figures for is left out, not drawn flat. Data wait in percent, as `hpcjob runs` shows it.
PANELS = (
    ("loss", "training loss", 1.0),
    ("samples_per_sec", "samples/s", 1.0),
    ("data_wait_fraction", "data wait (% of step time)", 100.0),
    ("gpu_util_pct", "GPU utilisation (%)", 1.0),
    ("gpu_memory_mib", "GPU memory (MiB)", 1.0),
)


# The cost panels' titles.
COST_AGAINST_SPEED = "cost (USD) against samples/s"
COST_PER_1000 = "cost per 1,000 samples (USD)"


@dataclass(frozen=True)
class RunCost:
    """What a run cost (US dollars; hpcjob.job.prices) and its samples/s; `per_1000_samples`: what 1,000
    samples cost at that throughput, its nodes' price a second over its samples a second."""

    run_id: str
    cost_usd: float
    samples_per_sec: float | None = None
    per_1000_samples: float | None = None


@dataclass
class Drawn:
    """What a picture shows: its panels, the labelled lines in each, each line's points (panel title,
    label) and each node and rank's colour, the same in every panel and run."""

    panels: dict[str, list[str]] = field(default_factory=dict)
    points: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    colours: dict[tuple[str, int], str] = field(default_factory=dict)


def series(timeline: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """The step lines of a run's timeline (this rank's figures every few steps), by (node, rank at the
    time), in time order; a run too short for any has its epoch lines instead (the epoch's figures of
    all ranks, its training loss as the loss)."""
    steps = [line for line in timeline if line.get("event") == "step"]
    if not steps:
        epochs = [line for line in timeline if line.get("event") == "epoch"]
        steps = [{**line, "loss": line["train_loss"]} if "train_loss" in line else line for line in epochs]
    by_rank: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for line in steps:
        by_rank.setdefault((str(line.get("node")), int(line.get("rank", 0))), []).append(line)
    return by_rank


def plot_runs(
    timelines: Mapping[str, Sequence[Mapping[str, Any]]],
    out: Path,
    costs: Sequence[RunCost] = (),
    starts: Mapping[str, float] | None = None,
) -> Drawn:
    """Draw each run's timeline (run id -> its lines) into `out` (PNG): a panel per metric, a line per
    node and rank (a colour each), time since the run's start on the x axis (`starts`: when each run
    started, seconds since the epoch; else its first line, whatever its event), so its first seconds
    show; runs told apart by line style. With the `costs` of runs that have one: cost against samples/s
    (a point a run) and the cost of 1,000 samples (a bar a run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
        from matplotlib.colors import to_hex
    except ImportError:
        raise missing_extra("plot", "runs plot") from None
    runs = {run: series(lines) for run, lines in timelines.items()}
    priced = [cost for cost in costs if cost.samples_per_sec is not None]
    per_1000 = [cost for cost in costs if cost.per_1000_samples is not None]
    if not any(runs.values()) and not priced and not per_1000:
        raise SpecError(
            "no metrics over time in these runs: a script writes them through hpctorch's Metrics, as the "
            "training program does (metrics/ in the run's log folder)"
        )
    shown = [(key, title, factor) for key, title, factor in PANELS if _has(runs, key)]
    ranks = sorted({rank for by_rank in runs.values() for rank in by_rank})
    palette = plt.get_cmap("tab20" if len(ranks) > 10 else "tab10")
    drawn = Drawn(colours={rank: to_hex(palette(i % palette.N)) for i, rank in enumerate(ranks)})
    origin = {run: _start(lines, (starts or {}).get(run)) for run, lines in timelines.items()}
    panels = len(shown) + bool(priced) + bool(per_1000)
    columns = 2 if panels > 1 else 1
    rows = (panels + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(7 * columns, 3.2 * rows), squeeze=False)
    styles = ("-", "--", ":", "-.")
    for index, (key, title, factor) in enumerate(shown):
        axis = axes[index // columns][index % columns]
        axis.set_title(title)
        axis.set_xlabel("seconds since the run's start")
        labels = drawn.panels.setdefault(title, [])
        for number, (run, by_rank) in enumerate(runs.items()):
            for (node, rank), lines in sorted(by_rank.items()):
                points = [
                    (float(line["t"]) - origin[run], float(line[key]) * factor)
                    for line in lines
                    if key in line
                ]
                if not points:
                    continue
                label = f"{node} rank {rank}" if len(runs) == 1 else f"{run}: {node} rank {rank}"
                colour = drawn.colours[(node, rank)]
                axis.plot(*zip(*points, strict=True), styles[number % len(styles)], color=colour, label=label)
                labels.append(label)
                drawn.points[(title, label)] = points
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    index = len(shown)
    if priced:
        axis = axes[index // columns][index % columns]
        axis.set_title(COST_AGAINST_SPEED)
        axis.set_xlabel("samples/s")
        axis.set_ylabel("USD")
        for cost in priced:
            assert cost.samples_per_sec is not None
            axis.plot([cost.samples_per_sec], [cost.cost_usd], "o")
            axis.annotate(cost.run_id, (cost.samples_per_sec, cost.cost_usd), fontsize="small")
        axis.grid(alpha=0.3)
        drawn.panels[COST_AGAINST_SPEED] = [cost.run_id for cost in priced]
        index += 1
    if per_1000:
        axis = axes[index // columns][index % columns]
        axis.set_title(COST_PER_1000)
        axis.set_ylabel("USD")
        axis.bar([cost.run_id for cost in per_1000], [cost.per_1000_samples or 0.0 for cost in per_1000])
        axis.tick_params(axis="x", labelrotation=20, labelsize="small")
        drawn.panels[COST_PER_1000] = [cost.run_id for cost in per_1000]
        index += 1
    for index in range(panels, rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.suptitle(", ".join(timelines))
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return drawn


def _start(timeline: Sequence[Mapping[str, Any]], started: float | None) -> float:
    """A run's x origin: when it started (`started`), or its first line of any kind (a rank's start comes
    before its first step), whichever is earlier (a node's clock may run a little ahead of this one's)."""
    times = [float(line["t"]) for line in timeline if isinstance(line.get("t"), int | float)]
    return min([*times, *([started] if started is not None else [])], default=0.0)


def _has(runs: Mapping[str, Mapping[tuple[str, int], Sequence[Mapping[str, Any]]]], key: str) -> bool:
    return any(key in line for by_rank in runs.values() for lines in by_rank.values() for line in lines)
