"""Results come home (issue 33, item 7): `hpcjob pull RUN [--to DIR]` copies a run's checkpoints, output
folder and logs from its share (a local run's folder, or SMB), only what changed since the last pull, and
only regular files: the share is another user's input (issue 31), so a link, a FIFO, a device or a name
that is no plain file name is skipped, said, and nothing is written outside DIR or through a link."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hpcjob
from hpcjob.job.plan import make_plan
from hpcjob.job.render import plan_json
from hpcjob.job.spec import JobSpec, SpecError
from hpcjob.runner import pull_run
from hpcjob.runner.pull import PULL_MANIFEST
from hpcjob.store.runs import RunRecord, save_run

from .conftest import REPO, cluster_spec
from .testbed.prerequisites import require_testbed
from .testbed.smb import SmbServer

TRAIN = REPO / "training" / "run_ddp.py"
RUN = "pulled-20261127-000000-abcd"
JOB_FOLDER = "hpcjob/run_ddp"


def hpcjob_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )


def local_run(root: Path, run_id: str = RUN) -> Path:
    """A local run recorded as `run --local` records it, its share at `root`: its job folder."""
    job = JobSpec(script=str(TRAIN), nodes=1)
    plan = make_plan(job, ["LOCAL1"], run_id, mount_point=str(root))
    save_run(RunRecord.of(plan, job.job_folder, "local", local_root=str(root)), plan=plan_json(plan))
    return root / job.job_folder


def results(job_folder: Path, run_id: str = RUN) -> dict[str, bytes]:
    """What a run of the training program leaves: a checkpoint (and a writer's temporary file beside
    it), an output, each node's output and metrics, and hpcjob's own marks."""
    files = {
        f"checkpoints/{run_id}/checkpoint.pt": os.urandom(300_000),
        f"checkpoints/{run_id}/.checkpoint.pt.tmp": b"half written",
        f"outputs/{run_id}/model.pt": os.urandom(1000),
        f"outputs/{run_id}/plots/loss.svg": b"<svg/>",
        f"logs/{run_id}/LOCAL1.out": b"epoch 1\n",
        f"logs/{run_id}/LOCAL1.exit": b"0 1.5\n",
        f"logs/{run_id}/metrics/LOCAL1-0.jsonl": b'{"event": "start"}\n',
        f"logs/{run_id}/.hpcjob-beats/rank-0.json": b"{}",
    }
    for relative, data in files.items():
        path = job_folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def pulled(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but the pull's manifest, by its path there; a link or another thing
    that is not a regular file or a folder fails the test."""
    found = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), f"{path} is neither a file nor a folder"
        if stat.S_ISREG(mode) and path.name != PULL_MANIFEST:
            found[path.relative_to(folder).as_posix()] = path.read_bytes()
    return found


def expected(files: dict[str, bytes], run_id: str = RUN) -> dict[str, bytes]:
    """The files as a pull lays them out: dot-names (a writer's temporaries, hpcjob's marks) stay."""
    return {
        relative.replace(f"/{run_id}/", "/", 1): data
        for relative, data in files.items()
        if not any(part.startswith(".") for part in relative.split("/"))
    }


