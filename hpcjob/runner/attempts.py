"""A run that outlives a lost node: when an attempt (one HPC Pack job) ends for a cause outside the
program (hpcjob.job.attempts), the next attempt is planned afresh and submitted as a new job on healthy
nodes, the lost ones left out, from the run's last checkpoint (every attempt shares the run's
checkpoint folder). A requeue cannot do this: hpcjob's tasks are not rerunnable, neither REST nor job XML
can exclude a node, and the first node is in every command line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner.access import Progress, submit_failure
from hpcjob.runner.follow import follow_run

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.attempts import Cause
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobInfo, JobSummary, Submission
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder


@dataclass(frozen=True)
class Retries:
    """How a run goes on: at most `retries` more attempts (0: none), for causes outside the program or,
    with retry_on "any", every failure; waiting at most `node_wait_s` for enough healthy nodes; a failed
    job watched for `settle_s` first, in case HPC Pack requeues it itself (JobRetryCount)."""

    retries: int = 0
    retry_on: str = "outside"
    node_wait_s: float = 600.0
    settle_s: float = 5.0
    poll_s: float = 5.0

    def __post_init__(self) -> None:
        from hpcjob.job.attempts import MAX_RETRIES, RETRY_ON

        if not 0 <= self.retries <= MAX_RETRIES:
            raise SpecError(f"--retries {self.retries}: give 0 to {MAX_RETRIES}")
        if self.retry_on not in RETRY_ON:
            raise SpecError(f"--retry-on {self.retry_on!r}: give {' or '.join(RETRY_ON)}")
        if self.node_wait_s < 0:
            raise SpecError("--node-wait must not be negative")


def follow_attempts(
    backend: Backend,
    spec: JobSpec,
    record: RunRecord,
    plan: JobPlan,
    open_folder: Callable[[], ShareFolder | None],
    started: float,
    progress: Progress,
    retries: Retries,
    *,
    mount_step: bool,
) -> tuple[RunRecord, JobSummary]:
    """Follow the run's attempts to the run's end: each attempt to its summary (follow_run), and while
    its cause is retried and attempts are left, the next one. The newest attempt's record, and its
    summary with a line for each attempt that went before."""
    from hpcjob.job.attempts import attempt_cause
    from hpcjob.job.results import State
    from hpcjob.store.runs import record_attempt_end, was_canceled

    told: list[str] = []
    total = retries.retries + 1
    while True:
        summary = follow_run(backend, record, plan, open_folder, started, progress)
        if summary.state is State.FINISHED or retries.retries == 0:
            if record.attempt > 1:
                _keep(record_attempt_end, record, summary, "finished", "finished", False)
            return record, _told(summary, told)
        info = _final(backend, record, retries, progress)
        if info is None:  # HPC Pack requeued the job itself: the same attempt goes on
            continue
        canceled = summary.state is State.CANCELED or _kept(was_canceled, record.run_id)
        nodes_now = backend.nodes(spec.node_group)
        cause = attempt_cause(summary, info, nodes_now, canceled_by_user=canceled, retry_on=retries.retry_on)
        last = record.attempt >= total
        _keep(record_attempt_end, record, summary, cause.kind, cause.said, cause.retried and not last)
        told.append(
            f"attempt {record.attempt} (job {record.job_id} on {', '.join(plan.nodes)}): {cause.said}"
        )
        if not cause.retried:
            return record, _told(summary, told)
        if last:
            told.append(f"no attempt left: --retries {retries.retries}")
            return record, _told(summary, told)
        progress(
            f"attempt {record.attempt} of {total} ended: {cause.said}; attempt {record.attempt + 1} next"
        )
        spec = _next_spec(spec, cause)
        if _kept(was_canceled, record.run_id):  # `hpcjob cancel` came as the attempt ended
            told.append("the run was canceled: no other attempt")
            return record, _told(summary, told)
        record, plan = submit_attempt(
            backend, spec, record, open_folder, retries, mount_step=mount_step, progress=progress
        )
        progress(f"attempt {record.attempt} of {total}: job {record.job_id} on {', '.join(plan.nodes)}")


def _keep(write: Callable[..., None], *args: object) -> None:
    """Write to the history; one that fails has said so on its own: the run's attempts matter more."""
    with contextlib.suppress(HpcjobError):
        write(*args)


