"""What the user asks for: a distributed training job, validated. Pure: no I/O.

A `JobSpec` is built from what the CLI (or a cluster profile) collected. Every check that can be
made without touching the network or the disk happens here, so that bad input fails before anything
is started, with one line that names the problem (`SpecError`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from hpcjob.job.hangs import MAX_HANG_TIMEOUT_S, MIN_HANG_TIMEOUT_S

# HPC Pack 2008 SDK: "CommandLine is limited to 480 Unicode characters"; unverified for 2016/2019,
# hence configurable (facts/hpcpack-jobs.md section 1).
DEFAULT_COMMAND_LIMIT = 480
# The total length of one task's environment variables (facts/hpcpack-jobs.md section 1).
TASK_ENV_LIMIT = 2048
DEFAULT_MOUNT_POINT = "/app"
DEFAULT_RDZV_PORT = 29400
# CPU data nodes (issue 34): the port each one's data service listens on, and how long a trainer waits
# for a data node that has not come up before it fails.
DEFAULT_DATA_PORT = 29600
DEFAULT_DATA_WAIT_S = 300.0
MAX_DATA_WAIT_S = 24 * 3600.0
MIN_DATASET_TIMEOUT_S, MAX_DATASET_TIMEOUT_S = 10.0, 7 * 86400.0
# Where a job's environment lives (`--env-on`). Node-local by default: importing torch and torchvision from
# the share took 10.5 s against 2.4 s from local disk (medians, benchmarks/bench_env.py, a real smbd), on
# every rank of every job; a node builds its own environment once, at the same time as the other nodes.
ENV_PLACES = ("node-local", "share")
DEFAULT_ENV_ON = ENV_PLACES[0]
# Each node's own folder of environments: the job owner's home, which the node agent makes (`useradd -m`,
# and `sudo -H` sets HOME for the task: Azure/hpcpack-linux-agent @f50e911 nodemanager/utils/System.cpp
# L485, nodemanager/scripts/StartTask.sh L42-49). env.py expands `~` on the node.
DEFAULT_NODE_ENV_DIR = "~/.cache/hpcjob/envs"
_NODE_ENV_DIR = re.compile(r"(~|/[A-Za-z0-9._-]+)(/[A-Za-z0-9._-]+)*")
# Never an environments' folder: with --image it becomes a volume over the image's own.
_SYSTEM_FOLDERS = re.compile(
    r"/(usr|etc|bin|sbin|lib\w*|proc|sys|dev|boot)(/.*)?|/(opt|var|run|root|home|tmp|mnt|srv)?"
)
# How a task's container gets the node's GPUs: `--gpus all` (the NVIDIA container toolkit, which the
# Azure HPC images install: Azure/azhpc-images @8e9d055 components/install_nvidia_container_toolkit.sh),
# or CCP_DOCKER_NVIDIA, with which the agent runs the container with the older `nvidia-docker` command
# (docs/facts/hpcpack-linux-agent-docker.md section 2).
DOCKER_GPUS = ("gpus-all", "nvidia-docker", "none")  # none: nodes without GPUs
DEFAULT_DOCKER_GPUS = DOCKER_GPUS[0]
_DOCKER_WORD = re.compile(r"[A-Za-z0-9._=:/,+@-]+")

# How a run goes on (hpcjob.job.attempts): --retry-on causes outside the program (the default), or any
# failure; --retries at most MAX_RETRIES (more is a loop, not a plan). Here, so that the command line
# defines its options without importing the attempts' rules.
RETRY_ON = ("outside", "any")
MAX_RETRIES = 100

# Beyond any cluster; they keep a typo (a huge -n) from reaching the scheduler, or a local run.
MAX_NODES = 10_000
MAX_PROCS_PER_NODE = 1024
# Credentials come from a root-only file on each node, never from the mount command line.
DEFAULT_MOUNT_OPTIONS = "vers=3.0,credentials=/etc/hpcjob/smb-credentials,dir_mode=0777,file_mode=0777"
# What hpcjob's execution filter mounts with unless the administrator says otherwise at install time
# (it adds nosuid, nodev and the owner's uid, gid and 0700 itself).
FILTER_MOUNT_OPTIONS = "vers=3.0"
# The backends that reach a cluster, as a cluster profile names them (hpcjob.backends.BACKENDS has them).
CLUSTER_BACKENDS = ("rest", "winrm")
# How WinRM may authenticate (pywinrm's transports that a head node accepts).
WINRM_TRANSPORTS = ("ntlm", "kerberos", "credssp", "basic")
# The scheduler's priority names (facts/hpcpack-jobs.md section 1), lowest first.
PRIORITIES = ("Lowest", "BelowNormal", "Normal", "AboveNormal", "Highest")

# A host-name label: HPC Pack node names are short computer names, never FQDNs.
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,57}")
# The run id names the HPC Pack job, whose name may be 80 characters long, and its mount job
# (`<run id>-mount`): 74 characters at most.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,73}")
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_PART = re.compile(r"[A-Za-z0-9._-]+")
# A path that bash and cmd.exe take as it is, unquoted (the mount step needs one).
PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_SHARE_PART = re.compile(r"[A-Za-z0-9._$-]+")
_MOUNT_OPTIONS = re.compile(r"[A-Za-z0-9_]+(=[A-Za-z0-9._/:-]*)?(,[A-Za-z0-9_]+(=[A-Za-z0-9._/:-]*)?)*")
# Characters an XML 1.0 job file cannot carry, even escaped.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# Names that hold a secret's usual words (issue 38: connection strings, database URLs, SAS tokens and
# passwords; a whole word SAS, so SASL_MECHANISM passes).
_SECRET_NAME = re.compile(
    r"PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|CONNECTION_?STRING"
    r"|DATABASE_URL|(?:^|_)SAS(?:_|$)|_PASS$",
    re.I,
)


class HpcjobError(Exception):
    """An error to report as one line, without a traceback."""


class SpecError(HpcjobError, ValueError):
    """Bad input. The message is one line that names the problem."""


class NotEnoughNodes(SpecError):
    """Fewer usable nodes than the job needs: a next attempt waits for them (--node-wait)."""


@dataclass(frozen=True)
class Share:
    """An SMB share folder on the head node, such as //HEADNODE/CcpSpoolDir/app."""

    host: str
    name: str
    folder: tuple[str, ...] = ()

    @property
    def unc(self) -> str:
        """The form mount.cifs takes: forward slashes."""
        return "//" + "/".join((self.host, self.name, *self.folder))

    @property
    def windows_unc(self) -> str:
        return "\\\\" + "\\".join((self.host, self.name, *self.folder))


