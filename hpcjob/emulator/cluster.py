"""The scheduler of the emulated cluster: nodes, jobs, tasks, their state machines, and task processes.

States follow facts/hpcpack-rest.md section 5. A job: Configuring -> (submit) Submitted -> Validating ->
Queued -> Running -> Finished | Failed | Canceled, with Canceling (Finishing for "finish") while its
running tasks are being stopped; the final state is set only once no process of the job is left. A job
that fails validation goes to Failed with an ErrorMessage. A task: Configuring -> Submitted (on submit)
-> Queued (the job passed validation) -> Dispatching -> Running -> Finished | Failed | Canceled.

A task runs as the Linux agent runs it (facts/hpcpack-jobs.md section 5): ``cmd.sh`` holds
``#!/bin/bash\\n\\n<CommandLine>``, ``run_dir_in_out.sh`` does ``cd <WorkDirectory or ~> || exit $?`` then
``/bin/bash cmd.sh >stdout 2>stderr [<stdin]``, paths written unquoted as the agent writes them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcjob.backends.local.procs import (
    MARKER_VAR,
    TaskProcess,
    Watchdog,
    exit_code,
    marked_processes,
    process_table,
)
from hpcjob.emulator import props as P
from hpcjob.emulator.jobxml import parse_job_xml
from hpcjob.node.mount_filter import FILTERS_DIR, NODE_ROOT_VAR

OUTPUT_LIMIT = 1500  # bytes of un-redirected stdout/stderr the agent reports (head -c 1500)
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
BUILTIN_GROUPS = {
    "HeadNodes": "The head nodes in the cluster",
    "ComputeNodes": "The compute nodes in the cluster",
    "WCFBrokerNodes": "The broker nodes in the cluster",
    "WorkstationNodes": "The workstation nodes in the cluster",
    "LinuxNodes": "The Linux nodes in the cluster",
}
ACTIVE_TASK = frozenset({"Dispatching", "Running", "Canceling", "Finishing"})


class ApiError(Exception):
    """An answer other than success: HTTP status and the human message the body carries."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Actor:
    """Who a request acts as: the authenticated user, or the one named by ``x-ms-as-user``."""

    name: str
    admin: bool


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

    def in_group(self, group: str) -> bool:
        return any(g.lower() == group.lower() for g in self.groups)


@dataclass(eq=False)
class Task:
    job: Job
    number: int
    system_id: int
    props: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, str] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)
    nodes: list[tuple[str, int]] = field(default_factory=list)  # (node, cores) while it runs
    process: TaskProcess | None = None
    stopping: str | None = None  # the state to end in once a stop has ended every process
    stop_message: str | None = None
    kill_now: threading.Event = field(default_factory=threading.Event)
    stop_done: threading.Event = field(default_factory=threading.Event)
    exited: bool = False
    started_at: float = 0.0

    @property
    def state(self) -> str:
        return self.props["State"]


@dataclass(eq=False)
class Job:
    id: int
    props: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, str] = field(default_factory=dict)
    tasks: list[Task] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    has_dependencies: bool = False
    seq: int = 0  # submission order
    step_at: float = 0.0  # earliest time of the next Submitted/Validating/Queued step
    candidates: list[str] = field(default_factory=list)  # nodes it may use, in preference order
    must: list[str] = field(default_factory=list)  # nodes its tasks require
    need: tuple[int, int] = (1, 1)  # (min, max) resources in its unit
    allocation: dict[str, int] = field(default_factory=dict)  # node -> cores, in allocation order
    started_at: float = 0.0
    stopping: str | None = None
    # The nodes where a task of the job has started: the agent runs OnJobTaskStart.sh at the first.
    filtered_nodes: set[str] = field(default_factory=set)

    @property
    def state(self) -> str:
        return self.props["State"]

    def flag(self, name: str) -> bool:
        return P.as_bool(self.props[name])


# How long a filter may take before the start is given up: the head node waits 40 s for a task to
# start (then sends the start again, which the emulator does not).
FILTER_TIMEOUT_S = 40


