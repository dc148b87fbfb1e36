"""Hangs caught: the ranks' beats (hpcjob/node/worker.py), the watch that tells whom to blame
(hpcjob.job.hangs), and a hung job ended with the hang as its root cause, run for real with gloo: one rank
put to sleep locally, one stopped (SIGSTOP) on the emulated cluster, followed over SMB."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import hpcjob
from hpcjob.backends.local import free_port
from hpcjob.backends.local.procs import marked_processes
from hpcjob.job.hangs import (
    HANG_EXIT_CODE,
    Beat,
    Collective,
    HangWatch,
    beat_interval,
    script_frame,
)
from hpcjob.job.plan import FLIGHT_RECORDER_FILE, make_plan
from hpcjob.job.render import job_xml, plan_json
from hpcjob.job.spec import JobSpec, SpecError, parse_hang_timeout
from hpcjob.runner.watch import DUMP_BEATS

from .conftest import REPO, RUN_ID, cluster_spec
from .test_mount_filter import python36
from .test_rest_e2e import Cluster

NODE_FILES = REPO / "hpcjob" / "node"
TIMEOUT = 10.0  # the bound in these tests: beats every 2 s, stale after 6 s
ALL_REDUCE = "gloo:all_reduce"


def beats(t: float, collectives: dict[int, tuple[int, bool] | None], node: str = "N") -> list[Beat]:
    """Each rank's beat at its own time `t`: its newest collective of the default group (seq, in flight)."""
    return [
        Beat(
            rank,
            f"{node}{rank}",
            t,
            {} if newest is None else {"0": Collective(newest[0], ALL_REDUCE, newest[1])},
        )
        for rank, newest in collectives.items()
    ]


def watched(watch: HangWatch, looks: Iterable[tuple[float, list[Beat]]]) -> list[str | None]:
    """What the watch says at each look (the follower's time, the beats read then)."""
    said = []
    for now, latest in looks:
        hang = watch.look(latest, now)
        said.append(None if hang is None else f"{hang.rank}|{hang.node}|{hang.reason}")
    return said


def test_a_job_whose_collectives_move_on_is_never_hung_however_long() -> None:
    watch = HangWatch(TIMEOUT, 2)
    looks = [(now, beats(now, {0: (int(now), True), 1: (int(now), False)})) for now in range(0, 120, 2)]
    assert set(watched(watch, looks)) == {None}


def test_a_rank_behind_the_collective_the_others_wait_in_is_named_once_the_bound_has_passed() -> None:
    watch = HangWatch(TIMEOUT, 3)
    # Rank 2 sleeps after collective 7; ranks 0 and 1 wait in collective 8. Everybody still beats.
    looks = [(now, beats(now, {0: (8, True), 1: (8, True), 2: (7, False)})) for now in (0, 4, 8, 9.9, 10)]
    said = watched(watch, looks)
    assert said[:4] == [None] * 4
    assert said[4] == (
        "2|N2|hung: never entered collective #8 gloo:all_reduce, in which ranks 0, 1 waited for 10 s "
        "(its last: collective #7 gloo:all_reduce)"
    )


def test_a_rank_in_another_collective_than_the_others_is_named_as_in_it() -> None:
    watch = HangWatch(TIMEOUT, 2)
    watch.look(beats(0, {0: (8, True), 1: (7, True)}), 0)
    hang = watch.look(beats(12, {0: (8, True), 1: (7, True)}), 12)
    assert (
        hang is not None
        and hang.rank == 1
        and hang.reason.endswith("(it is in collective #7 gloo:all_reduce)")
    )


def test_a_rank_that_stopped_beating_is_named_before_any_rank_behind() -> None:
    watch = HangWatch(TIMEOUT, 3)
    frozen = beats(0, {1: (5, False)})[0]  # rank 1 stopped: its beat keeps its time
    said = watched(
        watch,
        [(now, [*beats(now, {0: (6, True), 2: (5, False)}), frozen]) for now in (0, 2, 4, 6, 8, 10)],
    )
    assert said[-1] == (
        "1|N1|hung: stopped beating (its last beat: collective #5 gloo:all_reduce) while rank 0 waited in "
        "collective #6 gloo:all_reduce for 10 s"
    )


