"""The job's shape (DESIGN.md, "The job it builds") and the torchrun line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcjob.job.plan import make_plan
from hpcjob.job.spec import JobSpec, SpecError, parse_share

from .conftest import RUN_ID, cluster_spec


def test_one_pinned_task_per_node_with_one_identical_command() -> None:
    plan = make_plan(cluster_spec(3), ("GPUNODE003", "GPUNODE001", "GPUNODE002"), RUN_ID)
    assert [t.node for t in plan.tasks] == ["GPUNODE003", "GPUNODE001", "GPUNODE002"]
    assert len({t.command_line for t in plan.tasks}) == 1
    assert plan.rdzv_endpoint == "GPUNODE003:29400"
    assert plan.world_size == 12
    for task in plan.tasks:
        assert task.work_directory == "/app/hpcjob/run_ddp"
        assert task.stdout_path == f"/app/hpcjob/run_ddp/logs/{RUN_ID}/{task.node}.out"
        assert task.stderr_path == f"/app/hpcjob/run_ddp/logs/{RUN_ID}/{task.node}.err"


def test_torchrun_line_rendezvous_and_store_host_decided_on_the_node() -> None:
    line = make_plan(cluster_spec(2), ("GPUNODE001", "GPUNODE002"), RUN_ID).command_line
    assert line.startswith(f". .hpcjob/node.sh GPUNODE001 {RUN_ID} && python3 -m torch.distributed.run ")
    for part in [
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=GPUNODE001:29400",
        f"--rdzv_id={RUN_ID}",
        "--rdzv_conf=is_host=$HPCJOB_IS_HOST",
        "--local_addr=$HPCJOB_ADDR",
        "--max_restarts=0",
    ]:
        assert f" {part} " in line
    assert line.endswith(
        " .hpcjob/worker.py run_ddp.py --epochs 5 --data fashion-mnist --data-root /app/data"
    )


def test_rendezvous_options_reach_the_line() -> None:
    spec = cluster_spec(1, rdzv_port=29555, rdzv_join_timeout=60, max_restarts=2, python="/opt/py/bin/python")
    line = make_plan(spec, ("GPUNODE001",), RUN_ID).command_line
    assert "--rdzv_endpoint=GPUNODE001:29555" in line
    assert "--rdzv_conf=is_host=$HPCJOB_IS_HOST,join_timeout=60" in line
    assert "--max_restarts=2" in line
    assert "&& /opt/py/bin/python -m torch.distributed.run" in line
    elastic = cluster_spec(3, min_nodes=2, max_restarts=1, rdzv_last_call=2, rdzv_keep_alive=1)
    line = make_plan(elastic, elastic.node_names, RUN_ID).command_line
    # Both names as torch's dynamic_rendezvous.create_handler reads them: a lost node dropped after 3 s.
    assert (
        "--rdzv_conf=is_host=$HPCJOB_IS_HOST,last_call_timeout=2,keep_alive_interval=1,"
        "keep_alive_max_attempt=3 " in line
    )


def test_mount_step_is_idempotent_root_work_without_a_password() -> None:
    plan = make_plan(cluster_spec(2), ("GPUNODE001", "GPUNODE002"), RUN_ID)
    assert plan.mount is not None
    assert plan.mount.nodes == ("GPUNODE001", "GPUNODE002")
    assert plan.mount.command == (
        "m=/app; mkdir -p $m && { mountpoint -q $m || mount -t cifs //HEADNODE/CcpSpoolDir/app $m "
        "-o vers=3.0,credentials=/etc/hpcjob/smb-credentials,dir_mode=0777,file_mode=0777; } "
        f"&& mkdir -p $m/hpcjob/run_ddp/logs/{RUN_ID}"
    )
    assert "pass" not in plan.mount.command.replace("mountpoint", "")


def test_no_share_means_no_mount_step() -> None:
    assert make_plan(cluster_spec(1, share=None), ("GPUNODE001",), RUN_ID).mount is None


def test_command_longer_than_the_limit_is_refused() -> None:
    spec = cluster_spec(2, script_args=("--note", "x" * 100))
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert len(plan.command_line) <= 480
    long = cluster_spec(2, script_args=("--note", "x" * 200))
    with pytest.raises(SpecError, match=r"is 5\d\d characters, more than the scheduler's limit of 480"):
        make_plan(long, long.node_names, RUN_ID)
    raised = cluster_spec(2, script_args=("--note", "x" * 200), command_limit=2000)
    assert make_plan(raised, raised.node_names, RUN_ID).command_limit == 2000


def test_chosen_nodes_must_fit_the_spec() -> None:
    with pytest.raises(SpecError, match="1 node"):
        make_plan(cluster_spec(2), ("GPUNODE001",), RUN_ID)
    with pytest.raises(SpecError, match="named twice"):
        make_plan(cluster_spec(2), ("GPUNODE001", "gpunode001"), RUN_ID)
    with pytest.raises(SpecError, match="run id"):
        make_plan(cluster_spec(1), ("GPUNODE001",), "bad id")


def test_backend_may_move_the_rendezvous_and_the_share() -> None:
    plan = make_plan(
        cluster_spec(2, share=None),
        ("LOCAL1", "LOCAL2"),
        RUN_ID,
        rdzv_host="127.0.0.1",
        mount_point="/tmp/share/",
    )
    assert plan.rdzv_endpoint == "127.0.0.1:29400"
    assert " .hpcjob/node.sh LOCAL1 " in plan.command_line
    assert plan.job_dir == "/tmp/share/hpcjob/run_ddp"


FAKE_MOUNT = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$(basename "$0")" != mountpoint ] || [ -n "$MOUNTED" ]
"""


