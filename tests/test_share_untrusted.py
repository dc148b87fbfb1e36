"""Files on the share are untrusted input (issue 31, item 4): whoever can write the run's log folder can
put anything there, and the follower reads it. Each file is read a bounded number of bytes (a tail from
its end), only where it is a regular file, and one that cannot be read or taken is skipped alone: the
hang watch goes on with the other ranks' beats.

What would block or eat memory on a reader that trusts the share (a FIFO, a link to /dev/zero, a 1.5 GB
stderr) is read in a child Python of its own, with a memory cap and a time limit: a reader that trusts
them fails the test there instead of taking the test run down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcjob.job.hangs import Beat
from hpcjob.job.plan import make_plan
from hpcjob.job.results import untrusted_json
from hpcjob.runner import watch
from hpcjob.runner.watch import HangFound, hang_watch
from hpcjob.store.logs import BEATS_FOLDER, EXIT_RECORDS, TIMELINE_FOLDER, RunLogs, read_beats
from hpcjob.store.share import LocalFolder

from .conftest import REPO, RUN_ID, cluster_spec
from .test_hangs import ALL_REDUCE, TIMEOUT, beats
from .test_logs import LOG
from .testbed.prerequisites import require_testbed
from .testbed.smb import SmbServer

# A stderr bigger than any memory a reader should spend on it, made sparse (no disk used).
HUGE = "1500M"
# What a reader in the child may take: the child's own Python is some 50 MB; one that reads the huge
# file, or /dev/zero, whole hits the cap (a MemoryError) long before it could hurt this machine.
CHILD_MEMORY = 512 << 20
CHILD_TIMEOUT_S = 30
# Deeper than Python's stack: json's parser raises RecursionError.
DEEP = '{"t": 1, "rank": 2, "node": "N2", "collectives": {"0": ' + "[" * 100_000 + "]" * 100_000 + "}}"
HOSTILE_BEATS = {
    "infinity": '{"t": 1, "rank": 2, "node": "N2", "collectives": {"0": [Infinity, "x", 0, "s", true]}}',
    "deeply nested": DEEP,
}
# Beats put among the ranks' (file name, text): each alone would have the watch blame the wrong rank, or
# none. The last is a rank the 3-rank job does not have, waiting in a collective none of its ranks began.
PLANTED = {
    **{name: ("rank-2.json", text) for name, text in HOSTILE_BEATS.items()},
    "no such rank": ("rank-9.json", '{"t": 1, "rank": 9, "collectives": {"0": [7, "x", 0, "s", true]}}'),
}


def beat_json(beat: Beat) -> str:
    """A beat as worker.py writes it (groups as [seq, name, began, state, in flight])."""
    groups = {g: [c.seq, c.name, 0.0, "started", c.in_flight] for g, c in beat.collectives.items()}
    return json.dumps({"t": beat.t, "rank": beat.rank, "node": beat.node, "pid": 1, "collectives": groups})


def write_beats(folder: Path, written: list[Beat]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for beat in written:
        (folder / f"rank-{beat.rank}.json").write_text(beat_json(beat))


@pytest.mark.parametrize(("name", "text"), PLANTED.values(), ids=PLANTED.keys())
def test_a_hostile_beat_is_skipped_and_the_watch_still_names_the_rank_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str
) -> None:
    """Rank 2's beat says Infinity, or is nested deeper than Python's stack, or a rank 9 beats in a
    3-rank job; ranks 0 and 1 beat as worker.py does, rank 1 behind the collective rank 0 waits in. The
    job's own watch (what `submit --wait` looks at) names rank 1 once the bound has passed: one bad file
    does not switch it off."""
    beats_dir = tmp_path / LOG / BEATS_FOLDER
    beats_dir.mkdir(parents=True)
    (beats_dir / name).write_text(text)
    spec = cluster_spec(1, gpus_per_node=3, hang_timeout_s=TIMEOUT)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert plan.world_size == 3
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(watch, "time", SimpleNamespace(monotonic=lambda: clock.now))
    looking = hang_watch(plan, LocalFolder(tmp_path), LOG)
    assert looking is not None
    with pytest.raises(HangFound) as found:
        for now in range(0, 4 * int(TIMEOUT), 2):  # one look a beat (2 s), the ranks beating
            clock.now = float(now)
            write_beats(beats_dir, beats(now, {0: (5, True), 1: (4, False)}))
            looking.look()
    hang = found.value.hang
    assert (hang.rank, hang.node) == (1, "N1")
    assert hang.reason.startswith(f"hung: never entered collective #5 {ALL_REDUCE}, in which rank 0 waited")
    assert clock.now == TIMEOUT  # found at the bound, not later


def test_the_watch_reads_one_beat_while_rank_0_moves_on_and_every_rank_s_once_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 ranks (8 nodes of 8): while the collectives move on, a look reads rank 0's beat alone (issue 42:
    a 1,000-node job's 8,000 files each beat otherwise); once rank 0 waits, every rank's, and the rank that
    stopped beating meanwhile is named, a beat later than if every beat had been read all along."""
    from hpcjob.store.share import counting_share_calls

    beats_dir = tmp_path / LOG / BEATS_FOLDER
    spec = cluster_spec(8, gpus_per_node=8, hang_timeout_s=TIMEOUT)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(watch, "time", SimpleNamespace(monotonic=lambda: clock.now))
    looking = hang_watch(plan, LocalFolder(tmp_path), LOG)
    assert looking is not None
    ranks = range(plan.world_size)
    reads = []
    with counting_share_calls() as calls, pytest.raises(HangFound) as found:
        for now in range(0, 100, 2):  # a look a beat; at 40 rank 9 stops, the others wait in #40
            clock.now = float(now)
            stopped = now >= 40
            written = beats(
                now, {r: (40, True) if stopped else (now, False) for r in ranks if not (stopped and r == 9)}
            )
            if now != 10:  # at 10, a look between two beats: nothing new, and rank 0 beat 2 s ago
                write_beats(beats_dir, written)
            calls.reset()
            looking.look()
            reads.append(sum(calls.calls.values()))
    assert reads[:20] == [1 + 64] + [1] * 19  # every rank's at first, then rank 0's alone while it moved on
    assert reads[21:] == [1 + 1 + 64] * len(reads[21:])  # then rank 0's, the listing, every rank's
    hang = found.value.hang
    assert (hang.rank, hang.node) == (9, "N9")
    assert hang.reason.startswith("hung: stopped beating (its last beat: collective #38")
    # The others' move into #40 is seen at the first look that reads them (42): found a bound after it,
    # one beat later than reading every beat would have.
    assert clock.now == 42 + TIMEOUT


