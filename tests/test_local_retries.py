"""Issue 33, through the local backend: `run --local --retries N`. A local node whose whole task is
SIGKILLed from outside is lost, as a machine is; the next attempt runs on a fresh local node from the
run's checkpoint, and an interrupt during a later attempt ends the run with nothing left running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcjob.backends.local import local_data_node_names, local_node_names
from hpcjob.backends.local.procs import MARKER_VAR, marked_processes
from hpcjob.job.spec import JobSpec

from .test_elastic import SLOW_EPOCHS, TRAIN, kill_node_when_training


def run_local(share: Path, run_id: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--json", "--quiet", "-n", "2",
         "--mount-point", str(share), "--run-id", run_id, *options,
         str(TRAIN), *SLOW_EPOCHS, "--metrics-every", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def shown(run_id: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", run_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    entry: dict[str, object] = json.loads(done.stdout)
    return entry


def test_later_attempts_take_fresh_local_nodes_in_place_of_lost_ones() -> None:
    spec = JobSpec(script="train.py", nodes=2, exclude_nodes=("local1",))
    assert local_node_names(spec) == ("LOCAL2", "LOCAL3")
    assert local_node_names(JobSpec(script="train.py", nodes=3)) == ("LOCAL1", "LOCAL2", "LOCAL3")
    # A lost data node too: the next attempt's data node is a fresh one (it reused DATA1).
    lost_data = JobSpec(script="train.py", nodes=2, data_nodes=2, exclude_nodes=("LOCAL2", "data1"))
    assert local_data_node_names(lost_data) == ("DATA2", "DATA3")
    assert local_node_names(lost_data) == ("LOCAL1", "LOCAL3")


@pytest.mark.slow
def test_a_lost_local_node_is_replaced_and_the_run_goes_on_from_its_checkpoint(tmp_path: Path) -> None:
    run_id = "local-retry-1"
    job = run_local(tmp_path, run_id, "--retries", "1")
    try:
        kill_node_when_training(tmp_path, run_id, 2, epoch=2)
        out, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Finished"
    assert [n["node"] for n in summary["nodes"]] == ["LOCAL1", "LOCAL3"]  # the lost node left out
    assert summary["events"][0].startswith("attempt 1 (job local-retry-1 on LOCAL1, LOCAL2): LOCAL2 was lost")
    metrics = summary["metrics"]
    assert metrics["resumed_from_epoch"] == 1 and metrics["epochs_completed"] == 3  # epoch 1 not redone
    assert "attempt 2 of 2: job local-retry-1.2 on LOCAL1, LOCAL3" in err
    logs = tmp_path / "hpcjob" / "run_ddp" / "logs" / run_id
    assert (logs / "LOCAL2.out").is_file() and (logs / "2" / "LOCAL3.out").is_file()  # each its own
    attempts = shown(run_id)["attempts"]
    assert isinstance(attempts, list)
    assert [(a["attempt"], a["cause"], a["retried"]) for a in attempts] == [
        (1, "node lost", True),
        (2, "finished", False),
    ]


@pytest.mark.slow
def test_an_interrupt_in_attempt_2_ends_the_run_and_leaves_nothing_running(tmp_path: Path) -> None:
    run_id = "local-retry-2"
    job = run_local(tmp_path, run_id, "--retries", "2", "--retry-on", "any")
    try:
        kill_node_when_training(tmp_path, run_id, 2, epoch=1)
        second = tmp_path / "hpcjob" / "run_ddp" / "logs" / run_id / "2" / "metrics" / "LOCAL1-0.jsonl"
        deadline = time.monotonic() + 120
        while not (second.is_file() and '"step"' in second.read_text()):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)  # as Ctrl-C: the run ends, even with --retry-on any
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    summary = json.loads(out)
    assert summary["state"] == "Canceled", err[-3000:]
    assert "attempt 3" not in err
    # The summary after the interrupt has every attempt: attempt 1's line, and both attempts' figures.
    assert summary["events"][0].startswith(f"attempt 1 (job {run_id} on LOCAL1, LOCAL2): LOCAL2 was lost")
    assert [a["attempt"] for a in summary["run_attempts"]] == [1, 2]
    assert summary["wall_time_s"] == pytest.approx(
        sum(a["wall_s"] for a in summary["run_attempts"]), abs=0.01
    )
    assert marked_processes(f"{MARKER_VAR}={run_id}.2/".encode()) == set()
    attempts = shown(run_id)["attempts"]
    assert isinstance(attempts, list)
    assert [(a["attempt"], a["cause"], a["retried"]) for a in attempts] == [
        (1, "node lost", True),
        (2, "canceled", False),
    ]


@pytest.mark.slow
def test_a_local_run_of_the_python_api_is_retried_by_whoever_follows_it() -> None:
    """hpcjob.submit(retries=1) with no cluster, not waited for: its node lost, then Run.wait() (as
    `hpcjob wait`) takes the run up from the history and finishes it in attempt 2, in the same folder."""
    import hpcjob

    args = [*SLOW_EPOCHS, "--metrics-every", "0.2"]
    run = hpcjob.submit(TRAIN, args, nodes=2, run_id="local-retry-api", retries=1)
    try:
        assert run.record.local_root is not None
        kill_node_when_training(Path(run.record.local_root), run.run_id, 2, epoch=2)
        summary = run.wait()
    finally:
        run.cancel(force=True)  # nothing left behind whatever failed
    assert summary.state.value == "Finished", summary.events
    assert [n.node for n in summary.nodes] == ["LOCAL1", "LOCAL3"]
    assert "LOCAL2 was lost" in summary.events[0]
    assert summary.metrics["resumed_from_epoch"] == 1
    assert run.record.attempt == 2 and Path(summary.job_dir).parent == Path(run.record.local_root) / "hpcjob"


def test_each_attempt_s_progress_is_followed_from_its_own_log_folder(tmp_path: Path) -> None:
    """A later attempt of a local run shows its live output like the first: each attempt's progress
    (hpcjob.log) is read from its own log folder, not from the first attempt's again."""
    from hpcjob.backends.local import SUPERVISOR_LOG, LocalBackend
    from hpcjob.job.results import JobSummary, State
    from hpcjob.store.logs import SUMMARY_FILE
    from hpcjob.store.runs import RunRecord

    backend = LocalBackend()
    said: list[str] = []
    for attempt in (1, 2):
        record = RunRecord(
            "r-1", "train", "local", "hpcjob/train", ("LOCAL1",), local_root=str(tmp_path), attempt=attempt
        )
        log_dir = tmp_path / record.log_folder
        log_dir.mkdir(parents=True)
        (log_dir / SUPERVISOR_LOG).write_text(f"[LOCAL1] attempt {attempt} trains\n")
        ended = JobSummary("train", "r-1", State.FINISHED, 0, 1.0, str(tmp_path), str(log_dir))
        (log_dir / SUMMARY_FILE).write_text(ended.to_json())
        backend.wait(record, said.append)
    assert said == ["[LOCAL1] attempt 1 trains", "[LOCAL1] attempt 2 trains"]
