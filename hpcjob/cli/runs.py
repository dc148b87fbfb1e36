"""`hpcjob runs`: the runs this machine started, as recorded here (hpcjob.runs)."""

from __future__ import annotations

import dataclasses
import json

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import TEXT


@cli.command("runs")
@click.option("--cluster", "cluster_name", type=TEXT, metavar="NAME", help="Only the runs on this cluster.")
@click.option(
    "--backend",
    "backend_kind",
    type=TEXT,
    metavar="KIND",
    help="Only the runs of this backend: local, rest, winrm, or manual (rendered for submitting by hand).",
)
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Only the newest N runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON, one object each.")
def runs(cluster_name: str | None, backend_kind: str | None, last: int | None, as_json: bool) -> None:
    """The runs this machine started (run --local, submit) or rendered, newest first: run id, name,
    where it ran, its nodes, the last step recorded and the job id. `hpcjob status RUN` asks for its
    state now."""
    from hpcjob.runs import recorded_runs

    chosen = [
        r for r in recorded_runs() if cluster_name in (None, r.cluster) and backend_kind in (None, r.backend)
    ][:last]
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in chosen]))
        return
    from hpcjob.cli.tables import table

    rows = [(r.run_id, r.name, r.cluster or r.backend, ",".join(r.nodes), r.state, r.job_id) for r in chosen]
    for line in table(("RUN", "NAME", "WHERE", "NODES", "RECORDED", "JOB"), rows):
        click.echo(line)
