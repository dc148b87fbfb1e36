"""Commands that talk to a cluster through its backend: cluster, submit, status, cancel, nodes."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcjob.cli.app import cli, cluster
from hpcjob.cli.options import (
    AZURE,
    CREDENTIALS,
    FILTER,
    MAX_COST_OPTION,
    OUTPUT,
    PASS_THROUGH,
    TEXT,
    THE_CLUSTER,
    backend_option,
    cluster_option,
    headed,
    job_options,
    job_spec_of,
    named_or_newest,
    pull_after,
    pull_options,
    retries_of,
    retry_options,
    smb_options,
    started_command,
    tag_option,
)
from hpcjob.extras import missing_extra
from hpcjob.job.options import SHARE
from hpcjob.job.spec import CLUSTER_BACKENDS, MAX_RETRIES, WINRM_TRANSPORTS

if TYPE_CHECKING:
    from hpcjob.job.results import JobInfo
    from hpcjob.store.config import ClusterProfile


@cluster.command(
    "add",
    groups=headed(
        {
            THE_CLUSTER: "url user backend winrm_url winrm_transport node_group data_node_group "
            "poll_interval retries nodes_here make_default",
            CREDENTIALS: "password_env use_keyring ca_bundle insecure cert_fingerprint",
            SHARE: "share mount_point smb_user smb_server smb_port local_share",
            AZURE: "vm_size data_vm_size region spot",
        }
    ),
    epilog="""\b
    Examples:
      hpcjob cluster add lab --url https://headnode.contoso.com \\
          --user 'CONTOSO\\alice' --share //HEADNODE/CcpSpoolDir --default
      hpcjob cluster add lab-winrm --backend winrm --url https://headnode \\
          --user 'CONTOSO\\alice' --ca-bundle ca.pem --password-env LAB_PASSWORD
    """,
)
@click.argument("name")
@click.option(
    "--url",
    required=True,
    metavar="URL",
    help="The head node, e.g. https://headnode.contoso.com (/hpc is added).",
)
@click.option("--user", required=True, metavar="USER", help="User name, e.g. CONTOSO\\alice.")
@click.option("--password-env", metavar="VARIABLE", help="Read the password from this environment variable.")
@click.option("--keyring", "use_keyring", is_flag=True, help="Keep the password in the system keyring.")
@click.option("--ca-bundle", metavar="PATH", help="CA certificate(s) to trust, a PEM file.")
@click.option(
    "--insecure", is_flag=True, help="Do not verify the head node's certificate (warns on every use)."
)
@click.option("--share", metavar="UNC", help="The share folder, e.g. //HEADNODE/CcpSpoolDir/app.")
@click.option("--node-group", metavar="GROUP", help="Default node group (GPU nodes).")
@click.option("--data-node-group", metavar="GROUP", help="Default node group of --data-nodes (CPU nodes).")
@click.option(
    "--mount-point",
    metavar="PATH",
    help="Where your jobs see the share on the nodes: a folder of your own, where hpcjob's execution filter "
    "mounts it for you [default: /app/<your user name>].",
)
@click.option("--smb-user", metavar="USER", help="SMB user for the share [default: --user].")
@click.option("--smb-server", metavar="HOST", help="Reach the share here instead of its host name.")
@click.option(
    "--smb-port", type=int, metavar="PORT", default=445, show_default=True, help="SMB port."
)  # checked by the profile
@click.option(
    "--local-share",
    type=click.Path(exists=True, file_okay=False, resolve_path=True),
    metavar="DIR",
    help="The share as mounted on this machine (a drive, a CIFS mount): uploads and logs use it, not SMB.",
)
@click.option(
    "--backend",
    type=click.Choice(CLUSTER_BACKENDS),
    default="rest",
    show_default=True,
    help="How hpcjob reaches the head node. rest: the HPC Pack REST API at --url; winrm: PowerShell on "
    "the head node over WinRM (pip install 'hpcjob[winrm]').",
)
@click.option(
    "--winrm-url",
    metavar="URL",
    help="The head node's WinRM endpoint [default: https://<--url's host>:5986/wsman].",
)
@click.option(
    "--winrm-transport",
    type=click.Choice(WINRM_TRANSPORTS),
    help="How WinRM authenticates [default: ntlm] (kerberos needs pywinrm[kerberos], credssp "
    "pywinrm[credssp]).",
)
@click.option(
    "--cert-fingerprint",
    metavar="HEX",
    help="Trust exactly the head node's certificate with this SHA-256 fingerprint or SHA-1 thumbprint "
    "(a self-signed certificate, such as HPC Pack's own).",
)
@click.option(
    "--poll-interval",
    type=float,
    metavar="SECONDS",
    help="The longest wait between two looks at a job's state while it does not change, 0.1 to 300 "
    "[default: 15].",
)
@click.option(
    "--vm-size",
    metavar="SIZE",
    help="The compute nodes' Azure VM size: their NCCL settings, and the price runs are counted at.",
)
@click.option(
    "--data-vm-size",
    metavar="SIZE",
    help="The CPU data nodes' Azure VM size: the price their part of a run is counted at.",
)
@click.option(
    "--region", metavar="REGION", help="The cluster's Azure region, e.g. eastus: where prices come from."
)
@click.option("--spot", is_flag=True, help="The compute nodes are Spot VMs: counted at the Spot price.")
@click.option(
    "--retries",
    type=click.IntRange(0, MAX_RETRIES),
    metavar="N",
    help="The --retries of runs submitted to this cluster when they give none [default: 0].",
)
@click.option(
    "--nodes-here",
    is_flag=True,
    help="The cluster's nodes are all this machine (an emulated head node): jobs that name no "
    "--rdzv-port get a free port at submission, as run --local does.",
)
@click.option(
    "--default",
    "make_default",
    is_flag=True,
    help="Make this the default cluster [default: only where there is none yet].",
)
def cluster_add(
    name: str, password_env: str | None, use_keyring: bool, make_default: bool, **options: Any
) -> None:
    """Add or replace the cluster profile NAME."""
    from hpcjob.job.spec import SpecError
    from hpcjob.store.config import KEYRING_SERVICE, ClusterProfile, save_profile

    if password_env is not None and use_keyring:
        raise SpecError("choose one of --password-env and --keyring")
    # `is not None`: an empty --password-env must be refused, not taken as "prompt".
    password = f"env:{password_env}" if password_env is not None else "keyring" if use_keyring else "prompt"
    if options["ca_bundle"]:
        # The file outlives this directory: store the path from anywhere.
        options["ca_bundle"] = str(Path(options["ca_bundle"]).absolute())
    options["spot"] = options["spot"] or None  # written only when the nodes are Spot VMs
    options["nodes_here"] = options["nodes_here"] or None  # written only when they are this machine
    profile = ClusterProfile(name=name, password=password, **options)  # every check, before any prompt
    if use_keyring:
        try:
            import keyring
        except ImportError:
            raise missing_extra("keyring", "--keyring") from None
        keyring.set_password(
            KEYRING_SERVICE,
            f"{name}:{profile.user}",
            click.prompt(f"Password for {profile.user}", hide_input=True),
        )
    path = save_profile(profile, make_default)
    click.echo(f"cluster {name} saved in {path}")
    if profile.insecure:
        click.echo("hpcjob: warning: TLS verification is off for this cluster", err=True)


@cluster.command(
    "list",
    short_help="List the cluster profiles; * marks the default.",
    epilog="""\b
    Examples:
      hpcjob cluster list
      HPCJOB_CLUSTER=lab hpcjob cluster list   # * marks lab
    """,
)
def cluster_list() -> None:
    """List the cluster profiles; * marks the one used without --cluster. A cluster hpcjob onboarded
    shows its state (running or stopped, as `hpcjob cluster stop` and `start` last left it: no Azure is
    asked) and what it costs an hour in that state (~: from hpcjob's own approximate price table)."""
    from hpcjob.cli.tables import table
    from hpcjob.store.config import config_path, listed_config

    profiles, gone, chosen = listed_config()
    if not profiles:
        click.echo(
            f"no cluster configured in {config_path()}: add one with `hpcjob cluster add NAME --url ...`",
            err=True,
        )
        return
    rows = [
        (
            "*" if p.name == chosen else "",
            p.name,
            p.backend,
            p.endpoint,
            p.user,
            p.share,
            p.node_group,
            *_power_cells(p),
        )
        + ((", ".join(f"{_GONE[key][0]} missing" for key in gone.get(p.name, {})),) if gone else ())
        for p in sorted(profiles.values(), key=lambda p: p.name)
    ]
    header = ("DEFAULT", "NAME", "BACKEND", "URL", "USER", "SHARE", "NODE GROUP", "STATE", "$/H")
    for line in table(header + (("PROBLEM",) if gone else ()), rows):
        click.echo(line)
    for name, missing in sorted(gone.items()):
        click.echo(f"hpcjob: warning: cluster {name}: {_gone_fix(profiles[name], missing)}", err=True)


def _power_cells(profile: ClusterProfile) -> tuple[str | None, str | None]:
    """A cluster's STATE and $/H in `cluster list`: what stop or start recorded, and its cost an hour
    then (hpcjob.store.power); unknown for an onboarded cluster never stopped or started here, nothing
    for another."""
    from hpcjob.job.prices import money
    from hpcjob.store.power import hourly_cost, power_record

    if profile.resource_group is None:
        return None, None
    record = power_record(profile.name, profile.resource_group)
    if record is None:
        return "unknown", None
    cost = hourly_cost(record)
    shown = money(cost.total)
    for why in cost.unknown:  # a $/H of "-" says why
        click.echo(f"hpcjob: warning: cluster {profile.name}'s cost an hour: {why}", err=True)
    return f"{record.state}, as of {record.when}", (f"~{shown}" if shown and cost.approximate else shown)


# What `cluster list` says of a profile's file that is gone, and the option that gives it again.
_GONE = {"ca_bundle": ("CA file", "--ca-bundle FILE"), "local_share": ("local share", "--local-share DIR")}
# The password of the profiles the emulator prints (hpcjob.emulator.headnode.PASSWORD_ENV, not imported:
# that would load the emulator).
_EMULATOR_PASSWORD = "env:HPCJOB_EMULATOR_PASSWORD"


def _gone_fix(profile: ClusterProfile, missing: dict[str, str]) -> str:
    """What of the profile is gone, and the fix, in one line: an emulator's profile is mended by the
    emulator started again (a new CA, a new port), another by its files put back or given again."""
    what = " and ".join(f"{_GONE[key][0]} {path}" for key, path in missing.items())
    if profile.password == _EMULATOR_PASSWORD:
        # The emulator prints the lines of profile NAME and NAME-winrm (--profile, default emulator).
        name = profile.name.removesuffix("-winrm") if profile.backend == "winrm" else profile.name
        start = ["hpcjob", "emulator", "--user", profile.user] + (
            ["--profile", name] if name != "emulator" else []
        )
        fix = f"start `{shlex.join(start)}` again and run the `hpcjob cluster add` line it prints"
    else:
        again = " ".join(_GONE[key][1] for key in missing)
        fix = f"put it back, or add the profile again: `hpcjob cluster add {profile.name} --url ... {again}`"
    return f"{what} {'is' if len(missing) == 1 else 'are'} gone; {fix}"


@cluster.command(
    "remove",
    epilog="""\b
    Examples:
      hpcjob cluster remove lab
    """,
)
@click.argument("name")
def cluster_remove(name: str) -> None:
    """Remove the cluster profile NAME."""
    from hpcjob.store.config import remove_profile

    remove_profile(name)
    click.echo(f"cluster {name} removed")


@cli.command(
    context_settings=PASS_THROUGH,
    short_help="Submit SCRIPT to an HPC Pack cluster.",
    groups={"wait": OUTPUT, "dry_run": OUTPUT, "mount_step": SHARE},
    epilog="""\b
    Examples:
      hpcjob submit -n 2 --gpus-per-node 4 --wait train.py --epochs 1
      hpcjob submit --cluster lab --dry-run --node GPU1 --node GPU2 train.py
    """,
)
@cluster_option
@backend_option
@click.option("--wait", is_flag=True, help="Show progress until the job ends; exit with its exit code.")
@click.option("--dry-run", is_flag=True, help="Print the job that would be submitted, and send nothing.")
@click.option(
    "--mount-step/--no-mount-step",
    default=True,
    show_default=True,
    help="Mount the share on the nodes first, as root (needs an HPC administrator).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the run and job id as JSON, with --wait the summary (the fields of `run --local --json`); "
    "progress to stderr.",
)
@smb_options
@tag_option
@pull_options
@retry_options
@job_options
def submit(
    cluster_name: str | None,
    backend_kind: str | None,
    wait: bool,
    dry_run: bool,
    mount_step: bool,
    as_json: bool,
    tag_items: tuple[str, ...],
    pull: bool,
    pull_to: str | None,
    **params: Any,
) -> None:
    """Submit SCRIPT to an HPC Pack cluster, over its REST API or WinRM as the profile says.

    Chooses the nodes (--node, else idle online healthy nodes of --node-group), uploads the script's
    folder to the share, mounts the share on the nodes, creates the job from the job XML and submits
    it. Prints the job id; with --wait, follows it to the end, and with --pull copies its results here.
    """
    from hpcjob.job.spec import SpecError, parse_tags
    from hpcjob.runner import (
        ClusterAccess,
        StoppedWaiting,
        new_run_id,
        pull_target,
        smb_access,
        submit_and_follow,
        submit_preview,
    )
    from hpcjob.store.config import get_profile
    from hpcjob.store.runs import check_new_run_id

    tags = parse_tags(tag_items)
    if (pull or pull_to is not None) and not wait:
        raise SpecError("--pull needs --wait: the results come home when the run ends (or `hpcjob pull RUN`)")
    if pull_to is not None:  # a file in its place is refused before the run, not after it
        pull_target(pull_to, "", "--pull-to")
    profile = get_profile(cluster_name)
    spec = job_spec_of(params, profile)
    retries = retries_of(params, profile)  # its mistakes before anything is sent
    run_id = params["run_id"] or new_run_id(spec.name)
    check_new_run_id(run_id)
    if dry_run:
        click.echo(submit_preview(spec, run_id, mount_step=mount_step))
        return

    cluster = ClusterAccess(cluster_name, backend_kind)

    def progress(line: str) -> None:
        click.echo(line, err=as_json)

    smb = smb_access(params["smb_user"], params["smb_server"], params["smb_port"], profile)
    try:
        record, _, summary = submit_and_follow(
            cluster,
            spec,
            run_id,
            smb,
            mount_step=mount_step,
            wait=wait,
            progress=progress,
            command=started_command(),
            tags=tags,
            retries=retries,
        )
    except StoppedWaiting as stopped:
        progress(str(stopped))
        sys.exit(130)
    if summary is None:
        if as_json:
            click.echo(json.dumps({"run_id": run_id, "job_id": record.job_id, "cluster": record.cluster}))
        return
    from hpcjob.cli.tables import format_summary

    click.echo(summary.to_json() if as_json else format_summary(summary))
    if pull or pull_to is not None:
        sys.exit(pull_after(summary, pull_to, progress))
    sys.exit(summary.exit_code)


@cli.command(
    short_help="The state of a job and of each of its tasks.",
    epilog="""\b
    Examples:
      hpcjob status                # this machine's newest run
      hpcjob status 42 --json      # HPC Pack job 42
    """,
)
@click.argument("job", metavar="[JOB]", required=False)
@cluster_option
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(job: str | None, cluster_name: str | None, backend_kind: str | None, as_json: bool) -> None:
    """The state of JOB and of each of its tasks: an HPC Pack job id, or a run id (of a job submitted
    from this machine, or of a `run --local` in another shell) [default: this machine's newest run]."""
    from hpcjob.runner import run_of, run_status

    record = run_of(named_or_newest(job), cluster_name, backend_kind)
    info, latest = run_status(record, cluster_name, backend_kind)
    # A bare job id (not submitted from here) has no record: its name is hpcjob's run id.
    _print_status(info, record.run_id if record.job_folder else info.name, as_json, latest)


def _print_status(info: JobInfo, run_id: str, as_json: bool, latest: dict[str, Any] | None = None) -> None:
    """The job and its tasks; `latest`: a running job's newest line of metrics over time."""
    exit_code = info.exit_code() if info.ended else None
    if as_json:
        data: dict[str, Any] = {
            "job_id": info.job_id,
            "run_id": run_id,
            "name": info.name,
            "state": info.state,
            "error": info.error,
            "exit_code": exit_code,
            "tasks": [
                {
                    "task_id": t.task_id,
                    "name": t.name,  # its role and node: "torchrun NODE" or "data NODE"
                    "node": t.node,
                    "state": t.state,
                    "exit_code": t.exit_code,
                    "error": t.error,
                }
                for t in info.tasks
            ],
        }
        if info.gpu_use:
            data["gpu_use"] = [dataclasses.asdict(use) for use in info.gpu_use]
        if latest is not None:
            data["latest"] = latest
        click.echo(json.dumps(data))
        return
    line = f"job {info.job_id} ({info.name}) {info.state}"
    if exit_code is not None:
        line += f", exit code {exit_code}"
    click.echo(line + (f": {' '.join(info.error.split())}" if info.error else ""))
    if not info.tasks:
        return
    from hpcjob.cli.tables import table

    # A task's exit code is None until it has ended: the REST API says 0 before.
    rows = [
        (t.task_id, t.node or t.name, t.state, t.exit_code, " ".join(t.error.split())) for t in info.tasks
    ]
    for row in table(("TASK", "NODE", "STATE", "EXIT CODE", "ERROR"), rows):
        click.echo(row)
    if latest is not None:
        from hpcjob.cli.tables import latest_line

        click.echo(latest_line(latest, time.time()))
    if info.gpu_use:
        from hpcjob.cli.tables import gpu_table

        for row in gpu_table(info.gpu_use, now=not info.ended):
            click.echo(row)


@cli.command(
    short_help="Follow a run of this machine to its end, its attempts too.",
    epilog="""\b
    Examples:
      hpcjob wait                  # this machine's newest run
      hpcjob wait train-20261125-101500-ab12 --max-cost 50 --json
    """,
)
@click.argument("run", metavar="[RUN]", required=False)
@MAX_COST_OPTION
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as JSON (the fields of `run --local --json`); progress to stderr.",
)
def wait(run: str | None, max_cost: float | None, as_json: bool) -> None:
    """Follow RUN (a run id, or the job id of its newest attempt) to its end, as `submit --wait` does:
    its newest attempt, and the attempts after it as the run's --retries say; print its summary and
    exit with its exit code [default: this machine's newest run]. It takes up a run whose follower was
    stopped (a closed laptop, a lost connection), or one submitted without --wait. One follower at a
    time: while another hpcjob follows the run, this one says which and exits 1, starting nothing. Only
    the machine that started a run holds its history, and so can follow it.
    """
    from hpcjob.cli.tables import format_summary
    from hpcjob.runner import StoppedWaiting, take_up

    run_id = named_or_newest(run)

    def progress(line: str) -> None:
        click.echo(line, err=as_json)

    try:
        _, summary = take_up(run_id, progress, command=started_command(), max_cost_usd=max_cost)
    except StoppedWaiting as stopped:
        progress(str(stopped))
        sys.exit(130)
    click.echo(summary.to_json() if as_json else format_summary(summary))
    sys.exit(summary.exit_code)


