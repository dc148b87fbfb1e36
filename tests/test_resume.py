"""Numbers that are true: every run saves into a checkpoint folder of its own, starts from another run's only
when asked (`--resume-from RUN`, found in the run history), and a run that trained nothing says so in its
summary and its history, with no throughput of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcjob.cli import cli
from hpcjob.cli.tables import format_summary
from hpcjob.job.layout import CHECKPOINT_VAR, RESUME_VAR
from hpcjob.job.options import JobOptions
from hpcjob.job.plan import JobPlan, make_plan
from hpcjob.job.render import plan_json
from hpcjob.job.results import JobSummary, NodeResult, State, trained_nothing
from hpcjob.job.spec import JobSpec, SpecError
from hpcjob.runner import job_spec
from hpcjob.runner.resume import check_resume, resume_dir
from hpcjob.store.runs import RENDERED, RunRecord, history, record_end, save_run
from hpcjob.store.share import LocalFolder

from .conftest import REPO, RUN_ID, cluster_spec

TRAIN = REPO / "training" / "run_ddp.py"
UNC = "//HEADNODE/CcpSpoolDir/app"


def local_run(root: Path, run_id: str, **spec: object) -> JobPlan:
    """A local run of the training program recorded as `run --local` records it, its share at `root`."""
    job = JobSpec(script=str(TRAIN), nodes=1, **spec)  # type: ignore[arg-type]
    plan = make_plan(job, ["LOCAL1"], run_id, mount_point=str(root))
    save_run(RunRecord.of(plan, job.job_folder, "local", local_root=str(root)), plan=plan_json(plan))
    return plan


def cluster_run(run_id: str, share: str = UNC, **spec: object) -> JobPlan:
    job = cluster_spec(2, **spec)
    plan = make_plan(job, job.node_names, run_id)
    record = RunRecord.of(plan, job.job_folder, "rest", share=share, cluster="prod", job_id="7")
    save_run(record, plan=plan_json(plan))
    return plan


# --- where a run's checkpoints are, and a new run starts from ------------------------------------


def test_each_run_has_its_own_checkpoint_folder_and_resumes_only_when_asked(tmp_path: Path) -> None:
    first = dict(local_run(tmp_path, "first-1").env)
    second = dict(local_run(tmp_path, "second-1").env)
    assert first[CHECKPOINT_VAR] == f"{tmp_path}/hpcjob/run_ddp/checkpoints/first-1"
    assert second[CHECKPOINT_VAR] == f"{tmp_path}/hpcjob/run_ddp/checkpoints/second-1"
    assert RESUME_VAR not in first and RESUME_VAR not in second  # a new run starts fresh

    # Asked: the earlier run's folder, found through the history, as the new run's tasks get it.
    spec = job_spec(JobOptions(str(TRAIN), resume_from="first-1"), local=True)
    assert spec.resume_dir == first[CHECKPOINT_VAR]
    env = dict(make_plan(spec, ["LOCAL1"], "third-1", mount_point=str(tmp_path)).env)
    assert env[RESUME_VAR] == first[CHECKPOINT_VAR]
    assert env[CHECKPOINT_VAR] == f"{tmp_path}/hpcjob/run_ddp/checkpoints/third-1"  # its own, to save in
    # By its job id too (a local run's is its run id; a cluster's the scheduler's): cluster runs below.
    with pytest.raises(SpecError, match=f"--resume-from and --env {RESUME_VAR} both"):
        make_plan(replace(spec, env=((RESUME_VAR, "/x"),)), ["LOCAL1"], "fourth-1", mount_point=str(tmp_path))


def test_a_cluster_run_resumes_a_run_of_the_same_share_where_its_nodes_mount_it() -> None:
    plan = cluster_run(RUN_ID)
    assert dict(plan.env)[CHECKPOINT_VAR] == f"/app/hpcjob/run_ddp/checkpoints/{RUN_ID}"
    # The same share, mounted elsewhere by this run's nodes (a user's own folder of /app, say).
    found = resume_dir("7", local=False, share=UNC, mount_point="/app/alice")
    assert found == f"/app/alice/hpcjob/run_ddp/checkpoints/{RUN_ID}"
    options = JobOptions.read(
        {"script": str(TRAIN), "share": UNC, "mount_point": "/mnt/x", "resume_from": RUN_ID}
    )
    spec = job_spec(options)
    assert spec.resume_dir == f"/mnt/x/hpcjob/run_ddp/checkpoints/{RUN_ID}"
    with pytest.raises(
        SpecError, match=r"on //HEADNODE/CcpSpoolDir/app, and this one's on //OTHER/s: a run "
    ):
        resume_dir(RUN_ID, local=False, share="//OTHER/s", mount_point="/app")
    with pytest.raises(SpecError, match="not on this machine: a local run starts only from a run whose"):
        resume_dir(RUN_ID, local=True, share=None, mount_point="/app")


def test_resume_from_what_cannot_be_resumed_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as unknown:
        resume_dir("nope-1", local=True, share=None, mount_point="/app")
    assert (
        str(unknown.value)
        == "--resume-from nope-1: no such run in this machine's history (`hpcjob runs` lists them)"
    )
    local_run(tmp_path, "here-1")
    with pytest.raises(SpecError, match="that run's files are on this machine, and this one's on //HEADNODE"):
        resume_dir("here-1", local=False, share=UNC, mount_point="/app")
    job = JobSpec(script=str(TRAIN), node_names=("N1",), share=None)
    rendered = RunRecord.of(make_plan(job, ["N1"], "drawn-1"), job.job_folder, "manual", state=RENDERED)
    save_run(rendered)
    with pytest.raises(SpecError, match="only rendered; nothing ran under it"):
        resume_dir("drawn-1", local=False, share=None, mount_point="/app")


def test_where_an_older_or_a_redirected_run_kept_its_checkpoints(tmp_path: Path) -> None:
    # A run of an hpcjob before these folders: the training program's default was the job folder's, shared.
    plan = local_run(tmp_path, "old-1")
    legacy = json.loads(plan_json(plan))
    legacy["env"].pop(CHECKPOINT_VAR)
    save_run(RunRecord.of(plan, "hpcjob/run_ddp", "local", local_root=str(tmp_path)), plan=json.dumps(legacy))
    assert (
        resume_dir("old-1", local=True, share=None, mount_point="/")
        == f"{tmp_path}/hpcjob/run_ddp/checkpoints"
    )
    # Its --env named a folder: within the share, relative to the job folder, it is found; outside, refused.
    local_run(tmp_path, "mine-1", env=((CHECKPOINT_VAR, "ckpt/a"),))
    assert (
        resume_dir("mine-1", local=True, share=None, mount_point="/") == f"{tmp_path}/hpcjob/run_ddp/ckpt/a"
    )
    local_run(tmp_path, "away-1", env=((CHECKPOINT_VAR, "/scratch/ckpt"),))
    with pytest.raises(SpecError, match="its checkpoints are in /scratch/ckpt, outside its share: give the"):
        resume_dir("away-1", local=True, share=None, mount_point="/")


def test_a_run_that_saved_no_checkpoint_is_refused_before_anything_starts(tmp_path: Path) -> None:
    source = local_run(tmp_path, "empty-1")
    spec = job_spec(JobOptions(str(TRAIN), resume_from="empty-1"), local=True)
    plan = make_plan(spec, ["LOCAL1"], "next-1", mount_point=str(tmp_path))
    folder = Path(dict(source.env)[CHECKPOINT_VAR])
    with pytest.raises(SpecError) as missing:
        check_resume(spec, plan, LocalFolder(tmp_path), local=True)
    assert str(missing.value) == (
        f"--resume-from: no checkpoint in {folder}: that run saved none (it ended before its first, or "
        "trained nothing)"
    )
    folder.mkdir(parents=True)
    (folder / ".checkpoint.pt.123.tmp").write_bytes(b"")  # a writer's temporary file is no checkpoint
    with pytest.raises(SpecError, match="no checkpoint in"):
        check_resume(spec, plan, LocalFolder(tmp_path), local=True)
    (folder / "checkpoint.pt").write_bytes(b"x")
    check_resume(spec, plan, LocalFolder(tmp_path), local=True)
    # A local run of another project folder (another local share) is read where it is on this machine.
    elsewhere = make_plan(spec, ["LOCAL1"], "next-2", mount_point=str(tmp_path / "other"))
    check_resume(spec, elsewhere, LocalFolder(tmp_path / "other"), local=True)


# --- a run that trained nothing -----------------------------------------------------------------


NOTHING = {"epochs_completed": 3, "epochs_requested": 3, "epochs_trained": 0, "steps": 0,
           "resumed_from_epoch": 3, "world_size": 2, "wall_time_s": 0.01}  # fmt: skip
# What run_ddp.py before epochs_trained printed when it resumed at its last epoch: the first run's figures.
COPIED = {"epochs_completed": 3, "epochs_requested": 3, "resumed_from_epoch": 3, "samples_per_sec": 4857.0,
          "data_wait_fraction": 0.01, "accuracy": 0.979, "train_loss": 0.03, "test_loss": 0.09}  # fmt: skip
TRAINED = {"epochs_completed": 3, "epochs_trained": 3, "steps": 96, "resumed_from_epoch": 0,
           "samples_per_sec": 6700.0, "accuracy": 0.979}  # fmt: skip


@pytest.mark.parametrize(
    ("metrics", "nothing"),
    [
        (NOTHING, True),
        (COPIED, True),
        (TRAINED, False),
        ({**TRAINED, "epochs_trained": 1, "resumed_from_epoch": 2}, False),  # resumed, and trained
        ({"epochs_completed": 3, "resumed_from_epoch": 0, "samples_per_sec": 1.0}, False),  # older, fresh
        ({"accuracy": 0.5}, False),  # a script of one's own that says nothing of it
        (None, False),
    ],
)
def test_what_counts_as_trained_nothing(metrics: dict[str, object] | None, nothing: bool) -> None:
    assert trained_nothing(metrics) is nothing


def summary(run_id: str, metrics: dict[str, object]) -> JobSummary:
    return JobSummary(
        name="run_ddp",
        run_id=run_id,
        state=State.FINISHED,
        exit_code=0,
        wall_time_s=12.0,
        job_dir="/share/hpcjob/run_ddp",
        log_dir=f"/share/hpcjob/run_ddp/logs/{run_id}",
        nodes=[NodeResult("LOCAL1", State.FINISHED, 0), NodeResult("LOCAL2", State.FINISHED, 0)],
        metrics=dict(metrics),
    )


def test_a_run_that_trained_nothing_says_so_and_records_no_throughput() -> None:
    shown = format_summary(summary("n-1", NOTHING))
    assert (
        "  trained nothing: the checkpoint it resumed already covered 3 of 3 epoch(s); no samples/s\n"
        in shown
    )
    assert "samples_per_sec" not in shown
    # An older training program's copy of the first run's figures is never shown as the run's own.
    old = format_summary(summary("c-1", COPIED))
    assert "trained nothing" in old and "4857" not in old and "accuracy" not in old
    assert json.loads(summary("n-1", NOTHING).to_json())["trained_nothing"] is True
    assert "trained_nothing" not in json.loads(summary("t-1", TRAINED).to_json())

    for run_id, metrics in (("t-1", TRAINED), ("n-1", NOTHING), ("c-1", COPIED)):
        save_run(RunRecord(run_id, "run_ddp", "local", "hpcjob/run_ddp", ("LOCAL1", "LOCAL2")))
        record_end(summary(run_id, metrics))
    throughput = {entry.record.run_id: entry.samples_per_sec for entry in history()}
    assert throughput == {"t-1": 6700.0, "n-1": None, "c-1": None}
    listed = CliRunner().invoke(cli, ["runs", "--json"])
    assert {e["run_id"]: e["samples_per_sec"] for e in json.loads(listed.output)} == throughput
    table = CliRunner().invoke(cli, ["runs"]).output.splitlines()
    column = table[0].index("SAMPLES/S")
    assert {line.split()[0]: line[column:].split()[0] for line in table[1:]} == {
        "t-1": "6700",
        "n-1": "-",
        "c-1": "-",
    }


# --- end to end: three local runs of the quick start's program --------------------------------------

TINY = ["--epochs", "1", "--train-samples", "256", "--test-samples", "64", "--batch-size", "32",
        "--max-steps-per-epoch", "3", "--metrics-every", "0", "--gpu-report-every", "0"]  # fmt: skip


def run_here(share: Path, run_id: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--json", "--quiet",
         "--mount-point", str(share), "--run-id", run_id, "-n", "2", *args, str(TRAIN), *TINY],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.slow
def test_a_second_run_trains_and_a_resumed_one_that_has_nothing_left_says_so(tmp_path: Path) -> None:
    first = run_here(tmp_path, "e2e-first-1")["metrics"]
    second = run_here(tmp_path, "e2e-second-1")["metrics"]
    assert isinstance(first, dict) and isinstance(second, dict)
    for metrics in (first, second):  # each trained, and measured its own throughput
        assert metrics["epochs_trained"] == 1 and metrics["steps"] == 3 and metrics["resumed_from_epoch"] == 0
        assert metrics["samples_per_sec"] > 0  # type: ignore[operator]
    checkpoints = tmp_path / "hpcjob" / "run_ddp" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["e2e-first-1", "e2e-second-1"]

    third = run_here(tmp_path, "e2e-third-1", "--resume-from", "e2e-first-1")
    metrics = third["metrics"]
    assert isinstance(metrics, dict) and third["trained_nothing"] is True
    assert metrics["resumed_from"] == str(checkpoints / "e2e-first-1" / "step-000000003")
    assert (metrics["epochs_trained"], metrics["steps"], metrics["resumed_from_epoch"]) == (0, 0, 1)
    assert "samples_per_sec" not in metrics and "accuracy" not in metrics
    shown = CliRunner().invoke(cli, ["runs", "show", "e2e-third-1"]).output
    assert "trained nothing: the checkpoint it resumed already covered 1 of 1 epoch(s); no samples/s" in shown
    [entry] = [e for e in history() if e.record.run_id == "e2e-third-1"]
    assert entry.samples_per_sec is None
