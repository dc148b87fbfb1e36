"""A job spec and the chosen nodes become a JobPlan: the HPC Pack job, ready to render. Pure: no I/O.

The shape is fixed by DESIGN.md ("The job it builds"): Node as the unit, exactly the chosen nodes,
exclusive, failing as a whole when one task fails, and one single-node task per node, pinned with
RequiredNodes, all with the same torchrun CommandLine whose rendezvous endpoint is the first node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import PurePosixPath
from typing import Any

from hpcjob.job.datasets import (
    LOCAL_DIR_VAR,
    RESOURCE_DISKS,
    SOURCES_VAR,
    local_dir,
    parse_datasets,
    sources_value,
)
from hpcjob.job.fabric import TOPOLOGY_FOLDER, nccl_env
from hpcjob.job.hangs import beat_interval
from hpcjob.job.layout import (
    ATTEMPT_VAR,
    CHECKPOINT_VAR,
    OUTPUT_VAR,
    RESUME_VAR,
    attempt_id,
    attempt_log_folder,
    checkpoint_folder,
    output_folder,
)
from hpcjob.job.spec import (
    ENVS_NAME,
    PLAIN_PATH,
    TASK_ENV_LIMIT,
    WHEELS_NAME,
    JobSpec,
    SpecError,
    account_name,
    check_run_id,
    parse_node_names,
)
from hpcjob.job.torchrun import (
    NODE_DIR,
    TorchrunCommand,
    bash_join,
    bash_quote,
    command_line,
    data_command_line,
)
from hpcjob.node import mount_filter


@dataclass(frozen=True)
class TaskPlan:
    """One single-node task: the torchrun agent of one node, or a data node's data service. `env`: the
    task's own variables, over the job's."""

    name: str
    node: str
    command_line: str
    work_directory: str
    stdout_path: str
    stderr_path: str
    env: tuple[tuple[str, str], ...] = ()


# Elastic jobs: each rendezvous round's workers get a store of their own. torchrun's default shares one
# TCP store across rounds, so the workers of a restarted round can read the addresses the lost round's
# workers left there, and fail to connect (seen with gloo in torch 2.14).
SEPARATE_ROUND_STORES = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
# PyTorch's NCCL flight recorder, on in every job (a ring of the last collectives per rank, cheap): on a
# collective's timeout each rank writes what it was in to the run's log folder on the share, where
# `hpcjob logs` and a person can read it. Torch 2.9 renamed the settings; 2.14.1's libraries hold both
# names, and nodes may run an older torch: both are set (docs/facts/azure-gpu-fabric-and-nccl.md §5).
FLIGHT_RECORDER_ENTRIES = "2000"
FLIGHT_RECORDER_FILE = "nccl-trace-rank-"  # in the log folder, + the rank
# Seconds between a rank's beats (hpcjob/node/worker.py), set for a job with a --hang-timeout.
BEAT_VAR = "HPCJOB_BEAT_S"
# A job with CPU data nodes (issue 34; docs/data-nodes.md): every task knows the data nodes in order, the
# port their data service listens on, how long a trainer waits for one, and the folder, private to the
# job's owner and not among the logs, where each data node publishes its address and the attempt's keys.
DATA_NODES_VAR = "HPCJOB_DATA_NODES"
DATA_PORT_VAR = "HPCJOB_DATA_PORT"
DATA_WAIT_VAR = "HPCJOB_DATA_WAIT_S"
DATA_DIR_VAR = "HPCJOB_DATA_DIR"
DATA_CLIENTS_VAR = "HPCJOB_DATA_CLIENTS"  # the trainers' world size: the ranks the data nodes serve


# `--secret` (issue 38): the file of the attempt's secrets, NAME=value lines, that the node helper reads
# into the task's environment before torchrun or the data role starts, in the job folder on the share
# (the owner's alone: mode 0600, an owner-only DACL; hpcjob.store.secrets writes and removes it). The job
# names the file, never a value: every cluster user can read a job's environment. A run on this machine
# hands the values on in the tasks' environment instead, and names them in SECRET_NAMES_VAR (a container
# task gets each with `docker run -e NAME`).
SECRETS_VAR = "HPCJOB_SECRETS_FILE"
SECRET_NAMES_VAR = "HPCJOB_SECRET_NAMES"
SECRETS_FOLDER = f"{NODE_DIR}/secrets"


def secrets_file(job_folder: str, run_id: str, attempt: int) -> str:
    """Where attempt `attempt` of a run finds its secrets, relative to the share's root as the job
    folder is: a file of each attempt's own, named by its job (attempt_id)."""
    return f"{job_folder}/{SECRETS_FOLDER}/{attempt_id(run_id, attempt)}.env"


