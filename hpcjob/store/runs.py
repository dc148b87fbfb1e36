"""The runs this machine started: where each one's files are (RunRecord), and its history.

An SQLite database, `runs.db` in hpcjob's state folder (~/.local/state/hpcjob, on Windows
%LOCALAPPDATA%\\hpcjob). One row a run: where its files are (a local path, or a share and how to reach
it; never a credential), the command and tags it started with, its newest attempt's plan and job spec
and how it goes on (what `hpcjob wait` takes it up from), the job's state as last seen, and its summary
once it has ended; each ended attempt beside it. The history is this machine's alone: only the machine
that started a run knows its attempts and retries. A run on a cluster is recorded before its first job
is created, and again at each step (the job ids), so that no job hpcjob made is left without a record
that points to it. Every change is one IMMEDIATE transaction, so hpcjob processes writing at once wait
for each other instead of losing a record. The schema has a version (SQLite's user_version) and a
migration for each; the runs.jsonl of hpcjob 0.1 is imported once, when the database is made.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.job.attempts import Resumed
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobSummary, Submission
    from hpcjob.job.usage import AttemptUsage, RunUsage


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    name: str
    backend: str
    job_folder: str
    nodes: tuple[str, ...]
    local_root: str | None = None
    share: str | None = None
    smb_server: str | None = None
    smb_port: int | None = None
    smb_user: str | None = None
    job_id: str | None = None
    cluster: str | None = None
    # On a cluster: creating, mounting, created, submitted or canceled (rest.Submission), or failed (the
    # submission stopped before the job was submitted: `failure` says why); else None.
    state: str | None = None
    mount_job_id: str | None = None
    # A local run: the hpcjob process that runs it, as (pid, start time in clock ticks), so that
    # `status` and `cancel` in another shell find it, and never a process that reused its pid.
    pid: int | None = None
    pid_start: int | None = None
    # Why the submission failed (state SUBMIT_FAILED), in one line.
    failure: str | None = None
    # Which attempt of the run the record's job is (issue 33: each attempt is a job of its own).
    attempt: int = 1

    @classmethod
    def of(cls, plan: JobPlan, job_folder: str, backend: str, **where: Any) -> RunRecord:
        return cls(
            run_id=plan.run_id,
            name=plan.name,
            backend=backend,
            job_folder=job_folder,
            nodes=plan.nodes,
            attempt=plan.attempt,
            **where,
        )

    def after(self, step: Submission) -> RunRecord:
        """The record once a submission's `step` is done: its state, its job ids and, for a job run on
        this machine, the process that runs it."""
        pid, pid_start = step.process or (self.pid, self.pid_start)
        return replace(
            self,
            state=step.state,
            job_id=step.job_id,
            mount_job_id=step.mount_job_id,
            pid=pid,
            pid_start=pid_start,
        )

    @property
    def log_folder(self) -> str:
        """The log folder of the record's attempt, relative to the share folder."""
        from hpcjob.job.layout import attempt_log_folder

        return f"{self.job_folder}/logs/{attempt_log_folder(self.run_id, self.attempt)}"


