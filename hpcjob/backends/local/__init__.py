"""The local backend: the same JobPlan, run as N "nodes" on this machine.

Each node is what HPC Pack's Linux agent would start: `/bin/bash -c <CommandLine>` in the task's
WorkDirectory, stdout/stderr to the task's files, with the job's environment plus the CCP_* variables
the agent sets (facts/hpcpack-jobs.md section 5). The share is a local folder and the rendezvous is on
loopback. As with FailOnTaskFailure, one failing node ends the job: the others get SIGINT, then SIGKILL
after a grace period, as the agent cancels a task; every process the tasks started is tracked and
none outlives the job, not even when hpcjob itself is killed (a watchdog process then ends them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from hpcjob.backends.local.gpus import share_gpus, visible_gpus
from hpcjob.backends.local.procs import (
    LOCAL_CPUS_VAR,
    MARKER_VAR,
    STOP_SIGNALS,
    TaskProcess,
    Watchdog,
    exit_code,
    interrupt_on_cancel_signals,
    process_table,
)
from hpcjob.job.datasets import LOCAL_DIR_VAR
from hpcjob.job.layout import RESUME_VAR
from hpcjob.job.plan import (
    ENV_ON_VAR,
    ENVS_VAR,
    JobPlan,
    MountStep,
    TaskPlan,
    container_command,
    container_engine,
    make_plan,
)
from hpcjob.job.results import (
    ALREADY_MOUNTED,
    METRICS_PREFIX,
    JobInfo,
    JobSummary,
    MountResult,
    NodeInfo,
    NodeResult,
    State,
    Submission,
    TaskEnd,
    TaskInfo,
    elastic_events,
    find_metrics,
    job_exit_code,
)
from hpcjob.job.spec import HpcjobError, JobSpec, SpecError
from hpcjob.job.tracebacks import TracebackFilter
from hpcjob.store.logs import SUMMARY_FILE, RunLogs, Tail, node_tails, output_line, read_root_cause
from hpcjob.store.share import LocalFolder

if TYPE_CHECKING:
    from hpcjob.backends import Watch
    from hpcjob.job.render import JobShape
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord

LOOPBACK = "127.0.0.1"
# A submitted local job's own output (its progress), in its log folder.
SUPERVISOR_LOG = "hpcjob.log"
Printer = Callable[[str], None]


def local_node_names(spec: JobSpec) -> tuple[str, ...]:
    """The spec's node names if given, else n of LOCAL1, LOCAL2, ... leaving out the excluded ones (a
    later attempt's: its run lost them)."""
    return spec.node_names or _fresh_names("LOCAL", spec.node_count, spec.exclude_nodes)


def local_data_node_names(spec: JobSpec) -> tuple[str, ...]:
    """The spec's data node names if given, else m of DATA1, DATA2, ... leaving out the excluded ones: a
    lost data node is left out of the next attempt as a lost trainer is."""
    return spec.data_node_names or _fresh_names("DATA", spec.data_nodes, spec.exclude_nodes)


def _fresh_names(prefix: str, count: int, exclude: Sequence[str]) -> tuple[str, ...]:
    excluded = {name.upper() for name in exclude}
    names = (f"{prefix}{i}" for i in range(1, count + len(excluded) + 1))
    return tuple(name for name in names if name not in excluded)[:count]


# How many of this machine's CPUs the trainers of a local job with data nodes get (a benchmark's knob:
# one CPU for a trainer that must not decode its own data); unset: their share, N of N+M nodes.
TRAINER_CPUS_VAR = "HPCJOB_LOCAL_TRAINER_CPUS"


def local_cpus(
    cpus: Sequence[int],
    trainers: Sequence[str],
    data_node_names: Sequence[str],
    trainer_cpus: int | None = None,
) -> dict[str, str]:
    """Each local node's CPUs in a job with data nodes (HPCJOB_LOCAL_CPUS, as the task's first process
    sets its affinity): the trainers share the first `trainer_cpus` [default: N of N+M of them, at least
    one], the data nodes split the rest (sharing one each where there are fewer). {} without data nodes,
    or with one CPU: all share it."""
    if not data_node_names or len(cpus) < 2:
        return {}
    share = round(len(cpus) * len(trainers) / (len(trainers) + len(data_node_names)))
    count = min(len(cpus) - 1, max(1, trainer_cpus if trainer_cpus is not None else share))
    ordered = sorted(cpus)
    theirs, rest = ordered[:count], ordered[count:]
    placement = {name: ",".join(map(str, theirs)) for name in trainers}
    for index, name in enumerate(data_node_names):
        if len(rest) >= len(data_node_names):
            each = len(rest) // len(data_node_names)
            mine = rest[index * each : (index + 1) * each if index < len(data_node_names) - 1 else None]
        else:
            mine = [rest[index % len(rest)]]
        placement[name] = ",".join(map(str, mine))
    return placement


