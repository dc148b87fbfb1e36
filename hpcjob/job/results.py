"""What every backend reports: job and task states (HPC Pack's names), nodes, the summary, the root cause.

Shared by the backends, the logs and the CLI, below all of them: it imports nothing of hpcjob but the
price types of hpcjob.job.prices.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from hpcjob.job.datasets import DatasetCopy
from hpcjob.job.prices import Price, Usage, cost_of
from hpcjob.job.usage import AttemptUsage, RunUsage, run_usage

# The training program's last line of results (training/run_ddp.py documents the contract).
METRICS_PREFIX = "HPCJOB_METRICS "
# Each rank's latest GPU figures, printed every so often while it trains (training/gpu_monitor.py).
GPU_PREFIX = "HPCJOB_GPU "
# The exit code of a canceled job, as a shell reports an interrupted command.
CANCELED_EXIT_CODE = 130


def untrusted_json(text: str | bytes, *, null_for_non_finite: bool = False) -> object:
    """JSON from a file of the share (anyone who can write there may have written it): ValueError, and
    no other exception, for what is not plain JSON, and for nesting deeper than Python's stack. NaN and
    Infinity (they compare with nothing) and numbers beyond a float's range are refused too, or with
    `null_for_non_finite` read as null (a diverged run's NaN loss, written by Python's json)."""

    def non_finite(name: str) -> None:
        if not null_for_non_finite:
            raise ValueError(f"{name[:20]}: not a finite number")

    def number(figure: str) -> float | None:
        value = float(figure)
        if math.isinf(value):  # 1e999
            non_finite(figure)
            return None
        return value

    try:
        return json.loads(text, parse_constant=non_finite, parse_float=number)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


class State(StrEnum):
    """Job and task states, named as HPC Pack names them."""

    QUEUED = "Queued"
    RUNNING = "Running"
    FINISHED = "Finished"
    FAILED = "Failed"
    CANCELED = "Canceled"

    @property
    def ended(self) -> bool:
        return self in (State.FINISHED, State.FAILED, State.CANCELED)


@dataclass(frozen=True)
class RootCause:
    """Where a failed job went wrong first: a rank (from the worker shim's records) or, when no rank
    recorded its end first, a node's task (torchrun failed before any worker, or was killed)."""

    node: str
    exit_code: int
    time: float
    rank: int | None = None
    signal: str | None = None  # the signal that killed it, such as SIGKILL
    reason: str = ""  # one line from the node's stderr that says why, when there is one

    def describe(self) -> str:
        if self.rank is not None and self.node:
            where = f"rank {self.rank} on {self.node}"
        else:
            where = f"the task on {self.node}" if self.node else "the job"
        how = (
            f"killed by {self.signal} (exit code {self.exit_code})"
            if self.signal
            else f"exit code {self.exit_code}"
        )
        return f"{where}, {how}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class TaskEnd:
    """A node's task that ended: its exit code, and when (seconds since the epoch)."""

    node: str
    exit_code: int
    time: float


@dataclass
class NodeResult:
    node: str
    state: State = State.QUEUED
    exit_code: int | None = None
    stdout_path: str = ""
    stderr_path: str = ""
    # When the node's task started and ended as the scheduler reports them (seconds on the head node's
    # clock: what a run cost is counted from); None where the backend does not say (a local run).
    task_start: float | None = None
    task_end: float | None = None
    # What ended the task where its exit code does not say it (a local node's whole task killed from
    # outside, as a lost node); "" where nothing more is known.
    error: str = ""


@dataclass(frozen=True)
class GpuUse:
    """One node's GPUs: over a whole run (from the metrics: the mean of its ranks' mean utilisation,
    the highest peak), or now (from the latest HPCJOB_GPU lines: peaks are the current figures).
    Memory is per GPU, the most any of the node's GPUs used."""

    node: str
    gpus: int
    util_mean_pct: float
    util_peak_pct: float
    memory_peak_mib: float


def _by_node(rows: Iterable[dict[str, object]], util: str, peak: str, memory: str) -> list[GpuUse]:
    nodes: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        nodes.setdefault(str(row.get("node", "")), []).append(row)

    def figures(ranks: list[dict[str, object]], key: str) -> list[float]:
        values = [r.get(key) for r in ranks]
        return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]

    found = []
    for node, ranks in nodes.items():
        utils, peaks, memories = figures(ranks, util), figures(ranks, peak), figures(ranks, memory)
        if utils:
            mean = round(sum(utils) / len(utils), 1)
            found.append(GpuUse(node, len(ranks), mean, max(peaks or utils), max(memories or [0.0])))
    return found


