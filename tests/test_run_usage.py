"""Issue 38: one truth about what a run used and cost. Each attempt carries its own start, wall time,
nodes of each role, node-hours, GPU-hours and cost; the run's figures are their sums, and every view
(`runs`, `runs show`, `--json`, the summary `submit --wait` ends with) says the same. An attempt without a
price makes the run's cost unknown, named. `hpcjob wait` on a run that has ended changes nothing in its
record. Against test_follow.py's backend (the attempts' ends are told, not run)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from hpcjob.cli.runs import describe
from hpcjob.cli.tables import format_summary
from hpcjob.job.plan import JobPlan
from hpcjob.job.prices import Price
from hpcjob.job.results import JobInfo, JobSummary, NodeResult, State, TaskInfo
from hpcjob.job.usage import AttemptUsage, run_usage
from hpcjob.runner import follow_attempts, take_up
from hpcjob.store.runs import RunRecord, find_entry, history, history_file, record_end, save_run

from .test_follow import PRICE, RUN, SPEC, Cluster, fast, recorded


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The backend of every run here (test_follow.py's)."""
    backend = Cluster()
    monkeypatch.setattr("hpcjob.runner.access.backend_for_run", lambda record, *args: backend)
    return backend


# Attempt 1 held its 2 nodes for 10 minutes, attempt 2 its 2 for 20: $10 a node-hour where priced.
WALLS = {1: 600.0, 2: 1200.0}


def ended_after(states: list[State], prices: list[Price | None]) -> Any:
    """follow_run, as each attempt ends: attempt N in states[N - 1] after WALLS[N], its tasks that long,
    at prices[N - 1]; the summary recorded as follow_run records it."""

    def follow(backend: Any, record: RunRecord, plan: JobPlan, *args: Any) -> JobSummary:
        state, wall = states[record.attempt - 1], WALLS[record.attempt]
        code = 0 if state is State.FINISHED else 1
        nodes = [NodeResult(n, state, code, task_start=0.0, task_end=wall) for n in plan.nodes]
        summary = JobSummary(
            plan.name, record.run_id, state, code, wall, plan.job_dir, plan.log_dir, nodes,
            job_id=record.job_id, price=prices[record.attempt - 1],
        )  # fmt: skip
        record_end(summary)
        return summary

    return follow


def two_attempts(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, second: Price | None) -> JobSummary:
    """Run RUN (4 GPUs a node): attempt 1 loses GPU2, attempt 2 finishes; the run's summary."""
    monkeypatch.setattr(
        "hpcjob.runner.attempts.follow_run", ended_after([State.FAILED, State.FINISHED], [PRICE, second])
    )
    retries = fast(1)
    first, plan = recorded(retries)
    save_run(first, gpus_per_node=4)
    _, summary = follow_attempts(
        cluster, SPEC, first, plan, lambda: None, 0.0, lambda line: None, retries, mount_step=False
    )  # fmt: skip
    return summary


