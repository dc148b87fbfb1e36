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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.config import ClusterProfile
    from hpcjob.onboard import SizeTable
    from hpcjob.plan import AllowedShare, ContainerPolicy, JobPlan
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


def render_owner() -> str:
    """Who a rendered job is for, to submit by hand: the default cluster profile's user, else this
    machine's user name. Their folder on the share holds the job folder (hpcjob.spec.share_user_folder)."""
    import getpass

    from hpcjob.config import get_profile

    try:
        return get_profile(None).user
    except HpcjobError:
        pass
    try:
        return getpass.getuser()  # $LOGNAME, $USER, $USERNAME (Windows), else the account's
    except (ImportError, KeyError, OSError):
        raise SpecError(
            "cannot tell who the job is for: add a cluster profile (hpcjob cluster add), or set USER"
        ) from None


def with_profile(options: dict[str, Any], profile: ClusterProfile) -> dict[str, Any]:
    """Job options (the CLI's names; the share as UNC text) with the profile filling in what they do not
    say: the share, node group and mount point (by default the job owner's folder of /app, where
    hpcjob's execution filter mounts the share for them), the environment's and containers' settings,
    the rendezvous port, the nodes' VM size, and one process per GPU of the cluster's size."""
    filled = dict(options)
    filled["mount_point"] = filled.get("mount_point") or profile_mount_point(profile)
    filled["owner"] = profile.user
    for key, value in (
        ("share", profile.share),
        ("node_group", profile.node_group),
        ("smb_server", profile.smb_server),
        ("env_on", profile.env_on),
        ("node_env_dir", profile.node_env_dir),
        ("docker_gpus", profile.docker_gpus),
        ("docker_options", profile.docker_options),
        ("rdzv_port", profile.rdzv_port),
        ("vm_size", profile.vm_size),
    ):
        if not filled.get(key) and value:
            filled[key] = value
    if filled.get("smb_port", 445) == 445 and profile.smb_port != 445:
        filled["smb_port"] = profile.smb_port
    if filled.get("gpus_per_node") is None and filled.get("nproc_per_node") is None and profile.gpus_per_node:
        filled["gpus_per_node"] = profile.gpus_per_node
    return filled


# The size table and onboarding's parameters template: package data (hpcjob/arm/), so an installed
# hpcjob has them.
ARM_PACKAGE, ARM_DIR = "hpcjob", "arm"


def size_table() -> SizeTable:
    """The Azure GPU sizes hpcjob knows (hpcjob/arm/sizes.json): onboarding's, and doctor's marks."""
    import json
    from importlib import resources

    from hpcjob.onboard import SizeTable

    sizes = resources.files(ARM_PACKAGE) / ARM_DIR / "sizes.json"
    return SizeTable.from_data(json.loads(sizes.read_text(encoding="utf-8")))


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