def now() -> dt.datetime:
    return dt.datetime.now().replace(microsecond=0)


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
    ) -> None:
        """`password_of(owner)`: the job owner's password, which the agent hands to execution filters."""
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.nodes: dict[str, Node] = {}
        for spec in nodes:
            self._add_node(spec)
        if not self.nodes:
            raise ValueError("the cluster needs at least one node")
        self.work_root = work_root
        self.grace_period = grace_period
        self.domain = domain
        self.command_line_limit = command_line_limit
        self.step_delay = step_delay
        self.backfill = backfill
        self.base_env = dict(base_env)
        self.head_name = head_name
        self.password_of = password_of or (lambda owner: "")
        self.jobs: dict[int, Job] = {}
        self.token = secrets.token_hex(6)  # marks this emulator's task processes
        self._next_job = 1
        self._next_seq = 1
        self._next_task_system_id = 1
        self._closing = False
        self._runners: list[threading.Thread] = []
        self._watchdog: Watchdog | None = None
        self._thread = threading.Thread(target=self._loop, name="hpcjob-emulator-scheduler", daemon=True)

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # If this process is killed (SIGKILL), no task it started outlives it.
        self._watchdog = Watchdog(f"{self.token}-")
        self._thread.start()

    def close(self) -> None:
        """Kill every task process (no grace: the head node is going away), then stop the thread."""
        with self.lock:
            self._closing = True
            for job in self.jobs.values():
                for task in job.tasks:
                    if task.process is not None and not task.exited:
                        self._request_stop(task, "Canceled", "The emulator shut down.", forced=True)
            self.changed.notify_all()
            runners = list(self._runners)
        for runner in runners:
            runner.join(timeout=15)
        # Anything that escaped both tree and marker tracking up to now, by the marker once more.
        for pid, _ in marked_processes(self.marker_prefix()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._watchdog is not None:
            self._watchdog.close()

    def marker_prefix(self) -> bytes:
        return f"{MARKER_VAR}={self.token}-".encode()

    # --------------------------------------------------------------------------------------- nodes

    def _add_node(self, spec: NodeSpec) -> None:
        if spec.name.lower() in self.nodes:
            raise ValueError(f"duplicate node name {spec.name}")
        _check_node(spec.state, spec.health)
        self.nodes[spec.name.lower()] = Node(
            id=len(self.nodes) + 1,
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

    def node(self, name: str) -> Node:
        found = self.nodes.get(name.strip().lower())
        if found is None:
            raise ApiError(404, f"The node {name} was not found.")
        return found

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
            node = self.node(name)
            _check_node(state or node.state, health or node.health)
            if state is not None and state != node.state:
                if state == "Online":
                    node.online_time = now()
                elif node.state == "Online":
                    node.offline_time = now()
                node.state = state
            if health is not None:
                node.health = health
                if health == "Error":
                    # An unreachable node: its tasks are lost at once.
                    for task in self._tasks_on(node.name):
                        self._request_stop(
                            task, "Failed", f"The node {node.name} became unreachable.", forced=True
                        )
            if groups is not None:
                node.groups = list(groups)
            if cores is not None:
                node.cores = cores
            self.changed.notify_all()

    def take_offline(self, name: str) -> None:
        with self.lock:
            node = self.node(name)
            self.set_node(node.name, state="Draining" if node.held else "Offline")

    def _tasks_on(self, node_name: str) -> list[Task]:
        return [
            t
            for j in self.jobs.values()
            for t in j.tasks
            if t.state in ACTIVE_TASK and any(n == node_name for n, _ in t.nodes)
        ]

    def groups(self) -> dict[str, tuple[str, bool]]:
        """Group name -> (description, managed): the built-in groups and every group a node names."""
        found = {name: (text, True) for name, text in BUILTIN_GROUPS.items()}
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

    # ---------------------------------------------------------------------------------------- jobs

    def job(self, job_id: int) -> Job:
        found = self.jobs.get(job_id)
        if found is None:
            raise ApiError(404, f"The job {job_id} was not found.")
        return found

    def task(self, job_id: int, task_id: int) -> Task:
        job = self.job(job_id)
        if not 1 <= task_id <= len(job.tasks):
            raise ApiError(404, f"The task {task_id} was not found in job {job_id}.")
        return job.tasks[task_id - 1]

    def owner_name(self, actor: Actor) -> str:
        return f"{self.domain}\\{actor.name}" if self.domain and "\\" not in actor.name else actor.name

    def _may_change(self, actor: Actor, job: Job) -> None:
        if not actor.admin and not _same_user(job.props["Owner"], actor.name):
            raise ApiError(403, f"The user {actor.name} does not have permission to change job {job.id}.")

    def create_job(self, actor: Actor, pairs: Sequence[tuple[str, str | None]]) -> int:
        with self.lock:
            values = self._parse(P.JOB_BY_KEY, pairs, "job")
            job = self._new_job(actor)
            self._set_props(job, values)
            return job.id

    def create_job_from_xml(self, actor: Actor, xml: str) -> int:
        with self.lock:
            try:
                draft = parse_job_xml(xml)
            except P.PropError as err:
                raise ApiError(400, str(err)) from None
            for task in draft.tasks:
                self._check_command_line(task.props.get("CommandLine", ""))
            job = self._new_job(actor)
            self._set_props(job, draft.props)
            job.env.update(draft.env)
            job.custom.update(draft.custom)
            job.has_dependencies = draft.has_dependencies
            for task_draft in draft.tasks:
                new = self._new_task(job)
                new.props.update(task_draft.props)
                new.env.update(task_draft.env)
                new.custom.update(task_draft.custom)
            return job.id

    def _new_job(self, actor: Actor) -> Job:
        job = Job(id=self._next_job, props=P.defaults(P.JOB_PROPS))
        self._next_job += 1
        stamp = P.format_time(now())
        job.props.update(
            Id=str(job.id),
            Owner=self.owner_name(actor),
            CreateTime=stamp,
            ChangeTime=stamp,
            UserName=actor.name,
        )
        job.history.append("Configuring")
        self.jobs[job.id] = job
        return job

    def _new_task(self, job: Job) -> Task:
        number = len(job.tasks) + 1
        task = Task(
            job=job, number=number, system_id=self._next_task_system_id, props=P.defaults(P.TASK_PROPS)
        )
        self._next_task_system_id += 1
        stamp = P.format_time(now())
        task.props.update(
            TaskId=f"{job.id}.{number}",
            JobTaskId=str(number),
            ParentJobId=str(job.id),
            CreateTime=stamp,
            ChangeTime=stamp,
        )
        task.history.append("Configuring")
        job.tasks.append(task)
        return task

    def _parse(
        self,
        table: Mapping[str, P.Prop],
        pairs: Sequence[tuple[str, str | None]],
        what: str,
        live: bool = False,
    ) -> dict[str, str]:
        values: dict[str, str] = {}
        for name, value in pairs:
            try:
                prop = P.lookup(table, name, what)
            except P.PropError as err:
                raise ApiError(400, str(err)) from None
            if not prop.settable:
                raise ApiError(400, f"The {what} property {prop.name} is read-only.")
            if live and not prop.live:
                raise ApiError(
                    400, f"The {what} property {prop.name} cannot change once the job is submitted."
                )
            if value is None:
                raise ApiError(400, f"The value of the {what} property {prop.name} must be a string.")
            if prop.secret:
                continue  # accepted (Password), never kept
            try:
                values[prop.name] = P.parse_value(prop, value)
            except P.PropError as err:
                raise ApiError(400, str(err)) from None
            if prop.name == "CommandLine":
                self._check_command_line(values[prop.name])
        return values

    def _check_command_line(self, command: str) -> None:
        if self.command_line_limit is not None and len(command) > self.command_line_limit:
            raise ApiError(
                400,
                f"The command line is {len(command)} characters long; "
                f"the limit is {self.command_line_limit} characters.",
            )

    def _set_props(self, job: Job, values: Mapping[str, str]) -> None:
        job.props.update(values)
        if "Priority" in values and "ExpandedPriority" not in values:
            job.props["ExpandedPriority"] = str(P.PRIORITIES.index(values["Priority"]) * 1000)
        job.props["ChangeTime"] = P.format_time(now())

    def set_job(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state in P.ENDED:
                raise ApiError(400, f"Jobs in the {job.state} state cannot be modified.")
            values = self._parse(P.JOB_BY_KEY, pairs, "job", live=job.state != "Configuring")
            self._set_props(job, values)
            self.changed.notify_all()

    def set_pairs(
        self,
        actor: Actor,
        job_id: int,
        task_id: int | None,
        kind: str,
        pairs: Sequence[tuple[str, str | None]],
    ) -> None:
        """Environment variables (a null or empty value removes one) or custom properties."""
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            owner: Job | Task = job if task_id is None else self.task(job_id, task_id)
            if owner.state in P.ENDED:
                what = "Jobs" if task_id is None else "Tasks"
                raise ApiError(400, f"{what} in the {owner.state} state cannot be modified.")
            target = owner.env if kind == "env" else owner.custom
            for name, value in pairs:
                if not value:
                    target.pop(name, None)
                else:
                    target[name] = value

    def get_pairs(
        self, job_id: int, task_id: int | None, kind: str, names: list[str] | None
    ) -> list[tuple[str, str]]:
        with self.lock:
            owner: Job | Task = self.job(job_id) if task_id is None else self.task(job_id, task_id)
            source = owner.env if kind == "env" else owner.custom
            if names is None:
                return list(source.items())
            return [(name, source.get(name, "")) for name in names]

    def submit(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state != "Configuring":
                raise ApiError(400, f"Jobs in the {job.state} state cannot be submitted.")
            self._set_props(job, self._parse(P.JOB_BY_KEY, pairs, "job"))
            job.seq = self._next_seq
            self._next_seq += 1
            stamp = P.format_time(now())
            job.props["SubmitTime"] = stamp
            for task in job.tasks:
                task.props["SubmitTime"] = stamp
                self._task_state(task, "Submitted")
            self._job_state(job, "Submitted")
            job.step_at = time.monotonic() + self.step_delay
            self.changed.notify_all()

    def cancel_job(self, actor: Actor, job_id: int, message: str | None, forced: bool) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            text = message if message else f"Canceled by {self.owner_name(actor)}."
            if job.state in ("Canceling", "Finishing"):
                if not forced:
                    raise ApiError(400, f"Jobs in the {job.state} state cannot be canceled.")
                for task in job.tasks:
                    task.kill_now.set()
                return
            if job.state in P.ENDED:
                raise ApiError(400, f"Jobs in the {job.state} state cannot be canceled.")
            self._stop_job(job, "Canceled", text, forced)

    def finish_job(self, actor: Actor, job_id: int, message: str | None) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state in P.ENDED or job.state in ("Configuring", "Canceling", "Finishing"):
                raise ApiError(400, f"Jobs in the {job.state} state cannot be finished.")
            self._stop_job(job, "Finished", None, False)

    def requeue_job(self, actor: Actor, job_id: int) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state not in ("Failed", "Canceled"):
                raise ApiError(400, f"Jobs in the {job.state} state cannot be requeued.")
            job.props.update(
                ErrorMessage="",
                StartTime="",
                EndTime="",
                AllocatedNodes="",
                RequeueCount=str(int(job.props["RequeueCount"]) + 1),
            )
            job.stopping = None
            job.seq = self._next_seq
            self._next_seq += 1
            for task in job.tasks:
                if task.state != "Finished":
                    self._reset_task(task)
                    self._task_state(task, "Submitted")
            self._job_state(job, "Submitted")
            job.step_at = time.monotonic() + self.step_delay
            self.changed.notify_all()

    def _reset_task(self, task: Task) -> None:
        task.props.update(
            ExitCode="0",
            ErrorMessage="",
            Output="",
            StartTime="",
            EndTime="",
            AllocatedNodes="",
            RequeueCount=str(int(task.props["RequeueCount"]) + 1),
        )
        task.process = None
        task.stopping = None
        task.stop_message = None
        task.kill_now = threading.Event()
        task.stop_done = threading.Event()
        task.exited = False
        task.nodes = []

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: set[str] | None,
        group: str | None,
        changed_since: dt.datetime | None,
        node_names: list[str] | None,
    ) -> list[Job]:
        with self.lock:
            jobs = list(self.jobs.values())
            if node_names is not None:
                wanted = {n.lower() for n in node_names}
                return [
                    j
                    for j in jobs
                    if j.state in ("Running", "Canceling", "Finishing")
                    and any(n.lower() in wanted for n in j.allocation)
                ]
            if owner:
                jobs = [j for j in jobs if _same_user(j.props["Owner"], owner)]
            if states is not None:
                jobs = [j for j in jobs if j.state in states]
            if group:
                jobs = [
                    j
                    for j in jobs
                    if group.lower() in (g.lower() for g in P.split_list(j.props["NodeGroups"]))
                ]
            if changed_since is not None:
                jobs = [j for j in jobs if P.parse_time(j.props["ChangeTime"]) >= changed_since]
            return jobs

    # --------------------------------------------------------------------------------------- tasks

    def add_task(self, actor: Actor, job_id: int, pairs: Sequence[tuple[str, str | None]]) -> int:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state in P.ENDED or job.state in ("Canceling", "Finishing"):
                raise ApiError(400, f"Tasks cannot be added to a job in the {job.state} state.")
            values = self._parse(P.TASK_BY_KEY, pairs, "task")
            task = self._new_task(job)
            task.props.update(values)
            if job.state in ("Queued", "Running"):
                self._task_state(task, "Submitted")
                error = self._validate(job)
                if error:
                    job.tasks.pop()
                    raise ApiError(400, error)
                self._task_state(task, "Queued")
            elif job.state != "Configuring":
                self._task_state(task, "Submitted")
            self.changed.notify_all()
            return task.number

    def set_task(
        self, actor: Actor, job_id: int, task_id: int, pairs: Sequence[tuple[str, str | None]]
    ) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            task = self.task(job_id, task_id)
            if task.state not in ("Configuring", "Submitted", "Queued"):
                raise ApiError(400, f"Tasks in the {task.state} state cannot be modified.")
            task.props.update(self._parse(P.TASK_BY_KEY, pairs, "task"))
            task.props["ChangeTime"] = P.format_time(now())

    def cancel_task(self, actor: Actor, job_id: int, task_id: int, message: str | None, forced: bool) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            task = self.task(job_id, task_id)
            text = message if message else f"Canceled by {self.owner_name(actor)}."
            if task.state in ("Submitted", "Queued"):
                task.props["ErrorMessage"] = text
                self._task_state(task, "Canceled")
                self._check_job_end(job)
            elif task.state in ACTIVE_TASK:
                # A running task that is canceled ends Failed (observed on real clusters, BVT).
                self._request_stop(task, "Failed", text, forced)
            else:
                raise ApiError(400, f"Tasks in the {task.state} state cannot be canceled.")
            self.changed.notify_all()

    def finish_task(self, actor: Actor, job_id: int, task_id: int, message: str | None) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            task = self.task(job_id, task_id)
            if task.state in ("Submitted", "Queued"):
                task.props["ErrorMessage"] = message or ""
                self._task_state(task, "Finished")
                self._check_job_end(job)
            elif task.state in ("Dispatching", "Running"):
                self._request_stop(task, "Finished", message or "", False)
            else:
                raise ApiError(400, f"Tasks in the {task.state} state cannot be finished.")
            self.changed.notify_all()

    def requeue_task(self, actor: Actor, job_id: int, task_id: int) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            task = self.task(job_id, task_id)
            if task.state not in ("Failed", "Canceled", "Queued"):
                raise ApiError(400, f"Tasks in the {task.state} state cannot be requeued.")
            self._reset_task(task)
            if job.state in ("Queued", "Running"):
                self._task_state(task, "Queued")
            elif job.state in ("Submitted", "Validating"):
                self._task_state(task, "Submitted")
            else:
                self._task_state(task, "Configuring")
            self.changed.notify_all()

    # ------------------------------------------------------------------------------ state changes

    def _job_state(self, job: Job, state: str) -> None:
        if job.state != state:
            job.props["PreviousState"] = job.state
            job.props["State"] = state
            job.history.append(state)
        job.props["ChangeTime"] = P.format_time(now())

    def _task_state(self, task: Task, state: str) -> None:
        if task.state != state:
            task.props["PreviousState"] = task.state
            task.props["State"] = state
            task.history.append(state)
        task.props["ChangeTime"] = P.format_time(now())

    def _end_job(self, job: Job, state: str) -> None:
        for node_name in job.allocation:
            self.nodes[node_name.lower()].held.pop(job.id, None)
        job.allocation = {}
        job.props["EndTime"] = P.format_time(now())
        job.stopping = None
        self._job_state(job, state)
        self.changed.notify_all()

    def _stop_job(self, job: Job, final: str, message: str | None, forced: bool) -> None:
        """End a job: stop its running tasks (SIGINT, SIGKILL after the grace period), cancel the rest."""
        if message is not None:
            job.props["ErrorMessage"] = message
        for task in job.tasks:
            if task.state in ACTIVE_TASK:
                self._request_stop(task, "Canceled", None, forced)
            elif task.state not in P.ENDED:
                self._task_state(task, "Canceled")
        if any(t.state in ACTIVE_TASK for t in job.tasks):
            job.stopping = final
            self._job_state(job, "Finishing" if final == "Finished" else "Canceling")
        else:
            self._end_job(job, final)

    def _request_stop(self, task: Task, final: str, message: str | None, forced: bool) -> None:
        if forced or self.grace_period <= 0:
            task.kill_now.set()
        if task.exited or task.stopping is not None:
            return  # already ending: its runner reports it
        task.stopping = final
        task.stop_message = message
        self._task_state(task, "Finishing" if final == "Finished" else "Canceling")
        process = task.process
        if process is None:  # cannot happen: a task is started under the same lock that dispatches it
            task.stop_done.set()
            self._task_state(task, final)
            return
        threading.Thread(
            target=self._stop_task,
            args=(task, process),
            name=f"hpcjob-emulator-stop-{task.props['TaskId']}",
            daemon=True,
        ).start()

    def _stop_task(self, task: Task, process: TaskProcess) -> None:
        try:
            process.stop(self.grace_period, task.kill_now)
        finally:
            task.stop_done.set()

    def _check_job_end(self, job: Job) -> None:
        if any(t.state in ACTIVE_TASK for t in job.tasks):
            return
        if job.state in ("Canceling", "Finishing") and job.stopping is not None:
            self._end_job(job, job.stopping)
        elif job.state == "Running" and not job.flag("RunUntilCanceled"):
            if any(t.state not in P.ENDED for t in job.tasks):
                return
            failed = [t for t in job.tasks if t.state == "Failed"]
            if failed:
                job.props["ErrorMessage"] = (
                    f"{len(failed)} of {len(job.tasks)} tasks failed; "
                    f"the first is task {failed[0].props['TaskId']}."
                )
            self._end_job(job, "Failed" if failed else "Finished")

    # ----------------------------------------------------------------------------------- scheduler

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self._closing:
                    return
                self._tick()
                self.changed.wait(timeout=0.1)
                processes = [
                    t.process
                    for j in self.jobs.values()
                    for t in j.tasks
                    if t.process is not None and not t.exited
                ]
            if processes:  # remember the tasks' descendants while they live
                table = process_table()
                for process in processes:
                    process.refresh(table)

    def _tick(self) -> None:
        clock = time.monotonic()
        for job in self.jobs.values():
            if job.state == "Submitted" and clock >= job.step_at:
                self._job_state(job, "Validating")
                job.step_at = clock + self.step_delay
            elif job.state == "Validating" and clock >= job.step_at:
                error = self._validate(job)
                if error:
                    job.props["ErrorMessage"] = error
                    for task in job.tasks:
                        if task.state not in P.ENDED:
                            self._task_state(task, "Canceled")
                    self._end_job(job, "Failed")
                else:
                    for task in job.tasks:
                        if task.state == "Submitted":
                            self._task_state(task, "Queued")
                    self._job_state(job, "Queued")
                    job.step_at = clock + self.step_delay
        queued = sorted(
            (j for j in self.jobs.values() if j.state == "Queued"),
            key=lambda j: (-int(j.props["ExpandedPriority"]), j.seq),
        )
        for job in queued:
            started = clock >= job.step_at and self._held_until_passed(job) and self._try_start(job)
            if not started and not self.backfill:
                break  # first come, first served: a job that cannot start yet holds back the later ones
        for job in self.jobs.values():
            if job.state == "Running":
                runtime = int(job.props["RuntimeSeconds"])
                if runtime and clock - job.started_at > runtime:
                    self._stop_job(
                        job, "Canceled", f"The job exceeded its run time limit of {runtime} seconds.", False
                    )
                else:
                    self._dispatch(job)
                    self._check_job_end(job)
        for node in self.nodes.values():
            if node.state == "Draining" and not node.held:
                node.state = "Offline"
                node.offline_time = now()

    @staticmethod
    def _held_until_passed(job: Job) -> bool:
        hold = job.props["HoldUntil"]
        return not hold or P.parse_time(hold) <= now()

    def _validate(self, job: Job) -> str | None:
        """What the scheduler refuses at validation, as the job's ErrorMessage; None when valid."""
        unit = job.props["UnitType"]
        if unit not in ("Node", "Core"):
            return f"The emulator supports UnitType Node or Core, not {unit}."
        if job.has_dependencies:
            return "The emulator does not support task dependencies."
        if P.split_list(job.props["ParentJobIds"]):
            return "The emulator does not support job dependencies (ParentJobIds)."
        if not job.tasks and not job.flag("RunUntilCanceled"):
            return "The job has no tasks."
        candidates = list(self.nodes.values())
        requested = P.split_list(job.props["RequestedNodes"])
        if requested:
            unknown = [n for n in requested if n.lower() not in self.nodes]
            if unknown:
                return f"The requested node {unknown[0]} does not exist in the cluster."
            candidates = [self.nodes[n.lower()] for n in dict.fromkeys(n.lower() for n in requested)]
        groups = P.split_list(job.props["NodeGroups"])
        for group in groups:
            if group.lower() not in (g.lower() for g in self.groups()):
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
                if name.lower() not in self.nodes:
                    return f"{where}: the required node {name} does not exist in the cluster."
                if name.lower() not in names:
                    return f"{where}: the required node {name} is not among the nodes the job may use."
                must[self.nodes[name.lower()].name] = None
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
        self._job_state(job, "Running")
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
            job = self.jobs[job_id]
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
            for name, cores in nodes:
                busy[name] = busy.get(name, 0) + cores
            self._start_task(job, task, nodes)

    # --------------------------------------------------------------------------------- processes

    def _start_task(self, job: Job, task: Task, nodes: list[tuple[str, int]]) -> None:
        task.nodes = nodes
        task.props["AllocatedNodes"] = ",".join(n for n, _ in nodes)
        task.props["StartTime"] = P.format_time(now())
        self._task_state(task, "Dispatching")
        try:
            process, folder = self._launch(job, task, nodes)
        except OSError as err:
            task.props["ErrorMessage"] = f"The task could not be started: {err}"
            task.props["ExitCode"] = str(err.errno or 1)
            task.props["EndTime"] = P.format_time(now())
            task.nodes = []
            self._task_state(task, "Failed")
            self._after_task_failure(job, task)
            return
        task.process = process
        task.started_at = time.monotonic()
        self._task_state(task, "Running")
        runner = threading.Thread(
            target=self._run,
            args=(task, process, folder),
            name=f"hpcjob-emulator-task-{task.props['TaskId']}",
            daemon=True,
        )
        self._runners = [r for r in self._runners if r.is_alive()]
        self._runners.append(runner)
        runner.start()

    def _launch(self, job: Job, task: Task, nodes: list[tuple[str, int]]) -> tuple[TaskProcess, str]:
        """Write cmd.sh and run_dir_in_out.sh in a task folder and start them, as the agent does."""
        node_dir = os.path.join(self.work_root, "nodes", nodes[0][0])
        os.makedirs(node_dir, exist_ok=True)
        folder = tempfile.mkdtemp(
            prefix=f"nodemanager_task_{task.system_id}_{task.props['RequeueCount']}.", dir=node_dir
        )
        command_line = task.props["CommandLine"]
        filtered = self._execution_filter(job, task, nodes[0][0])
        if isinstance(filtered, str):  # the filter failed: the task fails, saying why
            with open(os.path.join(folder, "filter.txt"), "w", encoding="utf-8") as f:
                f.write(filtered + "\n")
            command_line = f"cat {folder}/filter.txt >&2; exit 1"
        cmd = os.path.join(folder, "cmd.sh")
        with open(cmd, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/bash\n\n{command_line}\n")
        stdout = task.props["StdOutFilePath"] or os.path.join(folder, "stdout.txt")
        stderr = task.props["StdErrFilePath"] or os.path.join(folder, "stderr.txt")
        stdin = task.props["StdInFilePath"]
        # Unquoted, as the agent writes them: `~` and $VARS expand, spaces split.
        script = f"#!/bin/bash\n\ncd {task.props['WorkDirectory'] or '~'} || exit $?\n\n"
        script += f" /bin/bash {cmd} >{stdout} 2>{stderr}" + (f" <{stdin}" if stdin else "") + "\n"
        run = os.path.join(folder, "run_dir_in_out.sh")
        with open(run, "w", encoding="utf-8") as f:
            f.write(script)
        described = f"{len(nodes)} " + " ".join(f"{name} {cores}" for name, cores in nodes)
        # The task's own variables, as the head node sends them (with what the filter changed).
        variables = {**job.env, **task.env, **(filtered if isinstance(filtered, dict) else {})}
        variables.update(
            CCP_JOBID=str(job.id),
            CCP_TASKID=str(task.number),
            CCP_TASKINSTANCEID="0",
            CCP_TASKSYSTEMID=str(task.system_id),
            CCP_TASKCONTEXT=f"{job.id}.{task.system_id}",
            CCP_JOBNAME=job.props["Name"],
            CCP_JOBTYPE="Batch",
            CCP_JOBTEMPLATE=job.props["JobTemplate"],
            CCP_NODES=described,
            CCP_NODES_CORES=described,
            CCP_NUMCPUS=str(sum(c for _, c in nodes)),
            CCP_EXCLUSIVE=job.props["IsExclusive"],
            CCP_WORKDIR=task.props["WorkDirectory"],
            CCP_RETRY_COUNT=task.props["RequeueCount"],
            CCP_RERUNNABLE=task.props["IsRerunnable"],
            CCP_RUNTIME=job.props["RuntimeSeconds"] if job.props["RuntimeSeconds"] != "0" else str(P.MAX_INT),
            CCP_SCHEDULER=self.head_name,
            CCP_CLUSTER_NAME=self.head_name,
        )
        if task.props["StdOutFilePath"]:
            variables["CCP_STDOUT"] = task.props["StdOutFilePath"]
        if task.props["StdErrFilePath"]:
            variables["CCP_STDERR"] = task.props["StdErrFilePath"]
        variables[MARKER_VAR] = f"{self.token}-{task.system_id}-{task.props['RequeueCount']}"
        env = {**self.node_env(nodes[0][0]), **variables}
        if variables.get("CCP_DOCKER_IMAGE"):
            run = self._container_start(job, task, folder, variables, nodes[0][1])
        # The wrapper's own errors (a failed cd or redirection) land in the task folder.
        with open(os.path.join(folder, "agent.txt"), "wb") as agent:
            process = TaskProcess(
                ["/bin/bash", run],
                cwd=folder,
                env=env,
                marker=env[MARKER_VAR],
                stdout=agent.fileno(),
                stderr=agent.fileno(),
            )
        return process, folder

    @staticmethod
    def _container_start(job: Job, task: Task, folder: str, variables: Mapping[str, str], cores: int) -> str:
        """A task whose environment names CCP_DOCKER_IMAGE, as the C++ agent runs it: its variables in
        the task folder's `environments` file, `docker run -id` with the options and volumes read back
        from that file and put in unquoted, the owner made in the container, then `docker exec -u OWNER`
        of run_dir_in_out.sh; the container is removed when the task ends (_run). Nothing of the
        node's own environment (PATH) goes in. Azure/hpcpack-linux-agent v2 @f50e911:
        nodemanager/core/Process.cpp L151-193, scripts/common.sh L141-173, PrepareTask.sh L39-59,
        StartTask.sh L26-32, CleanupTask.sh L13-34 (docs/facts/hpcpack-linux-agent-docker.md)."""
        env_file = os.path.join(folder, "environments")
        with open(env_file, "w", encoding="utf-8") as f:
            f.write("\n".join(f"{name}={value}" for name, value in variables.items()))
        owner = job.props["Owner"].rsplit("\\", 1)[-1]  # the domain left out (no CCP_PRESERVE_DOMAIN)
        name = f"hpcTask_Task_{task.system_id}_{task.props['RequeueCount'] or 0}"
        # The agent's own reads of the file: unanchored greps, so a line of another variable that holds
        # a name's text is read too (common.sh L141-173 @ f50e911; GetDockerEngine's cut -f 2 likewise).
        script = f"""#!/bin/bash

image=$(cat {env_file} | grep "CCP_DOCKER_IMAGE=" | cut -d '=' -f 2)
additionalOption=$(cat {env_file} | grep "CCP_DOCKER_START_OPTION=" | sed 's/^CCP_DOCKER_START_OPTION=//')
volumeOption=$(cat {env_file} | grep "CCP_DOCKER_VOLUMES=" \\
    | sed -e 's/^CCP_DOCKER_VOLUMES=/-v /g' -e 's/,/ -v /g')
nvidia=$(cat {env_file} | grep "CCP_DOCKER_NVIDIA=" | cut -d '=' -f 2)
engine=docker
if [ -n "$nvidia" ] && [ "$nvidia" != 0 ]; then engine=nvidia-docker; fi
$engine run -id $additionalOption $volumeOption --name {name} --cpuset-cpus 0-{cores - 1} \\
    --env-file {env_file} --cidfile {folder}/containerId -v {folder}:{folder}:z $image 2>&1
code=$?
if [ $code -ne 0 ]; then echo "Failed to start docker container"; exit $code; fi
id=$(cat {folder}/containerId)
docker exec $id useradd -m {owner} >/dev/null 2>&1
docker exec $id chown {owner} {folder} >/dev/null 2>&1
docker exec -u {owner} -e CCP_MPI_HOSTFILE={folder}/mpi_hostfile $id /bin/bash {folder}/run_dir_in_out.sh
"""
        start = os.path.join(folder, "StartTask.sh")
        with open(start, "w", encoding="utf-8") as f:
            f.write(script)
        return start

    def node_root(self, node: str) -> str:
        """The emulated node's own `/` for the files hpcjob puts on a node (its execution filter, the
        filter's lock, log and mount points): HPCJOB_NODE_ROOT in the node's processes."""
        return os.path.join(self.work_root, "nodes", node.upper())

    def filters_dir(self, node: str) -> str:
        """Where the node's agent looks for execution filters (/opt/hpcnodemanager/filters on a node)."""
        return self.node_root(node) + FILTERS_DIR

    def node_env(self, node: str) -> dict[str, str]:
        """The environment a process of `node` starts from."""
        env = {k: v for k, v in self.base_env.items() if not k.startswith(MARKER_VAR)}
        env[NODE_ROOT_VAR] = self.node_root(node)
        return env

    def _execution_filter(self, job: Job, task: Task, node: str) -> dict[str, str] | str | None:
        """Run the node's execution filter, if there is one, as the C++ node agent does at a task start
        (Azure/hpcpack-linux-agent v2 @ f50e9116: nodemanager/filters/ExecutionFilter.cpp L40-156,
        core/RemoteCommunicator.cpp L246-270, core/Process.cpp; head node LinuxCommunicator.cs L287-357).

        OnJobTaskStart.sh at the job's first task on the node (startjobandtask: the owner's user name
        and password in m_Item3/m_Item4), OnTaskStart.sh at its later tasks there (starttask: m_Item1
        and m_Item2 only). A file that is not there is skipped. As root, PATH alone in its environment,
        in a /dev/shm folder of its own: `/bin/bash cmd.sh >stdout.txt 2>&1 <stdin.txt`, cmd.sh naming
        the filter (so it must be executable). Exit code 0: the whole output is parsed as one JSON value,
        which replaces the request; anything else fails the start (HTTP 500 or 550), and so the task.
        The agent sets no time limit; the head node gives up after 40 s (FILTER_TIMEOUT_S).
        Returns the task's environment as the filter left it, None without a filter, or why the start
        failed."""
        first = node.upper() not in job.filtered_nodes
        job.filtered_nodes.add(node.upper())
        name = "OnJobTaskStart.sh" if first else "OnTaskStart.sh"
        path = os.path.join(self.filters_dir(node), name)
        if not os.access(path, os.R_OK):
            return None
        request: dict[str, Any] = {
            "m_Item1": {"JobId": job.id, "ResIds": [], "TaskId": task.number},
            "m_Item2": {
                "affinity": [],
                "commandLine": task.props["CommandLine"],
                "environmentVariables": {**job.env, **task.env},
                "inputFiles": "",
                "outputFiles": "",
                "role": 0,
                "stderr": task.props["StdErrFilePath"],
                "stdin": task.props["StdInFilePath"],
                "stdout": task.props["StdOutFilePath"],
                "taskRequeueCount": int(task.props["RequeueCount"] or 0),
                "workingDirectory": task.props["WorkDirectory"],
            },
        }
        if first:
            request.update(
                m_Item3=job.props["Owner"],
                m_Item4=self.password_of(job.props["Owner"]),
                m_Item5=None,
                m_Item6=None,
            )
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        prefix = f"nodemanager_executionfilter_{job.id}_{task.number}_{task.props['RequeueCount'] or 0}."
        agent_env = {"PATH": self.base_env.get("PATH", os.defpath), NODE_ROOT_VAR: self.node_root(node)}
        try:
            with tempfile.TemporaryDirectory(prefix=prefix, dir=shm) as folder:
                for file, text in (
                    ("stdin.txt", json.dumps(request)),
                    ("cmd.sh", f"#!/bin/bash\n\n{path}\n"),
                ):
                    with open(os.path.join(folder, file), "w", encoding="utf-8") as f:
                        f.write(text)
                done = subprocess.run(
                    ["/bin/bash", "-c", "/bin/bash cmd.sh >stdout.txt 2>&1 <stdin.txt"],
                    cwd=folder,
                    env=agent_env,
                    timeout=FILTER_TIMEOUT_S,
                    check=False,
                )
                with open(os.path.join(folder, "stdout.txt"), "rb") as f:
                    said = f.read().decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return f"The execution filter {name} gave the node agent no answer in {FILTER_TIMEOUT_S} s"
        except OSError as err:
            return f"The execution filter {name} could not run: {err}"
        if done.returncode != 0:
            why = " ".join(said.split())[:300]
            return f"{name}: Filter returned exit code {done.returncode}, execution message {why}"
        try:
            changed = json.loads(said)["m_Item2"]["environmentVariables"]
            return {str(k): str(v) for k, v in changed.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return f"The execution filter {name} answered what is not a task start ({err}): {said[:200]!r}"

    def run_as_system(self, node: str, command: str) -> tuple[int, str]:
        """`clusrun /user:system` on one node: the command's exit code and its output (stderr into
        stdout, as the agent streams it), run by bash as root."""
        with self.lock:
            known = self.node(node)
            if known.state != "Online" or known.health != "OK":
                return (
                    1,
                    f"The node {known.name} is {known.state} ({known.health}): it cannot run the command.",
                )
            env = self.node_env(known.name)
            described = f"1 {known.name} {known.cores}"
        env.update(CCP_NODES=described, CCP_NODES_CORES=described)
        try:
            done = subprocess.run(
                ["/bin/bash", "-c", command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tempfile.gettempdir(),
                timeout=300,
                check=False,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return 1, "The command did not end within 300 s."
        return done.returncode, done.stdout.decode("utf-8", "replace")

    def _run(self, task: Task, process: TaskProcess, folder: str) -> None:
        """Wait for the task's wrapper, make sure none of its processes is left, then report it."""
        returncode = process.popen.wait()
        with self.lock:
            task.exited = True
            stopping = task.stopping is not None
        if stopping:
            task.stop_done.wait()
        else:
            process.kill()  # what a finished task left running (the agent's cgroup cleanup)
        code = exit_code(returncode)
        output = _read_output(task, folder)
        container = os.path.join(folder, "containerId")
        if os.path.exists(container):  # the agent's CleanupTask.sh: the task's container goes
            with open(container, encoding="utf-8") as f:
                subprocess.run(["docker", "rm", "-f", f.read().strip()], capture_output=True, check=False)
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
        with self.lock:
            self._task_ended(task, code, output)

    def _task_ended(self, task: Task, code: int, output: str) -> None:
        job = task.job
        task.props.update(ExitCode=str(code), Output=output, EndTime=P.format_time(now()))
        task.nodes = []
        if task.stopping is not None:
            final = task.stopping
            if task.stop_message is not None:
                task.props["ErrorMessage"] = task.stop_message
        else:
            spec = task.props["TaskValidExitCodes"] or job.props["JobValidExitCodes"]
            try:
                valid = P.valid_exit_codes(spec)
            except P.PropError:
                valid = None
            final = "Finished" if P.exit_code_ok(code, valid) else "Failed"
            if final == "Failed":
                task.props["ErrorMessage"] = (
                    f"Task failed during execution with exit code {code}. "
                    "Please check task's output for error details."
                )
        self._task_state(task, final)
        if final == "Failed":
            self._after_task_failure(job, task)
        self._check_job_end(job)
        self.changed.notify_all()

    def _after_task_failure(self, job: Job, task: Task) -> None:
        fails_job = job.flag("FailOnTaskFailure") or P.as_bool(task.props["FailJobOnFailure"])
        if fails_job and job.stopping is None and job.state == "Running":
            self._stop_job(
                job,
                "Failed",
                f"Task {task.props['TaskId']} failed and the job fails on a task failure: "
                f"{task.props['ErrorMessage']}",
                False,
            )

    # ------------------------------------------------------------------------------ for the tests

    def live_processes(self) -> set[tuple[int, int]]:
        """Every process still alive that a task of this emulator started."""
        return marked_processes(self.marker_prefix())


def _read_output(task: Task, folder: str) -> str:
    """The agent keeps the first 1500 bytes of each stream that went to the task folder."""
    parts: list[bytes] = []
    for name, prop in (
        ("agent.txt", None),
        ("stdout.txt", "StdOutFilePath"),
        ("stderr.txt", "StdErrFilePath"),
    ):
        if prop is not None and task.props[prop]:
            continue
        with contextlib.suppress(OSError), open(os.path.join(folder, name), "rb") as f:
            parts.append(f.read(OUTPUT_LIMIT))
    return b"".join(parts).decode("utf-8", errors="replace")


def _same_user(owner: str, name: str) -> bool:
    """``HPC\\alice`` is ``alice``: ignore case, and the domain when only one side names one."""
    a, b = owner.lower(), name.lower()
    if "\\" in a and "\\" in b:
        return a == b
    return a.rsplit("\\", 1)[-1] == b.rsplit("\\", 1)[-1]


def _check_node(state: str, health: str) -> None:
    if state not in NODE_STATES:
        raise ValueError(f"node state {state!r} is not one of {', '.join(NODE_STATES)}")
    if health not in NODE_HEALTHS:
        raise ValueError(f"node health {health!r} is not one of {', '.join(NODE_HEALTHS)}")
