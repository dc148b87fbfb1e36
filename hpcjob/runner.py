"""The life of a run, below every front door: the command line and the Python API (hpcjob.api) call it,
and the PowerShell module reaches it through the command line.

It opens a cluster (its profile, password and backend), looks runs up, stages the code, submits and
follows a job to its summary, and says where a run's files are. It prints nothing and exits nothing:
what a person should see goes to the `progress` callback it is given (warnings start "hpcjob: warning:"),
and what goes wrong is an HpcjobError with the one line the CLI prints.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.config import ClusterProfile
    from hpcjob.results import JobSummary, Submission
    from hpcjob.runs import RunRecord
    from hpcjob.share import ShareFolder
    from hpcjob.spec import JobSpec, Share

Progress = Callable[[str], None]


class StoppedWaiting(HpcjobError):
    """Following a job was interrupted (Ctrl-C): the job goes on."""


class HpcjobWarning(UserWarning):
    """Something a person should know that stops nothing (the CLI prints it as `hpcjob: warning: ...`)."""


# Every backend opened here, closed by `close_backends` (a WinRM shell counts against the user's quota).
_OPEN: list[Backend] = []


def close_backends() -> None:
    """Let go of every head node opened so far."""
    while _OPEN:
        with contextlib.suppress(Exception):  # closing is best effort: the work is done
            _OPEN.pop().close()


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def profile_mount_point(profile: ClusterProfile) -> str:
    """Where the profile's user's jobs see the share: the profile's, else their folder of /app."""
    from hpcjob.plan import user_mount_point
    from hpcjob.spec import DEFAULT_MOUNT_POINT

    return profile.mount_point or user_mount_point(DEFAULT_MOUNT_POINT, profile.user)


def with_profile(options: dict[str, Any], profile: ClusterProfile) -> dict[str, Any]:
    """Job options (the CLI's names; the share as UNC text) with the profile filling in what they do not
    say: the share, node group and mount point (by default the job owner's folder of /app, where
    hpcjob's execution filter mounts the share for them), the environment's and containers' settings,
    and one process per GPU of the cluster's size."""
    filled = dict(options)
    filled["mount_point"] = filled.get("mount_point") or profile_mount_point(profile)
    for key, value in (
        ("share", profile.share),
        ("node_group", profile.node_group),
        ("smb_server", profile.smb_server),
        ("env_on", profile.env_on),
        ("node_env_dir", profile.node_env_dir),
        ("docker_gpus", profile.docker_gpus),
        ("docker_options", profile.docker_options),
    ):
        if not filled.get(key) and value:
            filled[key] = value
    if filled.get("smb_port", 445) == 445 and profile.smb_port != 445:
        filled["smb_port"] = profile.smb_port
    if filled.get("gpus_per_node") is None and filled.get("nproc_per_node") is None and profile.gpus_per_node:
        filled["gpus_per_node"] = profile.gpus_per_node
    return filled


def open_smb(share: Share, user: str | None, server: str | None, port: int) -> ShareFolder:
    """The share over SMB as a user without a cluster profile: HPCJOB_SMB_USER/_PASSWORD, or a prompt."""
    from hpcjob.credentials import smb_password, smb_user
    from hpcjob.share import SmbFolder

    who = smb_user(user)
    return SmbFolder(share, who, smb_password(who), server=server, port=port)


class ClusterAccess:
    """A cluster profile, its password (read once) and its backend, opened as the profile says unless
    `backend_kind` names another."""

    def __init__(self, cluster_name: str | None, backend_kind: str | None = None) -> None:
        from hpcjob.backends import open_backend
        from hpcjob.config import get_profile, password_for, with_caller_user

        self.profile = with_caller_user(get_profile(cluster_name))
        self.password = password_for(self.profile)
        if self.profile.insecure:
            warnings.warn(
                f"TLS verification is off for cluster {self.profile.name}: anyone on the way can read the "
                "password",
                HpcjobWarning,
                stacklevel=2,
            )
        self.backend = open_backend(backend_kind or self.profile.backend, self.profile, self.password)
        _OPEN.append(self.backend)

    def share(self, share: Share, user: str | None, server: str | None, port: int) -> ShareFolder:
        """The share as the profile reaches it: mounted here (local_share), else over SMB with the
        profile's password when the SMB user is the profile's own (asked for only for another user)."""
        from hpcjob.credentials import smb_password
        from hpcjob.share import LocalFolder, SmbFolder

        profile = self.profile
        if profile.local_share:  # mounted here: no SMB session, no password
            return LocalFolder(Path(profile.local_share))
        user = user or profile.smb_user or profile.user
        password = self.password if user == profile.user else smb_password(user)
        return SmbFolder(share, user, password, server=server, port=port)


