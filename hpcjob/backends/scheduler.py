"""What the backends that reach a scheduler share: choosing nodes, following a job, its summary.

Pure logic over the shared types of hpcjob.job.results; the share is read through a ShareFolder given in.
"""

from __future__ import annotations

import contextlib
import functools
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcjob.job.layout import attempt_id
from hpcjob.job.plan import mount_job_name
from hpcjob.job.results import (
    ALREADY_MOUNTED,
    ENDED_JOB_STATES,
    MOUNT_FAILED,
    MOUNTED,
    JobInfo,
    JobSummary,
    MountResult,
    NodeInfo,
    NodeResult,
    RootCause,
    State,
    TaskEnd,
    elastic_events,
    find_metrics,
    job_exit_code,
)
from hpcjob.job.spec import HpcjobError, NotEnoughNodes, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Watch
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for reads: first wait, growth, longest wait, and the total deadline of one call."""

    first_wait_s: float = 0.5
    factor: float = 2.0
    max_wait_s: float = 8.0
    deadline_s: float = 60.0
    timeout_s: float = 30.0

    def waits(self) -> Iterable[float]:
        wait = self.first_wait_s
        while True:
            yield wait * random.uniform(0.8, 1.2)  # jitter: many clients do not retry in step
            wait = min(wait * self.factor, self.max_wait_s)


# The description of a node group hpcjob makes (the data nodes' group, `cluster grow --data`).
GROUP_TEXT = "Made by hpcjob: CPU data nodes that feed the GPU nodes (--data-nodes)"


def choose_nodes(
    nodes: Sequence[NodeInfo],
    count: int,
    busy: set[str],
    group: str | None,
    exclude: Sequence[str] = (),
    what: str = "node(s)",
) -> tuple[str, ...]:
    """`count` usable nodes (Online, health OK, not excluded), idle ones first, in name order within
    each kind; `what` they are, for the line that says there are too few."""
    excluded = {name.upper() for name in exclude}
    usable = [n for n in nodes if n.usable and n.name.upper() not in excluded]
    ordered = sorted(usable, key=lambda n: (n.name.upper() in busy, n.name.upper()))
    if len(ordered) < count:
        where = f"in group {group}" if group else "in the cluster"
        found = ", ".join(
            f"{n.name} ({'excluded' if n.name.upper() in excluded else f'{n.state}, {n.health}'})"
            for n in nodes
        )
        raise NotEnoughNodes(
            f"{count} {what} needed but only {len(usable)} online, healthy and not excluded {where}; "
            f"found: {found or 'none'}"
        )
    return tuple(n.name for n in ordered[:count])


def run_job_names(job_name: str, mount: bool) -> list[str]:
    """The names of the jobs an attempt of a run makes: its job's (JobPlan.job_name), and its mount
    job's."""
    return [job_name, mount_job_name(job_name)] if mount else [job_name]


def on_cluster(cluster: str) -> str:
    return f" on cluster {cluster}" if cluster else ""


def refuse_taken_names(names: Sequence[str], found: Mapping[str, int], cluster: str = "") -> None:
    """Refuse a run whose job names (`names`) are taken on the cluster (`found`: name -> job id): a
    submit whose answer was lost looks its job up by name, and must never find an older job."""
    for name in names:
        if name in found:
            raise SpecError(
                f"job {found[name]}{on_cluster(cluster)} is already named {name!r}: the run id names the "
                "run's jobs and must be new; choose another --run-id, or leave it out for a new one"
            )


NO_OUTPUT_KEPT = "the scheduler kept none of the task's output"


