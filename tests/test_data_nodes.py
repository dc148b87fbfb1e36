"""Issue 34, the job: N GPU trainers and M CPU data nodes in one HPC Pack job. Node unit, exactly N+M
nodes, exclusive, failing as a whole; every node in RequestedNodes and no node group (a group's default
Intersect would keep the other role's nodes out); N torchrun tasks and M data tasks, each pinned with
RequiredNodes. Golden files for a 2+2 job, and the emulator's Intersect rule catching the wrong job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from hpcjob.backends.local.procs import MARKER_VAR, marked_processes
from hpcjob.backends.scheduler import cluster_plan
from hpcjob.emulator import HeadNode, NodeSpec
from hpcjob.job.plan import JobPlan, make_plan
from hpcjob.job.prices import Price
from hpcjob.job.render import JOB_NAMESPACE, clusrun_text, job_xml, powershell_text
from hpcjob.job.results import JobSummary, NodeInfo, NodeResult, State
from hpcjob.job.spec import JobSpec, NotEnoughNodes, SpecError, check_data_service

from .artefact_checks import check_powershell, powershell_errors
from .conftest import REPO, RUN_ID, cluster_spec
from .emulator.conftest import PASSWORD, Client

NS = {"j": JOB_NAMESPACE}
TRAIN = REPO / "training" / "run_ddp.py"
CPU = ("CPUNODE001", "CPUNODE002")


def plan_2plus2(**overrides: object) -> JobPlan:
    spec = cluster_spec(2, data_nodes=2, data_node_group="CPUNodes", **overrides)
    return make_plan(spec, spec.node_names, RUN_ID, data_node_names=CPU)


def test_the_2plus2_job_file_clusrun_and_powershell_are_the_golden_ones(
    golden: Callable[[str, str], None],
) -> None:
    plan = plan_2plus2()
    golden("job-2plus2.xml", job_xml(plan))
    golden("clusrun-2plus2.txt", clusrun_text(plan))
    text = powershell_text(plan)
    golden("submit-2plus2.ps1", text)
    assert not powershell_errors(text)
    check_powershell(plan, text, text)


def test_the_job_names_every_node_of_both_roles_and_no_node_group() -> None:
    root = ET.fromstring(job_xml(plan_2plus2()).encode())
    trainers = ("GPUNODE001", "GPUNODE002")
    assert root.get("RequestedNodes") == ",".join((*trainers, *CPU))
    assert (root.get("MinNodes"), root.get("MaxNodes"), root.get("UnitType")) == ("4", "4", "Node")
    assert root.get("NodeGroups") is None and root.get("IsExclusive") == "true"
    assert root.get("FailOnTaskFailure") == "true"  # a data node that fails ends the job
    tasks = root.findall("j:Tasks/j:Task", NS)
    assert [t.get("RequiredNodes") for t in tasks] == [*trainers, *CPU]
    lines = [t.get("CommandLine") or "" for t in tasks]
    assert all("HPCJOB_ROLE" not in line and "torch.distributed.run" in line for line in lines[:2])
    assert all("HPCJOB_ROLE=data" in line and "torch.distributed.run" not in line for line in lines[2:])
    variables = {
        v.findtext("j:Name", namespaces=NS): v.findtext("j:Value", namespaces=NS)
        for v in root.findall("j:EnvironmentVariables/j:Variable", NS)
    }
    assert variables["HPCJOB_DATA_NODES"] == "CPUNODE001,CPUNODE002"
    assert variables["HPCJOB_DATA_PORT"] == "29600" and variables["HPCJOB_DATA_WAIT_S"] == "300"
    # Published outside the logs (which `hpcjob pull` brings home), in the owner's job folder.
    assert variables["HPCJOB_DATA_DIR"] == f"/app/hpcjob/run_ddp/.hpcjob/data/{RUN_ID}"


def test_in_a_container_a_data_task_gets_no_gpus() -> None:
    root = ET.fromstring(job_xml(plan_2plus2(image="nvcr.io/nvidia/pytorch:24.05-py3")).encode())
    job_options = next(
        v.findtext("j:Value", namespaces=NS)
        for v in root.findall("j:EnvironmentVariables/j:Variable", NS)
        if v.findtext("j:Name", namespaces=NS) == "CCP_DOCKER_START_OPTION"
    )
    assert job_options is not None and "--gpus=all" in job_options
    for task in root.findall("j:Tasks/j:Task", NS):
        own = {
            v.findtext("j:Name", namespaces=NS): v.findtext("j:Value", namespaces=NS)
            for v in task.findall("j:EnvironmentVariables/j:Variable", NS)
        }
        if task.get("Name", "").startswith("data "):
            assert own == {
                "CCP_DOCKER_START_OPTION": job_options.replace(" --gpus=all", ""),
                "CCP_DOCKER_NVIDIA": "0",
            }
        else:
            assert own == {}


def nodes_of(names: tuple[str, ...], group: str, state: str = "Online") -> list[NodeInfo]:
    return [NodeInfo(name, state, "OK", cores=8, groups=(group,)) for name in names]


def test_hpcjob_chooses_the_data_nodes_from_their_group_and_never_a_trainer() -> None:
    gpus = nodes_of(("GPUNODE001", "GPUNODE002", "GPUNODE003"), "GPUNodes")
    cpus = nodes_of(("CPUNODE001", "CPUNODE002", "CPUNODE003"), "CPUNodes")
    by_group = {"GPUNodes": gpus, "CPUNodes": cpus, None: gpus + cpus}
    spec = replace(cluster_spec(2, data_nodes=2, data_node_group="CPUNodes"), node_names=())

    def plan(spec: JobSpec, busy: set[str] = set()) -> JobPlan:  # noqa: B006 - read only
        return cluster_plan(spec, RUN_ID, lambda g: by_group[g], lambda: busy, lambda names: {}, "lab")

    chosen = plan(spec, {"CPUNODE001"})
    assert chosen.nodes == ("GPUNODE001", "GPUNODE002") and chosen.data_node_names == (
        "CPUNODE002",
        "CPUNODE003",
    )
    # With no trainer group, the trainers never come from the data nodes' group.
    assert plan(replace(spec, node_group=None)).nodes == ("GPUNODE001", "GPUNODE002")
    too_few = r"^4 data node\(s\) needed but only 3 online.* in group CPUNodes"
    with pytest.raises(NotEnoughNodes, match=too_few):
        plan(replace(spec, data_nodes=4))
    with pytest.raises(SpecError, match="--data-node-group"):
        plan(replace(spec, data_node_group=None))
    named = plan(replace(spec, data_node_names=("CPUNODE003",), data_nodes=1))
    assert named.data_node_names == ("CPUNODE003",)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"data_nodes": -1}, "--data-nodes -1 must be at least 1"),
        (
            {"node_names": ("A", "B"), "data_node_names": ("b",)},
            "node 'b' is named both a trainer (--node) and a data node (--data-node)",
        ),
        ({"data_node_names": ("C", "c")}, "node 'c' is named twice (as 'C')"),
        ({"data_nodes": 3, "data_node_names": ("C",)}, "1 data node(s) named with --data-node, fewer than"),
        (
            {"data_nodes": 1, "nodes": 3, "min_nodes": 2, "max_restarts": 1},
            "--data-nodes does not go with --min-nodes",
        ),
        ({"data_nodes": 1, "data_port": 29400}, "not the --rdzv-port"),
        ({"data_nodes": 1, "data_wait_s": 0.0}, "--data-wait 0 must be more than 0"),
    ],
)
def test_bad_data_node_specs_are_one_line(fields: dict[str, object], error: str) -> None:
    with pytest.raises(SpecError) as raised:
        JobSpec(script="train.py", **fields)  # type: ignore[arg-type]
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_each_role_is_counted_at_its_own_price() -> None:
    """Two GPU nodes and a data node, each task an hour: the GPU nodes at their price, the data node at
    the data_vm_size's; a data node of a profile that names no data_vm_size leaves the cost unknown
    rather than counted at the GPU nodes' price."""
    gpu = Price("Standard_NC24ads_A100_v4", "eastus", False, 3.67, "2026-11-27", "api")
    cpu = Price("Standard_F16s_v2", "eastus", False, 0.677, "2026-11-27", "api")
    nodes = [
        NodeResult(name, State.FINISHED, 0, task_start=1000.0, task_end=4600.0)
        for name in ("GPUNODE001", "GPUNODE002", "CPUNODE001")
    ]
    summary = JobSummary("job", "run", State.FINISHED, 0, 3600.0, "/j", "/j/logs", nodes=nodes, price=gpu)
    summary.data_node_names = ["cpunode001"]
    assert summary.cost_usd is None  # the data node's size is not known
    summary.data_price = cpu
    assert summary.cost_usd == pytest.approx(2 * 3.67 + 0.677)
    back = JobSummary.from_json(summary.to_json())
    assert back.data_price == cpu and back.cost_usd == pytest.approx(summary.cost_usd)