def backend_for_run(
    record: RunRecord, cluster_name: str | None = None, backend_kind: str | None = None
) -> Backend:
    """The backend that runs the recorded run (a run rendered for submitting by hand has none)."""
    from hpcjob.backends import BACKENDS, open_backend

    if record.cluster is None:
        if record.backend not in BACKENDS:
            raise SpecError(
                f"run {record.run_id} was rendered for submitting by hand: ask its cluster, or give the "
                "job id"
            )
        return open_backend(record.backend, None, None)
    return ClusterAccess(cluster_name or record.cluster, backend_kind or record.backend).backend


def job_id_of(job: str) -> int | None:
    """JOB as an HPC Pack job id (ASCII digits, at least 1), or None when it is a run id."""
    if not re.fullmatch(r"[0-9]+", job):
        if job.isdigit():  # '²' is a digit to Python, and no job id
            raise SpecError(f"job {job!r} is neither a job id (0-9) nor a run id")
        return None
    if int(job) < 1:
        raise SpecError(f"job id {job} must be at least 1")
    return int(job)


def run_of(job: str, cluster_name: str | None = None, backend_kind: str | None = None) -> RunRecord:
    """JOB's record: a run id or job id recorded on this machine, else a job id on the cluster."""
    from hpcjob.config import get_profile
    from hpcjob.runs import RunRecord, find_run

    if job_id_of(job) is None:
        return find_run(job)
    with contextlib.suppress(SpecError):  # submitted from here: its cluster and backend are known
        return find_run(job, cluster_name)
    profile = get_profile(cluster_name)  # not submitted from here: the default cluster
    return RunRecord(
        run_id=job,
        name="",
        backend=backend_kind or profile.backend,
        job_folder="",
        nodes=(),
        job_id=job,
        cluster=profile.name,
    )


def node_wheels(spec: JobSpec, progress: Progress) -> list[Path]:
    """The wheels the nodes install from when the job has a wheelhouse (downloaded here, before anything
    is uploaded: a package without a wheel for the nodes stops the job first)."""
    if spec.wheelhouse is None or spec.requirements is None:
        return []
    from hpcjob.wheelhouse import download

    return download(spec.requirements, *spec.wheelhouse, progress)