def gpu_use_of_run(metrics: dict[str, object] | None) -> list[GpuUse]:
    """Per node, from the `gpus` list of the training program's metrics ([] when GPUs were not watched)."""
    ranks = (metrics or {}).get("gpus")
    if not isinstance(ranks, list):
        return []
    return _by_node(
        [r for r in ranks if isinstance(r, dict)], "util_mean_pct", "util_peak_pct", "memory_peak_mib"
    )


def latest_gpu_use(lines: Iterable[str]) -> list[GpuUse]:
    """Per node, from each rank's last HPCJOB_GPU line in `lines`."""
    latest: dict[object, dict[str, object]] = {}
    for line in lines:
        if line.startswith(GPU_PREFIX):
            try:
                value = untrusted_json(line[len(GPU_PREFIX) :])
            except ValueError:
                continue  # a line cut short by a dying node
            if isinstance(value, dict):
                latest[(value.get("node"), value.get("rank"))] = value
    return _by_node(latest.values(), "util_pct", "util_pct", "memory_mib")


def _count(metrics: Mapping[str, object], key: str) -> int | None:
    value = metrics.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def trained_nothing(metrics: Mapping[str, object] | None) -> bool:
    """Whether the training program says the run trained nothing: no epoch or step of its own (it resumed
    a checkpoint that already covered its epochs). The metrics of a run_ddp.py before `epochs_trained`:
    resumed at the epoch it completed (and a throughput copied from the checkpoint, which is not the
    run's)."""
    if not metrics:
        return False
    trained, steps = _count(metrics, "epochs_trained"), _count(metrics, "steps")
    if trained is not None or steps is not None:
        return trained == 0 or steps == 0
    resumed, completed = _count(metrics, "resumed_from_epoch"), _count(metrics, "epochs_completed")
    return resumed is not None and completed is not None and 0 < completed <= resumed


def nothing_trained_line(metrics: Mapping[str, object]) -> str:
    """What a summary says of a run that trained nothing, from its metrics."""
    resumed, wanted = _count(metrics, "resumed_from_epoch"), _count(metrics, "epochs_requested")
    if resumed is not None and wanted is not None:
        covered = f"the checkpoint it resumed already covered {resumed} of {wanted} epoch(s)"
    else:
        covered = "no training step of its own"
    return f"trained nothing: {covered}; no samples/s"