def test_a_local_run_s_results_come_home_and_a_second_pull_copies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_folder = local_run(tmp_path / "share")
    files = results(job_folder)
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    first = pull_run(RUN, progress=said.append)  # into ./RUN
    target = tmp_path / RUN
    assert first.target == target
    assert pulled(target) == expected(files)
    assert (first.files_copied, first.files_unchanged, first.skipped) == (6, 0, ())
    assert first.bytes_copied == sum(map(len, expected(files).values()))
    assert said == [
        "checkpoints: 1 file(s) copied, 300000 bytes; 0 unchanged",
        "outputs: 2 file(s) copied, 1006 bytes; 0 unchanged",
        "logs: 3 file(s) copied, 33 bytes; 0 unchanged",
    ]
    assert first.line() == (
        f"pulled run {RUN} into {target}: 6 file(s) copied, {first.bytes_copied} bytes; 0 unchanged"
    )
    # Each file keeps the time it had on the share.
    share_time = (job_folder / f"checkpoints/{RUN}/checkpoint.pt").stat().st_mtime_ns
    assert (target / "checkpoints/checkpoint.pt").stat().st_mtime_ns == share_time

    second = pull_run(RUN, target)
    assert (second.files_copied, second.bytes_copied, second.files_unchanged) == (0, 0, 6)

    # What changed on the share comes again; what changed here is put right; nothing here is deleted.
    (job_folder / f"logs/{RUN}/LOCAL1.out").write_bytes(b"epoch 1\nepoch 2\n")
    (target / "checkpoints/checkpoint.pt").write_bytes(b"edited here")
    (job_folder / f"outputs/{RUN}/model.pt").unlink()
    third = pull_run(RUN, target)
    assert (third.files_copied, third.files_unchanged) == (2, 3)
    assert (target / "logs/LOCAL1.out").read_bytes() == b"epoch 1\nepoch 2\n"
    assert (target / "checkpoints/checkpoint.pt").read_bytes() == files[f"checkpoints/{RUN}/checkpoint.pt"]
    assert (target / "outputs/model.pt").exists()
    manifest = json.loads((target / PULL_MANIFEST).read_text())
    assert manifest["run_id"] == RUN and "outputs/model.pt" not in manifest["files"]


def test_the_python_api_pulls_a_run_it_finds(tmp_path: Path) -> None:
    files = results(local_run(tmp_path / "share"))
    report = hpcjob.Run.find(RUN).pull(tmp_path / "here")
    assert report.files_copied == 6 and pulled(tmp_path / "here") == expected(files)


def plant_hostile(job_folder: Path, outside: Path) -> None:
    """What someone who can write the run's folders may leave there."""
    logs = job_folder / "logs" / RUN
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "passwd").symlink_to("/etc/passwd")
    (logs / "zero").symlink_to("/dev/zero")
    (logs / "etc").symlink_to("/etc")
    (logs / "outside").symlink_to(outside)
    os.mkfifo(logs / "fifo")
    (logs / "x\\..\\..\\escape").write_text("a name Windows reads as a path")
    (logs / "line\nbreak").write_text("a name that would break a line")
    (logs / "..x").write_text("a plain name that starts with two dots: a hidden one, left")
    (logs / "a..b").write_text("a plain name")
    # The whole outputs folder a link out of the run.
    shutil.rmtree(job_folder / "outputs" / RUN, ignore_errors=True)
    (job_folder / "outputs").mkdir(exist_ok=True)
    (job_folder / "outputs" / RUN).symlink_to(outside)


def test_a_hostile_share_pulls_nothing_bad(tmp_path: Path) -> None:
    """Links (to /etc/passwd, /dev/zero, a folder elsewhere), a FIFO, names with `..`, a backslash or a
    line break, the output folder itself a link: each skipped and said, the good files pulled, nothing
    written outside DIR, no link in it; a FIFO never blocks (the pull runs in a process of its own,
    with a time limit)."""
    job_folder = local_run(tmp_path / "share")
    results(job_folder)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_text("not the run's")
    plant_hostile(job_folder, outside)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = hpcjob_cli("pull", RUN, "--to", str(tmp_path / "here"))
    assert done.returncode == 0, done.stderr
    files = pulled(tmp_path / "here")
    assert files.keys() == {
        "checkpoints/checkpoint.pt", "logs/LOCAL1.out", "logs/LOCAL1.exit", "logs/metrics/LOCAL1-0.jsonl",
        "logs/a..b",
    }  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "here"])
    assert "secret" not in str(files) and b"root:" not in b"".join(files.values())
    warnings = [line for line in done.stderr.splitlines() if line.startswith("hpcjob: warning:")]
    assert sorted(warnings) == sorted(
        [
            "hpcjob: warning: logs/etc: not a regular file (a link, a FIFO, a device): not pulled",
            "hpcjob: warning: logs/fifo: not a regular file (a link, a FIFO, a device): not pulled",
            "hpcjob: warning: logs/line\\nbreak: a control character in its name: not pulled",
            "hpcjob: warning: logs/outside: not a regular file (a link, a FIFO, a device): not pulled",
            "hpcjob: warning: logs/passwd: not a regular file (a link, a FIFO, a device): not pulled",
            "hpcjob: warning: logs/zero: not a regular file (a link, a FIFO, a device): not pulled",
            "hpcjob: warning: logs/x\\..\\..\\escape: not a plain file name: not pulled",
            f"hpcjob: warning: outputs: {job_folder}/outputs/{RUN} cannot be listed: not a folder (a link, "
            "a file): not pulled",
        ]
    )
    assert done.stdout.endswith("; 0 unchanged, 8 skipped\n")