def test_every_rank_waiting_in_the_same_collective_blames_no_rank() -> None:
    watch = HangWatch(TIMEOUT, 2)
    said = watched(watch, [(now, beats(now, {0: (9, True), 1: (9, True)})) for now in (0, 5, 11)])
    assert said[-1] is not None and said[-1].startswith(
        "None|None|hung: every rank waited in collective #9 gloo:all_reduce for 11 s: none is missing"
    )


def test_a_beat_that_could_not_be_read_this_time_is_taken_as_last_read() -> None:
    watch = HangWatch(TIMEOUT, 2)
    watch.look(beats(0, {0: (4, True), 1: (3, False)}), 0)
    said = watched(watch, [(now, beats(now, {0: (4, True)})) for now in (2, 4, 6, 8, 10)])  # rank 1 unread
    assert said[-1] is not None and said[-1].startswith(
        "1|N1|hung: stopped beating (its last beat: collective #3"
    )


def test_the_rank_waiting_in_nothing_is_blamed_before_one_waiting_in_another_group() -> None:
    """Sequence numbers count per process group: ranks 0 and 1 wait in the default group's #100, rank 2
    (also in a group of its own) waits there in #40, rank 3 sleeps after the default group's #99."""
    watch = HangWatch(TIMEOUT, 4)
    default, waiting = Collective(100, ALL_REDUCE, True), Collective(99, ALL_REDUCE, False)
    latest = [
        Beat(0, "N0", 0, {"0": default}),
        Beat(1, "N1", 0, {"0": default}),
        Beat(2, "N2", 0, {"0": waiting, "2": Collective(40, "gloo:broadcast", True)}),
        Beat(3, "N3", 0, {"0": waiting}),
    ]
    watch.look(latest, 0)
    hang = watch.look([dataclasses.replace(b, t=12) for b in latest], 12)
    assert hang is not None and hang.rank == 3, hang
    del latest[3]  # without rank 3: rank 2 is behind, in its other collective
    watch = HangWatch(TIMEOUT, 3)
    watch.look(latest, 0)
    hang = watch.look([dataclasses.replace(b, t=12) for b in latest], 12)
    assert (
        hang is not None
        and hang.rank == 2
        and hang.reason.endswith("(it is in collective #40 gloo:broadcast)")
    ), hang


def test_where_the_script_was_is_its_own_innermost_frame_not_the_library_s() -> None:
    stacks = (
        "main thread:\n"
        '  File "/app/.hpcjob/worker.py", line 260, in _run\n    runpy.run_path(script)\n'
        '  File "/app/train.py", line 88, in load_batch\n    batch = queue.get()\n'
        '  File "/usr/lib/python3.10/queue.py", line 171, in get\n    self.not_empty.wait()\n'
        '  File "/usr/lib/python3.10/threading.py", line 320, in wait\n    waiter.acquire()\n'
        "\nthread 140:\n"
        '  File "/app/.hpcjob/worker.py", line 190, in _beat\n'
    )
    assert script_frame(stacks) == "train.py:88 in load_batch"
    assert script_frame("main thread:\n") is None


def test_a_rank_that_never_beat_is_named_by_its_rank_alone() -> None:
    watch = HangWatch(TIMEOUT, 3)
    said = watched(watch, [(now, beats(now, {0: (1, True), 1: (1, True)})) for now in (0, 11)])
    assert said[-1] == (
        "2|None|hung: rank 2 never beat, while ranks 0, 1 waited in collective #1 gloo:all_reduce for 11 s"
    )


