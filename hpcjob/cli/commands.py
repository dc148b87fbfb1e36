"""Commands that need no cluster: render, run --local, logs."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import (
    PASS_THROUGH,
    TEXT,
    Seconds,
    build_spec,
    job_options,
    local_folder,
    smb_options,
    started_command,
    tag_option,
)
from hpcjob.runner import new_run_id, node_wheels, open_smb

if TYPE_CHECKING:
    from hpcjob.logs import RunLogs


@cli.command(context_settings=PASS_THROUGH)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["xml", "clusrun", "powershell", "json"]),
    default="xml",
    show_default=True,
    help="xml: the job file for `job submit /jobfile:`; clusrun: the share mount step; powershell: a "
    "script for the head node that mounts and submits; json: the plan.",
)
@click.option(
    "--upload",
    "upload_code",
    is_flag=True,
    help="Also upload the code and node files to the job folder on --share over SMB.",
)
@click.option(
    "--copy-to",
    type=TEXT,
    metavar="DIR",
    help="Also copy the code and hpcjob's node files into DIR/<job folder>: DIR is the share as "
    "mounted here (a drive or a CIFS mount).",
)
@smb_options
@job_options
def render(fmt: str, upload_code: bool, copy_to: str | None, **params: Any) -> None:
    """Print the HPC Pack job for SCRIPT without contacting anything.

    Name the nodes with --node (render asks no cluster which nodes are online). Renders of the same job
    folder share its current run id, so that the job file, the mount step and the script agree;
    --upload and --copy-to start a new run (they stage its code), --run-id names one.
    """
    from hpcjob.plan import make_plan
    from hpcjob.render import clusrun_text, job_xml, plan_json, powershell_text
    from hpcjob.runs import RENDERED, RunRecord, check_new_run_id, current_manual_run, save_run
    from hpcjob.share import LocalFolder, ShareFolder
    from hpcjob.spec import SpecError
    from hpcjob.staging import stage_run

    spec = build_spec(params)
    if not spec.node_names:
        raise SpecError("render needs the nodes: name each with --node (render contacts no cluster)")
    if upload_code and spec.share is None:
        raise SpecError("--upload needs --share //HEADNODE/CcpSpoolDir[/folder]")
    if upload_code and copy_to is not None:
        raise SpecError("choose one of --upload (over SMB) and --copy-to DIR (the share mounted here)")
    if copy_to is not None:
        copy_to = str(local_folder(copy_to, "--copy-to"))
    staging = upload_code or copy_to is not None
    share = spec.share.unc if spec.share else None
    current = None if staging or params["run_id"] else current_manual_run(spec.job_folder, share)
    run_id = params["run_id"] or (current.run_id if current else new_run_id(spec.name))
    if staging:
        check_new_run_id(run_id)
    plan = make_plan(spec, spec.node_names, run_id)
    formats = {"xml": job_xml, "clusrun": clusrun_text, "powershell": powershell_text, "json": plan_json}
    text = formats[fmt](plan)
    record = RunRecord.of(
        plan,
        spec.job_folder,
        "manual",
        local_root=str(Path(copy_to).resolve()) if copy_to else None,
        share=share,
        smb_server=params["smb_server"],
        smb_port=params["smb_port"],
        smb_user=params["smb_user"],
    )
    if current is not None:
        click.echo(f"hpcjob: run {run_id}, the current run of job folder {spec.job_folder}", err=True)
    elif not staging and not params["run_id"]:
        save_run(dataclasses.replace(record, state=RENDERED))  # later renders of the folder reuse it
    if staging:
        wheels = node_wheels(spec, lambda line: click.echo(f"hpcjob: {line}", err=True))
        folder: ShareFolder
        if copy_to is not None:
            folder = LocalFolder(Path(copy_to))
        else:
            assert spec.share is not None  # checked above
            folder = open_smb(spec.share, params["smb_user"], params["smb_server"], params["smb_port"])
        code_dir = Path(spec.script).resolve().parent
        staged = stage_run(code_dir, folder, spec.job_folder, plan.run_id, plan.files, wheels)
        click.echo(f"hpcjob: run {run_id}: {staged}", err=True)
        save_run(record)
    click.echo(text, nl=False)


@cli.command(context_settings=PASS_THROUGH)
@click.option(
    "--local", "local", is_flag=True, help="Run the job on this machine: N local nodes, real torchrun."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON summary on stdout; progress goes to stderr."
)
@click.option("--quiet", is_flag=True, help="Show node states and the summary, not the nodes' output.")
@click.option(
    "--grace-period",
    type=Seconds(),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long stopped nodes get after SIGINT before SIGKILL.",
)
@tag_option
@job_options
def run(
    local: bool, as_json: bool, quiet: bool, grace_period: float, tag_items: tuple[str, ...], **params: Any
) -> None:
    """Run SCRIPT as a distributed job and wait for it; exit with the job's exit code.

    With --local, each node is a real `python3 -m torch.distributed.run` started the way HPC Pack
    starts a task, with the rendezvous on loopback and a local folder as the share (one per project
    folder unless --mount-point). Ctrl-C, SIGTERM and SIGHUP cancel the job; no process of it outlives
    hpcjob. The exit code is 0 when the job finished, the exit code of what failed first when it
    failed, 130 when canceled.
    """
    from hpcjob.spec import SpecError

    if sys.platform == "win32":  # its nodes are bash and torchrun processes in POSIX process groups
        raise SpecError("run --local needs Linux: on Windows, run it in WSL")
    from hpcjob.backends.local import (
        LocalBackend,
        cancel_on_signals,
        default_share_root,
        free_port,
        this_process,
    )
    from hpcjob.cli.tables import format_summary
    from hpcjob.config import secret_variables
    from hpcjob.gpus import default_procs_per_node, visible_gpus
    from hpcjob.render import plan_json
    from hpcjob.runs import RunRecord, record_end, save_run
    from hpcjob.share import LocalFolder
    from hpcjob.spec import HpcjobError, parse_tags
    from hpcjob.staging import upload

    if not local:
        raise SpecError("run needs --local: this version runs jobs on this machine only")
    tags = parse_tags(tag_items)
    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"run --local needs torch in {sys.executable}: pip install 'hpcjob[train]'")
    code_dir = Path(params["script"]).resolve().parent
    share_root = (
        local_folder(params["mount_point"], "--mount-point")
        if params["mount_point"]
        else default_share_root(code_dir)
    )
    # The local folder stands in for the share: the backend's plan replaces the spec's mount point.
    spec = build_spec(
        {**params, "mount_point": None, "share": None}, rdzv_port=params["rdzv_port"] or free_port()
    )
    if params["nproc_per_node"] is None and params["gpus_per_node"] is None:
        # As on a cluster node: one process per GPU the node gets.
        spec = dataclasses.replace(
            spec, nproc_per_node=default_procs_per_node(visible_gpus(os.environ), spec.node_count)
        )
    backend = LocalBackend(grace_period_s=grace_period, hidden_env=secret_variables(), share_root=share_root)
    plan = backend.plan(spec, params["run_id"] or new_run_id(spec.name))

    def progress(line: str) -> None:
        # A closed terminal (SIGHUP) makes writes fail: the job must still be stopped and summed up.
        with contextlib.suppress(OSError):
            click.echo(line, err=as_json)

    gpus = [d for d in backend.gpu_devices if d]
    progress(
        f"job {plan.name}: {len(plan.nodes)} node(s) x {plan.nproc_per_node} process(es), "
        + (f"GPUs {' | '.join(gpus)}, " if gpus else "")
        + f"rendezvous {plan.rdzv_endpoint}, folder {plan.job_dir}"
    )
    if backend.gpu_note:
        progress(backend.gpu_note)
    wheels = node_wheels(spec, progress)
    upload(Path(spec.script).resolve().parent, LocalFolder(share_root), spec.job_folder, plan.files, wheels)
    pid, pid_start = this_process()
    save_run(
        RunRecord.of(
            plan, spec.job_folder, "local", local_root=str(share_root), pid=pid, pid_start=pid_start
        ),
        command=started_command(),
        plan=plan_json(plan),
        tags=tags,
        gpus_per_node=len(gpus[0].split(",")) if gpus else None,
    )
    cancel_on_signals()
    summary = backend.run(plan, progress=progress, echo_output=not quiet)
    with contextlib.suppress(HpcjobError):  # the job's end matters more than its history
        record_end(summary)
    with contextlib.suppress(OSError):
        click.echo(summary.to_json() if as_json else format_summary(summary))
    sys.exit(summary.exit_code)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--node", "only_node", type=TEXT, metavar="NAME", help="Only this node's output.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option(
    "--cluster",
    "cluster_name",
    type=TEXT,
    metavar="NAME",
    help="The cluster of a job id, when several have one.",
)
@click.option("--share", type=TEXT, metavar="UNC", help="The share, if this machine did not start the run.")
@click.option(
    "--mount-point",
    type=click.Path(exists=True, file_okay=False),
    metavar="DIR",
    help="Where the share is mounted here (instead of SMB).",
)
@click.option(
    "--job-folder", type=TEXT, metavar="PATH", help="The job folder on the share [default: as recorded]."
)
@click.option(
    "--poll",
    type=Seconds(above=True),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to look.",
)
@click.option(
    "--idle-timeout",
    type=Seconds(),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --follow, stop after a task failed and no output came for this long (killed "
    "tasks write no end mark).",
)
@smb_options
def logs(
    run_id: str,
    only_node: str | None,
    follow: bool,
    cluster_name: str | None,
    share: str | None,
    mount_point: str | None,
    job_folder: str | None,
    poll: float,
    idle_timeout: float,
    **params: Any,
) -> None:
    """Print a run's per-node stdout and stderr, prefixed by node, from the share.

    RUN is the run id that render, run and submit print, or the HPC Pack job id of a submitted job.
    Without --follow, each node's output is printed whole, in node order; with it, new lines are
    printed as they come, and hpcjob exits with the job's exit code when it has ended. When the share
    cannot be reached, a submitted job's output comes from the scheduler, which keeps only its start.
    """
    from hpcjob.logs import RunLogs
    from hpcjob.runs import RunRecord
    from hpcjob.share import ShareFolder
    from hpcjob.spec import SpecError, check_job_folder, check_run_id

    check_run_id(run_id)
    if job_folder is not None:
        check_job_folder(job_folder)
    if share or mount_point:
        if not job_folder:
            raise SpecError("give --job-folder with --share or --mount-point")
        record = RunRecord(
            run_id=run_id,
            name="",
            backend="manual",
            job_folder=job_folder,
            nodes=(),
            local_root=mount_point,
            share=share,
        )
    else:
        from hpcjob.runner import run_of

        record = run_of(run_id, cluster_name, None)  # a bare job id: the scheduler's copy of the output
    scheduler_end: Callable[[], int | None] | None = None
    folder: ShareFolder | None
    smb = (params["smb_user"], params["smb_server"], params["smb_port"])
    if record.cluster is not None:  # the cluster knows whether the job has ended
        from hpcjob.runner import log_access, scheduler_outputs

        access = log_access(record, *smb)
        folder, scheduler_end = access.folder, access.scheduler_end
        if folder is None:  # the scheduler's copy of the output instead
            if access.warning:
                click.echo(f"hpcjob: warning: {access.warning}", err=True)
            for node, line in scheduler_outputs(access.outputs):
                click.echo(f"[{node}] {line}")
            if not any(text for _, text in access.outputs):
                job = record.job_id or record.run_id
                click.echo(f"hpcjob: job {job}: the scheduler holds no output of its tasks", err=True)
            return
    else:
        from hpcjob.runner import run_folder

        folder = run_folder(record, *smb)
    run_logs = RunLogs(folder, f"{job_folder or record.job_folder}/logs/{record.run_id}", record.nodes)
    if only_node:
        match = [n for n in run_logs.nodes if n.upper() == only_node.upper()]
        if not match:
            folder.close()
            known = ", ".join(run_logs.nodes) or f"none yet in {folder.describe()}/{run_logs.log_folder}"
            raise SpecError(f"run {record.run_id} has no node {only_node!r}; its nodes: {known}")
        run_logs = RunLogs(folder, run_logs.log_folder, match)
    try:
        exit_code = _print_logs(run_logs, follow, poll, idle_timeout, scheduler_end)
    finally:
        folder.close()
    sys.exit(exit_code)


def _print_logs(
    run_logs: RunLogs,
    follow: bool,
    poll: float,
    idle_timeout: float,
    scheduler_end: Callable[[], int | None] | None,
) -> int:
    if not follow:
        for line in run_logs.read(final=True):
            click.echo(line)
        steps = [t for t in run_logs.timeline() if t.get("event") == "step"]
        running = run_logs.ended() is None and (scheduler_end is None or scheduler_end() is None)
        if steps and running:  # where its training is now
            from hpcjob.cli.tables import latest_line

            click.echo(latest_line(steps[-1], time.time()), err=True)
        return 0
    quiet_since = time.monotonic()
    while True:
        ended = run_logs.ended()
        if ended is None and scheduler_end is not None:
            ended = scheduler_end()
        lines = run_logs.read(final=ended is not None)
        for line in lines:
            click.echo(line)
        if ended is not None:
            return ended
        if lines:
            quiet_since = time.monotonic()
        failed = [code for code in run_logs.exit_codes().values() if code != 0]
        if failed and time.monotonic() - quiet_since > idle_timeout:
            return failed[0]
        time.sleep(poll)