def parse_share(text: str) -> Share:
    """Parse `//HOST/SHARE[/folder...]` or `\\\\HOST\\SHARE[\\folder...]`."""
    if "@" in text:  # user[:password]@host: refused without showing it
        raise SpecError(
            "share must not name a user or password (user@host): the SMB user comes from --smb-user, "
            "the password from the environment or a prompt"
        )
    if not (text.startswith("//") or text.startswith("\\\\")):
        raise SpecError(f"share {text!r} must look like //HEADNODE/CcpSpoolDir[/folder]")
    parts = [p for p in re.split(r"[/\\]", text[2:]) if p]
    if len(parts) < 2:
        raise SpecError(f"share {text!r} must name a host and a share: //HEADNODE/CcpSpoolDir[/folder]")
    for part in parts:
        if not _SHARE_PART.fullmatch(part) or part in (".", ".."):
            raise SpecError(f"share {text!r}: {part!r} may use only letters, digits and . _ $ -")
    return Share(host=parts[0], name=parts[1], folder=tuple(parts[2:]))


def parse_env(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Parse repeated `K=V` options, keeping their order; a later K replaces an earlier one."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SpecError(f"--env {item!r} must be NAME=VALUE")
        env[name] = value
    return tuple(env.items())


def check_mount(mount_point: str, options: str) -> None:
    """A mount point on the nodes and mount.cifs options, as every mount of the share needs them."""
    if not PLAIN_PATH.fullmatch(mount_point):
        raise SpecError(
            f"--mount-point {mount_point!r} must be an absolute path on the nodes, of letters, digits and "
            ". _ - /"
        )
    # First, and without the value: an error message must not show a password to the screen.
    if re.search(r"(^|,)\s*(password|pass|password2)\s*=", options, re.I):
        raise SpecError("--mount-options must not hold a password: use credentials=FILE on the nodes")
    if not _MOUNT_OPTIONS.fullmatch(options):
        raise SpecError(f"--mount-options {options!r} must be a comma-separated option list")


# A line that names a job's nodes names this many at most, then says how many there are.
NODES_NAMED = 8


def nodes_said(nodes: Sequence[str]) -> str:
    """The nodes for a line of progress: all of a few, the first and the last of many (a line that named
    each of 1,000 nodes was 10 KB: issue 42)."""
    if len(nodes) <= NODES_NAMED:
        return ", ".join(nodes)
    return f"{', '.join(nodes[: NODES_NAMED - 1])}, ..., {nodes[-1]} ({len(nodes):,} nodes)"


def parse_node_names(names: Iterable[str]) -> tuple[str, ...]:
    """Validate HPC Pack node names: short names, no domain, no duplicates (names ignore case)."""
    seen: dict[str, str] = {}
    for name in names:
        if "." in name:
            raise SpecError(f"node {name!r}: give the HPC Pack node name without a domain")
        if name.isdigit():  # no node can be named so (a domain member's name is never all digits:
            # Microsoft KB 909264, "Naming conventions in Active Directory for computers"): a count was meant
            raise SpecError(
                f"node {name!r} is a number, not a node's name: a count of nodes is -n {name} (of data "
                f"nodes, --data-nodes {name})"
            )
        if not _NODE_NAME.fullmatch(name):
            raise SpecError(f"node {name!r} is not a valid node name (letters, digits and -, at most 63)")
        key = name.upper()
        if key in seen:
            raise SpecError(f"node {name!r} is named twice (as {seen[key]!r}); node names ignore case")
        seen[key] = name
    return tuple(names)


_TAG_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_tags(items: Iterable[str]) -> dict[str, str]:
    """`--tag key=value` items: keys plain (letters, digits, _.-), values printable, at most 256 characters;
    a key given twice keeps its last value."""
    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _TAG_KEY.fullmatch(key):
            raise SpecError(f"--tag {item!r} must be KEY=VALUE, the key of letters, digits, '_', '.' or '-'")
        if len(value) > 256 or not value.isprintable():
            raise SpecError(f"--tag {key}: the value must be printable and at most 256 characters")
        tags[key] = value
    return tags


def parse_duration(text: str, option: str = "--runtime") -> int:
    """A run-time limit in seconds: `90m`, `12h`, `1d12h30m`, `45s`, or the scheduler's own
    `[[DD:]HH:]MM` form (`job submit /runtime:`); `option` names it in errors."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    compact = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip().lower())
    if compact and any(compact.groups()):
        seconds = sum(
            int(value) * units[unit] for value, unit in zip(compact.groups(), "dhms", strict=True) if value
        )
    elif re.fullmatch(r"\d+(:\d+){0,2}", text.strip()):
        fields = [int(part) for part in text.strip().split(":")]
        units_of_fields = (60, 3600, 86400)[: len(fields)]  # MM, HH:MM, DD:HH:MM
        seconds = sum(value * unit for value, unit in zip(reversed(fields), units_of_fields, strict=True))
    else:
        raise SpecError(f"{option} {text!r} must be a duration such as 90m, 12h, 1d12h or DD:HH:MM")
    if not 1 <= seconds <= 2**31 - 1:
        raise SpecError(f"{option} {text!r} must be at least a second and less than 68 years")
    return seconds


def parse_hang_timeout(text: str) -> int:
    """--hang-timeout in seconds: a bare number is seconds, else a duration as --runtime takes it (10m)."""
    text = text.strip()
    return int(text) if text.isdigit() else parse_duration(text, "--hang-timeout")


SHARE_FOLDER = "hpcjob"  # hpcjob's folder on the share
ENVS_NAME, WHEELS_NAME = "envs", "wheels"  # in a user's folder: the environments and the wheels


def account_name(owner: str) -> str:
    """The cluster user's account on the nodes, as the node agent and hpcjob's filter take it
    (DOMAIN\\name is name): their mount point's last folder and their folder on the share."""
    from hpcjob.node.mount_filter import user_name  # when it runs: the command line starts without it

    name = user_name(owner)
    if not name:
        raise SpecError(f"user {owner!r} has no name a node can take (letters, digits, . _ -)")
    return name


def share_user_folder(owner: str | None) -> str:
    """The cluster user's own folder on the share, `hpcjob/<account>`, which holds their job folders,
    wheels and environments: a folder of their own, so that nobody else's code or packages run in their
    jobs. No owner: `hpcjob`, the layout of a share of one user's own (a local run's)."""
    return SHARE_FOLDER if owner is None else f"{SHARE_FOLDER}/{account_name(owner)}"


def check_job_folder(job_folder: str) -> str:
    """A folder below the share's root: a relative path of plain names, never `..`."""
    parts = job_folder.split("/")
    if any(not _PATH_PART.fullmatch(p) or p in (".", "..") for p in parts):
        raise SpecError(f"job folder {job_folder!r} must be a relative path of plain names")
    return job_folder


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise SpecError(f"run id {run_id!r} may use only letters, digits and . _ - (at most 74)")
    if re.search(r"\.[0-9]+$", run_id):  # RUN.N names attempt N's job (hpcjob.job.layout.attempt_id)
        raise SpecError(f"run id {run_id!r} may not end in .NUMBER: that names a later attempt's job")
    return run_id


@dataclass(frozen=True)
class JobSpec:
    """A distributed training job as the user asked for it.

    `script` is the training script's path on the client; its folder is what goes to the share, and
    the nodes run it from the job folder `<mount_point>/<job_folder>/`.
    """

    script: str
    script_args: tuple[str, ...] = ()
    name: str = ""
    nodes: int | None = None
    node_names: tuple[str, ...] = ()
    node_group: str | None = None
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    share: Share | None = None
    mount_point: str = DEFAULT_MOUNT_POINT
    mount_options: str = DEFAULT_MOUNT_OPTIONS
    job_folder: str = ""
    # The cluster user the job is for (DOMAIN\\name, as the profile names them): their folder on the share
    # (share_user_folder) holds the job folder. None: a share of this machine's user alone.
    owner: str | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    rdzv_join_timeout: int | None = None
    # Elastic: how long the rendezvous waits for more nodes once it has the minimum (torchrun's 30 s).
    rdzv_last_call: int | None = None
    # Seconds between the torchrun agents' heartbeats to the rendezvous: a node that stops beating is
    # dropped after three (torchrun's 5 s: 15 s), and the others re-form without it sooner.
    rdzv_keep_alive: int | None = None
    max_restarts: int = 0
    # An elastic job: it goes on while at least this many of its nodes remain (None: all of them).
    min_nodes: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    python: str = "python3"
    command_limit: int = DEFAULT_COMMAND_LIMIT
    runtime_s: int | None = None  # the job's run-time limit; None: the scheduler's (or template's)
    # Whoever follows the job ends it when no collective has moved on for this long while a rank waits
    # in one, naming the rank that held the others up (hpcjob.job.hangs); None: no watch, no beats.
    hang_timeout_s: float | None = None
    priority: str | None = None
    job_template: str | None = None
    exclude_nodes: tuple[str, ...] = ()  # never chosen for the job
    # The text of a pip requirements file: the job's own packages, in an environment built once per
    # content on the share (hpcjob/node/env.py); None: the nodes' Python as it is.
    requirements: str | None = None
    # A cluster without internet: the requirements' wheels for the nodes' (Python X.Y, platform tag),
    # downloaded on the client and installed on the nodes from the share (hpcjob/store/wheelhouse.py).
    wheelhouse: tuple[str, str] | None = None
    # Where the nodes keep the environment (ENV_PLACES): each on its local disk (node_env_dir, kept
    # between jobs), or one on the share for all of them.
    env_on: str = DEFAULT_ENV_ON
    node_env_dir: str = DEFAULT_NODE_ENV_DIR
    # A container image every task runs in, through the node agent's Docker support (hpcjob.job.plan's
    # docker_env); how its GPUs reach it (DOCKER_GPUS), and more `docker run` options from the profile.
    image: str | None = None
    docker_gpus: str = DEFAULT_DOCKER_GPUS
    docker_options: str = ""
    # The nodes' Azure VM size: the job gets the NCCL settings Azure's HPC images use for it
    # (hpcjob.job.fabric), unless its --env names them.
    vm_size: str | None = None
    # An earlier run's checkpoint folder on the nodes, to start from (`--resume-from RUN`, which
    # hpcjob.runner.resume finds in the run history): HPCJOB_RESUME_FROM in the tasks' environment.
    resume_dir: str | None = None
    # CPU data nodes that feed the trainers (issue 34): this many, chosen from data_node_group, or these
    # named ones; never trainers. Their data service listens on data_port; a trainer waits data_wait_s at
    # most for one to come up.
    data_nodes: int = 0
    data_node_names: tuple[str, ...] = ()
    data_node_group: str | None = None
    data_port: int = DEFAULT_DATA_PORT
    data_wait_s: float = DEFAULT_DATA_WAIT_S
    # Environment variables whose values reach the tasks without being written where others read
    # (`--secret NAME`; issue 38): the client's own values, in an owner-only file of the attempt's that
    # the node helper reads (hpcjob.job.plan.secrets_file). Names only: never a value.
    secrets: tuple[str, ...] = ()
    # Datasets each task copies onto its node's own disk before the program starts (`--dataset`; issue
    # 41; hpcjob.job.datasets), waiting at most dataset_timeout_s for the slowest node; local_dir: the
    # nodes' local folder for them (HPCJOB_LOCAL_DIR; None: by the VM size, or as the node finds it);
    # dataset_cache_gb: what a user's cache on a node keeps at most (None: all it can hold).
    datasets: tuple[str, ...] = ()
    dataset_timeout_s: float = 3600.0
    local_dir: str | None = None
    dataset_cache_gb: int | None = None

    def __post_init__(self) -> None:
        name = self.name or PurePosixPath(self.script_name).stem
        object.__setattr__(self, "name", name)
        if not self.job_folder:
            object.__setattr__(self, "job_folder", f"{self.user_folder}/{name}")
        if self.nproc_per_node is None:
            object.__setattr__(self, "nproc_per_node", self.gpus_per_node or 1)
        if self.nodes is None and self.node_names:
            object.__setattr__(self, "nodes", len(self.node_names))
        if not self.data_nodes and self.data_node_names:
            object.__setattr__(self, "data_nodes", len(self.data_node_names))
        self._validate()

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON takes it (lists for tuples, the share as a table): what a follower needs to
        plan a run's next attempt, kept in the run history (from_dict reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec back from to_dict's form (through JSON, too), checked as any spec is: keys of a newer
        hpcjob are left out; a value of the wrong shape is a SpecError."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        try:
            for key in _SPEC_TUPLES:
                if values.get(key) is not None:
                    values[key] = tuple(str(item) for item in values[key])
            values["env"] = tuple((str(name), str(value)) for name, value in values.get("env") or ())
            if values.get("wheelhouse") is not None:
                python, platform = values["wheelhouse"]
                values["wheelhouse"] = (str(python), str(platform))
            share = values.get("share")
            if share is not None:
                folder = tuple(str(part) for part in share["folder"])
                values["share"] = Share(str(share["host"]), str(share["name"]), folder)
            return cls(**values)
        except (TypeError, ValueError, KeyError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"a recorded job that cannot be read: {exc}") from None

    @property
    def user_folder(self) -> str:
        """The owner's folder on the share (share_user_folder)."""
        return share_user_folder(self.owner)

    @property
    def script_name(self) -> str:
        """The script's file name: where it lies in the job folder on the share."""
        return PureWindowsPath(self.script).name if "\\" in self.script else PurePosixPath(self.script).name

    @property
    def node_count(self) -> int:
        return self.nodes or 1

    @property
    def elastic(self) -> bool:
        """Whether the job outlives the loss of a node (fewer nodes than it has may go on)."""
        return self.min_nodes is not None and self.min_nodes < self.node_count

    @property
    def procs_per_node(self) -> int:
        assert self.nproc_per_node is not None  # set in __post_init__
        return self.nproc_per_node

    def _validate(self) -> None:
        if not self.script_name or not self.script_name.endswith(".py"):
            raise SpecError(f"script {self.script!r} must be a Python file (*.py)")
        if not _PATH_PART.fullmatch(self.script_name):
            raise SpecError(f"script name {self.script_name!r} may use only letters, digits and . _ -")
        for arg in self.script_args:
            if NOT_XML.search(arg):
                raise SpecError(f"script argument {arg!r} holds a control character a job file cannot carry")
        if not _JOB_NAME.fullmatch(self.name):
            raise SpecError(f"job name {self.name!r} may use only letters, digits and . _ - (at most 58)")
        _positive("--nodes", self.nodes, MAX_NODES)
        _positive("--nproc-per-node", self.nproc_per_node, MAX_PROCS_PER_NODE)
        _positive("--gpus-per-node", self.gpus_per_node, MAX_PROCS_PER_NODE)
        if self.gpus_per_node is not None and self.procs_per_node > self.gpus_per_node:
            raise SpecError(
                f"--nproc-per-node {self.nproc_per_node} is more than the {self.gpus_per_node} GPUs "
                "per node: run one process per GPU"
            )
        parse_node_names(self.node_names)
        if self.node_names and self.nodes is not None and len(self.node_names) != self.nodes:
            fewer = "fewer" if len(self.node_names) < self.nodes else "more"
            raise SpecError(
                f"{len(self.node_names)} node(s) named with --node, {fewer} than the {self.nodes} asked "
                "for with --nodes"
            )
        if self.node_group is not None and not GROUP_NAME.fullmatch(self.node_group):
            raise SpecError(f"node group {self.node_group!r} is not a valid group name")
        excluded = {name.upper() for name in parse_node_names(self.exclude_nodes)}
        both = [name for name in self.node_names if name.upper() in excluded]
        if both:
            raise SpecError(f"node {both[0]!r} is both named with --node and excluded with --exclude-node")
        self._validate_data_nodes(excluded)
        _positive("--runtime", self.runtime_s)
        if self.priority is not None and self.priority not in PRIORITIES:
            raise SpecError(f"--priority {self.priority!r} must be one of {', '.join(PRIORITIES)}")
        if self.job_template is not None and not GROUP_NAME.fullmatch(self.job_template):
            raise SpecError(f"--job-template {self.job_template!r} is not a valid template name")
        check_mount(self.mount_point, self.mount_options)
        check_job_folder(self.job_folder)
        user_folder = self.user_folder
        if self.owner is not None and not self.job_folder.startswith(user_folder + "/"):
            raise SpecError(
                f"job folder {self.job_folder} is not in {user_folder}/, your own folder on the share: "
                "nobody else's code may run in your jobs"
            )
        for kept in (ENVS_NAME, WHEELS_NAME):
            if f"{self.job_folder}/".startswith(f"{user_folder}/{kept}/"):
                raise SpecError(
                    f"job folder {self.job_folder} is where your jobs' {kept} live: choose another --name "
                    "or --job-folder"
                )
        if not 1 <= self.rdzv_port <= 65535:
            raise SpecError(f"--rdzv-port {self.rdzv_port} must be between 1 and 65535")
        _positive("--rdzv-timeout", self.rdzv_join_timeout)
        _positive("--rdzv-last-call", self.rdzv_last_call)
        _positive("--rdzv-keep-alive", self.rdzv_keep_alive)
        if self.max_restarts < 0:
            raise SpecError(f"--max-restarts {self.max_restarts} must not be negative")
        if self.min_nodes is not None:
            if not 1 <= self.min_nodes <= self.node_count:
                raise SpecError(
                    f"--min-nodes {self.min_nodes} must be between 1 and the job's {self.node_count} nodes"
                )
            if self.elastic and self.max_restarts < 1:
                raise SpecError(
                    "--min-nodes: an elastic job re-forms after a lost node by restarting its workers; "
                    "give --max-restarts 1 or more"
                )
        if self.hang_timeout_s is not None:
            if not MIN_HANG_TIMEOUT_S <= self.hang_timeout_s <= MAX_HANG_TIMEOUT_S:
                raise SpecError(
                    f"--hang-timeout {self.hang_timeout_s:g} must be between {MIN_HANG_TIMEOUT_S:g} seconds "
                    f"and {MAX_HANG_TIMEOUT_S // 3600:g} hours"
                )
            if self.elastic:
                raise SpecError(
                    "--hang-timeout does not go with --min-nodes: an elastic job's ranks change with each "
                    "round, and a lost node's would look hung"
                )
        if not re.fullmatch(r"[A-Za-z0-9._/+-]+", self.python):
            raise SpecError(f"--python {self.python!r} must be a program name or path without spaces")
        _positive("command length limit", self.command_limit)
        self._validate_env()
        check_secret_names(self.secrets, {name for name, _ in self.env})
        self._validate_datasets()
        if self.requirements is not None:
            check_requirements(self.requirements)
        if self.wheelhouse is not None:
            python, platform = self.wheelhouse
            if self.requirements is None:
                raise SpecError("--wheelhouse needs requirements: --requirements FILE, or requirements.txt")
            if not re.fullmatch(r"3\.\d{1,2}", python) or not re.fullmatch(r"[a-z][a-z0-9_]{2,60}", platform):
                raise SpecError(
                    f"--wheelhouse {python}:{platform} must be the nodes' Python and, optionally, their "
                    "platform tag: 3.10, or 3.10:manylinux2014_x86_64"
                )
        check_env_place(self.env_on, self.node_env_dir)
        check_docker(self.image, self.docker_gpus, self.docker_options)
        check_vm_size(self.vm_size)
        if self.resume_dir is not None and (
            not self.resume_dir.startswith("/")
            or "/../" in f"{self.resume_dir}/"
            or NOT_XML.search(self.resume_dir)
        ):
            raise SpecError(f"--resume-from: {self.resume_dir!r} is not an absolute folder on the nodes")

    def _validate_datasets(self) -> None:
        """The numbers; the sources themselves are read where the plan says them (hpcjob.job.datasets,
        which reads with this module's SpecError)."""
        if not MIN_DATASET_TIMEOUT_S <= self.dataset_timeout_s <= MAX_DATASET_TIMEOUT_S:
            raise SpecError(
                f"--dataset-timeout {self.dataset_timeout_s:g} must be between {MIN_DATASET_TIMEOUT_S:g} "
                f"seconds and {MAX_DATASET_TIMEOUT_S // 86400:g} days"
            )
        if self.local_dir is not None and not PLAIN_PATH.fullmatch(self.local_dir):
            raise SpecError(f"local_dir {self.local_dir!r} must be an absolute path on the nodes")

    def _validate_data_nodes(self, excluded: set[str]) -> None:
        if self.data_nodes < 0:
            raise SpecError(f"--data-nodes {self.data_nodes} must be at least 1")
        _positive("--data-nodes", self.data_nodes or None, MAX_NODES)
        named = parse_node_names(self.data_node_names)
        if named and len(named) != self.data_nodes:
            fewer = "fewer" if len(named) < self.data_nodes else "more"
            raise SpecError(
                f"{len(named)} data node(s) named with --data-node, {fewer} than the {self.data_nodes} asked "
                "for with --data-nodes"
            )
        trainers = {name.upper() for name in self.node_names}
        for name in named:
            if name.upper() in trainers:
                raise SpecError(
                    f"node {name!r} is named both a trainer (--node) and a data node (--data-node)"
                )
            if name.upper() in excluded:
                raise SpecError(
                    f"node {name!r} is both a data node (--data-node) and excluded (--exclude-node)"
                )
        if self.data_node_group is not None and not GROUP_NAME.fullmatch(self.data_node_group):
            raise SpecError(f"data node group {self.data_node_group!r} is not a valid group name")
        if not self.data_nodes:
            return
        if self.elastic:
            raise SpecError(
                "--data-nodes does not go with --min-nodes: which data node serves which trainer follows the "
                "ranks, and a re-formed world orders them anew"
            )
        if not 1 <= self.data_port <= 65535 or self.data_port == self.rdzv_port:
            raise SpecError(f"--data-port {self.data_port} must be between 1 and 65535, not the --rdzv-port")
        if not 0 < self.data_wait_s <= MAX_DATA_WAIT_S:
            raise SpecError(f"--data-wait {self.data_wait_s:g} must be more than 0 and at most a day")

    @property
    def all_node_count(self) -> int:
        """The job's nodes of both roles: its trainers and its data nodes."""
        return self.node_count + self.data_nodes

    def _validate_env(self) -> None:
        total = 0
        for name, value in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise SpecError(
                    f"--env {name!r}: a variable name is letters, digits and _, not first a digit"
                )
            matched = secret_in_value(value)
            if matched is not None:
                raise SpecError(
                    f"--env {name}: the value holds {matched}, and job environment variables are stored in "
                    f"clear in the job and the run history: give it with --secret {name} (from your "
                    "environment, to an owner-only file)"
                )
            word = _SECRET_NAME.search(name)
            if word is not None:
                raise SpecError(
                    f"--env {name}: the name holds {word.group().strip('_').upper()} and looks like a "
                    "secret, and job environment variables are stored in clear in the job: give it with "
                    f"--secret {name} (from your environment, to an owner-only file)"
                )
            # The agent writes a container task's variables into a file, a line each, and reads its own
            # back with unanchored greps (common.sh L157-173): a name that holds CCP_DOCKER_ anywhere, or a
            # line break, would reach `docker run`, whether hpcjob or a cluster's template names the image.
            if "CCP_DOCKER_" in name.upper():
                raise SpecError(
                    f"--env {name}: hpcjob sets the node agent's Docker variables, and no other name may "
                    "hold CCP_DOCKER_: give --image (and the cluster profile's docker_options)"
                )
            if "\n" in value or "\r" in value:
                raise SpecError(
                    f"--env {name}: the value may hold no line break (the node agent reads a container's "
                    "settings from a file of the variables, by line)"
                )
            if self.image is not None:
                if "CCP_DOCKER_" in value.upper():
                    raise SpecError(
                        f"--env {name}: with --image the value may hold no CCP_DOCKER_ (the node agent "
                        "reads its Docker settings from a file of the variables, by line)"
                    )
                if name in ("PATH", "LD_LIBRARY_PATH"):
                    raise SpecError(f"--env {name}: with --image the image's own {name} is the one to use")
            if NOT_XML.search(value):
                raise SpecError(f"--env {name}: the value holds a control character a job file cannot carry")
            total += len(name) + len(value) + 2
        if total > TASK_ENV_LIMIT:
            raise SpecError(
                f"--env: {total} characters of environment variables, more than HPC Pack's {TASK_ENV_LIMIT}"
            )


# JobSpec's fields that are tuples of strings (JSON has lists).
_SPEC_TUPLES = ("script_args", "node_names", "exclude_nodes", "data_node_names", "secrets", "datasets")
# Names hpcjob and the node agent set themselves, and those that say how the task's shell and Python run:
# a secret never replaces one.
_NOT_SECRETS = re.compile(r"(HPCJOB_|CCP_).*|PATH|HOME|USER|SHELL|PWD|IFS|BASH_ENV|ENV|LD_\w+|PYTHON\w*")
MAX_SECRETS = 64


def check_secret_names(names: Iterable[str], env_names: Iterable[str] = ()) -> tuple[str, ...]:
    """`--secret` names: variable names, each once, none also given with --env, none of hpcjob's own."""
    names = tuple(names)
    given = set(env_names)
    if len(names) > MAX_SECRETS:
        raise SpecError(f"--secret: {len(names)} secrets, more than {MAX_SECRETS}")
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise SpecError(f"--secret {name!r}: a variable name is letters, digits and _, not first a digit")
        if names.count(name) > 1:
            raise SpecError(f"--secret {name}: named twice")
        if name in given:
            raise SpecError(f"--secret {name} and --env {name} both give it: give one")
        if _NOT_SECRETS.fullmatch(name.upper()):
            raise SpecError(
                f"--secret {name}: hpcjob, the node agent or the task's shell set this name: choose another"
            )
    return names


# A script with a data-service mode reads its role (HPCJOB_ROLE), itself or through hpctorch's data service
# (hpctorch.data, which hpcjob ships with each job), or a data_service module of its own (docs/data-nodes.md).
_DATA_SERVICE = re.compile(
    r"HPCJOB_ROLE|\bdata_service\b|\bhpctorch\.data\b|\bfrom\s+hpctorch\s+import\b.*\bdata\b"
)


def check_data_service(script: str, text: str) -> None:
    """Refuse --data-nodes for a script (`text`: its source) with no data-service mode: its data tasks
    would train, or do nothing, and the trainers would wait for them in vain."""
    if not _DATA_SERVICE.search(text):
        raise SpecError(
            f"--data-nodes: {script} has no data-service mode (it never reads HPCJOB_ROLE nor imports "
            "hpctorch.data): see docs/data-nodes.md"
        )


def check_env_place(env_on: str, node_env_dir: str) -> None:
    if env_on not in ENV_PLACES:
        raise SpecError(f"env_on {env_on!r} must be one of {', '.join(ENV_PLACES)}")
    if not _NODE_ENV_DIR.fullmatch(node_env_dir) or "/../" in f"{node_env_dir}/":
        raise SpecError(
            f"node_env_dir {node_env_dir!r} must be an absolute path or one under ~ (letters, digits, "
            ". _ -), without .."
        )
    if _SYSTEM_FOLDERS.fullmatch(node_env_dir):
        raise SpecError(
            f"node_env_dir {node_env_dir!r} is a system folder: give one of its own, such as /scratch/envs"
        )


VM_SIZE = re.compile(r"Standard_[A-Za-z0-9_]{1,60}", re.IGNORECASE)


def check_vm_size(vm_size: str | None) -> None:
    if vm_size is not None and not VM_SIZE.fullmatch(vm_size):
        raise SpecError(f"--vm-size {vm_size!r} must be an Azure VM size such as Standard_ND96isr_H100_v5")


def check_docker(image: str | None, docker_gpus: str, docker_options: str) -> None:
    if image is not None:
        # As Docker reads it, and as the nodes' filter reads it (one answer: hpcjob.node.mount_filter). A
        # reference holds no `=`, which matters: the agent reads the image back from its env file with
        # `cut -d '=' -f 2`.
        from hpcjob.node.mount_filter import image_reference, shown

        try:
            image_reference(image)
        except ValueError as why:
            raise SpecError(f"--image {shown(image)}{why}") from None
    if docker_gpus not in DOCKER_GPUS:
        raise SpecError(f"docker_gpus {docker_gpus!r} must be one of {', '.join(DOCKER_GPUS)}")
    bad = [word for word in docker_options.split() if not _DOCKER_WORD.fullmatch(word)]
    if bad:
        raise SpecError(
            f"docker_options {bad[0]!r}: the node agent puts these words unquoted into `docker run`, so "
            "each is letters, digits and . _ - = : / , + @ only"
        )


# `--wheelhouse 3.10`: the nodes' platform unless said (glibc 2.28 and later: Ubuntu 20.04+, AlmaLinux 8+;
# pip takes the older manylinux wheels too). UNVERIFIED for a given cluster's image: say it when it differs.
DEFAULT_NODE_PLATFORM = "manylinux_2_28_x86_64"
# An http(s) URL with a user or a token in it (https://user:pass@host, https://ghp_TOKEN@github.com):
# pip would read it from a file on the share. ssh://git@host names no secret.
_URL_WITH_SECRET = re.compile(r"https?://[^/\s@]+@", re.I)
# A URL of any scheme with a password in it (postgres://user:pw@, redis://:pw@, mongodb+srv://...).
_URL_WITH_PASSWORD = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://[^/\s@:]*:[^/\s@]*@")
# Query parameters that carry a signature or a token (a SAS URL's sig=, OAuth's access_token=).
_SECRET_PARAMETER = re.compile(r"[?&;](sig|signature|access_token|token|password)=", re.I)
# Azure storage and Service Bus connection strings.
_SECRET_SETTING = re.compile(r"\b(AccountKey|SharedAccessSignature|SharedAccessKey)=", re.I)


def secret_in_value(value: str) -> str | None:
    """What in `value` looks like a secret, in words that never repeat it: a URL with a password or a
    user, a signature or token parameter, a storage key; None when nothing does."""
    if _URL_WITH_SECRET.search(value):
        return "a URL with a user or token (https://USER@ or https://USER:PASSWORD@)"
    url = _URL_WITH_PASSWORD.search(value)
    if url is not None:
        return f"a URL with a user and password ({url.group(1).lower()}://USER:PASSWORD@)"
    setting = _SECRET_SETTING.search(value)
    if setting is not None:
        return f"a connection string's {setting.group(1)}="
    parameter = _SECRET_PARAMETER.search(value)
    if parameter is not None:
        return f"the query parameter {parameter.group(1).lower()}="
    return None


# What a requirements file names relative to itself: it is copied into .hpcjob/ of the job folder, and
# the environment's key is the file's own text, so these would be looked for elsewhere, or not rebuilt.
_RELATIVE = re.compile(r"(-r|--requirement|-c|--constraint|-e|--editable)(\s|=|$)|\.{1,2}/|file:(?!//)")


def check_requirements(text: str) -> None:
    """A requirements file that may go to the share: nothing secret in it, nothing it names relative to
    itself, and text a node can read."""
    for number, line in enumerate(text.splitlines(), 1):
        matched = secret_in_value(line)
        if matched is not None:
            raise SpecError(
                f"requirements line {number}: {matched} would be written to the share: give the index "
                "URL with --secret PIP_INDEX_URL (or PIP_EXTRA_INDEX_URL), from your environment, or the "
                "credentials in pip.conf or ~/.netrc on the nodes, readable by you only"
            )
        if _RELATIVE.match(line.strip()):
            raise SpecError(
                f"requirements line {number}: -r, -c, -e and relative paths are not taken (the file is "
                "copied into the job folder, and only its own text keys the environment): list the "
                "packages in the file itself, or give absolute paths on the nodes"
            )
        if NOT_XML.search(line):
            raise SpecError(f"requirements line {number} holds a control character")


def _positive(option: str, value: int | None, most: int | None = None) -> None:
    if value is not None and value < 1:
        raise SpecError(f"{option} {value} must be at least 1")
    if value is not None and most is not None and value > most:
        raise SpecError(f"{option} {value} must be at most {most}")