def test_json_from_the_share_is_plain_json_or_a_value_error() -> None:
    assert untrusted_json(b'{"t": 1.5, "a": [1, "x", null]}') == {"t": 1.5, "a": [1, "x", None]}
    for text in ("NaN", "[Infinity]", '{"t": -Infinity}', "1e999", "[" * 100_000, DEEP, b"\xff", "1" * 5000):
        with pytest.raises(ValueError):
            untrusted_json(text)


def test_json_from_the_share_may_read_non_finite_figures_as_null_where_asked() -> None:
    text = '{"t": 2.5, "loss": NaN, "peak": Infinity, "low": -1e999, "deep": [[1]]}'
    read = {"t": 2.5, "loss": None, "peak": None, "low": None, "deep": [[1]]}
    assert untrusted_json(text, null_for_non_finite=True) == read
    with pytest.raises(ValueError):
        untrusted_json(DEEP, null_for_non_finite=True)


def test_a_diverged_step_stays_in_the_timeline_without_its_nan(tmp_path: Path) -> None:
    """training/timeline.py writes a NaN loss as Python's json does: the step is kept, the NaN dropped."""
    (tmp_path / TIMELINE_FOLDER).mkdir()
    lines = (
        '{"t": 1.0, "event": "step", "step": 1, "loss": 0.5}',
        '{"t": 2.0, "event": "step", "step": 2, "loss": NaN}',
        DEEP.replace('"t": 1', '"t": 3'),
    )
    (tmp_path / TIMELINE_FOLDER / "N-0.jsonl").write_text("\n".join(lines) + "\n")
    timeline = RunLogs(LocalFolder(tmp_path), "", []).timeline()
    assert [(t["step"], t.get("loss")) for t in timeline] == [(1, 0.5), (2, None)]


def test_a_beat_never_speaks_for_another_rank_nor_with_a_time_that_is_not_finite(tmp_path: Path) -> None:
    beats_dir = tmp_path / BEATS_FOLDER
    write_beats(beats_dir, beats(3.0, {0: (1, True), 1: (1, True)}))
    (beats_dir / "rank-2.json").write_text(beat_json(beats(3.0, {0: (9, True)})[0]))  # rank 0's, as 2
    (beats_dir / "rank-3.json").write_text('{"t": "NaN", "rank": 3, "collectives": {}}')
    assert sorted(b.rank for b in read_beats(LocalFolder(tmp_path), "")) == [0, 1]


