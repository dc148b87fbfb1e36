"""A job spec and the chosen nodes become a JobPlan: the HPC Pack job, ready to render. Pure: no I/O.

The shape is fixed by DESIGN.md ("The job it builds"): Node as the unit, exactly the chosen nodes,
exclusive, failing as a whole when one task fails, and one single-node task per node, pinned with
RequiredNodes, all with the same torchrun CommandLine whose rendezvous endpoint is the first node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcjob.spec import PLAIN_PATH, JobSpec, SpecError, check_run_id, parse_node_names
from hpcjob.torchrun import TorchrunCommand, bash_join, bash_quote, command_line


@dataclass(frozen=True)
class TaskPlan:
    """One single-node task: the torchrun agent of one node."""

    name: str
    node: str
    command_line: str
    work_directory: str
    stdout_path: str
    stderr_path: str


@dataclass(frozen=True)
class MountStep:
    """The cluster-run step, run as root on every node before the job: mount the share, idempotently."""

    nodes: tuple[str, ...]
    share_unc: str
    mount_point: str
    command: str


@dataclass(frozen=True)
class JobPlan:
    name: str
    run_id: str
    nodes: tuple[str, ...]
    node_group: str | None
    nproc_per_node: int
    rdzv_endpoint: str
    job_dir: str
    log_dir: str
    command_line: str
    env: tuple[tuple[str, str], ...]
    tasks: tuple[TaskPlan, ...]
    mount: MountStep | None
    command_limit: int
    runtime_s: int | None = None
    priority: str | None = None
    job_template: str | None = None

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node


def make_plan(
    spec: JobSpec,
    nodes: Sequence[str],
    run_id: str,
    *,
    rdzv_host: str | None = None,
    mount_point: str | None = None,
) -> JobPlan:
    """Build the job for `nodes`, in order: the first hosts the rendezvous.

    `rdzv_host` replaces the first node's name in the endpoint where the backend knows better (the
    local backend rendezvous on 127.0.0.1); `mount_point` replaces the spec's (the local backend's
    share is a local folder).
    """
    nodes = parse_node_names(nodes)
    if len(nodes) != spec.node_count:
        raise SpecError(f"{len(nodes)} node(s) chosen for a job of {spec.node_count} node(s)")
    check_run_id(run_id)
    root = (mount_point or spec.mount_point).rstrip("/") or "/"
    job_dir = f"{root.rstrip('/')}/{spec.job_folder}"
    log_dir = f"{job_dir}/logs/{run_id}"
    endpoint = f"{rdzv_host or nodes[0]}:{spec.rdzv_port}"
    line = command_line(
        TorchrunCommand(
            python=spec.python,
            nnodes=len(nodes),
            nproc_per_node=spec.procs_per_node,
            rdzv_endpoint=endpoint,
            rdzv_id=run_id,
            store_node=nodes[0],
            script=spec.script_name,
            script_args=spec.script_args,
            max_restarts=spec.max_restarts,
            rdzv_join_timeout=spec.rdzv_join_timeout,
        )
    )
    if len(line) > spec.command_limit:
        raise SpecError(
            f"the task command line is {len(line)} characters, more than the scheduler's limit of "
            f"{spec.command_limit}: shorten the script arguments (or raise the limit if your cluster "
            "allows more)"
        )
    tasks = tuple(
        TaskPlan(
            name=f"torchrun {node}",
            node=node,
            command_line=line,
            work_directory=job_dir,
            stdout_path=f"{log_dir}/{node}.out",
            stderr_path=f"{log_dir}/{node}.err",
        )
        for node in nodes
    )
    mount = None
    if spec.share is not None:
        mount = MountStep(
            nodes=nodes,
            share_unc=spec.share.unc,
            mount_point=root,
            command=mount_command(spec.share.unc, root, spec.mount_options, log_dir),
        )
        if len(mount.command) > spec.command_limit:
            raise SpecError(
                f"the mount command is {len(mount.command)} characters, more than the scheduler's limit of "
                f"{spec.command_limit}: use a shorter --mount-point or job folder"
            )
    return JobPlan(
        name=spec.name,
        run_id=run_id,
        nodes=nodes,
        node_group=spec.node_group,
        nproc_per_node=spec.procs_per_node,
        rdzv_endpoint=endpoint,
        job_dir=job_dir,
        log_dir=log_dir,
        command_line=line,
        env=spec.env,
        tasks=tasks,
        mount=mount,
        command_limit=spec.command_limit,
        runtime_s=spec.runtime_s,
        priority=spec.priority,
        job_template=spec.job_template,
    )


def mount_command(share_unc: str, mount_point: str, options: str, log_dir: str) -> str:
    """Bash, run as root on each node: mount the share unless mounted, then make this run's log folder.

    The task's stdout/stderr files go to the log folder, and the agent checks that it can write them
    before it starts the task, so the folder must exist first. No password: `options` name a
    credentials file on the node. The mount point is named once, in `$m`, to keep the line short:
    where only REST reaches the cluster it becomes a task's CommandLine, with the same length limit.
    """
    if not PLAIN_PATH.fullmatch(mount_point):
        raise SpecError(f"mount point {mount_point!r} may use only letters, digits and . _ - /")
    mount = bash_join(["mount", "-t", "cifs", share_unc, "MP", "-o", options]).replace(" MP ", " $m ")
    logs = log_dir.removeprefix(mount_point.rstrip("/"))
    # $m unquoted: the path is plain, and the clusrun line carries the command in double quotes.
    return (
        f"m={mount_point}; mkdir -p $m && {{ mountpoint -q $m || {mount}; }} && mkdir -p $m{bash_quote(logs)}"
    )
