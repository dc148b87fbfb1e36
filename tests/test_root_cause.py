"""The root cause of a failed job: the first thing to end badly, by time, whatever records exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcjob.job.results import (
    CANCELED_EXIT_CODE,
    RootCause,
    State,
    TaskEnd,
    first_failure,
    job_exit_code,
    parse_exit_records,
)
from hpcjob.store.logs import EXIT_RECORDS, read_root_cause, reason_line
from hpcjob.store.share import LocalFolder


def rank(node: str, number: int, code: int, time: float, signal: str | None = None) -> RootCause:
    return RootCause(node=node, rank=number, exit_code=code, time=time, signal=signal)


def test_a_rank_killed_by_a_signal_comes_before_the_stop_it_caused() -> None:
    # LOCAL2's rank died of SIGKILL at 10.0; LOCAL1's rank was stopped by hpcjob's SIGINT at 11.0.
    records = parse_exit_records(["11.000000 0 130 LOCAL1 SIGINT", "10.000000 1 137 LOCAL2 SIGKILL"])
    cause = first_failure(records, [TaskEnd("LOCAL2", 1, 10.3), TaskEnd("LOCAL1", 130, 11.2)], 10.4)
    assert cause == rank("LOCAL2", 1, 137, 10.0, "SIGKILL")
    assert job_exit_code(State.FAILED, 1, cause) == 137


def test_a_node_whose_torchrun_failed_before_any_rank_is_the_cause() -> None:
    # LOCAL2's torchrun died (no rank record); then the job stopped LOCAL1, whose rank recorded 130.
    records = parse_exit_records(["12.5 0 130 LOCAL1 SIGINT"])
    cause = first_failure(records, [TaskEnd("LOCAL2", 1, 12.0), TaskEnd("LOCAL1", 130, 12.6)], 12.1)
    assert cause == RootCause(node="LOCAL2", exit_code=1, time=12.0)
    assert job_exit_code(State.FAILED, 1, cause) == 1


def test_what_ended_after_the_stop_counts_only_when_nothing_came_before() -> None:
    records = [rank("A", 0, 130, 20.0, "SIGINT")]
    assert first_failure(records, [], stopped_at=19.0) == records[0]
    assert first_failure([], [TaskEnd("A", 0, 5.0)]) is None  # a task that finished is no cause


def test_a_failed_job_never_reports_the_canceled_code() -> None:
    stopped = rank("A", 0, CANCELED_EXIT_CODE, 1.0, "SIGINT")
    assert job_exit_code(State.FAILED, CANCELED_EXIT_CODE, stopped) == 1
    assert job_exit_code(State.FAILED, 4, stopped) == 4
    assert job_exit_code(State.FAILED, None, None) == 1
    assert job_exit_code(State.CANCELED, 1, None) == CANCELED_EXIT_CODE
    assert job_exit_code(State.FINISHED, None, None) == 0


def test_records_of_the_older_four_field_form_and_torn_ones() -> None:
    records = parse_exit_records(["3.0 2 9 N1", "1.0 0 5 N0 SIGTERM", "2.0 1", "x y z w"])
    assert records == [rank("N1", 2, 9, 3.0), rank("N0", 0, 5, 1.0, "SIGTERM")]


TORCHRUN_ERR = """\
hpcjob: LOCAL1 hosts the rendezvous, at 127.0.0.1 (lo)
Traceback (most recent call last):
  File "train.py", line 3, in <module>
    raise ValueError("bad shape (3, 4)")
ValueError: bad shape (3, 4)
E1123 12:00:00 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
"""


PORT_IN_USE_ERR = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 152, in _create_tcp_store
    store = TCPStore(
            ^^^^^^^^^
torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: 29411, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 180, in _create_tcp_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.
"""  # noqa: E501


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (TORCHRUN_ERR, "ValueError: bad shape (3, 4)"),
        (
            "hpcjob: A hosts the rendezvous, at 1.2.3.4 (eth0)\n"
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the "
            "C10d store has failed.\n",
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the "
            "C10d store has failed.",
        ),
        ("bash: line 1: nosuchpython: command not found\n", "bash: line 1: nosuchpython: command not found"),
        ("", ""),
        # A rendezvous port in use, as torchrun 2.14.1 says it (run here against a bound port): the cause
        # of the chain, in plain words, not the wrapper's "See inner exception for details".
        (
            PORT_IN_USE_ERR,
            "port 29411 is in use on LOCAL1: another program holds it (give another --rdzv-port)",
        ),
    ],
)
def test_the_reason_is_the_line_of_stderr_that_says_why(tmp_path: Path, err: str, reason: str) -> None:
    (tmp_path / "LOCAL1.err").write_text(err)
    assert reason_line(LocalFolder(tmp_path), "", "LOCAL1") == reason


