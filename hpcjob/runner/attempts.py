"""A run that outlives a lost node: when an attempt (one HPC Pack job) ends for a cause outside the
program (hpcjob.job.attempts), the next attempt is planned afresh and submitted as a new job on healthy
nodes, the lost ones left out, from the run's last checkpoint (every attempt shares the run's
checkpoint folder). A requeue cannot do this: hpcjob's tasks are not rerunnable, neither REST nor job XML
can exclude a node, and the first node is in every command line.

What a follower needs to go on lives in the run history (the newest attempt's spec and plan, the Retries,
the mount step), so that a follower that was stopped is taken up again by another (`take_up`: `hpcjob
wait`, Run.wait()), one at a time (hpcjob.store.followers): only this machine's history knows the run.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from hpcjob.job.attempts import attempt_line, told_lost
from hpcjob.job.spec import HpcjobError, SpecError, nodes_said
from hpcjob.runner.access import Progress, stopped_cluster_hint, submit_failure
from hpcjob.runner.follow import follow_run

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.attempts import Cause, Resumed
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobInfo, JobSummary, Submission
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import AttemptEntry, HistoryEntry, RunRecord
    from hpcjob.store.share import ShareFolder


@dataclass(frozen=True)
class Retries:
    """How a run goes on: at most `retries` more attempts (0: none), for causes outside the program or,
    with retry_on "any", every failure; waiting at most `node_wait_s` for enough healthy nodes; a failed
    job watched for `settle_s` first, in case HPC Pack requeues it itself (JobRetryCount); no other
    attempt once the run's attempts cost more than `max_cost_usd` (None: no bound)."""

    retries: int = 0
    retry_on: str = "outside"
    node_wait_s: float = 600.0
    settle_s: float = 5.0
    poll_s: float = 5.0
    max_cost_usd: float | None = None
    # How long a failure that looks like the network's is given for the head node to mark a lost node
    # before it is judged: HPC Pack marks one after HeartbeatInterval x InactivityCount (30 s x 3 by the
    # 2008 R2 SDK; Azure nodes x InactivityCountAzure, UNVERIFIED). Survivors of a lost node fail at once.
    detection_s: float = 120.0

    def __post_init__(self) -> None:
        from hpcjob.job.spec import MAX_RETRIES, RETRY_ON

        if not 0 <= self.retries <= MAX_RETRIES:
            raise SpecError(f"--retries {self.retries}: give 0 to {MAX_RETRIES}")
        if self.retry_on not in RETRY_ON:
            raise SpecError(f"--retry-on {self.retry_on!r}: give {' or '.join(RETRY_ON)}")
        if self.node_wait_s < 0:
            raise SpecError("--node-wait must not be negative")
        bound = self.max_cost_usd
        if bound is not None and not (math.isfinite(bound) and bound >= 0):
            raise SpecError(f"--max-cost {self.max_cost_usd}: give a number of US dollars, 0 or more")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Retries:
        """The Retries back from to_dict's form (keys of a newer hpcjob left out); SpecError when a value
        is not one."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{key: value for key, value in data.items() if key in known})
        except TypeError as exc:
            raise SpecError(f"recorded retries that cannot be read: {exc}") from None


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
    ended: JobSummary | None = None,
) -> tuple[RunRecord, JobSummary]:
    """Follow the run's attempts to the run's end: each attempt to its summary (follow_run), and while
    its cause is retried, attempts are left and --max-cost allows, the next one. The newest attempt's
    record, and the run's summary (_run_summary: a line for every attempt, those judged before this
    follower too). `ended`: the newest attempt's summary as the history keeps it, where it has ended: it
    is not followed again, and a run whose end the history holds is told as it is, nothing written."""
    from hpcjob.job.results import State
    from hpcjob.store.runs import record_attempt_end, was_canceled

    if backend.kind == "local":  # this machine's nodes are judged at once: no head node to hear from
        retries = replace(retries, settle_s=0.0, detection_s=0.0)
    told = [  # the attempts judged before this follower (its own, when it was interrupted)
        line
        for a in _attempts_kept(record)
        if a.attempt < record.attempt
        for line in [
            *([a.resumed.line(a.attempt)] if a.resumed else []),
            attempt_line(a.attempt, a.job_id, a.nodes, a.usage(None).data_node_names, a.said or a.cause or "")
            if a.ran
            else f"attempt {a.attempt}: {a.said}",
        ]
    ]
    total = retries.retries + 1
    unpriced_said = False
    while True:
        if ended is not None:
            summary, ended = ended, None
            if _run_ended(record, summary, retries):
                return record, _run_summary(record, summary, told)
        else:
            summary = follow_run(backend, record, plan, open_folder, started, progress)
        if summary.state is State.FINISHED or retries.retries == 0:
            if record.attempt > 1:
                resumed = _resumed(open_folder, record)
                told += [resumed.line(record.attempt)] if resumed else []
                _keep(record_attempt_end, record, summary, "finished", "finished", False, resumed)
            return record, _run_summary(record, summary, told)
        info = _final(backend, record, retries, progress)
        if info is None:  # HPC Pack requeued the job itself: the same attempt goes on
            continue
        canceled = summary.state is State.CANCELED or _kept(was_canceled, record.run_id)
        cause = _cause(backend, record, summary, info, canceled, retries, progress)
        summary = told_lost(summary, cause)
        last = record.attempt >= total
        over = None  # the line that ends the run at --max-cost
        if cause.retried and not last and retries.max_cost_usd is not None:
            spent, why = _run_cost(record, summary)
            if spent is None and not unpriced_said:
                progress(
                    f"hpcjob: warning: --max-cost: run {record.run_id}'s cost is unknown ({why}), so it "
                    "cannot be bounded: its attempts go on"
                )
                unpriced_said = True
            if spent is not None:
                from hpcjob.job.attempts import past_max_cost

                over = past_max_cost(spent, retries.max_cost_usd)
        goes_on = cause.retried and not last and over is None
        said = cause.said + ("" if cause.kind == "canceled" else _in_epoch(open_folder, record))
        resumed = _resumed(open_folder, record) if record.attempt > 1 else None
        _keep(record_attempt_end, record, summary, cause.kind, said, goes_on, resumed)
        told += [resumed.line(record.attempt)] if resumed else []
        told.append(attempt_line(record.attempt, record.job_id, plan.nodes, plan.data_node_names, said))
        if not cause.retried:
            return record, _run_summary(record, summary, told)
        if last:
            told.append(f"no attempt left: --retries {retries.retries}")
            return record, _run_summary(record, summary, told)
        if over is not None:
            progress(over)
            told.append(over)
            return record, _run_summary(record, summary, told)
        progress(
            f"attempt {record.attempt} of {total} ended: {cause.said}; attempt {record.attempt + 1} next"
        )
        spec = _next_spec(spec, cause)
        if _kept(was_canceled, record.run_id):  # `hpcjob cancel` came as the attempt ended
            told.append("the run was canceled: no other attempt")
            return record, _run_summary(record, summary, told)
        try:
            record, plan = submit_attempt(
                backend, spec, record, open_folder, retries, mount_step=mount_step, progress=progress
            )
        except HpcjobError as exc:  # no nodes within --node-wait, a cancel, a refused submission
            _keep(record_attempt_end, record, summary, cause.kind, cause.said, False)  # not retried after all
            told.append(f"attempt {record.attempt + 1} did not start: {exc}")
            return record, _run_summary(record, summary, told)
        started = time.monotonic()  # the attempt's own wall time
        progress(f"attempt {record.attempt} of {total}: job {record.job_id} on {nodes_said(plan.nodes)}")


def _cause(
    backend: Backend,
    record: RunRecord,
    summary: JobSummary,
    info: JobInfo,
    canceled: bool,
    retries: Retries,
    progress: Progress,
) -> Cause:
    """How the attempt ended, judged on every node the scheduler knows (a --node outside the profile's
    group too). A failure that looks like the network's with no node lost yet may be a lost node the
    head node has not marked: its survivors fail at once. The nodes are asked again until one of the
    job's turns unusable, `detection_s` at most, so a lost node is left out of the next attempt."""
    from hpcjob.job.attempts import attempt_cause

    def judged() -> Cause:
        return attempt_cause(
            summary, info, backend.nodes(None), canceled_by_user=canceled, retry_on=retries.retry_on
        )

    cause = judged()
    if cause.kind not in ("network", "task ended by the scheduler") or cause.lost:
        return cause
    progress(
        f"attempt {record.attempt} failed as when a node is lost: asking the head node, "
        f"{retries.detection_s:g} s at most"
    )
    deadline = time.monotonic() + retries.detection_s
    while time.monotonic() < deadline and not cause.lost:
        time.sleep(min(retries.poll_s, max(0.0, deadline - time.monotonic())))
        cause = judged()
    return cause