def mount_results(info: JobInfo, outputs: Iterable[tuple[str, str]]) -> list[MountResult]:
    """Each node's mount, from its task of a mount job: the state, and the last line it printed (what
    hpcjob's execution filter did), which the scheduler keeps in the task's Output property (documented
    for a task without a stdout file). Where it kept none, the task's state says enough: it finishes
    only when the share is there."""
    from hpcjob.job.plan import LOCAL_DISKS_SAID

    lines = {node.upper(): [line.strip() for line in text.strip().splitlines()] for node, text in outputs}
    said = {node: (found or [""])[-1] for node, found in lines.items()}
    disks = {
        node: next((line for line in found if line.startswith(LOCAL_DISKS_SAID)), "")
        for node, found in lines.items()
    }
    results = []
    for task in info.tasks:
        line = said.get(task.node.upper(), "")
        if task.state == State.FINISHED and line in (MOUNTED, ALREADY_MOUNTED):
            results.append(MountResult(task.node, line, disks.get(task.node.upper(), "")))
        elif task.state == State.FINISHED and not line:
            results.append(MountResult(task.node, MOUNTED, NO_OUTPUT_KEPT))
        elif not line:
            why = " ".join(task.error.split()) or f"the task {task.state.lower()}"
            results.append(MountResult(task.node, MOUNT_FAILED, f"{why} ({NO_OUTPUT_KEPT})"))
        else:
            why = line.removeprefix(f"{MOUNT_FAILED}:").strip() or " ".join(task.error.split()) or task.state
            results.append(MountResult(task.node, MOUNT_FAILED, why))
    return results


def mount_failure(mount_job_id: str, results: Sequence[MountResult]) -> str:
    """Why a mount job failed, per node."""
    failed = "; ".join(f"{r.node}: {r.message}" for r in results if not r.ok)
    return f"the mount job {mount_job_id} failed: {failed or 'no node reported'}"


def cluster_plan(
    spec: JobSpec,
    run_id: str,
    nodes: Callable[[str | None], list[NodeInfo]],
    busy: Callable[[], set[str]],
    find: Callable[[Collection[str]], Mapping[str, int]],
    cluster: str,
    attempt: int = 1,
) -> JobPlan:
    """The job on a cluster's nodes (the spec's, else idle usable ones of its group), refused when the
    cluster has jobs of the run's names already (`find`: name -> job id)."""
    from hpcjob.job.plan import make_plan

    group, taken = spec.node_group, busy()
    data: tuple[str, ...] = ()
    keep_out = tuple(spec.exclude_nodes)
    if spec.data_nodes:  # the data nodes first: from their own group, never a named trainer
        data_group = spec.data_node_group
        if not spec.data_node_names and data_group is None:
            raise SpecError(
                "--data-nodes: name the data nodes' group with --data-node-group (a profile's "
                "data_node_group), or the nodes with --data-node"
            )
        data = spec.data_node_names or choose_nodes(
            nodes(data_group),
            spec.data_nodes,
            taken,
            data_group,
            (*keep_out, *spec.node_names),
            "data node(s)",
        )
        # The trainers: never a data node, nor, from the whole cluster, a node of the data nodes' group.
        kept_for_data = [n.name for n in nodes(data_group)] if group is None and data_group else []
        keep_out = (*keep_out, *data, *kept_for_data)
    chosen = spec.node_names or choose_nodes(nodes(group), spec.node_count, taken, group, keep_out)
    plan = make_plan(spec, chosen, run_id, attempt=attempt, data_node_names=data)
    names = run_job_names(plan.job_name, plan.mount is not None)
    refuse_taken_names(names, find(names), cluster)
    return plan


def recorded_job_id(
    run: RunRecord, find: Callable[[Collection[str]], Mapping[str, int]], cluster: str
) -> int:
    """The run's job: as recorded, else found by its name (a submit whose answer was lost): the name of
    the record's attempt, never an earlier attempt's job."""
    if run.job_id is not None:
        return int(run.job_id)
    name = attempt_id(run.run_id, run.attempt)
    found = find([name]).get(name)
    if found is None:
        attempt = f" (attempt {run.attempt})" if run.attempt > 1 else ""
        raise SpecError(
            f"run {run.run_id}{attempt} has no job on cluster {cluster}: its submission stopped before the "
            "job was made"
        )
    return found