# The child: `folder` is the share (a local folder, or //HOST/SHARE/folder over SMB with the server and
# its login in the environment); it prints what EXPRESSION gave, how long it took, and how much its
# memory grew meanwhile.
CHILD = """
import dataclasses, json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
from pathlib import Path
from hpcjob.store.logs import RunLogs, read_beats, read_root_cause, read_stacks, reason_line
from hpcjob.store.share import LocalFolder

where = sys.argv[1]
if where.startswith("//"):
    from hpcjob.store.share import SmbFolder
    from hpcjob.job.spec import parse_share
    folder = SmbFolder(parse_share(where), os.environ["SMB_USER"], os.environ["SMB_PASSWORD"],
                       server=os.environ["SMB_SERVER"], port=int(os.environ["SMB_PORT"]))
else:
    folder = LocalFolder(Path(where))
log = sys.argv[2]
logs = RunLogs(folder, log, ["NODE0", "NODE1"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
said = {expression}
seconds = time.monotonic() - start
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({{"said": said, "seconds": seconds, "grew_mib": grew}}, default=str))
"""


def in_a_child(where: str, expression: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """What `expression` gives in a child Python reading the share at `where` (see CHILD)."""
    code = CHILD.format(memory=CHILD_MEMORY, expression=expression)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, where, LOG],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the share blocked for {CHILD_TIMEOUT_S} s: {expression}")
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def good_files(log: Path) -> None:
    """Node 0's files as a failed run leaves them, rank 0's beat and timeline: all readable."""
    write_beats(log / BEATS_FOLDER, beats(5.0, {0: (3, True)}))
    (log / "NODE0.out").write_text('hello\nHPCJOB_METRICS {"epochs_completed": 2}\n')
    (log / "NODE0.err").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    (log / "NODE0.exit").write_text("1 100.5\n")
    (log / EXIT_RECORDS).mkdir()
    (log / EXIT_RECORDS / "rank-0").write_text("100.0 0 1 NODE0 -\n")
    (log / TIMELINE_FOLDER).mkdir()
    (log / TIMELINE_FOLDER / "rank-0.jsonl").write_text('{"t": 1.0, "event": "step", "step": 1}\n')


# Node 1's files and rank 1's, where the hostile ones go; each would be read by one reader or another.
HOSTILE_NAMES = (
    f"{BEATS_FOLDER}/rank-1.json",
    f"{BEATS_FOLDER}/stacks-rank-1.txt",
    "NODE1.out",
    "NODE1.err",
    "NODE1.exit",
    "summary.json",
    f"{EXIT_RECORDS}/rank-1",
    f"{TIMELINE_FOLDER}/rank-1.jsonl",
)
# Every reader of the follower over the folder, and what each must say: node 0's and rank 0's, alone.
EVERY_READER = """{
    "beats": [b.rank for b in read_beats(folder, log)],
    "stacks": read_stacks(folder, log, 1),
    "ended": logs.ended(),
    "lines": list(logs.lines(final=True)),
    "timeline": [t["step"] for t in logs.timeline()],
    "gpu_use": logs.gpu_use(),
    "cause": dataclasses.asdict(read_root_cause(folder, log)),
    "reason of node 1": reason_line(folder, log, "NODE1"),
}"""
WHAT_NODE_0_SAID = {
    "beats": [0],
    "stacks": None,
    "ended": None,  # node 1 has not ended: its `.exit` is not read
    "lines": [
        ["NODE0", "stdout", "hello"],
        ["NODE0", "stdout", 'HPCJOB_METRICS {"epochs_completed": 2}'],
        ["NODE0", "stderr", "Traceback (most recent call last):"],
        ["NODE0", "stderr", "RuntimeError: boom"],
    ],
    "timeline": [1],
    "gpu_use": [],
    "cause": {
        "node": "NODE0",
        "exit_code": 1,
        "time": 100.0,
        "rank": 0,
        "signal": None,
        "reason": "RuntimeError: boom",
    },
    "reason of node 1": "",
}


def test_fifos_in_the_log_folder_are_skipped_without_blocking(tmp_path: Path) -> None:
    """FIFOs with no writer (a reader that opens one waits for ever; the child is killed at its limit)."""
    log = tmp_path / LOG
    log.mkdir(parents=True)
    good_files(log)
    for name in HOSTILE_NAMES:
        os.mkfifo(log / name)
    said = in_a_child(str(tmp_path), EVERY_READER)
    assert said["said"] == WHAT_NODE_0_SAID