def test_a_script_without_a_data_service_mode_is_refused() -> None:
    check_data_service("train.py", "role = os.environ.get('HPCJOB_ROLE', 'trainer')\n")
    check_data_service("train.py", "from data_service import feed\n")
    check_data_service("train.py", "from hpctorch.data import RemoteBatches, serve\n")
    check_data_service("train.py", "from hpctorch import Metrics, data\n")
    with pytest.raises(SpecError, match=r"train\.py has no data-service mode"):
        check_data_service("train.py", "import torch\n")


def test_the_emulator_never_starts_the_job_a_node_group_would_make() -> None:
    """The job as it would be with the trainers' group named (the default Intersect): its data tasks'
    required nodes are outside the group, and the scheduler refuses it; hpcjob's own job is taken."""
    nodes = [
        *(NodeSpec(name, groups=("ComputeNodes", "GPUNodes")) for name in ("GPUNODE001", "GPUNODE002")),
        *(NodeSpec(name, groups=("ComputeNodes", "CPUNodes")) for name in CPU),
    ]
    right = job_xml(plan_2plus2())
    wrong = right.replace('RequestedNodes="', 'NodeGroups="GPUNodes" RequestedNodes="', 1)
    with HeadNode(nodes, users={"alice": PASSWORD}, grace_period=0.2) as head:
        client = Client(head)
        refused = client.submit_xml(wrong)
        assert client.wait(refused) == "Failed"
        message = client.props(f"/jobs/{refused}", properties="ErrorMessage")["ErrorMessage"]
        assert "the required node CPUNODE001 is not among the nodes the job may use" in message
        taken = client.submit_xml(right)
        client.wait(taken, ("Running", "Finished", "Failed"))
        message = client.props(f"/jobs/{taken}", properties="ErrorMessage")["ErrorMessage"]
        assert "not among the nodes" not in message and "match its RequestedNodes" not in message
        client.post(f"/jobs/{taken}/cancel")
        client.wait(taken)