def _resumed(open_folder: Callable[[], ShareFolder | None], record: RunRecord) -> Resumed | None:
    """Where the record's attempt went on from and the work done again, from its timeline and the
    attempt before it's (hpcjob.job.attempts.resumed_of); None where none says (or the share is away)."""
    from hpcjob.job.attempts import resumed_of
    from hpcjob.job.layout import attempt_log_folder
    from hpcjob.store.logs import RunLogs

    try:
        folder = open_folder()
    except HpcjobError:
        return None
    if folder is None:
        return None
    before = f"{record.job_folder}/logs/{attempt_log_folder(record.run_id, record.attempt - 1)}"
    try:
        current = RunLogs(folder, record.log_folder, record.nodes).timeline()
        previous = RunLogs(folder, before, record.nodes).timeline()
    except (HpcjobError, OSError):  # the attempt is told without it
        return None
    finally:
        folder.close()
    return resumed_of(previous, current)


def _in_epoch(open_folder: Callable[[], ShareFolder | None], record: RunRecord) -> str:
    """Where the attempt's ranks were when it ended, from their timelines on the share: " in epoch N"
    (a step line of epoch N came last) or " after epoch N" (its end came last); "" where none says."""
    from hpcjob.store.logs import RunLogs

    try:
        folder = open_folder()
    except HpcjobError:
        return ""
    if folder is None:
        return ""
    try:
        timeline = RunLogs(folder, record.log_folder, record.nodes).timeline()  # in time order
    except (HpcjobError, OSError):  # the line is said without it
        return ""
    finally:
        folder.close()
    marks = [e for e in timeline if isinstance(e.get("epoch"), int) and not isinstance(e.get("epoch"), bool)]
    if not marks:
        return ""
    last = marks[-1]
    return f" {'after' if last.get('event') == 'epoch' else 'in'} epoch {last['epoch']}"


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