def locked_wheels(spec: JobSpec, progress: Progress) -> tuple[JobSpec, list[Path]]:
    """With a wheelhouse: the wheels the nodes install from (downloaded here, before anything is planned
    or uploaded: a package without a wheel for the nodes stops the job first), and the spec whose
    requirements are their lock, each wheel pinned with its SHA-256 (hpcjob.plan.wheel_lock): the nodes'
    pip installs exactly these files or nothing, whatever the share holds. Else the spec as it is."""
    if spec.wheelhouse is None or spec.requirements is None:
        return spec, []
    from hpcjob.plan import wheel_lock
    from hpcjob.wheelhouse import download, sha256_of

    wheels = download(spec.requirements, *spec.wheelhouse, progress)
    lock = wheel_lock([(wheel.name, sha256_of(wheel)) for wheel in wheels])
    return replace(spec, requirements=lock), wheels


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
        if plan.hang_timeout_s is not None:
            progress(
                "hpcjob: warning: --hang-timeout ends a hung job while hpcjob follows it (submit --wait, "
                "Run.wait()): this job is not followed"
            )
        progress(f"follow it with: hpcjob status {job_id}   or: hpcjob logs {job_id} --follow")
        return latest, plan, None
    folder = open_share if share else lambda: None
    return latest, plan, follow_run(cluster.backend, latest, plan, folder, started, progress)


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
    gpus_per_node: int | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Plan the job on `backend`, stage its code into `open_folder(plan)` (the share, or the local
    folder that stands in for it; None: the code is there already), submit it, recording the run at
    each step (`where`: the record's share, local folder and cluster; `command`: how it was asked
    for; `gpus_per_node`: each node's GPUs, for the history's GPU-hours [default: the spec's]). The
    run's latest record, and its plan."""
    from hpcjob.render import plan_json
    from hpcjob.runs import RunRecord, check_new_run_id, save_run
    from hpcjob.staging import stage_run

    if spec.wheelhouse is not None and open_folder is None:
        raise SpecError("--wheelhouse needs --share: the nodes install its wheels from there")
    spec, wheels = locked_wheels(spec, progress)
    plan = backend.plan(spec, run_id)  # before the upload: refuses a run id the cluster has seen
    if open_folder is not None:
        code_dir = Path(spec.script).resolve().parent
        staged = stage_run(
            code_dir, open_folder(plan), spec.job_folder, plan.run_id, plan.files, wheels, spec.user_folder
        )
        progress(staged)
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
        gpus = gpus_per_node or spec.gpus_per_node
        save_run(latest, command=command, plan=job, tags=tags, gpus_per_node=gpus)

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
    (`open_folder`: the share, the local folder, or None) which rank failed first, and the metrics. A job
    with a hang bound is watched through its folder, and ended when it hangs (hpcjob.runner.watch). An
    interrupted wait raises StoppedWaiting; the job goes on."""
    from hpcjob.backends.scheduler import job_summary
    from hpcjob.runner.watch import HangFound, end_hung_job, hang_watch, hung_summary
    from hpcjob.runs import record_end
    from hpcjob.share import ShareError

    def opened(without: str) -> ShareFolder | None:
        try:
            return open_folder()
        except ShareError as exc:
            progress(f"hpcjob: warning: {exc}: {without}")
            return None

    # A watched job's folder is read all along; another's only once it has ended.
    folder = None
    if plan.hang_timeout_s is not None:
        folder = opened("the job is not watched for hangs (its ranks' beats are there)")
    watch = hang_watch(plan, folder, record.log_folder) if folder is not None else None
    hang = None
    try:
        try:
            info = backend.wait(record, progress, watch)
        except HangFound as found:
            assert folder is not None
            info, hang = end_hung_job(backend, record, plan, found.hang, folder, progress)
    except BaseException as exc:
        if folder is not None:
            folder.close()
        if not isinstance(exc, KeyboardInterrupt):
            raise
        job = record.job_id or record.run_id
        raise StoppedWaiting(f"stopped waiting; job {job} goes on (hpcjob cancel {job} ends it)") from None
    if folder is None:
        folder = opened("the summary has only what the scheduler knows")
    try:
        summary = job_summary(
            info,
            plan,
            time.monotonic() - started,
            folder,
            record.log_folder,
            lambda: backend.task_outputs(record),
        )
        if hang is not None:
            summary = hung_summary(summary, hang)
        with contextlib.suppress(HpcjobError):  # the job's end matters more than its history
            record_end(summary)
        return summary
    finally:
        if folder is not None:
            folder.close()


def job_spec(fields: Mapping[str, Any]) -> JobSpec:
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
    spec = job_spec(filled)
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


@dataclass(frozen=True)
class LocalOptions:
    """How a job runs on this machine: `share_root`, the local folder that stands in for the share
    (None: one per project folder); `grace_period_s`, how long stopped nodes get after SIGINT before
    SIGKILL; `echo_output`, whether its progress has the nodes' output too."""

    share_root: Path | None = None
    grace_period_s: float = 10.0
    echo_output: bool = False


def start_local(
    fields: Mapping[str, Any],
    run_id: str | None,
    local: LocalOptions,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    attached: bool = False,
) -> tuple[Backend, RunRecord, JobPlan]:
    """Start a job on this machine (options by their JobSpec names; a share or mount point they name
    does not apply), in a process of its own, through the local backend as the registry opens it: its
    nodes are local processes, its share a local folder, its rendezvous on a free port of loopback unless
    the options name one. `attached`: the job is canceled when this process ends. The backend, the run's
    record and its plan."""
    import importlib.util
    import os
    import sys

    from hpcjob.backends import open_backend
    from hpcjob.backends.local import LocalBackend, free_port
    from hpcjob.gpus import default_procs_per_node, share_gpus, visible_gpus
    from hpcjob.share import LocalFolder

    if sys.platform == "win32":  # its nodes are bash and torchrun processes in POSIX process groups
        raise SpecError("a local run needs Linux: on Windows, run it in WSL")
    values = {**fields, "share": None}
    values.pop("mount_point", None)  # the local folder stands in for the share: the plan puts it there
    values["rdzv_port"] = values.get("rdzv_port") or free_port()
    spec = job_spec(values)
    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"a local run needs torch in {sys.executable}: pip install 'hpcjob[train]'")
    if fields.get("nproc_per_node") is None and fields.get("gpus_per_node") is None:
        # As on a cluster node: one process per GPU the node gets.
        spec = replace(spec, nproc_per_node=default_procs_per_node(visible_gpus(os.environ), spec.node_count))
    # Each local node's GPUs, as the backend's plan shares them out (none: the CPU), for the history.
    local_gpus = share_gpus(visible_gpus(os.environ), spec.node_count, spec.procs_per_node).devices[0]
    backend = open_backend("local", None, None)
    assert isinstance(backend, LocalBackend)
    backend.share_root, backend.grace_period_s = local.share_root, local.grace_period_s
    backend.echo_output, backend.attached = local.echo_output, attached
    _OPEN.append(backend)

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
        gpus_per_node=len(local_gpus.split(",")) if local_gpus else None,
    )
    return backend, record, plan


