"""The emulated scheduler: the thread that moves submitted jobs on, allocates nodes and starts tasks.

Each step of its loop, under the cluster's lock: a Submitted job goes Validating, then Queued when
`validate` accepts it (or Failed, saying why); queued jobs start in order of priority, then submission,
when `allocate` finds them nodes (no backfill unless asked for: a job that cannot start holds back the
later ones); a running job's queued tasks are dispatched to its nodes, in task order, and handed to the
node agent; a job past its RuntimeSeconds is canceled; a node state change asked for (a node operation)
is made once due; a Draining node that no job holds goes Offline.
A lost node is noticed `detection_delay` seconds after its loss (the heartbeats it missed): its health
becomes `unreachable_health` and the tasks it took fail; a job that failed for it and has JobRetryCount
left goes back to the queue by itself. Tasks dispatched to a lost node before that never start.
The rules of validation and allocation are the scheduler's as facts/hpcpack-rest.md and the README
describe them: RequestedNodes, NodeGroups with NodeGroupOp (Intersect, Union, Uniform), RequiredNodes,
the Node and Core units, IsExclusive, AutoCalculateMin/Max. Every state change goes through the
`JobBook`; the processes are the `NodeAgent`'s.
"""

from __future__ import annotations

import threading
import time

from hpcjob.emulator import props as P
from hpcjob.emulator.agent import NodeAgent
from hpcjob.emulator.base import now
from hpcjob.emulator.jobs import ACTIVE_TASK, Job, JobBook, Task
from hpcjob.emulator.nodes import Node, NodeRegistry

# Tasks started a tick (0.1 s) at most: a job of 1,000 tasks starts in batches, the head node's lock let go
# between them, so that the REST API and WinRM answer while it starts (a real head node starts tasks on
# their nodes' agents in parallel; the emulator starts each as processes of this machine).
LAUNCHES_PER_TICK = 32


