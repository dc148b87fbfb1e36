"""`hpcjob runs`: the history of the runs this machine started (hpcjob.store.runs), one run whole, and
plots."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import TYPE_CHECKING

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import TEXT

if TYPE_CHECKING:
    from hpcjob.store.runs import HistoryEntry

_AGO = re.compile(r"(\d+)([dhm])")


def parse_since(text: str, now: float) -> float:
    """`--since`: a date or time (2026-11-01, 2026-11-01T09:30) in local time, or an age (7d, 12h, 30m)."""
    from hpcjob.job.spec import SpecError

    if match := _AGO.fullmatch(text.strip()):
        return now - int(match[1]) * {"d": 86400, "h": 3600, "m": 60}[match[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SpecError(
            f"--since {text!r} must be a date (2026-11-01), a time (2026-11-01T09:30) or an age (7d, 12h)"
        ) from None


@cli.group(
    "runs",
    invoke_without_command=True,
    short_help="The runs this machine started, newest first.",
    epilog="""\b
    Examples:
      hpcjob runs --since 7d --tag lr=0.1
      hpcjob runs --cluster lab --state Failed --last 5 --json
    """,
)
@click.option("--cluster", "cluster_name", type=TEXT, metavar="NAME", help="Only the runs on this cluster.")
@click.option(
    "--backend",
    "backend_kind",
    type=TEXT,
    metavar="KIND",
    help="Only the runs of this backend: local, rest, winrm, or manual (rendered for submitting by hand).",
)
@click.option(
    "--state",
    type=TEXT,
    metavar="STATE",
    help="Only runs in this state as last seen (Running, Finished, Failed, Canceled, or a submission step).",
)
@click.option(
    "--tag", "tag_items", multiple=True, type=TEXT, metavar="KEY=VALUE", help="Only runs with this tag."
)
@click.option("--since", type=TEXT, metavar="WHEN", help="Only runs started since: 2026-11-01, 7d, 12h.")
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Only the newest N runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON, one object each.")
@click.pass_context
def runs(
    ctx: click.Context,
    cluster_name: str | None,
    backend_kind: str | None,
    state: str | None,
    tag_items: tuple[str, ...],
    since: str | None,
    last: int | None,
    as_json: bool,
) -> None:
    """The runs this machine started (run --local, submit) or rendered, newest first: where, nodes x
    GPUs, state as last seen, start, wall time, node- and GPU-hours, cost, samples/s and tags. `hpcjob status
    RUN` asks for a job's state now; `hpcjob runs show RUN` gives one run whole."""
    if ctx.invoked_subcommand is not None:
        return
    from hpcjob.job.spec import parse_tags
    from hpcjob.store.runs import iter_history

    found = iter_history(
        cluster=cluster_name,
        backend=backend_kind,
        state=state,
        tags=parse_tags(tag_items),
        since=parse_since(since, time.time()) if since else None,
        last=last,
    )
    if as_json:  # one JSON array, written a run at a time as the history gives them
        click.echo("[", nl=False)
        for index, entry in enumerate(found):
            click.echo(("," if index else "") + json.dumps(entry.to_dict()), nl=False)
        click.echo("]")
        return
    entries = list(found)
    from hpcjob.cli.tables import duration, number, table
    from hpcjob.job.prices import money

    def hours(value: float | None) -> str | None:
        return None if value is None else f"{value:.2f}"

    rows = [
        (
            e.record.run_id,
            e.record.name,
            e.record.cluster or e.record.backend,
            (f"{len(e.record.nodes)}x{e.gpus_per_node}" if e.gpus_per_node else str(len(e.record.nodes)))
            + (f"+{len(e.data_node_names)} data" if e.data_node_names else ""),
            e.state or e.record.state,
            time.strftime("%Y-%m-%d %H:%M", time.localtime(e.started)),
            None if e.wall_s is None else duration(e.wall_s),
            hours(e.node_hours),
            hours(e.gpu_hours),
            money(e.cost_usd),
            None if e.samples_per_sec is None else number(e.samples_per_sec),
            None if e.data_wait is None else f"{e.data_wait:.0%}",
            None if e.data_samples_per_sec is None else number(e.data_samples_per_sec),
            " ".join(f"{k}={v}" for k, v in e.tags.items()) or None,
        )
        for e in entries
    ]
    header = (
        "RUN",
        "NAME",
        "WHERE",
        "NODES",
        "STATE",
        "START",
        "WALL",
        "NODE-H",
        "GPU-H",
        "COST",
        "SAMPLES/S",
        "WAIT",
        "DATA/S",
        "TAGS",
    )
    for line in table(header, rows):
        click.echo(line)


@runs.command(
    "show",
    short_help="One run whole: command, nodes, root cause, metrics, logs.",
    epilog="""\b
    Examples:
      hpcjob runs show 42          # HPC Pack job 42, submitted from here
      hpcjob runs show 42 --json
    """,
)
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
def runs_show(run_id: str, as_json: bool) -> None:
    """One run whole: the command, the job, its nodes and their exit codes, the root cause, the metrics,
    and where its logs and checkpoints are. RUN is a run id or the job id of a submitted job."""
    from hpcjob.store.runs import find_entry

    entry = find_entry(run_id)
    if as_json:
        click.echo(json.dumps(entry.to_dict()))
        return
    for line in describe(entry):
        click.echo(line)


