"""Nodes taken offline and brought online, and the wait until the head node shows them so: what the
REST and WinRM backends share (their `take_offline` and `bring_online`), and what `hpcjob cluster start`
uses to wait for nodes to report again.

HPC Pack does a node state change asynchronously: REST's `POST /cluster/nodes/{name}/operations/{op}`
answers 202, and "the caller has to query the node state for the operation result"
(reference/hpcpack-rest-api/hpcpack.yaml L293-310); `Set-HpcNodeState -Async` "returns immediately
without waiting" (MicrosoftDocs/windows-powershell-docs @ 04aa4cb3
docset/winserver2012r2-ps/hpc/Set-HpcNodeState.md). A node that runs a job goes Draining first, and
"can take a long time to go offline" (same page): every wait here has a bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hpcjob.job.spec import HpcjobError

if TYPE_CHECKING:
    from hpcjob.backends.scheduler import PollPolicy
    from hpcjob.job.results import NodeInfo

OFFLINE, ONLINE, DRAINING = "Offline", "Online", "Draining"
# How long a node state change may take before hpcjob gives up (seconds): Offline waits for the jobs
# that still run there to end (a drain), Online only for the head node to make the change.
OFFLINE_TIMEOUT_S = 600.0
ONLINE_TIMEOUT_S = 300.0

Progress = Callable[[str], None]


class NodeWaitError(HpcjobError):
    """Nodes that did not get where they were asked to within the bound: one line naming them."""


def wait_for_nodes(
    read: Callable[[], list[NodeInfo]],
    names: Sequence[str],
    done: Callable[[NodeInfo], bool],
    *,
    wanted: str,
    timeout_s: float,
    progress: Progress,
    poll: PollPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[NodeInfo]:
    """Read the nodes (`read`: one look at all of them) until each of `names` is `done`, saying each
    node's change of state or health as it comes; their last look, in the order of `names`. A node the
    head node does not list fails at once; nodes not `wanted` (words for the error: "Offline") after
    `timeout_s` fail with their states named."""
    from hpcjob.backends.scheduler import PollPolicy

    poll = poll or PollPolicy()
    deadline = clock() + timeout_s
    seen: dict[str, str] = {}
    wait = poll.first_wait_s
    while True:
        found = {node.name.upper(): node for node in read()}
        missing = [name for name in names if name.upper() not in found]
        if missing:
            raise NodeWaitError(f"the head node lists no node {', '.join(missing)}")
        nodes = [found[name.upper()] for name in names]
        changed = False
        for node in nodes:
            now = f"{node.state}, health {node.health or '-'}"
            if seen.get(node.name) != now:
                if node.name in seen or not done(node):  # the first look: only the nodes still to go
                    progress(f"{node.name}: {now}")
                changed = changed or node.name in seen
                seen[node.name] = now
        left = [node for node in nodes if not done(node)]
        if not left:
            return nodes
        if clock() >= deadline:
            states = ", ".join(f"{n.name} {n.state} (health {n.health or '-'})" for n in left)
            raise NodeWaitError(
                f"{len(left)} node(s) not {wanted} after {timeout_s:.0f} s: {states}"
                + (": a job still runs there" if any(n.state == DRAINING for n in left) else "")
            )
        wait = poll.first_wait_s if changed else min(wait * poll.factor, poll.max_wait_s)
        sleep(max(0.0, min(wait, deadline - clock())))


def is_offline(force: bool) -> Callable[[NodeInfo], bool]:
    """Whether a node is taken offline: Offline; with `force` where the head node has no forced Offline
    (REST), Draining too: it takes no new job, and what still runs there ends with its VM."""
    return lambda node: node.state == OFFLINE or (force and node.state == DRAINING)


def is_online(node: NodeInfo) -> bool:
    return node.state == ONLINE
