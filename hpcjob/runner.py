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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.config import ClusterProfile
    from hpcjob.plan import AllowedShare, JobPlan
    from hpcjob.results import JobInfo, JobSummary, MountResult, Submission
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


def run_status(
    record: RunRecord, cluster_name: str | None = None, backend_kind: str | None = None
) -> tuple[JobInfo, dict[str, Any] | None]:
    """The run's job as its backend sees it now, learnt by this machine's history; where its logs are on
    this machine (a local run, a mounted share), with the GPUs' use and, while it runs, its newest line
    of metrics over time."""
    from hpcjob.logs import RunLogs
    from hpcjob.runs import record_state
    from hpcjob.share import LocalFolder

    info = backend_for_run(record, cluster_name, backend_kind).status(record)
    if record.job_folder:  # a run of this machine's
        record_state(record.run_id, info.state, info.exit_code() if info.ended else None)
    if not record.local_root:
        return info, None
    run_logs = RunLogs(LocalFolder(Path(record.local_root)), record.log_folder, record.nodes)
    info = replace(info, gpu_use=tuple(run_logs.gpu_use()))
    steps = [line for line in run_logs.timeline() if line.get("event") == "step"]
    return info, steps[-1] if steps and not info.ended else None


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
) -> tuple[RunRecord, JobPlan, JobSummary | None]:
    """Upload the code to the cluster's share, submit the job (recording the run at each step, with
    `command`: how it was asked for) and, with `wait`, follow it to its summary: the run's latest
    record, its plan, and the summary (None without `wait`)."""
    profile, share = cluster.profile, spec.share
    smb_user, smb_server, smb_port = smb

    def open_share(plan: JobPlan | None = None) -> ShareFolder:  # for the upload, and the summary
        assert share is not None
        return cluster.share(share, smb_user, smb_server, smb_port)

    where = {
        "share": share.unc if share else None,
        "local_root": profile.local_share,
        "smb_server": smb_server,
        "smb_port": smb_port,
        "smb_user": smb_user or profile.smb_user or profile.user,
        "cluster": profile.name,
    }
    started = time.monotonic()
    latest, plan = submit_run(
        cluster.backend,
        spec,
        run_id,
        open_folder=open_share if share else None,
        where=lambda plan: where,
        mount_step=mount_step,
        progress=progress,
        command=command,
        tags=tags,
    )
    job_id = latest.job_id
    progress(f"submitted job {job_id} (run {plan.run_id}) to {profile.name} on {', '.join(plan.nodes)}")
    if not wait:
        progress(f"follow it with: hpcjob status {job_id}   or: hpcjob logs {job_id} --follow")
        return latest, plan, None
    folder = open_share if share else lambda: None
    return latest, plan, follow_run(cluster.backend, latest, plan, folder, started, progress)


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


def read_requirements(path: Path, named: str) -> str:
    """A requirements file's text, or one line that says why not (`named`: how the user gave it)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{named}: no such file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{named}: not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(f"{named}: {exc.strerror}") from None


def requirements_text(script: Path, given: str | Path | None, no_env: bool, progress: Progress) -> str | None:
    """The job's requirements: the file given, else requirements.txt beside the script (said on one
    line), else none; none at all with `no_env`."""
    if given is not None and no_env:
        raise SpecError("--requirements and --no-env contradict each other: give one")
    if no_env:
        return None
    path = Path(given) if given is not None else script.resolve().parent / "requirements.txt"
    if given is None:
        if not path.is_file():
            return None
        progress(
            f"hpcjob: the job's packages from {path.name} beside {script.name} (--no-env: the nodes' "
            "Python as it is)"
        )
    return read_requirements(path, f"--requirements {given}" if given is not None else str(path))


def submit_run(
    backend: Backend,
    spec: JobSpec,
    run_id: str,
    *,
    open_folder: Callable[[JobPlan], ShareFolder] | None,
    where: Callable[[JobPlan], Mapping[str, Any]],
    mount_step: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Plan the job on `backend`, stage its code into `open_folder(plan)` (the share, or the local
    folder that stands in for it; None: the code is there already), submit it, recording the run at
    each step (`where`: the record's share, local folder and cluster; `command`: how it was asked
    for). The run's latest record, and its plan."""
    from hpcjob.render import plan_json
    from hpcjob.runs import RunRecord, check_new_run_id, save_run
    from hpcjob.staging import stage_run

    plan = backend.plan(spec, run_id)  # before the upload: refuses a run id the cluster has seen
    if open_folder is not None:
        wheels = node_wheels(spec, progress)
        code_dir = Path(spec.script).resolve().parent
        progress(stage_run(code_dir, open_folder(plan), spec.job_folder, plan.run_id, plan.files, wheels))
    else:
        progress("hpcjob: warning: no --share: the code must already be in the job folder on the nodes")
    first = RunRecord.of(plan, spec.job_folder, backend.kind, **where(plan))
    latest = first
    job = plan_json(plan)

    def record(step: Submission) -> None:
        nonlocal latest
        pid, pid_start = step.process or (first.pid, first.pid_start)
        latest = replace(
            first,
            state=step.state,
            job_id=step.job_id,
            mount_job_id=step.mount_job_id,
            pid=pid,
            pid_start=pid_start,
        )
        save_run(latest, command=command, plan=job, tags=tags, gpus_per_node=spec.gpus_per_node)

    check_new_run_id(plan.run_id)  # again: another submit may have taken it during the upload
    backend.submit(plan, mount=mount_step, progress=progress, record=record)
    return latest, plan


