"""Commands that talk to a cluster over the HPC Pack REST API: cluster, submit, status, cancel, nodes."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import PASS_THROUGH, TEXT, build_spec, job_options, new_run_id, smb_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from hpcjob.backends.rest import RestClient
    from hpcjob.config import ClusterProfile
    from hpcjob.results import JobInfo
    from hpcjob.runs import RunRecord
    from hpcjob.share import ShareFolder
    from hpcjob.spec import JobSpec, Share

cluster_option = click.option(
    "--cluster",
    "cluster_name",
    type=TEXT,
    metavar="NAME",
    help="Cluster profile [default: $HPCJOB_CLUSTER, else the configured default].",
)


def connect(profile: ClusterProfile, password: str | None = None) -> RestClient:
    from hpcjob.backends.rest import RestClient
    from hpcjob.config import password_for

    if profile.insecure:
        click.echo(
            f"hpcjob: warning: TLS verification is off for cluster {profile.name}: anyone on the way can "
            "read the password",
            err=True,
        )
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # warned once, above
    return RestClient(
        profile.api_base, profile.user, password or password_for(profile), verify=profile.verify
    )


@cli.group()
def cluster() -> None:
    """Cluster profiles: the head node's URL, user, TLS, share and node group (never a password)."""


@cluster.command("add")
@click.argument("name")
@click.option(
    "--url", required=True, help="The head node, e.g. https://headnode.contoso.com (/hpc is added)."
)
@click.option("--user", required=True, help="User name, e.g. CONTOSO\\alice.")
@click.option("--password-env", metavar="VARIABLE", help="Read the password from this environment variable.")
@click.option("--keyring", "use_keyring", is_flag=True, help="Keep the password in the system keyring.")
@click.option("--ca-bundle", metavar="PATH", help="CA certificate(s) to trust, a PEM file.")
@click.option(
    "--insecure", is_flag=True, help="Do not verify the head node's certificate (warns on every use)."
)
@click.option("--share", metavar="UNC", help="The share folder, e.g. //HEADNODE/CcpSpoolDir/app.")
@click.option("--node-group", metavar="GROUP", help="Default node group (GPU nodes).")
@click.option("--mount-point", metavar="PATH", help="Where the nodes mount the share [default: /app].")
@click.option("--smb-user", metavar="USER", help="SMB user for the share [default: --user].")
@click.option("--smb-server", metavar="HOST", help="Reach the share here instead of its host name.")
@click.option("--smb-port", type=int, default=445, show_default=True)  # checked by the profile
@click.option(
    "--local-share",
    type=click.Path(exists=True, file_okay=False, resolve_path=True),
    metavar="DIR",
    help="The share as mounted on this machine (a drive, a CIFS mount): uploads and logs use it, not SMB.",
)
@click.option("--default", "make_default", is_flag=True, help="Make this the default cluster.")
def cluster_add(
    name: str, password_env: str | None, use_keyring: bool, make_default: bool, **options: Any
) -> None:
    """Add or replace the cluster profile NAME."""
    from hpcjob.config import KEYRING_SERVICE, ClusterProfile, save_profile
    from hpcjob.spec import SpecError

    if password_env is not None and use_keyring:
        raise SpecError("choose one of --password-env and --keyring")
    # `is not None`: an empty --password-env must be refused, not taken as "prompt".
    password = f"env:{password_env}" if password_env is not None else "keyring" if use_keyring else "prompt"
    if options["ca_bundle"]:
        # The file outlives this directory: store the path from anywhere.
        options["ca_bundle"] = str(Path(options["ca_bundle"]).absolute())
    profile = ClusterProfile(name=name, password=password, **options)  # every check, before any prompt
    if use_keyring:
        try:
            import keyring
        except ImportError:
            raise SpecError("--keyring needs the keyring package: pip install keyring") from None
        keyring.set_password(
            KEYRING_SERVICE,
            f"{name}:{profile.user}",
            click.prompt(f"Password for {profile.user}", hide_input=True),
        )
    path = save_profile(profile, make_default)
    click.echo(f"cluster {name} saved in {path}")
    if profile.insecure:
        click.echo("hpcjob: warning: TLS verification is off for this cluster", err=True)