class Scheduler:
    """The scheduler's thread and its decisions, on the jobs of `book` and the nodes of `registry`."""

    def __init__(
        self,
        lock: threading.RLock,
        changed: threading.Condition,
        registry: NodeRegistry,
        book: JobBook,
        agent: NodeAgent,
        *,
        step_delay: float,
        backfill: bool,
        detection_delay: float = 90.0,
        unreachable_health: str = "Error",
    ) -> None:
        self.lock = lock
        self.changed = changed
        self.registry = registry
        self.nodes = registry.nodes
        self.book = book
        self.agent = agent
        self.step_delay = step_delay
        self.backfill = backfill
        self.detection_delay = detection_delay
        self.unreachable_health = unreachable_health
        self.closing = False  # set under the lock: the loop ends at its next step
        self._launches_left = LAUNCHES_PER_TICK
        self._thread = threading.Thread(target=self._loop, name="hpcjob-emulator-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.closing:
                    return
                self._tick()
                self.changed.wait(timeout=0.1)
                processes = [
                    t.process
                    for j in self.book.jobs.values()
                    for t in j.tasks
                    if t.process is not None and not t.exited
                ]
            self.agent.refresh(processes)

    def _tick(self) -> None:
        book = self.book
        clock = time.monotonic()
        self._launches_left = LAUNCHES_PER_TICK
        for node in self.nodes.values():
            if node.lost is not None and (node.unreachable or clock >= node.lost_at + self.detection_delay):
                if not node.unreachable:  # the heartbeats it missed: the head node gives up on it
                    node.unreachable = True
                    self.registry.change(node, health=self.unreachable_health)
                book.fail_lost_tasks(node.name)
        for job in book.jobs.values():
            if job.state == "Failed" and job.auto_requeue_at is not None and clock >= job.auto_requeue_at:
                book.auto_requeue(job)
            if job.state == "Submitted" and clock >= job.step_at:
                book.job_state(job, "Validating")
                job.step_at = clock + self.step_delay
            elif job.state == "Validating" and clock >= job.step_at:
                error = validate(job, self.registry)
                if error:
                    job.props["ErrorMessage"] = error
                    for task in job.tasks:
                        if task.state not in P.ENDED:
                            book.task_state(task, "Canceled")
                    book.end_job(job, "Failed")
                else:
                    for task in job.tasks:
                        if task.state == "Submitted":
                            book.task_state(task, "Queued")
                    book.job_state(job, "Queued")
                    job.step_at = clock + self.step_delay
        queued = sorted(
            (j for j in book.jobs.values() if j.state == "Queued"),
            key=lambda j: (-int(j.props["ExpandedPriority"]), j.seq),
        )
        for job in queued:
            started = clock >= job.step_at and self._held_until_passed(job) and self._try_start(job)
            if not started and not self.backfill:
                break  # first come, first served: a job that cannot start yet holds back the later ones
        for job in book.jobs.values():
            if job.state == "Running":
                runtime = int(job.props["RuntimeSeconds"])
                if runtime and clock - job.started_at > runtime:
                    book.stop_job(
                        job, "Canceled", f"The job exceeded its run time limit of {runtime} seconds.", False
                    )
                else:
                    self._dispatch(job)
                    book.check_job_end(job)
        self.registry.make_due(clock)
        self.registry.drain()

    @staticmethod
    def _held_until_passed(job: Job) -> bool:
        hold = job.props["HoldUntil"]
        return not hold or P.parse_time(hold) <= now()

    def _try_start(self, job: Job) -> bool:
        allocation = self._allocate(job)
        if allocation is None:
            return False
        whole = job.props["UnitType"] == "Node" or job.flag("IsExclusive")
        for name, cores in allocation.items():
            node = self.nodes[name.lower()]
            node.held[job.id] = node.cores if whole else cores
        job.allocation = allocation
        job.started_at = time.monotonic()
        job.props["StartTime"] = P.format_time(now())
        job.props["AllocatedNodes"] = ",".join(allocation)
        self.book.job_state(job, "Running")
        return True

    def _allocate(self, job: Job) -> dict[str, int] | None:
        usable = [self.nodes[n.lower()] for n in job.candidates]
        usable = [n for n in usable if n.state == "Online" and n.health == "OK"]
        groups = P.split_list(job.props["NodeGroups"])
        choices = (
            [[n for n in usable if n.in_group(g)] for g in groups]
            if groups and job.props["NodeGroupOp"] == "Uniform"
            else [usable]
        )
        low, high = job.need
        for pool in choices:
            names = [n.name for n in pool]
            if not all(m in names for m in job.must):
                continue
            if job.props["UnitType"] == "Node" or job.flag("IsExclusive"):
                free = [n for n in pool if not n.held]
            else:
                free = [n for n in pool if n.cores - sum(n.held.values()) > 0 and not self._held_whole(n)]
            if not all(m in (n.name for n in free) for m in job.must):
                continue
            ordered = sorted(free, key=lambda n: n.name not in job.must)  # required nodes first, stable
            picked: dict[str, int] = {}
            total = 0
            for node in ordered:
                if total >= high:
                    break
                if job.props["UnitType"] == "Node":
                    picked[node.name], total = node.cores, total + 1
                else:
                    spare = node.cores if job.flag("IsExclusive") else node.cores - sum(node.held.values())
                    take = min(spare, high - total) if not job.flag("IsExclusive") else spare
                    picked[node.name], total = take, total + take
            if total >= low:
                return {n.name: picked[n.name] for n in pool if n.name in picked}  # in candidate order
        return None

    def _held_whole(self, node: Node) -> bool:
        for job_id in node.held:
            job = self.book.jobs[job_id]
            if job.props["UnitType"] == "Node" or job.flag("IsExclusive"):
                return True
        return False

    def _dispatch(self, job: Job) -> None:
        if job.stopping is not None:
            return
        busy: dict[str, int] = {}  # node -> cores used by the job's running tasks
        for task in job.tasks:
            if task.state in ACTIVE_TASK:
                for name, cores in task.nodes:
                    busy[name] = busy.get(name, 0) + cores
        for task in job.tasks:
            if task.state != "Queued":
                continue
            required = {n.lower() for n in P.split_list(task.props["RequiredNodes"])}
            allowed = [n for n in job.allocation if not required or n.lower() in required]
            nodes: list[tuple[str, int]] = []
            if job.props["UnitType"] == "Node":
                free = [n for n in allowed if n not in busy]
                if len(free) < int(task.props["MinNodes"]):
                    continue
                nodes = [(n, self.nodes[n.lower()].cores) for n in free[: int(task.props["MaxNodes"])]]
            else:
                for name in allowed:
                    spare = job.allocation[name] - busy.get(name, 0)
                    if P.as_bool(task.props["IsExclusive"]):
                        if spare == job.allocation[name]:
                            nodes = [(name, spare)]
                            break
                    elif spare >= int(task.props["MinCores"]):
                        nodes = [(name, min(spare, int(task.props["MaxCores"])))]
                        break
                if not nodes:
                    continue
            if self._launches_left <= 0:
                return  # the rest at the next tick: the lock is let go between them
            self._launches_left -= 1
            for name, cores in nodes:
                busy[name] = busy.get(name, 0) + cores
            self._start_task(job, task, nodes)

    def _start_task(self, job: Job, task: Task, nodes: list[tuple[str, int]]) -> None:
        """Dispatching, then Running once the agent has started it (Failed if it could not)."""
        task.nodes = nodes
        task.props["AllocatedNodes"] = ",".join(n for n, _ in nodes)
        task.props["StartTime"] = P.format_time(now())
        self.book.task_state(task, "Dispatching")
        lost = next((name for name, _ in nodes if self.nodes[name.lower()].lost is not None), None)
        if lost is not None:  # nobody answers there: the task waits until the head node gives up
            task.lost_on = lost
            return
        try:
            process, folder = self.agent.launch(job, task, nodes)
        except OSError as err:
            task.props["ErrorMessage"] = f"The task could not be started: {err}"
            task.props["ExitCode"] = str(err.errno or 1)
            task.props["EndTime"] = P.format_time(now())
            task.nodes = []
            self.book.task_state(task, "Failed")
            self.book.after_task_failure(job, task)
            return
        task.process = process
        task.started_at = time.monotonic()
        self.book.task_state(task, "Running")
        self.agent.follow(task, process, folder, self.book.task_ended)


def validate(job: Job, registry: NodeRegistry) -> str | None:
    """What the scheduler refuses at validation, as the job's ErrorMessage; None when valid. A valid job
    gets the nodes it may use, those its tasks require, and the (min, max) it needs in its unit."""
    nodes = registry.nodes
    unit = job.props["UnitType"]
    if unit not in ("Node", "Core"):
        return f"The emulator supports UnitType Node or Core, not {unit}."
    if job.has_dependencies:
        return "The emulator does not support task dependencies."
    if P.split_list(job.props["ParentJobIds"]):
        return "The emulator does not support job dependencies (ParentJobIds)."
    if not job.tasks and not job.flag("RunUntilCanceled"):
        return "The job has no tasks."
    candidates = list(nodes.values())
    requested = P.split_list(job.props["RequestedNodes"])
    if requested:
        unknown = [n for n in requested if n.lower() not in nodes]
        if unknown:
            return f"The requested node {unknown[0]} does not exist in the cluster."
        candidates = [nodes[n.lower()] for n in dict.fromkeys(n.lower() for n in requested)]
    groups = P.split_list(job.props["NodeGroups"])
    for group in groups:
        if group.lower() not in (g.lower() for g in registry.groups()):
            return f"The node group {group} does not exist."
    if groups:
        op = job.props["NodeGroupOp"]
        if op == "Intersect":
            candidates = [n for n in candidates if all(n.in_group(g) for g in groups)]
        else:  # Union; Uniform also picks from one group at allocation time
            candidates = [n for n in candidates if any(n.in_group(g) for g in groups)]
    names = {n.name.lower() for n in candidates}
    must: dict[str, None] = {}
    for task in job.tasks:
        where = f"Task {task.props['TaskId']}"
        if task.props["Type"] != "Basic":
            return f"{where}: the emulator supports only Basic tasks, not {task.props['Type']}."
        if P.split_list(task.props["DependsOn"]):
            return f"{where}: the emulator does not support task dependencies (DependsOn)."
        if not task.props["CommandLine"].strip():
            return f"{where} has no command line."
        for bound in ("Nodes", "Cores"):
            if int(task.props[f"Min{bound}"]) > int(task.props[f"Max{bound}"]):
                return f"{where}: Min{bound} is greater than Max{bound}."
        for name in P.split_list(task.props["RequiredNodes"]):
            if name.lower() not in nodes:
                return f"{where}: the required node {name} does not exist in the cluster."
            if name.lower() not in names:
                return f"{where}: the required node {name} is not among the nodes the job may use."
            must[nodes[name.lower()].name] = None
    key = "Nodes" if unit == "Node" else "Cores"
    task_min = max((int(t.props[f"Min{key}"]) for t in job.tasks), default=1)
    task_sum = sum(int(t.props[f"Max{key}"]) for t in job.tasks) or task_min
    low = task_min if job.flag("AutoCalculateMin") else int(job.props[f"Min{key}"])
    high = task_sum if job.flag("AutoCalculateMax") else int(job.props[f"Max{key}"])
    if low > high:
        return f"Min{key} ({low}) is greater than Max{key} ({high})."
    available = len(candidates) if unit == "Node" else sum(n.cores for n in candidates)
    if low > available:
        return (
            f"The job asks for at least {low} {key.lower()} but only {available} "
            f"{key.lower()} match its RequestedNodes and NodeGroups."
        )
    if task_min > high:
        return f"A task asks for {task_min} {key.lower()}, more than the job's Max{key} ({high})."
    if unit == "Node" and len(must) > high:
        return f"The tasks require {len(must)} distinct nodes, more than the job's MaxNodes ({high})."
    if unit == "Core" and task_min > max(n.cores for n in candidates):
        return f"A task asks for {task_min} cores; no node the job may use has that many."
    job.candidates = [n.name for n in candidates]
    job.must = list(must)
    job.need = (low, high)
    return None