@cli.command(
    short_help="Cancel a job, or a run of this machine.",
    epilog="""\b
    Examples:
      hpcjob cancel                # this machine's newest run
      hpcjob cancel 42 --force     # HPC Pack job 42, without the grace period
    """,
)
@click.argument("job", metavar="[JOB]", required=False)
@cluster_option
@backend_option
@click.option("--force", is_flag=True, help="Kill the tasks at once, without the grace period.")
def cancel(job: str | None, cluster_name: str | None, backend_kind: str | None, force: bool) -> None:
    """Cancel JOB (a job id, or a run id, also of a `run --local` in another shell) [default: this
    machine's newest run]. Canceling a job that has already ended, or is being canceled, is not an error."""
    from hpcjob.runner import cancel_run, run_of

    record = run_of(named_or_newest(job), cluster_name, backend_kind)
    shown = f"job {record.job_id}" if record.cluster and record.job_id else f"run {record.run_id}"
    already = cancel_run(record, cluster_name, backend_kind, force=force)
    if already is None:
        click.echo(f"{shown} canceled")
    elif already == "Canceling":
        click.echo(f"{shown} was already being canceled (Canceling)")
    else:
        click.echo(f"{shown} had already ended ({already})")


@cli.command(
    short_help="The cluster's nodes: state, health, use, cores, GPUs.",
    epilog="""\b
    Examples:
      hpcjob nodes                 # the profile's node group
      hpcjob nodes --all-groups --json
    """,
)
@cluster_option
@backend_option
@click.option("--group", metavar="GROUP", help="Only the nodes of this group [default: the profile's].")
@click.option("--all-groups", is_flag=True, help="All nodes, whatever the profile's group.")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
def nodes(
    cluster_name: str | None, backend_kind: str | None, group: str | None, all_groups: bool, as_json: bool
) -> None:
    """The cluster's nodes: state, health, whether a running job holds them, cores, GPUs (where the head
    node reports them: HPC Pack 2019's node model has no GPU count) and groups."""
    from hpcjob.job.spec import GROUP_NAME, SpecError
    from hpcjob.runner import ClusterAccess
    from hpcjob.store.config import get_profile

    profile = get_profile(cluster_name)
    group = None if all_groups else group or profile.node_group
    if group is not None and not GROUP_NAME.fullmatch(group):
        raise SpecError(f"--group {group!r} is not a valid node group name")
    backend = ClusterAccess(cluster_name, backend_kind).backend
    found, busy = backend.nodes(group), backend.busy_nodes()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": n.name,
                        "state": n.state,
                        "health": n.health,
                        "cores": n.cores,
                        "gpus": n.gpus,
                        "groups": list(n.groups),
                        "busy": n.name.upper() in busy,
                    }
                    for n in found
                ]
            )
        )
        return
    from hpcjob.cli.tables import table

    rows = [
        (
            n.name,
            n.state,
            n.health,
            "busy" if n.name.upper() in busy else "idle",
            n.cores,
            n.gpus,
            ",".join(n.groups),
        )
        for n in found
    ]
    for line in table(("NODE", "STATE", "HEALTH", "USE", "CORES", "GPUS", "GROUPS"), rows):
        click.echo(line)