def _kept(read: Callable[[str], bool], run_id: str) -> bool:
    """Read the history; one that fails reads as nothing recorded."""
    try:
        return read(run_id)
    except HpcjobError:
        return False


def _told(summary: JobSummary, told: list[str]) -> JobSummary:
    return replace(summary, events=[*told, *summary.events]) if told else summary


def _final(backend: Backend, record: RunRecord, retries: Retries, progress: Progress) -> JobInfo | None:
    """The attempt's job once it stays ended for `settle_s` (None: HPC Pack requeued it)."""
    deadline = time.monotonic() + retries.settle_s
    while True:
        info = backend.status(record)
        if not info.ended:
            progress(f"job {record.job_id} was requeued by HPC Pack: following it again")
            return None
        if time.monotonic() >= deadline:
            return info
        time.sleep(min(retries.poll_s, max(0.0, deadline - time.monotonic())))


def _next_spec(spec: JobSpec, cause: Cause) -> JobSpec:
    """The next attempt's job: the lost nodes never chosen again; a run that named its nodes and lost one
    lets the scheduler choose from its node group."""
    from hpcjob.job.attempts import next_attempt_exclusions

    lost = {n.upper() for n in cause.lost}
    names = spec.node_names
    if any(n.upper() in lost for n in names):
        names = ()
    return replace(spec, node_names=names, exclude_nodes=next_attempt_exclusions(spec.exclude_nodes, cause))


def submit_attempt(
    backend: Backend,
    spec: JobSpec,
    record: RunRecord,
    open_folder: Callable[[], ShareFolder | None],
    retries: Retries,
    *,
    mount_step: bool,
    progress: Progress,
) -> tuple[RunRecord, JobPlan]:
    """Plan and submit the run's next attempt (the code and wheels are on the share already), waiting at
    most `node_wait_s` for enough healthy nodes; the run's record follows each step."""
    from hpcjob.job.plan import attempt_log_folder
    from hpcjob.store.runs import record_next_attempt, save_run

    attempt = record.attempt + 1
    plan = _plan_when_nodes(backend, spec, record.run_id, attempt, retries, progress)
    folder = open_folder()
    if folder is not None:
        try:
            folder.makedirs(f"{spec.job_folder}/logs/{attempt_log_folder(record.run_id, attempt)}")
        finally:
            folder.close()
    latest = replace(record, attempt=attempt, nodes=plan.nodes, job_id=None, mount_job_id=None, state=None)
    record_next_attempt(latest)

    def step(done: Submission) -> None:
        nonlocal latest
        latest = replace(latest, state=done.state, job_id=done.job_id, mount_job_id=done.mount_job_id)
        save_run(latest)

    try:
        backend.submit(plan, mount=mount_step, progress=progress, record=step)
    except BaseException as exc:  # the run's row must not stay without a state: it failed here
        from hpcjob.store.runs import SUBMIT_FAILED

        failed = replace(latest, state=SUBMIT_FAILED, failure=submit_failure(exc, latest.state))
        with contextlib.suppress(Exception):  # the history itself failing: the first error says more
            save_run(failed)
        raise
    return latest, plan


def _plan_when_nodes(
    backend: Backend, spec: JobSpec, run_id: str, attempt: int, retries: Retries, progress: Progress
) -> JobPlan:
    """The attempt's plan once enough healthy nodes are there, asking every `poll_s`, `node_wait_s` at
    most; then the one line of why not."""
    deadline = time.monotonic() + retries.node_wait_s
    said = False
    while True:
        try:
            return backend.plan(spec, run_id, attempt)
        except SpecError as exc:
            if time.monotonic() >= deadline:
                raise HpcjobError(
                    f"attempt {attempt} of run {run_id} did not start: {exc} (waited "
                    f"{retries.node_wait_s:g} s, --node-wait)"
                ) from None
            if not said:
                progress(f"attempt {attempt} waits for healthy nodes: {exc}")
                said = True
            time.sleep(min(retries.poll_s, max(0.0, deadline - time.monotonic())))
