"""hpctorch, the library a user's script imports: shipped with every job, importable on the nodes without
hpcjob, and its figures read by hpcjob as the example's are (issue 40)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpctorch
from hpcjob.job.results import METRICS_PREFIX, find_metrics
from hpcjob.store.logs import timeline_line
from hpcjob.store.staging import node_files
from hpctorch import Metrics

from .conftest import stand_in_python
from .test_rest_e2e import (
    Cluster,
    cluster,  # noqa: F401 - the fixture: the emulated head node, a real smbd
)


def lines_of(folder: Path) -> list[dict[str, object]]:
    """Every timeline line as hpcjob reads it (hpcjob.store.logs.timeline_line)."""
    read = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            clean = timeline_line(json.loads(line))
            assert clean is not None, line
            read.append(clean)
    return read


def test_a_script_s_steps_become_the_timeline_and_the_metrics_line_hpcjob_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPCJOB_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("HPCJOB_NODE", "GPU1")
    monkeypatch.setenv("HPCJOB_TASK_START", str(time.time() - 3))
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)
    metrics = Metrics(every_s=0.05)
    for step in range(6):
        time.sleep(0.02)
        metrics.step(samples=32, loss=1.0 / (step + 1), data_wait_s=0.005, epoch=0, lr=0.1, note=object())
    metrics.epoch(0, accuracy=0.5, test_loss=0.7)
    said = metrics.summary(accuracy=0.5)
    out = capsys.readouterr().out
    assert METRICS_PREFIX == hpctorch.METRICS_PREFIX  # the library's is hpcjob's
    assert find_metrics(out.splitlines()) == said  # the one line hpcjob takes as the run's metrics
    assert said["steps"] == 6 and said["samples"] == 192 and said["world_size"] == 1
    assert 0 < float(said["data_wait_fraction"]) < 1 and float(said["samples_per_sec"]) > 0
    timeline = lines_of(tmp_path / "logs" / "metrics")
    events = [line["event"] for line in timeline]
    assert events[:2] == ["start", "first_step"] and events[-1] == "epoch" and "step" in events
    assert 2.5 < float(timeline[1]["after_start_s"]) < 60  # from the task's start, as node.sh says it
    step = next(line for line in timeline if line["event"] == "step")
    assert {"loss", "samples_per_sec", "data_wait_fraction", "lr", "epoch", "step"} <= set(step)
    assert "note" not in step and step["node"] == "GPU1"  # not a figure: left out
    assert (tmp_path / "logs" / "metrics" / "GPU1-0.jsonl").is_file()


def test_without_hpcjob_rank_0_says_its_steps_on_the_console(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HPCJOB_LOG_DIR", raising=False)
    monkeypatch.setenv("RANK", "0")
    metrics = Metrics(every_s=0)
    metrics.step(samples=10, loss=0.25)
    assert capsys.readouterr().out.startswith("step 1: data_wait_fraction 0, loss 0.25, samples_per_sec ")
    monkeypatch.setenv("RANK", "1")
    Metrics(every_s=0).step(samples=10, loss=0.25)
    assert capsys.readouterr().out == ""  # the other ranks say nothing


def test_every_job_ships_the_library_in_its_node_folder() -> None:
    shipped = {str(path): data for path, data in node_files()}
    for source in sorted(Path(hpctorch.__file__).parent.glob("*.py")):
        assert shipped[f".hpcjob/lib/hpctorch/{source.name}"] == source.read_bytes()


def test_a_script_on_a_node_without_hpcjob_imports_the_library_and_shows_in_runs(
    cluster: Cluster,  # noqa: F811 - the fixture of that name
    tmp_path: Path,
) -> None:
    """On the emulated cluster, the task's Python started with -S: no site-packages, so neither hpcjob nor
    an installed hpctorch; the script imports the job's own copy from .hpcjob/lib, and its figures reach
    `hpcjob runs` as the example's do."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import sys, time\n"
        "assert 'hpcjob' not in sys.modules\n"
        "import hpctorch\n"
        "print('hpctorch from', hpctorch.__file__, flush=True)\n"
        "metrics = hpctorch.Metrics(every_s=0.01)\n"
        "for step in range(20):\n"
        "    time.sleep(0.01)\n"
        "    metrics.step(samples=64, loss=1.0 / (step + 1), data_wait_s=0.001)\n"
        "metrics.summary(accuracy=0.9)\n"
    )
    # Whatever torchrun line the task has, the node's Python runs the script, without its site-packages.
    python = stand_in_python(tmp_path, f"exec {sys.executable} -S train.py")
    done = cluster.submit(
        "--wait", "-n", "1", "--run-id", "own-1", "--python", str(python), str(code / "train.py")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = cluster.hpcjob("logs", "own-1").stdout
    assert "/.hpcjob/lib/hpctorch/__init__.py" in logs, logs
    listed = json.loads(cluster.hpcjob("runs", "--json").stdout)
    mine = next(run for run in listed if run["run_id"] == "own-1")
    assert mine["samples_per_sec"] > 0 and mine["data_wait"] is not None, mine
    assert mine["summary"]["metrics"]["accuracy"] == 0.9 and mine["summary"]["metrics"]["steps"] == 20


@pytest.mark.slow
def test_a_two_rank_script_sums_its_ranks_as_the_example_does(tmp_path: Path) -> None:
    """A real 2-node local run (gloo): the metrics line holds both ranks' samples, the history its
    samples/s, each rank's timeline is there for `runs plot`."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import time\nimport torch.distributed as dist\nimport hpctorch\n"
        "dist.init_process_group('gloo')\n"
        "metrics = hpctorch.Metrics(every_s=0.01)\n"
        "for step in range(10 + 5 * dist.get_rank()):\n"
        "    time.sleep(0.01)\n"
        "    metrics.step(samples=8, loss=0.5, data_wait_s=0.002)\n"
        "metrics.summary(accuracy=0.75)\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2", "--json", "--run-id", "two-1",
         "--mount-point", str(tmp_path / "share"), str(code / "train.py")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout)["metrics"]
    assert metrics["samples"] == 8 * (10 + 15) and metrics["world_size"] == 2 and metrics["accuracy"] == 0.75
    listed = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", "two-1", "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(listed.stdout)["samples_per_sec"] == metrics["samples_per_sec"] > 0
    timelines = sorted(p.name for p in (tmp_path / "share").rglob("metrics/*.jsonl"))
    assert timelines == ["LOCAL1-0.jsonl", "LOCAL2-0.jsonl"]


def page_script(tmp_path: Path) -> Path:
    """docs/own-script.md's first Python block, as a reader copies it."""
    import re

    page = (Path(__file__).parents[1] / "docs" / "own-script.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S)
    assert block is not None and len(block[1].splitlines()) <= 80
    script = tmp_path / "code" / "own.py"
    script.parent.mkdir()
    script.write_text(block[1])
    return script


def run_page(tmp_path: Path, run_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", "2", "--retries", "1", "--json",
         "--run-id", run_id, "--mount-point", str(tmp_path / "share"), str(page_script(tmp_path)), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_the_script_of_the_own_script_page_runs_as_it_stands(tmp_path: Path) -> None:
    """As the page says to run it: a 2-node local run that finishes, its metrics the run's (3 epochs of
    4096 samples over both ranks), its samples/s in the history, its saves complete and marked."""
    job = run_page(tmp_path, "own-page-1")
    out, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["metrics"]["samples"] == 3 * 4096 and summary["metrics"]["accuracy"] > 0.8
    assert "epoch 2: accuracy " in err and "hpctorch: saved step 96 (training held " in err
    shown = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", "own-page-1", "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(shown.stdout)["samples_per_sec"] == summary["metrics"]["samples_per_sec"] > 0
    saves = sorted(
        p.parent.name for p in (tmp_path / "share").rglob("checkpoints/own-page-1/*/.hpcjob-complete")
    )
    assert saves == ["step-000000096"]  # every 100 steps, and the last one at close; keep=2


def past_save(share: Path, run_id: str, step: int) -> bool:
    """Whether the run's first attempt reported a step past `step` in its timeline."""
    for timeline in share.rglob(f"logs/{run_id}/metrics/*.jsonl"):
        for text in timeline.read_text().splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(text)
                if line.get("event") == "step" and line.get("step", 0) > step:
                    return True
    return False


@pytest.mark.slow
def test_the_page_s_script_survives_a_lost_node_and_resumes_from_its_save(tmp_path: Path) -> None:
    """A node killed after the first complete save: the run is Finished in 2 attempts, the second
    resumed from that save (its steps not trained again)."""
    import os
    import signal

    from hpcjob.backends.local.procs import MARKER_VAR, marked_processes

    run_id = "own-page-2"
    job = run_page(tmp_path, run_id, "--epochs", "40")
    try:
        # Once a save is complete and a step line past it is in the timeline: the work to redo is known.
        deadline = time.monotonic() + 180
        while not (
            saved := list((tmp_path / "share").rglob(f"checkpoints/{run_id}/*/.hpcjob-complete"))
        ) or not (past_save(tmp_path / "share", run_id, int(saved[0].parent.name.removeprefix("step-")))):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.05)
        for pid, _ in marked_processes(f"{MARKER_VAR}={run_id}/2\0".encode()):
            os.kill(pid, signal.SIGKILL)
        out, err = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Finished" and summary["events"][0].startswith("attempt 1 ("), summary[
        "events"
    ]
    assert "attempt 2 of 2" in err and "hpctorch: resumed from step " in err
    resumed = summary["metrics"]["resumed_at_step"]
    assert resumed >= 100 and summary["metrics"]["steps"] == 40 * 32 - resumed  # nothing trained twice
    said = next(e for e in summary["events"] if e.startswith("attempt 2 resumed at step "))
    assert re.fullmatch(
        rf"attempt 2 resumed at step {resumed:,} \(\d[\d,]* step\(s\), [\d,]+ s redone\)", said
    )
    shown = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "show", run_id, "--json"], capture_output=True, text=True
    )
    attempts = json.loads(shown.stdout)["attempts"]
    assert attempts[0]["resumed"] is None and attempts[1]["resumed"]["step"] == resumed