def test_links_to_dev_zero_are_not_followed(tmp_path: Path) -> None:
    log = tmp_path / LOG
    log.mkdir(parents=True)
    good_files(log)
    for name in HOSTILE_NAMES:
        (log / name).symlink_to("/dev/zero")
    said = in_a_child(str(tmp_path), EVERY_READER)
    assert said["said"] == WHAT_NODE_0_SAID
    assert float(str(said["grew_mib"])) < 64


def huge_output(log: Path) -> None:
    """A sparse 1.5 GB stderr and stdout whose last lines say why the node failed and how it used its
    GPUs (the training program's metrics line)."""
    log.mkdir(parents=True, exist_ok=True)
    for name, last in (("NODE0.err", "RuntimeError: CUDA out of memory"), ("NODE0.out", METRICS)):
        subprocess.run(["truncate", "-s", HUGE, str(log / name)], check=True)
        with (log / name).open("ab") as out:
            out.write(f"\n{last}\n".encode())
    assert (log / "NODE0.err").stat().st_size > 1_500_000_000


METRICS = 'HPCJOB_METRICS {"gpus": [{"node": "NODE0", "util_mean_pct": 50, "memory_peak_mib": 900}]}'
HUGE_READERS = '[reason_line(folder, log, "NODE0"), [dataclasses.asdict(u) for u in logs.gpu_use()]]'
GPU_USE = {"node": "NODE0", "gpus": 1, "util_mean_pct": 50.0, "util_peak_pct": 50.0, "memory_peak_mib": 900.0}


def test_the_last_line_of_a_1_5_gb_stderr_costs_its_end_alone(tmp_path: Path) -> None:
    huge_output(tmp_path / LOG)
    said = in_a_child(str(tmp_path), HUGE_READERS)
    assert said["said"] == ["RuntimeError: CUDA out of memory", [GPU_USE]]
    assert float(str(said["seconds"])) < 5  # a whole read of it takes longer (and 1.5 GB)
    assert float(str(said["grew_mib"])) < 64


def test_a_whole_output_read_to_its_end_is_handed_on_a_piece_at_a_time(tmp_path: Path) -> None:
    """`hpcjob logs` (final: every line left) of a node that wrote 200 MB: counted as it goes by, the
    reader holds a piece of it, not all of it."""
    log = tmp_path / LOG
    log.mkdir(parents=True)
    with (log / "NODE0.out").open("wb") as out:
        out.write((b"x" * 1023 + b"\n") * (200 << 10))
    said = in_a_child(str(tmp_path), "sum(1 for _ in logs.lines(final=True))")
    assert said["said"] == 200 << 10
    assert float(str(said["grew_mib"])) < 64


@pytest.fixture
def smb_share(tmp_path: Path) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """A real smbd serving tmp_path/CcpSpoolDir/app: the folder, its UNC, and the child's login."""
    require_testbed(tools=("smbd", "smbpasswd"))
    folder = tmp_path / "CcpSpoolDir" / "app"
    folder.mkdir(parents=True)
    with SmbServer(folder) as smb:
        env = {
            "SMB_USER": smb.username,
            "SMB_PASSWORD": smb.password,
            "SMB_SERVER": smb.address,
            "SMB_PORT": str(smb.port),
        }
        yield folder, f"//HEADNODE/CcpSpoolDir/{folder.name}", env


def test_over_smb_too_a_huge_stderr_costs_its_end_and_hostile_files_are_skipped(
    smb_share: tuple[Path, str, dict[str, str]],
) -> None:
    """The same through the SMB client (the share not mounted here): smbd itself hides a link out of
    the share and reads a FIFO as empty; the huge stderr and a beat with Infinity are hpcjob's to guard."""
    folder, unc, env = smb_share
    log = folder / LOG
    log.mkdir(parents=True)
    good_files(log)
    huge_output(log)
    (log / BEATS_FOLDER / "rank-1.json").write_text(
        HOSTILE_BEATS["infinity"].replace('"rank": 2', '"rank": 1')
    )
    os.mkfifo(log / BEATS_FOLDER / "rank-2.json")
    (log / BEATS_FOLDER / "rank-3.json").symlink_to("/dev/zero")
    said = in_a_child(unc, f"[{HUGE_READERS}, [b.rank for b in read_beats(folder, log)]]", env)
    assert said["said"] == [["RuntimeError: CUDA out of memory", [GPU_USE]], [0]]
    assert float(str(said["seconds"])) < 10  # its end only, over loopback
    assert float(str(said["grew_mib"])) < 64