# Each migration takes the database from the version before it to its own; user_version says which ran.
MIGRATIONS = (
    """
    CREATE TABLE runs (
        run_id        TEXT PRIMARY KEY,
        started       REAL NOT NULL,  -- unix time of the run's first record
        updated       REAL NOT NULL,
        name          TEXT NOT NULL,
        backend       TEXT NOT NULL,
        cluster       TEXT,
        job_id        TEXT,
        nodes         INTEGER NOT NULL,
        gpus_per_node INTEGER,
        state         TEXT,           -- the job's state as last seen (Running, Finished, Failed, ...)
        exit_code     INTEGER,
        wall_s        REAL,
        record        TEXT NOT NULL,  -- the RunRecord, as JSON
        command       TEXT,           -- the hpcjob command that started it
        plan          TEXT,           -- the job, as `render --format json` writes it
        summary       TEXT            -- the JobSummary at its end, as JSON
    );
    CREATE INDEX runs_by_start ON runs (started);
    CREATE INDEX runs_by_job ON runs (job_id);
    CREATE TABLE tags (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key    TEXT NOT NULL,
        value  TEXT NOT NULL,
        PRIMARY KEY (run_id, key)
    );
    """,
    # Issue 33: a run is attempts, each one HPC Pack job; the run's own row holds the newest.
    """
    CREATE TABLE attempts (
        run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        job_id  TEXT,
        nodes   TEXT NOT NULL,  -- the attempt's nodes, as a JSON list
        cause   TEXT,           -- how it ended (hpcjob.job.attempts.KINDS)
        said    TEXT,           -- that, in a line a person reads
        retried INTEGER,        -- whether the run went on in another attempt
        ended   REAL,           -- unix time
        summary TEXT,           -- its JobSummary, as JSON
        PRIMARY KEY (run_id, attempt)
    );
    ALTER TABLE runs ADD COLUMN canceled REAL;  -- when `hpcjob cancel` ended the run: no attempt after it
    """,
    # Issue 33: whoever follows the run next (`hpcjob wait`) plans its next attempt from the history.
    """
    ALTER TABLE runs ADD COLUMN spec TEXT;    -- the newest attempt's JobSpec, as JSON (JobSpec.to_dict)
    ALTER TABLE runs ADD COLUMN follow TEXT;  -- how the run goes on: its Retries and mount step, as JSON
    """,
    # Issue 38: each attempt's own figures (hpcjob.job.usage) start where its submission started.
    """
    ALTER TABLE runs ADD COLUMN attempt_started REAL;  -- unix time the newest attempt's submission began
    ALTER TABLE attempts ADD COLUMN started REAL;      -- unix time its submission began
    """,
    # Issue 40: where a later attempt went on from, and the work done again (hpcjob.job.attempts.Resumed).
    """
    ALTER TABLE attempts ADD COLUMN resumed TEXT;  -- as JSON: step, redone_steps, redone_s
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
ENDED_STATES = ("Finished", "Failed", "Canceled")
# A submission's last step when it stopped before its job was submitted (a step failed, Ctrl-C): never
# left at creating, mounting or created, which would read as a submission still going on.
SUBMIT_FAILED = "failed"
_RUN_ID_TIME = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


def history_file() -> Path:
    from hpcjob.store.folders import user_folder

    return user_folder("state") / "runs.db"


def legacy_runs_file() -> Path:
    """hpcjob 0.1's record of runs, one JSON object a line: imported into the database once."""
    return history_file().with_name("runs.jsonl")


# How long a command waits for another hpcjob that holds the history (a write), before it says so.
LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def _history(write: bool = True) -> Iterator[sqlite3.Connection]:
    """The database, migrated, inside one transaction (committed when the block ends): IMMEDIATE to
    write, so that writers wait for each other. A read where there is no database yet makes none: it
    reads an empty one in memory (with what it imports). The file is its owner's alone."""
    path = history_file()
    try:
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.touch(mode=0o600)
        where = str(path) if write or path.exists() else ":memory:"
        connection = sqlite3.connect(where, timeout=LOCK_WAIT_S, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise HpcjobError(f"cannot open the run history {path}: {exc}") from None
    try:
        connection.execute("PRAGMA foreign_keys = ON")
        connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        _migrate(connection)
        yield connection
        connection.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        raise HpcjobError(_history_problem(path, exc)) from None
    finally:
        connection.close()


def _history_problem(path: Path, exc: sqlite3.Error) -> str:
    text = str(exc)
    if "locked" in text:
        return f"the run history {path} stayed locked by another hpcjob for {LOCK_WAIT_S:g} s: try again"
    if "not a database" in text or "malformed" in text:
        return (
            f"the run history {path} is damaged ({text}): move it aside (hpcjob starts a new one) and keep "
            "it for the runs it knew"
        )
    return f"cannot read or write the run history {path}: {text}"


def _migrate(connection: sqlite3.Connection) -> None:
    version = int(connection.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise HpcjobError(
            f"the run history {history_file()} was written by a newer hpcjob (schema {version}, this one "
            f"knows {SCHEMA_VERSION}): upgrade hpcjob"
        )
    for script in MIGRATIONS[version:]:
        for statement in script.split(";"):
            if statement.strip():
                connection.execute(statement)
    if version == 0:
        _import_legacy(connection)
    if version < SCHEMA_VERSION:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _import_legacy(connection: sqlite3.Connection) -> None:
    """The runs.jsonl of hpcjob 0.1, oldest line first, so that a run's latest line wins. A line torn or
    garbled by hand is skipped. Its runs start when their run ids say, else when the file was written."""
    path = legacy_runs_file()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        written = path.stat().st_mtime
    except OSError:
        return
    for line in lines:
        try:
            record = _record_of(line)
        except ValueError:
            continue  # a line torn or garbled by hand: the others still find their runs
        match = _RUN_ID_TIME.search(record.run_id)
        started = written
        if match:
            with contextlib.suppress(ValueError):
                started = datetime.strptime(match[1], "%Y%m%d-%H%M%S").timestamp()
        _upsert(connection, record, started=started)


def _upsert(
    connection: sqlite3.Connection,
    record: RunRecord,
    *,
    started: float | None = None,
    command: str | None = None,
    plan: str | None = None,
    gpus_per_node: int | None = None,
    spec: str | None = None,
    follow: str | None = None,
) -> None:
    now = time.time()
    connection.execute(
        """
        INSERT INTO runs (run_id, started, updated, name, backend, cluster, job_id, nodes, gpus_per_node,
                          record, command, plan, spec, follow, attempt_started)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (run_id) DO UPDATE SET
            updated = excluded.updated, name = excluded.name, backend = excluded.backend,
            cluster = excluded.cluster, job_id = excluded.job_id, nodes = excluded.nodes,
            record = excluded.record,
            gpus_per_node = COALESCE(excluded.gpus_per_node, runs.gpus_per_node),
            command = COALESCE(excluded.command, runs.command), plan = COALESCE(excluded.plan, runs.plan),
            spec = COALESCE(excluded.spec, runs.spec), follow = COALESCE(excluded.follow, runs.follow)
        """,
        (
            record.run_id, started or now, now, record.name, record.backend, record.cluster, record.job_id,
            len(record.nodes), gpus_per_node, json.dumps(asdict(record)), command, plan, spec, follow,
            started or now,
        ),
    )  # fmt: skip


def save_run(
    record: RunRecord,
    *,
    command: str | None = None,
    plan: str | None = None,
    tags: Mapping[str, str] | None = None,
    gpus_per_node: int | None = None,
    spec: str | None = None,
    follow: str | None = None,
) -> None:
    """Record the run (again: the latest record of a run id supersedes the earlier ones); the command,
    plan, GPUs per node, spec and follow (what a follower needs to go on: the JobSpec, and the Retries
    and mount step, as JSON) are kept from the latest record that gives them, tags added (a key given
    again takes its new value)."""
    with _history() as connection:
        _upsert(
            connection, record, command=command, plan=plan, gpus_per_node=gpus_per_node, spec=spec,
            follow=follow,
        )  # fmt: skip
        for key, value in (tags or {}).items():
            connection.execute(
                "INSERT OR REPLACE INTO tags (run_id, key, value) VALUES (?, ?, ?)",
                (record.run_id, key, value),
            )


def record_end(summary: JobSummary) -> None:
    """The run's summary, at its end: state, exit code, wall time, nodes, root cause, metrics."""
    with _history() as connection:
        connection.execute(
            "UPDATE runs SET state = ?, exit_code = ?, wall_s = ?, summary = ?, updated = ? WHERE run_id = ?",
            (
                summary.state.value, summary.exit_code, summary.wall_time_s, summary.to_json(), time.time(),
                summary.run_id,
            ),
        )  # fmt: skip


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt of a run, as the history knows it: its job, nodes and how it ended."""

    attempt: int
    job_id: str | None
    nodes: tuple[str, ...]
    cause: str | None
    said: str | None
    retried: bool
    ended: float | None  # when its end was judged, on this machine's clock
    summary: JobSummary | None
    started: float | None = None  # when its submission began, on this machine's clock
    resumed: Resumed | None = None  # the save it went on from, and the work done again

    @property
    def ran(self) -> bool:
        """Whether its job ran: one whose submission was cut short ran nothing, and cost nothing."""
        from hpcjob.job.attempts import CUT_SHORT

        return self.cause != CUT_SHORT

    def usage(self, gpus_per_node: int | None) -> AttemptUsage:
        """Its own figures (hpcjob.job.usage), each trainer with `gpus_per_node` GPUs."""
        from hpcjob.job.usage import AttemptUsage

        if self.summary is None or not self.ran:
            return AttemptUsage(self.attempt, self.started, 0.0, self.nodes, ran=False)
        return self.summary.attempt_usage(self.attempt, self.started, gpus_per_node)

    def to_dict(self, gpus_per_node: int | None = None) -> dict[str, Any]:
        return {
            **self.usage(gpus_per_node).to_dict(),
            "job_id": self.job_id,
            "nodes": list(self.nodes),
            "cause": self.cause,
            "said": self.said,
            "retried": self.retried,
            "judged": self.ended,
            "state": self.summary.state.value if self.summary else None,
            "resumed": self.resumed.to_dict() if self.resumed else None,
        }


def record_attempt_end(
    record: RunRecord,
    summary: JobSummary | None,
    cause: str,
    said: str,
    retried: bool,
    resumed: Resumed | None = None,
) -> None:
    """How the record's attempt ended, kept beside the run (its row holds the newest attempt); no
    summary for an attempt whose job never ran (its submission was cut short); `resumed`: where it went
    on from."""
    with _history() as connection:
        # Its start is the run's record of it (its first attempt's: the run's own start); judged again
        # (not retried after all), its first judgement's time stays.
        connection.execute(
            """
            INSERT INTO attempts (run_id, attempt, job_id, nodes, cause, said, retried, ended, summary,
                                  started, resumed)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT COALESCE(attempt_started, started) FROM runs
                                                WHERE run_id = ?), ?)
            ON CONFLICT (run_id, attempt) DO UPDATE SET
                job_id = excluded.job_id, nodes = excluded.nodes, cause = excluded.cause,
                said = excluded.said, retried = excluded.retried,
                summary = COALESCE(excluded.summary, attempts.summary),
                resumed = COALESCE(excluded.resumed, attempts.resumed)
            """,
            (
                record.run_id, record.attempt, record.job_id, json.dumps(list(record.nodes)), cause, said,
                int(retried), time.time(), summary.to_json() if summary is not None else None, record.run_id,
                json.dumps(resumed.to_dict()) if resumed is not None else None,
            ),
        )  # fmt: skip


_ATTEMPT_COLUMNS = "attempt, job_id, nodes, cause, said, retried, ended, summary, started, resumed"


def _attempt_of(row: Sequence[Any]) -> AttemptEntry:
    """A row of _ATTEMPT_COLUMNS; a summary or node list that cannot be read is shown as missing."""
    from hpcjob.job.attempts import Resumed
    from hpcjob.job.results import JobSummary

    attempt, job_id, nodes, cause, said, retried, ended, summary, started, resumed = row
    try:
        ended_summary = JobSummary.from_json(summary) if summary else None
    except (ValueError, TypeError, KeyError):
        ended_summary = None
    try:
        names = tuple(str(n) for n in json.loads(nodes))
    except ValueError:
        names = ()
    try:
        went_on = Resumed.from_dict(json.loads(resumed)) if resumed else None
    except (ValueError, AttributeError):
        went_on = None
    return AttemptEntry(
        attempt, job_id, names, cause, said, bool(retried), ended, ended_summary, started, went_on
    )


def record_cancel(run_id: str) -> None:
    """`hpcjob cancel` ended the run: whoever follows it starts no other attempt."""
    with _history() as connection:
        connection.execute("UPDATE runs SET canceled = ? WHERE run_id = ?", (time.time(), run_id))


def was_canceled(run_id: str) -> bool:
    """Whether `hpcjob cancel` ended the run (on this machine)."""
    with _history(write=False) as connection:
        row = connection.execute("SELECT canceled FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return row is not None and row[0] is not None


def record_next_attempt(record: RunRecord, *, plan: str | None = None, spec: str | None = None) -> None:
    """A run goes on in another attempt (`record`, its job not made yet; its `plan` and `spec`, as JSON,
    replace the earlier attempt's): the earlier attempt's end is no longer the run's, so its state, exit
    code and summary are cleared until this one ends."""
    with _history() as connection:
        _upsert(connection, record, plan=plan, spec=spec)
        connection.execute(
            "UPDATE runs SET state = NULL, exit_code = NULL, wall_s = NULL, summary = NULL, "
            "attempt_started = ? WHERE run_id = ?",
            (time.time(), record.run_id),
        )


def recorded_follow(run_id: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What a follower needs to go on with the run, as recorded: its newest attempt's JobSpec and how it
    goes on (Retries, mount step), each as a JSON object, or None (a run of an older hpcjob, a value
    that cannot be read)."""
    with _history(write=False) as connection:
        row = connection.execute("SELECT spec, follow FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    found: list[dict[str, Any] | None] = []
    for text in row or (None, None):
        try:
            value = json.loads(text) if text else None
        except ValueError:
            value = None
        found.append(value if isinstance(value, dict) else None)
    return found[0], found[1]


def record_state(run_id: str, state: str, exit_code: int | None) -> None:
    """The job's state as just seen (`hpcjob status`), where no summary says more."""
    with _history() as connection:
        connection.execute(
            "UPDATE runs SET state = ?, exit_code = COALESCE(?, exit_code), updated = ? "
            "WHERE run_id = ? AND summary IS NULL",
            (state, exit_code, time.time(), run_id),
        )


_RECORD_INTS = {"smb_port", "pid", "pid_start", "attempt"}
_RECORD_REQUIRED = {"run_id", "name", "backend", "job_folder"}


@functools.cache
def _record_fields() -> tuple[Field[Any], ...]:
    return fields(RunRecord)


def _record_of(text: str) -> RunRecord:
    """A RunRecord from its JSON; ValueError when the text is not one (keys of a newer hpcjob are
    left out, values of the wrong type are not taken)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict):
        raise ValueError("not an object")
    values: dict[str, Any] = {}
    for f in _record_fields():
        value = data.get(f.name)
        if f.name == "nodes":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise ValueError("nodes must be a list of names")
            values["nodes"] = tuple(value)
        elif value is None:
            if f.name in _RECORD_REQUIRED:
                raise ValueError(f"{f.name} is missing")
        elif isinstance(value, int if f.name in _RECORD_INTS else str) and not isinstance(value, bool):
            values[f.name] = value
        else:
            raise ValueError(f"{f.name} has the wrong type")
    return RunRecord(**values)


@dataclass(frozen=True)
class HistoryEntry:
    """One run as the history knows it."""

    record: RunRecord
    started: float
    updated: float
    state: str | None
    exit_code: int | None
    attempt_wall_s: float | None  # the newest attempt's (the run's: wall_s)
    gpus_per_node: int | None
    command: str | None
    plan: dict[str, Any] | None
    summary: JobSummary | None
    tags: dict[str, str] = field(default_factory=dict)
    # The run's ended attempts the history kept (issue 33): none for a run of one attempt, no retries.
    attempts: list[AttemptEntry] = field(default_factory=list)
    # When the newest attempt's submission began (None: a history of an older hpcjob).
    attempt_started: float | None = None

    @cached_property
    def usage(self) -> RunUsage | None:
        """What the run used, attempt by attempt, and in all (hpcjob.job.usage): every attempt the history
        kept, and the newest from the run's own summary; None while no attempt has ended."""
        if self.summary is None and not self.attempts:
            return None
        return self.usage_with(self.summary)

    def usage_with(self, newest: JobSummary | None) -> RunUsage:
        """The run's figures had its newest attempt ended with `newest` (its follower's summary, before
        the history has it): the earlier attempts' as the history keeps them, and that one's."""
        from hpcjob.job.usage import run_usage

        attempt = self.record.attempt
        ended = [a.usage(self.gpus_per_node) for a in self.attempts if newest is None or a.attempt != attempt]
        if newest is not None:
            started = self.attempt_started if attempt > 1 else self.started
            ended.append(newest.attempt_usage(attempt, started, self.gpus_per_node))
        return run_usage(ended)

    @property
    def wall_s(self) -> float | None:
        """The time the run held nodes: its attempts' wall times together."""
        return None if (usage := self.usage) is None else usage.wall_s

    @property
    def node_hours(self) -> float | None:
        """The wall time of every node the run held, attempt by attempt: trainers and data nodes."""
        return None if (usage := self.usage) is None else usage.node_hours

    @property
    def gpu_hours(self) -> float | None:
        """The trainers' GPUs' wall time, attempt by attempt (a data node has none)."""
        return None if (usage := self.usage) is None else usage.gpu_hours

    @property
    def cost_usd(self) -> float | None:
        """What the run's nodes cost while their tasks ran, every attempt's, at the price each attempt's
        summary was counted at (hpcjob.job.prices: an attribution, not the bill); None for a local run, a
        run without a summary, a cluster whose profile named no size and region, or a run one of whose
        attempts has no price (`usage.unknown_cost()` says which)."""
        return None if (usage := self.usage) is None else usage.cost_usd

    @property
    def cost_per_1000_samples(self) -> float | None:
        """What 1,000 samples cost at the run's own samples/s: its priced nodes' price a second over the
        samples a second they trained (start-up and evaluation are in the run's cost, not here)."""
        from hpcjob.job.prices import cost_per_1000_samples

        summary, speed = self.summary, self.samples_per_sec
        if summary is None or summary.price is None or not summary.usage or speed is None:
            return None
        return cost_per_1000_samples(summary.price.usd_per_hour * len(summary.usage), speed)

    @property
    def samples_per_sec(self) -> float | None:
        """The run's own throughput; None where it measured none (a run that trained nothing: an older
        training program copied the checkpoint's)."""
        return self._metric("samples_per_sec")

    @property
    def data_node_names(self) -> tuple[str, ...]:
        """The CPU data nodes of the run's newest attempt (its plan's), if it had any."""
        plan = self.plan or {}
        return tuple(str(node) for node in plan.get("data_node_names") or plan.get("data_nodes") or ())

    def _metric(self, key: str) -> float | None:
        if self.summary is None or self.summary.trained_nothing:
            return None
        value = (self.summary.metrics or {}).get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def data_wait(self) -> float | None:
        """The share of the trainers' loop time spent waiting for data (their loaders', or data nodes')."""
        return self._metric("data_wait_fraction")

    @property
    def data_samples_per_sec(self) -> float | None:
        """The data nodes' samples a second together, as the trainers drew them (a run with data nodes)."""
        return self._metric("data_samples_per_sec")

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.record),
            "started": self.started,
            "updated": self.updated,
            "job_state": self.state,
            "exit_code": self.exit_code,
            "wall_s": self.wall_s,
            "gpus_per_node": self.gpus_per_node,
            "node_hours": self.node_hours,
            "gpu_hours": self.gpu_hours,
            "samples_per_sec": self.samples_per_sec,
            "data_node_names": list(self.data_node_names),
            "data_wait": self.data_wait,
            "data_samples_per_sec": self.data_samples_per_sec,
            "cost_usd": self.cost_usd,
            "cost_per_1000_samples_usd": self.cost_per_1000_samples,
            "price": asdict(self.summary.price) if self.summary and self.summary.price else None,
            "tags": self.tags,
            "command": self.command,
            "plan": self.plan,
            "summary": json.loads(self.summary.to_json()) if self.summary else None,
            "attempts": [attempt.to_dict(self.gpus_per_node) for attempt in self.attempts],
            "usage": None if self.usage is None else self.usage.to_dict(),
        }


def history(**filters: Any) -> list[HistoryEntry]:
    """The runs recorded here, newest first, as iter_history's `filters` choose them, in a list."""
    return list(iter_history(**filters))


def iter_history(
    *,
    cluster: str | None = None,
    backend: str | None = None,
    state: str | None = None,
    tags: Mapping[str, str] | None = None,
    since: float | None = None,
    last: int | None = None,
) -> Iterator[HistoryEntry]:
    """The runs recorded here, newest first, one at a time as the database gives them: of
    `cluster`/`backend`, in `state` (the job's, else the submission's last step), with every one of
    `tags`, started at or after `since`; `last`: the newest so many. The filters and `last` are the
    query's, so that the newest few of a long history read only those few (issue 42: 10,000 runs)."""
    query = f"SELECT {_ENTRY_COLUMNS} FROM runs WHERE 1 = 1"
    values: list[Any] = []
    for column, wanted in (("cluster", cluster), ("backend", backend)):
        if wanted is not None:
            query += f" AND {column} = ?"
            values.append(wanted)
    if since is not None:
        query += " AND started >= ?"
        values.append(since)
    if state is not None:  # the job's state, else the submission's last step (the record's)
        query += " AND (lower(state) = ? OR lower(json_extract(record, '$.state')) = ?)"
        values += [state.lower(), state.lower()]
    for key, value in (tags or {}).items():
        query += (
            " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_id = runs.run_id AND t.key = ? AND t.value = ?)"
        )
        values += [key, value]
    query += " ORDER BY started DESC, rowid DESC"
    if last is not None:
        query += " LIMIT ?"
        values.append(last)
    with _history(write=False) as connection:
        yield from _entries(connection, connection.execute(query, values).fetchall())


def _lookup(run_or_job_id: str, cluster: str | None = None) -> HistoryEntry | None:
    """The run whose run id, else job id (its newest attempt's, or an earlier attempt's) on `cluster` if
    named, this is: of several with that job id, the latest updated."""
    query = (
        f"SELECT {_ENTRY_COLUMNS} FROM runs WHERE (run_id = ? OR job_id = ? OR run_id IN "
        "(SELECT run_id FROM attempts WHERE job_id = ?)) AND (? IS NULL OR cluster = ?) "
    )
    query += "ORDER BY run_id = ? DESC, updated DESC, rowid DESC LIMIT 1"
    values = [run_or_job_id, run_or_job_id, run_or_job_id, cluster, cluster, run_or_job_id]
    with _history(write=False) as connection:
        found = list(_entries(connection, connection.execute(query, values).fetchall()))
    return found[0] if found else None


def find_entry(run_or_job_id: str) -> HistoryEntry:
    """One run of the history, whole (`hpcjob runs show`)."""
    entry = _lookup(run_or_job_id)
    if entry is None:
        raise SpecError(f"no run {run_or_job_id!r} in this machine's history: `hpcjob runs` lists them")
    return entry


_FEW_ROWS = 500  # rows whose tags and attempts are looked up by run id (below SQLite's 999 parameters)
_ENTRY_COLUMNS = (
    "run_id, started, updated, state, exit_code, wall_s, gpus_per_node, record, command, plan, summary, "
    "attempt_started"
)


def _entries(connection: sqlite3.Connection, rows: list[Any]) -> Iterator[HistoryEntry]:
    """Rows of _ENTRY_COLUMNS as entries, one at a time; a row whose record cannot be read is left out, a
    summary or plan that cannot be read (a newer hpcjob's, a hand's) is shown as missing. Their tags and
    attempts are read for those rows alone where they are few, else for all at once."""
    from hpcjob.job.results import JobSummary

    where, chosen = "", []
    if len(rows) <= _FEW_ROWS:
        where, chosen = f" WHERE run_id IN ({', '.join('?' * len(rows))})", [row[0] for row in rows]
    tags: dict[str, dict[str, str]] = {}
    for run_id, key, value in connection.execute(
        f"SELECT run_id, key, value FROM tags{where} ORDER BY key", chosen
    ):
        tags.setdefault(run_id, {})[key] = value
    attempts: dict[str, list[AttemptEntry]] = {}
    for row in connection.execute(
        f"SELECT run_id, {_ATTEMPT_COLUMNS} FROM attempts{where} ORDER BY attempt", chosen
    ):
        attempts.setdefault(row[0], []).append(_attempt_of(row[1:]))
    for (
        run_id,
        started,
        updated,
        job_state,
        exit_code,
        wall_s,
        gpus,
        record,
        command,
        plan,
        summary,
        since,
    ) in rows:
        try:
            run = _record_of(record)
        except ValueError:
            continue
        try:
            ended = JobSummary.from_json(summary) if summary else None
        except (ValueError, TypeError, KeyError):
            ended = None
        try:
            job = json.loads(plan) if plan else None
        except ValueError:
            job = None
        yield HistoryEntry(
            run,
            started,
            updated,
            job_state,
            exit_code,
            wall_s,
            gpus,
            command,
            job,
            ended,
            tags.get(run_id, {}),
            attempts.get(run_id, []),
            since,
        )


def _records_newest_first() -> Iterator[RunRecord]:
    with _history(write=False) as connection:
        rows = connection.execute("SELECT record FROM runs ORDER BY updated DESC, rowid DESC").fetchall()
    for (record,) in rows:
        with contextlib.suppress(ValueError):
            yield _record_of(record)


def newest_run() -> RunRecord:
    """The run this machine started last (for status, logs and cancel without a run named)."""
    with _history(write=False) as connection:
        rows = connection.execute("SELECT record FROM runs ORDER BY started DESC, rowid DESC").fetchall()
    for (record,) in rows:
        with contextlib.suppress(ValueError):
            return _record_of(record)
    raise SpecError("no run in this machine's history yet: start one with `hpcjob run` or `hpcjob submit`")


def find_run(run_id: str, cluster: str | None = None) -> RunRecord:
    """Where the run's files are: its latest record (also by the job id a backend gave it, on
    `cluster` if named)."""
    entry = _lookup(run_id, cluster)
    if entry is None:
        where = f" for cluster {cluster}" if cluster else ""
        raise SpecError(
            f"no run {run_id!r} recorded on this machine{where}: give its --share or --mount-point and "
            "--job-folder"
        )
    return entry.record


# The state of a run id that `render` made up without staging anything: the job folder's current run,
# which later renders of the same job folder reuse, so that the job file and the mount step agree.
RENDERED = "rendered"


def current_manual_run(job_folder: str, share: str | None) -> RunRecord | None:
    """The newest run rendered or staged by hand (`render`) for this job folder of this share."""
    for record in _records_newest_first():
        if record.backend == "manual" and record.job_folder == job_folder and record.share == share:
            return record
    return None


def check_new_run_id(run_id: str) -> None:
    """Refuse a run id this machine has recorded: it names the job on the cluster, the rendezvous and
    the log folder, so a second run under it would mix with the first. Call it before anything is sent."""
    for record in _records_newest_first():
        if record.run_id == run_id and record.state != RENDERED:  # only rendered: nothing ran under it
            if record.job_id is not None:
                used = f"job {record.job_id} on cluster {record.cluster}"
            elif record.cluster is not None:
                used = f"a submission to cluster {record.cluster}"
            else:
                used = f"a {record.backend} run"
            raise SpecError(
                f"run id {run_id!r} is taken: {used} has it (see `hpcjob runs show {run_id}`); choose "
                "another --run-id, or leave it out for a new one"
            )
