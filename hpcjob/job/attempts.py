"""Why an attempt of a run ended, told by evidence, and whether the run goes on in another (issue 33).
Pure: the summary, the scheduler's view of the job and of its nodes come in; a Cause goes out.

Retried, as something outside the program: a node lost, unreachable or taken offline (its health or
state after the job says so, or the scheduler's message for its task); a task the scheduler ended with no
exit of its own; a NCCL or network error; a hang caught by --hang-timeout. Not retried unless
--retry-on any: an exception in a rank, a non-zero exit of the script, a rank killed (the out-of-memory
killer, SIGKILL) while its node stays healthy. A job the user canceled is never retried.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hpcjob.job.hangs import HANG_EXIT_CODE
from hpcjob.job.results import JobInfo, JobSummary, NodeInfo, RootCause, State
from hpcjob.job.spec import nodes_said

# What a rank's last words say when the fabric, not the program, failed (torch's and NCCL's own texts:
# ncclSystemError/ncclRemoteError, DistNetworkError, the store's connection errors).
_NETWORK = re.compile(
    r"NCCL (?:error|WARN)|ncclSystemError|ncclRemoteError|ncclInternalError|DistNetworkError|"
    r"communicator was aborted|Gloo connectFullMesh failed|"
    r"RendezvousConnectionError|Connection (?:reset|refused|closed) by peer|Broken pipe|"
    r"No route to host|Network is unreachable",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(r"unreachable|lost|offline|evicted|not respond", re.IGNORECASE)


@dataclass(frozen=True)
class Cause:
    """Why an attempt ended: `kind` (one of KINDS), whether the run goes on in another attempt, the
    nodes the next attempt leaves out, and one line a person reads."""

    kind: str
    retried: bool
    said: str
    lost: tuple[str, ...] = ()


# An attempt whose submission stopped half way (its follower killed, the network): no job of it ran.
CUT_SHORT = "submission cut short"
KINDS = (
    "finished", "canceled", "node lost", "task ended by the scheduler", "network", "hang", "program",
    CUT_SHORT,
)  # fmt: skip
OUTSIDE = frozenset({"node lost", "task ended by the scheduler", "network", "hang", CUT_SHORT})


def attempt_cause(
    summary: JobSummary,
    info: JobInfo,
    nodes_now: Iterable[NodeInfo],
    *,
    canceled_by_user: bool = False,
    retry_on: str = "outside",
) -> Cause:
    """The cause of an attempt's end, from its summary (the root cause hpcjob read on the share), the
    scheduler's job (its tasks' states and messages) and the job's nodes as the scheduler sees them now."""
    if summary.state is State.FINISHED:
        return Cause("finished", False, "finished")
    if canceled_by_user:
        return Cause("canceled", False, "canceled")
    health: Mapping[str, NodeInfo] = {n.name.upper(): n for n in nodes_now}
    job_nodes = [n.node for n in summary.nodes] or [t.node for t in info.tasks]
    lost = tuple(
        node
        for node in job_nodes
        if (found := health.get(node.upper())) is None or not found.usable
        or any(t.node.upper() == node.upper() and _UNREACHABLE.search(t.error) for t in info.tasks)
    )  # fmt: skip
    cause = summary.root_cause
    if lost:
        kind, said = "node lost", f"{', '.join(lost)} {'was' if len(lost) == 1 else 'were'} lost"
    elif cause is not None and cause.exit_code == HANG_EXIT_CODE and summary.state is State.FAILED:
        kind, said = "hang", f"a hang: {cause.reason or 'no collective moved on'}"
    elif cause is not None and _NETWORK.search(cause.reason):
        kind, said = "network", f"a network error on {cause.node}: {cause.reason}"
    elif scheduler_ended := [  # failed with no exit of its own (a canceled one: the gang's others);
        # HPC Pack reports such a task's ExitCode as -1, which no Linux process exits with
        t
        for t in info.tasks
        if t.state == "Failed" and t.exit_code in (None, -1) and t.error
    ]:
        first = scheduler_ended[0]
        kind, said = (
            "task ended by the scheduler",
            f"the scheduler ended the task on {first.node}: {first.error}",
        )
    elif cause is not None and _killed(cause):
        kind, said = (
            "program",
            f"{_where(cause)} was killed by SIGKILL (exit code {cause.exit_code}): {OOM_HINT}",
        )
    else:
        where = f" on {cause.node}" if cause is not None and cause.node else ""
        why = f": {cause.reason}" if cause is not None and cause.reason else ""
        kind, said = "program", f"the program failed{where}{why}"
    retried = kind in OUTSIDE or retry_on == "any"
    if kind == "program" and not retried:
        said += "; not retried (--retry-on any retries it)"
    return Cause(kind, retried, said, lost)


