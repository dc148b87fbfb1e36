"""The emulated cluster's jobs and tasks: their records, the requests that change them, and their states.

States follow facts/hpcpack-rest.md section 5. A job: Configuring -> (submit) Submitted -> Validating ->
Queued -> Running -> Finished | Failed | Canceled, with Canceling (Finishing for "finish") while its
running tasks are being stopped; the final state is set only once no process of the job is left. A job
that fails validation goes to Failed with an ErrorMessage. A task: Configuring -> Submitted (on submit)
-> Queued (the job passed validation) -> Dispatching -> Running -> Finished | Failed | Canceled.

This module holds the records and every transition that a request or an ending task makes. Moving a
job from Submitted to Running and dispatching its tasks is the scheduler's (scheduler.py); a task's
processes are the node agent's (agent.py), which `JobBook` reaches only through the two functions it is
given: the scheduler's validation and the agent's stop of a task's processes. Callers hold the
cluster's lock for the methods without a ``with self.lock`` of their own.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hpcjob.backends.local.procs import TaskProcess
from hpcjob.emulator import props as P
from hpcjob.emulator.base import Actor, ApiError, now
from hpcjob.emulator.jobxml import parse_job_xml
from hpcjob.emulator.nodes import NodeRegistry

ACTIVE_TASK = frozenset({"Dispatching", "Running", "Canceling", "Finishing"})
# What a task taken by a lost node ends with, in the head node's words: the message (`{node}` is the
# node's name) and an exit code, since none reached the head node. Both UNVERIFIED (the emulator's).
NODE_LOST_MESSAGE = "The node {node} became unreachable."
LOST_EXIT_CODE = -1


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
    # The lost node that took the task: the head node ends it only when it notices (fail_lost_tasks);
    # `lost_gone`: its processes are gone, and their end was reported to nobody.
    lost_on: str | None = None
    lost_gone: bool = False

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
    # When a job that failed for a lost node goes back to the queue by itself (JobRetryCount).
    auto_requeue_at: float | None = None

    @property
    def state(self) -> str:
        return self.props["State"]

    def flag(self, name: str) -> bool:
        return P.as_bool(self.props[name])


class JobBook:
    """Every job by id, the requests on jobs and tasks, and the state changes they and ending tasks make."""

    def __init__(
        self,
        lock: threading.RLock,
        changed: threading.Condition,
        registry: NodeRegistry,
        *,
        grace_period: float,
        domain: str | None,
        command_line_limit: int | None,
        step_delay: float,
        validate: Callable[[Job], str | None],
        stop_process: Callable[[Task, TaskProcess], None],
        node_lost_message: str = NODE_LOST_MESSAGE,
        job_retry_count: int = 0,
        auto_requeue_delay: float = 2.0,
    ) -> None:
        """`validate(job)`: what the scheduler refuses, or None (for a task added to a queued or running
        job); `stop_process(task, process)`: stop a task's processes, which reports its end when done.
        `node_lost_message`: the ErrorMessage of a task whose node was lost ({node}: its name);
        `job_retry_count`: the cluster's JobRetryCount, how many times a job that failed for a lost
        node is requeued by itself, `auto_requeue_delay` seconds after it failed."""
        self.lock = lock
        self.changed = changed
        self.registry = registry
        self.grace_period = grace_period
        self.domain = domain
        self.command_line_limit = command_line_limit
        self.step_delay = step_delay
        self.validate = validate
        self.stop_process = stop_process
        self.node_lost_message = node_lost_message
        self.job_retry_count = job_retry_count
        self.auto_requeue_delay = auto_requeue_delay
        self.jobs: dict[int, Job] = {}
        self._next_job = 1
        self._next_seq = 1
        self._next_task_system_id = 1

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
        if not actor.admin and not same_user(job.props["Owner"], actor.name):
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
                self.task_state(task, "Submitted")
            self.job_state(job, "Submitted")
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
            self.stop_job(job, "Canceled", text, forced)

    def finish_job(self, actor: Actor, job_id: int, message: str | None) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state in P.ENDED or job.state in ("Configuring", "Canceling", "Finishing"):
                raise ApiError(400, f"Jobs in the {job.state} state cannot be finished.")
            self.stop_job(job, "Finished", None, False)

    def requeue_job(self, actor: Actor, job_id: int) -> None:
        with self.lock:
            job = self.job(job_id)
            self._may_change(actor, job)
            if job.state not in ("Failed", "Canceled"):
                raise ApiError(400, f"Jobs in the {job.state} state cannot be requeued.")
            job.seq = self._next_seq  # in the queue as if submitted now
            self._next_seq += 1
            self._back_to_queue(job, "Submitted", automatic=False)

    def _back_to_queue(self, job: Job, state: str, *, automatic: bool) -> None:
        """A failed or canceled job, and its unfinished tasks, in `state` again: its end forgotten,
        RequeueCount counting it (and AutoRequeueCount, when the scheduler did it by itself)."""
        counts = {"RequeueCount": str(int(job.props["RequeueCount"]) + 1)}
        if automatic:
            counts["AutoRequeueCount"] = str(int(job.props["AutoRequeueCount"]) + 1)
        job.props.update(ErrorMessage="", StartTime="", EndTime="", AllocatedNodes="", **counts)
        job.stopping = None
        job.auto_requeue_at = None
        for task in job.tasks:
            if task.state != "Finished":
                self._reset_task(task)
                if automatic:
                    task.props["AutoRequeueCount"] = str(int(task.props["AutoRequeueCount"]) + 1)
                self.task_state(task, state)
        self.job_state(job, state)
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
        task.lost_on = None
        task.lost_gone = False

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
                jobs = [j for j in jobs if same_user(j.props["Owner"], owner)]
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
                self.task_state(task, "Submitted")
                error = self.validate(job)
                if error:
                    job.tasks.pop()
                    raise ApiError(400, error)
                self.task_state(task, "Queued")
            elif job.state != "Configuring":
                self.task_state(task, "Submitted")
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
                self.task_state(task, "Canceled")
                self.check_job_end(job)
            elif task.state in ACTIVE_TASK:
                # A running task that is canceled ends Failed (observed on real clusters, BVT).
                self.request_stop(task, "Failed", text, forced)
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
                self.task_state(task, "Finished")
                self.check_job_end(job)
            elif task.state in ("Dispatching", "Running"):
                self.request_stop(task, "Finished", message or "", False)
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
                self.task_state(task, "Queued")
            elif job.state in ("Submitted", "Validating"):
                self.task_state(task, "Submitted")
            else:
                self.task_state(task, "Configuring")
            self.changed.notify_all()

    # ------------------------------------------------------------------------------ state changes

    def job_state(self, job: Job, state: str) -> None:
        if job.state != state:
            job.props["PreviousState"] = job.state
            job.props["State"] = state
            job.history.append(state)
        job.props["ChangeTime"] = P.format_time(now())

    def task_state(self, task: Task, state: str) -> None:
        if task.state != state:
            task.props["PreviousState"] = task.state
            task.props["State"] = state
            task.history.append(state)
        task.props["ChangeTime"] = P.format_time(now())

    def end_job(self, job: Job, state: str) -> None:
        for node_name in job.allocation:
            self.registry.nodes[node_name.lower()].held.pop(job.id, None)
        job.allocation = {}
        job.props["EndTime"] = P.format_time(now())
        job.stopping = None
        self.job_state(job, state)
        retried = state == "Failed" and self._failed_for_lost_node(job)
        job.auto_requeue_at = time.monotonic() + self.auto_requeue_delay if retried else None
        self.changed.notify_all()

    def _failed_for_lost_node(self, job: Job) -> bool:
        """Whether JobRetryCount requeues the job: every failed task failed for a lost node (a system
        error, not the job's own), and the job has retries left."""
        failed = [t for t in job.tasks if t.state == "Failed"]
        lost = bool(failed) and all(t.lost_on is not None for t in failed)
        return lost and int(job.props["AutoRequeueCount"]) < self.job_retry_count

    def auto_requeue(self, job: Job) -> None:
        """JobRetryCount: a job that failed for a system error goes back to the queue by itself, as
        Queued, its unfinished tasks too; RequeueCount and AutoRequeueCount count it."""
        job.filtered_nodes = set()  # a new start on each node: OnJobTaskStart.sh again
        self._back_to_queue(job, "Queued", automatic=True)

    def stop_job(self, job: Job, final: str, message: str | None, forced: bool) -> None:
        """End a job: stop its running tasks (SIGINT, SIGKILL after the grace period), cancel the rest."""
        if message is not None:
            job.props["ErrorMessage"] = message
        for task in job.tasks:
            if task.state in ACTIVE_TASK:
                self.request_stop(task, "Canceled", None, forced)
            elif task.state not in P.ENDED:
                self.task_state(task, "Canceled")
        if any(t.state in ACTIVE_TASK for t in job.tasks):
            job.stopping = final
            self.job_state(job, "Finishing" if final == "Finished" else "Canceling")
        else:
            self.end_job(job, final)

    def request_stop(self, task: Task, final: str, message: str | None, forced: bool) -> None:
        if forced or self.grace_period <= 0:
            task.kill_now.set()
        if task.exited or task.stopping is not None:
            return  # already ending: its runner reports it
        task.stopping = final
        task.stop_message = message
        self.task_state(task, "Finishing" if final == "Finished" else "Canceling")
        process = task.process
        if process is None:  # cannot happen: a task is started under the same lock that dispatches it
            task.stop_done.set()
            self.task_state(task, final)
            return
        self.stop_process(task, process)

    def stop_all(self, message: str) -> None:
        """Kill every task that has processes (no grace: the head node is going away)."""
        for job in self.jobs.values():
            for task in job.tasks:
                if task.process is not None and not task.exited:
                    self.request_stop(task, "Canceled", message, forced=True)

    def tasks_on(self, node_name: str) -> list[Task]:
        return [
            t
            for j in self.jobs.values()
            for t in j.tasks
            if t.state in ACTIVE_TASK and any(n == node_name for n, _ in t.nodes)
        ]

    def lose_tasks(self, node_name: str) -> list[Task]:
        """The node is lost: its tasks are taken with it (whoever owns the processes decides what happens
        to them), but the head node does not know it yet: they stay as they are until
        `fail_lost_tasks`. Returns the tasks it took."""
        taken = [t for t in self.tasks_on(node_name) if t.lost_on is None]
        for task in taken:
            task.lost_on = node_name
        return taken

    def fail_lost_tasks(self, node_name: str) -> None:
        """The head node gives up on the node: each task it took ends Failed with the node-lost message
        (one being stopped ends as its stop said), with no exit code or output; the processes that
        still run are killed first, and the task ends once they are gone."""
        message = self.node_lost_message.format(node=node_name)
        for task in self.tasks_on(node_name):
            if task.lost_on != node_name:
                continue
            already_stopping = task.stopping is not None
            if not already_stopping:
                task.stopping, task.stop_message = "Failed", message
            task.kill_now.set()
            if task.process is None or task.lost_gone:
                task.stop_done.set()
                self.task_ended(task, LOST_EXIT_CODE, "")
            elif not task.exited and not already_stopping:
                self.stop_process(task, task.process)

    def node_back(self, node_name: str, *, keep_running: bool) -> None:
        """A lost node reports again before the head node gave up on it: the tasks it took whose
        processes are gone end now, as at detection; with `keep_running` (its processes were never
        killed), those that still run carry on."""
        if keep_running:
            for task in self.tasks_on(node_name):
                if task.lost_on == node_name and task.process is not None and not task.lost_gone:
                    task.lost_on = None
        self.fail_lost_tasks(node_name)

    def node_lost(self, node_name: str) -> None:
        """A node whose health is set to Error: its tasks are lost, and fail, at once."""
        self.lose_tasks(node_name)
        self.fail_lost_tasks(node_name)

    def check_job_end(self, job: Job) -> None:
        if any(t.state in ACTIVE_TASK for t in job.tasks):
            return
        if job.state in ("Canceling", "Finishing") and job.stopping is not None:
            self.end_job(job, job.stopping)
        elif job.state == "Running" and not job.flag("RunUntilCanceled"):
            if any(t.state not in P.ENDED for t in job.tasks):
                return
            failed = [t for t in job.tasks if t.state == "Failed"]
            if failed:
                job.props["ErrorMessage"] = (
                    f"{len(failed)} of {len(job.tasks)} tasks failed; "
                    f"the first is task {failed[0].props['TaskId']}."
                )
            self.end_job(job, "Failed" if failed else "Finished")

    def task_ended(self, task: Task, code: int, output: str) -> None:
        """A task's processes are all gone: its exit code and output decide its final state."""
        job = task.job
        if task.lost_on is not None:
            if task.stopping is None:  # the processes died with the node: the head node waits
                task.lost_gone = True
                return
            code, output = LOST_EXIT_CODE, ""  # nothing of the task reached the head node
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
        self.task_state(task, final)
        if final == "Failed":
            self.after_task_failure(job, task)
        self.check_job_end(job)
        self.changed.notify_all()

    def after_task_failure(self, job: Job, task: Task) -> None:
        fails_job = job.flag("FailOnTaskFailure") or P.as_bool(task.props["FailJobOnFailure"])
        if fails_job and job.stopping is None and job.state == "Running":
            self.stop_job(
                job,
                "Failed",
                f"Task {task.props['TaskId']} failed and the job fails on a task failure: "
                f"{task.props['ErrorMessage']}",
                False,
            )


def same_user(owner: str, name: str) -> bool:
    """``HPC\\alice`` is ``alice``: ignore case, and the domain when only one side names one."""
    a, b = owner.lower(), name.lower()
    if "\\" in a and "\\" in b:
        return a == b
    return a.rsplit("\\", 1)[-1] == b.rsplit("\\", 1)[-1]
