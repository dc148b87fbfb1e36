"""A node lost under a running job: evicted (its processes killed at once) or unreachable, noticed by the
head node only after its detection delay, as each front door shows it; the job fails, or goes back to
the queue by itself while JobRetryCount allows; the node comes back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcjob.emulator import HeadNode
from hpcjob.emulator.base import Actor
from hpcjob.job.render.winrm import bootstrap_command, winrm_script

from .conftest import Client, job_xml, task_xml
from .test_jobs_run import pinned_job

DELAY = 1.5  # the head node's detection delay in these tests (90 s by default)
SLEEP = "sleep 60"
UNREACHABLE = "\n".join(
    [
        "$nodes = @(Get-HpcNode -Health Unreachable)",
        "@($nodes | ForEach-Object {",
        "    [pscustomobject]@{",
        "        Name = $_.NetBiosName",
        "        State = [string]$_.NodeState",
        "        Health = [string]$_.NodeHealth",
        "        HealthState = [string]$_.HealthState",
        "    }",
        "})",
    ]
)


def ddp_job(tmp_path: Path) -> str:
    """hpcjob's 2-node shape (LOCALHOST and GPU02, tasks pinned), each task sleeping."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    return pinned_job(tmp_path, SLEEP, SLEEP)


def powershell(head: HeadNode, script: str, data: dict[str, Any] | None = None) -> Any:
    """What a script run over WinRM by an administrator outputs (its JSON, parsed)."""
    command, arguments = bootstrap_command()
    stdin = json.dumps({"Script": script, "Data": data or {}}).encode()
    out, err, code = head.powershell(Actor("alice", admin=True), command, list(arguments), stdin)
    assert code == 0, err.decode()
    return json.loads(out)


def unreachable(head: HeadNode) -> list[dict[str, Any]]:
    return list(powershell(head, UNREACHABLE))


def health(client: Client, node: str) -> str:
    response = client.get(f"/cluster/nodes/{node}")
    assert response.status_code == 200, response.text
    return str(response.json()["Health"])


def running(head: HeadNode, job_id: int, task_id: int, timeout: float = 10.0) -> None:
    """Wait until the task has a process that lives."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with head.cluster.lock:
            process = head.cluster.task(job_id, task_id).process
        if process is not None and process.live():
            return
        time.sleep(0.05)
    raise AssertionError(f"task {job_id}.{task_id} did not start")


def alive(head: HeadNode, job_id: int, task_id: int) -> bool:
    with head.cluster.lock:
        process = head.cluster.task(job_id, task_id).process
    return process is not None and bool(process.live())


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> float:
    """Wait until `check()`; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)
    return time.monotonic()


@pytest.fixture
def lossy(make_head: Callable[..., HeadNode]) -> HeadNode:
    return make_head(detection_delay_s=DELAY)


