"""run_ddp.py's start-up line: when the first step was done, in a person's words (seconds since the task
started, local time), and exactly, for programs, in the rank's timeline."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import run_ddp

SMALL_RUN = [
    *("--train-samples", "256", "--test-samples", "64", "--batch-size", "32", "--epochs", "1"),
    *("--max-steps-per-epoch", "2", "--no-resume"),
]
# "first step done 12.3 s after start (14:02:11)"
FIRST_STEP = re.compile(r"^first step done (\d+\.\d) s after start \((\d\d):(\d\d):(\d\d)\)$", re.M)


def test_the_first_step_is_said_from_the_tasks_start_and_kept_exactly_in_the_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    task_start = time.time() - 30.0  # as node.sh says: the task started 30 s ago
    monkeypatch.setenv(run_ddp.TASK_START_VAR, f"{task_start:.6f}")
    before = time.time()
    flags = [*SMALL_RUN, "--checkpoint-dir", str(tmp_path), "--metrics-dir", str(tmp_path / "metrics")]
    assert run_ddp.main(flags) == 0
    after = time.time()
    out = capsys.readouterr().out
    assert "first step done at" not in out  # no raw Unix time for people
    (said,) = FIRST_STEP.findall(out)
    seconds, clock = float(said[0]), ":".join(said[1:])
    assert before - task_start - 0.1 <= seconds <= after - task_start + 0.1
    (timeline,) = (tmp_path / "metrics").glob("*.jsonl")
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    (first,) = [event for event in events if event["event"] == "first_step"]
    assert before <= first["t"] <= after and first["rank"] == 0
    assert first["after_start_s"] == pytest.approx(first["t"] - task_start, abs=0.002)
    assert abs(first["after_start_s"] - seconds) <= 0.051  # the same moment, said to a tenth
    # The local time of that same moment (the timeline's is rounded to the millisecond).
    assert clock in {time.strftime("%H:%M:%S", time.localtime(first["t"] + d)) for d in (-0.001, 0.0)}


@pytest.mark.parametrize("value", [None, "not a time"])
def test_without_hpcjob_the_first_step_is_said_from_the_process_start(
    value: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if value is None:
        monkeypatch.delenv(run_ddp.TASK_START_VAR, raising=False)
    else:
        monkeypatch.setenv(run_ddp.TASK_START_VAR, value)
    started = time.perf_counter()
    assert run_ddp.main([*SMALL_RUN, "--checkpoint-dir", str(tmp_path)]) == 0
    took = time.perf_counter() - started
    (said,) = FIRST_STEP.findall(capsys.readouterr().out)
    assert 0.0 <= float(said[0]) <= took + 0.1
