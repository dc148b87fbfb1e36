"""The run history (hpcjob.store.runs, `hpcjob runs`): an SQLite database that two hpcjob processes write at
once without losing a record, that says in one line when it is damaged, and that imports the runs.jsonl
of hpcjob 0.1 once."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcjob.cli import cli
from hpcjob.job.results import JobSummary, NodeResult, RootCause, State
from hpcjob.store.runs import (
    SCHEMA_VERSION,
    RunRecord,
    find_run,
    history,
    history_file,
    legacy_runs_file,
    record_end,
    record_state,
    save_run,
)

from .conftest import REPO


@pytest.fixture
def state_home() -> Path:
    """The test's own state folder (conftest's private_state), where runs.db is."""
    return history_file().parent.parent


def record(run_id: str, cluster: str | None = None, **more: object) -> RunRecord:
    backend = "rest" if cluster else "local"
    return RunRecord(run_id, run_id.split("-")[0], backend, "hpcjob/x", ("N1", "N2"), cluster=cluster, **more)  # type: ignore[arg-type]


def summary(run_id: str, state: State, exit_code: int, wall: float, **metrics: object) -> JobSummary:
    return JobSummary(
        name=run_id.split("-")[0],
        run_id=run_id,
        state=state,
        exit_code=exit_code,
        wall_time_s=wall,
        job_dir="/app/hpcjob/x",
        log_dir="/app/hpcjob/x/logs/" + run_id,
        nodes=[NodeResult("N1", State.FINISHED, 0), NodeResult("N2", state, exit_code)],
        root_cause=RootCause(time=1.0, rank=1, exit_code=exit_code, node="N2") if exit_code else None,
        metrics=dict(metrics) or None,
    )


def runs(*args: str) -> list[dict[str, object]]:
    done = CliRunner().invoke(cli, ["runs", "--json", *args])
    assert done.exit_code == 0, done.output
    result: list[dict[str, object]] = json.loads(done.output)
    return result


def test_a_run_s_history_from_its_first_record_to_its_end() -> None:
    save_run(record("a-1", "prod", state="creating"), command="hpcjob submit x", plan='{"run_id": "a-1"}',
             tags={"exp": "one"}, gpus_per_node=4)  # fmt: skip
    save_run(record("a-1", "prod", state="submitted", job_id="17"))  # later records keep what the first gave
    record_state("a-1", "Running", None)
    [entry] = history()
    assert (entry.record.state, entry.record.job_id, entry.state, entry.command) == (
        "submitted",
        "17",
        "Running",
        "hpcjob submit x",
    )
    assert entry.tags == {"exp": "one"} and entry.plan == {"run_id": "a-1"} and entry.wall_s is None
    record_end(summary("a-1", State.FAILED, 3, 1800.0, samples_per_sec=1234.5))
    record_state("a-1", "Running", None)  # a late poll does not undo the summary
    [entry] = history()
    assert (entry.state, entry.exit_code, entry.wall_s) == ("Failed", 3, 1800.0)
    assert entry.node_hours == 1.0 and entry.gpu_hours == 4.0 and entry.samples_per_sec == 1234.5
    assert entry.summary is not None and entry.summary.root_cause is not None
    assert find_run("17", "prod").run_id == "a-1"  # by job id too


def test_the_list_filters_and_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    save_run(record("old-1", "prod"), tags={"exp": "a"})
    record_end(summary("old-1", State.FINISHED, 0, 3600.0))
    with sqlite3.connect(history_file()) as db:  # started ten days ago
        db.execute("UPDATE runs SET started = ? WHERE run_id = 'old-1'", (time.time() - 10 * 86400,))
    save_run(record("new-1", "prod"), tags={"exp": "b"}, gpus_per_node=8)
    save_run(record("loc-1"), tags={"exp": "a"})
    record_end(summary("loc-1", State.FAILED, 1, 60.0))
    assert [r["run_id"] for r in runs()] == ["loc-1", "new-1", "old-1"]  # newest first
    assert [r["run_id"] for r in runs("--cluster", "prod")] == ["new-1", "old-1"]
    assert [r["run_id"] for r in runs("--tag", "exp=a")] == ["loc-1", "old-1"]
    assert [r["run_id"] for r in runs("--tag", "exp=a", "--state", "FAILED")] == ["loc-1"]
    assert [r["run_id"] for r in runs("--since", "7d")] == ["loc-1", "new-1"]
    assert [r["run_id"] for r in runs("--last", "1")] == ["loc-1"]
    table = CliRunner().invoke(cli, ["runs"]).output.splitlines()
    assert table[0].split() == [
        "RUN", "NAME", "WHERE", "NODES", "STATE", "START", "WALL", "NODE-H", "GPU-H", "COST", "SAMPLES/S",
        "WAIT", "DATA/S", "TAGS",
    ]  # fmt: skip
    loc = table[1].split()
    assert loc[:5] == ["loc-1", "loc", "local", "2", "Failed"]
    # GPU-H, COST (a local run has none, not $0.00), SAMPLES/S, WAIT, DATA/S (no data nodes)
    assert loc[-6:-1] == ["-", "-", "-", "-", "-"]
    assert runs("--last", "1")[0]["cost_usd"] is None
    assert "1 min 0 s" in table[1] and "0.03" in table[1] and table[1].endswith("exp=a")
    assert "2x8" in table[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "last week"], "--since 'last week' must be a date"),
        (["--tag", "no-value"], "--tag 'no-value' must be KEY=VALUE"),
        (["--tag", "k=\x07"], "--tag k: the value must be printable"),
    ],
)
def test_bad_filters_are_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from hpcjob.cli.app import main; main()", "runs", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.startswith("hpcjob: error: " + message), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_two_processes_writing_at_once_lose_no_record(state_home: Path) -> None:
    writer = textwrap.dedent(
        """
        import sys
        from hpcjob.store.runs import RunRecord, save_run
        who = sys.argv[1]
        for i in range(150):
            save_run(RunRecord(f"{who}-{i}", who, "local", "hpcjob/x", ("N1",)), tags={"who": who})
        """
    )
    env = {"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(state_home), "HOME": str(state_home)}
    started = [
        subprocess.Popen(
            [sys.executable, "-c", writer, who], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        for who in ("left", "right")
    ]
    for process in started:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    entries = history()
    assert len(entries) == 300 and len({e.record.run_id for e in entries}) == 300
    assert sum(e.tags == {"who": "left"} for e in entries) == 150


def test_a_damaged_database_is_one_line_with_the_way_out(state_home: Path) -> None:
    path = history_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"hpcjob: error: the run history {path} is damaged (file is not a database): move it aside (hpcjob "
        "starts a new one) and keep it for the runs it knew\n"
    )
    path.rename(path.with_suffix(".bad"))
    assert runs() == []


def test_a_history_locked_by_another_process_is_one_line_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process holds the history (a write that does not end): a command waits LOCK_WAIT_S, then
    says so in one line, exit 1; once let go of, every run is there and a new one is saved."""
    from hpcjob.store import runs as history_module

    save_run(record("a-1"))
    monkeypatch.setattr(history_module, "LOCK_WAIT_S", 0.5)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None);"
         " db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); sys.stdin.read()", str(history_file())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        for args in (["runs"], ["runs", "--last", "20"]):
            done = CliRunner().invoke(cli, args)
            assert done.exit_code == 1
            assert str(done.exception) == (
                f"the run history {history_file()} stayed locked by another hpcjob for 0.5 s: try again"
            )
    finally:
        holder.communicate("", timeout=30)
    save_run(record("a-2"))
    assert [e.record.run_id for e in history()] == ["a-2", "a-1"]


