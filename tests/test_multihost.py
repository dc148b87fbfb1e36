"""The generated job on real separate hosts, with code and logs on a real SMB share.

Each host runs a task's CommandLine taken byte for byte from the job XML, as HPC Pack's Linux agent
does (`cmd.sh` run by /bin/bash in the WorkDirectory, stdout/stderr to the task's files, CCP_JOBID,
CCP_TASKID and CCP_NODES set). Host names are lower case, HPC Pack node names upper case, and each
host's own name resolves to 127.0.1.1. The client reaches the share over SMB only.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO
from .testbed import TestBed, require_testbed
from .testbed.agent import kill_node_processes, start_job

pytestmark = pytest.mark.slow
TRAIN = REPO / "training" / "run_ddp.py"
SMALL = ["--train-samples", "1024", "--test-samples", "256", "--batch-size", "32"]


@pytest.fixture
def bed() -> Iterator[TestBed]:
    require_testbed()
    with TestBed(("node1", "node2")) as testbed:
        yield testbed


def client_env(bed: TestBed) -> dict[str, str]:
    assert bed.smb is not None
    return {**os.environ, "HPCJOB_SMB_USER": bed.smb.username, "HPCJOB_SMB_PASSWORD": bed.smb.password}


def render_and_upload(
    bed: TestBed,
    run_id: str,
    *script_args: str,
    nodes: tuple[str, ...] = ("--node", "NODE1", "--node", "NODE2"),
    script: Path = TRAIN,
    options: tuple[str, ...] = (),
) -> ET.Element:
    """`hpcjob render --upload`: the job XML, with training/ sent to the share over SMB."""
    assert bed.smb is not None
    command = [
        sys.executable,
        "-m",
        "hpcjob.cli",
        "render",
        "--upload",
        "--share",
        bed.share_unc,
        "--smb-server",
        bed.smb.address,
        "--smb-port",
        str(bed.smb.port),
        *nodes,
        "--rdzv-timeout",
        "60",
        "--run-id",
        run_id,
        *options,
        str(script),
        *script_args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=client_env(bed), timeout=120)
    assert result.returncode == 0, result.stderr
    assert bed.smb.password not in result.stdout + result.stderr
    return ET.fromstring(result.stdout.encode())


def wait_all(processes: list[subprocess.Popen[str]], log_dir: Path, timeout: float) -> list[int]:
    """The tasks' exit codes; on a hang, kill them and fail with what their logs say."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in processes]
    except subprocess.TimeoutExpired:
        for node in ("NODE1", "NODE2"):
            kill_node_processes(node, log_dir.name)
        logs = {f.name: f.read_text()[-2000:] for f in sorted(log_dir.glob("*")) if f.is_file()}
        pytest.fail(f"the tasks did not end within {timeout} s: {logs}")


def test_the_job_runs_across_hosts_with_code_and_logs_on_the_share(bed: TestBed, tmp_path: Path) -> None:
    run_id = "multihost-1"
    job = render_and_upload(bed, run_id, "--epochs", "2", *SMALL)
    job_dir = bed.share_folder / "hpcjob" / getpass.getuser() / "run_ddp"  # render's owner: this machine's
    assert (job_dir / "run_ddp.py").is_file() and (job_dir / ".hpcjob" / "node.sh").is_file()
    processes = start_job(bed, job, "101", tmp_path)
    codes = wait_all(processes, job_dir / "logs" / run_id, 240)
    err = {n: (job_dir / "logs" / run_id / f"{n}.err").read_text() for n in ("NODE1", "NODE2")}
    assert codes == [0, 0], err
    assert "NODE1 hosts the rendezvous, at " in err["NODE1"] and "NODE2 joins from " in err["NODE2"]
    assert f"joins from {bed['node2'].address} (eth0)" in err["NODE2"]  # not 127.0.1.1
    assert list((job_dir / "checkpoints" / run_id).glob("step-*/.hpcjob-complete"))  # the run's own folder
    assert (job_dir / "logs" / run_id / "NODE1.exit").read_text().split()[0] == "0"  # and its end time

    logs = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "logs", run_id, "--follow"],
        capture_output=True,
        text=True,
        env=client_env(bed),
        timeout=120,
    )
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert "[NODE1] epoch 2/2" in "\n".join(lines) or "[NODE2] epoch 2/2" in "\n".join(lines)
    assert sum(line.startswith(("[NODE1] HPCJOB_METRICS", "[NODE2] HPCJOB_METRICS")) for line in lines) == 1
    assert any(line.startswith("[NODE2 err] hpcjob: NODE2 joins from ") for line in lines)


