"""Commands that need no cluster: render, run --local, logs."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any

import click

from hpcjob.cli.app import cli
from hpcjob.cli.options import (
    OUTPUT,
    PASS_THROUGH,
    TEXT,
    Seconds,
    job_options,
    job_options_of,
    local_folder,
    named_or_newest,
    pull_after,
    pull_options,
    retries_of,
    retry_options,
    smb_options,
    started_command,
    tag_option,
)
from hpcjob.job.options import FAILURE, NODES, SHARE


@cli.command(
    context_settings=PASS_THROUGH,
    groups={"fmt": OUTPUT, "upload_code": SHARE, "copy_to": SHARE},
    epilog="""\b
    Examples:
      hpcjob render --node GPU1 --node GPU2 --gpus-per-node 4 train.py
      hpcjob render --format powershell --node GPU1 --node GPU2 \\
          --share //HEADNODE/CcpSpoolDir/app train.py > submit.ps1
    """,
)
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
    from hpcjob.job.spec import SpecError
    from hpcjob.runner import gpus_for_nodes, job_spec, open_smb, render_owner, render_run
    from hpcjob.store.share import LocalFolder, ShareFolder

    options = dataclasses.replace(job_options_of(params), owner=render_owner())
    gpus, told = gpus_for_nodes(options, None)  # render reads no profile: --gpus-per-node, else --vm-size's
    if told:
        options = dataclasses.replace(options, gpus_per_node=gpus)
    spec = job_spec(options, progress=lambda line: click.echo(line, err=True))
    if upload_code and spec.share is None:
        raise SpecError("--upload needs --share //HEADNODE/CcpSpoolDir[/folder]")
    if upload_code and copy_to is not None:
        raise SpecError("choose one of --upload (over SMB) and --copy-to DIR (the share mounted here)")
    mounted = local_folder(copy_to, "--copy-to").resolve() if copy_to is not None else None
    share = spec.share

    def stage_into() -> ShareFolder:  # opened once the job is rendered: the SMB password comes last
        if mounted is not None:
            return LocalFolder(mounted)
        assert share is not None  # checked above
        return open_smb(share, params["smb_user"], params["smb_server"], params["smb_port"])

    where = {
        "local_root": str(mounted) if mounted else None,
        "share": share.unc if share else None,
        "smb_server": params["smb_server"],
        "smb_port": params["smb_port"],
        "smb_user": params["smb_user"],
    }
    done = render_run(
        spec,
        params["run_id"],
        (fmt,),
        stage_into=stage_into if upload_code or mounted else None,
        where=where,
        progress=lambda line: click.echo(line, err=True),
    )
    if told is not None:  # once rendered: bad input stays one line
        click.echo(f"hpcjob: {gpus} GPU(s) per node, from {told}", err=True)
    if done.again:
        click.echo(
            f"hpcjob: run {done.plan.run_id}, the current run of job folder {spec.job_folder}", err=True
        )
    click.echo(done.texts[fmt], nl=False)


@cli.command(
    context_settings=PASS_THROUGH,
    short_help="Run SCRIPT as a distributed job and wait for it.",
    groups={"local": NODES, "quiet": OUTPUT, "grace_period": FAILURE},
    epilog="""\b
    Examples:
      hpcjob run --local -n 2 train.py --epochs 1
      hpcjob run --local -n 2 --requirements requirements.txt --json train.py
      hpcjob run -n 4 --gpus-per-node 8 --hang-timeout 10m train.py --epochs 90
    """,
)
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
@pull_options
@retry_options
@job_options
def run(
    local: bool,
    as_json: bool,
    quiet: bool,
    grace_period: float,
    tag_items: tuple[str, ...],
    pull: bool,
    pull_to: str | None,
    **params: Any,
) -> None:
    """Run SCRIPT as a distributed job and wait for it; exit with the job's exit code.

    Without --local: `hpcjob submit --wait` on the default cluster. With --local, each node is a real
    torchrun started as HPC Pack starts a task, the rendezvous on loopback, a local folder as the share.
    Ctrl-C cancels the job; no process of it outlives hpcjob. Exit code: 0 when the job finished, that
    of what failed first, 130 when canceled; with --pull, 1 when it finished but its results could not
    be pulled.
    """
    from hpcjob.cli.tables import format_summary
    from hpcjob.job.spec import SpecError, parse_tags
    from hpcjob.runner import LocalOptions, pull_target, run_local

    if not local:  # on the default cluster, and followed: `submit --wait`
        from hpcjob.store.config import NoCluster, get_profile

        try:  # a broken default profile says what is wrong with it (a CA file gone), as submit does
            get_profile(None)
        except NoCluster:
            raise SpecError(
                "run without --local runs on your default cluster, and none is configured: add one with "
                "`hpcjob cluster add NAME --url https://HEADNODE ...`, or run here with --local"
            ) from None
        smb = {"smb_user": None, "smb_server": None, "smb_port": 445}
        context = click.get_current_context()
        submit = cli.get_command(context, "submit")  # through the group: commands import no other command
        assert submit is not None
        context.invoke(
            submit, cluster_name=None, backend_kind=None, wait=True, dry_run=False, mount_step=True,
            as_json=as_json, tag_items=tag_items, pull=pull, pull_to=pull_to, **smb, **params,
        )  # fmt: skip
        return
    if params["max_cost"] is not None:
        raise SpecError("--max-cost needs a cluster: a local run has no price")
    tags = parse_tags(tag_items)
    if pull_to is not None:  # a file in its place is refused before the run, not after it
        pull_target(pull_to, "", "--pull-to")
    share_root = local_folder(params["mount_point"], "--mount-point") if params["mount_point"] else None

    def progress(line: str) -> None:
        # A closed terminal (SIGHUP) makes writes fail: the job must still be stopped and summed up.
        with contextlib.suppress(OSError):
            click.echo(line, err=as_json)

    summary = run_local(
        job_options_of(params),
        LocalOptions(share_root, grace_period, echo_output=not quiet),
        progress=progress,
        command=started_command(),
        tags=tags,
        retries=retries_of(params),
    )
    with contextlib.suppress(OSError):
        click.echo(summary.to_json() if as_json else format_summary(summary))
    if pull or pull_to is not None:
        sys.exit(pull_after(summary, pull_to, progress))
    sys.exit(summary.exit_code)


@cli.command(
    short_help="Print a run's output, node by node, from the share.",
    groups={"only_node": OUTPUT, "follow": OUTPUT, "poll": OUTPUT, "idle_timeout": OUTPUT},
    epilog="""\b
    Examples:
      hpcjob logs --follow          # this machine's newest run, until it ends
      hpcjob logs 42 --node GPU1    # job 42's output on node GPU1
    """,
)
@click.argument("run_id", metavar="[RUN]", required=False)
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
    run_id: str | None,
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

    RUN is the run id that render, run and submit print, or the HPC Pack job id of a submitted job
    [default: this machine's newest run]. Without --follow, each node's output is printed whole, in
    node order; with it, new lines are printed as they come, and hpcjob exits with the job's exit code
    when it has ended. When the share cannot be reached, a submitted job's output comes from the
    scheduler, which keeps only its start. A failed run's lines start with its first failure.
    """
    from hpcjob.job.spec import SpecError, check_job_folder, check_run_id
    from hpcjob.runner import RunOutput, run_of
    from hpcjob.store.logs import output_line
    from hpcjob.store.runs import RunRecord

    if run_id is None and (share or mount_point):
        raise SpecError("name the run with --share or --mount-point: this machine's history knows no other")
    run_id = named_or_newest(run_id)
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
        record = run_of(run_id, cluster_name, None)  # a bare job id: the scheduler's copy of the output
        if job_folder is not None:
            record = dataclasses.replace(record, job_folder=job_folder)
    output = RunOutput(record, (params["smb_user"], params["smb_server"], params["smb_port"]), only_node)
    try:
        if output.warning:
            click.echo(f"hpcjob: warning: {output.warning}", err=True)
        first = None if follow else output.first_failure()
        if first is not None:  # the error to look for, before every node's lines (they stay whole)
            click.echo(f"first failure: {first.describe()}")
        for node, stream, line in output.lines(follow=follow, poll_s=poll, idle_timeout_s=idle_timeout):
            click.echo(output_line(node, stream, line))
        if output.scheduler_copy is not None and not any(text for _, text in output.scheduler_copy):
            job = record.job_id or record.run_id
            click.echo(f"hpcjob: job {job}: the scheduler holds no output of its tasks", err=True)
        latest = None if follow else output.latest_step()
        if latest is not None:  # where its training is now
            from hpcjob.cli.tables import latest_line

            click.echo(latest_line(latest, time.time()), err=True)
    finally:
        output.close()
    sys.exit(output.exit_code or 0)