def test_the_share_alone_names_the_first_failure(tmp_path: Path) -> None:
    """The REST path reads the same files: rank records, and each task's `.exit` with its end time."""
    log = tmp_path / "logs" / "r1"
    (log / EXIT_RECORDS).mkdir(parents=True)
    (log / EXIT_RECORDS / "rank-0").write_text("50.0 0 130 GPU1 SIGINT\n")
    (log / "GPU2.exit").write_text("137 40.5\n")  # its torchrun was killed: no rank record
    (log / "GPU1.exit").write_text("130 50.2\n")
    (log / "gpu2.err").write_text("Killed\n")  # HPC Pack may spell the node in another case
    cause = read_root_cause(LocalFolder(tmp_path), "logs/r1")
    assert cause == RootCause(node="GPU2", exit_code=137, time=40.5, signal="SIGKILL", reason="Killed")
    assert cause.describe() == "the task on GPU2, killed by SIGKILL (exit code 137): Killed"


def test_python_missing_on_the_nodes_is_named_even_quietly(tmp_path: Path) -> None:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('never')\n")

    def run(*options: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--quiet", *options]
        where = ["--mount-point", str(tmp_path / "share"), "--python", "nosuchpython", str(script)]
        return subprocess.run([*command, *where], capture_output=True, text=True, timeout=60)

    result = run("--json", "-n", "2")
    assert result.returncode == 127, result.stderr
    cause = json.loads(result.stdout)["root_cause"]
    assert cause["rank"] is None and cause["exit_code"] == 127
    assert cause["reason"].endswith("nosuchpython: command not found")
    lines = run("-n", "1").stdout.splitlines()
    assert any(
        line.startswith("  first failure: the task on LOCAL1, exit code 127: ")
        and line.endswith("nosuchpython: command not found")
        for line in lines
    ), lines


def test_an_elastic_job_s_losses_read_from_the_timeline() -> None:
    from hpcjob.job.results import TaskEnd, elastic_events

    timeline = [
        {"t": 10.0, "event": "start", "node": "N3", "world_size": 6, "restart": 0, "first_epoch": 1},
        {"t": 20.0, "event": "epoch", "node": "N3", "epoch": 1},
        {"t": 25.0, "event": "step", "node": "N3", "epoch": 2, "step": 40},
        # The agents restart at their own counts; the world size says how many nodes went on.
        {"t": 31.0, "event": "start", "node": "N2", "world_size": 4, "restart": 2, "first_epoch": 2},
        {"t": 31.5, "event": "start", "node": "N1", "world_size": 4, "restart": 1, "first_epoch": 2},
    ]
    lost = [TaskEnd("n3", 137, 30.0), TaskEnd("N9", 1, 5.0)]
    assert elastic_events(lost, timeline, procs_per_node=2) == [  # in the order they were lost
        "N9 lost (exit code 1); continued on 2 node(s) from the epoch-1 checkpoint",
        "n3 lost at epoch 2, step 40 (exit code 137); continued on 2 node(s) from the epoch-1 checkpoint",
    ]
    assert elastic_events([TaskEnd("N3", 9, 35.0)], timeline, 2) == [
        "N3 lost at epoch 2, step 40 (exit code 9); the others went on"  # no restart seen after it
    ]
    # hpctorch's timeline: no epoch in its start lines; the restart's resume line says which save.
    hpctorch = [
        {"t": 10.0, "event": "start", "node": "N3", "world_size": 6, "restart": 0},
        {"t": 25.0, "event": "step", "node": "N3", "epoch": 2, "step": 40},
        {"t": 31.0, "event": "start", "node": "N2", "world_size": 4, "restart": 2},
        {"t": 31.2, "event": "resume", "node": "N1", "world_size": 4, "restart": 1, "step": 99},
        {"t": 32.0, "event": "resume", "node": "N2", "world_size": 4, "restart": 2, "step": 32, "epoch": 1},
    ]
    assert elastic_events([TaskEnd("N3", 137, 30.0)], hpctorch, 2) == [
        "N3 lost at epoch 2, step 40 (exit code 137); continued on 2 node(s) from the step-32 save (epoch 1)"
    ]
    (fresh,) = elastic_events([TaskEnd("N3", 137, 30.0)], hpctorch[:3], 2)
    assert fresh.endswith("; continued on 2 node(s) from the start (no checkpoint yet)")
