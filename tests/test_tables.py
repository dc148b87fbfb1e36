"""What a person reads: aligned tables with headers, durations as times, rounded metrics."""

from __future__ import annotations

import pytest

from hpcjob.cli.tables import duration, format_summary, number, table
from hpcjob.job.results import JobSummary, NodeResult, RootCause, State


def test_table_aligns_columns_under_the_header() -> None:
    assert table(
        ("NODE", "STATE", "EXIT CODE"), [("LOCAL1", "Running", None), ("N2", "Failed", 3)], "  "
    ) == [
        "  NODE    STATE    EXIT CODE",
        "  LOCAL1  Running  -",
        "  N2      Failed   3",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0 s"), (9.54, "9.5 s"), (59.9, "59.9 s"), (725.2, "12 min 5 s"), (12025, "3 h 20 min")],
)
def test_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.96191406, "0.962"),
        (4475.23, "4475"),
        (1.798123, "1.8"),
        (0.0, "0"),
        (0.00012, "1.2e-04"),
        (7, "7"),
        (True, "True"),
        ("gloo", "gloo"),
    ],
)
def test_numbers_are_rounded(value: object, text: str) -> None:
    assert number(value) == text


def test_the_summary_of_a_failed_job() -> None:
    summary = JobSummary(
        name="run_ddp",
        run_id="r-1",
        state=State.FAILED,
        exit_code=137,
        wall_time_s=3725.0,
        job_dir="/share/hpcjob/run_ddp",
        log_dir="/share/hpcjob/run_ddp/logs/r-1",
        nodes=[NodeResult("LOCAL1", State.CANCELED, 130), NodeResult("LOCAL2", State.FAILED, 1)],
        root_cause=RootCause(node="LOCAL2", exit_code=137, time=5.0, rank=1, signal="SIGKILL"),
        metrics={
            "accuracy": 0.96191406,
            "data_wait_fraction": 0.024281,
            "wall_time_s": 2.841,
            "world_size": 2,
        },
    )
    assert format_summary(summary).splitlines() == [
        "job run_ddp Failed in 1 h 2 min, exit code 137 (run r-1)",
        "  NODE    STATE     EXIT CODE",
        "  LOCAL1  Canceled  130",
        "  LOCAL2  Failed    1",
        "  first failure: rank 1 on LOCAL2, killed by SIGKILL (exit code 137)",
        "  metrics: accuracy=0.962, data_wait=2.4%, wall_time=2.8 s, world_size=2",
        "  logs: /share/hpcjob/run_ddp/logs/r-1",
    ]
