"""The emulated cluster as the front doors see it: one object, one lock, the parts it is made of.

`Cluster` holds no rules of its own. It makes the parts, each in a module of its own, shares its lock
and condition with them, and answers the REST API (api.py), the PowerShell host (powershell.py) and the
head node (headnode.py) by handing each request to the part it concerns:

- nodes.py: the nodes, their states, health and groups (`NodeRegistry`);
- jobs.py: jobs and tasks, the requests on them and their state machines (`JobBook`);
- scheduler.py: the thread that validates, allocates nodes and dispatches tasks (`Scheduler`);
- agent.py: each task run as the Linux node agent runs it, and clusrun (`NodeAgent`);
- base.py: what they share (`ApiError`, `Actor`, `now`).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from hpcjob.emulator.agent import NodeAgent
from hpcjob.emulator.base import Actor
from hpcjob.emulator.jobs import NODE_LOST_MESSAGE, Job, JobBook, Task
from hpcjob.emulator.nodes import LOSSES, NODE_HEALTHS, Node, NodeRegistry, NodeSpec
from hpcjob.emulator.scheduler import Scheduler, validate


class Cluster:
    """All state of the emulated scheduler, behind one lock, and the thread that moves it on."""

    def __init__(
        self,
        nodes: Iterable[NodeSpec],
        *,
        work_root: str,
        grace_period: float,
        domain: str | None,
        command_line_limit: int | None,
        step_delay: float,
        backfill: bool,
        base_env: Mapping[str, str],
        head_name: str,
        password_of: Callable[[str], str] | None = None,
        detection_delay_s: float = 90.0,
        unreachable_health: str = "Error",
        node_lost_message: str = NODE_LOST_MESSAGE,
        job_retry_count: int = 0,
        auto_requeue_delay_s: float = 2.0,
        node_operation_delay_s: float = 0.5,
        unknown_group_node: str = "skip",
    ) -> None:
        """`password_of(owner)`: the job owner's password, which the agent hands to execution filters.
        The rest is what a lost node does (`lose_node`), how long a node operation takes
        (`set_node_state`) and what a node group does with a node it does not know: see HeadNode."""
        check_losses(
            detection_delay_s, unreachable_health, node_lost_message, job_retry_count, auto_requeue_delay_s
        )
        if node_operation_delay_s < 0:
            raise ValueError("node_operation_delay_s must not be negative")
        self.node_operation_delay_s = node_operation_delay_s
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.registry = NodeRegistry(nodes, unknown_group_node)
        self.agent = NodeAgent(
            self.lock,
            self.registry,
            work_root=work_root,
            grace_period=grace_period,
            base_env=base_env,
            head_name=head_name,
            password_of=password_of,
        )
        self.book = JobBook(
            self.lock,
            self.changed,
            self.registry,
            grace_period=grace_period,
            domain=domain,
            command_line_limit=command_line_limit,
            step_delay=step_delay,
            validate=lambda job: validate(job, self.registry),
            stop_process=self.agent.stop,
            node_lost_message=node_lost_message,
            job_retry_count=job_retry_count,
            auto_requeue_delay=auto_requeue_delay_s,
        )
        self.scheduler = Scheduler(
            self.lock,
            self.changed,
            self.registry,
            self.book,
            self.agent,
            step_delay=step_delay,
            backfill=backfill,
            detection_delay=detection_delay_s,
            unreachable_health=unreachable_health,
        )
        # The parts' own tables, not copies: callers read them under the lock (and tests set base_env).
        self.nodes: dict[str, Node] = self.registry.nodes
        self.jobs: dict[int, Job] = self.book.jobs
        self.base_env: dict[str, str] = self.agent.base_env

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.agent.start()
        self.scheduler.start()

    def close(self) -> None:
        """Kill every task process (no grace: the head node is going away), then stop the thread."""
        with self.lock:
            self.scheduler.closing = True
            self.book.stop_all("The emulator shut down.")
            self.changed.notify_all()
            runners = self.agent.runners()
        self.agent.wait_for(runners)
        self.scheduler.join()
        self.agent.close()

    def marker_prefix(self) -> bytes:
        return self.agent.marker_prefix()

    # --------------------------------------------------------------------------------------- nodes

    def node(self, name: str) -> Node:
        return self.registry.node(name)

    def set_node(
        self,
        name: str,
        *,
        state: str | None = None,
        health: str | None = None,
        groups: Sequence[str] | None = None,
        cores: int | None = None,
    ) -> None:
        with self.lock:
            node = self.registry.node(name)
            self.registry.change(node, state=state, health=health, groups=groups, cores=cores)
            if health == "Error":
                self.book.node_lost(node.name)
            self.changed.notify_all()

    def lose_node(self, name: str, how: str = "evicted") -> None:
        """Lose a node: "evicted" (its VM deallocated) SIGKILLs its task processes before returning;
        "unreachable" (its agent, or the way to it, gone) leaves them running. The head node notices
        only after the detection delay: then the node's health is `unreachable_health` and the tasks
        it took end Failed (killed first if they still run). Its State stays as it is."""
        if how not in LOSSES:
            raise ValueError(f"how must be one of {', '.join(LOSSES)}, not {how!r}")
        with self.lock:
            node = self.registry.node(name)
            if node.lost is not None:
                raise ValueError(f"the node {node.name} is already lost ({node.lost})")
            node.lost, node.lost_at = how, time.monotonic()
            taken = self.book.lose_tasks(node.name)
            doomed = [t.process for t in taken if t.process is not None and not t.exited]
            self.changed.notify_all()
        if how == "evicted":
            for process in doomed:
                process.kill()

    def restore_node(self, name: str) -> None:
        """A lost node comes back (its VM started again) and its agent reports: health OK at once, its
        State as it was. Before the head node noticed the loss, the tasks the node took end now as at
        detection, except an unreachable node's tasks that still run: they carry on."""
        with self.lock:
            node = self.registry.node(name)
            if node.lost is None:
                raise ValueError(f"the node {node.name} is not lost")
            if not node.unreachable:
                self.book.node_back(node.name, keep_running=node.lost == "unreachable")
            node.lost, node.unreachable = None, False
            self.registry.change(node, health="OK")
            self.changed.notify_all()

    def set_node_state(self, name: str, state: str, *, force: bool = False) -> None:
        """A node operation (REST bringOnline/takeOffline, Set-HpcNodeState -Async): accepted now, made
        `node_operation_delay_s` later by the scheduler's thread. Offline drains a node that a job holds
        (Draining until its jobs end) unless forced; what a forced Offline does to the tasks running
        there is UNVERIFIED: they run on (the VM's deallocation ends them)."""
        with self.lock:
            node = self.node(name)
            due = time.monotonic() + self.node_operation_delay_s
            self.registry.operate(node, state, force=force, due=due)
            if self.node_operation_delay_s == 0:
                self.registry.make_due(due)
            self.changed.notify_all()

    def remove_node(self, name: str) -> None:
        with self.lock:
            self.registry.remove(name)
            self.changed.notify_all()

    def groups(self) -> dict[str, tuple[str, bool]]:
        """Group name -> (description, managed): the built-in groups and every group a node names."""
        return self.registry.groups()

    def group(self, name: str) -> tuple[str, str, bool]:
        return self.registry.group(name)

    def group_members(self, name: str) -> list[str]:
        return self.registry.group_members(name)

    def create_group(self, name: str, description: str) -> tuple[str, str, bool]:
        return self.registry.create_group(name, description)

    def move_nodes(self, name: str, operation: str, nodes: Sequence[str]) -> list[str]:
        return self.registry.move_nodes(name, operation, nodes)

    def node_root(self, node: str) -> str:
        """The emulated node's own `/` (HPCJOB_NODE_ROOT in the node's processes)."""
        return self.agent.node_root(node)

    def filters_dir(self, node: str) -> str:
        """Where the node's agent looks for execution filters (/opt/hpcnodemanager/filters on a node)."""
        return self.agent.filters_dir(node)

    def node_env(self, node: str) -> dict[str, str]:
        """The environment a process of `node` starts from."""
        return self.agent.node_env(node)

    def run_as_system(self, node: str, command: str) -> tuple[int, str]:
        """`clusrun /user:system` on one node: the command's exit code and its output."""
        return self.agent.run_as_system(node, command)

    # ---------------------------------------------------------------------------------------- jobs

    def job(self, job_id: int) -> Job:
        return self.book.job(job_id)

    def task(self, job_id: int, task_id: int) -> Task:
        return self.book.task(job_id, task_id)

    def owner_name(self, actor: Actor) -> str:
        return self.book.owner_name(actor)

    def create_job(self, actor: Actor, pairs: Sequence[tuple[str, str | None]]) -> int:
        return self.book.create_job(actor, pairs)

    def create_job_from_xml(self, actor: Actor, xml: str) -> int:
        return self.book.create_job_from_xml(actor, xml)

    def set_job(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> None:
        self.book.set_job(actor, job_id, pairs)

    def set_pairs(
        self,
        actor: Actor,
        job_id: int,
        task_id: int | None,
        kind: str,
        pairs: Sequence[tuple[str, str | None]],
    ) -> None:
        """Environment variables (a null or empty value removes one) or custom properties."""
        self.book.set_pairs(actor, job_id, task_id, kind, pairs)

    def get_pairs(
        self, job_id: int, task_id: int | None, kind: str, names: list[str] | None
    ) -> list[tuple[str, str]]:
        return self.book.get_pairs(job_id, task_id, kind, names)

    def submit(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> None:
        self.book.submit(actor, job_id, pairs)

    def cancel_job(self, actor: Actor, job_id: int, message: str | None, forced: bool) -> None:
        self.book.cancel_job(actor, job_id, message, forced)

    def finish_job(self, actor: Actor, job_id: int, message: str | None) -> None:
        self.book.finish_job(actor, job_id, message)

    def requeue_job(self, actor: Actor, job_id: int) -> None:
        self.book.requeue_job(actor, job_id)

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: set[str] | None,
        group: str | None,
        changed_since: dt.datetime | None,
        node_names: list[str] | None,
    ) -> list[Job]:
        return self.book.list_jobs(
            owner=owner, states=states, group=group, changed_since=changed_since, node_names=node_names
        )

    # --------------------------------------------------------------------------------------- tasks

    def add_task(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> int:
        return self.book.add_task(actor, job_id, pairs)

    def set_task(
        self, actor: Actor, job_id: int, task_id: int, pairs: Sequence[tuple[str, str | None]]
    ) -> None:
        self.book.set_task(actor, job_id, task_id, pairs)

    def cancel_task(self, actor: Actor, job_id: int, task_id: int, message: str | None, forced: bool) -> None:
        self.book.cancel_task(actor, job_id, task_id, message, forced)

    def finish_task(self, actor: Actor, job_id: int, task_id: int, message: str | None) -> None:
        self.book.finish_task(actor, job_id, task_id, message)

    def requeue_task(self, actor: Actor, job_id: int, task_id: int) -> None:
        self.book.requeue_task(actor, job_id, task_id)

    # ------------------------------------------------------------------------------ for the tests

    def live_processes(self) -> set[tuple[int, int]]:
        """Every process still alive that a task of this emulator started."""
        return self.agent.live_processes()


def check_losses(
    detection_delay_s: float,
    unreachable_health: str,
    node_lost_message: str,
    job_retry_count: int,
    auto_requeue_delay_s: float,
) -> None:
    """ValueError for settings of node losses that make no sense."""
    if unreachable_health not in NODE_HEALTHS:
        raise ValueError(f"unreachable_health must be one of {', '.join(NODE_HEALTHS)}")
    if detection_delay_s < 0 or auto_requeue_delay_s < 0 or job_retry_count < 0:
        raise ValueError("detection_delay_s, auto_requeue_delay_s and job_retry_count must not be negative")
    try:
        node_lost_message.format(node="NODE")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"node_lost_message may name only {{node}}: {err}") from None
