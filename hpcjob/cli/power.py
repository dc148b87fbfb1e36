"""`hpcjob cluster stop` and `hpcjob cluster start`: an onboarded cluster's idle compute nodes offline
and deallocated, and back (hpcjob.azure.power); the head node stays, and its cost is said."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from hpcjob.cli.app import cluster
from hpcjob.cli.options import TEXT

if TYPE_CHECKING:
    from hpcjob.azure.power import PowerReport


def _progress(line: str) -> None:
    click.echo(line, err=True)


@cluster.command(
    "stop",
    short_help="Take NAME's compute nodes offline and deallocate them.",
    epilog="""\b
    Examples:
      hpcjob cluster stop gpu1               # the head node stays
      hpcjob cluster stop gpu1 --force       # even while a job runs there
      hpcjob cluster stop gpu1 --print-only  # the commands, by hand
    """,
)
@click.argument("name", required=False, type=TEXT)
@click.option("--force", is_flag=True, help="Stop even while jobs run on the nodes (they end with the VMs).")
@click.option("--print-only", is_flag=True, help="Print what it would run, and run nothing.")
def cluster_stop(name: str | None, force: bool, print_only: bool) -> None:
    """Take the compute nodes of cluster NAME (one `hpcjob cluster onboard` made; default: the default
    cluster) offline, wait until HPC Pack shows them Offline, then deallocate their VMs: deallocated
    VMs cost nothing (their disks a little). The head node keeps running, and what it costs an hour is
    said. Refused while a job runs on the nodes, unless --force. `hpcjob cluster start` brings them
    back."""
    from hpcjob.azure.power import by_hand, onboarded, stop_cluster

    if print_only:
        for line in by_hand(onboarded(name), stop=True):
            click.echo(line)
        return
    report = stop_cluster(name, force=force, progress=_progress)
    _say(report, stopped=True)


@cluster.command(
    "start",
    short_help="Start NAME's compute nodes again and bring them online.",
    epilog="""\b
    Examples:
      hpcjob cluster start gpu1
      hpcjob cluster start gpu1 --print-only
    """,
)
@click.argument("name", required=False, type=TEXT)
@click.option("--print-only", is_flag=True, help="Print what it would run, and run nothing.")
def cluster_start(name: str | None, print_only: bool) -> None:
    """Start the compute node VMs of cluster NAME (one `hpcjob cluster onboard` made; default: the
    default cluster), wait until HPC Pack hears each node again (health OK), then bring them online."""
    from hpcjob.azure.power import by_hand, onboarded, start_cluster

    if print_only:
        for line in by_hand(onboarded(name), stop=False):
            click.echo(line)
        return
    report = start_cluster(name, progress=_progress)
    _say(report, stopped=False)


def _say(report: PowerReport, *, stopped: bool) -> None:
    from hpcjob.cli.tables import duration
    from hpcjob.job.prices import money

    nodes, took, head = len(report.nodes), duration(report.seconds), report.head
    named = f"the head node {head.name} ({head.size})" if head is not None else "the head node"
    head_cost = money(report.head_usd) or "an unknown amount"
    if stopped:
        click.echo(
            f"cluster {report.cluster} stopped in {took}: {nodes} compute node(s) offline and deallocated "
            f"(no charge for them now, a little for their disks); {named} still runs: {head_cost} an hour. "
            f"`hpcjob cluster start {report.cluster}` brings them back"
        )
    else:
        total = (
            None
            if report.nodes_usd is None or report.head_usd is None
            else report.nodes_usd + report.head_usd
        )
        click.echo(
            f"cluster {report.cluster} started in {took}: {nodes} compute node(s) online; it costs "
            f"{money(total) or 'an unknown amount'} an hour while it runs, {named} {head_cost} of it"
        )
    for note in report.price_notes:
        click.echo(f"hpcjob: prices: {note}", err=True)
