"""Reaching a cluster and a run: profiles, passwords and backends opened (and closed), runs looked up,
where a run's files are, and the types every runner module shares."""

from __future__ import annotations

import contextlib
import re
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.options import JobOptions
    from hpcjob.job.results import JobInfo
    from hpcjob.job.spec import Share
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder


Progress = Callable[[str], None]


class StoppedWaiting(HpcjobError):
    """Following a job was interrupted (Ctrl-C): the job goes on."""


class HpcjobWarning(UserWarning):
    """Something a person should know that stops nothing (the CLI prints it as `hpcjob: warning: ...`)."""


# Every backend opened here, closed by `close_backends` (a WinRM shell counts against the user's quota).
_OPEN: list[Backend] = []


def keep_open(backend: Backend) -> None:
    """Close `backend` with the others (close_backends)."""
    _OPEN.append(backend)


def close_backends() -> None:
    """Let go of every head node opened so far."""
    while _OPEN:
        with contextlib.suppress(Exception):  # closing is best effort: the work is done
            _OPEN.pop().close()


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def profile_mount_point(profile: ClusterProfile) -> str:
    """Where the profile's user's jobs see the share: the profile's, else their folder of /app."""
    from hpcjob.job.plan import user_mount_point
    from hpcjob.job.spec import DEFAULT_MOUNT_POINT

    return profile.mount_point or user_mount_point(DEFAULT_MOUNT_POINT, profile.user)


def render_owner() -> str:
    """Who a rendered job is for, to submit by hand: the default cluster profile's user, else this
    machine's user name. Their folder on the share holds the job folder
    (hpcjob.job.spec.share_user_folder)."""
    import getpass

    from hpcjob.store.config import get_profile

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


def with_profile(options: JobOptions, profile: ClusterProfile) -> JobOptions:
    """The job's options with the profile filling in what they do not say: each option the table marks
    as the profile's (hpcjob.job.options.profile_keys), the mount point by default the job owner's folder
    of /app (where hpcjob's execution filter mounts the share for them), the profile's secrets before the
    job's own, the rendezvous port (a free port of this machine's, picked now, where the profile's nodes
    are this machine and none is given), and one process per GPU of the cluster's size. The job is the
    profile user's: their folder on the share holds it."""
    from hpcjob.job.options import profile_keys

    taken = ("mount_point", "gpus_per_node", "secrets")  # each below, in its own way
    defaults: dict[str, Any] = {key: getattr(profile, key) for key in profile_keys() if key not in taken}
    defaults["mount_point"] = profile_mount_point(profile)
    filled = options.filled({key: value for key, value in defaults.items() if value})
    filled = replace(filled, owner=profile.user)
    if profile.secrets:  # the profile's names, then the job's own
        filled = replace(filled, secrets=tuple(dict.fromkeys((*profile.secrets, *filled.secrets))))
    if profile.nodes_here and not filled.rdzv_port:
        # Every job here would take 29400 and the second would fail: one free port each, as run --local.
        from hpcjob.backends.local import free_port

        filled = replace(filled, rdzv_port=free_port())
    gpus, _ = gpus_for_nodes(filled, profile)
    return filled if gpus is None else replace(filled, gpus_per_node=gpus)


def gpus_for_nodes(options: JobOptions, profile: ClusterProfile | None) -> tuple[int | None, str | None]:
    """Each node's GPUs for a job of `options` and where that comes from: the options, else the
    profile's gpus_per_node, else the size table's GPUs of the nodes' VM size (the options' or the
    profile's); (None, None) where --nproc-per-node alone is given or nothing says."""
    from hpcjob.job.sizes import gpus_per_node

    if options.gpus_per_node is None and options.nproc_per_node is not None:
        return None, None
    vm_size = options.vm_size or (profile.vm_size if profile else None)
    return gpus_per_node(options.gpus_per_node, profile.gpus_per_node if profile else None, vm_size)


def open_smb(share: Share, user: str | None, server: str | None, port: int) -> ShareFolder:
    """The share over SMB as a user without a cluster profile: HPCJOB_SMB_USER/_PASSWORD, or a prompt."""
    from hpcjob.store.credentials import smb_password, smb_user
    from hpcjob.store.share import SmbFolder

    who = smb_user(user)
    return SmbFolder(share, who, smb_password(who), server=server, port=port)


