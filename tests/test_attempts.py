"""Issue 33: why an attempt ended, told by evidence, and whether the run goes on (hpcjob.job.attempts)."""

from __future__ import annotations

import dataclasses

import pytest

from hpcjob.job.attempts import Cause, attempt_cause, next_attempt_exclusions, told_lost
from hpcjob.job.hangs import HANG_EXIT_CODE
from hpcjob.job.results import JobInfo, JobSummary, NodeInfo, NodeResult, RootCause, State, TaskInfo

NODES = ("GPU1", "GPU2")


def summary(state: State, cause: RootCause | None = None) -> JobSummary:
    results = [NodeResult(n, state, 0 if state is State.FINISHED else 1) for n in NODES]
    return JobSummary("train", "run-1", state, 0, 1.0, "/app", "/app/logs", results, root_cause=cause)


def job(*tasks: TaskInfo, state: str = "Failed") -> JobInfo:
    return JobInfo("7", "run-1", state, "", tasks=tasks)


def task(node: str, state: str, exit_code: int | None, error: str = "") -> TaskInfo:
    return TaskInfo(1, f"torchrun {node}", state, exit_code, node, error)


def healthy(*sick: str, health: str = "Error") -> list[NodeInfo]:
    return [NodeInfo(n, "Online", health if n in sick else "OK") for n in (*NODES, "GPU3")]


def rank_failed(reason: str, node: str = "GPU2", exit_code: int = 1) -> RootCause:
    return RootCause(node, exit_code, 1.0, rank=1, reason=reason)


def test_a_finished_or_canceled_attempt_is_never_retried() -> None:
    assert attempt_cause(summary(State.FINISHED), job(state="Finished"), healthy()) == Cause(
        "finished", False, "finished"
    )
    canceled = attempt_cause(summary(State.CANCELED), job(state="Canceled"), healthy(), canceled_by_user=True)
    assert (canceled.kind, canceled.retried) == ("canceled", False)


@pytest.mark.parametrize(
    ("nodes_now", "tasks", "lost"),
    [
        # The head node marked it: REST shows the HealthState (Error), PowerShell Unreachable.
        (healthy("GPU2"), (task("GPU2", "Failed", None),), ("GPU2",)),
        (healthy("GPU2", health="Unreachable"), (task("GPU2", "Failed", None),), ("GPU2",)),
        # Taken offline, or gone from the node list.
        ([NodeInfo("GPU1", "Online", "OK"), NodeInfo("GPU2", "Offline", "OK")], (), ("GPU2",)),
        ([NodeInfo("GPU1", "Online", "OK")], (), ("GPU2",)),
        # Not marked yet, but the scheduler's message for its task says so.
        (healthy(), (task("GPU1", "Failed", None, "The node GPU1 became unreachable."),), ("GPU1",)),
    ],
)
def test_a_lost_node_is_retried_and_left_out_of_the_next_attempt(
    nodes_now: list[NodeInfo], tasks: tuple[TaskInfo, ...], lost: tuple[str, ...]
) -> None:
    cause = attempt_cause(summary(State.FAILED, rank_failed("RuntimeError: boom")), job(*tasks), nodes_now)
    assert (cause.kind, cause.retried, cause.lost) == ("node lost", True, lost)
    assert cause.said == f"{lost[0]} was lost"
    assert next_attempt_exclusions(("GPU9",), cause) == ("GPU9", *lost)