def test_an_attempt_s_redone_work_is_what_the_one_before_did_past_the_save() -> None:
    """From the timelines: the step the attempt resumed (its resume line), the last step the attempt
    before reported, and the seconds between it being at the resumed step (between its lines, in
    proportion) and that last line."""
    from hpcjob.job.attempts import Resumed, resumed_of

    def line(event: str, step: int, t: float) -> dict[str, object]:
        return {"event": event, "step": step, "t": t}

    before = [
        line("step", 50, 100.0),
        line("step", 150, 110.0),
        line("checkpoint", 100, 111.0),
        line("step", 250, 120.0),
    ]
    assert resumed_of(before, [line("resume", 100, 200.0)]) == Resumed(100, 150, 15.0)
    assert Resumed(100, 150, 15.0).line(2) == "attempt 2 resumed at step 100 (150 step(s), 15 s redone)"
    assert resumed_of(before, [line("step", 1, 200.0)]) is None  # a fresh start: nothing resumed
    assert resumed_of([], [line("resume", 100, 200.0)]) == Resumed(100)  # no steps reported before
    assert "the work redone unknown" in Resumed(100).line(3)
    assert resumed_of([line("step", 90, 5.0)], [line("resume", 100, 9.0)]) == Resumed(100, 0, 0.0)
    assert Resumed.from_dict(Resumed(1200, 80, 40.5).to_dict()) == Resumed(1200, 80, 40.5)