# A local node is lost as a machine is: its whole task killed from outside the job (a signal to the task
# itself, not a rank that torchrun reports), which `hpcjob.job.attempts` retries as a node lost.
LOST_WORDS = "the node is lost"
LOST_NODE = "its whole task was killed by signal {signal} from outside the job: " + LOST_WORDS


# Ports a local run may pick for its rendezvous: below the kernel's ephemeral range, so that no outgoing
# connection takes the port between its choice and torchrun's bind seconds later (the ephemeral port the
# kernel hands out for port 0 is free only until then), and clear of the defaults of hpcjob's rendezvous
# (29400), torchrun's (29500) and the data service (29600).
PICKED_PORTS_FROM = 20000
KEPT_CLEAR = range(29400, 29700)


def port_in_use(port: int, reuse_address: bool = False) -> str | None:
    """Why TCP `port` cannot be bound on every address of this machine (None: it is free).
    `reuse_address`: as torch's TCPStore binds its rendezvous (SO_REUSEADDR, pytorch/pytorch
    torch/csrc/distributed/c10d/socket.cpp SocketListenOp::tryListen, commit 056b6f38), so that only a
    listener counts, not an ended job's connections in TIME_WAIT; without it, those count too."""
    with socket.socket() as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))  # "": a listener on any address (0.0.0.0 or one of them) conflicts
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def free_port() -> int:
    """A TCP port nothing is bound to, on any address, picked at random below the ephemeral range."""
    below = _ephemeral_ports_from()
    for port in random.sample(range(PICKED_PORTS_FROM, below), k=min(200, below - PICKED_PORTS_FROM)):
        if port not in KEPT_CLEAR and port_in_use(port) is None:
            return port
    with socket.socket() as sock:  # that many taken: the kernel's choice, as good as it was before
        sock.bind(("", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def _ephemeral_ports_from() -> int:
    """The first port of Linux's ephemeral range (its default, 32768, where it cannot be read)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > PICKED_PORTS_FROM + 1000 else 32768


def default_share_root(code_dir: Path) -> Path:
    """The local stand-in for the share, one per project folder: two checkouts with the same script
    name never resume from each other's checkpoints; the same checkout always finds its own."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    code_dir = code_dir.resolve()
    digest = hashlib.sha256(str(code_dir).encode()).hexdigest()[:8]
    return Path(data_home) / "hpcjob" / "local-share" / f"{code_dir.name}-{digest}"


@dataclass
class _Node:
    task: TaskPlan
    result: NodeResult
    tails: list[Tail]
    process: TaskProcess | None = None
    ended_at: float | None = None  # seconds since the epoch, as the worker shim's records say it
    alive_at: float | None = None  # when it was last seen running

    def running(self) -> bool:
        return self.process is not None and self.process.popen.poll() is None


def local_node_folder(node: str) -> Path:
    """A local node's own disk (HPCJOB_LOCAL_DIR): a folder of this machine's cache, kept between runs, as
    a cluster node keeps its local disk."""
    from hpcjob.store.folders import user_folder

    return user_folder("cache") / "nodes" / node


class LocalBackend:
    """The Backend of this machine (hpcjob.backends.Backend). `run` runs a job in this process;
    `submit` starts one in a process of its own, which status, wait and cancel then find by its
    record, from any shell."""

    kind = "local"

    def __init__(
        self,
        *,
        grace_period_s: float = 10.0,
        poll_interval_s: float = 0.2,
        hidden_env: Collection[str] = (),
        share_root: Path | None = None,
        gpu_devices: Sequence[str | None] = (),
        echo_output: bool = False,
        attached: bool = False,
    ) -> None:
        """`hidden_env`: variables of this environment the tasks must not see (passwords).
        `share_root`: the local folder that stands in for the share [default: one per project].
        `gpu_devices`: each node's CUDA_VISIBLE_DEVICES (hpcjob.backends.local.gpus; `plan` sets them).
        `echo_output`: a submitted job's progress has its nodes' output too.
        `attached`: a submitted job is canceled when this process ends, however it ends (`run --local`)."""
        self.grace_period_s = grace_period_s
        self.poll_interval_s = poll_interval_s
        self.hidden_env = frozenset(hidden_env)
        self.share_root = share_root
        self.gpu_devices = tuple(gpu_devices)
        self.gpu_note: str | None = None
        self.echo_output = echo_output
        self.attached = attached
        self._progress_tails: dict[str, Tail] = {}  # each followed run's progress, read so far
        self._known_nodes: dict[str, None] = {}  # the local nodes of the jobs planned or looked at here
        self._lifelines: list[IO[bytes]] = []  # attached jobs: their end of the pipe closes with us
        self._cpus: dict[str, str] = {}  # each node's CPUs in a job with data nodes (local_cpus)

    # -- the Backend interface -------------------------------------------------------------------

    def nodes(self, group: str | None) -> list[NodeInfo]:
        """This machine, which holds every local node, and the local nodes of the jobs planned or looked at
        here: all healthy (a lost one is told by its task: LOST_NODE)."""
        cores = os.cpu_count()
        names = dict.fromkeys([socket.gethostname(), *self._known_nodes])
        return [NodeInfo(name, "Online", "OK", cores=cores) for name in names]

    def busy_nodes(self) -> set[str]:
        return set()

    def take_offline(
        self, nodes: Sequence[str], *, force: bool, progress: Printer, timeout_s: float = 0.0
    ) -> list[NodeInfo]:
        raise SpecError("the local backend has no cluster nodes to take offline: name a cluster (--cluster)")

    def bring_online(
        self, nodes: Sequence[str], *, progress: Printer, timeout_s: float = 0.0
    ) -> list[NodeInfo]:
        raise SpecError("the local backend has no cluster nodes to bring online: name a cluster (--cluster)")

    def add_to_group(self, group: str, nodes: Sequence[str]) -> list[str]:
        raise SpecError("the local backend has no node groups: name a cluster (--cluster)")

    def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
        """LOCAL1..n (or the spec's names) with the rendezvous on loopback and a local folder for
        the share; the spec's share and mount point do not apply here."""
        from hpcjob.store.runs import check_new_run_id

        if attempt == 1:  # a later attempt is of a run in the history already
            check_new_run_id(run_id)
        if attempt > 1:  # a free port of its own: the first attempt's may linger (TIME_WAIT) on loopback
            spec = replace(spec, rdzv_port=free_port())
        root = self.share_root or default_share_root(Path(spec.script).resolve().parent)
        share = share_gpus(visible_gpus(os.environ), spec.node_count, spec.procs_per_node)
        self.gpu_devices, self.gpu_note = share.devices, share.note
        names = local_node_names(spec)
        data = local_data_node_names(spec)
        plan = make_plan(
            spec,
            names,
            run_id,
            rdzv_host=LOOPBACK,
            mount_point=str(root),
            attempt=attempt,
            data_node_names=data,
        )
        self._known_nodes.update(dict.fromkeys((*names, *data)))
        engine = container_engine(dict(plan.env))
        if plan.image is not None and shutil.which(engine) is None:
            raise HpcjobError(
                f"--image {plan.image} runs each node's task in a container, and this machine has no "
                f"{engine} command: install Docker, or run without --image"
            )
        return plan

    def submit(
        self, plan: JobPlan, *, mount: bool, progress: Printer, record: Callable[[Submission], None]
    ) -> str:
        """Start the job in a process of its own (its progress in the log folder, hpcjob.log); the run
        id is its job id. Nothing to mount: the share is a local folder."""
        from hpcjob.job.render import plan_json

        gpus = [d for d in self.gpu_devices if d]
        progress(
            f"job {plan.name}: {len(plan.nodes)} node(s) x {plan.nproc_per_node} process(es), "
            + (f"GPUs {' | '.join(gpus)}, " if gpus else "")
            + f"rendezvous {plan.rdzv_endpoint}, folder {plan.job_dir}"
        )
        if self.gpu_note:
            progress(self.gpu_note)
        log_dir = Path(plan.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        request = {
            "plan": json.loads(plan_json(plan)),
            "grace_period_s": self.grace_period_s,
            "gpu_devices": list(self.gpu_devices),
            "echo_output": self.echo_output,
            "attached": self.attached,
        }
        # The job's process holds the stopping signals until its run has begun (a cancel that comes
        # while it starts up then still stops the nodes and writes the summary).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        with (log_dir / SUPERVISOR_LOG).open("wb") as log:
            try:
                runner = subprocess.Popen(
                    [sys.executable, "-m", "hpcjob.backends.local"],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={k: v for k, v in os.environ.items() if k not in self.hidden_env},
                    start_new_session=True,  # stopped by its starter or by cancel, not by a terminal
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
        assert runner.stdin is not None
        runner.stdin.write(json.dumps(request).encode() + b"\n")
        runner.stdin.flush()
        if self.attached:
            # Never written again, never closed by us: the kernel closes it when this process ends,
            # even by SIGKILL, and the job's process then cancels the job.
            self._lifelines.append(runner.stdin)
        else:
            runner.stdin.close()
        start = process_table().get(runner.pid, (0, -1, b""))[1]
        record(Submission("submitted", job_id=plan.job_name, process=(runner.pid, start)))
        if not self.attached:
            progress(
                f"job {plan.job_name} runs in process {runner.pid}; its output: {log_dir / SUPERVISOR_LOG}"
            )
        return plan.job_name

    def status(self, run: RunRecord) -> JobInfo:
        """From the run's summary once it has ended, else from its nodes' end marks."""
        log_dir = self._log_dir(run)
        self._known_nodes.update(dict.fromkeys(run.nodes))
        summary = local_status(log_dir, run.pid, run.pid_start)
        if summary is not None:
            ended_tasks = []
            for i, n in enumerate(summary.nodes):
                role = "data" if summary.is_data_node(n.node) else "torchrun"  # as the plan names them
                ended_tasks.append(TaskInfo(i + 1, f"{role} {n.node}", n.state, n.exit_code, n.node, n.error))
            return JobInfo(
                job_id=run.run_id,
                name=summary.name,
                state=summary.state,
                error=summary.root_cause.describe() if summary.root_cause else "",
                root_cause=summary.root_cause,
                tasks=tuple(ended_tasks),
            )
        ended = RunLogs(LocalFolder(log_dir), "", run.nodes).exit_codes()
        tasks = []
        for i, node in enumerate(run.nodes):
            code = ended.get(node.upper())
            state = State.RUNNING if code is None else State.FINISHED if code == 0 else State.FAILED
            tasks.append(TaskInfo(i + 1, f"torchrun {node}", state, code, node))
        return JobInfo(run.run_id, run.name, State.RUNNING, "", tuple(tasks))

    def wait(self, run: RunRecord, progress: Printer, watch: Watch | None = None) -> JobInfo:
        """Until the run has ended, each line of its progress (hpcjob.log: its nodes' states, and their
        output where it was started with `echo_output`), each line once however often waited for;
        `watch` is looked at every poll."""
        log_dir = self._log_dir(run)
        # One tail an attempt: each later attempt has a log folder (and a progress) of its own.
        tail = self._progress_tails.setdefault(str(log_dir), Tail(LocalFolder(log_dir), SUPERVISOR_LOG, ""))
        while True:
            ended = local_status(log_dir, run.pid, run.pid_start) is not None
            for line in tail.read(final=ended):
                progress(line)
            if ended:
                return self.status(run)
            if watch is not None:
                watch.look()
            time.sleep(self.poll_interval_s)

    def cancel(self, run: RunRecord, *, force: bool) -> str | None:
        """As Ctrl-C in the run's own shell: SIGTERM to the process that runs it (which stops the
        nodes: at once when `force`), then wait for it to end."""
        if not cancel_local(run.pid, run.pid_start, force):
            return self.status(run).state
        while running_process(run.pid, run.pid_start):
            time.sleep(0.1)
        return None

    def task_outputs(self, run: RunRecord) -> list[tuple[str, str]]:
        folder = LocalFolder(self._log_dir(run))
        outputs = []
        for node in run.nodes:
            try:
                outputs.append((node, folder.read_bytes(f"{node}.out").decode("utf-8", "replace")))
            except FileNotFoundError:
                continue
        return outputs

    def mount(self, name: str, step: MountStep, shape: JobShape, progress: Printer) -> list[MountResult]:
        """Nothing to mount: the local nodes share this machine's folders."""
        Path(step.mount_point).mkdir(parents=True, exist_ok=True)
        return [MountResult(node, ALREADY_MOUNTED, "a folder of this machine") for node in shape.nodes]

    def run_on_nodes(
        self, name: str, command: str, shape: JobShape, progress: Printer
    ) -> tuple[JobInfo, list[tuple[str, str]]]:
        """Each local node's run of `command`, one after the other (they are all this machine)."""
        tasks, outputs = [], []
        for index, node in enumerate(shape.nodes):
            env = {**os.environ, "HPCJOB_NODE": node}
            done = subprocess.run(
                ["/bin/bash", "-c", command],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=300,
            )
            state = State.FINISHED if done.returncode == 0 else State.FAILED
            tasks.append(TaskInfo(index + 1, f"probe {node}", state, done.returncode, node))
            outputs.append((node, done.stdout + done.stderr))
        failed = any(t.state == State.FAILED for t in tasks)
        return JobInfo(name, name, State.FAILED if failed else State.FINISHED, "", tuple(tasks)), outputs

    def version(self) -> str | None:
        return None  # no HPC Pack here

    def install_filter(self, command: str, shape: JobShape, progress: Printer) -> tuple[bool, str]:
        return True, "nothing to install: the local nodes share this machine's folders"

    def close(self) -> None:
        pass

    @staticmethod
    def _log_dir(run: RunRecord) -> Path:
        if run.local_root is None:
            raise HpcjobError(f"run {run.run_id} has no local folder recorded")
        return Path(run.local_root) / run.log_folder

    # -- running a job in this process -----------------------------------------------------------

    def run(self, plan: JobPlan, *, progress: Printer, echo_output: bool = True) -> JobSummary:
        """Run the plan's tasks here until the job ends; Ctrl-C (KeyboardInterrupt) cancels it."""
        Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
        nodes = [self._node(task) for task in plan.tasks]
        trainer_cpus = os.environ.get(TRAINER_CPUS_VAR, "")
        self._cpus = local_cpus(
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
            plan.nodes,
            plan.data_node_names,
            int(trainer_cpus) if trainer_cpus.isdigit() else None,
        )
        start = time.monotonic()
        state = State.RUNNING
        failed_first: _Node | None = None
        stopped_at: float | None = None
        watchdog = Watchdog(f"{plan.job_name}/")
        tracebacks = TracebackFilter()  # what is echoed of the nodes' output (their logs keep it all)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held by a submitted job's starter
            for index, node in enumerate(nodes):
                self._start(plan, index, node)
                progress(f"{node.task.node}: Running")
            while True:
                for node in nodes:
                    if node.process is not None:
                        node.process.refresh()  # remember each new process of the task
                if echo_output:
                    _echo(nodes, progress, tracebacks)
                for node in nodes:
                    if node.result.state is State.RUNNING and node.running():
                        node.alive_at = time.time()
                    elif node.result.state is State.RUNNING:
                        assert node.process is not None
                        code = exit_code(node.process.popen.returncode)
                        # A task killed from outside (its whole node: a signal, not an exit) died as early
                        # as just after it was last seen running, maybe before its peers' ranks failed
                        # for its loss: that earliest time is the one to put in order.
                        killed = code > 128 and node.alive_at is not None
                        if node.process.popen.returncode < 0:  # the task itself, not what it ran
                            node.result.error = LOST_NODE.format(signal=-node.process.popen.returncode)
                        node.ended_at = node.alive_at if killed else time.time()
                        node.result.exit_code = code
                        node.result.state = State.FINISHED if code == 0 else State.FAILED
                        progress(f"{node.task.node}: {node.result.state} (exit code {code})")
                        if code != 0 and failed_first is None and not self._goes_on(plan, nodes, progress):
                            failed_first = node
                if failed_first is not None:
                    state = State.FAILED
                    progress("a task failed: stopping the other nodes")
                    tracebacks.stopping(n.task.node for n in nodes if n.running())
                    stopped_at = time.time()
                    self._stop(nodes, progress)
                    break
                if all(n.result.state.ended for n in nodes):
                    finished = sum(n.result.state is State.FINISHED for n in nodes)
                    # An elastic job succeeds when enough of its nodes saw it through.
                    state = State.FINISHED if finished >= (plan.min_nodes or len(nodes)) else State.FAILED
                    break
                if plan.runtime_s is not None and time.monotonic() - start > plan.runtime_s:
                    # As the scheduler does with a job past its run-time limit: cancel it.
                    progress(f"the job exceeded its run-time limit of {plan.runtime_s} s: canceling it")
                    raise KeyboardInterrupt
                time.sleep(self.poll_interval_s)
        except KeyboardInterrupt:
            state = State.CANCELED
            progress("canceled: stopping all nodes")
            tracebacks.stopping(n.task.node for n in nodes if n.running())
            self._stop(nodes, progress)
        finally:
            for node in nodes:  # whatever any task started and is still alive
                if node.process is not None:
                    node.process.kill()
                    node.process.popen.wait()
            watchdog.close()
        if echo_output:
            _echo(nodes, progress, tracebacks, final=True)
        summary = self._summary(plan, nodes, state, failed_first, stopped_at, time.monotonic() - start)
        # Tells `hpcjob logs --follow` and `run --local`, which read it as it comes, that the job has ended:
        # whole or not at all.
        written = Path(plan.log_dir) / f".{SUMMARY_FILE}.{os.getpid()}"
        written.write_text(summary.to_json(), encoding="utf-8")
        os.replace(written, Path(plan.log_dir) / SUMMARY_FILE)
        return summary

    @staticmethod
    def _goes_on(plan: JobPlan, nodes: Sequence[_Node], progress: Printer) -> bool:
        """After a task failed: whether the job goes on without it (an elastic job with at least its
        minimum of nodes left; the others re-form the rendezvous and restart from the checkpoint)."""
        if plan.min_nodes is None:
            return False
        left = sum(n.result.state is not State.FAILED for n in nodes)
        if left < plan.min_nodes:
            progress(f"{left} node(s) left, fewer than the job's minimum of {plan.min_nodes}")
            return False
        progress(f"going on with {left} node(s) (elastic job: at least {plan.min_nodes})")
        return True

    @staticmethod
    def _node(task: TaskPlan) -> _Node:
        result = NodeResult(task.node, stdout_path=task.stdout_path, stderr_path=task.stderr_path)
        # The plan puts each task's stdout/stderr in the run's log folder as NODE.out/NODE.err.
        tails = node_tails(LocalFolder(Path(task.stdout_path).parent), "", task.node)
        return _Node(task=task, result=result, tails=tails)

    def _start(self, plan: JobPlan, index: int, node: _Node) -> None:
        task = node.task
        # Not this shell's HPCJOB_RESUME_FROM: a run starts from another's checkpoint only when its own
        # plan says so (--resume-from), as on a node.
        left_out = {MARKER_VAR, RESUME_VAR, *self.hidden_env}
        env = {k: v for k, v in os.environ.items() if k not in left_out}
        variables = {**dict(plan.env), **dict(task.env)}  # the task's own, as a node gets them
        if index < len(self.gpu_devices) and self.gpu_devices[index] is not None:
            variables["CUDA_VISIBLE_DEVICES"] = str(self.gpu_devices[index])  # this node's own GPUs
        if task.node in plan.data_node_names:  # a CPU node (its data service finds a free port if it must)
            variables["CUDA_VISIBLE_DEVICES"] = ""
        if task.node in self._cpus:
            variables[LOCAL_CPUS_VAR] = self._cpus[task.node]
        if LOCAL_DIR_VAR not in variables:  # each local node's own disk: a folder of this machine's cache
            variables[LOCAL_DIR_VAR] = str(local_node_folder(task.node))
        variables.update(
            {
                "CCP_JOBID": str(os.getpid()),
                "CCP_TASKID": str(index + 1),
                "CCP_JOBNAME": plan.name,
                "CCP_NODES": f"1 {task.node} {os.cpu_count() or 1}",
                "CCP_WORKDIR": task.work_directory,
                "HPCJOB_IFNAME": "lo" if sys.platform.startswith("linux") else "lo0",
                "HPCJOB_ADDR": LOOPBACK,
                # Every local node's processes share this machine's CPUs (training sizes its loaders).
                "HPCJOB_PROCESSES_ON_HOST": str(plan.world_size),
                MARKER_VAR: f"{plan.job_name}/{index + 1}",  # '/': no run id starts another's
            }
        )
        env.update(variables)
        # This Python's folder first, so the command's `python3` is the one hpcjob runs with.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        command = ["/bin/bash", "-c", task.command_line]
        if plan.image:
            command = self._in_container(plan, task, variables)
        with open(task.stdout_path, "wb") as stdout, open(task.stderr_path, "wb") as stderr:
            node.process = TaskProcess(
                command,
                cwd=task.work_directory,
                env=env,
                marker=env[MARKER_VAR],
                stdout=stdout.fileno(),
                stderr=stderr.fileno(),
            )
        node.result.state = State.RUNNING

    @staticmethod
    def _in_container(plan: JobPlan, task: TaskPlan, variables: dict[str, str]) -> list[str]:
        """The task in a container of the plan's image, as the node agent runs it: the task's variables
        alone (in a file beside its logs, only this user's to read), this user, its work folder, bash
        as the command (`docker exec` of the agent runs no ENTRYPOINT either); the folder of
        environments made first (Docker would make a missing one root's), and named whole, as this
        machine's home is not the one the container's passwd gives."""
        envs = variables.get(ENVS_VAR, "")
        volumes = []
        if envs and variables.get(ENV_ON_VAR) == "node-local":
            folder = os.path.expanduser(envs)
            os.makedirs(folder, exist_ok=True)
            variables = {**variables, ENVS_VAR: folder}
            if envs.startswith("~"):
                volumes.append(f"{folder}:{folder}")
        own_disk = local_node_folder(task.node)
        if variables.get(LOCAL_DIR_VAR) == str(own_disk):  # the node's own disk, as the job's volume is
            own_disk.mkdir(parents=True, exist_ok=True)
            volumes.append(f"{own_disk}:{own_disk}")
        env_file = Path(plan.log_dir) / f"{task.node}.container-env"
        with os.fdopen(os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write("".join(f"{name}={value}\n" for name, value in variables.items()))
        command = container_command(
            variables,
            task.command_line,
            name=f"hpcjob-{plan.job_name}-{task.node}",
            env_file=str(env_file),
            user=f"{os.getuid()}:{os.getgid()}",
            workdir=task.work_directory,
            volumes=volumes,
        )
        return [shutil.which(command[0]) or command[0], *command[1:]]  # the task starts it by its path

    def _stop(self, nodes: Sequence[_Node], progress: Printer) -> None:
        """As HPC Pack cancels tasks: SIGINT to every process of the running tasks, SIGKILL to what is
        left after the grace period (at once on a second Ctrl-C)."""
        running = [n for n in nodes if n.running()]
        processes = [n.process for n in running if n.process is not None]
        deadline = time.monotonic() + self.grace_period_s
        try:
            # A list, not a generator: each round must interrupt what is new in every task.
            while any([p.interrupt() for p in processes]) and time.monotonic() < deadline:
                time.sleep(0.1)
        except KeyboardInterrupt:
            progress("interrupted again: killing now")
        for node in running:
            assert node.process is not None
            node.process.kill()
            node.result.exit_code = exit_code(node.process.popen.wait())
            node.result.state = State.CANCELED
            node.ended_at = time.time()

    @staticmethod
    def _summary(
        plan: JobPlan,
        nodes: Sequence[_Node],
        state: State,
        failed_first: _Node | None,
        stopped_at: float | None,
        wall_time: float,
    ) -> JobSummary:
        root_cause = None
        ends = [
            TaskEnd(n.task.node, n.result.exit_code, n.ended_at)
            for n in nodes
            if n.result.exit_code is not None and n.ended_at is not None
        ]
        if state is State.FAILED:
            root_cause = read_root_cause(LocalFolder(Path(plan.log_dir)), "", ends, stopped_at)
            gone = {n.task.node.upper(): n.result.error for n in nodes if n.result.error.endswith(LOST_WORDS)}
            if root_cause is not None and root_cause.node.upper() in gone:  # not the last line it printed
                root_cause = replace(root_cause, rank=None, reason=gone[root_cause.node.upper()])
        events: list[str] = []
        if plan.min_nodes is not None:
            # The nodes lost while the job went on: not those it stopped itself.
            lost = [e for e in ends if e.exit_code != 0 and (stopped_at is None or e.time < stopped_at)]
            timeline = RunLogs(LocalFolder(Path(plan.log_dir)), "", plan.nodes).timeline()
            events = elastic_events(lost, timeline, plan.nproc_per_node)
        lines: list[str] = []
        for node in nodes:
            path = Path(node.task.stdout_path)
            if path.is_file():
                lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
        return JobSummary(
            name=plan.name,
            run_id=plan.run_id,
            state=state,
            exit_code=job_exit_code(
                state, failed_first.result.exit_code if failed_first else None, root_cause
            ),
            wall_time_s=round(wall_time, 3),
            job_dir=plan.job_dir,
            log_dir=plan.log_dir,
            nodes=[n.result for n in nodes],
            root_cause=root_cause,
            metrics=find_metrics(lines),
            events=events,
            data_node_names=list(plan.data_node_names),
            datasets=RunLogs(LocalFolder(Path(plan.log_dir)), "", plan.nodes).datasets(),
        )


def running_process(pid: int | None, start: int | None) -> bool:
    """Whether the process recorded as (pid, start time) still runs (not a later one with its pid)."""
    entry = process_table().get(pid or -1)
    return entry is not None and entry[1] == start and entry[2] not in (b"Z", b"X")


def local_status(log_dir: Path, pid: int | None, start: int | None) -> JobSummary | None:
    """A local run seen from another shell: its summary once it has ended; None while it runs."""
    summary = log_dir / SUMMARY_FILE
    if summary.is_file():
        return JobSummary.from_json(summary.read_text(encoding="utf-8"))
    if running_process(pid, start):
        return None
    raise HpcjobError(
        f"the run in {log_dir} ended without a summary: its process was killed while it ran (its tasks "
        "were stopped with it)"
    )


def cancel_local(pid: int | None, start: int | None, force: bool = False) -> bool:
    """Cancel a local run from another shell, as Ctrl-C in its own does (twice when `force`: no grace
    period); False when it had ended."""
    if not running_process(pid, start):
        return False
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    if force:
        time.sleep(0.2)  # the first must have been taken: a second one during the stop kills at once
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return True


def open_backend(profile: ClusterProfile | None, password: str | None) -> LocalBackend:
    from hpcjob.store.config import secret_variables

    return LocalBackend(hidden_env=secret_variables())


def supervise() -> int:
    """A submitted job's process: runs the plan read from stdin's first line. An attached job's starter
    holds stdin open for as long as it lives: its end (EOF) cancels the job, as SIGTERM does."""
    request = json.loads(sys.stdin.buffer.readline())
    plan = JobPlan.from_dict(request["plan"])
    interrupt_on_cancel_signals()  # `hpcjob cancel`, its starter's end: the nodes stopped, not orphaned
    if request.get("attached"):
        threading.Thread(target=_cancel_when_starter_ends, daemon=True).start()
    backend = LocalBackend(grace_period_s=request["grace_period_s"], gpu_devices=request["gpu_devices"])
    summary = backend.run(
        plan, progress=lambda line: print(line, flush=True), echo_output=request.get("echo_output", False)
    )
    for stop in STOP_SIGNALS:  # the job has ended: its starter's end, or a late cancel, changes nothing
        signal.signal(stop, signal.SIG_IGN)
    return summary.exit_code


def _cancel_when_starter_ends() -> None:
    # The file descriptor, not sys.stdin: a daemon thread blocked in a buffered read holds its lock, and
    # Python's shutdown then aborts the process ("could not acquire lock for <stdin>").
    while os.read(sys.stdin.fileno(), 65536):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _echo(
    nodes: Sequence[_Node], progress: Printer, tracebacks: TracebackFilter, final: bool = False
) -> None:
    """The nodes' new lines, but the metrics line, which the summary shows in a person's units, with a
    failing script's tracebacks cut to its own frames and each shown once, and torchrun's report of the
    failure left out (hpcjob.job.tracebacks; the first-failure line says it). The logs keep every line,
    for `hpcjob logs` and the history."""
    for node in nodes:
        for stream, tail in zip(("stdout", "stderr"), node.tails, strict=True):  # node_tails' order
            for line in tail.read(final):
                text = line[len(tail.prefix) :]
                if not text.startswith(METRICS_PREFIX):
                    for shown in tracebacks.feed(node.task.node, stream, text):
                        progress(output_line(*shown))
    for shown in tracebacks.flush(final):
        progress(output_line(*shown))