def test_a_database_of_a_newer_hpcjob_is_refused_in_one_line() -> None:
    save_run(record("a-1"))
    with sqlite3.connect(history_file()) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    done = CliRunner().invoke(cli, ["runs"])
    assert done.exit_code == 1 and "was written by a newer hpcjob" in str(done.exception)


def test_the_runs_jsonl_of_hpcjob_0_1_is_imported_once() -> None:
    legacy = legacy_runs_file()
    legacy.parent.mkdir(parents=True)
    train = {"run_id": "train-20261101-093000-ab12", "name": "train", "backend": "rest", "cluster": "prod",
             "job_folder": "hpcjob/train", "nodes": ["GPU1", "GPU2"]}  # fmt: skip
    lines = [
        {**train, "state": "creating"},
        "a line torn by hand {",
        {**train, "state": "submitted", "job_id": "41"},
        {"run_id": "mine", "name": "mine", "backend": "local", "job_folder": "hpcjob/mine",
         "nodes": ["LOCAL1"], "a key of a newer hpcjob": 1},
    ]  # fmt: skip
    legacy.write_text(
        "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
    )
    first = runs()
    assert [(r["run_id"], r["state"], r["job_id"]) for r in first] == [
        ("mine", None, None),
        ("train-20261101-093000-ab12", "submitted", "41"),  # its latest line
    ]
    assert time.localtime(float(str(first[1]["started"])))[:5] == (2026, 11, 1, 9, 30)  # from its run id
    assert [r["run_id"] for r in runs()] == ["mine", "train-20261101-093000-ab12"]
    assert not history_file().exists()  # reading makes no database
    save_run(record("z-1"))  # the first write makes it, with the import
    late = {"run_id": "late", "name": "late", "backend": "local", "job_folder": "x", "nodes": []}
    with legacy.open("a") as f:  # hpcjob 0.1 is gone: nothing writes there any more
        f.write(json.dumps(late) + "\n")
    assert [r["run_id"] for r in runs()] == ["z-1", "mine", "train-20261101-093000-ab12"]
    assert legacy.is_file()  # kept, for hpcjob 0.1 and for whoever wants it
    assert find_run("41", "prod").state == "submitted"