def follow_run(
    backend: Backend,
    record: RunRecord,
    plan: JobPlan,
    open_folder: Callable[[], ShareFolder | None],
    started: float,
    progress: Progress,
) -> JobSummary:
    """Follow the run to its end and sum it up: the scheduler knows the tasks' states; the run's folder
    (`open_folder`: the share, the local folder, or None) which rank failed first, and the metrics. An
    interrupted wait raises StoppedWaiting; the job goes on."""
    from hpcjob.backends.scheduler import job_summary
    from hpcjob.runs import record_end
    from hpcjob.share import ShareError

    try:
        info = backend.wait(record, progress)
    except KeyboardInterrupt:
        job = record.job_id or record.run_id
        raise StoppedWaiting(f"stopped waiting; job {job} goes on (hpcjob cancel {job} ends it)") from None
    folder = None
    try:
        folder = open_folder()
    except ShareError as exc:
        progress(f"hpcjob: warning: {exc}: the summary has only what the scheduler knows")
    try:
        summary = job_summary(
            info,
            plan,
            time.monotonic() - started,
            folder,
            record.log_folder,
            lambda: backend.task_outputs(record),
        )
        with contextlib.suppress(HpcjobError):  # the job's end matters more than its history
            record_end(summary)
        return summary
    finally:
        if folder is not None:
            folder.close()


def _spec(fields: Mapping[str, Any]) -> JobSpec:
    """A JobSpec from options by its own names, the share as a UNC or a Share; checks that the script
    exists."""
    from hpcjob.spec import JobSpec, parse_share

    values = dict(fields)
    if isinstance(values.get("share"), str):
        values["share"] = parse_share(values["share"])
    if not Path(values["script"]).is_file():
        raise SpecError(f"script {values['script']} does not exist")
    return JobSpec(**values)


