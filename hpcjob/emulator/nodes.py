"""The emulated cluster's nodes: how they are configured, their records, states and health, and groups.

A node is a name with a state (Online, Offline, Draining...), a health (OK, Error...), cores, sockets,
memory and the groups it belongs to; it also keeps which jobs hold how many of its cores, which the
scheduler fills and the jobs' state machine empties. The built-in groups exist with no node in them;
any other group exists because a node names it. What a change of health does to the tasks on a node is
the jobs' concern (`JobBook.node_lost`); this module only keeps the records. Callers hold the cluster's
lock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcjob.emulator.base import ApiError, now

NODE_STATES = (
    "Unknown",
    "Provisioning",
    "Offline",
    "Starting",
    "Online",
    "Draining",
    "Rejected",
    "Removing",
    "NotDeployed",
    "Stopping",
)
NODE_HEALTHS = ("OK", "Warning", "Error", "Transitional", "Unapproved")
# How a node can be lost: its VM evicted (deallocated: its processes die with it) or its agent
# unreachable (the processes run on, unheard); either way the head node learns it only after the
# node missed its heartbeats.
LOSSES = ("evicted", "unreachable")
# What a request to put a node the cluster does not know in a group does: "error" refuses the whole
# request, "skip" leaves that node out and puts the others in. Add-HpcGroup's page calls -NodeName "a
# filter parameter, so you do not receive an error for specifying a node the does not exist in the HPC
# cluster as long as you specify at least one node that does exist" (MicrosoftDocs/windows-powershell-docs
# @ 1095f968 docset/winserver2012r2-ps/hpc/Add-HpcGroup.md): "skip". REST's moveNodesOfGroup names no
# error (Azure/hpcpack-rest-api-spec @ 9bd56c8 src/hpcpack.yaml L623-660): UNVERIFIED either way.
UNKNOWN_GROUP_NODES = ("skip", "error")
BUILTIN_GROUPS = {
    "HeadNodes": "The head nodes in the cluster",
    "ComputeNodes": "The compute nodes in the cluster",
    "WCFBrokerNodes": "The broker nodes in the cluster",
    "WorkstationNodes": "The workstation nodes in the cluster",
    "LinuxNodes": "The Linux nodes in the cluster",
}


@dataclass
class NodeSpec:
    """A compute node as configured: what the node APIs report and what the scheduler allocates."""

    name: str
    state: str = "Online"
    health: str = "OK"
    cores: int = 4
    sockets: int = 1
    memory_mb: int = 16384
    groups: Sequence[str] = ("ComputeNodes", "LinuxNodes")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSpec:
        """From a typed Node object as ``GET /cluster/nodes`` returns it (keys case-insensitive)."""
        low = {str(k).lower(): v for k, v in data.items()}
        if not isinstance(low.get("name"), str) or not low["name"]:
            raise ValueError(f"a node needs a Name: {dict(data)}")
        groups = low.get("groups", ["ComputeNodes", "LinuxNodes"])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ValueError(f"Groups of node {low['name']} must be a list of names")
        return cls(
            name=low["name"],
            state=str(low.get("state", "Online")),
            health=str(low.get("health", "OK")),
            cores=int(low.get("cores", 4)),
            sockets=int(low.get("sockets", 1)),
            memory_mb=int(low.get("memorysize", 16384)),
            groups=tuple(groups),
        )


@dataclass
class Node:
    id: int
    name: str
    state: str
    health: str
    cores: int
    sockets: int
    memory_mb: int
    groups: list[str]
    online_time: dt.datetime | None = None
    offline_time: dt.datetime | None = None
    held: dict[int, int] = field(default_factory=dict)  # job id -> cores held
    # A lost node: how (one of LOSSES), when (time.monotonic()), and whether the head node has
    # noticed yet (after the detection delay); until then it reports the node as before.
    lost: str | None = None
    lost_at: float = 0.0
    unreachable: bool = False
    # A state change asked for (REST's node operations, Set-HpcNodeState) and not yet made: the state
    # asked for, whether forced, and when it takes effect (time.monotonic()); the head node makes it
    # asynchronously.
    pending: tuple[str, bool, float] | None = None

    def in_group(self, group: str) -> bool:
        return any(g.lower() == group.lower() for g in self.groups)


class NodeRegistry:
    """The nodes by lower-case name, in the order they were added (their Ids), and the groups they make."""

    def __init__(self, specs: Iterable[NodeSpec], unknown_group_node: str = "skip") -> None:
        if unknown_group_node not in UNKNOWN_GROUP_NODES:
            raise ValueError(f"unknown_group_node must be one of {', '.join(UNKNOWN_GROUP_NODES)}")
        self.nodes: dict[str, Node] = {}
        self.created_groups: dict[str, str] = {}  # made by an administrator: name -> description
        self.unknown_group_node = unknown_group_node
        for spec in specs:
            self.add(spec)
        if not self.nodes:
            raise ValueError("the cluster needs at least one node")

    def add(self, spec: NodeSpec) -> None:
        if spec.name.lower() in self.nodes:
            raise ValueError(f"duplicate node name {spec.name}")
        check_node(spec.state, spec.health)
        self.nodes[spec.name.lower()] = Node(
            id=max((node.id for node in self.nodes.values()), default=0) + 1,  # one removed leaves a gap
            name=spec.name,
            state=spec.state,
            health=spec.health,
            cores=spec.cores,
            sockets=spec.sockets,
            memory_mb=spec.memory_mb,
            groups=list(spec.groups),
            online_time=now() if spec.state == "Online" else None,
            offline_time=None if spec.state == "Online" else now(),
        )

    def remove(self, name: str) -> None:
        """Remove-HpcNode: the node's entry leaves the cluster, and with it its groups (MicrosoftDocs/
        windows-powershell-docs @ 1b636b31 docset/winserver2012r2-ps/hpc/Remove-HpcNode.md). A node a job
        holds is refused (the emulator's rule: the page says nothing of one)."""
        node = self.node(name)
        if node.held:
            raise ApiError(400, f"The node {node.name} runs a job: it cannot be removed.")
        del self.nodes[node.name.lower()]

    def node(self, name: str) -> Node:
        found = self.nodes.get(name.strip().lower())
        if found is None:
            raise ApiError(404, f"The node {name} was not found.")
        return found

    @staticmethod
    def change(
        node: Node,
        *,
        state: str | None = None,
        health: str | None = None,
        groups: Sequence[str] | None = None,
        cores: int | None = None,
    ) -> None:
        """Set what is given, after checking the state and health; a move to or from Online is stamped."""
        check_node(state or node.state, health or node.health)
        if state is not None and state != node.state:
            if state == "Online":
                node.online_time = now()
            elif node.state == "Online":
                node.offline_time = now()
            node.state = state
        if health is not None:
            node.health = health
        if groups is not None:
            node.groups = list(groups)
        if cores is not None:
            node.cores = cores

    def operate(self, node: Node, state: str, *, force: bool, due: float) -> None:
        """Ask for `node` to go Online or Offline at `due` (time.monotonic()); a later request replaces
        one not yet made."""
        if state not in ("Online", "Offline"):
            raise ValueError(f"a node can be set Online or Offline, not {state!r}")
        node.pending = (state, force, due)

    def make_due(self, clock: float) -> None:
        """Make the state changes due by `clock`: Online; Offline at once when forced or when no job
        holds the node, else Draining (Offline once its jobs end: `drain`)."""
        for node in self.nodes.values():
            if node.pending is None or node.pending[2] > clock:
                continue
            state, force, _ = node.pending
            node.pending = None
            if state == "Offline" and node.held and not force:
                state = "Draining"
            self.change(node, state=state)

    def drain(self) -> None:
        """A Draining node goes Offline once no job holds it."""
        for node in self.nodes.values():
            if node.state == "Draining" and not node.held:
                node.state = "Offline"
                node.offline_time = now()

    def groups(self) -> dict[str, tuple[str, bool]]:
        """Group name -> (description, managed): the built-in groups and every group a node names."""
        found = {name: (text, True) for name, text in BUILTIN_GROUPS.items()}
        found.update({name: (text, False) for name, text in self.created_groups.items()})
        known = {g.lower() for g in found}
        for node in self.nodes.values():
            for group in node.groups:
                if group.lower() not in known:
                    known.add(group.lower())
                    found[group] = ("", False)
        return found

    def group(self, name: str) -> tuple[str, str, bool]:
        for group, (text, managed) in self.groups().items():
            if group.lower() == name.strip().lower():
                return group, text, managed
        raise ApiError(404, f"The node group {name} was not found.")

    def group_members(self, name: str) -> list[str]:
        group, _, _ = self.group(name)
        return [n.name for n in self.nodes.values() if n.in_group(group)]

    def create_group(self, name: str, description: str) -> tuple[str, str, bool]:
        """REST createNodeGroup (SPEC19 `POST /cluster/nodeGroups`). A name taken: 400, UNVERIFIED (the
        spec names no error); the 64-character limit is Get-HpcGroup's reference's."""
        name = name.strip()
        if not name or len(name) > 64:
            raise ApiError(400, "A node group name has 1 to 64 characters.")
        if any(group.lower() == name.lower() for group in self.groups()):
            raise ApiError(400, f"The node group {name} already exists.")
        self.created_groups[name] = description
        return name, description, False

    def move_nodes(self, name: str, operation: str, nodes: Iterable[str]) -> list[str]:
        """REST moveNodesOfGroup (SPEC19 `PATCH /cluster/nodeGroups/{name}/nodes`, a NodeGroupOperation:
        add or remove), and Add-HpcGroup: the group's members after it. A built-in group's members are
        HPC Pack's to say (400, UNVERIFIED). A node the cluster does not know: `unknown_group_node`."""
        group, _, managed = self.group(name)
        if operation not in ("add", "remove"):
            raise ApiError(400, f"The operation {operation} is not add or remove.")
        if managed:
            raise ApiError(400, f"The node group {group} is managed by HPC Pack: its nodes cannot be moved.")
        found = []
        for node_name in nodes:
            node = self.nodes.get(str(node_name).strip().lower())
            if node is None:
                if self.unknown_group_node == "skip":
                    continue
                raise ApiError(404, f"The node {node_name} was not found.")  # before any node moves
            found.append(node)
        for node in found:
            if operation == "add" and not node.in_group(group):
                node.groups.append(group)
            elif operation == "remove":
                node.groups = [g for g in node.groups if g.lower() != group.lower()]
        return self.group_members(group)


def check_node(state: str, health: str) -> None:
    if state not in NODE_STATES:
        raise ValueError(f"node state {state!r} is not one of {', '.join(NODE_STATES)}")
    if health not in NODE_HEALTHS:
        raise ValueError(f"node health {health!r} is not one of {', '.join(NODE_HEALTHS)}")