def test_lines_and_rows_of_the_wrong_shape_are_left_out_not_fatal() -> None:
    legacy = legacy_runs_file()
    legacy.parent.mkdir(parents=True)
    good = {"run_id": "ok-1", "name": "ok", "backend": "local", "job_folder": "x", "nodes": ["N1"]}
    bad = [
        {**good, "run_id": None},
        {**good, "name": None},
        {**good, "nodes": "N1"},
        {**good, "pid": "7"},
        [1],
    ]
    legacy.write_text("\n".join(json.dumps(line) for line in [*bad, good]) + "\n")
    save_run(record("new-1"))  # the import, with the database
    assert [r["run_id"] for r in runs()] == ["new-1", "ok-1"]
    assert history_file().stat().st_mode & 0o777 == 0o600  # the owner's alone
    # A summary written by a newer hpcjob (a field this one does not know) is still shown.
    ended = json.loads(summary("new-1", State.FINISHED, 0, 60.0).to_json())
    with sqlite3.connect(history_file()) as db:
        db.execute("UPDATE runs SET summary = ? WHERE run_id = 'new-1'", (json.dumps({**ended, "later": 1}),))
        db.execute("UPDATE runs SET plan = 'not json' WHERE run_id = 'ok-1'")
    shown = CliRunner().invoke(cli, ["runs", "show", "new-1"])
    assert shown.exit_code == 0 and "job new Finished in 1 min 0 s, exit code 0" in shown.output
    assert runs()[1]["plan"] is None


def test_timeline_lines_keep_only_fields_of_the_right_type() -> None:
    from hpcjob.store.logs import timeline_line

    assert timeline_line({"t": "noon"}) is None and timeline_line([1]) is None
    assert timeline_line(
        {"t": 5, "event": "step", "node": 3, "rank": "1", "step": 10, "loss": float("nan"), "epoch": True,
         "samples_per_sec": 12, "note": "x"}
    ) == {"t": 5.0, "event": "step", "step": 10, "samples_per_sec": 12.0}  # fmt: skip


def test_the_newest_few_of_a_long_history_are_read_alone_and_the_json_streams_whole() -> None:
    """`--last`, the state and the tags are the query's: the newest few of 600 runs (more than are looked
    up by run id) come with their own tags and attempts, as the whole listing gives them, and `runs --json`
    writes the same runs as one JSON array."""
    from hpcjob.store.runs import iter_history, record_attempt_end

    for index in range(600):
        run_id = f"long-{index:04d}"
        state = "failed" if index % 7 == 0 else "submitted"
        save_run(record(run_id, "prod", state=state), tags={"n": str(index)} if index % 2 else None)
    record_state("long-0598", "Running", None)
    record_attempt_end(record("long-0599", "prod"), None, "lost", "GPU2 was lost", retried=True)
    whole = history()
    assert len(whole) == 600 and [e.record.run_id for e in whole[:3]] == [
        "long-0599",
        "long-0598",
        "long-0597",
    ]
    newest = history(last=3)
    assert [(e.record.run_id, e.tags, len(e.attempts)) for e in newest] == [
        (e.record.run_id, e.tags, len(e.attempts)) for e in whole[:3]
    ]
    assert newest[0].attempts and newest[0].tags == {"n": "599"}
    failed = [
        e.record.run_id for e in whole if "failed" in (str(e.state).lower(), str(e.record.state).lower())
    ]
    assert [e.record.run_id for e in history(state="Failed")] == failed  # the record's step, any case
    assert [e.record.run_id for e in history(state="running")] == ["long-0598"]  # the job's state
    assert [e.record.run_id for e in iter_history(tags={"n": "5"}, last=5)] == ["long-0005"]
    streamed = runs()
    assert [r["run_id"] for r in streamed] == [e.record.run_id for e in whole]
    assert runs("--last", "2") == [json.loads(json.dumps(e.to_dict())) for e in whole[:2]]