def describe(entry: HistoryEntry) -> list[str]:
    """`runs show`: the run as a person reads it."""
    from hpcjob.cli.tables import cost_line, duration, format_summary
    from hpcjob.job.prices import money

    record = entry.record
    where = f"cluster {record.cluster} over {record.backend}" if record.cluster else record.backend
    lines = [
        f"run {record.run_id} ({record.name}) on {where}"
        + (f", job {record.job_id}" if record.job_id else "")
    ]
    lines.append(f"  started:  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(entry.started))}")
    state = entry.state or record.state or "unknown"
    if entry.exit_code is not None:
        state += f", exit code {entry.exit_code}"
    lines.append(
        f"  state:    {state}" + (f" after {duration(entry.wall_s)}" if entry.wall_s is not None else "")
    )
    if record.failure:  # the submission failed before its job was submitted
        lines.append(f"  why:      {record.failure}")
    if entry.command:
        lines.append(f"  command:  {entry.command}")
    if entry.tags:
        lines.append("  tags:     " + " ".join(f"{k}={v}" for k, v in entry.tags.items()))
    gpus = f" x {entry.gpus_per_node} GPU(s)" if entry.gpus_per_node else ""
    lines.append(f"  nodes:    {', '.join(record.nodes)}{gpus}")
    if entry.plan:
        lines.append(f"  job:      {entry.plan.get('command_line', '')}")
    base = record.local_root or record.share or "the share"
    lines.append(f"  logs:     {base}/{record.log_folder}")
    from hpcjob.runner.resume import checkpoints_shown

    lines.append(f"  checkpoints: {checkpoints_shown(entry)}")
    usage, summary = entry.usage, entry.summary
    several = usage is not None and len(usage.attempts) > 1
    if usage is not None:
        gpu_hours = f", {usage.gpu_hours:.2f} GPU-hours" if usage.gpu_hours is not None else ""
        over = f", its {len(usage.attempts)} attempts together" if several else ""
        lines.append(f"  usage:    {usage.node_hours:.2f} node-hours{gpu_hours}{over}")
    if usage is not None and usage.unknown_cost():
        lines.append(f"  cost:     unknown: {usage.unknown_cost()}")
    elif several and usage is not None and usage.cost_usd is not None:
        lines.append(
            f"  cost:     ≈ {money(usage.cost_usd)}, its attempts together (an attribution, not the bill)"
        )
    elif summary is not None and summary.price is not None and summary.cost_usd is not None:
        busy = sum(used.node_hours for used in summary.usage)
        lines.append(
            f"  cost:     {cost_line(summary.cost_usd, summary.price)}: {busy:.2f} node-hours of tasks at "
            f"${summary.price.usd_per_hour:,.2f} an hour (an attribution, not the bill)"
        )
    if entry.attempts:  # issue 33: each attempt a job of its own
        lines.append("  attempts:")
        figures = {a.attempt: a for a in usage.attempts} if usage is not None else {}
        for attempt in entry.attempts:
            used = figures.get(attempt.attempt) or attempt.usage(entry.gpus_per_node)
            data = f" and data node(s) {', '.join(used.data_node_names)}" if used.data_node_names else ""
            cost = "no price" if not used.priced else money(used.cost_usd or 0.0)
            then = "; retried" if attempt.retried else ""
            lines.append(
                f"    {attempt.attempt}. job {attempt.job_id or '-'} on {', '.join(attempt.nodes)}{data}, "
                f"{duration(used.wall_s)}, {used.node_hours:.2f} node-hours, {cost}: "
                f"{attempt.said or attempt.cause or 'unknown'}{then}"
            )
    if entry.summary is not None:
        lines.append("")
        lines += format_summary(entry.summary).splitlines()
    return lines


@runs.command(
    "plot",
    short_help="Draw runs' metrics over time into a PNG.",
    epilog="""\b
    Examples:
      hpcjob runs plot                          # the newest run, into run.png
      hpcjob runs plot 42 43 -o compare.png
    """,
)
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@click.option(
    "-o", "--output", "out", type=click.Path(dir_okay=False), default="run.png", show_default=True,
    help="The PNG to write.",
)  # fmt: skip
def runs_plot(run_ids: tuple[str, ...], out: str) -> None:
    """Draw runs' metrics over time into a PNG: training loss, samples/s, data wait (%) and, where a GPU
    was watched, its utilisation and memory, a line (and a colour) per node and rank, from the run's
    start, every attempt of it; several runs side by side. Without RUN, the newest run (as `status`).
    Runs on a cluster with a price: their cost against their samples/s, and what 1,000 samples cost."""
    from dataclasses import replace
    from pathlib import Path

    from hpcjob.runner import run_folder
    from hpcjob.store.logs import RunLogs
    from hpcjob.store.plot import RunCost, plot_runs
    from hpcjob.store.runs import find_entry, newest_run

    timelines, costs, starts = {}, [], {}
    for run_id in run_ids or (newest_run().run_id,):
        entry = find_entry(run_id)
        record = entry.record
        if entry.cost_usd is not None:
            costs.append(
                RunCost(record.run_id, entry.cost_usd, entry.samples_per_sec, entry.cost_per_1000_samples)
            )
        starts[record.run_id] = entry.started
        folder = run_folder(record)
        try:
            timelines[record.run_id] = [  # every attempt's, in time order
                line
                for attempt in range(1, record.attempt + 1)
                for line in RunLogs(folder, replace(record, attempt=attempt).log_folder, ()).timeline()
            ]
        finally:
            folder.close()
    drawn = plot_runs(timelines, Path(out), costs, starts)
    click.echo(f"{out}: {', '.join(drawn.panels)}")