def test_an_evicted_node_fails_its_job_once_the_head_node_notices(lossy: HeadNode, tmp_path: Path) -> None:
    """The first figure of issue 33: a rigid 2-node job (hpcjob's shape: tasks pinned, not rerunnable,
    FailOnTaskFailure) loses a node. Its processes go at once; the head node says nothing for the
    detection delay; then REST shows Health Error, PowerShell NodeHealth Unreachable; the lost node's
    task is Failed with the node-lost message, the other's Canceled, the job Failed; nothing runs."""
    head, client = lossy, Client(lossy)
    xml = ddp_job(tmp_path).replace("<Task ", '<Task IsRerunnable="false" ')
    job_id = client.submit_xml(xml)
    running(head, job_id, 1)
    running(head, job_id, 2)

    lost_at = time.monotonic()
    head.lose_node("GPU02")
    assert not alive(head, job_id, 2), "an evicted node's processes die with it"
    assert alive(head, job_id, 1)

    # The head node has not noticed: the node, the task and the job look as before.
    assert health(client, "GPU02") == "OK"
    assert unreachable(head) == []
    assert client.props(f"/jobs/{job_id}/tasks/2", properties="State")["State"] == "Running"
    assert client.props(f"/jobs/{job_id}", properties="State")["State"] == "Running"

    noticed = wait_for(lambda: health(client, "GPU02") == "Error")
    assert noticed - lost_at >= DELAY
    assert client.wait(job_id) == "Failed"
    assert time.monotonic() - lost_at >= DELAY

    task = client.props(f"/jobs/{job_id}/tasks/2", properties="State,ErrorMessage,ExitCode,Output")
    assert task == {
        "State": "Failed",
        "ErrorMessage": "The node GPU02 became unreachable.",
        "ExitCode": "-1",
        "Output": "",
    }
    assert client.props(f"/jobs/{job_id}/tasks/1", properties="State")["State"] == "Canceled"
    job = client.props(f"/jobs/{job_id}", properties="ErrorMessage,RequeueCount,AutoRequeueCount")
    assert "The node GPU02 became unreachable." in job["ErrorMessage"]
    assert (job["RequeueCount"], job["AutoRequeueCount"]) == ("0", "0")
    assert head.job_history(job_id)[-3:] == ["Running", "Canceling", "Failed"]
    assert not head.live_processes()

    # Each door as it shows the node: its State stays Online.
    node = client.get("/cluster/nodes/GPU02").json()
    assert (node["State"], node["Health"]) == ("Online", "Error")
    assert [n["Name"] for n in client.get("/cluster/nodes", params={"health": "Error"}).json()] == ["GPU02"]
    assert client.props("/nodes/GPU02")["Reachable"] == "False"  # the 2016 API's
    assert unreachable(head) == [
        {"Name": "GPU02", "State": "Online", "Health": "Unreachable", "HealthState": "Error"}
    ]
    by_state = powershell(head, UNREACHABLE.replace("-Health Unreachable", "-HealthState Error"))
    assert [n["Name"] for n in by_state] == ["GPU02"]
    # What hpcjob's own nodes script reads: NodeHealth Unreachable, so not a node it would use.
    rows = powershell(head, winrm_script("nodes"), {"Group": None})
    assert {r["NetBiosName"]: r["NodeHealth"] for r in rows}["GPU02"] == "Unreachable"

    # Nothing starts there while it is lost; clusrun does not reach it.
    assert head.cluster.run_as_system("GPU02", "true")[0] == 1
    head.restore_node("GPU02")
    assert health(client, "GPU02") == "OK"
    assert unreachable(head) == []
    assert client.props("/nodes/GPU02")["Reachable"] == "True"
    assert client.get("/cluster/nodes/GPU02").json()["State"] == "Online"