@dataclass
class JobSummary:
    name: str
    run_id: str
    state: State
    exit_code: int
    wall_time_s: float
    job_dir: str
    log_dir: str
    nodes: list[NodeResult] = field(default_factory=list)
    root_cause: RootCause | None = None
    metrics: dict[str, object] | None = None
    job_id: str | None = None  # the scheduler's, for a submitted job
    # An elastic job's losses, one line each: which node, when, and how the others went on.
    events: list[str] = field(default_factory=list)
    # The price its nodes are counted at (their size's in the cluster's region), where the profile knows
    # it; None for a local run, which has no cost.
    price: Price | None = None
    # The CPU data nodes of a job with data nodes, and the price they are counted at (the profile's
    # data_vm_size): each role at its own price.
    data_node_names: list[str] = field(default_factory=list)
    data_price: Price | None = None
    # A run of several attempts, at its end: each attempt's own figures (hpcjob.job.usage); the summary's
    # wall time and cost are then the run's, their sums. Empty for the summary of one attempt.
    run_attempts: list[AttemptUsage] = field(default_factory=list)
    # A job with --dataset: what each node's task copied (hpcjob.job.datasets), where its files say.
    datasets: list[DatasetCopy] = field(default_factory=list)

    def is_data_node(self, node: str) -> bool:
        return node.upper() in {name.upper() for name in self.data_node_names}

    def _price_of(self, node: str) -> Price | None:
        return self.data_price if self.is_data_node(node) else self.price

    @property
    def usage(self) -> list[Usage]:
        """Each node's task, start to end, at its role's price ([] where a node of the job has none)."""
        if any(self._price_of(node.node) is None for node in self.nodes) or self.price is None:
            return []
        return [
            Usage(1, node.task_start, node.task_end, price)
            for node in self.nodes
            if node.task_start is not None
            and node.task_end is not None
            and (price := self._price_of(node.node)) is not None
        ]

    @property
    def cost_usd(self) -> float | None:
        """What the job's nodes cost while their tasks ran (hpcjob.job.prices); None where a role has no
        price (a data node of a profile that names no data_vm_size: not counted at the GPU nodes'). The
        summary of a run of several attempts: the run's (hpcjob.job.usage's rule)."""
        if self.run_attempts:
            return run_usage(self.run_attempts).cost_usd
        return self.job_cost_usd

    @property
    def job_cost_usd(self) -> float | None:
        """This attempt's job's own cost, whatever the run's."""
        if self.price is None or any(self._price_of(node.node) is None for node in self.nodes):
            return None
        return cost_of(self.usage)

    @property
    def run_usage(self) -> RunUsage | None:
        """The run's figures, for the summary of a run of several attempts."""
        return run_usage(self.run_attempts) if self.run_attempts else None

    def attempt_usage(self, attempt: int, started: float | None, gpus_per_node: int | None) -> AttemptUsage:
        """This job's figures as attempt `attempt` of its run, started at `started` (this machine's clock)."""
        data = [n.node for n in self.nodes if self.is_data_node(n.node)]
        trainers = tuple(n.node for n in self.nodes if not self.is_data_node(n.node))
        return AttemptUsage(
            attempt, started, self.wall_time_s, trainers, tuple(data), gpus_per_node, self.job_cost_usd
        )

    @property
    def gpu_use(self) -> list[GpuUse]:
        return gpu_use_of_run(self.metrics)

    @property
    def trained_nothing(self) -> bool:
        """The training program says it trained nothing (trained_nothing): its metrics hold no
        throughput of its own."""
        return trained_nothing(self.metrics)

    def to_json(self) -> str:
        data = asdict(self)
        if self.gpu_use:
            data["gpu_use"] = [asdict(use) for use in self.gpu_use]
        if self.trained_nothing:
            data["trained_nothing"] = True
        data["cost_usd"] = self.cost_usd
        data["run_attempts"] = [a.to_dict() for a in self.run_attempts]
        if (usage := self.run_usage) is not None:
            data["run_usage"] = usage.to_dict()
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> JobSummary:
        # Fields of a newer hpcjob are left out (gpu_use and trained_nothing are derived from the metrics).
        raw = json.loads(text)
        data = _known(cls, raw)
        if "data_nodes" in raw and "data_node_names" not in raw:  # an older hpcjob's name for them
            data["data_node_names"] = raw["data_nodes"]
        data["state"] = State(data["state"])
        data["nodes"] = [
            NodeResult(**{**_known(NodeResult, n), "state": State(n["state"])}) for n in data.get("nodes", [])
        ]
        if data.get("root_cause") is not None:
            data["root_cause"] = RootCause(**_known(RootCause, data["root_cause"]))
        for key in ("price", "data_price"):
            if data.get(key) is not None:
                data[key] = Price.from_dict(data[key])
        data["run_attempts"] = [AttemptUsage.from_dict(a) for a in data.get("run_attempts") or ()]
        data["datasets"] = [DatasetCopy(**_known(DatasetCopy, d)) for d in data.get("datasets") or ()]
        return cls(**data)