@cluster.command("list")
def cluster_list() -> None:
    """List the cluster profiles; * marks the one used without --cluster."""
    from hpcjob.cli.tables import table
    from hpcjob.config import config_path, load_config

    profiles, chosen = load_config()
    if not profiles:
        click.echo(
            f"no cluster configured in {config_path()}: add one with `hpcjob cluster add NAME --url ...`",
            err=True,
        )
        return
    rows = [
        ("*" if p.name == chosen else "", p.name, p.api_base, p.user, p.share, p.node_group)
        for p in sorted(profiles.values(), key=lambda p: p.name)
    ]
    for line in table(("DEFAULT", "NAME", "URL", "USER", "SHARE", "NODE GROUP"), rows):
        click.echo(line)


@cluster.command("remove")
@click.argument("name")
def cluster_remove(name: str) -> None:
    """Remove the cluster profile NAME."""
    from hpcjob.config import remove_profile

    remove_profile(name)
    click.echo(f"cluster {name} removed")


def _spec_with_profile(params: dict[str, Any], profile: ClusterProfile) -> JobSpec:
    """Job options win; the profile fills in the share, node group and mount point."""
    for key, value in (
        ("share", profile.share),
        ("node_group", profile.node_group),
        ("mount_point", profile.mount_point),
        ("smb_server", profile.smb_server),
    ):
        if not params.get(key) and value:
            params[key] = value
    if params.get("smb_port") == 445 and profile.smb_port != 445:
        params["smb_port"] = profile.smb_port
    return build_spec(params)


def _open_share(
    share: Share, profile: ClusterProfile, rest_password: str, user: str | None, server: str | None, port: int
) -> ShareFolder:
    from hpcjob.credentials import smb_password
    from hpcjob.share import LocalFolder, SmbFolder

    if profile.local_share:  # mounted here: no SMB session, no password
        return LocalFolder(Path(profile.local_share))
    user = user or profile.smb_user or profile.user
    # Usually the same domain account as the REST API's; ask only for another user's password.
    password = rest_password if user == profile.user else smb_password(user)
    return SmbFolder(share, user, password, server=server, port=port)


