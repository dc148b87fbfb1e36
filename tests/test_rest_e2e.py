"""`hpcjob submit/status/cancel/logs` end to end against the local HPC Pack head node (the emulator).

The code goes to a real smbd over SMB; the emulator's nodes run the tasks as local processes, where
the share's folder is "mounted" at the mount point (a bind mount onto itself, so that the mount step's
`mountpoint -q` finds it mounted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcjob.backends.local import free_port
from hpcjob.backends.rest import RestClient, wait_for_job
from hpcjob.emulator import HeadNode
from hpcjob.job.plan import make_plan
from hpcjob.job.render import job_xml
from hpcjob.job.spec import JobSpec

from .conftest import POLL_S, REPO, empty_script, stand_in_python
from .testbed import SmbServer, require_testbed

pytestmark = pytest.mark.slow
TRAIN = REPO / "training" / "run_ddp.py"
SMALL = ["--train-samples", "512", "--test-samples", "256", "--batch-size", "32"]
PASSWORD = "emu-Pw-1"


@dataclass
class Cluster:
    head: HeadNode
    smb: SmbServer
    share_dir: Path
    mount_point: Path
    env: dict[str, str]

    def hpcjob(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def submit(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        # The nodes are processes of this machine: their python is ours, their interface loopback.
        job = ["--python", sys.executable, "--rdzv-port", str(free_port()), "--env", "HPCJOB_IFNAME=lo"]
        return self.hpcjob("submit", *job, *args, timeout=timeout)

    def leftovers(self) -> list[int]:
        return list(self.head.live_processes())


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from emulated_cluster(tmp_path)


def emulated_cluster(
    tmp_path: Path, filter_nodes: tuple[str, ...] = ("LOCALHOST", "NODE002", "NODE003"), **head_options: Any
) -> Iterator[Cluster]:
    """The head node (both front doors, nodes from this process's environment; `head_options` for
    HeadNode), a real smbd, alice's profile, and hpcjob's filter on `filter_nodes`."""
    require_testbed(tools=("smbd", "smbpasswd", "mount", "umount", "mountpoint"))
    share_dir = tmp_path / "CcpSpoolDir" / "app"
    share_dir.mkdir(parents=True)
    # Where alice's jobs see the share on the nodes (hpcjob's filter mounts it at MOUNT ROOT/alice):
    # bind-mounted here, so that the filter finds it mounted.
    mount_point = tmp_path / "mnt" / "alice"
    mount_point.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(share_dir), str(mount_point)], check=True)
    try:
        head_node = HeadNode(users={"alice": PASSWORD}, grace_period=3.0, **head_options)
        with head_node as head, SmbServer(share_dir) as smb:
            env = {
                **os.environ,
                "HPCJOB_CONFIG": str(tmp_path / "clusters.toml"),
                "EMU_PW": PASSWORD,
                "HPCJOB_SMB_PASSWORD": smb.password,
            }
            env.pop("HPCJOB_CLUSTER", None)
            cluster = Cluster(head, smb, share_dir, mount_point, env)
            added = cluster.hpcjob(
                "cluster",
                "add",
                "emu",
                "--url",
                head.url,
                "--user",
                "alice",
                "--password-env",
                "EMU_PW",
                "--ca-bundle",
                head.ca_file,
                "--share",
                "//HEADNODE/CcpSpoolDir/app",
                "--smb-user",
                smb.username,
                "--smb-server",
                smb.address,
                "--smb-port",
                str(smb.port),
                "--mount-point",
                str(mount_point),
                "--node-group",
                "GPUNodes",
                "--winrm-url",  # for --backend winrm: the same head node's other front door
                head.wsman_url,
                "--poll-interval",
                str(POLL_S),
            )
            assert added.returncode == 0, added.stderr
            # hpcjob's execution filter on every node, once (alice is an administrator): the mount job of
            # each submit has it mount the share (bind-mounted here already: "already mounted").
            nodes = [f"--node={n}" for n in filter_nodes]
            installed = cluster.hpcjob("mount", "--install", "--backend", "winrm", *nodes)
            assert installed.returncode == 0, installed.stderr
            # and hpcjob/ on the share made the administrator's, each user's folder theirs (issue 31)
            assert "hpcjob/ on the share is an administrator's" in installed.stderr, installed.stderr
            yield cluster
            assert cluster.leftovers() == []
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


# The nodes' Python in the command line's tests: rank 0's metrics line on the store host, a line on stderr
# from each node. What a real training job does on the emulated cluster: tests/test_api.py.
REPORTING = (
    '[ "$HPCJOB_IS_HOST" = 1 ] && echo \'HPCJOB_METRICS {"epochs_completed": 2}\'; '
    'echo "rank of $HPCJOB_NODE" >&2'
)


@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_submit_wait_prints_the_summary_its_progress_and_then_logs_and_status(
    cluster: Cluster, backend: str, tmp_path: Path
) -> None:
    """The command line's side of `submit --wait` over either front door: what it prints of the mount
    job, the nodes and the summary, then `logs` and `status` of the job it made (nothing secret)."""
    python = stand_in_python(tmp_path, REPORTING)
    shells = cluster.head.wsman.shells_created  # the fixture's mount --install had one
    result = cluster.hpcjob(
        "submit", "--backend", backend, "--wait", "--json", "-n", "2", "--python", str(python),
        "--rdzv-port", str(free_port()), str(empty_script(tmp_path)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert PASSWORD not in result.stdout + result.stderr and cluster.smb.password not in result.stderr
    status = json.loads(result.stdout)  # the summary `run --local --json` prints, and the job id
    assert (status["state"], status["exit_code"], status["root_cause"]) == ("Finished", 0, None)
    assert [(n["node"], n["state"], n["exit_code"]) for n in status["nodes"]] == [
        ("LOCALHOST", "Finished", 0),
        ("NODE002", "Finished", 0),
    ]
    assert status["metrics"] == {"epochs_completed": 2}
    assert f"mounting the share at {cluster.mount_point} on the nodes" in result.stderr
    assert "NODE002: Finished (exit code 0)" in result.stderr  # a job this short may end between polls
    # WinRM: one shell for the submit and its wait; REST: none.
    assert cluster.head.wsman.shells_created == shells + (backend == "winrm")
    job_id = str(status["job_id"])
    logs = cluster.hpcjob("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert "[NODE002 err] rank of NODE002" in logs.stdout and "[LOCALHOST] HPCJOB_METRICS" in logs.stdout
    assert "[NODE002 err] hpcjob: NODE002 joins from " in logs.stdout
    shown = cluster.hpcjob("status", job_id)
    assert shown.stdout.startswith(f"job {job_id} (train-") and "Finished, exit code 0" in shown.stdout


def test_run_without_local_is_submit_wait_on_the_default_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """... and with --pull-to, the run's logs come home over SMB as the profile reaches the share."""
    python = stand_in_python(tmp_path, REPORTING)
    result = cluster.hpcjob(
        "run", "--json", "-n", "1", "--python", str(python), "--rdzv-port", str(free_port()),
        "--pull-to", str(tmp_path / "results"), str(empty_script(tmp_path)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["state"], summary["exit_code"]) == ("Finished", 0) and summary["job_id"]
    assert f"mounting the share at {cluster.mount_point} on the nodes" in result.stderr
    assert "HPCJOB_METRICS" in (tmp_path / "results" / "logs" / "LOCALHOST.out").read_text()
    assert f"pulled run {summary['run_id']} into {tmp_path / 'results'}: " in result.stderr
    assert cluster.smb.password not in result.stderr


def test_an_elastic_job_goes_on_when_a_node_becomes_unreachable(cluster: Cluster) -> None:
    """`--min-nodes 2` of 3: mid-epoch 2 the head node loses NODE003 (health Error: its task is killed and
    fails); the other two re-form and finish from epoch 1's save, and the summary says so, although
    the scheduler saw a task fail (FailOnTaskFailure is off). Over REST: the WinRM front door takes the
    same job file (`test_an_elastic_job_file_reaches_the_scheduler_through_winrm_as_written`)."""
    run_id = "elastic-rest"
    job = subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", "submit", "--backend", "rest", "--wait", "--json", "-n", "3",
         "--min-nodes", "2", "--max-restarts", "2", "--rdzv-last-call", "2", "--rdzv-keep-alive", "1",
         "--run-id", run_id,
         "--python", sys.executable, "--rdzv-port", str(free_port()), "--env", "HPCJOB_IFNAME=lo",
         str(TRAIN), "--epochs", "3", "--train-samples", "1200", "--batch-size", "40", "--step-sleep", "0.05",
         "--metrics-every", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    timeline = (
        cluster.share_dir / "hpcjob" / "alice" / "run_ddp" / "logs" / run_id / "metrics" / "NODE003-0.jsonl"
    )
    saves = cluster.share_dir / "hpcjob" / "alice" / "run_ddp" / "checkpoints" / run_id
    deadline = time.monotonic() + 180
    while not (  # in epoch 2, the save of epoch 1 complete (it is written in the background)
        timeline.is_file()
        and any(json.loads(line).get("epoch") == 2 for line in timeline.open())
        and any(saves.glob("step-*/.hpcjob-complete"))
    ):
        assert time.monotonic() < deadline and job.poll() is None, job.communicate()
        time.sleep(0.1)
    cluster.head.set_node("NODE003", health="Error")
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Finished" and summary["root_cause"] is None
    assert [(n["node"], n["state"]) for n in summary["nodes"]][2] == ("NODE003", "Failed")
    [event] = summary["events"]
    assert (
        event.startswith("NODE003 lost at epoch 2, step ")
        and event.endswith(" save (epoch 1)")
        and "; continued on 2 node(s) from the step-" in event
    ), event
    assert summary["metrics"]["epochs_completed"] == 3 and summary["metrics"]["resumed_from_epoch"] == 1
    cluster.head.set_node("NODE003", health="OK")


def test_an_elastic_job_file_reaches_the_scheduler_through_winrm_as_written(
    cluster: Cluster, tmp_path: Path
) -> None:
    """WinRM submits the job file (`job submit /jobfile:`): the scheduler gets an elastic job as one, with
    FailOnTaskFailure off and a task per node (the job's run itself: the REST test above)."""
    python = stand_in_python(tmp_path, "exit 0")
    result = cluster.hpcjob(
        "submit", "--backend", "winrm", "--json", "--no-mount-step", "-n", "3", "--min-nodes", "2",
        "--max-restarts", "1", "--python", str(python), str(empty_script(tmp_path)),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    job_id = int(json.loads(result.stdout)["job_id"])
    with cluster.head.cluster.lock:
        job = cluster.head.cluster.job(job_id)
        assert not job.flag("FailOnTaskFailure") and len(job.tasks) == 3
    assert cluster.head.wait_job(job_id) == "Finished"


FAILING = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    sys.exit(3)
dist.all_reduce(t)
time.sleep(600)
"""


def test_a_failing_rank_fails_the_job_with_its_code_and_stops_the_other(
    cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "code" / "fail.py"
    script.parent.mkdir()
    script.write_text(FAILING)
    result = cluster.submit("--wait", "--json", "--no-mount-step", "-n", "2", str(script), timeout=180)
    assert result.returncode == 3, result.stderr[-3000:]
    status = json.loads(result.stdout)
    assert status["state"] == "Failed" and status["exit_code"] == 3
    assert sorted(n["state"] for n in status["nodes"]) in (["Canceled", "Failed"], ["Failed", "Failed"])
    cause = status["root_cause"]
    assert (cause["rank"], cause["exit_code"], cause["signal"]) == (1, 3, None)


def test_cancel_stops_a_running_job_and_is_idempotent(cluster: Cluster) -> None:
    result = cluster.submit(
        "--no-mount-step", "-n", "2", str(TRAIN), "--epochs", "100", "--step-sleep", "0.05", *SMALL
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    deadline = time.monotonic() + 60
    while json.loads(cluster.hpcjob("status", job_id, "--json").stdout)["state"] != "Running":
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.5)
    canceled = cluster.hpcjob("cancel", job_id)
    assert canceled.returncode == 0 and canceled.stdout.strip() == f"job {job_id} canceled"
    deadline = time.monotonic() + 30
    while (state := json.loads(cluster.hpcjob("status", job_id, "--json").stdout)["state"]) != "Canceled":
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert cluster.leftovers() == []
    again = cluster.hpcjob("cancel", job_id)
    assert again.returncode == 0 and again.stdout.strip() == f"job {job_id} had already ended (Canceled)"


def test_too_few_nodes_and_bad_credentials_are_one_line(cluster: Cluster) -> None:
    cluster.head.set_node("NODE003", state="Offline")
    few = cluster.submit("-n", "3", str(TRAIN))
    assert few.returncode == 2
    assert few.stderr.strip() == (
        "hpcjob: error: 3 node(s) needed but only 2 online, healthy and not excluded in group GPUNodes; "
        "found: LOCALHOST (Online, OK), NODE002 (Online, OK), NODE003 (Offline, OK)"
    )
    cluster.env["EMU_PW"] = "wrong"
    refused = cluster.hpcjob("nodes")
    assert refused.returncode == 1
    assert refused.stderr.strip().startswith(
        "hpcjob: error: the head node refused the credentials of alice (HTTP 401)"
    )


def test_dry_run_sends_nothing(cluster: Cluster) -> None:
    result = cluster.hpcjob("submit", "--dry-run", "--node", "LOCALHOST", "--node", "NODE002", str(TRAIN))
    assert result.returncode == 0, result.stderr
    mount, job = result.stdout.split("# would create and submit the job:\n")
    assert mount.startswith("# would upload ") and "# would mount the share on the nodes first" in mount
    assert job.startswith('<?xml version="1.0"') and 'Name="run_ddp-' in job
    assert len(cluster.head.requests) == 0


def test_a_lost_answer_to_create_does_not_make_two_jobs(cluster: Cluster) -> None:
    client = RestClient(cluster.head.url, "alice", PASSWORD, verify=cluster.head.ca_file)
    spec = JobSpec(script=str(TRAIN), node_names=("LOCALHOST",))
    plan = make_plan(spec, spec.node_names, "lost-answer-1")
    fault = cluster.head.inject(method="POST", path=r"/jobs/jobFile$", drop="after", times=1)
    job_id = client.create_job(job_xml(plan), plan.run_id)
    assert fault.hits == 1
    assert client.find_job(plan.run_id) == job_id
    assert cluster.head.requests.count("POST", r"/jobs/jobFile$") == 1
    client.cancel(job_id, "test")


def test_logs_fall_back_to_the_schedulers_output_without_the_share(cluster: Cluster, tmp_path: Path) -> None:
    # The nodes do not have the share where the job expects it: each task fails at `cd`.
    missing = tmp_path / "not-mounted"
    result = cluster.submit("--wait", "--no-mount-step", "--mount-point", str(missing), "-n", "2", str(TRAIN))
    assert result.returncode != 0
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    cluster.env["HPCJOB_SMB_PASSWORD"] = "not-the-password"  # the share cannot be reached now
    logs = cluster.hpcjob("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert (
        "showing the scheduler's copy of each task's output, which holds only its first 1500 bytes"
        in logs.stderr
    )
    assert "[LOCALHOST] " in logs.stdout and "No such file or directory" in logs.stdout
    assert str(missing) in logs.stdout
    # The first failure first, as this machine's history has it (issue 39), then every line.
    first, nodes = logs.stdout.split("\n", 1)
    assert first.startswith("first failure: the task on LOCALHOST, exit code 1: ") and str(missing) in first
    # A job this machine did not submit (no record here): the scheduler's copy, and why.
    cluster.env["XDG_STATE_HOME"] = str(tmp_path / "another-machine")
    elsewhere = cluster.hpcjob("logs", job_id)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert f"job {job_id} was not submitted from this machine" in elsewhere.stderr
    assert elsewhere.stdout == nodes  # no history there: no first failure


def test_the_readme_flow_by_hand_runs_on_the_head_node(cluster: Cluster, tmp_path: Path) -> None:
    """docs/render.md: upload and render the job file, render the mount step
    in a second call, submit the file on the head node (`job submit /jobfile:`; here its REST twin). The
    nodes' Python a stand-in that finds the uploaded code in the job's folder and says what torchrun would
    be given (the job files `submit` renders the same way train for real: tests/test_api.py)."""
    found = 'for f in .hpcjob/node.sh .hpcjob/worker.py run_ddp.py; do [ -f "$f" ] || exit 1; done'
    python = stand_in_python(tmp_path, f'{found}; echo "the code is here: $*"')
    smb = ["--smb-user", cluster.smb.username, "--smb-server", cluster.smb.address]
    job = ["--node", "LOCALHOST", "--node", "NODE002", "--share", "//HEADNODE/CcpSpoolDir/app"]
    job += ["--mount-point", str(cluster.share_dir), "--python", str(python), "--env", "HPCJOB_IFNAME=lo"]
    job += ["--rdzv-port", str(free_port()), str(TRAIN), "--epochs", "1", *SMALL]
    uploaded = cluster.hpcjob("render", "--upload", *smb, "--smb-port", str(cluster.smb.port), *job)
    assert uploaded.returncode == 0, uploaded.stderr
    mount = cluster.hpcjob("render", "--format", "clusrun", *job)
    assert mount.returncode == 0, mount.stderr
    run_id = ET.fromstring(uploaded.stdout.encode()).get("Name")
    assert f"hpcjob: run {run_id}: sent " in uploaded.stderr
    assert f"/logs/{run_id}'" in mount.stdout or f'/logs/{run_id}"' in mount.stdout
    # On the head node: the job file as it is.
    client = RestClient(cluster.head.url, "alice", PASSWORD, verify=cluster.head.ca_file)
    job_id = client.create_job(uploaded.stdout, str(run_id))
    client.submit(job_id)
    assert (
        wait_for_job(client, job_id, lambda line: None, sleep=lambda s: time.sleep(0.5)).state == "Finished"
    )
    logs = cluster.hpcjob("logs", str(run_id))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.count("the code is here: ") == 2, logs.stdout
    assert logs.stdout.count(" .hpcjob/worker.py run_ddp.py --epochs 1 --train-samples 512 ") == 2


def test_the_job_s_environment_is_built_on_the_share_through_either_front_door(
    cluster: Cluster, tmp_path: Path
) -> None:
    """--requirements through REST builds the environment once on the share (a real pip install from a
    local wheelhouse); the same requirements through WinRM find it built and install nothing."""
    from .test_env import make_wheel, requirements

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinya", "1.0", "VALUE = 'a1'\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import os, tinya\nprint('rank', os.environ['RANK'], tinya.VALUE)\n")
    (code / "reqs.txt").write_text(requirements(wheels, "tinya==1.0"))
    for backend, said in (("rest", "building environment"), ("winrm", "built before")):
        result = cluster.submit(
            "--backend", backend, "--wait", "--json", "-n", "2", "--requirements", str(code / "reqs.txt"),
            "--env-on", "share", str(code / "train.py"),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        status = json.loads(result.stdout)
        logs = cluster.hpcjob("logs", str(status["job_id"]))
        # each rank's line, whole: an environment's key (a hash) may begin with "a1" too
        ranks = [line for line in logs.stdout.splitlines() if line.endswith((" rank 0 a1", " rank 1 a1"))]
        assert len(ranks) == 2, logs.stdout[-3000:]
        assert said in logs.stdout, logs.stdout[-3000:]
    complete = list((cluster.share_dir / "hpcjob" / "alice" / "envs").glob("*/*.ready"))
    assert len(complete) == 1 and json.loads(complete[0].read_text())["node"] in ("LOCALHOST", "NODE002")