def test_saves_are_marked_kept_and_resumed_and_a_torn_one_is_never_chosen(tmp_path: Path) -> None:
    """One process, no process group: a save every 2 steps, the newest 2 kept, the last step saved at
    close; a later save cut short (no marker) is passed over; a resume loads the newest marked one."""
    import torch

    from hpctorch import Checkpoints
    from hpctorch.checkpoint import MARKER, complete_saves

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saving = Checkpoints(folder=str(tmp_path), every_steps=2, keep=2)
    assert saving.resume(model, optimizer) == 0  # nothing there: a fresh start
    for step in range(1, 8):
        model.weight.data += 1.0
        saving.step(step, model, optimizer)
    saving.close(7, model, optimizer)
    assert [step for step, _ in complete_saves(str(tmp_path))] == [6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000006", "step-000000007"]
    torn = tmp_path / "step-000000009"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"cut short")
    fresh = torch.nn.Linear(4, 2)
    resumed = Checkpoints(folder=str(tmp_path))
    assert resumed.resume(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1)) == 7
    assert torch.equal(fresh.weight, model.weight) and not (torn / MARKER).exists()


def test_a_checkpoint_that_cannot_be_saved_or_resumed_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from hpctorch import CheckpointError, Checkpoints

    monkeypatch.delenv("HPCJOB_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match=r"^hpctorch: no checkpoint folder: run under hpcjob"):
        Checkpoints()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(
        CheckpointError, match=r"^hpctorch: checkpoint folder .*/file/ck cannot be written on "
    ):
        Checkpoints(folder=str(blocked / "ck"))
    empty = tmp_path / "earlier"
    empty.mkdir()
    monkeypatch.setenv("HPCJOB_RESUME_FROM", str(empty))
    model = torch.nn.Linear(4, 2)
    with pytest.raises(
        CheckpointError, match=r"earlier holds no complete save \(a folder with .hpcjob-complete\)"
    ):
        Checkpoints(folder=str(tmp_path / "mine")).resume(model)
    monkeypatch.delenv("HPCJOB_RESUME_FROM")
    saved = Checkpoints(folder=str(tmp_path / "mine"))
    saved.close(1, model)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3))  # another model: its keys are not the save's
    with pytest.raises(CheckpointError) as info:
        Checkpoints(folder=str(tmp_path / "mine")).resume(other)
    assert re.fullmatch(
        r"hpctorch: cannot resume from .*step-000000001: RuntimeError: Missing key in checkpoint state_dict: "
        r"model\.0\.weight\.",
        str(info.value),
    ), str(info.value)