@cli.command(
    short_help="Copy a run's checkpoints, outputs and logs here.",
    epilog="""\b
    Examples:
      hpcjob pull                  # this machine's newest run, into ./RUN_ID
      hpcjob pull 42 --to results  # HPC Pack job 42's run, into ./results
    """,
)
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option("--to", "to", type=TEXT, metavar="DIR", help="The folder to copy into [default: ./RUN_ID].")
@smb_options
def pull(run_id: str | None, to: str | None, **params: Any) -> None:
    """Copy a run's results from the share into DIR: its checkpoints, its output folder
    (HPCJOB_OUTPUT_DIR) and its logs, as DIR/checkpoints, DIR/outputs and DIR/logs.

    RUN is a run id or job id of this machine's history [default: its newest run]. Only what changed
    since the last pull into DIR is copied; nothing here is deleted. Only regular files come: a link,
    a FIFO or a name that is no plain file name is skipped, and said.
    """
    from hpcjob.runner import pull_run, pull_target

    if to is not None:  # a file in its place: one line before the run is looked up
        pull_target(to, "")
    report = pull_run(
        named_or_newest(run_id),
        to,
        smb_user=params["smb_user"],
        smb_server=params["smb_server"],
        smb_port=params["smb_port"],
        progress=lambda line: click.echo(line, err=True),
    )
    click.echo(report.line())