@cli.command(
    short_help="Mount the share on the nodes, with your own credentials.",
    groups=headed(
        {
            FILTER: "install mount_options allow_images allow_docker_options allow_volumes local_disks",
            OUTPUT: "dry_run",
        }
    ),
    epilog="""\b
    Examples:
      hpcjob mount --install --allow-image nvcr.io/nvidia/  # an administrator
      hpcjob mount                                          # any user, for them
      hpcjob mount --node GPU1 --dry-run                    # send nothing
    """,
)
@cluster_option
@backend_option
@click.option(
    "--node",
    "node_names",
    multiple=True,
    metavar="NAME",
    help="A node to mount on, repeatable [default: every online node of --node-group].",
)
@click.option("--node-group", type=TEXT, metavar="GROUP", help="The nodes' group [default: the profile's].")
@click.option("--share", type=TEXT, metavar="UNC", help="The share [default: the profile's].")
@click.option(
    "--mount-point",
    type=TEXT,
    metavar="PATH",
    help="Where your jobs see the share on the nodes, MOUNT ROOT/<your user name>; --install allows that "
    "MOUNT ROOT for every user [default: the profile's, else /app/<your user name>].",
)
@click.option(
    "--mount-options",
    type=TEXT,
    metavar="OPTS",
    help="With --install: the mount.cifs options the filter uses, from its short list (vers=, sec=, "
    "cache=, seal, ...) [default: vers=3.0].",
)
@click.option(
    "--install",
    is_flag=True,
    help="First install hpcjob's execution filter on the nodes, as root (an HPC administrator, once).",
)
@click.option(
    "--allow-image",
    "allow_images",
    multiple=True,
    metavar="PREFIX",
    help="With --install: a container policy for every job on the nodes; tasks may run only images that "
    "start with PREFIX, a registry or repository ending in / (repeatable, e.g. nvcr.io/nvidia/). Without "
    "it, containers run as the agent allows.",
)
@click.option(
    "--allow-docker-option",
    "allow_docker_options",
    multiple=True,
    metavar="OPTION",
    help="With --allow-image: a `docker run` option tasks may use, written as one argument "
    "(--allow-docker-option=--shm-size=16g, --allow-docker-option='--ulimit memlock=-1'); repeatable; "
    "given, the list replaces hpcjob's own, which then must be named too [default: what hpcjob's own "
    "containers use].",
)
@click.option(
    "--allow-volume",
    "allow_volumes",
    multiple=True,
    metavar="PATH[:ro]",
    help="With --allow-image: a host folder tasks may mount at the same path (and below it); :ro only "
    "read-only; repeatable; given, the list replaces the default [default: the mount root, /home, the "
    "host's users and topology files read-only].",
)
@click.option(
    "--local-disks",
    type=TEXT,
    metavar="PATH",
    help="With --install: at each job's start on a node, its free NVMe disks (no partition, file system "
    "or mount) become one RAID 0 volume mounted at PATH, once; `none`: left alone [default: /mnt/nvme "
    "where the profile's vm_size has NVMe disks].",
)
@click.option("--dry-run", is_flag=True, help="Print what would run on the head node, and send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print each node's result as JSON.")
def mount(
    cluster_name: str | None,
    backend_kind: str | None,
    node_names: tuple[str, ...],
    node_group: str | None,
    share: str | None,
    mount_point: str | None,
    mount_options: str | None,
    install: bool,
    allow_images: tuple[str, ...],
    allow_docker_options: tuple[str, ...],
    allow_volumes: tuple[str, ...],
    local_disks: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Mount the share on the nodes for you, at MOUNT ROOT/<your user name>, with your own credentials
    and no password on any node, command line or job: a job of yours whose start on each node has
    hpcjob's execution filter mount it as root, with the credentials the node agent gives it. The
    filter mounts only what an HPC administrator allowed with --install (the share, the mount point,
    the options), each user at a folder of their own that only they can enter. A node where it is
    mounted is left alone. Reports each node: mounted, already mounted, or failed with the node's words;
    exits 1 when a node failed. Jobs that hpcjob submits mount it the same way on every node they start
    on, after a reboot too.
    """
    from hpcjob.job.spec import SpecError
    from hpcjob.runner import ClusterAccess, mount_preview, mount_request, mount_share
    from hpcjob.store.config import get_profile

    if (allow_images or allow_docker_options or allow_volumes or local_disks) and not install:
        raise SpecError(
            "--allow-image, --allow-docker-option, --allow-volume and --local-disks go with --install"
        )
    request = mount_request(
        get_profile(cluster_name), share, mount_point, mount_options, node_group, node_names,
        allow_images, allow_docker_options, allow_volumes, local_disks,
    )  # fmt: skip
    if dry_run:
        click.echo(mount_preview(request, install=install))
        return
    results = mount_share(
        ClusterAccess(cluster_name, backend_kind),
        request,
        install=install,
        progress=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps([{"node": r.node, "result": r.outcome, "message": r.message} for r in results]))
    else:
        from hpcjob.cli.tables import mount_lines

        for line in mount_lines(results):
            click.echo(line)
    if not all(r.ok for r in results):
        sys.exit(1)


@cli.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    short_help="A local HPC Pack head node for tests (REST API, WinRM).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def emulator(args: tuple[str, ...]) -> None:
    """A local HPC Pack head node for tests: the REST API, tasks run here (--help for its options)."""
    from hpcjob.emulator.cli import main as emulator_main

    sys.exit(emulator_main(list(args)))