def submit_and_follow(
    cluster: ClusterAccess,
    spec: JobSpec,
    run_id: str,
    smb: tuple[str | None, str | None, int],
    *,
    mount_step: bool,
    wait: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> tuple[RunRecord, JobSummary | None]:
    """Upload the code, submit the job (recording the run at each step, with `command`: how it was
    asked for) and, with `wait`, follow it to its summary (the scheduler's states, the share's root
    cause and metrics): the run's latest record, and the summary (None without `wait`). An interrupted
    wait raises StoppedWaiting; the job goes on."""
    from hpcjob.backends.scheduler import job_summary
    from hpcjob.render import plan_json
    from hpcjob.runs import RunRecord, check_new_run_id, record_end, save_run
    from hpcjob.share import ShareError
    from hpcjob.staging import stage_run

    profile, backend = cluster.profile, cluster.backend
    plan = backend.plan(spec, run_id)  # before the upload: refuses a run id the cluster has seen
    smb_user, smb_server, smb_port = smb

    def open_share() -> ShareFolder:
        assert spec.share is not None
        return cluster.share(spec.share, smb_user, smb_server, smb_port)

    if spec.share:
        wheels = node_wheels(spec, progress)
        code_dir = Path(spec.script).resolve().parent
        progress(stage_run(code_dir, open_share(), spec.job_folder, plan.run_id, plan.files, wheels))
    else:
        progress("hpcjob: warning: no --share: the code must already be in the job folder on the nodes")
    first = RunRecord.of(
        plan,
        spec.job_folder,
        backend.kind,
        share=spec.share.unc if spec.share else None,
        local_root=profile.local_share,
        smb_server=smb_server,
        smb_port=smb_port,
        smb_user=smb_user or profile.smb_user or profile.user,
        cluster=profile.name,
    )
    latest = first
    job = plan_json(plan)

    def record(step: Submission) -> None:
        nonlocal latest
        latest = replace(first, state=step.state, job_id=step.job_id, mount_job_id=step.mount_job_id)
        save_run(latest, command=command, plan=job, tags=tags, gpus_per_node=spec.gpus_per_node)

    check_new_run_id(plan.run_id)  # again: another submit may have taken it during the upload
    started = time.monotonic()
    job_id = backend.submit(plan, mount=mount_step, progress=progress, record=record)
    progress(f"submitted job {job_id} (run {plan.run_id}) to {profile.name} on {', '.join(plan.nodes)}")
    if not wait:
        progress(f"follow it with: hpcjob status {job_id}   or: hpcjob logs {job_id} --follow")
        return latest, None
    try:
        info = backend.wait(latest, progress)
    except KeyboardInterrupt:
        said = f"stopped waiting; job {job_id} goes on (hpcjob cancel {job_id} ends it)"
        raise StoppedWaiting(said) from None
    # The scheduler knows the tasks' states; the share which rank failed first, and the metrics.
    folder = None
    if spec.share:
        try:
            folder = open_share()
        except ShareError as exc:
            progress(f"hpcjob: warning: {exc}: the summary has only what the scheduler knows")
    try:
        summary = job_summary(
            info,
            plan,
            time.monotonic() - started,
            folder,
            f"{spec.job_folder}/logs/{plan.run_id}",
            lambda: backend.task_outputs(latest),
        )
        with contextlib.suppress(HpcjobError):  # the job's end matters more than its history
            record_end(summary)
        return latest, summary
    finally:
        if folder is not None:
            folder.close()


@dataclass
class LogAccess:
    """Where a submitted run's logs can be read: the share (`folder`), else the scheduler's copy of each
    task's output (`outputs`, with `warning` saying why); `scheduler_end` asks whether the job has ended
    (its exit code, or None while it runs)."""

    folder: ShareFolder | None
    scheduler_end: Callable[[], int | None]
    outputs: list[tuple[str, str]]
    warning: str | None = None


def log_access(record: RunRecord, smb_user: str | None, smb_server: str | None, smb_port: int) -> LogAccess:
    """For the logs of a submitted job: the share, or the scheduler's copy of each task's output (HPC
    Pack keeps only its first bytes: 1500 on Linux nodes) when the share cannot be reached."""
    from hpcjob.share import LocalFolder, ShareError
    from hpcjob.spec import parse_share

    cluster = ClusterAccess(record.cluster, record.backend)  # one password, for the head node and the share
    backend = cluster.backend

    def scheduler_end() -> int | None:
        info = backend.status(record)
        return info.exit_code() if info.ended else None

    backend.status(record)  # a run whose job was never made has no logs: this says so, in one line
    if record.local_root:
        return LogAccess(LocalFolder(Path(record.local_root)), scheduler_end, [])
    if not record.share:
        why = (
            f"run {record.run_id} was submitted without a share"
            if record.job_folder
            else f"job {record.job_id} was not submitted from this machine: its share and folder are unknown"
        )
        warning = (
            f"{why}, so hpcjob cannot read its log files; showing the scheduler's copy of each task's "
            "output, which holds only its first 1500 bytes (give the share with `hpcjob logs --share UNC "
            f"--job-folder PATH`, or add it to cluster {record.cluster})"
        )
    else:
        try:
            folder = cluster.share(
                parse_share(record.share),
                smb_user or record.smb_user,
                smb_server or record.smb_server,
                record.smb_port or smb_port,
            )
            return LogAccess(folder, scheduler_end, [])
        except ShareError as exc:
            warning = (
                f"{exc}; showing the scheduler's copy of each task's output, which holds only its first "
                "1500 bytes"
            )
    return LogAccess(None, scheduler_end, backend.task_outputs(record), warning)


def run_folder(
    record: RunRecord, smb_user: str | None = None, smb_server: str | None = None, smb_port: int = 445
) -> ShareFolder:
    """Where the run's files are, read from here: the local folder recorded, else the share over SMB,
    reached as recorded unless the --smb-* options say otherwise."""
    from hpcjob.share import LocalFolder
    from hpcjob.spec import parse_share

    if record.local_root:
        return LocalFolder(Path(record.local_root))
    if not record.share:
        raise SpecError(f"run {record.run_id} has no share recorded: its files cannot be read from here")
    user = smb_user or record.smb_user
    server = smb_server or record.smb_server
    # The option's default gives way to the port the run was uploaded through.
    port = record.smb_port if record.smb_port and smb_port == 445 else smb_port
    if record.cluster:  # with the cluster profile's user and password
        cluster = ClusterAccess(record.cluster, record.backend)
        return cluster.share(parse_share(record.share), user, server, port)
    return open_smb(parse_share(record.share), user, server, port)


def scheduler_outputs(outputs: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    """Each line of the scheduler's copy of the tasks' output, with its node."""
    for node, text in outputs:
        for line in text.splitlines():
            yield node, line