@pytest.mark.parametrize(
    "collectives",
    [
        {0: (4, False), 1: (4, False)},  # both compute, out of any collective (an evaluation, a save)
        {0: None, 1: None},  # no process group yet (a long data load before init_process_group)
    ],
)
def test_ranks_that_wait_in_no_collective_are_not_hung(
    collectives: dict[int, tuple[int, bool] | None],
) -> None:
    watch = HangWatch(TIMEOUT, 2)
    assert set(watched(watch, [(now, beats(now, collectives)) for now in range(0, 60, 2)])) == {None}


def test_beats_that_cannot_be_read_anew_accuse_nobody() -> None:
    watch = HangWatch(TIMEOUT, 2)
    frozen = beats(0, {0: (3, True), 1: (2, False)})  # every beat as it was: the share, not the ranks
    assert set(watched(watch, [(now, frozen) for now in range(0, 60, 2)])) == {None}


def test_the_beat_and_the_bound() -> None:
    assert (beat_interval(10), beat_interval(120), beat_interval(3600)) == (2.0, 20.0, 30.0)
    assert (parse_hang_timeout("90"), parse_hang_timeout("10m"), parse_hang_timeout("1h30m")) == (
        90,
        600,
        5400,
    )
    with pytest.raises(SpecError, match=r"^--hang-timeout 5 must be between 10 seconds and 168 hours$"):
        JobSpec(script="train.py", hang_timeout_s=5)
    with pytest.raises(SpecError, match=r"^--hang-timeout does not go with --min-nodes"):
        JobSpec(script="train.py", nodes=3, min_nodes=2, max_restarts=1, hang_timeout_s=60)
    with pytest.raises(SpecError, match=r"^--hang-timeout 'soon' must be a duration"):
        parse_hang_timeout("soon")


def test_a_watched_job_s_file_has_the_beat_and_its_plan_the_bound(golden: Callable[[str, str], None]) -> None:
    spec = cluster_spec(2, hang_timeout_s=120)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    golden("job-2node-hang-timeout.xml", job_xml(plan))  # HPCJOB_BEAT_S=20: six beats in the bound
    assert json.loads(plan_json(plan))["hang_timeout_s"] == 120
    unwatched = cluster_spec(2)
    assert "HPCJOB_BEAT_S" not in job_xml(make_plan(unwatched, unwatched.node_names, RUN_ID))


@pytest.mark.parametrize("python", [sys.executable, "3.6"])
def test_a_rank_beats_and_when_asked_says_where_its_script_is(tmp_path: Path, python: str) -> None:
    """worker.py's beat in a rank without torch, with this Python and with 3.6 (nodes run any Python 3):
    its time, its node, no collective; then, asked, where its script is."""
    if python == "3.6":
        python = python36() or pytest.skip("no Python 3.6 on this machine")
    (tmp_path / ".hpcjob").mkdir()
    (tmp_path / ".hpcjob" / "worker.py").write_bytes((NODE_FILES / "worker.py").read_bytes())
    (tmp_path / "train.py").write_text("import time\n\ndef wait():\n    time.sleep(30)\n\nwait()\n")
    folder = tmp_path / "beats"
    env = {**os.environ, "HPCJOB_BEAT_S": "0.2", "HPCJOB_BEAT_DIR": str(folder), "RANK": "3"}
    rank = subprocess.Popen([python, ".hpcjob/worker.py", "train.py"], cwd=tmp_path, env={
        **env, "HPCJOB_NODE": "N1"})  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (folder / "rank-3.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first = json.loads((folder / "rank-3.json").read_text())
        assert (first["rank"], first["node"], first["collectives"]) == (3, "N1", {})
        time.sleep(0.5)
        assert json.loads((folder / "rank-3.json").read_text())["t"] > first["t"]  # it beats on
        (folder / "dump").write_bytes(b"")
        while not (folder / "stacks-rank-3.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert script_frame((folder / "stacks-rank-3.txt").read_text()) == "train.py:4 in wait"
    finally:
        rank.kill()
        rank.wait()


def torchfrtrace(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """The installed `torchfrtrace` (PyTorch's flight-recorder analyzer) on a folder, as the docs say
    to run it: its output, both streams (it reports through logging)."""
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("torchfrtrace")),
            str(folder),
            "-p",
            FLIGHT_RECORDER_FILE,
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


# One rank, two process groups (the default one and one of its own), with gloo: the dump worker.py writes.
DUMPING = """\
import os, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import worker

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
own = dist.new_group([0], group_desc="own")
tensor = torch.ones(8)
dist.all_reduce(tensor)
dist.all_reduce(tensor, group=own)
worker._dump_flight_recorder("0")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_dumped_flight_recorder_opens_in_torch_s_own_analyzer(tmp_path: Path) -> None:
    """torch 2.14.1's gloo dump keys `pg_config` by '' while its entries name ('0', 'default_pg'): worker.py
    keys it by the groups' names, so that `torchfrtrace` reads it (KeyError: ('0', 0) before)."""
    env = {
        **os.environ,
        "TORCH_FR_BUFFER_SIZE": "100",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / FLIGHT_RECORDER_FILE),
    }
    subprocess.run([sys.executable, "-c", DUMPING, str(NODE_FILES)], env=env, check=True, timeout=120)
    trace = pickle.loads((tmp_path / f"{FLIGHT_RECORDER_FILE}0").read_bytes())
    assert [entry["process_group"] for entry in trace["entries"]] == [("0", "default_pg"), ("1", "own")]
    assert trace["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0]"},
        "1": {"name": "1", "desc": "own", "ranks": "[0]"},
    }
    analyzed = torchfrtrace(tmp_path)
    assert analyzed.returncode == 0 and "Traceback" not in analyzed.stdout, analyzed.stdout