def submit_to_cluster(
    fields: Mapping[str, Any],
    run_id: str | None,
    cluster_name: str,
    backend_kind: str | None,
    *,
    mount_step: bool,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Submit a job (options by their JobSpec names, and smb_user, smb_server and smb_port) to the
    cluster of profile `cluster_name`, the profile filling in what the options do not say."""
    cluster = ClusterAccess(cluster_name, backend_kind)
    filled = with_profile(dict(fields), cluster.profile)
    smb = (filled.pop("smb_user", None), filled.pop("smb_server", None), filled.pop("smb_port", 445))
    spec = _spec(filled)
    record, plan, _ = submit_and_follow(
        cluster,
        spec,
        run_id or new_run_id(spec.name),
        smb,
        mount_step=mount_step,
        wait=False,
        progress=progress,
        command=command,
        tags=tags,
    )
    return record, plan


def submit_local(
    fields: Mapping[str, Any],
    run_id: str | None,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Start a job on this machine (options by their JobSpec names), in a process of its own, through
    the local backend as the registry opens it: its nodes are local processes, its share a local
    folder (one per project), its rendezvous on a free port of loopback."""
    import os

    from hpcjob.backends import open_backend
    from hpcjob.backends.local import free_port
    from hpcjob.gpus import default_procs_per_node, visible_gpus
    from hpcjob.share import LocalFolder

    values = dict(fields)
    values["rdzv_port"] = values.get("rdzv_port") or free_port()
    spec = _spec(values)
    if fields.get("nproc_per_node") is None and fields.get("gpus_per_node") is None:
        # As on a cluster node: one process per GPU the node gets.
        spec = replace(spec, nproc_per_node=default_procs_per_node(visible_gpus(os.environ), spec.node_count))
    backend = open_backend("local", None, None)

    def root(plan: JobPlan) -> str:  # the local folder the plan put the job folder in
        return plan.job_dir[: -len(spec.job_folder) - 1]

    record, plan = submit_run(
        backend,
        spec,
        run_id or new_run_id(spec.name),
        open_folder=lambda plan: LocalFolder(Path(root(plan))),
        where=lambda plan: {"local_root": root(plan)},
        mount_step=False,
        progress=progress,
        command=command,
        tags=tags,
    )
    return record, plan


def recorded_plan(run_id: str) -> JobPlan | None:
    """The plan this machine's history keeps for the run (None: not a run of this machine's)."""
    from hpcjob.plan import JobPlan
    from hpcjob.runs import find_entry

    try:
        entry = find_entry(run_id)
    except SpecError:
        return None
    return JobPlan.from_dict(entry.plan) if entry.plan else None


def run_folder_opener(record: RunRecord) -> Callable[[], ShareFolder | None]:
    """How to reach the run's files for its summary: None where no share or folder was recorded."""
    if not (record.local_root or record.share):
        return lambda: None
    return lambda: run_folder(record)


def log_lines(record: RunRecord, *, follow: bool, poll_s: float) -> Iterator[tuple[str, str, str]]:
    """Each line the run's nodes wrote, as (node, "stdout" or "stderr", line), in node order: what is
    there now, or with `follow`, new lines as they come until the run has ended."""
    from hpcjob.logs import RunLogs, Tail

    folder = run_folder(record)
    try:
        logs = RunLogs(folder, record.log_folder, record.nodes)
        tails = [
            (node, stream, Tail(folder, f"{record.log_folder}/{node}.{ending}", ""))
            for node in logs.nodes
            for stream, ending in (("stdout", "out"), ("stderr", "err"))
        ]
        backend = backend_for_run(record) if follow else None
        while True:
            ended: int | None = 0
            if backend is not None:
                ended = logs.ended()
                if ended is None and record.cluster is not None:
                    info = backend.status(record)
                    ended = info.exit_code() if info.ended else None
            for node, stream, tail in tails:
                for line in tail.read(final=ended is not None):
                    yield node, stream, line
            if ended is not None:
                return
            time.sleep(poll_s)
    finally:
        folder.close()


@dataclass(frozen=True)
class MountRequest:
    """What `hpcjob mount` mounts: the share and the filter's options as an administrator allows them
    (`allowed`, for every user's folder of its mount root), this user's mount point, and the nodes (none:
    every usable node of `group`)."""

    allowed: AllowedShare
    point: str
    group: str | None
    nodes: tuple[str, ...]


def mount_request(
    profile: ClusterProfile,
    share: str | None,
    mount_point: str | None,
    mount_options: str | None,
    node_group: str | None,
    node_names: Iterable[str],
) -> MountRequest:
    """The mount as asked (the profile filling in), checked: the share, a mount point that is the user's
    own folder of its mount root, the filter's options from its short list, the group's name."""
    from hpcjob.plan import AllowedShare, user_mount_point
    from hpcjob.spec import FILTER_MOUNT_OPTIONS, GROUP_NAME, parse_node_names, parse_share

    unc = share or profile.share
    if unc is None:
        raise SpecError(
            "no share to mount: give --share //HEADNODE/CcpSpoolDir[/folder], or add it to cluster "
            f"{profile.name}"
        )
    point = mount_point or profile_mount_point(profile)
    root = point.rstrip("/").rpartition("/")[0] or "/"
    if user_mount_point(root, profile.user) != point.rstrip("/"):
        mine = user_mount_point("/app", profile.user)
        raise SpecError(
            f"the mount point {point} is not a folder of your own: hpcjob's execution filter mounts the "
            f"share for {profile.user} at MOUNT ROOT/<user name>, such as {mine}"
        )
    options = FILTER_MOUNT_OPTIONS if mount_options is None else mount_options
    allowed = AllowedShare.checked(parse_share(unc).unc, root, options)
    group = node_group or profile.node_group
    if group is not None and not GROUP_NAME.fullmatch(group):
        raise SpecError(f"--node-group {group!r} is not a valid node group name")
    names = tuple(node_names)
    return MountRequest(allowed, point, group, parse_node_names(names) if names else ())


def mount_share(
    cluster: ClusterAccess, request: MountRequest, *, install: bool, progress: Progress
) -> list[MountResult]:
    """Mount the share on the nodes for the profile's user, as a job of theirs whose start has hpcjob's
    execution filter mount it (with `install`, the filter is installed first, as root: an HPC
    administrator's job); a node where the user's account was made only by that job is mounted again.
    Each node's result."""
    from hpcjob.node.mount_filter import NO_ACCOUNT_YET
    from hpcjob.plan import mount_step
    from hpcjob.render import JobShape
    from hpcjob.render.text import filter_install_command

    backend, allowed, group = cluster.backend, request.allowed, request.group
    nodes = request.nodes or tuple(n.name for n in backend.nodes(group) if n.usable)
    if not nodes:
        raise SpecError(f"no online, healthy node {f'in group {group}' if group else 'in the cluster'}")
    shape = JobShape(nodes, group, None, None)
    if install:
        ok, said = backend.install_filter(filter_install_command([allowed]), shape, progress)
        for line in said.splitlines():
            progress(line)
        if not ok:
            raise HpcjobError(
                "installing hpcjob's execution filter failed on some node (see above): it needs an HPC "
                "administrator"
            )
    # The job's name is unique: a lost answer is recovered by looking the job up by name.
    step = mount_step(allowed.unc, request.point, allowed.options, nodes)
    results = backend.mount(new_run_id("mount"), step, shape, progress)
    # A user's first job on a node makes their account there, after the filter ran: mount again there.
    new = tuple(r.node for r in results if NO_ACCOUNT_YET in r.message)
    if new:
        progress(f"your account was made just now on {', '.join(new)}: mounting there again")
        step = mount_step(allowed.unc, request.point, allowed.options, new)
        again = backend.mount(new_run_id("mount"), step, JobShape(new, group), progress)
        retried = {r.node.upper(): r for r in again}
        results = [retried.get(r.node.upper(), r) for r in results]
    return results