@pytest.mark.parametrize("mounted", [False, True])
def test_mount_step_mounts_only_when_not_mounted_and_makes_the_log_folder(
    tmp_path: Path, mounted: bool
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mount", "mountpoint"):
        (bin_dir / name).write_text(FAKE_MOUNT)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "app"
    spec = cluster_spec(1, mount_point=str(root))
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert plan.mount is not None
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}
    if mounted:
        env["MOUNTED"] = "1"
    subprocess.run(["/bin/bash", "-c", plan.mount.command], env=env, check=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"mountpoint -q {root}"
    if mounted:
        assert calls == [f"mountpoint -q {root}"]
    else:
        assert calls[1] == (
            f"mount -t cifs //HEADNODE/CcpSpoolDir/app {root} -o vers=3.0,"
            "credentials=/etc/hpcjob/smb-credentials,dir_mode=0777,file_mode=0777"
        )
    assert (root / "hpcjob" / "run_ddp" / "logs" / RUN_ID).is_dir()


def test_mount_command_is_held_to_the_limit_too() -> None:
    # Where only REST reaches the cluster, the mount command becomes a task's CommandLine.
    spec = cluster_spec(1, mount_point="/" + "m" * 200, job_folder="j" * 150)
    with pytest.raises(SpecError, match=r"the mount command is \d+ characters, more than the scheduler"):
        make_plan(spec, spec.node_names, RUN_ID, mount_point=None)


def test_a_later_attempt_is_a_job_of_its_own_that_resumes_the_run_s_checkpoints() -> None:
    """Issue 33: each attempt of a run is a new HPC Pack job with its own name, rendezvous id and log
    folder (no attempt reads another's exit files, beats or dumps); all share the run's checkpoints."""
    spec = JobSpec(script="train.py", node_names=("N1", "N2"), share=parse_share("//H/CcpSpoolDir"))
    first = make_plan(spec, spec.node_names, RUN_ID)
    third = make_plan(spec, ("N3", "N2"), RUN_ID, attempt=3)
    assert (first.job_name, first.attempt, third.job_name, third.attempt) == (RUN_ID, 1, f"{RUN_ID}.3", 3)
    assert first.log_dir.endswith(f"/logs/{RUN_ID}") and third.log_dir == f"{first.log_dir}/3"
    assert f"--rdzv_id={RUN_ID} " in first.command_line and f"--rdzv_id={RUN_ID}.3 " in third.command_line
    assert f" .hpcjob/node.sh N3 {RUN_ID}/3 && " in third.command_line  # its tasks log into its folder
    assert {t.stdout_path.rsplit("/", 1)[0] for t in third.tasks} == {third.log_dir}
    first_env, third_env = dict(first.env), dict(third.env)
    assert (first_env["HPCJOB_ATTEMPT"], third_env["HPCJOB_ATTEMPT"]) == ("1", "3")
    assert third_env["HPCJOB_CHECKPOINT_DIR"] == first_env["HPCJOB_CHECKPOINT_DIR"]  # the run's own
    assert third_env["TORCH_FR_DUMP_TEMP_FILE"].startswith(f"{third.log_dir}/")  # its own dumps
    with pytest.raises(SpecError, match="attempts count from 1"):
        make_plan(spec, spec.node_names, RUN_ID, attempt=0)