def run_local(
    share: Path, *options: str, epochs: int = 2, more: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--json", "--quiet", "-n", "1",
         "--mount-point", str(share), *options, str(TRAIN), "--epochs", str(epochs),
         "--train-samples", "600", "--batch-size", "30", *more],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def serving_run(share: Path, run_id: str) -> subprocess.Popen[str]:
    """A local run of 20 slow epochs with one data node, returned once DATA1 has published where it
    serves (120 s at most, the run alive; killed otherwise)."""
    job = run_local(share, "--data-nodes", "1", "--run-id", run_id, epochs=20, more=("--step-sleep", "0.05"))
    published = share / "hpcjob" / "run_ddp" / ".hpcjob" / "data" / run_id / "DATA1.json"
    deadline = time.monotonic() + 120
    while not published.is_file():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"DATA1 did not serve within 120 s: {job.communicate()}")
        time.sleep(0.1)
    return job


@pytest.mark.slow
def test_a_local_job_with_two_data_nodes_trains_from_them_and_ends_finished(tmp_path: Path) -> None:
    """`run --local -n 1 --data-nodes 2`: the trainer's batches come from its data node (the other has
    no rank to serve, and ends at once); every task exits 0 and the job ends Finished, its summary and
    `runs` saying what the data nodes served and how long the trainer waited. A run resumed from it asks
    the data node for the checkpoint's next epoch."""
    job = run_local(tmp_path, "--data-nodes", "2", "--run-id", "hetero-1")
    out, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "Finished"
    assert [(n["node"], n["exit_code"]) for n in summary["nodes"]] == [
        ("LOCAL1", 0),
        ("DATA1", 0),
        ("DATA2", 0),
    ]
    metrics = summary["metrics"]
    assert [n["node"] for n in metrics["data_node_stats"]] == ["DATA1"] and metrics["data_node_stats"][0][
        "samples"
    ] == 1200
    assert metrics["data_samples_per_sec"] > 0 and 0 <= metrics["data_wait_fraction"] < 1
    logs = tmp_path / "hpcjob" / "run_ddp" / "logs" / "hetero-1"
    assert "no trainer rank to serve" in (logs / "DATA2.out").read_text()
    listed = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "runs", "--last", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = listed.stdout.splitlines()[1].split()
    assert row[3:5] == ["1+2", "data"], listed.stdout
    shown = json.loads(
        subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", "runs", "show", "hetero-1", "--json"],
            capture_output=True, text=True, timeout=60,
        ).stdout
    )  # fmt: skip
    assert shown["data_node_names"] == ["DATA1", "DATA2"]
    assert json.loads(out)["data_node_names"] == ["DATA1", "DATA2"]  # the summary says which nodes served
    assert shown["node_hours"] == pytest.approx(3 * shown["wall_s"] / 3600)  # every node it held
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", "status", "hetero-1", "--json"],
            capture_output=True, text=True, timeout=60,
        ).stdout
    )  # fmt: skip
    assert [t["name"] for t in status["tasks"]] == ["torchrun LOCAL1", "data DATA1", "data DATA2"]
    resumed = run_local(tmp_path, "--data-nodes", "1", "--resume-from", "hetero-1", epochs=3)
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    again = json.loads(out)["metrics"]
    assert (again["resumed_from_epoch"], again["epochs_trained"]) == (2, 1)
    assert again["data_node_stats"][0]["samples"] == 600  # one epoch served: the third


