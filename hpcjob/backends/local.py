"""The local backend: the same JobPlan, run as N "nodes" on this machine.

Each node is what HPC Pack's Linux agent would start: `/bin/bash -c <CommandLine>` in the task's
WorkDirectory, stdout/stderr to the task's files, with the job's environment plus the CCP_* variables
the agent sets (facts/hpcpack-jobs.md section 5). The share is a local folder and the rendezvous is on
loopback. As with FailOnTaskFailure, one failing node ends the job: the others get SIGINT, then SIGKILL
after a grace period, as the agent cancels a task; every process the tasks started is tracked and
none outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hpcjob.backends.base import (
    JobSummary,
    NodeResult,
    State,
    find_metrics,
    job_exit_code,
)
from hpcjob.logs import SUMMARY_FILE, Tail, node_tails, read_root_cause
from hpcjob.plan import JobPlan, TaskPlan
from hpcjob.share import LocalFolder
from hpcjob.spec import JobSpec

LOOPBACK = "127.0.0.1"
Printer = Callable[[str], None]


def local_node_names(spec: JobSpec) -> tuple[str, ...]:
    """The spec's node names if given, else LOCAL1..LOCALn."""
    return spec.node_names or tuple(f"LOCAL{i}" for i in range(1, spec.node_count + 1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def default_share_root() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "hpcjob" / "local-share"


@dataclass
class _Node:
    task: TaskPlan
    result: NodeResult
    tails: list[Tail]
    process: subprocess.Popen[bytes] | None = None
    # Every process seen in the task's tree, by pid and start time (pids get reused).
    seen: set[tuple[int, int]] = field(default_factory=set)
    files: list[IO[bytes]] = field(default_factory=list)


class LocalBackend:
    def __init__(self, *, grace_period_s: float = 10.0, poll_interval_s: float = 0.2) -> None:
        self.grace_period_s = grace_period_s
        self.poll_interval_s = poll_interval_s

    def run(self, plan: JobPlan, *, progress: Printer, echo_output: bool = True) -> JobSummary:
        """Run the plan's tasks here until the job ends; Ctrl-C (KeyboardInterrupt) cancels it."""
        Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
        nodes = [self._node(task) for task in plan.tasks]
        start = time.monotonic()
        state = State.RUNNING
        failed_first: _Node | None = None
        try:
            for index, node in enumerate(nodes):
                self._start(plan, index, node)
                progress(f"{node.task.node}: Running (pid {node.process.pid if node.process else '?'})")
            while True:
                self._track(nodes)
                if echo_output:
                    _echo(nodes, progress)
                for node in nodes:
                    if (
                        node.result.state is State.RUNNING
                        and node.process
                        and node.process.poll() is not None
                    ):
                        code = _exit_code(node.process.returncode)
                        node.result.exit_code = code
                        node.result.state = State.FINISHED if code == 0 else State.FAILED
                        progress(f"{node.task.node}: {node.result.state} (exit code {code})")
                        if code != 0 and failed_first is None:
                            failed_first = node
                if failed_first is not None:
                    state = State.FAILED
                    progress("a task failed: stopping the other nodes")
                    self._stop(nodes, progress)
                    break
                if all(n.result.state.ended for n in nodes):
                    state = State.FINISHED
                    break
                time.sleep(self.poll_interval_s)
        except KeyboardInterrupt:
            state = State.CANCELED
            progress("canceled: stopping all nodes")
            self._stop(nodes, progress)
        finally:
            self._sweep(nodes)
            for node in nodes:
                for f in node.files:
                    f.close()
        if echo_output:
            _echo(nodes, progress, final=True)
        summary = self._summary(plan, nodes, state, failed_first, time.monotonic() - start)
        # Tells `hpcjob logs --follow` in another terminal that the job has ended.
        (Path(plan.log_dir) / SUMMARY_FILE).write_text(summary.to_json(), encoding="utf-8")
        return summary

    @staticmethod
    def _node(task: TaskPlan) -> _Node:
        result = NodeResult(task.node, stdout_path=task.stdout_path, stderr_path=task.stderr_path)
        # The plan puts each task's stdout/stderr in the run's log folder as NODE.out/NODE.err.
        tails = node_tails(LocalFolder(Path(task.stdout_path).parent), "", task.node)
        return _Node(task=task, result=result, tails=tails)

    def _start(self, plan: JobPlan, index: int, node: _Node) -> None:
        task = node.task
        env = dict(os.environ)
        env.update(plan.env)
        # This Python's folder first, so the command's `python3` is the one hpcjob runs with.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(
            {
                "CCP_JOBID": str(os.getpid()),
                "CCP_TASKID": str(index + 1),
                "CCP_JOBNAME": plan.name,
                "CCP_NODES": f"1 {task.node} {os.cpu_count() or 1}",
                "CCP_WORKDIR": task.work_directory,
                "HPCJOB_IFNAME": "lo" if sys.platform.startswith("linux") else "lo0",
                "HPCJOB_ADDR": LOOPBACK,
            }
        )
        stdout = open(task.stdout_path, "wb")  # noqa: SIM115 - closed when the job ends
        stderr = open(task.stderr_path, "wb")  # noqa: SIM115
        node.files = [stdout, stderr]
        node.process = subprocess.Popen(
            ["/bin/bash", "-c", task.command_line],
            cwd=task.work_directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # Ctrl-C reaches hpcjob only; it stops the nodes itself
        )
        node.result.state = State.RUNNING

    def _track(self, nodes: Sequence[_Node]) -> None:
        table = _process_table()
        for node in nodes:
            if node.process is not None:
                node.seen.update(_tree(node.process.pid, table))

    def _stop(self, nodes: Sequence[_Node], progress: Printer) -> None:
        """SIGINT to every process of the running tasks, SIGKILL to what is left after the grace period."""
        self._track(nodes)
        running = [n for n in nodes if n.process is not None and n.process.poll() is None]
        for node in running:
            _signal_node(node, signal.SIGINT)
        deadline = time.monotonic() + self.grace_period_s
        try:
            while time.monotonic() < deadline and any(
                _alive(n.seen) or (n.process is not None and n.process.poll() is None) for n in running
            ):
                time.sleep(0.1)
                self._track(running)
        except KeyboardInterrupt:
            progress("interrupted again: killing now")
        for node in running:
            _signal_node(node, signal.SIGKILL)
            assert node.process is not None
            node.process.wait()
            node.result.exit_code = _exit_code(node.process.returncode)
            node.result.state = State.CANCELED

    def _sweep(self, nodes: Sequence[_Node]) -> None:
        """Kill whatever any task started and is still alive, then reap our own children."""
        self._track(nodes)
        for node in nodes:
            _signal_node(node, signal.SIGKILL)
            if node.process is not None:
                node.process.wait()

    @staticmethod
    def _summary(
        plan: JobPlan, nodes: Sequence[_Node], state: State, failed_first: _Node | None, wall_time: float
    ) -> JobSummary:
        root_cause = read_root_cause(LocalFolder(Path(plan.log_dir)), "") if state is State.FAILED else None
        lines: list[str] = []
        for node in nodes:
            path = Path(node.task.stdout_path)
            if path.is_file():
                lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
        return JobSummary(
            name=plan.name,
            run_id=plan.run_id,
            state=state,
            exit_code=job_exit_code(state, failed_first.result if failed_first else None, root_cause),
            wall_time_s=round(wall_time, 3),
            job_dir=plan.job_dir,
            log_dir=plan.log_dir,
            nodes=[n.result for n in nodes],
            root_cause=root_cause,
            metrics=find_metrics(lines),
        )


def _echo(nodes: Sequence[_Node], progress: Printer, final: bool = False) -> None:
    for node in nodes:
        for tail in node.tails:
            for line in tail.read(final):
                progress(line)


def _exit_code(returncode: int) -> int:
    """As a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) for every process, from /proc (Linux)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def _tree(root: int, table: dict[int, tuple[int, int]]) -> set[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in table:
            found.add((pid, table[pid][1]))
        stack.extend(children.get(pid, []))
    return found


def _alive(seen: set[tuple[int, int]]) -> bool:
    table = _process_table()
    return any(table.get(pid, (0, -1))[1] == start and not _zombie(pid) for pid, start in seen)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :][:1] == b"Z"


def _signal_node(node: _Node, sig: signal.Signals) -> None:
    """Signal every process of the task; without /proc (macOS), at least the task's session."""
    _signal_all(node.seen, sig)
    if node.process is not None and node.process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(node.process.pid, sig)


def _signal_all(seen: set[tuple[int, int]], sig: signal.Signals) -> None:
    table = _process_table()
    for pid, start in seen:
        if table.get(pid, (0, -1))[1] == start:  # still the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
