"""Taking nodes offline and bringing them online, through both front doors, as the sources say: REST's
node operations answer 202 and act asynchronously (the spec); Set-HpcNodeState drains a node that runs a
job unless -Force, returns at once with -Async, and is an administrator's (its page)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from hpcjob.emulator import HeadNode
from hpcjob.emulator.base import Actor
from hpcjob.job.render.winrm import script_input, winrm_script

from .conftest import PASSWORD, Client, job_xml, task_xml
from .test_node_loss import powershell

DELAY = 0.4  # node_operation_delay_s in these tests


@pytest.fixture
def slow_head(make_head: Any) -> HeadNode:
    head: HeadNode = make_head(
        users={"alice": PASSWORD, "bob": "bob-pw"}, admins={"alice"}, node_operation_delay_s=DELAY
    )
    return head


def state(client: Client, node: str) -> str:
    response = client.get(f"/cluster/nodes/{node}")
    assert response.status_code == 200, response.text
    return str(response.json()["State"])


def wait_state(client: Client, node: str, wanted: str, timeout: float = 10.0) -> float:
    """Seconds until the node reads `wanted`."""
    start = time.monotonic()
    while state(client, node) != wanted:
        assert time.monotonic() - start < timeout, f"{node} still {state(client, node)}"
        time.sleep(0.02)
    return time.monotonic() - start


def busy_job(client: Client, node: str) -> int:
    job_id = client.submit_xml(
        job_xml(task_xml("sleep 60", RequiredNodes=node), UnitType="Node", RequestedNodes=node)
    )
    client.wait_task(job_id, 1, ("Running",))
    return job_id


def test_rest_operations_are_accepted_then_done_asynchronously(slow_head: HeadNode) -> None:
    client = Client(slow_head)
    assert client.post("/cluster/nodes/GPU02/operations/takeOffline").status_code == 202
    assert state(client, "GPU02") == "Online"  # accepted, not yet done
    assert wait_state(client, "GPU02", "Offline") >= DELAY * 0.5
    assert client.post("/cluster/nodes/gpu02/operations/bringOnline").status_code == 202
    wait_state(client, "GPU02", "Online")


def test_rest_take_offline_drains_a_node_that_runs_a_job(slow_head: HeadNode) -> None:
    client = Client(slow_head)
    job_id = busy_job(client, "CPU04")
    assert client.post("/cluster/nodes/CPU04/operations/takeOffline").status_code == 202
    wait_state(client, "CPU04", "Draining")
    time.sleep(DELAY * 2)
    assert state(client, "CPU04") == "Draining"  # as long as the job runs
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 204
    client.wait(job_id)
    wait_state(client, "CPU04", "Offline")


def test_rest_operations_are_an_administrator_s_and_name_a_node_and_an_operation(
    slow_head: HeadNode,
) -> None:
    client, bob = Client(slow_head), Client(slow_head, "bob", "bob-pw")
    assert bob.post("/cluster/nodes/GPU02/operations/takeOffline").status_code == 403
    assert client.post("/cluster/nodes/NOPE/operations/takeOffline").status_code == 404
    assert client.post("/cluster/nodes/GPU02/operations/sleep", spec=False).status_code == 400
    time.sleep(DELAY * 2)
    assert state(client, "GPU02") == "Online"


def set_state(head: HeadNode, script: str, data: dict[str, Any], admin: bool = True) -> tuple[int, str]:
    """hpcjob's offline/online script run over WinRM: exit code and stderr."""
    from hpcjob.job.render.winrm import bootstrap_command

    command, arguments = bootstrap_command()
    actor = Actor("alice" if admin else "bob", admin=admin)
    _, err, code = head.powershell(actor, command, list(arguments), script_input(script, data))
    return code, err.decode()


def test_set_hpcnodestate_drains_without_force_and_is_offline_at_once_with_it(slow_head: HeadNode) -> None:
    client = Client(slow_head)
    first = busy_job(client, "CPU04")
    second = busy_job(client, "GPU02")
    assert set_state(slow_head, "offline", {"Names": ["CPU04"], "Force": False}) == (0, "")
    wait_state(client, "CPU04", "Draining")
    assert set_state(slow_head, "offline", {"Names": ["GPU02"], "Force": True}) == (0, "")
    wait_state(client, "GPU02", "Offline")  # without Draining first, its job still running
    assert client.props(f"/jobs/{second}", properties="State")["State"] == "Running"
    assert state(client, "CPU04") == "Draining"
    for job_id in (first, second):
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 204
        client.wait(job_id)
    wait_state(client, "CPU04", "Offline")
    assert set_state(slow_head, "online", {"Names": ["CPU04", "GPU02"]}) == (0, "")
    for node in ("CPU04", "GPU02"):
        wait_state(client, node, "Online")


def test_set_hpcnodestate_refuses_what_the_cmdlet_refuses(slow_head: HeadNode) -> None:
    code, err = set_state(slow_head, "offline", {"Names": ["GPU02"], "Force": False}, admin=False)
    assert code == 1 and "cluster administrator" in err
    code, err = set_state(slow_head, "offline", {"Names": ["GPU02", "NOPE"], "Force": False})
    assert code == 1 and "NOPE" in err
    assert state(Client(slow_head), "GPU02") == "Online"  # nothing changed: one unknown node refuses all
    forced_online = winrm_script("online").replace("-State Online", "-State Online -Force")
    with pytest.raises(AssertionError, match="only use -Force when you specify Offline"):
        powershell(slow_head, forced_online, {"Names": ["GPU02"]})


def test_set_hpcnodestate_without_async_returns_once_the_state_is_made(slow_head: HeadNode) -> None:
    waits = winrm_script("offline").replace(" -Async", "")
    start = time.monotonic()
    assert powershell(slow_head, waits, {"Names": ["GPU02"], "Force": False}) == []
    assert time.monotonic() - start >= DELAY * 0.5
    assert state(Client(slow_head), "GPU02") == "Offline"


def test_the_scripts_read_their_nodes_from_data_only(tmp_path: Path) -> None:
    for name in ("offline", "online"):
        text = winrm_script(name)
        assert "$Data.Names" in text and "-Async" in text and "-Confirm:$false" in text
