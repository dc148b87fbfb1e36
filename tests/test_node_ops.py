"""Nodes taken offline and brought online through each cluster backend, against the emulated head node:
REST's node operations (202, then the node's State read until it is there), WinRM's Set-HpcNodeState
-Async (then Get-HpcNode); a node that runs a job drains, within a bound; with force, WinRM's -Force
takes it Offline at once, and REST (which has no force) takes it as taken once it drains."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hpcjob.backends import Backend, open_backend
from hpcjob.backends.scheduler import NodeWaitError
from hpcjob.emulator import HeadNode
from hpcjob.job.spec import HpcjobError
from hpcjob.store.config import ClusterProfile

from .emulator.conftest import Client, job_xml, task_xml

PASSWORD = "Node-ops-Pw1"


@pytest.fixture
def head() -> Iterator[HeadNode]:
    with HeadNode(
        users={"alice": PASSWORD, "bob": PASSWORD},
        admins={"alice"},
        grace_period=0.5,
        node_operation_delay_s=0.3,
    ) as started:
        yield started


def opened(head: HeadNode, kind: str, user: str = "alice") -> Backend:
    profile = ClusterProfile(
        name="emu",
        url=head.url,
        user=f"HPC\\{user}",
        ca_bundle=head.ca_file,
        backend=kind,
        winrm_url=head.wsman_url if kind == "winrm" else None,
        poll_interval=0.1,
    )
    return open_backend(kind, profile, PASSWORD)


@pytest.fixture(params=["rest", "winrm"])
def backend(request: pytest.FixtureRequest, head: HeadNode) -> Iterator[Backend]:
    made = opened(head, request.param)
    yield made
    made.close()


def states(head: HeadNode) -> dict[str, str]:
    return {n["Name"]: n["State"] for n in Client(head, "alice", PASSWORD).get("/cluster/nodes").json()}


def running_job(head: HeadNode, node: str) -> int:
    client = Client(head, "alice", PASSWORD)
    job_id = client.submit_xml(
        job_xml(task_xml("sleep 60", RequiredNodes=node), UnitType="Node", RequestedNodes=node)
    )
    client.wait_task(job_id, 1, ("Running",))
    return job_id


def job_state(head: HeadNode, job_id: int) -> str:
    return Client(head, "alice", PASSWORD).props(f"/jobs/{job_id}", properties="State")["State"]


def test_nodes_go_offline_and_come_back_online(backend: Backend, head: HeadNode) -> None:
    said: list[str] = []
    taken = backend.take_offline(["NODE002", "node003"], force=False, progress=said.append)
    assert [(n.name, n.state) for n in taken] == [("NODE002", "Offline"), ("NODE003", "Offline")]
    assert states(head)["NODE002"] == "Offline" and states(head)["LOCALHOST"] == "Online"
    assert said[:2] == ["NODE002: Online, health OK", "NODE003: Online, health OK"]  # what it waited for
    assert "NODE002: Offline, health OK" in said
    back = backend.bring_online(["NODE002", "NODE003"], progress=said.append)
    assert {n.state for n in back} == {"Online"}


def test_a_node_that_runs_a_job_drains_and_the_wait_has_a_bound(backend: Backend, head: HeadNode) -> None:
    job_id = running_job(head, "NODE004")
    start = time.monotonic()
    with pytest.raises(NodeWaitError) as failed:
        backend.take_offline(["NODE004"], force=False, progress=lambda line: None, timeout_s=1.0)
    assert 1.0 <= time.monotonic() - start < 10
    assert str(failed.value) == (
        "1 node(s) not Offline after 1 s: NODE004 Draining (health OK): a job still runs there"
    )
    assert job_state(head, job_id) == "Running"
    assert Client(head, "alice", PASSWORD).post(f"/jobs/{job_id}/cancel").status_code == 204
    taken = backend.take_offline(["NODE004"], force=False, progress=lambda line: None, timeout_s=10)
    assert taken[0].state == "Offline"


def test_force_does_not_wait_for_the_job(backend: Backend, head: HeadNode) -> None:
    job_id = running_job(head, "NODE004")
    taken = backend.take_offline(["NODE004"], force=True, progress=lambda line: None, timeout_s=10)
    # Set-HpcNodeState -Force: Offline at once; REST has no force: Draining, which takes no new job.
    assert taken[0].state == ("Offline" if backend.kind == "winrm" else "Draining")
    assert job_state(head, job_id) == "Running"  # what runs there ends with its VM
    Client(head, "alice", PASSWORD).post(f"/jobs/{job_id}/cancel")


def test_an_unknown_node_is_one_line(backend: Backend) -> None:
    with pytest.raises(Exception, match="NOPE") as failed:
        backend.take_offline(["NOPE"], force=False, progress=lambda line: None, timeout_s=5)
    assert "\n" not in str(failed.value)


@pytest.mark.parametrize("kind", ["rest", "winrm"])
def test_only_an_administrator_takes_nodes_offline(head: HeadNode, kind: str) -> None:
    bob = opened(head, kind, "bob")
    try:
        with pytest.raises(Exception, match="administrator") as refused:
            bob.take_offline(["NODE002"], force=False, progress=lambda line: None, timeout_s=5)
    finally:
        bob.close()
    assert "\n" not in str(refused.value)
    assert states(head)["NODE002"] == "Online"


def test_the_local_backend_has_no_nodes_to_take_offline() -> None:
    from hpcjob.job.spec import SpecError

    local = open_backend("local", None, None)
    with pytest.raises(SpecError, match="no cluster nodes"):
        local.take_offline(["LOCAL1"], force=False, progress=lambda line: None)


def test_nodes_are_put_in_a_group_made_for_them(backend: Backend, head: HeadNode) -> None:
    """The data nodes' group (issue 34): made where the cluster has none, the nodes put in it, and the
    same again does no harm (REST's createNodeGroup and moveNodesOfGroup; WinRM's New-HpcGroup and
    Add-HpcGroup)."""
    assert backend.add_to_group("CPUNodes", ["NODE003", "NODE004"]) == ["NODE003", "NODE004"]
    assert backend.add_to_group("CPUNodes", ["NODE004"]) == ["NODE003", "NODE004"]
    assert {n.name for n in backend.nodes("CPUNodes")} == {"NODE003", "NODE004"}
    rows = Client(head, "alice", PASSWORD).get("/cluster/nodeGroups").json()
    assert [(r["Name"], r["Managed"]) for r in rows if r["Name"] == "CPUNodes"] == [("CPUNodes", False)]


@pytest.mark.parametrize("kind", ["rest", "winrm"])
def test_only_an_administrator_puts_nodes_in_a_group(head: HeadNode, kind: str) -> None:
    bob = opened(head, kind, "bob")
    try:
        with pytest.raises(HpcjobError, match="administrator"):
            bob.add_to_group("CPUNodes", ["NODE003"])
    finally:
        bob.close()
    assert "CPUNodes" not in {
        r["Name"] for r in Client(head, "alice", PASSWORD).get("/cluster/nodeGroups").json()
    }
