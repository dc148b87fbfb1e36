"""What every backend reports: job and task states (HPC Pack's names), the summary, the root cause."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum

# The training program's last line of results (training/run_ddp.py documents the contract).
METRICS_PREFIX = "HPCJOB_METRICS "
# The exit code of a canceled job, as a shell reports an interrupted command.
CANCELED_EXIT_CODE = 130


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
    """The rank that failed first in the whole job, from the worker shim's records."""

    rank: int
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


def parse_exit_records(lines: Iterable[str]) -> RootCause | None:
    """The earliest of the worker shim's `<time> <rank> <exit code> <node>` records, if any."""
    causes = []
    for line in lines:
        parts = line.split()
        try:
            causes.append(
                RootCause(time=float(parts[0]), rank=int(parts[1]), exit_code=int(parts[2]), node=parts[3])
            )
        except (IndexError, ValueError):
            continue  # a record cut short by a dying node says nothing reliable
    return min(causes, key=lambda c: c.time, default=None)


def find_metrics(lines: Iterable[str]) -> dict[str, object] | None:
    """The last metrics line the training program printed, if any."""
    found: dict[str, object] | None = None
    for line in lines:
        if line.startswith(METRICS_PREFIX):
            try:
                value = json.loads(line[len(METRICS_PREFIX) :])
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                found = value
    return found


def job_exit_code(state: str, failed_task_code: int | None, root_cause: RootCause | None) -> int:
    """The job's exit code, for every backend: 0 when finished, 130 when canceled, and when failed the
    code of the rank that failed first (from the worker shim's records), else the first failed task's."""
    if state == State.FINISHED:
        return 0
    if state == State.CANCELED:
        return CANCELED_EXIT_CODE
    if root_cause is not None and root_cause.exit_code:
        return root_cause.exit_code
    return failed_task_code or 1
