"""`hpcjob doctor`: is this cluster fit for a first job? One line per check, the fix under each failure."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import backend_option, cluster_option, started_command
from hpcjob.runner import ClusterAccess, new_run_id, profile_mount_point, submit_and_follow

if TYPE_CHECKING:
    from hpcjob.doctor import Check

SHARE_PROBE_FILE = ".hpcjob-doctor"  # written (and overwritten) at the share's root to prove it writable


@cli.command()
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
def doctor(
    cluster_name: str | None,
    backend_kind: str | None,
    as_json: bool,
    requirements: Path | None,
    image: str | None,
) -> None:
    """Check a cluster before the first job: the head node and its version, the credentials, the node
    group's nodes, each node's GPUs, Python, torch and CUDA and its mount of the share (one short job, a
    task per node), an all-reduce between two nodes (in the environment of --requirements FILE, in
    containers of --image IMAGE, when given), and the share from this machine. Exits 1 when a check
    fails."""
    from hpcjob.doctor import (
        FAIL,
        SKIP,
        Check,
        fit_nodes,
        node_check,
        probe_checks,
        probe_command,
        reach_checks,
        share_check,
    )
    from hpcjob.render import JobShape
    from hpcjob.runner import read_requirements
    from hpcjob.spec import DEFAULT_DOCKER_GPUS, HpcjobError, check_docker

    # Read first: a file that cannot be read, or an image name, is said before anything runs.
    check_docker(image, DEFAULT_DOCKER_GPUS, "")
    wanted = (
        (requirements.name, read_requirements(requirements, f"--requirements {requirements}"))
        if requirements
        else None
    )
    access = ClusterAccess(cluster_name, backend_kind)
    profile, backend = access.profile, access.backend
    mount_point = profile_mount_point(profile)
    checks: list[Check] = []
    started = time.monotonic()
    error: str | None = None
    try:
        nodes = backend.nodes(profile.node_group)
        version = backend.version()
    except HpcjobError as exc:
        error, nodes, version = " ".join(str(exc).split()), [], None
    checks += reach_checks(profile.endpoint, profile.user, version, error, time.monotonic() - started)
    if error is not None:
        checks.append(Check("nodes", SKIP, "cannot run: the head node did not answer"))
    else:
        nodes_checked, usable = node_check(nodes, profile.node_group)
        checks.append(nodes_checked)
        if usable:
            shape = JobShape(tuple(usable), profile.node_group)
            if not as_json:
                click.echo(f"hpcjob: probing {len(usable)} node(s) with a short job ...", err=True)
            try:
                _, answers = backend.run_on_nodes(
                    f"hpcjob-doctor-{int(time.time())}", probe_command(mount_point), shape, lambda line: None
                )
                checks += probe_checks(answers, profile.gpus_per_node, mount_point, profile.share)
                checks += _allreduce(access, fit_nodes(answers), mount_point, as_json, wanted, image)
            except HpcjobError as exc:
                checks.append(
                    Check("probe", FAIL, " ".join(str(exc).split()), "see `hpcjob status` of the job")
                )
    checks.append(share_check(profile.share, _share_error(access)))
    failed = [check for check in checks if check.failed]
    if as_json:
        rows = [{"check": c.name, "result": c.result, "detail": c.detail, "fix": c.fix} for c in checks]
        click.echo(json.dumps({"cluster": profile.name, "backend": backend.kind, "checks": rows}))
    else:
        _print(profile.name, backend.kind, profile.endpoint, checks, failed)
    if failed:
        raise SystemExit(1)


def _allreduce(
    access: ClusterAccess,
    fit: list[str],
    mount_point: str,
    quiet: bool,
    requirements: tuple[str, str] | None,
    image: str | None,
) -> list[Check]:
    """A 2-node all-reduce job (hpcjob/probes/allreduce.py) through the same path as `hpcjob submit`;
    with `requirements` (a file's name and text), in the job's environment built from them; with
    `image`, in containers of it, with the profile's GPUs and Docker options."""
    from hpcjob.doctor import SKIP, Check, allreduce_check, container_check, environment_check
    from hpcjob.runner import with_profile
    from hpcjob.spec import JobSpec, parse_share

    profile = access.profile
    if len(fit) < 2:
        why = "cannot run: it needs two nodes that passed the checks above"
        skipped = [Check("all-reduce", SKIP, why)]
        skipped += [Check("environment", SKIP, why)] if requirements else []
        return skipped + ([Check("container", SKIP, why)] if image else [])
    nodes = tuple(fit[:2])
    # As a job of the profile's is: its share and folder, environment and containers' settings.
    fields = with_profile({"mount_point": mount_point, "nproc_per_node": 1}, profile)
    spec = JobSpec(
        script=str(Path(__file__).resolve().parents[1] / "probes" / "allreduce.py"),
        name="hpcjob-doctor",
        node_names=nodes,
        node_group=fields.get("node_group"),
        share=parse_share(fields["share"]) if fields.get("share") else None,
        mount_point=fields["mount_point"],
        nproc_per_node=1,
        runtime_s=600 if requirements or image else 300,  # building the environment takes its time
        requirements=requirements[1] if requirements else None,
        image=image,
        **{
            key: fields[key]
            for key in ("env_on", "node_env_dir", "docker_gpus", "docker_options")
            if key in fields
        },
    )
    if not quiet:
        click.echo(f"hpcjob: an all-reduce job on {' and '.join(nodes)} ...", err=True)
    smb = (profile.smb_user, profile.smb_server, profile.smb_port)
    _, _, summary = submit_and_follow(
        access,
        spec,
        new_run_id(spec.name),
        smb,
        mount_step=False,
        wait=True,
        progress=lambda line: None,
        command=started_command(),
    )
    assert summary is not None  # waited
    cause = summary.root_cause.describe() if summary.root_cause else ""
    checks = [allreduce_check(nodes, summary.state, summary.metrics, cause)]
    if requirements:
        checks.append(environment_check(requirements[0], nodes, summary.state, summary.metrics, cause))
    if image:
        checks.append(container_check(image, nodes, summary.state, summary.metrics, cause))
    return checks


def _share_error(access: ClusterAccess) -> str | None:
    """Whether the share can be written from here (None: it can; the profile may name none)."""
    from hpcjob.spec import HpcjobError, parse_share

    profile = access.profile
    if profile.share is None:
        return None
    try:
        folder = access.share(
            parse_share(profile.share), profile.smb_user, profile.smb_server, profile.smb_port
        )
        try:
            folder.write_bytes(SHARE_PROBE_FILE, b"written by hpcjob doctor\n")
            folder.read_bytes(SHARE_PROBE_FILE)
        finally:
            folder.close()
    except (HpcjobError, OSError) as exc:
        return " ".join(str(exc).split())
    return None


def _print(name: str, kind: str, endpoint: str, checks: list[Check], failed: list[Check]) -> None:
    from hpcjob.doctor import SKIP

    width = max(len(check.name) for check in checks)
    click.echo(f"cluster {name} ({kind}, {endpoint})")
    for check in checks:
        click.echo(f"  {check.result.upper():4}  {check.name.ljust(width)}  {check.detail}")
        if check.fix and check.failed:
            click.echo(f"  {'':4}  {''.ljust(width)}  fix: {check.fix}")
    ran = [check for check in checks if check.result != SKIP]
    click.echo(f"{len(failed)} of {len(ran)} checks failed" if failed else f"all {len(ran)} checks passed")
