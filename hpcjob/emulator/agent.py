"""The node agent of the emulated nodes: a task started, watched, stopped and reported as the agent does.

A task runs as the Linux agent runs it (facts/hpcpack-jobs.md section 5): ``cmd.sh`` holds
``#!/bin/bash\\n\\n<CommandLine>``, ``run_dir_in_out.sh`` does ``cd <WorkDirectory or ~> || exit $?`` then
``/bin/bash cmd.sh >stdout 2>stderr [<stdin]``, paths written unquoted as the agent writes them, in a
task folder under ``<work root>/nodes/<NODE>``, as a process of this machine. Before it, the node's
execution filter (OnJobTaskStart.sh, OnTaskStart.sh) may change its environment or fail its start; a
task that names CCP_DOCKER_IMAGE runs in a container as the C++ agent's scripts run it. Its processes
carry a marker variable, the emulator's stand-in for the agent's cgroup: a stop finds every one of them
(SIGINT, SIGKILL after the grace period), and what a finished task leaves running is killed. Output
keeps the first 1500 bytes of each stream that went to the task folder. `clusrun /user:system` runs
here too. The task's states are not the agent's: it reports a task's end to whoever started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hpcjob.backends.local.procs import (
    LOCAL_CPUS_VAR,
    MARKER_VAR,
    TaskProcess,
    Watchdog,
    children_of,
    exit_code,
    marked_processes,
    process_table,
)
from hpcjob.emulator import props as P
from hpcjob.emulator.jobs import Job, Task
from hpcjob.emulator.nodes import NodeRegistry
from hpcjob.node.mount_filter import FILTERS_DIR, NODE_ROOT_VAR

OUTPUT_LIMIT = 1500  # bytes of un-redirected stdout/stderr the agent reports (head -c 1500)
# How long a filter may take before the start is given up: the head node waits 40 s for a task to
# start (then sends the start again, which the emulator does not).
FILTER_TIMEOUT_S = 40


class NodeAgent:
    """What the agent of every node does, for all the nodes: they all run on this machine."""

    def __init__(
        self,
        lock: threading.RLock,
        registry: NodeRegistry,
        *,
        work_root: str,
        grace_period: float,
        base_env: Mapping[str, str],
        head_name: str,
        password_of: Callable[[str], str] | None = None,
    ) -> None:
        """`password_of(owner)`: the job owner's password, which the agent hands to execution filters."""
        self.lock = lock
        self.registry = registry
        self.work_root = work_root
        self.grace_period = grace_period
        self.base_env = dict(base_env)
        self.head_name = head_name
        self.password_of = password_of or (lambda owner: "")
        self.token = secrets.token_hex(6)  # marks this emulator's task processes
        self._runners: list[threading.Thread] = []
        self._watchdog: Watchdog | None = None

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        # If this process is killed (SIGKILL), no task it started outlives it.
        self._watchdog = Watchdog(f"{self.token}-")

    def runners(self) -> list[threading.Thread]:
        """The threads that wait for tasks (the caller holds the lock)."""
        return list(self._runners)

    def wait_for(self, runners: Iterable[threading.Thread]) -> None:
        """Wait for `runners`, then kill by the marker what escaped both tree and marker tracking."""
        for runner in runners:
            runner.join(timeout=15)
        # Anything that escaped both tree and marker tracking up to now, by the marker once more.
        for pid, _ in marked_processes(self.marker_prefix()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()

    def marker_prefix(self) -> bytes:
        return f"{MARKER_VAR}={self.token}-".encode()

    def live_processes(self) -> set[tuple[int, int]]:
        """Every process still alive that a task of this emulator started."""
        return marked_processes(self.marker_prefix())

    # ------------------------------------------------------------------------------------- a node

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

    # ---------------------------------------------------------------------------------- a task run

    def launch(self, job: Job, task: Task, nodes: list[tuple[str, int]]) -> tuple[TaskProcess, str]:
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
        # Each emulated node's own disk, where a job names none, under the name hpcjob's tasks read it by
        # (hpcjob.job.datasets.LOCAL_DIR_VAR; the emulator imports nothing of the client's).
        variables.setdefault("HPCJOB_LOCAL_DIR", os.path.join(node_dir, "local"))
        os.makedirs(os.path.join(node_dir, "local"), exist_ok=True)
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
        env = {**self.node_env(nodes[0][0]), **variables, LOCAL_CPUS_VAR: node_cpus(job, nodes[0][0])}
        if variables.get("CCP_DOCKER_IMAGE"):
            run = container_start(job, task, folder, variables, nodes[0][1])
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

    def follow(
        self, task: Task, process: TaskProcess, folder: str, report: Callable[[Task, int, str], None]
    ) -> None:
        """Wait for a started task in a thread of its own; `report(task, exit code, output)` under the
        lock once none of its processes is left. The caller holds the lock."""
        runner = threading.Thread(
            target=self._wait,
            args=(task, process, folder, report),
            name=f"hpcjob-emulator-task-{task.props['TaskId']}",
            daemon=True,
        )
        self._runners = [r for r in self._runners if r.is_alive()]
        self._runners.append(runner)
        runner.start()

    def _wait(
        self, task: Task, process: TaskProcess, folder: str, report: Callable[[Task, int, str], None]
    ) -> None:
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
        output = read_output(task, folder)
        container = os.path.join(folder, "containerId")
        if os.path.exists(container):  # the agent's CleanupTask.sh: the task's container goes
            with open(container, encoding="utf-8") as f:
                subprocess.run(["docker", "rm", "-f", f.read().strip()], capture_output=True, check=False)
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
        with self.lock:
            report(task, code, output)

    def stop(self, task: Task, process: TaskProcess) -> None:
        """Stop every process of the task in a thread of its own: SIGINT, then SIGKILL after the grace
        period or as soon as `task.kill_now` is set. `task.stop_done` is set once none is left."""
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

    @staticmethod
    def refresh(processes: list[TaskProcess]) -> None:
        """Remember the tasks' descendants while they live (called without the lock): one read of the
        process table and one map of it for all of them, whatever their number."""
        if processes:
            table = process_table()
            children = children_of(table)
            for process in processes:
                process.refresh(table, children)

    # ------------------------------------------------------------------------------------- clusrun

    def run_as_system(self, node: str, command: str) -> tuple[int, str]:
        """`clusrun /user:system` on one node: the command's exit code and its output (stderr into
        stdout, as the agent streams it), run by bash as root."""
        with self.lock:
            known = self.registry.node(node)
            if known.lost is not None:
                return 1, f"The node {known.name} did not answer: it is unreachable."
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


def container_start(job: Job, task: Task, folder: str, variables: Mapping[str, str], cores: int) -> str:
    """A task whose environment names CCP_DOCKER_IMAGE, as the C++ agent runs it: its variables in
    the task folder's `environments` file, `docker run -id` with the options and volumes read back
    from that file and put in unquoted, the owner made in the container, then `docker exec -u OWNER`
    of run_dir_in_out.sh; the container is removed when the task ends (NodeAgent._wait). Nothing of the
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


def read_output(task: Task, folder: str) -> str:
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


def node_cpus(job: Job, node: str) -> str:
    """The CPUs of this machine that `node`'s tasks of `job` run on (HPCJOB_LOCAL_CPUS, which the task's
    first process sets as its affinity): a share of their own, as separate machines' would be. A rank
    sizes its threads by the CPUs it sees, as it should on a real node; with every emulated node on every
    CPU, their idle OpenMP threads spun on each other's cores, and a 2-node job trained 10 times slower
    than `run --local` of the same job. More nodes than CPUs: they take turns."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    names = [name.upper() for name in job.props["AllocatedNodes"].split(",") if name]
    if not cpus or node.upper() not in names:
        return ""
    index = names.index(node.upper())
    if len(names) >= len(cpus):
        return str(cpus[index % len(cpus)])
    each = len(cpus) // len(names)
    return ",".join(str(cpu) for cpu in cpus[index * each : (index + 1) * each])