@cli.command(context_settings=PASS_THROUGH)
@cluster_option
@click.option("--wait", is_flag=True, help="Show progress until the job ends; exit with its exit code.")
@click.option("--dry-run", is_flag=True, help="Print what would be sent, and send nothing.")
@click.option(
    "--mount-step/--no-mount-step",
    default=True,
    show_default=True,
    help="Mount the share on the nodes first, with an admin job (needs an HPC administrator).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --wait, print the summary as JSON (the fields of `run --local --json`); progress to stderr.",
)
@smb_options
@job_options
def submit(
    cluster_name: str | None, wait: bool, dry_run: bool, mount_step: bool, as_json: bool, **params: Any
) -> None:
    """Submit SCRIPT to an HPC Pack cluster over its REST API.

    Chooses the nodes (--node, else idle online healthy nodes of --node-group), uploads the script's
    folder to the share, mounts the share on the nodes, creates the job from the job XML and submits
    it. Prints the job id; with --wait, follows it to the end.
    """
    from dataclasses import replace

    from hpcjob.backends.rest import Submission, check_new_job_names, choose_nodes, submit_job, wait_for_job
    from hpcjob.config import get_profile, password_for
    from hpcjob.plan import make_plan
    from hpcjob.render import job_xml, mount_job_xml
    from hpcjob.runs import RunRecord, check_new_run_id, save_run
    from hpcjob.spec import SpecError
    from hpcjob.staging import code_files, stage_run

    profile = get_profile(cluster_name)
    spec = _spec_with_profile(params, profile)
    run_id = params["run_id"] or new_run_id(spec.name)
    check_new_run_id(run_id)
    code_dir = Path(spec.script).resolve().parent
    if dry_run:
        if not spec.node_names:
            raise SpecError("--dry-run asks the cluster nothing: name the nodes with --node")
        plan = make_plan(spec, spec.node_names, run_id)
        files = list(code_files(code_dir))
        base = profile.api_base
        if spec.share:
            click.echo(
                f"# would upload {len(files)} file(s), {sum(f.size for f in files)} bytes, from {code_dir} "
                f"to {spec.share.unc}/{spec.job_folder} (unchanged files are skipped)"
            )
        if mount_step and plan.mount:
            click.echo(f"# would create the mount job: POST {base}/jobs/jobFile\n{mount_job_xml(plan)}")
            click.echo(f"# would submit it: POST {base}/jobs/<id>/submit, and wait for it to finish")
        click.echo(f"# would create the job: POST {base}/jobs/jobFile\n{job_xml(plan)}")
        click.echo(f"# would submit it: POST {base}/jobs/<id>/submit")
        return

    rest_password = password_for(profile)
    client = connect(profile, rest_password)
    group = spec.node_group
    nodes = spec.node_names or choose_nodes(
        client.nodes(group), spec.node_count, client.busy_nodes(), group, spec.exclude_nodes
    )
    plan = make_plan(spec, nodes, run_id)
    mount = (mount_job_xml(plan), plan.mount.mount_point) if mount_step and plan.mount else None
    check_new_job_names(client, plan.run_id, mount is not None, profile.name)  # before the upload

    def progress(line: str) -> None:
        click.echo(line, err=as_json)

    def open_share() -> ShareFolder:
        assert spec.share is not None
        return _open_share(
            spec.share,
            profile,
            rest_password,
            params.get("smb_user"),
            params.get("smb_server"),
            params["smb_port"],
        )

    if spec.share:
        progress(stage_run(code_dir, open_share(), spec.job_folder, plan.run_id))
    else:
        progress("hpcjob: warning: no --share: the code must already be in the job folder on the nodes")
    first = RunRecord.of(
        plan,
        spec.job_folder,
        "rest",
        share=spec.share.unc if spec.share else None,
        local_root=profile.local_share,
        smb_server=params.get("smb_server"),
        smb_port=params["smb_port"],
        smb_user=params.get("smb_user") or profile.smb_user or profile.user,
        cluster=profile.name,
    )

    def record(step: Submission) -> None:
        job, mount_job = (None if i is None else str(i) for i in (step.job_id, step.mount_job_id))
        save_run(replace(first, state=step.state, job_id=job, mount_job_id=mount_job))

    check_new_run_id(plan.run_id)  # again: another submit may have taken it during the upload
    started = time.monotonic()
    job_id = submit_job(
        client, plan.run_id, job_xml(plan), mount, progress, cluster=profile.name, record=record
    )
    progress(f"submitted job {job_id} (run {plan.run_id}) to {profile.name} on {', '.join(plan.nodes)}")
    if not wait:
        progress(f"follow it with: hpcjob status {job_id}   or: hpcjob logs {job_id} --follow")
        return
    try:
        info = wait_for_job(client, job_id, progress)
    except KeyboardInterrupt:
        progress(f"stopped waiting; job {job_id} goes on (hpcjob cancel {job_id} ends it)")
        sys.exit(130)
    # The scheduler knows the tasks' states; the share which rank failed first, and the metrics.
    from hpcjob.backends.rest import job_summary
    from hpcjob.cli.tables import format_summary
    from hpcjob.share import ShareError

    folder = None
    if spec.share:
        try:
            folder = open_share()
        except ShareError as exc:
            progress(f"hpcjob: warning: {exc}: the summary has only what the scheduler knows")
    try:
        summary = job_summary(
            info, plan, time.monotonic() - started, folder, f"{spec.job_folder}/logs/{plan.run_id}"
        )
    finally:
        if folder is not None:
            folder.close()
    click.echo(summary.to_json() if as_json else format_summary(summary))
    sys.exit(summary.exit_code)


def rest_log_access(
    record: RunRecord, params: dict[str, Any]
) -> tuple[ShareFolder | None, Callable[[], int | None]]:
    """For `hpcjob logs` of a submitted job: the share, and the scheduler's word on the job's end.

    When the share cannot be reached, prints each task's Output from the scheduler instead (HPC Pack
    keeps only its first bytes: 1500 on Linux nodes) and returns no folder.
    """
    from hpcjob.config import get_profile, password_for
    from hpcjob.share import LocalFolder, ShareError
    from hpcjob.spec import SpecError, parse_share

    profile = get_profile(record.cluster)
    password = password_for(profile)
    client = connect(profile, password)
    job_id = int(record.job_id) if record.job_id is not None else client.find_job(record.run_id)
    if job_id is None:
        raise SpecError(
            f"run {record.run_id} has no job on cluster {profile.name}: its submission stopped before "
            "the job was made, so it has no logs"
        )

    def scheduler_end() -> int | None:
        assert job_id is not None
        return client.job_with_tasks(job_id).exit_code() if client.job(job_id).ended else None

    if record.local_root:
        return LocalFolder(Path(record.local_root)), scheduler_end
    if not record.share:
        click.echo(
            f"hpcjob: warning: run {record.run_id} was submitted without a share, so hpcjob cannot read "
            "its log files; showing the scheduler's copy of each task's output, which holds only its "
            "first 1500 bytes (give the share with `hpcjob logs --share UNC --job-folder PATH`, or add "
            f"it to cluster {profile.name})",
            err=True,
        )
    else:
        try:
            folder = _open_share(
                parse_share(record.share),
                profile,
                password,
                params.get("smb_user") or record.smb_user,
                params.get("smb_server") or record.smb_server,
                record.smb_port or params["smb_port"],
            )
            return folder, scheduler_end
        except ShareError as exc:
            click.echo(
                f"hpcjob: warning: {exc}; showing the scheduler's copy of each task's output, "
                "which holds only its first 1500 bytes",
                err=True,
            )
    printed = False
    for task in client.job_with_tasks(job_id).tasks:
        for line in client.task_output(job_id, task.task_id).splitlines():
            click.echo(f"[{task.node}] {line}")
            printed = True
    if not printed:
        click.echo(f"hpcjob: job {job_id}: the scheduler holds no output of its tasks", err=True)
    return None, scheduler_end