def submit_local(
    fields: Mapping[str, Any],
    run_id: str | None,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Start a job on this machine (`start_local`) that goes on whatever becomes of this process:
    status, wait, logs and cancel find it from anywhere."""
    _, record, plan = start_local(
        fields, run_id, LocalOptions(), progress=progress, command=command, tags=tags
    )
    return record, plan


def run_local(
    fields: Mapping[str, Any],
    run_id: str | None,
    local: LocalOptions,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
) -> JobSummary:
    """Run a job on this machine to its summary, as `submit --wait` follows a cluster's job (the same
    local backend, through `start_local` and `follow_run`). The job lives no longer than this process:
    Ctrl-C, SIGTERM and SIGHUP cancel it (a second one: its nodes are killed at once) and it is followed
    on to its summary; a process killed outright takes the job with it."""
    import signal
    import sys

    if sys.platform == "win32":  # before hpcjob.procs, which names POSIX signals
        raise SpecError("a local run needs Linux: on Windows, run it in WSL")
    from hpcjob.procs import interrupt_on_cancel_signals

    before = interrupt_on_cancel_signals()
    started = time.monotonic()
    try:
        backend, record, plan = start_local(
            fields, run_id, local, progress=progress, command=command, tags=tags, attached=True
        )
        interrupted = False
        while True:
            try:
                # Each interrupt is one SIGTERM to the job's process: the first stops the nodes, a second
                # kills them at once (as a second Ctrl-C in its own shell would).
                if interrupted:
                    backend.cancel(record, force=False)
                return follow_run(backend, record, plan, run_folder_opener(record), started, progress)
            except (KeyboardInterrupt, StoppedWaiting):
                interrupted = True
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)


RENDERERS = ("xml", "clusrun", "powershell", "json")


def rendered(plan: JobPlan, formats: Iterable[str] = RENDERERS) -> dict[str, str]:
    """The plan in each of `formats` (RENDERERS): the job file, the mount step and submit commands for
    cmd.exe (a plan without a share has none: asked for, it is one line that says so), the head node's
    script, the plan."""
    from hpcjob.render import clusrun_text, job_xml, plan_json, powershell_text

    render = {"xml": job_xml, "clusrun": clusrun_text, "powershell": powershell_text, "json": plan_json}
    return {name: render[name](plan) for name in formats}


@dataclass(frozen=True)
class Rendered:
    """A job rendered for submitting by hand: its plan, its texts, and whether it is the job folder's
    current run again (renders of one folder share a run id, so that the job file and the mount step
    agree)."""

    plan: JobPlan
    texts: dict[str, str]
    again: bool


def render_run(
    spec: JobSpec,
    run_id: str | None,
    formats: Iterable[str],
    *,
    stage_into: Callable[[], ShareFolder] | None = None,
    where: Mapping[str, Any],
    progress: Progress,
) -> Rendered:
    """Plan SPEC on its named nodes for submitting by hand and render it in `formats`, contacting nothing
    but `stage_into`: with it (opening the share over SMB, or as mounted here), a new run whose code and
    node files are staged there; without, the job folder's current run (recorded here as rendered), unless
    `run_id` names one. `where`: the record's share and local folder."""
    from hpcjob.plan import make_plan
    from hpcjob.runs import RENDERED, RunRecord, check_new_run_id, current_manual_run, save_run
    from hpcjob.staging import stage_run

    if not spec.node_names:
        raise SpecError("render needs the nodes: name each with --node (render contacts no cluster)")
    staging = stage_into is not None
    if spec.wheelhouse is not None and not staging:
        raise SpecError(
            "render --wheelhouse needs --upload or --copy-to: the nodes install a lock of the wheels, made "
            "as they are uploaded"
        )
    current = None if staging or run_id else current_manual_run(spec.job_folder, where.get("share"))
    chosen = run_id or (current.run_id if current else new_run_id(spec.name))
    if staging:
        check_new_run_id(chosen)
    spec, wheels = locked_wheels(spec, progress)
    plan = make_plan(spec, spec.node_names, chosen)
    texts = rendered(plan, formats)  # before anything is recorded or staged: a text may be refused
    record = RunRecord.of(plan, spec.job_folder, "manual", **where)
    if stage_into is not None:
        code_dir = Path(spec.script).resolve().parent
        staged = stage_run(
            code_dir, stage_into(), spec.job_folder, plan.run_id, plan.files, wheels, spec.user_folder
        )
        progress(f"hpcjob: run {chosen}: {staged}")
        save_run(record)
    elif current is None and not run_id:
        save_run(replace(record, state=RENDERED))  # later renders of the folder reuse it
    return Rendered(plan, texts, current is not None)


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


