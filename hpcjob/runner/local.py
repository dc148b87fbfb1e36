"""A job run on this machine: the same plan, submitted to the local backend and followed to its end."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner.access import Progress, StoppedWaiting, keep_open, new_run_id, run_folder_opener
from hpcjob.runner.attempts import Retries, attempt_clock, follow_attempts
from hpcjob.runner.follow import follow_run
from hpcjob.runner.submit import job_spec, submit_run

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.options import JobOptions
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobSummary
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import RunRecord


@dataclass(frozen=True)
class LocalOptions:
    """How a job runs on this machine: `share_root`, the local folder that stands in for the share
    (None: one per project folder); `grace_period_s`, how long stopped nodes get after SIGINT before
    SIGKILL; `echo_output`, whether its progress has the nodes' output too."""

    share_root: Path | None = None
    grace_period_s: float = 10.0
    echo_output: bool = False


def start_local(
    options: JobOptions,
    local: LocalOptions,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    attached: bool = False,
    retries: Retries | None = None,
) -> tuple[Backend, JobSpec, RunRecord, JobPlan]:
    """Start a job on this machine (a share or mount point its options name does not apply), in a
    process of its own, through the local backend as the registry opens it: its nodes are local
    processes, its share a local folder, its rendezvous on a free port of loopback unless the options name
    one. `attached`: the job is canceled when this process ends; `retries`: recorded, as a cluster run's.
    The backend, the spec, the run's record and its plan."""
    import importlib.util
    import os
    import sys

    from hpcjob.backends import open_backend
    from hpcjob.backends.local import LocalBackend, free_port
    from hpcjob.backends.local.gpus import default_procs_per_node, share_gpus, visible_gpus
    from hpcjob.store.share import LocalFolder

    if sys.platform == "win32":  # its nodes are bash and torchrun processes in POSIX process groups
        raise SpecError("a local run needs Linux: on Windows, run it in WSL")
    # The local folder stands in for the share: the plan puts it there.
    values = replace(options, share=None, mount_point=None, rdzv_port=options.rdzv_port or free_port())
    spec = job_spec(values, local=True, progress=progress)
    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"a local run needs torch in {sys.executable}: pip install 'hpcjob[train]'")
    if options.nproc_per_node is None and options.gpus_per_node is None:
        # As on a cluster node: one process per GPU the node gets.
        spec = replace(spec, nproc_per_node=default_procs_per_node(visible_gpus(os.environ), spec.node_count))
    # Each local node's GPUs, as the backend's plan shares them out (none: the CPU), for the history.
    local_gpus = share_gpus(visible_gpus(os.environ), spec.node_count, spec.procs_per_node).devices[0]
    backend = open_backend("local", None, None)
    assert isinstance(backend, LocalBackend)
    backend.share_root, backend.grace_period_s = local.share_root, local.grace_period_s
    backend.echo_output, backend.attached = local.echo_output, attached
    keep_open(backend)

    def root(plan: JobPlan) -> str:  # the local folder the plan put the job folder in
        return plan.job_dir[: -len(spec.job_folder) - 1]

    record, plan = submit_run(
        backend,
        spec,
        options.run_id or new_run_id(spec.name),
        open_folder=lambda plan: LocalFolder(Path(root(plan))),
        where=lambda plan: {"local_root": root(plan)},
        mount_step=False,
        progress=progress,
        command=command,
        tags=tags,
        gpus_per_node=len(local_gpus.split(",")) if local_gpus else None,
        retries=retries,
    )
    return backend, spec, record, plan


def submit_local(
    options: JobOptions,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    retries: Retries | None = None,
) -> tuple[RunRecord, JobPlan]:
    """Start a job on this machine (`start_local`) that goes on whatever becomes of this process:
    status, wait, logs and cancel find it from anywhere; its `retries` start while someone follows it
    (`hpcjob wait`, Run.wait())."""
    _, _, record, plan = start_local(
        options, LocalOptions(), progress=progress, command=command, tags=tags, retries=retries
    )
    return record, plan


def run_local(
    options: JobOptions,
    local: LocalOptions,
    *,
    progress: Progress,
    command: str,
    tags: Mapping[str, str] | None = None,
    retries: Retries | None = None,
) -> JobSummary:
    """Run a job on this machine to its summary, as `submit --wait` follows a cluster's job (the same
    local backend, through `start_local` and `follow_run`), and with `retries`, its attempts as a
    cluster's (`follow_attempts`: a local node whose whole task is killed from outside is lost, and the
    next attempt runs on a fresh one). The job lives no longer than this process: Ctrl-C, SIGTERM and
    SIGHUP cancel it and the run (a second one: its nodes are killed at once) and it is followed on to its
    summary; a process killed outright takes the job with it."""
    import signal
    import sys

    if sys.platform == "win32":  # before hpcjob.backends.local.procs, which names POSIX signals
        raise SpecError("a local run needs Linux: on Windows, run it in WSL")
    from hpcjob.backends.local.procs import interrupt_on_cancel_signals

    before = interrupt_on_cancel_signals()
    started = time.monotonic()
    try:
        backend, spec, record, plan = start_local(
            options, local, progress=progress, command=command, tags=tags, attached=True,
            retries=retries,
        )  # fmt: skip
        interrupted = False
        while True:
            try:
                # Each interrupt is one SIGTERM to the job's process: the first stops the nodes, a second
                # kills them at once (as a second Ctrl-C in its own shell would).
                if interrupted:
                    record, plan = _cancel_newest(backend, record, plan)
                    started = attempt_clock(record.run_id, started)  # the newest attempt's own
                folder = run_folder_opener(record)
                if retries is None or not retries.retries:
                    return follow_run(backend, record, plan, folder, started, progress)
                return follow_attempts(
                    backend, spec, record, plan, folder, started, progress, retries, mount_step=False
                )[1]
            except (KeyboardInterrupt, StoppedWaiting):
                interrupted = True
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)


def _cancel_newest(backend: Backend, record: RunRecord, plan: JobPlan) -> tuple[RunRecord, JobPlan]:
    """Cancel the run (no attempt after it) and its newest attempt's job, as the history has it now (an
    interrupt may come while the attempts go on): that attempt's record and plan."""
    from hpcjob.job.plan import JobPlan
    from hpcjob.store.runs import find_entry, record_cancel

    with contextlib.suppress(HpcjobError):  # the job's cancel matters more than the mark
        record_cancel(record.run_id)
        entry = find_entry(record.run_id)
        record, plan = entry.record, JobPlan.from_dict(entry.plan) if entry.plan else plan
    backend.cancel(record, force=False)
    return record, plan
