"""`hpcjob run --local` and signals: no process outlives its job, and the right node is blamed.

Real torchrun processes (a stand-in Python where hpcjob's side alone is at stake); seconds each, hence `slow`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import stand_in_python
from .test_local_e2e import hpcjob_run, leftover_processes

pytestmark = pytest.mark.slow

# Each rank says it is up, then waits: the job runs until it is stopped.
WAITING = """
import os, sys, time
open(os.path.join(sys.argv[1], "up-" + os.environ["RANK"]), "w").close()
time.sleep(600)
"""


# The same for a stand-in of the nodes' Python (no torchrun): each node says it is up, then waits.
WAITING_STAND_IN = 'for marks; do :; done; touch "$marks/up-$HPCJOB_NODE"; exec sleep 600'


def start(
    tmp_path: Path, run_id: str, *, ignore_sigint: bool = False, real: bool = True
) -> tuple[subprocess.Popen[str], Path]:
    """`run --local` of two nodes that wait until stopped; `real`: torchrun and its ranks, else a stand-in
    Python on each node."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "wait.py").write_text(WAITING)
    marks = tmp_path / "marks"
    marks.mkdir()
    python = [] if real else ["--python", str(stand_in_python(tmp_path, WAITING_STAND_IN))]
    options = [
        "-n",
        "2",
        "--grace-period",
        "10",
        *python,
    ]  # 3 s was not enough for torchrun on a loaded CI machine
    process = subprocess.Popen(
        [*hpcjob_run(tmp_path / "share", run_id, *options, str(code / "wait.py")), str(marks)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a shell script starts a background job: SIGINT ignored, inherited by what it runs.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    if len(list(marks.iterdir())) < 2:
        process.send_signal(signal.SIGTERM)
        pytest.fail(f"the ranks did not start: {process.communicate(timeout=60)}")
    return process, tmp_path / "share" / "hpcjob" / "wait" / "logs" / run_id


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> Iterator[str]:
    """A run id of its own for each test; whatever a failed test left running is killed afterwards."""
    run_id = f"sig-{secrets.token_hex(4)}"
    yield run_id
    for pid in leftover_processes(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def no_leftovers(run_id: str, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (found := leftover_processes(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.mark.parametrize(
    ("sig", "ignore_sigint", "real"),
    [(signal.SIGTERM, False, True), (signal.SIGHUP, False, False), (signal.SIGINT, True, False)],
    ids=["SIGTERM", "SIGHUP (terminal closed)", "SIGINT with SIGINT ignored by the starter"],
)
def test_a_signal_to_hpcjob_cancels_the_job(
    tmp_path: Path, run_id: str, sig: signal.Signals, ignore_sigint: bool, real: bool
) -> None:
    """Each signal cancels the job as Ctrl-C does; torchrun's own stop on its SIGINT is seen once (the
    others with a stand-in Python, which an inherited ignored SIGINT would leave running to the SIGKILL)."""
    process, log_dir = start(tmp_path, run_id, ignore_sigint=ignore_sigint, real=real)
    process.send_signal(sig)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Canceled" and summary["root_cause"] is None
    # The tasks stopped on SIGINT within the grace period, not by the SIGKILL after it.
    assert {(n["state"], n["exit_code"]) for n in summary["nodes"]} == {("Canceled", 130)}, err[-3000:]
    assert json.loads((log_dir / "summary.json").read_text())["state"] == "Canceled"
    assert no_leftovers(run_id, within=5) == []


def test_sigkill_of_hpcjob_leaves_no_process(tmp_path: Path, run_id: str) -> None:
    """The job's own process sees its starter gone (the pipe between them closes) and cancels the job as
    a signal would: the nodes stopped, the summary written."""
    process, log_dir = start(tmp_path, run_id)
    assert len(leftover_processes(run_id)) >= 6  # per node: bash, torchrun, worker shim, rank
    process.kill()  # as the OOM killer does: no handler runs
    process.communicate(timeout=30)
    assert no_leftovers(run_id, within=10) == []
    assert json.loads((log_dir / "summary.json").read_text())["state"] == "Canceled"


def test_a_rank_killed_by_a_signal_is_blamed_not_the_node_stopped_after_it(
    tmp_path: Path, run_id: str
) -> None:
    process, _ = start(tmp_path, run_id)

    def cmdline(pid: int) -> bytes:
        return Path(f"/proc/{pid}/cmdline").read_bytes()

    # The worker shim and the rank it forked (same command line); torchrun names worker.py too.
    workers = [
        pid
        for pid in leftover_processes(run_id)
        if b"worker.py" in cmdline(pid) and b"torch.distributed.run" not in cmdline(pid)
    ]
    victims = []
    for pid in workers:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if b"HPCJOB_NODE=LOCAL2\0" in environ and parent in workers:
            victims.append(pid)  # LOCAL2's rank itself, below its shim
    assert len(victims) == 1, workers
    # The rendezvous, not the node order, gives the ranks: LOCAL2's may be 0 or 1.
    environ = Path(f"/proc/{victims[0]}/environ").read_bytes().split(b"\0")
    rank = int(next(item for item in environ if item.startswith(b"RANK="))[5:])
    time.sleep(0.5)
    os.kill(victims[0], signal.SIGKILL)
    out, err = process.communicate(timeout=60)
    summary = json.loads(out)
    assert summary["state"] == "Failed", err[-3000:]
    cause = summary["root_cause"]
    assert (cause["node"], cause["rank"], cause["signal"], cause["exit_code"]) == (
        "LOCAL2",
        rank,
        "SIGKILL",
        137,
    )
    assert process.returncode == 137 and summary["exit_code"] == 137
    assert no_leftovers(run_id, within=5) == []


def test_torchrun_failing_before_any_worker_has_a_root_cause(tmp_path: Path, run_id: str) -> None:
    """The rendezvous port is taken: torchrun fails with RendezvousConnectionError, no rank ever runs."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('never')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *hpcjob_run(tmp_path / "share", run_id, "-n", "2", "--quiet"),
                "--rdzv-port",
                str(port),
                "--rdzv-timeout",
                "10",
                "--grace-period",
                "2",
                str(code / "train.py"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode not in (0, 130), result.stderr[-3000:]
    summary = json.loads(result.stdout)
    cause = summary["root_cause"]
    assert summary["state"] == "Failed" and cause is not None and cause["rank"] is None
    # The cause of torchrun's "See inner exception for details", in plain words (issue 39).
    assert cause["reason"].startswith(f"port {port} is in use on LOCAL1"), cause
    assert no_leftovers(run_id, within=5) == []