class RunOutput:
    """What a run's nodes wrote, as (node, "stdout" or "stderr", line), read from the run's folder (the
    share, or this machine's folder for a local run); for a submitted job whose share cannot be reached,
    the scheduler's copy of each task's output instead (HPC Pack keeps only its first 1500 bytes on Linux
    nodes), with `warning` saying why. `only_node`: that node's alone. Close it when done."""

    def __init__(
        self,
        record: RunRecord,
        smb: tuple[str | None, str | None, int] = (None, None, 445),
        only_node: str | None = None,
    ) -> None:
        from hpcjob.logs import RunLogs

        self.record = record
        self.warning: str | None = None
        self.exit_code: int | None = None  # once `lines(follow=True)` has seen the run end
        self.scheduler_copy: list[tuple[str, str]] | None = None  # (node, its task's Output)
        self._folder: ShareFolder | None = None
        self._scheduler_end: Callable[[], int | None] | None = None
        if record.cluster is not None:  # the cluster knows whether the job has ended
            self._for_cluster(*smb)
        else:
            self._folder = run_folder(record, *smb)
            if record.backend in _local_backends():
                backend = backend_for_run(record)
                self._scheduler_end = lambda: _exit_code(backend.status(record))
        copy: list[tuple[str, str]] = self.scheduler_copy or []
        self.nodes = [node for node, _ in copy]
        self._logs: RunLogs | None = None
        if self._folder is not None:
            self._logs = RunLogs(self._folder, record.log_folder, record.nodes)
            self.nodes = self._logs.nodes
        if only_node is not None:
            self._only(only_node)

    def _for_cluster(self, smb_user: str | None, smb_server: str | None, smb_port: int) -> None:
        from hpcjob.share import LocalFolder, ShareError
        from hpcjob.spec import parse_share

        record = self.record
        cluster = ClusterAccess(record.cluster, record.backend)  # one password: head node and share
        backend = cluster.backend
        self._scheduler_end = lambda: _exit_code(backend.status(record))
        backend.status(record)  # a run whose job was never made has no logs: this says so, in one line
        if record.local_root:
            self._folder = LocalFolder(Path(record.local_root))
            return
        if not record.share:
            why = (
                f"run {record.run_id} was submitted without a share"
                if record.job_folder
                else f"job {record.job_id} was not submitted from this machine: its share and folder are "
                "unknown"
            )
            self.warning = (
                f"{why}, so hpcjob cannot read its log files; showing the scheduler's copy of each task's "
                "output, which holds only its first 1500 bytes (give the share with `hpcjob logs --share "
                f"UNC --job-folder PATH`, or add it to cluster {record.cluster})"
            )
        else:
            try:
                self._folder = cluster.share(
                    parse_share(record.share),
                    smb_user or record.smb_user,
                    smb_server or record.smb_server,
                    record.smb_port or smb_port,
                )
                return
            except ShareError as exc:
                self.warning = (
                    f"{exc}; showing the scheduler's copy of each task's output, which holds only its "
                    "first 1500 bytes"
                )
        self.scheduler_copy = backend.task_outputs(record)

    def _only(self, only_node: str) -> None:
        from hpcjob.logs import RunLogs

        match = [n for n in self.nodes if n.upper() == only_node.upper()]
        if not match:
            where = f"{self._folder.describe()}/{self.record.log_folder}" if self._folder else "its output"
            known = ", ".join(self.nodes) or f"none yet in {where}"
            self.close()
            raise SpecError(f"run {self.record.run_id} has no node {only_node!r}; its nodes: {known}")
        self.nodes = match
        if self._logs is not None and self._folder is not None:
            self._logs = RunLogs(self._folder, self.record.log_folder, match)
        if self.scheduler_copy is not None:
            self.scheduler_copy = [(n, text) for n, text in self.scheduler_copy if n in match]

    def lines(
        self, *, follow: bool = False, poll_s: float = 1.0, idle_timeout_s: float = 60.0
    ) -> Iterator[tuple[str, str, str]]:
        """Each node's lines in node order: what is there now, or with `follow`, new lines as they come
        until the run has ended (`exit_code` then says how), or until a task has failed and nothing came
        for `idle_timeout_s` (a killed task writes no end mark)."""
        if self._logs is None:  # the scheduler's copy: all there is, at once
            for node, text in self.scheduler_copy or ():
                for line in text.splitlines():
                    yield node, "stdout", line
            return  # its job's end is not followed: the copy is all there will be
        logs = self._logs
        quiet_since = time.monotonic()
        while True:
            ended = self._ended() if follow else 0
            said = False
            for node, stream, line in logs.lines(final=ended is not None):
                said = True
                yield node, stream, line
            if ended is not None:
                self.exit_code = ended if follow else None
                return
            if said:
                quiet_since = time.monotonic()
            failed = [code for code in logs.exit_codes().values() if code != 0]
            if failed and time.monotonic() - quiet_since > idle_timeout_s:
                self.exit_code = failed[0]
                return
            time.sleep(poll_s)

    def _ended(self) -> int | None:
        assert self._logs is not None
        ended = self._logs.ended()
        if ended is None and self._scheduler_end is not None:
            ended = self._scheduler_end()
        return ended

    def latest_step(self) -> dict[str, Any] | None:
        """While the run goes on, its training's newest line of metrics over time (None once it ended,
        or before its first step)."""
        if self._logs is None:
            return None
        steps = [t for t in self._logs.timeline() if t.get("event") == "step"]
        try:
            running = self._ended() is None
        except HpcjobError:  # a local run whose process was killed: ended, without a summary
            running = False
        return steps[-1] if steps and running else None

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()