def _known(kind: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of `data` that are fields of the dataclass `kind`."""
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in data.items() if k in names}


def elastic_events(
    lost: Iterable[TaskEnd], timeline: Sequence[Mapping[str, Any]], procs_per_node: int
) -> list[str]:
    """One line for each node an elastic job lost: where its training was when it ended (the last
    timeline line of that node), and how the job went on (the first restart of the workers
    after it: on how many nodes, its world size over `procs_per_node`, from which epoch's checkpoint)."""
    events = []
    for end in sorted(lost, key=lambda e: e.time):
        line = f"{end.node} lost"
        # A lost node writes nothing after its end (whose time may be only a bound): its last line.
        mine = [t for t in timeline if str(t.get("node", "")).upper() == end.node.upper()]
        progress = [t for t in mine if t.get("event") in ("step", "epoch")]
        if progress:
            last = max(progress, key=lambda t: float(t["t"]))
            where = f"step {last.get('step', '?')}" if last["event"] == "step" else "its end"
            line += f" at epoch {last.get('epoch', '?')}, {where}"
        line += f" (exit code {end.exit_code})"
        restarts = [
            t
            for t in timeline
            if t.get("event") == "start" and float(t.get("t", 0)) > end.time and int(t.get("restart", 0)) > 0
        ]
        if restarts:
            first = min(restarts, key=lambda t: float(t["t"]))
            nodes = int(first.get("world_size", 0)) // max(procs_per_node, 1)
            line += f"; continued on {nodes} node(s) from {_restarted_from(first, timeline)}"
        else:
            line += "; the others went on"
        events.append(line)
    return events


def _restarted_from(start: Mapping[str, Any], timeline: Sequence[Mapping[str, Any]]) -> str:
    """Which save a restart of the workers went on from: the first `resume` line of that restart on its
    node (hpctorch's), else the epoch its start line names (an older run_ddp.py), else the start."""
    began, restart, node = float(start["t"]), start.get("restart"), start.get("node")
    resumes = [
        t
        for t in timeline
        if t.get("event") == "resume"
        and (t.get("restart"), t.get("node")) == (restart, node)
        and float(t.get("t", 0)) >= began
    ]
    if resumes:
        resume = min(resumes, key=lambda t: float(t["t"]))
        which = f" (epoch {resume['epoch']})" if resume.get("epoch") is not None else ""
        return f"the step-{resume.get('step', '?')} save{which}"
    epoch = int(start.get("first_epoch", 1)) - 1
    return f"the epoch-{epoch} checkpoint" if epoch > 0 else "the start (no checkpoint yet)"


def parse_exit_records(lines: Iterable[str]) -> list[RootCause]:
    """The worker shim's `<time> <rank> <exit code> <node> [<signal>]` records, each a failed rank."""
    records = []
    for line in lines:
        parts = line.split()
        try:
            signal_name = parts[4] if len(parts) > 4 and parts[4].startswith("SIG") else None
            if not math.isfinite(float(parts[0])):
                continue  # a time that orders nothing ("nan"): not written by the shim
            records.append(
                RootCause(
                    time=float(parts[0]),
                    rank=int(parts[1]),
                    exit_code=int(parts[2]),
                    node=parts[3],
                    signal=signal_name,
                )
            )
        except (IndexError, ValueError):
            continue  # a record cut short by a dying node says nothing reliable
    return records


def first_failure(
    ranks: Iterable[RootCause], tasks: Iterable[TaskEnd], stopped_at: float | None = None
) -> RootCause | None:
    """The first thing to end badly, by time, whatever kind of record it left: a rank (the worker
    shim writes its record when the rank dies, by a signal too), or a node's task (a torchrun that
    failed before any worker, or was itself killed). What ended after the job began stopping its
    nodes (`stopped_at`: a failure elsewhere, or a cancel) is a consequence, unless nothing came
    before it."""
    candidates = [*ranks, *(RootCause(node=t.node, exit_code=t.exit_code, time=t.time) for t in tasks)]
    candidates = [c for c in candidates if c.exit_code != 0]
    if stopped_at is not None:
        causes = [c for c in candidates if c.time < stopped_at]
        candidates = causes or candidates
    if not candidates:
        return None
    # A task's end is seen a little after its rank's; on a tie, the rank says more.
    return min(candidates, key=lambda c: (c.time, c.rank is None))


def signal_of_exit_code(code: int) -> str | None:
    """The signal a task's code names, as bash reports a child killed by signal N: 128 + N."""
    try:
        return signal.Signals(code - 128).name if 128 < code < 192 else None
    except ValueError:
        return None


def find_metrics(lines: Iterable[str]) -> dict[str, object] | None:
    """The last metrics line the training program printed, if any."""
    found: dict[str, object] | None = None
    for line in lines:
        if line.startswith(METRICS_PREFIX):
            try:
                value = untrusted_json(line[len(METRICS_PREFIX) :])
            except ValueError:
                continue
            if isinstance(value, dict):
                found = value
    return found


def job_exit_code(state: str, failed_task_code: int | None, root_cause: RootCause | None) -> int:
    """The job's exit code, for every backend: 0 when finished, 130 when canceled, and when failed the
    code of what failed first (`first_failure`), else the first failed task's. A failed job never
    reports 130, the canceled code, nor 0: a rank stopped by hpcjob's SIGINT is not the cause."""
    if state == State.FINISHED:
        return 0
    if state == State.CANCELED:
        return CANCELED_EXIT_CODE
    for code in (root_cause.exit_code if root_cause else None, failed_task_code):
        if code and code != CANCELED_EXIT_CODE:
            return code
    return 1


# The scheduler's states of a job or task that has ended (it has more than State names while it runs).
ENDED_JOB_STATES = frozenset({"Finished", "Failed", "Canceled"})


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    health: str
    groups: tuple[str, ...] = ()
    cores: int | None = None
    # The 2019 Node model has no GPU count. Linux agents register `GpuInfo` (one entry a GPU) with the
    # head node; whether the API passes it on is UNVERIFIED (facts/hpcpack-rest.md section 6): None
    # when the answer does not carry it.
    gpus: int | None = None

    @property
    def usable(self) -> bool:
        return self.state == "Online" and self.health == "OK"


@dataclass(frozen=True)
class TaskInfo:
    task_id: int
    name: str
    state: str
    exit_code: int | None
    node: str
    error: str = ""
    # StartTime and EndTime as the scheduler reports them, in seconds on the head node's clock (its local
    # time read as UTC: only their difference means something); None where it does not say.
    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class JobInfo:
    """A job as a backend sees it: the scheduler's job id (a local run's: its run id)."""

    job_id: str
    name: str
    state: str
    error: str
    tasks: tuple[TaskInfo, ...] = field(default_factory=tuple)
    root_cause: RootCause | None = None  # where the backend knows it (a local run's summary)
    gpu_use: tuple[GpuUse, ...] = ()  # per node: the run's when it has ended, else the latest, where known

    @property
    def ended(self) -> bool:
        return self.state in ENDED_JOB_STATES

    def wall_s(self, followed_s: float) -> float:
        """The job's wall time: its tasks' span on the scheduler's clock where it reports every task's
        start and end (so a follower that came after the job ended cannot stretch it), else
        `followed_s`, the follower's own clock since the submission (a local run's)."""
        starts = [t.start for t in self.tasks]
        ends = [t.end for t in self.tasks]
        if not self.tasks or None in starts or None in ends:
            return followed_s
        return max(0.0, max(e for e in ends if e is not None) - min(s for s in starts if s is not None))

    def exit_code(self, root_cause: RootCause | None = None) -> int:
        """As every backend reports it (job_exit_code); the scheduler knows the failed tasks, the share
        (`root_cause`, else the one the job carries) which rank failed first."""
        failed = [t.exit_code for t in self.tasks if t.state == State.FAILED and t.exit_code]
        return job_exit_code(self.state, failed[0] if failed else None, root_cause or self.root_cause)


@dataclass(frozen=True)
class Submission:
    """How far a submission got, reported before each next step so that the run's record always points
    to every job made: creating (no job yet, but a create's lost answer may have made one), mounting
    (the mount job exists), created (the job exists, not submitted), submitted, or canceled (hpcjob
    canceled the job, or the mount job, whose submit failed). A local job names the process that
    runs it, (pid, start time)."""

    state: str
    job_id: str | None = None
    mount_job_id: str | None = None
    process: tuple[int, int] | None = None


@dataclass(frozen=True)
class MountResult:
    """The share on one node after a mount: mounted, already mounted, or failed with the node's words."""

    node: str
    outcome: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (MOUNTED, ALREADY_MOUNTED)


# What hpcjob's execution filter says it did (hpcjob/node/mount_filter.py), and a failure.
MOUNTED = "mounted"
ALREADY_MOUNTED = "already mounted"
MOUNT_FAILED = "failed"