# A DDP-like loop of all-reduces with gloo, in which one rank stops after 5 of them: it sleeps in
# Python (HANG_MODE=sleep: it beats on, behind) or is stopped (HANG_MODE=stop: it stops beating).
HANGING = """\
import os, signal, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(8)
for step in range(10_000):
    if step == 5 and dist.get_rank() == 1:
        if os.environ["HANG_MODE"] == "stop":
            time.sleep(2.5)  # a beat with its 5 collectives first (one every 2 s)
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(600)
    dist.all_reduce(tensor)
    time.sleep(0.05)
"""


def hanging_script(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "hang.py"
    script.write_text(HANGING)
    return script


def assert_ended_as_hung(run: hpcjob.Run, log_dir: Path, found: str) -> None:
    summary = run.summary
    assert summary is not None and (summary.state, summary.exit_code) == ("Failed", HANG_EXIT_CODE), summary
    cause = summary.root_cause
    assert cause is not None and cause.rank == 1, cause
    assert cause.reason.startswith(found), cause.reason
    assert marked_processes(f"HPCJOB_TASK_MARKER={run.run_id}/".encode()) == set()  # nothing left
    # The rank that waited dumped its flight recorder: the collective it waited in is its newest.
    trace = pickle.loads((log_dir / "nccl-trace-rank-0").read_bytes())
    assert trace["entries"][-1]["profiling_name"] == ALL_REDUCE


@pytest.mark.slow
def test_a_rank_put_to_sleep_is_named_and_the_job_ended_within_the_bound(tmp_path: Path) -> None:
    said: list[tuple[float, str]] = []
    run = hpcjob.submit(
        hanging_script(tmp_path / "code"),
        nodes=2,
        hang_timeout_s=TIMEOUT,
        env={"HANG_MODE": "sleep"},
        python=sys.executable,
        no_env=True,
    )
    run.wait(progress=lambda line: said.append((time.time(), line)))
    ended = time.time()
    log_dir = Path(run.record.local_root or "") / run.record.log_folder
    assert_ended_as_hung(
        run, log_dir, "hung: never entered collective #6 gloo:all_reduce, in which rank 0 waited for "
    )
    assert run.summary is not None and run.summary.root_cause is not None
    assert run.summary.root_cause.reason.endswith("; it was at hang.py:11 in <module>")
    # PyTorch's own analyzer, on the log folder as it is, names the rank and collective hpcjob named
    # (rank 1, collective #6 gloo:all_reduce: asserted above).
    analyzed = torchfrtrace(log_dir)
    assert analyzed.returncode == 0, analyzed.stdout
    assert "Not all ranks joining collective, sequence number: 6\n" in analyzed.stdout, analyzed.stdout
    rank = run.summary.root_cause.rank
    assert f"collective: {ALL_REDUCE}\nmissing ranks: {{{rank}}}\n" in analyzed.stdout, analyzed.stdout
    named_at, named = next((at, line) for at, line in said if "hung:" in line)
    # Ranks go to nodes in the order torchrun's rendezvous takes them, not by node: rank 1's beat says where.
    node = json.loads((log_dir / ".hpcjob-beats" / "rank-1.json").read_text())["node"]
    assert node in ("LOCAL1", "LOCAL2")
    assert named.startswith(f"hpcjob: rank 1 on {node} hung:") and named.endswith("; ending the job")
    # When rank 0 began to wait (its clock is this machine's): named after the bound, within a few beats
    # more (a beat to be written, one to be read), and ended within the dumps' beats and the stop's grace.
    began = json.loads((log_dir / ".hpcjob-beats" / "rank-0.json").read_text())["collectives"]["0"][2]
    beat = beat_interval(TIMEOUT)
    assert TIMEOUT <= named_at - began <= TIMEOUT + 3 * beat + 2, (began, named_at)
    assert ended - named_at <= DUMP_BEATS * beat + 10


@pytest.mark.slow
def test_a_stopped_rank_on_the_cluster_is_named_over_smb_and_its_job_canceled(
    emulated: Cluster,
) -> None:
    run = hpcjob.submit(
        hanging_script(emulated.share_dir.parent.parent / "code"),
        cluster="emu",
        backend="rest",
        nodes=2,
        hang_timeout_s=TIMEOUT,
        env={"HANG_MODE": "stop", "HPCJOB_IFNAME": "lo"},
        python=sys.executable,
        rdzv_port=free_port(),
        no_env=True,
        wait=True,
    )
    assert_ended_as_hung(
        run,
        emulated.share_dir / run.record.log_folder,
        "hung: stopped beating (its last beat: collective #5 gloo:all_reduce) while rank 0 waited in "
        "collective #6 gloo:all_reduce for ",
    )
    assert run.status().state == "Canceled"  # the scheduler's word: hpcjob canceled it


@pytest.mark.parametrize(
    ("header", "left"),
    [
        (
            b'getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)',
            "TORCH_FR_BUFFER_SIZE",
        ),
        (b'getCvarInt({"TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)', "TORCH_NCCL_TRACE_BUFFER_SIZE"),  # older
        (None, "both"),  # no header shipped: both, as the job set them
    ],
)
def test_a_rank_keeps_the_buffer_size_name_its_torch_reads(
    tmp_path: Path, header: bytes | None, left: str
) -> None:
    """Every run printed torch 2.14's `TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated` on each node; an older
    torch reads only that name. worker.py looks in the task's own torch, without importing it."""
    torch = tmp_path / "torch"
    torch.mkdir()
    (torch / "__init__.py").write_text("raise SystemExit('worker.py must not import torch for this')\n")
    if header is not None:
        folder = torch / "include" / "torch" / "csrc" / "distributed" / "c10d"
        folder.mkdir(parents=True)
        (folder / "FlightRecorder.hpp").write_bytes(header)
    script = tmp_path / "show.py"
    script.write_text("import os; print(sorted(k for k in os.environ if k.endswith('BUFFER_SIZE')))\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    env |= {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    done = subprocess.run(
        [sys.executable, str(REPO / "hpcjob" / "node" / "worker.py"), str(script)],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    both = ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"]
    assert done.stdout.strip() == str(both if left == "both" else [left])