@dataclass(frozen=True)
class PollPolicy:
    """Status polling: quick while things change, slower while they do not."""

    first_wait_s: float = 1.0
    factor: float = 1.5
    max_wait_s: float = 15.0

    @classmethod
    def at_most(cls, max_wait_s: float | None) -> PollPolicy:
        """The policy with this longest wait (a profile's poll_interval; None: the default), the first
        wait after a change no longer than it."""
        if max_wait_s is None:
            return cls()
        return cls(first_wait_s=min(cls.first_wait_s, max_wait_s), max_wait_s=max_wait_s)


def job_summary(
    info: JobInfo,
    plan: JobPlan,
    wall_time_s: float,
    folder: ShareFolder | None,
    log_folder: str,
    task_outputs: Callable[[], Iterable[tuple[str, str]]] | None = None,
) -> JobSummary:
    """The end of a submitted job as every backend reports it (the summary `run --local` prints).

    The scheduler knows the tasks' states; the share (`folder`, with the run's `log_folder` in it)
    knows what failed first and the training program's metrics. Where the share says nothing (the task
    never started its command: a failed container start, an execution filter), the task the scheduler
    failed (the others it canceled, FailOnTaskFailure) is the first failure, and why is the agent's word
    in its Output (`task_outputs`, asked only then), else its error message.
    """
    from hpcjob.store.logs import RunLogs, output_reason, output_tail, read_root_cause

    by_node = {task.node.upper(): task for task in info.tasks}
    nodes = []
    for planned in plan.tasks:
        task = by_node.get(planned.node.upper())
        state = State(task.state) if task and task.state in set(State) else State.CANCELED
        nodes.append(
            NodeResult(
                planned.node,
                state,
                task.exit_code if task else None,
                stdout_path=planned.stdout_path,
                stderr_path=planned.stderr_path,
                task_start=task.start if task else None,
                task_end=task.end if task else None,
            )
        )
    cause = None
    if info.state == State.FAILED:
        # The backend's own word where it has one (a local run's: it saw when each node ended).
        cause = info.root_cause or (read_root_cause(folder, log_folder) if folder is not None else None)
        failed = [t for t in info.tasks if t.state == State.FAILED]
        if cause is None and failed:
            first = failed[0]
            said: dict[str, str] = {}
            with contextlib.suppress(HpcjobError):  # the agent's word is a bonus: the summary comes first
                said = {n.upper(): text for n, text in (task_outputs() if task_outputs else ())}
            reason = output_reason(said.get(first.node.upper(), "")) or " ".join(first.error.split())
            cause = RootCause(node=first.node, exit_code=first.exit_code or 1, time=0.0, reason=reason)
    lines: list[str] = []
    if folder is not None:  # the metrics line is at the end of the output: its end is read
        lines = [line for planned in plan.tasks for line in output_tail(folder, log_folder, planned.node)]
    failed_codes = [t.exit_code for t in info.tasks if t.state == State.FAILED and t.exit_code]
    state, events = State(info.state), list[str]()
    if plan.min_nodes is not None and info.ended:
        state, events = _elastic_end(plan, nodes, state, folder, log_folder)
        cause = None if state is State.FINISHED else cause
    return JobSummary(
        name=plan.name,
        run_id=plan.run_id,
        state=state,
        exit_code=job_exit_code(state, failed_codes[0] if failed_codes else None, cause),
        wall_time_s=round(wall_time_s, 3),
        job_dir=plan.job_dir,
        log_dir=plan.log_dir,
        nodes=nodes,
        root_cause=cause,
        metrics=find_metrics(lines),
        job_id=info.job_id,
        events=events,
        data_node_names=list(plan.data_node_names),
        datasets=RunLogs(folder, log_folder, plan.nodes).datasets() if folder is not None else [],
    )


