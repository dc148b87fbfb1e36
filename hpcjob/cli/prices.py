"""`hpcjob prices`: Azure VM sizes' prices an hour, as runs are counted at (hpcjob.runner.cost)."""

from __future__ import annotations

import json

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import TEXT, cluster_option


@cli.command(
    "prices",
    short_help="Azure prices an hour of the cluster's VM sizes.",
    epilog="""\b
    Examples:
      hpcjob prices                       # the default cluster's size and region
      hpcjob prices --size Standard_ND96isr_H100_v5 --region eastus
      hpcjob prices --refresh --json
    """,
)
@click.option(
    "--size",
    "sizes",
    multiple=True,
    type=TEXT,
    metavar="SIZE",
    help="An Azure VM size, repeatable [default: the cluster profile's vm_size].",
)
@click.option("--region", type=TEXT, metavar="REGION", help="The Azure region [default: the profile's].")
@click.option("--refresh", is_flag=True, help="Ask the Azure Retail Prices API again, not the cache.")
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="Print the prices as JSON, one object each.")
def prices(
    sizes: tuple[str, ...], region: str | None, refresh: bool, cluster_name: str | None, as_json: bool
) -> None:
    """Azure VM sizes' pay-as-you-go prices an hour in a region, in US dollars: Linux (compute nodes),
    Spot, and Windows (the head node), with the date they were asked for and where they came from (the
    Azure Retail Prices API, cached; without a network, hpcjob's own approximate table). Runs on the
    cluster are counted at these prices."""
    from hpcjob.cli.tables import table
    from hpcjob.job.prices import FROM_API
    from hpcjob.runner.cost import price_rows

    found, warnings = price_rows(sizes, region, refresh=refresh, cluster=cluster_name)
    for warning in warnings:
        click.echo(f"hpcjob: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps([one.prices.to_dict() for one in found]))
        return

    def hourly(value: float | None) -> str | None:
        return None if value is None else f"{value:,.4f}".rstrip("0").rstrip(".")

    rows = [
        (
            p.size,
            p.region,
            hourly(p.linux),
            hourly(p.spot),
            hourly(p.windows),
            p.asked,
            "Azure Retail Prices API" if p.source == FROM_API else "hpcjob's own table",
        )
        for p in (one.prices for one in found)
    ]
    header = ("SIZE", "REGION", "LINUX $/H", "SPOT $/H", "WINDOWS $/H", "ASKED", "SOURCE")
    for line in table(header, rows):
        click.echo(line)