def _run_cost(record: RunRecord, summary: JobSummary) -> tuple[float | None, str]:
    """What the run's attempts so far cost (hpcjob.job.usage's rule: the earlier ones' as the history
    keeps them, the record's own from its summary), and where it is unknown, why."""
    from hpcjob.store.runs import find_entry

    try:
        usage = find_entry(record.run_id).usage_with(summary)
    except HpcjobError as exc:
        return None, f"the run history cannot be read: {exc}"
    why = (
        usage.unknown_cost() or "no attempt has a price: the cluster profile names no --vm-size and --region"
    )
    return usage.cost_usd, why


def _run_ended(record: RunRecord, summary: JobSummary, retries: Retries) -> bool:
    """Whether the run whose newest attempt ended with `summary` has ended as the history says: nothing
    more to judge (one attempt, no retries; it finished) or its end judged, and not retried."""
    from hpcjob.job.results import State

    if summary.state is State.FINISHED or retries.retries == 0:
        return record.attempt == 1 or any(a.attempt == record.attempt for a in _attempts_kept(record))
    judged = [a for a in _attempts_kept(record) if a.attempt == record.attempt]
    return bool(judged) and not judged[0].retried


def _attempts_kept(record: RunRecord) -> list[AttemptEntry]:
    from hpcjob.store.runs import find_entry

    try:
        return find_entry(record.run_id).attempts
    except HpcjobError:
        return []


