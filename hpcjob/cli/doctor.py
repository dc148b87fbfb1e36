"""`hpcjob doctor`: is this cluster fit for a first job? One line per check, the fix under each failure."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import backend_option, cluster_option, started_command


@cli.command(
    short_help="Check a cluster, or this machine, before the first job.",
    epilog="""\b
    Examples:
      hpcjob doctor                # the default cluster
      hpcjob doctor --cluster lab --requirements requirements.txt
      hpcjob doctor --local        # this machine, for run --local
    """,
)
@cluster_option
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option(
    "--requirements",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Also build the job's environment from FILE on two nodes and run the all-reduce in it.",
)
@click.option(
    "--image",
    metavar="IMAGE",
    help="Run the all-reduce in containers of IMAGE, as `--image` jobs run (Docker, GPUs, the image).",
)
@click.option(
    "--local",
    is_flag=True,
    help="Check this machine for `run --local` instead: Python and torch, CUDA and the GPUs, a 2-node "
    "all-reduce on loopback, the rendezvous port, disk for environments, Docker.",
)
def doctor(
    cluster_name: str | None,
    backend_kind: str | None,
    as_json: bool,
    requirements: Path | None,
    image: str | None,
    local: bool,
) -> None:
    """Check a cluster before the first job: the head node and its version, the credentials, the node
    group's nodes, each node's GPUs, Python, torch and CUDA and its mount of the share (one short job, a
    task per node), an all-reduce between two nodes (in the environment of --requirements FILE, in
    containers of --image IMAGE, when given), and the share from this machine. With --local, this
    machine instead, for `run --local`. Exits 1 when a check fails."""
    from hpcjob.checks.cluster import checkup
    from hpcjob.job.spec import DEFAULT_DOCKER_GPUS, check_docker
    from hpcjob.runner import read_requirements

    # Read first: a file that cannot be read, or an image name, is said before anything runs.
    check_docker(image, DEFAULT_DOCKER_GPUS, "")
    wanted = (
        (requirements.name, read_requirements(requirements, f"--requirements {requirements}"))
        if requirements
        else None
    )

    def progress(line: str) -> None:
        if not as_json:
            click.echo(line, err=True)

    if local:
        from hpcjob.checks.cluster import local_checkup
        from hpcjob.job.spec import SpecError

        if cluster_name or backend_kind or requirements or image:
            raise SpecError(
                "--local checks this machine: --cluster, --backend, --requirements, --image are a cluster's"
            )
        report = local_checkup(progress)
    else:
        from hpcjob.runner import ClusterAccess

        report = checkup(
            ClusterAccess(cluster_name, backend_kind),
            requirements=wanted,
            image=image,
            progress=progress,
            command=started_command(),
        )
    if as_json:
        rows = [
            {"check": c.name, "result": c.result, "detail": c.detail, "fix": c.fix}
            | ({"figures": list(c.figures)} if c.figures else {})
            for c in report.checks
        ]
        click.echo(json.dumps({"cluster": report.cluster, "backend": report.backend, "checks": rows}))
    else:
        from hpcjob.cli.tables import checkup_lines

        for line in checkup_lines(report):
            click.echo(line)
    if report.failed:
        raise SystemExit(1)
