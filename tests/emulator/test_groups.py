"""Node groups through both front doors, and a node the cluster does not know put in one: left out
without an error (Add-HpcGroup's page calls -NodeName a filter) or the whole request refused, by the
switch `unknown_group_node` (REST: UNVERIFIED either way)."""

from __future__ import annotations

from typing import Any

import pytest

from hpcjob.emulator import HeadNode
from hpcjob.emulator.base import Actor
from hpcjob.job.render.winrm import bootstrap_command, script_input

from .conftest import PASSWORD, Client


def add_over_rest(head: HeadNode, group: str, names: list[str]) -> tuple[int, Any]:
    client = Client(head)
    if group not in {g["Name"] for g in client.get("/cluster/nodeGroups").json()}:
        assert client.post("/cluster/nodeGroups", json={"Name": group, "Description": "d"}).status_code == 200
    answer = client.request(
        "PATCH", f"/cluster/nodeGroups/{group}/nodes", json={"Operation": "add", "NodeNames": names}
    )
    return answer.status_code, answer.json() if answer.status_code == 200 else answer.text


def add_over_powershell(head: HeadNode, group: str, names: list[str]) -> tuple[int, str]:
    command, arguments = bootstrap_command()
    data = {"Group": group, "Names": names, "Description": "d"}
    stdin = script_input("group", data)  # hpcjob's own group script
    _, err, code = head.powershell(Actor("alice", admin=True), command, list(arguments), stdin)
    return code, err.decode()


def members(head: HeadNode, group: str) -> list[str]:
    return list(Client(head).get(f"/cluster/nodeGroups/{group}/nodes").json())


@pytest.mark.parametrize("door", ["rest", "powershell"])
def test_an_unknown_node_is_left_out_without_an_error_by_default(make_head: Any, door: str) -> None:
    head: HeadNode = make_head()
    if door == "rest":
        assert add_over_rest(head, "Data", ["CPU04", "NOPE"]) == (200, ["CPU04"])
    else:
        assert add_over_powershell(head, "Data", ["CPU04", "NOPE"]) == (0, "")
    assert members(head, "Data") == ["CPU04"]


@pytest.mark.parametrize("door", ["rest", "powershell"])
def test_with_the_switch_an_unknown_node_refuses_the_whole_request(make_head: Any, door: str) -> None:
    head: HeadNode = make_head(unknown_group_node="error")
    if door == "rest":
        status, said = add_over_rest(head, "Data", ["CPU04", "NOPE"])
        assert (status, said) == (404, "The node NOPE was not found.")
    else:
        code, said = add_over_powershell(head, "Data", ["CPU04", "NOPE"])
        assert code == 1 and said.startswith("Add-HpcGroup : The node NOPE was not found.")
    assert members(head, "Data") == []  # the group was made (its own request, its own statement)


def test_powershell_fails_when_no_node_it_names_exists(make_head: Any) -> None:
    """-NodeName filters "as long as you specify at least one node that does exist"."""
    head: HeadNode = make_head()
    code, said = add_over_powershell(head, "Data", ["NOPE", "NADA"])
    assert code == 1 and said.startswith("Add-HpcGroup : No node named NOPE, NADA was found.")
    assert members(head, "Data") == []


def test_the_switch_takes_only_its_two_values() -> None:
    with pytest.raises(ValueError, match="skip, error"):
        HeadNode(users={"alice": PASSWORD}, unknown_group_node="ignore")  # type: ignore[arg-type]


def test_a_removed_node_leaves_the_cluster_and_its_groups(make_head: Any) -> None:
    head: HeadNode = make_head()
    assert add_over_rest(head, "Data", ["CPU04", "GPU02"])[0] == 200
    head.remove_node("cpu04")
    client = Client(head)
    assert "CPU04" not in {n["Name"] for n in client.get("/cluster/nodes").json()}
    assert members(head, "Data") == ["GPU02"]
    assert client.get("/cluster/nodes/CPU04").status_code == 404
    assert add_over_rest(head, "Data", ["CPU04"]) == (200, ["GPU02"])  # skipped now: it is unknown