def run_secrets_files(run_id: str, names: Sequence[str]) -> list[str]:
    """Which of `names` (a listing of the job folder's secrets folder) are the run's own: RUN_ID.env and
    RUN_ID.N.env. No other run's: a run id never ends in .NUMBER (hpcjob.job.spec.check_run_id)."""
    own = re.compile(re.escape(run_id) + r"(\.[0-9]+)?\.env")
    return [name for name in names if own.fullmatch(name)]


def secrets_text(values: Mapping[str, str]) -> str:
    """The secrets file: a NAME=value line each, as the node helper reads them (no line break in a
    value: hpcjob.store.secrets refuses one)."""
    return "".join(f"{name}={value}\n" for name, value in values.items())


def secrets_in_environment(plan: JobPlan) -> JobPlan:
    """The plan of a run on this machine: no secrets file; the tasks get the values from the environment
    they inherit, and their names in SECRET_NAMES_VAR."""
    if plan.secrets_file is None:
        return plan
    names = ",".join(plan.secret_names)
    env = tuple((name, value) for name, value in plan.env if name != SECRETS_VAR)
    return dataclasses.replace(plan, env=(*env, (SECRET_NAMES_VAR, names)), secrets_file=None)


def flight_recorder_env(log_dir: str) -> tuple[tuple[str, str], ...]:
    dump = f"{log_dir}/{FLIGHT_RECORDER_FILE}"
    return (
        ("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
        ("TORCH_FR_DUMP_TEMP_FILE", dump),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", dump),
    )


# The job environment variable that asks hpcjob's execution filter (hpcjob/node/mount_filter.py) to
# mount a share on the node before the task starts, with the job owner's credentials.
MOUNT_VAR = "HPCJOB_MOUNT"
# What the filter did, in the task's environment: mounted, already mounted, or "failed: <why>".
MOUNT_RESULT_VAR = "HPCJOB_MOUNT_RESULT"
LOCAL_DISK_RESULT_VAR = mount_filter.LOCAL_DISK_RESULT_VAR  # what it did with the node's local disks
LOCAL_DISKS_SAID = "local disks: "  # how a mount job's task says it, before the mount's own line
# The job's environment (hpcjob/node/env.py): its requirements file in the job folder, and the folder of
# environments: each node's own (spec.node_env_dir), or the share's, beside the job folders (`--env-on`).
REQUIREMENTS_VAR = "HPCJOB_REQUIREMENTS"
ENVS_VAR = "HPCJOB_ENVS"
ENV_ON_VAR = "HPCJOB_ENV_ON"  # node-local or share: env.py checks a node's own folder more strictly
# `--image`: the node agent runs each task in a container of the image when its environment names one.
# What the agent does with these variables, and what it leaves out: docs/facts/hpcpack-linux-agent-docker.md.
DOCKER_IMAGE_VAR = "CCP_DOCKER_IMAGE"
DOCKER_OPTIONS_VAR = "CCP_DOCKER_START_OPTION"  # words put unquoted into `docker run` (section 1)
DOCKER_VOLUMES_VAR = "CCP_DOCKER_VOLUMES"  # comma-separated, each one `-v` (section 1)
DOCKER_NVIDIA_VAR = "CCP_DOCKER_NVIDIA"  # anything but empty or 0: `nvidia-docker run` (section 1)
# "1": no ssh set-up in the container, which the agent does (stopping the host's sshd) when a task's
# CCP_NODES counts more than one node; each hpcjob task has one, and this keeps it so (section 5).
DOCKER_SKIP_SSH_VAR = "CCP_DOCKER_SKIP_SSH_SETUP"
# What multi-node DDP needs of a container, none of which the agent adds (section 2): the host's network
# (c10d and NCCL reach the other nodes; the default bridge network hides them), its IPC namespace (the
# data loaders' shared memory instead of Docker's 64 MB /dev/shm), and no limit on locked memory and a
# large stack (what NVIDIA's PyTorch containers ask for; RDMA pins memory).
CONTAINER_OPTIONS_PHRASES = ("--network=host", "--ipc=host", "--ulimit memlock=-1", "--ulimit stack=67108864")
CONTAINER_OPTIONS = " ".join(CONTAINER_OPTIONS_PHRASES)
# The host's users, read-only. The agent's `useradd -m` in the container would give the job's owner
# another uid than the host's (section 3): not one that may read the share mounted for the host's uid.
# With these, that useradd fails (the agent ignores it) and `docker exec -u OWNER` runs as the host uid.
CONTAINER_USERS = ("/etc/passwd:/etc/passwd:ro", "/etc/group:/etc/group:ro")
# Options that name where pip looks: the nodes look in the share's wheels alone.
_INDEX_OPTION = re.compile(
    r"(-i|--index-url|--extra-index-url|-f|--find-links|--no-index|--trusted-host)(\s|=|$)"
)


def wheel_lock(wheels: Sequence[tuple[str, str]]) -> str:
    """Requirements that name exactly these wheels (file name, SHA-256), each `name==version` with its
    digest: pip's hash-checking mode then installs these files or nothing (another user's replaced wheel,
    or an added higher version, is refused on the node by pip itself). The file name's first two fields
    are the name and version (PEP 427)."""
    pins: dict[str, list[str]] = {}
    for filename, digest in sorted(wheels):
        name, version = filename.split("-")[:2]
        pins.setdefault(f"{name}=={version}", []).append(digest)
    pinned = (
        pin + "".join(f" --hash=sha256:{digest}" for digest in digests) for pin, digests in pins.items()
    )
    return "\n".join(["--require-hashes", *pinned]) + "\n"


def node_requirements(text: str, wheels: str) -> str:
    """The requirements as the nodes install them from the share's wheels: with no index at all."""
    kept = [line for line in text.splitlines() if not _INDEX_OPTION.match(line.strip())]
    return "\n".join(["--no-index", f"--find-links {wheels}", *kept]) + "\n"


def docker_env(spec: JobSpec, root: str) -> tuple[tuple[str, str], ...]:
    """The variables that make the agent run each task in a container of spec.image. Volumes: the
    share's mount point at the same path (the agent runs the work folder and output paths in the container
    and reads them on the host), the host's users (CONTAINER_USERS), /home (the owner's home, which the
    agent made on the host: HOME in the container, and ~/.cache/hpcjob/envs kept between containers),
    and an absolute node_env_dir of the profile's."""
    if spec.image is None:
        return ()
    options = CONTAINER_OPTIONS
    if spec.docker_gpus == "gpus-all":
        options += " --gpus=all"
    if spec.docker_options:
        options += " " + " ".join(spec.docker_options.split())
    volumes = [f"{root}:{root}", *CONTAINER_USERS, "/home:/home"]
    if spec.requirements is not None and spec.env_on == "node-local" and spec.node_env_dir.startswith("/"):
        volumes.append(f"{spec.node_env_dir}:{spec.node_env_dir}")
    if nccl_env(spec.vm_size):  # the size's topology files, which its NCCL settings name
        volumes.append(f"{TOPOLOGY_FOLDER}:{TOPOLOGY_FOLDER}:ro")
    if spec.datasets or spec.local_dir:  # the node's own disk: the datasets' cache, HPCJOB_LOCAL_DIR
        local = local_dir(spec.local_dir, spec.vm_size)
        if local is None and spec.vm_size is not None:  # the resource disk the node finds, below /mnt:
            local = str(PurePosixPath(RESOURCE_DISKS[0]).parent)  # Docker binds what is mounted below too
        if local is not None:
            volumes.append(f"{local}:{local}")
    env = [
        (DOCKER_IMAGE_VAR, spec.image),
        (DOCKER_OPTIONS_VAR, options),
        (DOCKER_VOLUMES_VAR, ",".join(volumes)),
        (DOCKER_SKIP_SSH_VAR, "1"),
    ]
    if spec.docker_gpus == "nvidia-docker":
        env.append((DOCKER_NVIDIA_VAR, "1"))
    return tuple(env)


def container_engine(env: Mapping[str, str]) -> str:
    """The command that starts a task's container: nvidia-docker where CCP_DOCKER_NVIDIA says so."""
    return "nvidia-docker" if env.get(DOCKER_NVIDIA_VAR, "") not in ("", "0") else "docker"


def container_command(
    env: Mapping[str, str],
    command_line: str,
    *,
    name: str,
    env_file: str,
    user: str,
    workdir: str,
    volumes: Sequence[str] = (),
) -> list[str]:
    """`docker run` of one task on this machine (a local run with --image), from the job's CCP_DOCKER_*
    variables read as the node agent reads them (options split on blanks, volumes on commas, nvidia-docker
    for CCP_DOCKER_NVIDIA): the container ends with the task, which runs as `user` in `workdir`, with
    the variables of `env_file` alone, and the secrets SECRET_NAMES_VAR names from docker's own
    environment. `volumes`: more, for this machine."""
    mounts = [*filter(None, env.get(DOCKER_VOLUMES_VAR, "").split(",")), *volumes]
    # `-e NAME` without a value: docker takes it from its own environment, so it is never in a file or on
    # this line (docker/cli @3d41bba opts/env.go ValidateEnv: os.LookupEnv of a bare name).
    secrets = [name for name in env.get(SECRET_NAMES_VAR, "").split(",") if name]
    return [
        container_engine(env),
        "run",
        "--rm",
        *env.get(DOCKER_OPTIONS_VAR, "").split(),
        *(word for mount in mounts for word in ("-v", mount)),
        *(word for name in secrets for word in ("-e", name)),
        *("--name", name, "--env-file", env_file, "-u", user, "-w", workdir, "--entrypoint", "/bin/bash"),
        env[DOCKER_IMAGE_VAR],
        *("-c", command_line),
    ]


def requirements_file(text: str) -> str:
    """Where a job's requirements go in its folder: named by their content, so that a run never reads
    another run's."""
    return f"{NODE_DIR}/requirements-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"


@dataclass(frozen=True)
class MountStep:
    """The share on the nodes. `filter_request` is the HPCJOB_MOUNT value that makes hpcjob's execution
    filter mount it, as root with the job owner's credentials; `command` mounts it by hand (clusrun as
    an administrator, with a credentials file on the node), idempotently."""

    nodes: tuple[str, ...]
    share_unc: str
    mount_point: str
    command: str
    filter_request: str = ""

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return ((MOUNT_VAR, self.filter_request),)


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
    # An elastic job: at least this many nodes go on without the others (None: a gang of all).
    min_nodes: int | None = None
    # Files the job needs in its folder besides the code (path in the job folder, text): its requirements.
    files: tuple[tuple[str, str], ...] = ()
    # Its ranks beat, and whoever follows it ends it when it hangs this long (hpcjob.job.hangs).
    hang_timeout_s: float | None = None
    # Which attempt of the run this job is (1: the first).
    attempt: int = 1
    # The CPU data nodes that feed the trainers (`nodes`), each with a data task of its own.
    data_node_names: tuple[str, ...] = ()
    # `--secret`: the names, and the attempt's secrets file relative to the share's root (secrets_file;
    # None: none, or a run on this machine, whose tasks inherit the values).
    secret_names: tuple[str, ...] = ()
    secrets_file: str | None = None

    @property
    def all_nodes(self) -> tuple[str, ...]:
        """Every node of the job: its trainers, then its data nodes."""
        return (*self.nodes, *self.data_node_names)

    @property
    def job_name(self) -> str:
        """The HPC Pack job's name: the run id, with the attempt for a later attempt (attempt_id)."""
        return attempt_id(self.run_id, self.attempt)

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.nproc_per_node

    @property
    def image(self) -> str | None:
        """The container image the tasks run in, if any."""
        return dict(self.env).get(DOCKER_IMAGE_VAR) or None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobPlan:
        """The plan back from its JSON form (render's plan_json): env as an object, lists for tuples."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        env = data.get("env") or {}
        values["env"] = tuple(env.items()) if isinstance(env, Mapping) else tuple(map(tuple, env))
        values["nodes"] = tuple(data["nodes"])
        # "data_nodes": an older hpcjob's name for them, in the run history
        values["data_node_names"] = tuple(data.get("data_node_names") or data.get("data_nodes") or ())
        values["secret_names"] = tuple(data.get("secret_names") or ())
        values["tasks"] = tuple(
            TaskPlan(**{**task, "env": tuple(map(tuple, task.get("env") or ()))}) for task in data["tasks"]
        )
        values["files"] = tuple(map(tuple, data.get("files") or ()))
        mount = data.get("mount")
        values["mount"] = None if mount is None else MountStep(**{**mount, "nodes": tuple(mount["nodes"])})
        return cls(**values)


def make_plan(
    spec: JobSpec,
    nodes: Sequence[str],
    run_id: str,
    *,
    rdzv_host: str | None = None,
    mount_point: str | None = None,
    attempt: int = 1,
    data_node_names: Sequence[str] = (),
) -> JobPlan:
    """Build the job for `nodes`, in order: the first hosts the rendezvous; `data_node_names` run the
    script's data service for them.

    `rdzv_host` replaces the first node's name in the endpoint where the backend knows better (the
    local backend rendezvous on 127.0.0.1); `mount_point` replaces the spec's (the local backend's
    share is a local folder). `attempt`: which attempt of run `run_id` the job is (its own job name,
    rendezvous id and log folder; the run's checkpoints).
    """
    nodes = parse_node_names(nodes)
    if len(nodes) != spec.node_count:
        raise SpecError(f"{len(nodes)} node(s) chosen for a job of {spec.node_count} node(s)")
    data_node_names = parse_node_names(data_node_names)
    if len(data_node_names) != spec.data_nodes:
        raise SpecError(f"{len(data_node_names)} data node(s) chosen for a job of {spec.data_nodes}")
    if both := {n.upper() for n in nodes} & {n.upper() for n in data_node_names}:
        raise SpecError(f"node {sorted(both)[0]} chosen as both a trainer and a data node")
    check_run_id(run_id)
    if attempt < 1:
        raise SpecError(f"attempt {attempt}: attempts count from 1")
    root = (mount_point or spec.mount_point).rstrip("/") or "/"
    job_dir = f"{root.rstrip('/')}/{spec.job_folder}"
    log_dir = f"{job_dir}/logs/{attempt_log_folder(run_id, attempt)}"
    endpoint = f"{rdzv_host or nodes[0]}:{spec.rdzv_port}"
    torchrun = TorchrunCommand(
        python=spec.python,
        nnodes=len(nodes),
        nproc_per_node=spec.procs_per_node,
        rdzv_endpoint=endpoint,
        rdzv_id=attempt_id(run_id, attempt),
        store_node=nodes[0],
        script=spec.script_name,
        script_args=spec.script_args,
        max_restarts=spec.max_restarts,
        rdzv_join_timeout=spec.rdzv_join_timeout,
        rdzv_last_call=spec.rdzv_last_call,
        rdzv_keep_alive=spec.rdzv_keep_alive,
        min_nnodes=spec.min_nodes if spec.elastic else None,
        environment=spec.requirements is not None,
        log_id=attempt_log_folder(run_id, attempt),
        datasets=bool(spec.datasets),
    )
    line = command_line(torchrun)
    data_line = data_command_line(torchrun)
    if len(line) > spec.command_limit:
        raise SpecError(
            f"the task command line is {len(line)} characters, more than the scheduler's limit of "
            f"{spec.command_limit}: shorten the script arguments (or raise the limit if your cluster "
            "allows more)"
        )
    if data_node_names and len(data_line) > spec.command_limit:
        raise SpecError(
            f"the data task command line is {len(data_line)} characters, more than the scheduler's limit "
            f"of {spec.command_limit}: shorten the script arguments"
        )

    def task(role: str, node: str, command: str, env: tuple[tuple[str, str], ...] = ()) -> TaskPlan:
        """A node's task in the job folder, its output in the attempt's log folder."""
        out = f"{log_dir}/{node}"
        return TaskPlan(f"{role} {node}", node, command, job_dir, f"{out}.out", f"{out}.err", env)

    data_env = _data_task_env(spec, root)
    tasks = (
        *(task("torchrun", node, line) for node in nodes),
        *(task("data", node, data_line, data_env) for node in data_node_names),
    )
    mount = None
    given = {name for name, _ in spec.env}  # the job's own --env wins over the size's and hpcjob's settings
    checkpoints = (CHECKPOINT_VAR, f"{root.rstrip('/')}/{checkpoint_folder(spec.job_folder, run_id)}")
    outputs = (OUTPUT_VAR, f"{root.rstrip('/')}/{output_folder(spec.job_folder, run_id)}")
    defaults = (
        *nccl_env(spec.vm_size),
        *flight_recorder_env(log_dir),
        checkpoints,
        outputs,
        (ATTEMPT_VAR, str(attempt)),
    )
    env = (*((name, value) for name, value in defaults if name not in given), *spec.env)
    if data_node_names:
        data_dir = f"{job_dir}/{NODE_DIR}/data/{attempt_log_folder(run_id, attempt)}"
        env = (
            *env,
            (DATA_NODES_VAR, ",".join(data_node_names)),
            (DATA_PORT_VAR, str(spec.data_port)),
            (DATA_WAIT_VAR, f"{spec.data_wait_s:g}"),
            (DATA_DIR_VAR, data_dir),
            (DATA_CLIENTS_VAR, str(len(nodes) * spec.procs_per_node)),
        )
    if spec.resume_dir is not None:
        if RESUME_VAR in given:
            raise SpecError(f"--resume-from and --env {RESUME_VAR} both say where to start from: give one")
        env = (*env, (RESUME_VAR, spec.resume_dir))
    files: tuple[tuple[str, str], ...] = ()
    if spec.requirements is not None:
        text = spec.requirements
        if spec.wheelhouse is not None:
            text = node_requirements(text, f"{root.rstrip('/')}/{spec.user_folder}/{WHEELS_NAME}")
        files = ((requirements_file(text), text),)
        envs = (
            f"{root.rstrip('/')}/{spec.user_folder}/{ENVS_NAME}"
            if spec.env_on == "share"
            else spec.node_env_dir
        )
        env = (*env, (REQUIREMENTS_VAR, files[0][0]), (ENVS_VAR, envs), (ENV_ON_VAR, spec.env_on))
    env = (*env, *docker_env(spec, root))
    if spec.hang_timeout_s is not None:
        env = (*env, (BEAT_VAR, f"{beat_interval(spec.hang_timeout_s):g}"))
    if spec.elastic and all(name != SEPARATE_ROUND_STORES[0] for name, _ in env):
        env = (*env, SEPARATE_ROUND_STORES)
    secrets = secrets_file(spec.job_folder, run_id, attempt) if spec.secrets else None
    if secrets is not None:
        env = (*env, (SECRETS_VAR, f"{root.rstrip('/')}/{secrets}"))
    env = (*env, *dataset_env(spec, root, len(nodes) + len(data_node_names)))
    if spec.share is not None:
        mount = mount_step(spec.share.unc, root, spec.mount_options, (*nodes, *data_node_names), log_dir)
        if len(mount.command) > spec.command_limit:
            raise SpecError(
                f"the mount command is {len(mount.command)} characters, more than the scheduler's limit of "
                f"{spec.command_limit}: use a shorter --mount-point or job folder"
            )
        env = (*env, *mount.env)  # a node that lost the mount gets it back before the task starts
    check_task_env(env)  # every job's: a long --env value, or many, is refused before submit
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
        env=env,
        tasks=tasks,
        mount=mount,
        command_limit=spec.command_limit,
        runtime_s=spec.runtime_s,
        priority=spec.priority,
        job_template=spec.job_template,
        min_nodes=spec.min_nodes if spec.elastic else None,
        files=files,
        hang_timeout_s=spec.hang_timeout_s,
        attempt=attempt,
        data_node_names=data_node_names,
        secret_names=spec.secrets,
        secrets_file=secrets,
    )


def dataset_env(spec: JobSpec, root: str, tasks: int) -> tuple[tuple[str, str], ...]:
    """A job with datasets: one variable says what each of its `tasks` copies (hpcjob.job.datasets), and
    the nodes' local folder where it is known. The job's whole environment then fits HPC Pack's limit a
    task, whatever the number of sources or files."""
    given = {name for name, _ in spec.env}
    if not spec.datasets:
        return ((LOCAL_DIR_VAR, spec.local_dir),) if spec.local_dir and LOCAL_DIR_VAR not in given else ()
    cache_bytes = spec.dataset_cache_gb * 10**9 if spec.dataset_cache_gb else None
    value = sources_value(parse_datasets(spec.datasets), root, tasks, spec.dataset_timeout_s, cache_bytes)
    env: tuple[tuple[str, str], ...] = ((SOURCES_VAR, value),)
    local = local_dir(spec.local_dir, spec.vm_size)
    if local is not None and LOCAL_DIR_VAR not in given:
        env = (*env, (LOCAL_DIR_VAR, local))
    return env


def check_task_env(env: Sequence[tuple[str, str]]) -> None:
    """A task's whole environment within HPC Pack's TASK_ENV_LIMIT characters."""
    total = sum(len(name) + len(value) + 2 for name, value in env)
    if total > TASK_ENV_LIMIT:
        raise SpecError(
            f"the job's environment is {total} characters, more than HPC Pack's {TASK_ENV_LIMIT} a task: "
            "fewer or shorter --dataset sources or --env variables"
        )


def _data_task_env(spec: JobSpec, root: str) -> tuple[tuple[str, str], ...]:
    """A data task's own variables: in a container, the job's options without its GPUs (a CPU node has
    none to give, and `--gpus=all` would fail there). The task's variables over the job's: UNVERIFIED on
    a real cluster that the agent reads its CCP_DOCKER_* from the task's (docs/data-nodes.md)."""
    job = dict(docker_env(spec, root))
    if DOCKER_OPTIONS_VAR not in job:
        return ()
    options = " ".join(word for word in job[DOCKER_OPTIONS_VAR].split() if word != "--gpus=all")
    return ((DOCKER_OPTIONS_VAR, options), (DOCKER_NVIDIA_VAR, "0"))


def mount_job_name(run_id: str) -> str:
    """The name of a run's mount job: the run id names its jobs, so that each can be found again."""
    return f"{run_id}-mount"


def mount_step(
    share_unc: str, mount_point: str, options: str, nodes: Sequence[str], log_dir: str | None = None
) -> MountStep:
    """The share at `mount_point` on `nodes`; `log_dir`: a run's log folder, made once mounted. The
    filter's request names the share and the mount point only: the options are the administrator's."""
    return MountStep(
        nodes=tuple(nodes),
        share_unc=share_unc,
        mount_point=mount_point,
        command=mount_command(share_unc, mount_point, options, log_dir),
        filter_request=f"{share_unc}|{mount_point}",
    )


@dataclass(frozen=True)
class AllowedShare:
    """A share the administrator lets jobs mount through hpcjob's execution filter: each job owner gets
    it at `<mount_root>/<name>` with `options` (and the filter's own: nosuid, nodev, theirs alone)."""

    unc: str
    mount_root: str
    options: str

    @classmethod
    def checked(cls, unc: str, mount_root: str, options: str) -> AllowedShare:
        """The entry, if the filter on the nodes would take it (the same check, from the same code)."""
        entry = cls(unc, mount_root.rstrip("/") or "/", options)
        try:
            mount_filter.check_entry(dataclasses.asdict(entry))
        except ValueError as err:
            raise SpecError(f"hpcjob's execution filter would refuse this share: {err}") from None
        return entry


@dataclass(frozen=True)
class ContainerPolicy:
    """What an administrator lets jobs run in containers on the nodes, applied by hpcjob's execution filter
    to every task start that names an image (any job's, hpcjob's or not): images by prefix, the
    `docker run` options (phrases of one or more words: `--ulimit memlock=-1`) and the volumes (host
    folders, mounted at the same path; `PATH:ro` read-only only)."""

    images: tuple[str, ...]
    options: tuple[str, ...]
    volumes: tuple[str, ...]

    @classmethod
    def checked(
        cls, images: Sequence[str], options: Sequence[str], volumes: Sequence[str], mount_roots: Sequence[str]
    ) -> ContainerPolicy:
        """The policy, with hpcjob's own container options and volumes where none are named (the mount
        roots, the host's users read-only, /home, the topology files), if the filter would take it."""
        defaults = (*CONTAINER_OPTIONS_PHRASES, "--gpus=all")
        own = (*mount_roots, *(v.split(":", 1)[0] + ":ro" for v in CONTAINER_USERS), "/home")
        policy = cls(
            tuple(images),
            tuple(" ".join(o.split()) for o in options) or defaults,
            tuple(volumes) or (*own, f"{TOPOLOGY_FOLDER}:ro"),
        )
        try:
            mount_filter.check_policy(
                {
                    "images": list(policy.images),
                    "options": list(policy.options),
                    "volumes": list(policy.volumes),
                }
            )
        except ValueError as err:
            raise SpecError(f"hpcjob's execution filter would refuse this container policy: {err}") from None
        return policy


def user_mount_point(mount_root: str, owner: str) -> str:
    """Where hpcjob's execution filter mounts the share for the job owner `owner` (DOMAIN\\name): a
    folder of their own under the administrator's mount root, so each user reaches the share with their
    own SMB identity (hpcjob/node/mount_filter.py applies the same rule on the node)."""
    return f"{mount_root.rstrip('/')}/{account_name(owner)}"


def mount_command(share_unc: str, mount_point: str, options: str, log_dir: str | None = None) -> str:
    """Bash, run as root on each node: mount the share unless mounted, then make this run's log folder.

    The task's stdout/stderr files go to the log folder, and the agent checks that it can write them
    before it starts the task, so the folder must exist first. No password: `options` name a
    credentials file on the node. The mount point is named once, in `$m`, to keep the line short:
    where only REST reaches the cluster it becomes a task's CommandLine, with the same length limit.
    """
    if not PLAIN_PATH.fullmatch(mount_point):
        raise SpecError(f"mount point {mount_point!r} may use only letters, digits and . _ - /")
    mount = bash_join(["mount", "-t", "cifs", share_unc, "MP", "-o", options]).replace(" MP ", " $m ")
    # $m unquoted: the path is plain, and the clusrun line carries the command in double quotes.
    command = f"m={mount_point}; mkdir -p $m && {{ mountpoint -q $m || {mount}; }}"
    if log_dir is None:
        return command
    return f"{command} && mkdir -p $m{bash_quote(log_dir.removeprefix(mount_point.rstrip('/')))}"