def test_job_retry_count_requeues_the_job_on_the_nodes_it_can_get(
    make_head: Callable[..., HeadNode], tmp_path: Path
) -> None:
    """JobRetryCount=1: the job that failed for a lost node is seen Failed, then Queued, then Running
    again on the free healthy nodes, its counts up by one through both doors; a second loss, with no
    retry left, leaves it Failed."""
    head = make_head(detection_delay_s=DELAY, job_retry_count=1, auto_requeue_delay_s=1.0)
    client = Client(head)
    tasks = [task_xml(SLEEP, Name=f"rank{n}", MinNodes="1", MaxNodes="1") for n in (0, 1)]
    xml = job_xml(
        *tasks,
        Name="elastic-less",
        UnitType="Node",
        MinNodes="2",
        MaxNodes="2",
        AutoCalculateMin="false",
        AutoCalculateMax="false",
        RequestedNodes="LOCALHOST,GPU02,CPU04",
        IsExclusive="true",
        FailOnTaskFailure="true",
    )
    job_id = client.submit_xml(xml)
    running(head, job_id, 1)
    running(head, job_id, 2)
    assert client.props(f"/jobs/{job_id}", properties="AllocatedNodes")["AllocatedNodes"] == "LOCALHOST,GPU02"

    head.lose_node("GPU02")
    assert client.wait(job_id, ("Failed",), timeout=15) == "Failed"  # seen by a client that polls
    assert client.wait(job_id, ("Running",), timeout=15) == "Running"
    assert head.job_history(job_id)[-4:] == ["Canceling", "Failed", "Queued", "Running"]
    job = client.props(
        f"/jobs/{job_id}", properties="AllocatedNodes,RequeueCount,AutoRequeueCount,ErrorMessage"
    )
    assert job == {
        "AllocatedNodes": "LOCALHOST,CPU04",
        "RequeueCount": "1",
        "AutoRequeueCount": "1",
        "ErrorMessage": "",
    }
    running(head, job_id, 1)
    running(head, job_id, 2)
    for task_id in (1, 2):
        task = client.props(
            f"/jobs/{job_id}/tasks/{task_id}", properties="State,RequeueCount,AutoRequeueCount"
        )
        assert task == {"State": "Running", "RequeueCount": "1", "AutoRequeueCount": "1"}
    script = "\n".join(
        [
            "$job = Get-HpcJob -Id $Data.JobId",
            "[pscustomobject]@{",
            "    State = [string]$job.State",
            "    RequeueCount = $job.RequeueCount",
            "    AutoRequeueCount = $job.AutoRequeueCount",
            "}",
        ]
    )
    assert powershell(head, script, {"JobId": job_id}) == [
        {"State": "Running", "RequeueCount": 1, "AutoRequeueCount": 1}
    ]

    head.lose_node("CPU04")  # no retry left
    assert client.wait(job_id, timeout=15) == "Failed"
    time.sleep(1.5)  # past the requeue delay: it stays Failed
    assert client.props(f"/jobs/{job_id}", properties="State,AutoRequeueCount") == {
        "State": "Failed",
        "AutoRequeueCount": "1",
    }
    assert not head.live_processes()


def test_a_requeued_job_pinned_to_the_lost_node_waits_for_it(
    make_head: Callable[..., HeadNode], tmp_path: Path
) -> None:
    """hpcjob's pinned tasks cannot move: the requeued job stays Queued until the node is back."""
    head = make_head(detection_delay_s=DELAY, job_retry_count=1, auto_requeue_delay_s=0.0)
    client = Client(head)
    job_id = client.submit_xml(ddp_job(tmp_path))
    running(head, job_id, 2)
    head.lose_node("GPU02")
    wait_for(lambda: head.job_history(job_id)[-1] == "Queued" and "Failed" in head.job_history(job_id))
    time.sleep(0.5)
    assert client.props(f"/jobs/{job_id}", properties="State")["State"] == "Queued"
    head.restore_node("GPU02")
    assert client.wait(job_id, ("Running",)) == "Running"
    running(head, job_id, 2)
    client.post(f"/jobs/{job_id}/cancel", params={"forced": "true"})
    assert client.wait(job_id) == "Canceled"
    assert not head.live_processes()


def test_an_unreachable_node_keeps_its_processes_until_the_head_node_gives_up(
    lossy: HeadNode, tmp_path: Path
) -> None:
    head, client = lossy, Client(lossy)
    job_id = client.submit_xml(ddp_job(tmp_path))
    running(head, job_id, 2)
    lost_at = time.monotonic()
    head.lose_node("GPU02", how="unreachable")
    assert alive(head, job_id, 2)
    assert client.wait(job_id) == "Failed"
    assert time.monotonic() - lost_at >= DELAY
    assert not alive(head, job_id, 2)
    task = client.props(f"/jobs/{job_id}/tasks/2", properties="State,ErrorMessage,ExitCode")
    assert task == {"State": "Failed", "ErrorMessage": "The node GPU02 became unreachable.", "ExitCode": "-1"}
    assert not head.live_processes()