def _run_summary(record: RunRecord, summary: JobSummary, told: list[str]) -> JobSummary:
    """The run's summary at its end: its newest attempt's, with a line for each attempt before it
    (`told`) and, for a run of several attempts, each attempt's own figures, the wall time and cost
    being the run's (hpcjob.job.usage, from the history)."""
    from hpcjob.store.runs import find_entry

    try:
        usage = find_entry(record.run_id).usage_with(summary)
    except HpcjobError:
        usage = None
    if usage is not None and len(usage.attempts) > 1:
        summary = replace(summary, run_attempts=list(usage.attempts), wall_time_s=round(usage.wall_s, 3))
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
    """The next attempt's job: the lost nodes never chosen again; a run that named its nodes (or data
    nodes) and lost one lets hpcjob choose from its node group (or data node group)."""
    from hpcjob.job.attempts import next_attempt_exclusions

    lost = {n.upper() for n in cause.lost}
    names, data_names = spec.node_names, spec.data_node_names
    if any(n.upper() in lost for n in names):
        names = ()
    if any(n.upper() in lost for n in data_names):  # the data nodes come from their group, if it has one
        data_names = ()
    return replace(
        spec,
        node_names=names,
        data_node_names=data_names,
        exclude_nodes=next_attempt_exclusions(spec.exclude_nodes, cause),
    )


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
    from hpcjob.job.layout import attempt_log_folder
    from hpcjob.job.render import plan_json
    from hpcjob.store.runs import record_next_attempt, save_run
    from hpcjob.store.secrets import hand_over_secrets, remove_attempt_secrets

    attempt = record.attempt + 1
    plan = _plan_when_nodes(backend, spec, record.run_id, attempt, retries, progress, record.cluster)
    folder = open_folder()
    if folder is not None:
        try:
            folder.makedirs(f"{spec.job_folder}/logs/{attempt_log_folder(record.run_id, attempt)}")
        finally:
            folder.close()
    plan = hand_over_secrets(spec, plan, open_folder, local=backend.kind == "local")  # its own (--secret)
    # Nothing of the earlier attempt's job, nor of its process (a local attempt has one of its own).
    latest = replace(
        record, attempt=attempt, nodes=plan.nodes, job_id=None, mount_job_id=None, state=None, pid=None,
        pid_start=None,
    )  # fmt: skip
    # Its plan and spec replace the earlier attempt's: whoever takes the run up plans from them.
    record_next_attempt(latest, plan=plan_json(plan), spec=json.dumps(spec.to_dict()))

    def step(done: Submission) -> None:
        nonlocal latest
        latest = latest.after(done)
        save_run(latest)

    try:
        backend.submit(plan, mount=mount_step, progress=progress, record=step)
    except BaseException as exc:  # the run's row must not stay without a state: it failed here
        from hpcjob.store.runs import SUBMIT_FAILED

        failed = replace(latest, state=SUBMIT_FAILED, failure=submit_failure(exc, latest.state))
        with contextlib.suppress(Exception):  # the history itself failing: the first error says more
            save_run(failed)
        if plan.secrets_file is not None:  # no job of it will read its secrets: not left on the share
            with contextlib.suppress(Exception):
                folder = open_folder()
                try:
                    remove_attempt_secrets(folder, plan, progress)
                finally:
                    if folder is not None:
                        folder.close()
        raise
    return latest, plan


