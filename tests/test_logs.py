"""`hpcjob logs`: per-node output from the share, prefixed by node, following until the job ends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcjob.job.spec import SpecError
from hpcjob.store.logs import RunLogs, Tail
from hpcjob.store.runs import RunRecord, find_run, save_run
from hpcjob.store.share import LocalFolder

LOG = "hpcjob/train/logs/r-1"


def hpcjob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def share(tmp_path: Path) -> Path:
    log = tmp_path / LOG
    log.mkdir(parents=True)
    (log / "NODE1.out").write_text("one\ntwo\n")
    (log / "NODE1.err").write_text("warn\n")
    (log / "NODE2.out").write_text("three\npartial")
    save_run(
        RunRecord(
            run_id="r-1",
            name="train",
            backend="manual",
            job_folder="hpcjob/train",
            nodes=("NODE1", "NODE2"),
            local_root=str(tmp_path),
        )
    )
    return tmp_path


def test_tail_shows_complete_lines_and_the_rest_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a\nb")
    tail = Tail(LocalFolder(tmp_path), "f", "> ")
    assert list(tail.read()) == ["> a"]
    with (tmp_path / "f").open("ab") as f:
        f.write("c\nd\u00e9\n".encode())
    assert list(tail.read()) == ["> bc", "> d\u00e9"]
    assert list(tail.read(final=True)) == []
    assert list(Tail(LocalFolder(tmp_path), "missing", "").read()) == []


def test_logs_prints_each_node_in_order(share: Path) -> None:
    result = hpcjob("logs", "r-1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[NODE1] one",
        "[NODE1] two",
        "[NODE1 err] warn",
        "[NODE2] three",
        "[NODE2] partial",
    ]
    only = hpcjob("logs", "r-1", "--node", "node2")
    assert only.stdout.splitlines() == ["[NODE2] three", "[NODE2] partial"]


def test_logs_without_a_record_needs_the_folder(share: Path) -> None:
    result = hpcjob("logs", "r-2")
    assert result.returncode == 2 and "no run 'r-2' recorded" in result.stderr
    direct = hpcjob("logs", "r-1", "--mount-point", str(share), "--job-folder", "hpcjob/train")
    assert direct.stdout.splitlines()[0] == "[NODE1] one"  # nodes found from the files
    bad = hpcjob("logs", "r-1", "--node", "NODE9")
    assert bad.returncode == 2 and "has no node 'NODE9'; its nodes: NODE1, NODE2" in bad.stderr


def test_follow_ends_when_every_task_has_ended_with_the_jobs_code(share: Path) -> None:
    log = share / LOG

    def finish() -> None:
        time.sleep(1.0)
        with (log / "NODE2.out").open("a") as f:
            f.write(" line\nlast\n")
        (log / "NODE2.exit").write_text("0\n")
        time.sleep(0.5)
        (log / "node1.exit").write_text("3\n")  # HPC Pack may spell a node in another case

    writer = threading.Thread(target=finish)
    writer.start()
    start = time.monotonic()
    result = hpcjob("logs", "r-1", "--follow", "--poll", "0.1")
    writer.join()
    assert result.returncode == 3
    assert 1.4 < time.monotonic() - start < 30
    assert result.stdout.splitlines()[-2:] == ["[NODE2] partial line", "[NODE2] last"]


def test_follow_gives_up_after_a_failure_and_silence(share: Path) -> None:
    (share / LOG / "NODE1.exit").write_text("4\n")  # NODE2 was killed: it writes no end mark
    result = hpcjob("logs", "r-1", "-f", "--poll", "0.1", "--idle-timeout", "0.5")
    assert result.returncode == 4


def test_run_logs_ended_reads_the_local_summary(share: Path) -> None:
    logs = RunLogs(LocalFolder(share), LOG, ("NODE1", "NODE2"))
    assert logs.ended() is None
    (share / LOG / "summary.json").write_text('{"exit_code": 130}')
    logs.look()  # a follower's next poll
    assert logs.ended() == 130


def test_find_run_takes_the_latest_record(share: Path) -> None:
    save_run(RunRecord(run_id="r-1", name="again", backend="manual", job_folder="x", nodes=("A",)))
    assert find_run("r-1").name == "again"
    with pytest.raises(SpecError):
        find_run("nope")


def test_logs_of_a_failed_run_start_with_its_first_failure(share: Path) -> None:
    """Every line stays, and the error to look for comes first, before the nodes (issue 39)."""
    log = share / LOG
    (log / ".hpcjob-exits").mkdir()
    (log / ".hpcjob-exits" / "rank-1").write_text("10.5 1 3 NODE2\n")
    (log / "NODE2.err").write_text("Traceback (most recent call last):\nValueError: bad shape\n")
    result = hpcjob("logs", "r-1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "first failure: rank 1 on NODE2, exit code 3: ValueError: bad shape"
    assert lines[1:] == [
        "[NODE1] one", "[NODE1] two", "[NODE1 err] warn", "[NODE2] three", "[NODE2] partial",
        "[NODE2 err] Traceback (most recent call last):", "[NODE2 err] ValueError: bad shape",
    ]  # fmt: skip


def test_a_poll_reads_what_changed_not_every_node_s_every_file(share: Path) -> None:
    """Issue 42: a poll of a 300-node run (one look, its end, its lines, its tasks' exit codes) lists the
    log folder once and reads the outputs that grew and the exit records not yet read; each output is
    read at least every UNCHANGED_LOOKS looks anyway (a listing may show a file being written at an
    older size). Before, a poll read every node's .out, .err and .exit."""
    from hpcjob.store.logs import UNCHANGED_LOOKS
    from hpcjob.store.share import counting_share_calls

    nodes = [f"GPU{index:03d}" for index in range(300)]
    log = share / LOG
    for node in nodes:
        (log / f"{node}.out").write_text("epoch 1\n")
        (log / f"{node}.err").write_text("")
    logs = RunLogs(LocalFolder(share), LOG, nodes)

    def poll() -> tuple[list[str], dict[str, int]]:
        with counting_share_calls() as counts:
            logs.look()
            assert logs.ended() is None
            said = [line for _, _, line in logs.lines()]
            logs.exit_codes()
        return said, dict(counts.calls)

    anyway = 2 * 300 // UNCHANGED_LOOKS  # the outputs whose turn it is to be read anyway, a look
    said, calls = poll()
    assert len(said) == 300 and calls == {"scan": 1, "read_capped": 300 + anyway}  # the .out files that grew
    with open(log / "GPU007.out", "a") as out:
        out.write("epoch 2\n")
    (log / "GPU042.exit").write_text("1 1795956528.5\n")
    said, calls = poll()
    assert said == ["epoch 2"]
    # One listing; GPU007's output; GPU042's exit record; the outputs whose turn it is.
    assert calls == {"scan": 1, "read_capped": 1 + 1 + anyway}, calls
    assert logs.exit_codes() == {"GPU042": 1}
    said, calls = poll()
    assert said == [] and calls == {"scan": 1, "read_capped": anyway}  # the exit record is not read again