def test_a_node_back_before_the_head_node_noticed(make_head: Callable[..., HeadNode], tmp_path: Path) -> None:
    """Back before the detection delay: an evicted node's task ends then (its processes are gone), an
    unreachable node's task carries on; the node's health never leaves OK."""
    head = make_head(detection_delay_s=60.0)
    client = Client(head)
    evicted = client.submit_xml(ddp_job(tmp_path))
    running(head, evicted, 2)
    head.lose_node("GPU02")
    time.sleep(0.3)
    assert client.props(f"/jobs/{evicted}/tasks/2", properties="State")["State"] == "Running"
    head.restore_node("GPU02")
    assert client.wait(evicted) == "Failed"
    assert client.props(f"/jobs/{evicted}/tasks/2", properties="ErrorMessage")["ErrorMessage"] == (
        "The node GPU02 became unreachable."
    )
    assert health(client, "GPU02") == "OK"

    kept = client.submit_xml(ddp_job(tmp_path))
    running(head, kept, 2)
    head.lose_node("GPU02", how="unreachable")
    head.restore_node("GPU02")
    time.sleep(0.3)
    assert alive(head, kept, 2)
    assert client.props(f"/jobs/{kept}", properties="State")["State"] == "Running"
    client.post(f"/jobs/{kept}/cancel", params={"forced": "true"})
    assert client.wait(kept) == "Canceled"
    assert not head.live_processes()


def test_a_task_sent_to_a_lost_node_never_starts(lossy: HeadNode, tmp_path: Path) -> None:
    """Before the head node noticed, it still allocates the node: the task waits in Dispatching, with
    no process, and fails when the head node gives up."""
    head, client = lossy, Client(lossy)
    head.lose_node("GPU02")
    marker = tmp_path / "ran"
    job_id = client.submit_xml(job_xml(task_xml(f"touch {marker}"), RequestedNodes="GPU02", Name="late"))
    wait_for(lambda: client.props(f"/jobs/{job_id}/tasks/1", properties="State")["State"] == "Dispatching")
    assert client.wait(job_id) == "Failed"
    assert not marker.exists()
    task = client.props(f"/jobs/{job_id}/tasks/1", properties="State,ErrorMessage")
    assert task == {"State": "Failed", "ErrorMessage": "The node GPU02 became unreachable."}


def test_bad_losses_are_refused(make_head: Callable[..., HeadNode], lossy: HeadNode) -> None:
    with pytest.raises(ValueError, match="how must be one of evicted, unreachable"):
        lossy.lose_node("GPU02", how="stolen")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not lost"):
        lossy.restore_node("GPU02")
    lossy.lose_node("GPU02")
    with pytest.raises(ValueError, match="already lost"):
        lossy.lose_node("gpu02")
    with pytest.raises(ValueError, match="unreachable_health must be one of"):
        HeadNode(users={"alice": "pw"}, unreachable_health="Unreachable")
    with pytest.raises(ValueError, match="must not be negative"):
        HeadNode(users={"alice": "pw"}, job_retry_count=-1)
    with pytest.raises(ValueError, match="may name only"):
        HeadNode(users={"alice": "pw"}, node_lost_message="{host} is gone")
    command, arguments = bootstrap_command()
    stdin = json.dumps({"Script": "Get-HpcNode -Health Gone", "Data": {}}).encode()
    _, err, code = lossy.powershell(Actor("alice", admin=True), command, list(arguments), stdin)
    assert code == 1 and b"Cannot bind parameter 'Health'" in err


def test_the_loss_settings_are_the_emulator_s_choices(
    make_head: Callable[..., HeadNode], tmp_path: Path
) -> None:
    """unreachable_health and node_lost_message are UNVERIFIED: other values can be asked for."""
    head = make_head(detection_delay_s=0.2, unreachable_health="Warning", node_lost_message="{node} left.")
    client = Client(head)
    job_id = client.submit_xml(ddp_job(tmp_path))
    running(head, job_id, 2)
    head.lose_node("GPU02")
    assert client.wait(job_id) == "Failed"
    assert client.props(f"/jobs/{job_id}/tasks/2", properties="ErrorMessage")["ErrorMessage"] == "GPU02 left."
    assert health(client, "GPU02") == "Warning"
    assert unreachable(head)[0]["HealthState"] == "Warning"