def _elastic_end(
    plan: JobPlan, nodes: Sequence[NodeResult], state: State, folder: ShareFolder | None, log_folder: str
) -> tuple[State, list[str]]:
    """An elastic job that enough nodes saw through has finished, whatever the scheduler calls a job
    with a failed task; and each lost node is an event. Where the share has no end time of a lost node
    (a node that went down runs no exit trap), its last timeline line stands in for it."""
    from hpcjob.store.logs import RunLogs, read_task_ends

    assert plan.min_nodes is not None
    if sum(n.state is State.FINISHED for n in nodes) < plan.min_nodes:
        return state, []
    timeline = RunLogs(folder, log_folder, plan.nodes).timeline() if folder is not None else []
    ends = {e.node.upper(): e.time for e in read_task_ends(folder, log_folder)} if folder is not None else {}
    lost = []
    for node in (n for n in nodes if n.state is State.FAILED):
        seen = [float(t["t"]) for t in timeline if str(t.get("node", "")).upper() == node.node.upper()]
        at = ends.get(node.node.upper()) or max(seen, default=0.0)
        lost.append(TaskEnd(node.node, node.exit_code if node.exit_code is not None else 1, at))
    return State.FINISHED, elastic_events(lost, timeline, plan.nproc_per_node)


# The scheduler's times: the REST API's `M/d/yyyy h:mm:ss tt` (GET /cluster/info/dateTimeFormat), and a
# DateTime cast to a string in PowerShell (the invariant culture's MM/dd/yyyy HH:mm:ss).
_SCHEDULER_TIMES = ("%m/%d/%Y %I:%M:%S %p", "%m/%d/%Y %H:%M:%S")


@functools.lru_cache(maxsize=4096)
def scheduler_time(text: str) -> float | None:
    """A time as the scheduler gives it, in seconds, its local time read as UTC (only differences between
    two of them mean something: the head node's time zone is not said); None for an empty or unknown one.
    Kept once read: a poll of 1,000 tasks gives 2,000 times, the same ones poll after poll (issue 42:
    parsing them was a third of following such a job)."""
    import datetime as dt

    text = text.strip()
    if not text:
        return None
    parsed = None
    for form in _SCHEDULER_TIMES:
        with contextlib.suppress(ValueError):
            parsed = dt.datetime.strptime(text, form)
            break
    if parsed is None:
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            return None
    # A DateTime never set reads as the year 1 (DateTime.MinValue): no time at all.
    return parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).timestamp() if parsed.year >= 2000 else None


def follow_job(
    read: Callable[[], JobInfo],
    progress: Callable[[str], None],
    *,
    poll: PollPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    watch: Watch | None = None,
) -> JobInfo:
    """Read the job (`read`: one status poll) until it ends, reporting each change, and looking at
    `watch` between polls (which then come at least every `watch.every_s`)."""
    poll = poll or PollPolicy()
    longest = min(poll.max_wait_s, watch.every_s) if watch else poll.max_wait_s
    seen: dict[str, str] = {}
    wait = poll.first_wait_s
    while True:
        info = read()
        changes = _changes(info, seen)
        for line in changes:
            progress(line)
        if info.ended:
            return info
        if watch is not None:
            watch.look()
        wait = min(poll.first_wait_s, longest) if changes else min(wait * poll.factor, longest)
        sleep(wait)


# A job of more tasks than this is told as counts of its tasks' states (a line a change, not a line a
# task: 1,000 nodes starting made 1,000 lines), naming only each task that failed.
TASKS_NAMED = 16


def _changes(info: JobInfo, seen: dict[str, str]) -> list[str]:
    lines = []
    job_line = f"job {info.job_id}: {info.state}" + (f" ({info.error})" if info.error else "")
    if seen.get("") != job_line:
        seen[""] = job_line
        lines.append(job_line)
    many = len(info.tasks) > TASKS_NAMED
    for task in info.tasks:
        failed = task.exit_code not in (None, 0) and task.state in ENDED_JOB_STATES
        if many and not failed:
            continue
        key = f"task{task.task_id}"
        line = f"{task.node or task.name}: {task.state}"
        if task.exit_code is not None and task.state in ENDED_JOB_STATES:
            line += f" (exit code {task.exit_code})"
        if seen.get(key) != line:
            seen[key] = line
            lines.append(line)
    if many:
        counts = Counter(task.state for task in info.tasks)
        count_line = f"{len(info.tasks)} tasks: " + ", ".join(
            f"{n} {state}" for state, n in sorted(counts.items())
        )
        if seen.get("tasks") != count_line:
            seen["tasks"] = count_line
            lines.append(count_line)
    return lines