def _plan_when_nodes(
    backend: Backend,
    spec: JobSpec,
    run_id: str,
    attempt: int,
    retries: Retries,
    progress: Progress,
    cluster: str | None,
) -> JobPlan:
    """The attempt's plan once enough healthy nodes are there, asking every `poll_s`, `node_wait_s` at
    most; then the one line of why not (with how to start `cluster` where hpcjob stopped it)."""
    from hpcjob.job.spec import NotEnoughNodes
    from hpcjob.store.runs import was_canceled

    deadline = time.monotonic() + retries.node_wait_s
    said = False
    while True:
        if _kept(was_canceled, run_id):
            raise HpcjobError(f"run {run_id} was canceled while attempt {attempt} waited for nodes")
        try:
            return backend.plan(spec, run_id, attempt)
        except NotEnoughNodes as short:
            why = f"{short}{stopped_cluster_hint(cluster)}"
            if time.monotonic() >= deadline:
                raise HpcjobError(
                    f"attempt {attempt} of run {run_id} did not start: {why} (waited "
                    f"{retries.node_wait_s:g} s, --node-wait)"
                ) from None
            if not said:
                progress(f"attempt {attempt} waits for healthy nodes: {why}")
                said = True
            time.sleep(min(retries.poll_s, max(0.0, deadline - time.monotonic())))


def not_in_history(run_or_job_id: str) -> str:
    """The line for a run this machine's history does not know: only where it started is it known."""
    return (
        f"no run {run_or_job_id!r} in this machine's history: only the machine that started a run holds its "
        "history (its attempts and retries), so follow it there; `hpcjob status JOB_ID` shows a job from "
        "anywhere"
    )


# The steps of a submission that stopped half way: the job may be made, and is not submitted.
_HALF_WAY = ("creating", "mounting", "created")


def take_up(
    run_or_job_id: str,
    progress: Progress,
    *,
    command: str,
    max_cost_usd: float | None = None,
) -> tuple[RunRecord, JobSummary]:
    """Follow a run of this machine's history from where it is (`hpcjob wait`, Run.wait()): its newest
    attempt to its end, then on with its attempts as its recorded Retries say (`max_cost_usd`, given,
    replaces the recorded bound), holding the run's follower lock throughout (`command`: what another
    follower is told; FollowedElsewhere while another holds it). The newest attempt's record, and the
    run's summary, as `submit --wait` ends with them."""
    from hpcjob.job.plan import JobPlan
    from hpcjob.runner.access import backend_for_run, run_folder_opener
    from hpcjob.store.followers import follower_lock
    from hpcjob.store.runs import SUBMIT_FAILED, find_entry
    from hpcjob.store.secrets import remove_left_over_secrets

    try:
        run_id = find_entry(run_or_job_id).record.run_id
    except SpecError:
        raise SpecError(not_in_history(run_or_job_id)) from None
    with follower_lock(run_id, command):
        entry = find_entry(run_id)  # again, under the lock: a follower before this one may have gone on
        record = entry.record
        backend = backend_for_run(record)  # a run rendered for submitting by hand has none: one line
        started = _attempt_clock(entry)
        folder = run_folder_opener(record)
        if entry.summary is not None:  # --secret: an ended attempt's file its follower left
            remove_left_over_secrets(record, folder)
        if record.attempt == 1 and (record.state == SUBMIT_FAILED or record.state in _HALF_WAY):
            why = record.failure or f"its submission stopped while {record.state}"
            raise HpcjobError(
                f"run {run_id} was never submitted ({why}): there is no job to follow; submit it again "
                f"(`hpcjob cancel {run_id}` cancels a job it may have made)"
            )
        try:
            plan = JobPlan.from_dict(entry.plan) if entry.plan else None
        except (TypeError, ValueError, KeyError):
            plan = None
        if plan is None:
            raise HpcjobError(f"run {run_id} has no plan in this machine's history: hpcjob cannot follow it")
        spec, retries, mount_step = _recorded_way(record, max_cost_usd, progress)
        if spec is None:  # a run whose job cannot be read: followed, never retried
            return record, entry.summary or follow_run(backend, record, plan, folder, started, progress)
        unsent = record.state is None and not record.job_id
        cut_short = record.state in (*_HALF_WAY, SUBMIT_FAILED) or unsent
        ended = entry.summary
        if record.attempt > 1 and cut_short:  # its submission failed, or its follower stopped in it
            record, plan = _submitted_again(backend, spec, record, folder, retries, mount_step, progress)
            started, ended = time.monotonic(), None
        return follow_attempts(
            backend, spec, record, plan, folder, started, progress, retries, mount_step=mount_step,
            ended=ended,
        )  # fmt: skip


