"""How the CLI shows things to a person: aligned tables with headers, durations, rounded metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcjob.checks.cluster import Checkup
    from hpcjob.job.prices import Price
    from hpcjob.job.results import GpuUse, JobSummary, MountResult


def table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> list[str]:
    """The lines of a table: the header, then each row, columns aligned; None shows as '-'."""
    cells = [list(header)] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def duration(seconds: float) -> str:
    """9.5 s, 12 min 5 s, 3 h 20 min: as a person reads a time."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def number(value: object) -> str:
    """Three significant digits, without an exponent; whole numbers from 100 up."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 0.001 or value == 0 else f"{value:.1e}"


def metrics_line(metrics: Mapping[str, object]) -> str:
    """The training program's metrics, rounded: `*_s` as durations, `*_fraction` as percentages."""
    shown = []
    for key, value in metrics.items():
        if isinstance(value, list | dict):
            continue  # per-rank detail (the GPUs): shown as a table of its own
        if isinstance(value, int | float) and not isinstance(value, bool):
            if key.endswith("_s"):
                shown.append(f"{key.removesuffix('_s')}={duration(float(value))}")
                continue
            if key.endswith("_fraction"):
                shown.append(f"{key.removesuffix('_fraction')}={100 * value:.1f}%")
                continue
        shown.append(f"{key}={number(value)}")
    return ", ".join(shown)


def latest_line(step: Mapping[str, object], now: float) -> str:
    """A running job's newest metrics line (the training program's timeline), as `status` and `logs`
    show it."""
    figures = ", ".join(f"{key} {number(step[key])}" for key in ("loss", "samples_per_sec") if key in step)
    ago = now - float(str(step.get("t", now)))
    return (
        f"latest: epoch {step.get('epoch')} step {step.get('step')}: {figures} "
        f"({step.get('node')} rank {step.get('rank')}, {ago:.0f} s ago)"
    )


def format_summary(summary: JobSummary) -> str:
    """How every backend ends a job it followed: state, each node, the first failure, the metrics."""
    usage = summary.run_usage
    attempts = f", {len(usage.attempts)} attempts" if usage is not None else ""
    lines = [
        f"job {summary.name} {summary.state} in {duration(summary.wall_time_s)}, exit code "
        f"{summary.exit_code} (run {summary.run_id}{attempts})"
    ]
    rows = [(node.node, node.state, node.exit_code) for node in summary.nodes]
    lines += table(("NODE", "STATE", "EXIT CODE"), rows, indent="  ")
    lines += [f"  {event}" for event in summary.events]
    if summary.root_cause:
        lines.append(f"  first failure: {summary.root_cause.describe()}")
    if summary.datasets:
        from hpcjob.job.datasets import copies_line

        lines.append(f"  {copies_line(summary.datasets)}")
    if summary.metrics and summary.trained_nothing:
        from hpcjob.job.results import nothing_trained_line

        lines.append(f"  {nothing_trained_line(summary.metrics)}")
        # An older training program copied the checkpoint's figures: never shown as this run's.
        copied = ("samples_per_sec", "data_wait_fraction", "accuracy", "train_loss", "test_loss")
        own = {key: value for key, value in summary.metrics.items() if key not in copied}
        lines.append(f"  metrics: {metrics_line(own)}")
    elif summary.metrics:
        lines.append(f"  metrics: {metrics_line(summary.metrics)}")
    if summary.gpu_use:
        lines += gpu_table(summary.gpu_use, now=False, indent="  ")
    if usage is not None:  # the run's, its attempts' together
        gpu_hours = f", {usage.gpu_hours:.2f} GPU-hours" if usage.gpu_hours is not None else ""
        lines.append(f"  usage: {usage.node_hours:.2f} node-hours{gpu_hours}, its attempts together")
        if usage.unknown_cost():
            lines.append(f"  cost unknown: {usage.unknown_cost()}")
    if summary.price is not None and summary.cost_usd is not None:
        lines.append(f"  {cost_line(summary.cost_usd, summary.price)}")
    lines.append(f"  logs: {summary.log_dir}")
    return "\n".join(lines)


def cost_line(usd: float, price: Price) -> str:
    """`cost ≈ $1.23 at Standard_ND96isr_H100_v5 list price, eastus, 2026-11-27`."""
    from hpcjob.job.prices import money

    return f"cost ≈ {money(usd)} at {price.describe()}"


def gpu_table(uses: Sequence[GpuUse], *, now: bool, indent: str = "") -> list[str]:
    """Each node's GPU use: over the run (mean and peak utilisation, peak memory), or `now` (the latest)."""
    if now:
        latest = [(u.node, u.gpus, f"{u.util_mean_pct:.0f}%", _mib(u.memory_peak_mib)) for u in uses]
        return table(("NODE", "GPUS", "GPU UTIL NOW", "GPU MEMORY NOW"), latest, indent)
    rows = [
        (u.node, u.gpus, f"{u.util_mean_pct:.0f}%", f"{u.util_peak_pct:.0f}%", _mib(u.memory_peak_mib))
        for u in uses
    ]
    return table(("NODE", "GPUS", "GPU UTIL MEAN", "GPU UTIL PEAK", "GPU MEMORY PEAK"), rows, indent)


def _mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def mount_lines(results: Sequence[MountResult]) -> list[str]:
    """`hpcjob mount`'s table: each node's result, with the node's own words."""
    return table(("NODE", "RESULT", "MESSAGE"), [(r.node, r.outcome, r.message) for r in results])


def checkup_lines(report: Checkup) -> list[str]:
    """`hpcjob doctor`'s report: a line per check, the fix under each failure, then the count."""
    from hpcjob.checks.verdicts import INFO, SKIP

    checks, failed = report.checks, report.failed
    width = max(len(check.name) for check in checks)
    where = f"cluster {report.cluster} ({report.backend}, " if report.backend != "local" else "this machine ("
    lines = [f"{where}{report.endpoint})"]
    for check in checks:
        lines.append(f"  {check.result.upper():4}  {check.name.ljust(width)}  {check.detail}")
        if check.fix and check.failed:
            lines.append(f"  {'':4}  {''.ljust(width)}  fix: {check.fix}")
    ran = [check for check in checks if check.result not in (SKIP, INFO)]
    lines.append(f"{len(failed)} of {len(ran)} checks failed" if failed else f"all {len(ran)} checks passed")
    return lines