def certificate_failure(exc: BaseException) -> str | None:
    """The reason of the ssl.SSLCertVerificationError that requests and urllib3 wrap, if any."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return str(current.verify_message or current.reason or "certificate verify failed").rstrip(".")
        if str(current).startswith("Fingerprints did not match"):  # urllib3's words for a pinned one
            return "its fingerprint is not the cluster profile's cert_fingerprint"
        # requests keeps urllib3's error in args; urllib3's MaxRetryError keeps its cause in .reason.
        linked = (*current.args, current.__cause__, current.__context__, getattr(current, "reason", None))
        todo.extend(item for item in linked if isinstance(item, BaseException))
    return None


def pin_certificate(session: Any, fingerprint: str) -> None:
    """Make `session` (a requests.Session) trust exactly the certificate with this fingerprint: SHA-256,
    or SHA-1 as a Windows thumbprint (urllib3 tells them by length and compares in the handshake). The
    requests must then go with verify=False: the pin replaces a CA's verification, which a self-signed
    head node certificate with no host name in it (HPC Pack's own) would fail."""
    from requests.adapters import HTTPAdapter

    pinned = fingerprint.replace(":", "").lower()

    class Pinned(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["assert_fingerprint"] = pinned
            super().init_poolmanager(*args, **kwargs)

        def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
            # Through an HTTPS_PROXY too: requests makes that pool manager apart, without the pin.
            proxy_kwargs["assert_fingerprint"] = pinned
            return super().proxy_manager_for(proxy, **proxy_kwargs)

    session.mount("https://", Pinned())


# -- nodes taken offline and brought online ---------------------------------------------------------
# HPC Pack does a node state change asynchronously: REST's `POST /cluster/nodes/{name}/operations/{op}`
# answers 202, and "the caller has to query the node state for the operation result"
# (reference/hpcpack-rest-api/hpcpack.yaml L293-310); `Set-HpcNodeState -Async` "returns immediately
# without waiting" (MicrosoftDocs/windows-powershell-docs @ 04aa4cb3
# docset/winserver2012r2-ps/hpc/Set-HpcNodeState.md). A node that runs a job goes Draining first, and
# "can take a long time to go offline" (same page): every wait here has a bound.

OFFLINE, ONLINE, DRAINING = "Offline", "Online", "Draining"


class NodeWaitError(HpcjobError):
    """Nodes that did not get where they were asked to within the bound: one line naming them."""


def wait_for_nodes(
    read: Callable[[], list[NodeInfo]],
    names: Sequence[str],
    done: Callable[[NodeInfo], bool],
    *,
    wanted: str,
    timeout_s: float,
    progress: Callable[[str], None],
    poll: PollPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[NodeInfo]:
    """Read the nodes (`read`: one look at all of them) until each of `names` is `done`, saying each
    node's change of state or health as it comes; their last look, in the order of `names`. A node the
    head node does not list fails at once; nodes not `wanted` (words for the error: "Offline") after
    `timeout_s` fail with their states named."""
    poll = poll or PollPolicy()
    deadline = clock() + timeout_s
    seen: dict[str, str] = {}
    wait = poll.first_wait_s
    while True:
        found = {node.name.upper(): node for node in read()}
        missing = [name for name in names if name.upper() not in found]
        if missing:
            raise NodeWaitError(f"the head node lists no node {', '.join(missing)}")
        nodes = [found[name.upper()] for name in names]
        changed = False
        for node in nodes:
            now = f"{node.state}, health {node.health or '-'}"
            if seen.get(node.name) != now:
                if node.name in seen or not done(node):  # the first look: only the nodes still to go
                    progress(f"{node.name}: {now}")
                changed = changed or node.name in seen
                seen[node.name] = now
        left = [node for node in nodes if not done(node)]
        if not left:
            return nodes
        if clock() >= deadline:
            states = ", ".join(f"{n.name} {n.state} (health {n.health or '-'})" for n in left)
            raise NodeWaitError(
                f"{len(left)} node(s) not {wanted} after {timeout_s:.0f} s: {states}"
                + (": a job still runs there" if any(n.state == DRAINING for n in left) else "")
            )
        wait = poll.first_wait_s if changed else min(wait * poll.factor, poll.max_wait_s)
        sleep(max(0.0, min(wait, deadline - clock())))


def is_offline(force: bool) -> Callable[[NodeInfo], bool]:
    """Whether a node is taken offline: Offline; with `force` where the head node has no forced Offline
    (REST), Draining too: it takes no new job, and what still runs there ends with its VM."""
    return lambda node: node.state == OFFLINE or (force and node.state == DRAINING)


def is_online(node: NodeInfo) -> bool:
    return node.state == ONLINE


# -- nodes put in a node group ----------------------------------------------------------------------
# Add-HpcGroup's -NodeName "is a filter parameter, so you do not receive an error for specifying a node
# the does not exist in the HPC cluster as long as you specify at least one node that does exist"
# (MicrosoftDocs/windows-powershell-docs @ 1095f968 docset/winserver2012r2-ps/hpc/Add-HpcGroup.md), and
# REST's moveNodesOfGroup declares no error at all (reference/hpcpack-rest-api/hpcpack.yaml L623-660):
# a node can stay out of the group with or without an error, so the members are read back and compared
# (docs/facts/hpcpack-node-groups.md).


class GroupJoinError(HpcjobError):
    """Nodes asked into a node group that are not among its members afterwards: one line naming them.
    `joined`: the nodes asked for that are members."""

    def __init__(self, message: str, joined: Sequence[str]) -> None:
        super().__init__(message)
        self.joined = list(joined)


def check_joined(group: str, asked: Sequence[str], members: Iterable[str], said: str | None = None) -> None:
    """Nothing where every node of `asked` is among `members` (node names compare without case, as HPC
    Pack's do); else GroupJoinError naming, as asked, those that are not, and what the head node said
    (`said`: its error, None where it raised none)."""
    held = {name.upper() for name in members}
    missing = [name for name in asked if name.upper() not in held]
    if not missing:
        return
    joined = [name for name in asked if name.upper() in held]
    who = f"node {missing[0]}" if len(missing) == 1 else f"nodes {', '.join(missing)}"
    did = f" ({', '.join(joined)} did)" if joined else ""
    if said:  # one line; WinRM's errors start "the head node: " already
        why = "the head node said: " + " ".join(said.split()).removeprefix("the head node: ")
    else:
        why = "the head node raised no error"
    raise GroupJoinError(f"{who} did not join node group {group}{did}; {why}", joined)


def put_in_group(
    group: str,
    nodes: Sequence[str],
    add: Callable[[], object],
    members: Callable[[], list[str]],
    unsure: tuple[type[HpcjobError], ...] = (),
) -> list[str]:
    """`add` (the backend's request that puts `nodes` in `group`), then `members` (the group's members,
    read back): those members when every node joined, else GroupJoinError, whether `add` raised or not.
    An error of `add` stands as it is where the members cannot be read, or where every node joined,
    unless it is one of `unsure` (the answer was lost: the members say what the request did)."""
    try:
        add()
    except HpcjobError as refused:
        try:
            found = members()
        except HpcjobError:
            raise refused from None
        check_joined(group, nodes, found, str(refused))
        if isinstance(refused, unsure):
            return found
        raise
    found = members()
    check_joined(group, nodes, found)
    return found