def test_a_hang_a_network_error_and_a_task_the_scheduler_ended_are_retried() -> None:
    hang = RootCause("GPU2", HANG_EXIT_CODE, 1.0, rank=1, reason="rank 1 held the others up in all_reduce")
    assert attempt_cause(summary(State.FAILED, hang), job(), healthy()).kind == "hang"
    for reason in (
        "torch.distributed.DistBackendError: NCCL error in: ... ncclRemoteError",
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0.",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    ):
        found = attempt_cause(summary(State.FAILED, rank_failed(reason)), job(), healthy())
        assert (found.kind, found.retried, found.lost) == ("network", True, ()), reason
    ended = job(task("GPU1", "Failed", -1, "Task failed during execution on the node."))  # HPC Pack's -1
    found = attempt_cause(summary(State.FAILED), ended, healthy())
    assert (found.kind, found.retried) == ("task ended by the scheduler", True)
    assert found.said == "the scheduler ended the task on GPU1: Task failed during execution on the node."


@pytest.mark.parametrize(
    "cause",
    [
        rank_failed("ZeroDivisionError: division by zero"),  # an exception in a rank
        rank_failed("", exit_code=3),  # the script's own exit code
        RootCause("GPU2", 137, 1.0, rank=0, signal="SIGKILL"),  # the OOM killer, the node healthy
    ],
)
def test_the_program_s_own_failure_is_retried_only_with_retry_on_any(cause: RootCause) -> None:
    # The gang's other task is canceled by the scheduler, with its words: not the cause.
    failed = job(task("GPU2", "Failed", cause.exit_code), task("GPU1", "Canceled", None, "The job failed."))
    found = attempt_cause(summary(State.FAILED, cause), failed, healthy())
    assert (found.kind, found.retried, found.lost) == ("program", False, ())
    assert found.said.endswith("; not retried (--retry-on any retries it)")
    again = attempt_cause(summary(State.FAILED, cause), failed, healthy(), retry_on="any")
    assert again.retried and "not retried" not in again.said
    if cause.exit_code == 137:  # killed, not failed: and why a rank of a healthy node usually is
        assert found.said.startswith(
            "rank 0 on GPU2 was killed by SIGKILL (exit code 137): the out-of-memory "
        )
    else:
        assert found.said.startswith("the program failed on GPU2")


def test_a_task_that_exits_137_without_a_rank_record_was_killed() -> None:
    """A torchrun (or container) killed as a whole: its task's exit code, no rank's record."""
    cause = RootCause("GPU2", 137, 1.0)
    found = attempt_cause(summary(State.FAILED, cause), job(task("GPU2", "Failed", 137)), healthy())
    assert found.said.startswith("the task on GPU2 was killed by SIGKILL (exit code 137)")


def test_the_history_keeps_each_attempt_and_a_cancel_marks_the_run() -> None:
    """`runs show` and `runs --json` list the attempts (this machine's history, in the test's own
    folder: tests/conftest.py); a cancel marks the run for whoever follows it."""
    from hpcjob.job.plan import make_plan
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.runs import (
        RunRecord,
        find_entry,
        record_attempt_end,
        record_cancel,
        record_next_attempt,
        save_run,
        was_canceled,
    )

    spec = JobSpec(script="train.py", node_names=NODES)
    first = RunRecord.of(make_plan(spec, NODES, "run-1"), "hpcjob/train", "rest", cluster="lab", job_id="7")
    save_run(first)
    lost = summary(State.FAILED, rank_failed("RuntimeError: gloo"))
    record_attempt_end(first, lost, "node lost", "GPU2 was lost", True)
    second = RunRecord.of(make_plan(spec, ("GPU1", "GPU3"), "run-1", attempt=2), "hpcjob/train", "rest")
    record_next_attempt(second)
    entry = find_entry("run-1")
    assert (entry.state, entry.summary, entry.record.attempt) == (None, None, 2)  # the run goes on
    assert entry.record.log_folder == "hpcjob/train/logs/run-1/2"
    assert [(a.attempt, a.job_id, a.nodes, a.cause, a.retried) for a in entry.attempts] == [
        (1, "7", NODES, "node lost", True)
    ]
    assert entry.to_dict()["attempts"][0]["said"] == "GPU2 was lost"
    assert find_entry("7").record.run_id == "run-1"  # an earlier attempt's job id finds the run
    assert not was_canceled("run-1")
    record_cancel("run-1")
    assert was_canceled("run-1")


def test_a_later_attempt_s_job_is_looked_up_by_its_own_name() -> None:
    """A record whose job id was never heard (a lost answer, a follower stopped while submitting) names
    its attempt's job, RUN.N, never the first attempt's."""
    from dataclasses import replace

    from hpcjob.backends.scheduler import recorded_job_id
    from hpcjob.job.spec import SpecError
    from hpcjob.store.runs import RunRecord

    jobs = {"run-1": 7, "run-1.2": 9}
    second = RunRecord("run-1", "train", "rest", "hpcjob/train", NODES, attempt=2)
    assert recorded_job_id(second, lambda names: {n: jobs[n] for n in names if n in jobs}, "lab") == 9
    with pytest.raises(SpecError, match=r"run run-1 \(attempt 3\) has no job on cluster lab"):
        recorded_job_id(replace(second, attempt=3), lambda names: {}, "lab")


def test_a_run_id_never_takes_the_name_of_another_run_s_later_attempt() -> None:
    from hpcjob.job.spec import SpecError, check_run_id

    assert check_run_id("train.v2") == "train.v2"
    with pytest.raises(SpecError, match=r"may not end in \.NUMBER: that names a later attempt's job"):
        check_run_id("train.2")


def test_a_lost_node_s_first_failure_says_it_was_lost_not_its_last_line() -> None:
    last_words = RootCause("GPU2", 1, 1.0, rank=3, reason="epoch 2 step 40 loss=0.31")
    ended = summary(State.FAILED, last_words)
    cause = attempt_cause(
        ended, job(), [NodeInfo("GPU1", "Online", "OK"), NodeInfo("GPU2", "Unreachable", "OK")]
    )
    assert cause.lost == ("GPU2",)
    told = told_lost(ended, cause).root_cause
    assert told is not None and told.describe() == "the task on GPU2, exit code 1: GPU2 was lost"
    assert told_lost(ended, attempt_cause(ended, job(), healthy())).root_cause == last_words  # not lost


def test_a_lost_data_node_s_first_failure_says_it_was_lost_too() -> None:
    """A data node (no rank of the training) lost: its last words are not the attempt's cause either."""
    last_words = RootCause("DATA1", 1, 1.0, rank=None, reason="served 4000 samples")
    ended = summary(State.FAILED, last_words)
    data = NodeResult("DATA1", State.FAILED, 1)
    ended = dataclasses.replace(ended, nodes=[*ended.nodes, data], data_node_names=["DATA1"])
    nodes = [*healthy(), NodeInfo("DATA1", "Unreachable", "OK")]
    cause = attempt_cause(ended, job(task("DATA1", "Failed", 1)), nodes)
    assert cause.lost == ("DATA1",) and cause.retried
    told = told_lost(ended, cause).root_cause
    assert told is not None and told.describe() == "the task on DATA1, exit code 1: DATA1 was lost"