def test_a_planted_link_in_dir_is_replaced_never_written_through(tmp_path: Path) -> None:
    """A link already in DIR where a file comes (put there by anyone): the file takes its name, and
    what the link named is untouched."""
    results(local_run(tmp_path / "share"))
    target = tmp_path / "here"
    (target / "logs").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (target / "logs" / "LOCAL1.out").symlink_to(victim)
    (target / "checkpoints").symlink_to(tmp_path)  # a folder that is a link: nothing goes through it
    report = pull_run(RUN, target)
    assert victim.read_text() == "mine"
    assert (target / "logs/LOCAL1.out").read_bytes() == b"epoch 1\n"
    assert not (tmp_path / "checkpoint.pt").exists()
    assert report.skipped == (f"checkpoints: {target}/checkpoints is here and not a folder",)


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    unknown = hpcjob_cli("pull", "nope-1", "--to", str(tmp_path / "x"))
    assert (unknown.returncode, unknown.stderr) == (
        2,
        "hpcjob: error: pull nope-1: no such run in this machine's history (`hpcjob runs` lists them)\n",
    )
    local_run(tmp_path / "share")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for to in (a_file, a_file / "below"):
        done = hpcjob_cli("pull", RUN, "--to", str(to))
        assert (done.returncode, done.stderr) == (
            2,
            f"hpcjob: error: --to {to}: {a_file} is a file, not a folder\n",
        )
    inside = hpcjob_cli("pull", RUN, "--to", str(tmp_path / "share" / JOB_FOLDER / "logs" / RUN / "x"))
    assert inside.returncode == 2 and "inside the run's own folder" in inside.stderr
    assert a_file.read_text() == "" and not (tmp_path / "x").exists()
    # --pull needs a run that ends here; --pull-to a file is refused before anything starts.
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    no_wait = hpcjob_cli("submit", "--pull", "--node", "A", str(script))
    assert no_wait.returncode == 2 and no_wait.stderr.startswith("hpcjob: error: ")
    assert len(no_wait.stderr.splitlines()) == 1
    local = hpcjob_cli("run", "--local", "--pull-to", str(a_file), str(script))
    assert (local.returncode, local.stderr) == (
        2,
        f"hpcjob: error: --pull-to {a_file}: {a_file} is a file, not a folder\n",
    )


def test_the_cli_pulls_the_newest_run_by_default(tmp_path: Path) -> None:
    results(local_run(tmp_path / "share"))
    done = hpcjob_cli("pull", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"hpcjob: run {RUN}, the newest of this machine" in done.stderr
    assert done.stdout == (
        f"pulled run {RUN} into {tmp_path / RUN}: 6 file(s) copied, 301039 bytes; 0 unchanged\n"
    )


# --- a cluster's run, over SMB ----------------------------------------------------------------------


@pytest.fixture
def smb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, SmbServer]]:
    """A run of a cluster recorded as `submit` records it, its share served by a real smbd (no cluster
    profile: the SMB user and password from HPCJOB_SMB_USER/_PASSWORD): the job folder on disk."""
    require_testbed(tools=("smbd", "smbpasswd"))
    folder = tmp_path / "CcpSpoolDir" / "app"
    folder.mkdir(parents=True)
    with SmbServer(folder) as smb:
        job = cluster_spec(2)
        plan = make_plan(job, job.node_names, RUN)
        record = RunRecord.of(
            plan, job.job_folder, "rest", share="//HEADNODE/CcpSpoolDir/app", smb_server=smb.address,
            smb_port=smb.port, smb_user=smb.username, job_id="7",
        )  # fmt: skip
        save_run(record, plan=plan_json(plan))
        monkeypatch.setenv("HPCJOB_SMB_PASSWORD", smb.password)
        yield folder / job.job_folder, smb