@pytest.mark.slow
def test_a_data_node_that_fails_ends_the_job_naming_it(tmp_path: Path) -> None:
    job = serving_run(tmp_path, "hetero-2")
    try:
        time.sleep(2)  # training from it
        for pid, _ in marked_processes(f"{MARKER_VAR}=hetero-2/2\0".encode()):
            os.kill(pid, signal.SIGKILL)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    summary = json.loads(out)
    assert summary["state"] == "Failed", err[-3000:]
    assert summary["root_cause"]["node"] == "DATA1"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_both_emulator_front_doors_run_a_2plus2_job_to_the_end(tmp_path: Path, backend: str) -> None:
    """Two GPU trainers and two CPU data nodes of their own group, chosen by hpcjob, in one job through
    each front door: every task exits 0, the job ends Finished, each data node served its trainer."""
    from hpcjob.emulator.headnode import GPU_GROUPS

    from .test_rest_e2e import SMALL, emulated_cluster

    nodes = [
        NodeSpec("LOCALHOST", groups=GPU_GROUPS),
        NodeSpec("NODE002", groups=GPU_GROUPS),
        *(NodeSpec(name, groups=("ComputeNodes", "LinuxNodes", "CPUNodes")) for name in CPU),
    ]
    for cluster in emulated_cluster(tmp_path, filter_nodes=("LOCALHOST", "NODE002", *CPU), nodes=nodes):
        done = cluster.submit(
            "--wait", "--json", "--backend", backend, "-n", "2", "--data-nodes", "2",
            "--data-node-group", "CPUNodes", str(TRAIN), "--epochs", "1", *SMALL,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        summary = json.loads(done.stdout)
        assert summary["state"] == "Finished"
        assert sorted((n["node"], n["exit_code"]) for n in summary["nodes"]) == sorted(
            [("LOCALHOST", 0), ("NODE002", 0), *((name, 0) for name in CPU)]
        )
        served = {n["node"]: n["samples"] for n in summary["metrics"]["data_node_stats"]}
        assert set(served) == set(CPU) and all(samples > 0 for samples in served.values())


def test_a_lost_data_node_is_left_out_of_the_next_attempt() -> None:
    """Retried as any lost node: the next attempt chooses its data nodes from their group, without it."""
    from hpcjob.job.attempts import Cause
    from hpcjob.runner.attempts import _next_spec

    spec = cluster_spec(2, data_node_names=CPU, data_node_group="CPUNodes")
    after = _next_spec(spec, Cause("node lost", True, "CPUNODE001 was lost", ("CPUNODE001",)))
    assert (after.data_nodes, after.data_node_names) == (2, ())
    assert after.exclude_nodes == ("CPUNODE001",) and after.node_names == spec.node_names


@pytest.mark.slow
def test_a_cancel_stops_both_roles(tmp_path: Path) -> None:
    job = serving_run(tmp_path, "hetero-3")
    try:
        job.send_signal(signal.SIGTERM)  # as Ctrl-C
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    summary = json.loads(out)
    assert summary["state"] == "Canceled", err[-3000:]
    assert {n["node"]: n["state"] for n in summary["nodes"]} == {"LOCAL1": "Canceled", "DATA1": "Canceled"}
    assert marked_processes(f"{MARKER_VAR}=hetero-3/".encode()) == set()


def test_a_run_history_of_an_older_hpcjob_still_names_its_data_nodes() -> None:
    """The data nodes' names were "data_nodes" in the plan, the summary and each attempt's figures that
    the history keeps; now "data_node_names" (data_nodes is their count, as --data-nodes): the old
    records read the same."""
    from hpcjob.job.render import plan_json
    from hpcjob.job.usage import AttemptUsage

    plan = plan_json(plan_2plus2())
    old = json.loads(plan)
    old["data_nodes"] = old.pop("data_node_names")
    assert (
        JobPlan.from_dict(old) == JobPlan.from_dict(json.loads(plan))
        and len(JobPlan.from_dict(old).data_node_names) == 2
    )
    summary = JobSummary("t", RUN_ID, State.FINISHED, 0, 1.0, "/j", "/l", data_node_names=["CPU1"])
    older = json.loads(summary.to_json())
    older["data_nodes"] = older.pop("data_node_names")
    assert JobSummary.from_json(json.dumps(older)).data_node_names == ["CPU1"]
    usage = AttemptUsage(1, 0.0, 60.0, ("GPU1",), ("CPU1",)).to_dict()
    usage["data_nodes"] = usage.pop("data_node_names")
    assert AttemptUsage.from_dict(usage).data_node_names == ("CPU1",)