# Why a rank of a healthy node is SIGKILLed, most often: it is the program's failure, not the node's.
OOM_HINT = "the out-of-memory killer is the usual cause (the node's kernel log says: dmesg)"


def _killed(cause: RootCause) -> bool:
    """A rank or task killed by SIGKILL: by its signal, or by the exit code a shell or container gives it."""
    return cause.signal == "SIGKILL" or cause.exit_code in (137, -9)


def _where(cause: RootCause) -> str:
    return f"rank {cause.rank} on {cause.node}" if cause.rank is not None else f"the task on {cause.node}"


def told_lost(summary: JobSummary, cause: Cause) -> JobSummary:
    """The attempt's summary as its cause says it: a first failure on a node that was lost is its loss,
    not the last line the node printed before it went."""
    root = summary.root_cause
    if root is None or root.node.upper() not in {n.upper() for n in cause.lost}:
        return summary
    return replace(summary, root_cause=replace(root, rank=None, reason=f"{root.node} was lost"))


def next_attempt_exclusions(excluded: Iterable[str], cause: Cause) -> tuple[str, ...]:
    """The nodes the next attempt never chooses: the run's --exclude-node ones and every node lost."""
    return tuple(dict.fromkeys([*excluded, *cause.lost]))


def attempt_line(
    attempt: int, job_id: str | None, nodes: Sequence[str], data_node_names: Sequence[str], said: str
) -> str:
    """How an attempt ended, in the run's summary: its job, its nodes (data nodes too) and why."""
    data = f" and data node(s) {', '.join(data_node_names)}" if data_node_names else ""
    return f"attempt {attempt} (job {job_id} on {nodes_said(nodes)}{data}): {said}"


def past_max_cost(spent: float, max_cost_usd: float) -> str | None:
    """The line that ends a run whose attempts cost more than --max-cost; None while they do not."""
    from hpcjob.job.prices import money

    if spent <= max_cost_usd:
        return None
    bound = money(max_cost_usd)
    return f"no other attempt: the run's attempts cost {money(spent)}, more than --max-cost {bound}"


@dataclass(frozen=True)
class Resumed:
    """Where an attempt went on from: the step of the save it resumed (hpctorch.Checkpoints says it in
    its timeline), and the work the attempt before it had done past that step, done again: its steps and
    their seconds (None where that attempt's timeline reports no steps)."""

    step: int
    redone_steps: int | None = None
    redone_s: float | None = None

    def line(self, attempt: int) -> str:
        """`attempt 2 resumed at step 1,200 (80 step(s), 40 s redone)`."""
        if self.redone_steps is None or self.redone_s is None:
            work = "the work redone unknown: the attempt before reported no steps"
        else:
            work = f"{self.redone_steps:,} step(s), {self.redone_s:,.0f} s redone"
        return f"attempt {attempt} resumed at step {self.step:,} ({work})"

    def to_dict(self) -> dict[str, int | float | None]:
        return {"step": self.step, "redone_steps": self.redone_steps, "redone_s": self.redone_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Resumed | None:
        """From to_dict's form; None where it is not one."""
        step, steps, seconds = data.get("step"), data.get("redone_steps"), data.get("redone_s")
        if not isinstance(step, int) or isinstance(step, bool):
            return None
        return cls(
            step,
            steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
            float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else None,
        )


def resumed_of(
    previous: Sequence[Mapping[str, object]], current: Sequence[Mapping[str, object]]
) -> Resumed | None:
    """Where the `current` attempt resumed, from its timeline's `resume` line, and what the `previous`
    attempt's step lines say it did past that step (the last step it reported, and the time from when it
    was at the resumed step to that one); None where the attempt resumed nothing."""
    starts = [e["step"] for e in current if e.get("event") == "resume" and _whole(e.get("step"))]
    if not starts:
        return None
    step = int(str(starts[0]))
    reported = sorted(
        (int(str(e["step"])), float(str(e["t"])))
        for e in previous
        if e.get("event") == "step" and _whole(e.get("step"))
    )
    if not reported:
        return Resumed(step)
    last, last_t = reported[-1]
    if last <= step:
        return Resumed(step, 0, 0.0)
    # When the attempt was at the resumed step: between its lines on either side, in proportion.
    before = [(s, t) for s, t in reported if s < step]
    after_s, after_t = next((s, t) for s, t in reported if s >= step)
    at = after_t
    if before and after_s > before[-1][0]:
        before_s, before_t = before[-1]
        at = before_t + (after_t - before_t) * (step - before_s) / (after_s - before_s)
    return Resumed(step, last - step, max(0.0, last_t - at))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