def test_a_cluster_run_s_results_come_home_over_smb(tmp_path: Path, smb_run: tuple[Path, SmbServer]) -> None:
    """By its job id, over SMB; the second pull copies nothing. smbd itself hides a link out of the
    share, shows one within it as what it names (a folder reached twice is pulled once), and a FIFO as
    an empty file: none of them puts anything but a regular file here, or blocks."""
    job_folder, _ = smb_run
    files = results(job_folder)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plant_hostile(job_folder, outside)
    (job_folder / "logs" / RUN / "again").symlink_to("metrics")  # within the share: smbd follows it
    (job_folder / "logs" / RUN / "metrics" / "loop").symlink_to(".")
    said: list[str] = []
    started = time.monotonic()
    first = pull_run("7", tmp_path / "here", progress=said.append)
    took = time.monotonic() - started
    got = pulled(tmp_path / "here")
    good = expected(files)
    good.pop("outputs/model.pt"), good.pop("outputs/plots/loss.svg")  # its outputs folder is a link out
    assert {k: v for k, v in got.items() if k in good} == good
    # smbd's own views: a FIFO as an empty file, a link within the share as what it names, and names
    # Windows cannot hold (a backslash, a line break) mangled into 8.3 names (L4U1HB~C): plain files.
    extra = {name for name in set(got) - set(good) if "~" not in name.split("/")[-1]}
    assert extra == {"logs/fifo", "logs/a..b", "logs/again/LOCAL1-0.jsonl"}, extra
    assert got["logs/fifo"] == b"" and got["logs/again/LOCAL1-0.jsonl"] == b'{"event": "start"}\n'
    assert not any("loop" in name or "passwd" in name or "escape" in name for name in got)
    second = pull_run("7", tmp_path / "here")
    assert second.files_copied == 0 and second.files_unchanged == first.files_copied
    assert took < 20, said


# --- --pull on run: end to end ----------------------------------------------------------------------

SAVER = """\
import os, pathlib
for variable, name in (("HPCJOB_CHECKPOINT_DIR", "checkpoint.pt"), ("HPCJOB_OUTPUT_DIR", "model.pt")):
    folder = pathlib.Path(os.environ[variable])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"{name} of rank {os.environ['RANK']}")
print("saved")
"""


@pytest.mark.slow
def test_run_local_pull_brings_the_run_s_results_here(tmp_path: Path) -> None:
    """A script of one's own saves where HPCJOB_CHECKPOINT_DIR and HPCJOB_OUTPUT_DIR say; `run --local
    --pull-to DIR` ends with them, and the node's output, in DIR."""
    script = tmp_path / "code" / "save.py"
    script.parent.mkdir()
    script.write_text(SAVER)
    done = hpcjob_cli(
        "run", "--local", "--quiet", "--mount-point", str(tmp_path / "share"), "--run-id", "saver-1",
        "--pull-to", str(tmp_path / "results"), str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    got = pulled(tmp_path / "results")
    assert got["checkpoints/checkpoint.pt"] == b"checkpoint.pt of rank 0"
    assert got["outputs/model.pt"] == b"model.pt of rank 0"
    assert b"saved" in got["logs/LOCAL1.out"]
    assert done.stdout.splitlines()[-1].startswith(f"pulled run saver-1 into {tmp_path / 'results'}: ")


def test_a_pull_refuses_a_run_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such run"):
        pull_run("7", tmp_path)