def test_each_attempt_has_its_figures_and_the_run_their_sums_in_every_view(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = two_attempts(monkeypatch, cluster, PRICE)
    entry = find_entry(RUN)
    assert entry.usage is not None
    attempts = [
        (a.attempt, a.wall_s, a.nodes, a.node_hours, a.gpu_hours, a.cost_usd) for a in entry.usage.attempts
    ]
    assert attempts == [
        (1, 600.0, ("GPU1", "GPU2"), pytest.approx(2 / 6), pytest.approx(8 / 6), pytest.approx(20 / 6)),
        (2, 1200.0, ("GPU1", "GPU3"), pytest.approx(4 / 6), pytest.approx(16 / 6), pytest.approx(40 / 6)),
    ]
    assert all(a.started is not None and a.ended == a.started + a.wall_s for a in entry.usage.attempts)
    # The run: the sums, not its last attempt's (which said 20 min, 0.67 node-hours, 2.67 GPU-hours).
    run = (1800.0, pytest.approx(1.0), pytest.approx(4.0), pytest.approx(10.0))
    assert (entry.wall_s, entry.node_hours, entry.gpu_hours, entry.cost_usd) == run
    listed = history()[0].to_dict()  # `runs --json`
    assert (listed["wall_s"], listed["node_hours"], listed["gpu_hours"], listed["cost_usd"]) == run
    assert [(a["attempt"], a["wall_s"], a["cost_usd"]) for a in listed["attempts"]] == [
        (1, 600.0, pytest.approx(20 / 6)),
        (2, 1200.0, pytest.approx(40 / 6)),
    ]
    # The summary `submit --wait` ends with, and its --json.
    assert summary.wall_time_s == 1800.0 and summary.cost_usd == pytest.approx(10.0)
    printed = format_summary(summary)
    assert printed.splitlines()[0].startswith(f"job {summary.name} Finished in 30 min 0 s, exit code 0 (run ")
    assert ", 2 attempts)" in printed.splitlines()[0]
    assert "  usage: 1.00 node-hours, 4.00 GPU-hours, its attempts together" in printed
    assert "cost ≈ $10.00 at " in printed
    data = json.loads(summary.to_json())
    assert data["wall_time_s"] == 1800.0 and data["run_usage"]["node_hours"] == pytest.approx(1.0)
    assert JobSummary.from_json(summary.to_json()).run_attempts == summary.run_attempts
    # `runs show`.
    shown = "\n".join(describe(entry))
    assert "  state:    Finished, exit code 0 after 30 min 0 s" in shown
    assert "  usage:    1.00 node-hours, 4.00 GPU-hours, its 2 attempts together" in shown
    assert "  cost:     ≈ $10.00, its attempts together" in shown
    assert "    1. job 11 on GPU1, GPU2, 10 min 0 s, 0.33 node-hours, $3.33: GPU2 was lost; retried" in shown
    assert "    2. job 12 on GPU1, GPU3, 20 min 0 s, 0.67 node-hours, $6.67: finished" in shown


def test_an_attempt_without_a_price_makes_the_run_s_cost_unknown_and_is_named(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = two_attempts(monkeypatch, cluster, None)
    entry = find_entry(RUN)
    assert entry.cost_usd is None and summary.cost_usd is None  # not attempt 1's $3.33 alone
    assert entry.usage is not None and entry.usage.unknown_cost() == "attempt 2 has no price"
    assert "  cost:     unknown: attempt 2 has no price" in describe(entry)
    assert "  cost unknown: attempt 2 has no price" in format_summary(summary)
    assert history()[0].to_dict()["usage"]["unknown_cost"] == "attempt 2 has no price"


def test_a_cut_short_attempt_ran_nothing_and_cost_nothing() -> None:
    usage = run_usage(
        [
            AttemptUsage(1, 0.0, 600.0, ("A", "B"), ("D",), 8, 5.0),
            AttemptUsage(2, 700.0, 0.0, ("A", "C"), ran=False),
            AttemptUsage(3, 800.0, 300.0, ("A", "C"), ("D",), 8, 2.5),
        ]
    )
    # Data nodes count in node-hours, not in GPU-hours.
    assert (usage.wall_s, usage.node_hours, usage.gpu_hours) == (900.0, 0.75, pytest.approx(4.0))
    assert usage.cost_usd == 7.5 and usage.unknown_cost() is None


def test_waiting_for_a_run_that_has_ended_changes_nothing_in_its_record(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of one attempt ended 20 s after it started: each `hpcjob wait` since tells it as the history
    holds it, follows nothing and writes nothing (it stretched its wall time to the time of the wait)."""
    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", ended_after([State.FINISHED], [PRICE]))
    retries = fast(0)
    first, plan = recorded(retries)
    follow_attempts(
        cluster, SPEC, first, plan, lambda: None, 0.0, lambda line: None, retries, mount_step=False
    )

    def rows() -> list[Any]:
        with sqlite3.connect(history_file()) as db:
            return [
                db.execute("SELECT * FROM runs").fetchall(),
                db.execute("SELECT * FROM attempts").fetchall(),
            ]

    before = rows()

    def never(*args: Any) -> JobSummary:
        raise AssertionError("an ended run was followed again")

    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", never)
    for _ in range(2):
        _, summary = take_up(RUN, lambda line: None, command="hpcjob wait")
        assert summary.state is State.FINISHED and summary.wall_time_s == 600.0
    assert rows() == before


def test_a_job_s_wall_time_is_its_tasks_span_where_the_scheduler_gives_it() -> None:
    """A follower that comes after the job ended (`submit` without --wait, then `wait`) counts the
    job's time, not its own."""
    tasks = (
        TaskInfo(1, "a", "Finished", 0, "N1", start=1000.0, end=1015.0),
        TaskInfo(2, "b", "Finished", 0, "N2", start=1001.0, end=1020.0),
    )
    assert JobInfo("1", "j", "Finished", "", tasks).wall_s(330.0) == 20.0
    unknown = (TaskInfo(1, "a", "Finished", 0, "N1"),)
    assert JobInfo("1", "j", "Finished", "", unknown).wall_s(330.0) == 330.0  # a local run's: its own clock