def _local_backends() -> tuple[str, ...]:
    from hpcjob.backends import BACKENDS
    from hpcjob.spec import CLUSTER_BACKENDS

    return tuple(kind for kind in BACKENDS if kind not in CLUSTER_BACKENDS)


def _exit_code(info: JobInfo) -> int | None:
    return info.exit_code() if info.ended else None


@dataclass(frozen=True)
class MountRequest:
    """What `hpcjob mount` mounts: the share and the filter's options as an administrator allows them
    (`allowed`, for every user's folder of its mount root), this user's mount point, and the nodes (none:
    every usable node of `group`)."""

    allowed: AllowedShare
    point: str
    group: str | None
    nodes: tuple[str, ...]
    containers: ContainerPolicy | None = None  # with --install: the administrator's container policy


def mount_request(
    profile: ClusterProfile,
    share: str | None,
    mount_point: str | None,
    mount_options: str | None,
    node_group: str | None,
    node_names: Iterable[str],
    allow_images: Sequence[str] = (),
    allow_docker_options: Sequence[str] = (),
    allow_volumes: Sequence[str] = (),
) -> MountRequest:
    """The mount as asked (the profile filling in), checked: the share, a mount point that is the user's
    own folder of its mount root, the filter's options from its short list, the group's name; and the
    container policy to install, when images are allowed."""
    from hpcjob.plan import AllowedShare, ContainerPolicy, user_mount_point
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
    containers = None
    if allow_images:
        containers = ContainerPolicy.checked(allow_images, allow_docker_options, allow_volumes, [root])
    elif allow_docker_options or allow_volumes:
        raise SpecError("a container policy names its images: give --allow-image PREFIX")
    return MountRequest(allowed, point, group, parse_node_names(names) if names else (), containers)