def _job_id(job: str) -> int | None:
    """JOB as an HPC Pack job id (ASCII digits, at least 1), or None when it is a run id."""
    from hpcjob.spec import SpecError

    if not re.fullmatch(r"[0-9]+", job):
        if job.isdigit():  # '²' is a digit to Python, and no job id
            raise SpecError(f"job {job!r} is neither a job id (0-9) nor a run id")
        return None
    if int(job) < 1:
        raise SpecError(f"job id {job} must be at least 1")
    return int(job)


def _client_for(job: str, cluster_name: str | None) -> tuple[RestClient, int]:
    """The cluster and job id of JOB: a job id, or a run id recorded on this machine."""
    from hpcjob.config import get_profile
    from hpcjob.runs import find_run
    from hpcjob.spec import SpecError

    if _job_id(job) is not None:
        if cluster_name is None:
            with contextlib.suppress(SpecError):  # not submitted from here: the default cluster
                cluster_name = find_run(job).cluster
        return connect(get_profile(cluster_name)), int(job)
    record = find_run(job)
    if record.job_id is None and record.backend != "rest":
        raise SpecError(f"run {job} was not submitted to a cluster")
    profile = get_profile(cluster_name or record.cluster)
    client = connect(profile)
    if record.job_id is not None:
        return client, int(record.job_id)
    # Recorded before its job was created: a create whose answer was lost made it all the same.
    found = client.find_job(record.run_id)
    if found is None:
        raise SpecError(
            f"run {job} has no job on cluster {profile.name}: its submission stopped before the job was made"
        )
    return client, found


@cli.command()
@click.argument("job", metavar="JOB")
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(job: str, cluster_name: str | None, as_json: bool) -> None:
    """The state of JOB and of each of its tasks: an HPC Pack job id, or a run id (of a job submitted
    from this machine, or of a `run --local` in another shell)."""
    local = _local_run(job)
    if local is not None:
        _print_local_status(local, as_json)
        return
    client, job_id = _client_for(job, cluster_name)
    _print_status(client.job_with_tasks(job_id), as_json)


def _local_run(job: str) -> RunRecord | None:
    from hpcjob.runs import find_run
    from hpcjob.spec import SpecError

    if _job_id(job) is not None:
        return None
    try:
        record = find_run(job)
    except SpecError:
        return None
    return record if record.backend == "local" else None


def _print_local_status(record: RunRecord, as_json: bool) -> None:
    from hpcjob.backends.local import local_status
    from hpcjob.cli.tables import format_summary, table
    from hpcjob.logs import RunLogs
    from hpcjob.share import LocalFolder

    assert record.local_root is not None
    log_dir = Path(record.local_root) / record.log_folder
    summary = local_status(log_dir, record.pid, record.pid_start)
    if summary is not None:
        click.echo(summary.to_json() if as_json else format_summary(summary))
        return
    ended = RunLogs(LocalFolder(log_dir), "", record.nodes).exit_codes()
    nodes = [(node, *_node_state(ended.get(node.upper()))) for node in record.nodes]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "run_id": record.run_id,
                    "state": "Running",
                    "nodes": [{"node": n, "state": s, "exit_code": c} for n, s, c in nodes],
                }
            )
        )
        return
    click.echo(f"run {record.run_id} ({record.name}, local, process {record.pid}) Running")
    for line in table(("NODE", "STATE", "EXIT CODE"), nodes, indent="  "):
        click.echo(line)