def test_a_script_that_ends_with_a_save_in_flight_has_it_finished_and_marked(tmp_path: Path) -> None:
    """No close(): at the script's end the save in flight is finished (Python waits for DCP's writer)
    and marked, and said once."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import sys, torch\nfrom hpctorch import Checkpoints\n"
        "Checkpoints(folder=sys.argv[1]).save(1, torch.nn.Linear(2048, 2048))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(hpctorch.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("hpctorch: saved step 1 (training held ") == 1, done.stdout + done.stderr
    assert (tmp_path / "ck" / "step-000000001" / ".hpcjob-complete").is_file()


@pytest.mark.slow
def test_a_run_of_fewer_nodes_resumes_a_save_of_more(tmp_path: Path) -> None:
    """DCP reshards on load: a 3-node run with --resume-from goes on from a 4-node run's newest save (DDP,
    one rank a node), every rank with the weights the 4 saved."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
        "from hpctorch import Checkpoints\n"
        "dist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
        "model = DistributedDataParallel(torch.nn.Linear(16, 4))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "checkpoints = Checkpoints(every_steps=5)\n"
        "done = checkpoints.resume(model, optimizer)\n"
        "print('start sum %.6f' % float(model.module.weight.sum()), flush=True)\n"
        "for step in range(done + 1, done + 13):\n"
        "    loss = model(torch.randn(8, 16)).pow(2).mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    checkpoints.step(step, model, optimizer)\n"
        "checkpoints.close(step, model, optimizer)\n"
        "print('end sum %.6f from %d' % (float(model.module.weight.sum()), done), flush=True)\n"
        "dist.destroy_process_group()\n"
    )

    def run(run_id: str, nodes: str, *more: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", "run", "--local", "-n", nodes, "--run-id", run_id,
             "--mount-point", str(tmp_path / "share"), *more, str(code / "train.py")],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    more = run("more-1", "4")
    assert "from 0" in more and "hpctorch: saved step 12 " in more
    fewer = run("fewer-1", "3", "--resume-from", "more-1")
    assert "hpctorch: resumed from step 12 (" in fewer and "from 12" in fewer
    logs = tmp_path / "share" / "hpcjob" / "train" / "logs"

    def printed(run_id: str, start: str) -> list[str]:
        outs = sorted((logs / run_id).glob("*.out"))
        return [line for out in outs for line in out.read_text().splitlines() if line.startswith(start)]

    (saved,) = {line.split()[2] for line in printed("more-1", "end sum ")}  # every rank's, the same
    assert printed("fewer-1", "start sum ") == [f"start sum {saved}"] * 3
    resumed = [
        json.loads(line)
        for path in (logs / "fewer-1").glob("metrics/*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert sorted((e["node"], e["world_size"], e["step"]) for e in resumed if e["event"] == "resume") == [
        (f"LOCAL{i}", 3, 12) for i in (1, 2, 3)
    ]


FULL_DISK_SCRIPT = """
import os, shutil, sys, torch
from hpctorch import CheckpointError, Checkpoints
folder = sys.argv[1]
model = torch.nn.Linear(256, 256)  # 257 KiB of weights
checkpoints = Checkpoints(folder=folder)
checkpoints.close(1, model)  # a complete save
saved = model.weight.detach().clone()
with torch.no_grad():
    model.weight.add_(1.0)
with open(os.path.join(folder, "filler"), "wb") as filler:  # the disk fills up: 64 KiB are left
    filler.write(bytes(shutil.disk_usage(folder).free - 64 * 1024))
try:
    checkpoints.close(2, model)
except CheckpointError as exc:
    print("error:", exc)
fresh = torch.nn.Linear(256, 256)
print("resumed", Checkpoints(folder=folder).resume(fresh), torch.equal(fresh.weight, saved))
"""


def test_a_full_disk_during_a_save_is_one_line_and_the_last_complete_save_stays(tmp_path: Path) -> None:
    """On a 1 MiB tmpfs (a mount namespace of its own): the save that does not fit fails in one line naming
    the node and the free space; the save before it is untouched, and the one resumed."""
    folder = tmp_path / "small"
    folder.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK_SCRIPT)
    inside = f"mount -t tmpfs -o size=1m tmpfs {folder} && exec {sys.executable} {script} {folder}/ck"
    env = {**os.environ, "PYTHONPATH": str(Path(hpctorch.__file__).parents[1]), "HPCJOB_NODE": "GPU7"}
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", inside], capture_output=True, text=True, timeout=120, env=env
    )
    if done.returncode != 0 and "mount" in done.stderr and "error:" not in done.stdout:
        pytest.skip(f"no tmpfs in a mount namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    error, resumed = [line for line in done.stdout.splitlines() if line.startswith(("error:", "resumed"))]
    assert re.fullmatch(
        r"error: hpctorch: the save of step 2 on GPU7 failed \(0\.\d MiB free there\): .+; the last complete "
        r"save is untouched",
        error,
    ), done.stdout
    assert resumed == "resumed 1 True"