def prepare_share(cluster: ClusterAccess, unc: str) -> str:
    """An administrator's: hpcjob/ on the share made theirs, with every cluster user allowed to make a
    folder of their own in it and nobody else to move it (hpcjob.share.SmbFolder.prepare_common). What
    was done, in a line; a share that cannot be reached is said, not raised: the filter is installed."""
    from hpcjob.share import ShareError
    from hpcjob.spec import SHARE_FOLDER, parse_share

    profile = cluster.profile
    try:
        folder = cluster.share(parse_share(unc), None, profile.smb_server, profile.smb_port)
        try:
            folder.prepare_common(SHARE_FOLDER)
        finally:
            folder.close()
    except (ShareError, SpecError) as exc:
        return (
            f"hpcjob: warning: {SHARE_FOLDER}/ on the share was not prepared ({exc}): until it is, users' "
            "uploads are refused once another user owns it"
        )
    return (
        f"hpcjob: {SHARE_FOLDER}/ on the share is an administrator's: each user makes a folder of their own "
        "there"
    )


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
        command = filter_install_command([allowed], request.containers)
        ok, said = backend.install_filter(command, shape, progress)
        for line in said.splitlines():
            progress(line)
        if not ok:
            raise HpcjobError(
                "installing hpcjob's execution filter failed on some node (see above): it needs an HPC "
                "administrator"
            )
        progress(prepare_share(cluster, allowed.unc))
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