def _node_state(code: int | None) -> tuple[str, int | None]:
    return ("Running", None) if code is None else ("Finished" if code == 0 else "Failed", code)


def _print_status(info: JobInfo, as_json: bool, exit_code: int | None = None) -> None:
    if exit_code is None and info.ended:
        exit_code = info.exit_code()
    if as_json:
        data = {
            "job_id": info.job_id,
            "name": info.name,
            "state": info.state,
            "error": info.error,
            "exit_code": exit_code,
            "tasks": [
                {
                    "task_id": t.task_id,
                    "node": t.node,
                    "state": t.state,
                    "exit_code": t.exit_code,
                    "error": t.error,
                }
                for t in info.tasks
            ],
        }
        click.echo(json.dumps(data))
        return
    line = f"job {info.job_id} ({info.name}) {info.state}"
    if exit_code is not None:
        line += f", exit code {exit_code}"
    click.echo(line + (f": {' '.join(info.error.split())}" if info.error else ""))
    if not info.tasks:
        return
    from hpcjob.cli.tables import table

    # A task's exit code is None until it has ended (job_with_tasks): the API says 0 before.
    rows = [
        (t.task_id, t.node or t.name, t.state, t.exit_code, " ".join(t.error.split())) for t in info.tasks
    ]
    for row in table(("TASK", "NODE", "STATE", "EXIT CODE", "ERROR"), rows):
        click.echo(row)


@cli.command()
@click.argument("job", metavar="JOB")
@cluster_option
@click.option("--force", is_flag=True, help="Kill the tasks at once, without the grace period.")
def cancel(job: str, cluster_name: str | None, force: bool) -> None:
    """Cancel JOB (a job id, or a run id, also of a `run --local` in another shell). Canceling a job
    that has already ended, or is being canceled, is not an error."""
    local = _local_run(job)
    if local is not None:
        _cancel_local_run(local)
        return
    client, job_id = _client_for(job, cluster_name)
    already = client.cancel(job_id, "Canceled by hpcjob", forced=force)
    if already is None:
        click.echo(f"job {job_id} canceled")
    elif already == "Canceling":
        click.echo(f"job {job_id} was already being canceled (Canceling)")
    else:
        click.echo(f"job {job_id} had already ended ({already})")


def _cancel_local_run(record: RunRecord) -> None:
    """As Ctrl-C in the run's own shell: SIGTERM to its hpcjob, which stops the nodes; wait for it."""
    from hpcjob.backends.local import cancel_local, local_status, running_process

    if not cancel_local(record.pid, record.pid_start):
        assert record.local_root is not None
        summary = local_status(Path(record.local_root) / record.log_folder, record.pid, record.pid_start)
        click.echo(f"run {record.run_id} had already ended ({summary.state if summary else 'unknown'})")
        return
    click.echo(f"run {record.run_id}: stopping its nodes (process {record.pid})", err=True)
    while running_process(record.pid, record.pid_start):
        time.sleep(0.2)
    click.echo(f"run {record.run_id} canceled")


@cli.command()
@cluster_option
@click.option("--group", metavar="GROUP", help="Only the nodes of this group [default: the profile's].")
@click.option("--all-groups", is_flag=True, help="All nodes, whatever the profile's group.")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
def nodes(cluster_name: str | None, group: str | None, all_groups: bool, as_json: bool) -> None:
    """The cluster's nodes: state, health, whether a running job holds them, cores, GPUs (where the head
    node reports them: HPC Pack 2019's node model has no GPU count) and groups."""
    from hpcjob.config import get_profile
    from hpcjob.spec import GROUP_NAME, SpecError

    profile = get_profile(cluster_name)
    group = None if all_groups else group or profile.node_group
    if group is not None and not GROUP_NAME.fullmatch(group):
        raise SpecError(f"--group {group!r} is not a valid node group name")
    client = connect(profile)
    found, busy = client.nodes(group), client.busy_nodes()
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
    context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def emulator(args: tuple[str, ...]) -> None:
    """A local HPC Pack head node for tests: the REST API, tasks run here (--help for its options)."""
    from hpcjob.emulator.cli import main as emulator_main

    sys.exit(emulator_main(list(args)))
