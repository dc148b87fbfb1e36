"""The Python API (hpcjob.submit, Run, list_runs, render_job): a run's life from Python, through the local
backend and through both front doors of the emulated head node, with no CliRunner and no printing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hpcjob
from hpcjob.backends.local import free_port
from hpcjob.backends.local.procs import marked_processes
from hpcjob.runner import ClusterAccess

from .conftest import empty_script, stand_in_python
from .test_rest_e2e import PASSWORD, SMALL, TRAIN, Cluster


def test_a_local_run_from_python_submits_waits_reads_its_logs_and_is_found_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = stand_in_python(tmp_path, 'echo "rank of $CCP_NODES"; echo "to stderr" >&2')
    said: list[str] = []
    run = hpcjob.submit(empty_script(tmp_path), nodes=2, python=str(python), progress=said.append)
    assert run.job_id == run.run_id  # a local run's job is its run
    summary = run.wait(progress=said.append)
    assert (summary.state, summary.exit_code, [n.state for n in summary.nodes]) == (
        "Finished",
        0,
        ["Finished"] * 2,
    )
    assert run.summary is summary and "LOCAL2: Finished (exit code 0)" in said  # the job's own progress
    lines = list(run.logs())
    assert ("LOCAL1", "stdout", "rank of 1 LOCAL1 2") in lines and ("LOCAL2", "stderr", "to stderr") in lines
    assert [node for node, _, _ in lines] == sorted(node for node, _, _ in lines)  # node order
    assert {node for node, _, _ in run.logs(node="local2")} == {"LOCAL2"}
    with pytest.raises(hpcjob.SpecError, match=r"has no node 'LOCAL3'; its nodes: LOCAL1, LOCAL2$"):
        list(run.logs(node="LOCAL3"))
    found = hpcjob.Run.find(run.run_id)
    assert found.status().state == "Finished" and found.plan == run.plan
    assert hpcjob.list_runs(last=1)[0].record.run_id == run.run_id
    assert capsys.readouterr() == ("", "")  # nothing printed below the command line


def test_a_failed_local_run_says_why_and_a_canceled_one_leaves_no_process(tmp_path: Path) -> None:
    failing = stand_in_python(tmp_path, 'echo "ValueError: bad batch" >&2; exit 3')
    summary = hpcjob.submit(empty_script(tmp_path), nodes=2, python=str(failing), wait=True).summary
    assert summary is not None and (summary.state, summary.exit_code) == ("Failed", 3)
    assert summary.root_cause is not None and summary.root_cause.reason == "ValueError: bad batch"

    sleeping = stand_in_python(tmp_path / "long", "exec sleep 60")
    run = hpcjob.submit(empty_script(tmp_path, "other/train.py"), nodes=2, python=str(sleeping))
    assert run.cancel() is None  # at once: while its process may still be starting
    assert run.status().state == "Canceled" and run.cancel() == "Canceled"  # again: not an error
    assert marked_processes(f"HPCJOB_TASK_MARKER={run.run_id}/".encode()) == set()


def test_errors_are_raised_with_the_command_line_s_one_line_and_nothing_half_done(tmp_path: Path) -> None:
    script = empty_script(tmp_path)
    with pytest.raises(hpcjob.SpecError, match=r"^--nodes 0 must be at least 1$"):
        hpcjob.submit(script, nodes=0)
    with pytest.raises(hpcjob.SpecError, match=r"does not exist$"):
        hpcjob.submit(tmp_path / "missing.py", nodes=1)
    with pytest.raises(hpcjob.HpcjobError, match=r"^no run 'nope-1' recorded on this machine"):
        hpcjob.Run.find("nope-1")
    assert hpcjob.list_runs() == []  # nothing was recorded
    assert issubclass(hpcjob.SpecError, hpcjob.HpcjobError) and issubclass(
        hpcjob.StoppedWaiting, hpcjob.HpcjobError
    )


def test_render_job_gives_what_the_command_line_renders(tmp_path: Path) -> None:
    script = empty_script(tmp_path)
    options = {"share": "//HEADNODE/CcpSpoolDir/app", "gpus_per_node": 4}
    rendered = hpcjob.render_job(script, ["--epochs", "2"], node_names=["N1", "N2"], run_id="r-1", **options)
    by_cli = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "hpcjob.cli",
                "render",
                "--node",
                "N1",
                "--node",
                "N2",
                "--run-id",
                "r-1",
            ),
            *("--share", options["share"], "--gpus-per-node", "4", str(script), "--epochs", "2"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert rendered["xml"] == by_cli.stdout
    assert set(rendered) == {"xml", "powershell", "json", "clusrun"}
    assert json.loads(rendered["json"])["run_id"] == "r-1"


def test_an_insecure_profile_warns_through_python_s_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "clusters.toml"
    config.write_text(
        '[clusters.lab]\nurl = "https://127.0.0.1:9"\nuser = "alice"\npassword = "env:LAB_PW"\n'
        "insecure = true\n"
    )
    monkeypatch.setenv("HPCJOB_CONFIG", str(config))
    monkeypatch.setenv("LAB_PW", "pw")
    with pytest.warns(hpcjob.HpcjobWarning, match="TLS verification is off for cluster lab"):
        ClusterAccess("lab")  # what every run of the cluster opens first (contacting nothing yet)


@pytest.mark.slow
def test_a_cluster_run_from_python_through_either_front_door(emulated: Cluster, tmp_path: Path) -> None:
    """A run's life over REST then WinRM: the share mounted by a job of its own first, the summary, the run
    found again by its job id, its status and its logs. Over REST the real training job across two
    emulated nodes (its checkpoint on the share); over WinRM, whose nodes run the very same job, a
    stand-in Python (the command line's printing of the same: tests/test_rest_e2e.py)."""
    metrics = '[ "$HPCJOB_IS_HOST" = 0 ] || echo \'HPCJOB_METRICS {"epochs_completed": 1}\''
    stand_in = stand_in_python(tmp_path, f"sleep 1; echo 'epoch 1/1'; {metrics}")
    for backend, python in (("rest", sys.executable), ("winrm", str(stand_in))):
        posted = emulated.head.requests.count("POST", r"/jobs/jobFile$")
        said: list[str] = []
        run = hpcjob.submit(
            TRAIN,
            ["--epochs", "1", *SMALL],
            cluster="emu",
            backend=backend,
            nodes=2,
            python=python,  # the nodes are processes of this machine
            rdzv_port=free_port(),
            env={"HPCJOB_IFNAME": "lo"},
            wait=True,
            progress=said.append,
            name=f"train-{backend}",  # a job folder each
        )
        assert run.summary is not None and run.summary.state == "Finished", run.summary
        assert run.summary.metrics is not None and run.summary.metrics["epochs_completed"] == 1
        assert [(n.node, n.exit_code) for n in run.summary.nodes] == [("LOCALHOST", 0), ("NODE002", 0)]
        mounting = f"mounting the share at {emulated.mount_point} on the nodes (job "
        assert any(line.startswith(mounting) for line in said)  # by a job of its own first
        assert "LOCALHOST: Running" in said and "NODE002: Finished (exit code 0)" in said
        # Over REST two jobs (mount, training), each one create and one submit; over WinRM none at all.
        assert emulated.head.requests.count("POST", r"/jobs/jobFile$") - posted == (
            2 if backend == "rest" else 0
        )
        assert run.job_id is not None and run.job_id.isdigit()
        found = hpcjob.Run.find(run.job_id)
        assert found.run_id == run.run_id and found.status().state == "Finished"
        lines = list(found.logs())
        assert {node for node, _, _ in lines} == {"LOCALHOST", "NODE002"}
        assert any(stream == "stdout" and "epoch 1/1" in line for _, stream, line in lines)
        assert any(
            (node, stream) == ("NODE002", "stderr") and line.startswith("hpcjob: NODE002 joins from ")
            for node, stream, line in lines
        )
    checkpoints = emulated.share_dir / "hpcjob" / "alice" / "train-rest" / "checkpoints"
    assert len(list(checkpoints.glob("*/step-*/.hpcjob-complete"))) == 1  # the job's, in its run's folder
    assert PASSWORD not in os.environ.get("HPCJOB_CONFIG", "")