def test_a_dead_host_ends_the_other_task_instead_of_hanging(bed: TestBed, tmp_path: Path) -> None:
    run_id = "multihost-kill-1"
    job = render_and_upload(
        bed, run_id, "--epochs", "50", "--step-sleep", "0.02", "--pg-timeout", "60", *SMALL
    )
    processes = start_job(bed, job, "102", tmp_path)
    out = bed.share_folder / "hpcjob" / getpass.getuser() / "run_ddp" / "logs" / run_id
    deadline = time.monotonic() + 180
    while (
        "epoch 1/50" not in "".join(p.read_text() for p in out.glob("*.out")) and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert kill_node_processes("NODE1", run_id) > 0
    start = time.monotonic()
    codes = wait_all(processes, out, 120)
    assert codes[1] != 0
    assert time.monotonic() - start < 90  # within the rendezvous/process-group timeouts, not hung


def test_a_trainer_reads_its_batches_from_a_data_node_on_another_host(bed: TestBed, tmp_path: Path) -> None:
    """One job of a trainer on node1 and a data node on node2 (issue 34): the data node serves on its
    own address (eth0, as the node helper picks it), published on the share; the trainer trains from
    it across hosts; both tasks exit 0."""
    run_id = "multihost-data-1"
    job = render_and_upload(
        bed, run_id, "--epochs", "2", *SMALL, nodes=("--node", "NODE1", "--data-node", "NODE2")
    )
    processes = start_job(bed, job, "103", tmp_path)
    out = bed.share_folder / "hpcjob" / getpass.getuser() / "run_ddp" / "logs" / run_id
    codes = wait_all(processes, out, 240)
    logs = {n: (out / f"{n}.out").read_text() + (out / f"{n}.err").read_text() for n in ("NODE1", "NODE2")}
    assert codes == [0, 0], logs
    assert f"data node NODE2: serving ranks 0 at {bed['node2'].address}:29600" in logs["NODE2"]
    metrics = next(line for line in logs["NODE1"].splitlines() if line.startswith("HPCJOB_METRICS "))
    served = json.loads(metrics.removeprefix("HPCJOB_METRICS "))["data_node_stats"]
    assert [(s["node"], s["samples"]) for s in served] == [("NODE2", 2048)]


def test_each_host_copies_a_dataset_from_the_share_onto_its_own_disk_once(
    bed: TestBed, tmp_path: Path
) -> None:
    """`--dataset` of a share folder: each host's task copies it over SMB onto its own local folder before
    the program starts, both hold identical bytes, and a second job reads nothing from the share."""
    from .test_datasets import SHOW

    source = bed.share_folder / "datasets" / "tiny"
    (source / "sub").mkdir(parents=True)
    blob = os.urandom(200_000)
    (source / "a.bin").write_bytes(blob)
    (source / "sub" / "b.txt").write_text("hello\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.py").write_text(SHOW)
    said = []
    for number, run_id in enumerate(("multihost-ds-1", "multihost-ds-2")):
        job = render_and_upload(bed, run_id, script=code / "show.py", options=("--dataset", "datasets/tiny"))
        processes = start_job(bed, job, str(110 + number), tmp_path / run_id)
        logs = bed.share_folder / "hpcjob" / getpass.getuser() / "show" / "logs" / run_id
        codes = wait_all(processes, logs, 120)
        out = {n: (logs / f"{n}.out").read_text() for n in ("NODE1", "NODE2")}
        err = {n: (logs / f"{n}.err").read_text() for n in ("NODE1", "NODE2")}
        assert codes == [0, 0], err
        held = {
            n: sorted(line.split()[2:] for line in out[n].splitlines() if line.startswith("HAS "))
            for n in out
        }
        wanted = [
            ["tiny/a.bin", hashlib.sha256(blob).hexdigest()],
            ["tiny/sub/b.txt", hashlib.sha256(b"hello\n").hexdigest()],
        ]
        assert held["NODE1"] == held["NODE2"] == wanted
        said.append(err)
    for node in ("NODE1", "NODE2"):  # each host copied it once, and kept it: the second job read nothing
        assert f"dataset tiny on {node}: 200.0 KB from the source, 0 bytes from" in said[0][node]
        assert f"dataset tiny on {node}: 0 bytes from the source, 200.0 KB from the node's" in said[1][node]