def attempt_clock(run_id: str, default: float) -> float:
    """When the run's newest attempt started, on this process's monotonic clock (what follow_run counts
    its wall time from), as the history says; `default` where it cannot be read."""
    from hpcjob.store.runs import find_entry

    try:
        return _attempt_clock(find_entry(run_id))
    except HpcjobError:
        return default


def _attempt_clock(entry: HistoryEntry) -> float:
    newest = entry.record.attempt
    since = entry.attempt_started if newest > 1 and entry.attempt_started else entry.started
    return time.monotonic() - max(0.0, time.time() - since)


def _recorded_way(
    record: RunRecord, max_cost_usd: float | None, progress: Progress
) -> tuple[JobSpec | None, Retries, bool]:
    """How the recorded run goes on: its newest attempt's spec (None: a spec this hpcjob cannot read,
    said when it had retries), its Retries (`max_cost_usd`, given, replacing the
    recorded bound) and whether its attempts mount the share first."""
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import recorded_follow

    spec_data, follow = recorded_follow(record.run_id)
    try:
        retries = Retries.from_dict((follow or {}).get("retries") or {})
    except SpecError:
        retries = Retries()
    if max_cost_usd is not None:
        retries = replace(retries, max_cost_usd=max_cost_usd)
    try:
        spec = JobSpec.from_dict(spec_data) if spec_data else None
    except SpecError:
        spec = None
    if spec is None and retries.retries:
        progress(
            f"hpcjob: warning: run {record.run_id}'s job is not in this machine's history as this hpcjob "
            "reads it (an older hpcjob's run?): its newest attempt is followed, and no other started"
        )
    return spec, retries, bool((follow or {}).get("mount_step", True))


def _submitted_again(
    backend: Backend,
    spec: JobSpec,
    record: RunRecord,
    folder: Callable[[], ShareFolder | None],
    retries: Retries,
    mount_step: bool,
    progress: Progress,
) -> tuple[RunRecord, JobPlan]:
    """The run's newest attempt, whose submission was cut short (its follower stopped) or failed (the
    network), submitted: afresh where nothing of it was sent; else it counts as an attempt that ran
    nothing (kept in the history), its half-made job canceled, and the next attempt goes."""
    from hpcjob.job.attempts import CUT_SHORT
    from hpcjob.store.runs import SUBMIT_FAILED, record_attempt_end, was_canceled

    attempt, run_id = record.attempt, record.run_id
    if _kept(was_canceled, run_id):
        raise HpcjobError(f"run {run_id} was canceled before attempt {attempt} was submitted")
    if record.state is None:  # planned, and nothing sent: the same attempt, planned again
        progress(f"attempt {attempt} of run {run_id} was not submitted yet: submitting it now")
        record = replace(record, attempt=attempt - 1)
    else:  # its job may be made, not submitted
        with contextlib.suppress(HpcjobError):
            backend.cancel(record, force=True)
        if record.state == SUBMIT_FAILED:
            said = f"its submission failed ({record.failure or 'no reason kept'}); its job, if made, canceled"
        else:
            said = f"its submission was cut short while {record.state} (its job, if made, canceled)"
        goes_on = attempt < retries.retries + 1
        _keep(record_attempt_end, record, None, CUT_SHORT, said, goes_on)
        if not goes_on:
            raise HpcjobError(
                f"attempt {attempt} of run {run_id}: {said}, and no attempt is left (--retries "
                f"{retries.retries})"
            )
        progress(f"attempt {attempt} of run {run_id}: {said}; attempt {attempt + 1} next")
    record, plan = submit_attempt(
        backend, spec, record, folder, retries, mount_step=mount_step, progress=progress
    )
    progress(f"attempt {record.attempt}: job {record.job_id} on {nodes_said(plan.nodes)}")
    return record, plan