class ClusterAccess:
    """A cluster profile, its password (read once) and its backend, opened as the profile says unless
    `backend_kind` names another."""

    def __init__(self, cluster_name: str | None, backend_kind: str | None = None) -> None:
        from hpcjob.backends import open_backend
        from hpcjob.store.config import get_profile, password_for, with_caller_user

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
        from hpcjob.store.credentials import smb_password
        from hpcjob.store.share import LocalFolder, SmbFolder

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
    from hpcjob.backends.local import LocalBackend

    if record.cluster is None:
        if record.backend not in BACKENDS:
            raise SpecError(
                f"run {record.run_id} was rendered for submitting by hand: ask its cluster, or give the "
                "job id"
            )
        backend = open_backend(record.backend, None, None)
        if isinstance(backend, LocalBackend) and record.local_root:  # its later attempts: the same folder
            backend.share_root = Path(record.local_root)
        return backend
    return ClusterAccess(cluster_name or record.cluster, backend_kind or record.backend).backend


def run_status(
    record: RunRecord, cluster_name: str | None = None, backend_kind: str | None = None
) -> tuple[JobInfo, dict[str, Any] | None]:
    """The run's job as its backend sees it now, learnt by this machine's history; where its logs are on
    this machine (a local run, a mounted share), with the GPUs' use and, while it runs, its newest line
    of metrics over time."""
    from hpcjob.store.logs import RunLogs
    from hpcjob.store.runs import record_state
    from hpcjob.store.secrets import remove_left_over_secrets
    from hpcjob.store.share import LocalFolder

    info = backend_for_run(record, cluster_name, backend_kind).status(record)
    if record.job_folder:  # a run of this machine's
        record_state(record.run_id, info.state, info.exit_code() if info.ended else None)
    if info.ended:  # --secret: a file its follower left (none followed it, or the share was away)
        remove_left_over_secrets(record, lambda: run_folder(record))
    if not record.local_root:
        return info, None
    run_logs = RunLogs(LocalFolder(Path(record.local_root)), record.log_folder, record.nodes)
    info = replace(info, gpu_use=tuple(run_logs.gpu_use()))
    steps = [line for line in run_logs.timeline() if line.get("event") == "step"]
    return info, steps[-1] if steps and not info.ended else None


def stopped_cluster_hint(cluster_name: str | None) -> str:
    """For a line about too few nodes: how to start the cluster's compute nodes where `hpcjob cluster stop`
    deallocated them, as this machine last saw them ("" otherwise)."""
    from hpcjob.store.config import get_profile
    from hpcjob.store.power import STOPPED, power_record

    try:
        profile = get_profile(cluster_name) if cluster_name else None
    except SpecError:
        return ""
    if profile is None or not profile.resource_group:
        return ""
    record = power_record(profile.name, profile.resource_group)
    if record is None or record.state != STOPPED:
        return ""
    return (
        f"; cluster {profile.name}'s compute nodes were stopped by `hpcjob cluster stop` ({record.when}): "
        f"`hpcjob cluster start {profile.name}` starts them"
    )


def cancel_run(
    record: RunRecord, cluster_name: str | None = None, backend_kind: str | None = None, force: bool = False
) -> str | None:
    """Cancel the run's job, and the run: a follower with --retries starts no other attempt after it.
    None, or the state the job had already ended in (or "Canceling")."""
    from hpcjob.store.runs import record_cancel
    from hpcjob.store.secrets import remove_left_over_secrets

    if record.job_folder:  # a run of this machine's history
        with contextlib.suppress(HpcjobError):  # the job's cancel matters more than the mark
            record_cancel(record.run_id)
    ended = backend_for_run(record, cluster_name, backend_kind).cancel(record, force=force)
    remove_left_over_secrets(record, lambda: run_folder(record))  # --secret: no task reads them again
    return ended


# What a submission was doing at each step it records (hpcjob.job.results.Submission).
_DOING = {"creating": "creating the job", "mounting": "mounting the share", "created": "submitting the job"}


def submit_failure(exc: BaseException, step: str | None) -> str:
    """Why a submission stopped at `step`, in one line (the run's record keeps it)."""
    doing = _DOING.get(str(step), "submitting the job")
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted (Ctrl-C) while {doing}"
    return f"{' '.join(str(exc).split()) or type(exc).__name__} (while {doing})"


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
    from hpcjob.store.config import get_profile
    from hpcjob.store.runs import RunRecord, find_run

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


def run_folder(
    record: RunRecord, smb_user: str | None = None, smb_server: str | None = None, smb_port: int = 445
) -> ShareFolder:
    """Where the run's files are, read from here: the local folder recorded, else the share over SMB,
    reached as recorded unless the --smb-* options say otherwise."""
    from hpcjob.job.spec import parse_share
    from hpcjob.store.share import LocalFolder

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


def run_folder_opener(record: RunRecord) -> Callable[[], ShareFolder | None]:
    """How to reach the run's files for its summary: None where no share or folder was recorded."""
    if not (record.local_root or record.share):
        return lambda: None
    return lambda: run_folder(record)
