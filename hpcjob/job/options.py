"""The options of a job, in one place: `JobOptions`, one field each. Pure: no I/O.

Each field is one option under one name: the Python API's keyword (`hpcjob.submit(..., nodes=2)`), the
click parameter's name, the cluster profile's key where a profile may set it, and the JobSpec field it
fills (hpcjob.runner.job_spec). Its metadata (`Option`) says the rest: the command line's flag, how its
text is read, its bounds, its help and heading, and whether a profile fills it in. hpcjob.cli.options
builds the click options from this table, the PowerShell module's parameters are checked against it
(tests/test_powershell_module.py), and a new option is added here, as a field.

A value is read the same way from every front door: the command line's text ("90m", "K=V") or the
API's Python value (5400 seconds, a mapping), into the field's type; a bad one is a SpecError in the
command line's words (`--runtime`), as the JobSpec's own checks say it from every door.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import PurePath
from typing import Any

from hpcjob.job.spec import (
    DEFAULT_NODE_PLATFORM,
    DOCKER_GPUS,
    ENV_PLACES,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    PRIORITIES,
    Share,
    SpecError,
    parse_duration,
    parse_env,
    parse_share,
)

# The headings a command's --help lists the job's options under (hpcjob.cli.options.HEADINGS orders them).
SHAPE = "Job shape"
NODES = "Nodes and cluster"
DATA = "CPU data nodes"
DATASETS = "Datasets"
SHARE = "Share"
SOFTWARE = "Software"
FAILURE = "Failure handling"

# How an option's value is read (Option.kind).
COUNT = "count"  # a whole number within [low, high]
TEXT = "text"  # a string that says something
CHOICE = "choice"  # one of `choices`
NAMES = "names"  # a repeatable option: a tuple of strings (the API: a sequence, or one string)
PAIRS = "pairs"  # --env K=V, repeatable (the API: a mapping)
DURATION = "duration"  # seconds: 90m, 12h, 1d12h, the scheduler's [[DD:]HH:]MM; the API: seconds
TIMEOUT = "timeout"  # seconds: a bare number is seconds, else a duration; the API: seconds
SWITCH = "switch"  # a flag
SHARE_UNC = "share"  # //HOST/SHARE[/folder] (the API: that text, or a Share)
WHEELHOUSE = "wheelhouse"  # PYTHON[:PLATFORM], as (Python, platform)
KINDS = (COUNT, TEXT, CHOICE, NAMES, PAIRS, DURATION, TIMEOUT, SWITCH, SHARE_UNC, WHEELHOUSE)

MAX_SECONDS = 2**31 - 1  # what a job file's seconds hold


@dataclass(frozen=True)
class Option:
    """How the fronts show one field of JobOptions: `flag`, the command line's (None: the API's and the
    profile's alone); `kind` (KINDS), within `low`..`high` or one of `choices`; `profile`: a cluster
    profile's key of the field's name fills it in when the job does not say; `spec`: the JobSpec field
    of the same name takes it (else the runner reads it: the run id, a file to read, a run to find)."""

    flag: str | None
    kind: str
    help: str
    heading: str
    metavar: str | None = None
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    profile: bool = False
    spec: bool = True
    short: str | None = None
    powershell: str | None = None  # its PowerShell parameter where it is not the flag's words joined

    @property
    def parameter(self) -> str | None:
        """The PowerShell module's parameter (Submit-HpcTorchJob's): -RdzvTimeout for --rdzv-timeout."""
        if self.flag is None:
            return None
        return self.powershell or "".join(word.capitalize() for word in self.flag[2:].split("-"))


def _option(default: Any = None, **how: Any) -> Any:
    return field(default=default, metadata={"option": Option(**how)})


@dataclass(frozen=True)
class JobOptions:
    """A job as one of the fronts asked for it, before a cluster profile fills in what it does not say
    (None, or an empty tuple: not said). `hpcjob.runner.job_spec` makes the JobSpec of it."""

    script: str
    script_args: tuple[str, ...] = ()
    # Job shape
    nodes: int | None = _option(
        flag="--nodes", short="-n", kind=COUNT, low=1, high=MAX_NODES, metavar="N", heading=SHAPE,
        help="Number of nodes [default: the number of --node names].",
    )  # fmt: skip
    nproc_per_node: int | None = _option(
        flag="--nproc-per-node", kind=COUNT, low=1, high=MAX_PROCS_PER_NODE, metavar="N", heading=SHAPE,
        help="Processes per node, one per GPU [default: --gpus-per-node, else 1].",
    )  # fmt: skip
    gpus_per_node: int | None = _option(
        flag="--gpus-per-node", kind=COUNT, low=1, high=MAX_PROCS_PER_NODE, metavar="N", heading=SHAPE,
        profile=True,
        help="GPUs per node, to check --nproc-per-node against [default: the profile's gpus_per_node, "
        "else the size table's for the nodes' --vm-size].",
    )  # fmt: skip
    runtime_s: int | None = _option(
        flag="--runtime", kind=DURATION, metavar="DURATION", heading=SHAPE,
        help="Run-time limit (90m, 12h, 1d12h, DD:HH:MM), canceled past it [default: the cluster's].",
    )  # fmt: skip
    name: str | None = _option(
        flag="--name", kind=TEXT, metavar="NAME", heading=SHAPE,
        help="Job name: its folder's and the run id's start [default: the script's name].",
    )  # fmt: skip
    run_id: str | None = _option(
        flag="--run-id", kind=TEXT, metavar="RUN", heading=SHAPE, spec=False,
        help="Unique id of this run: HPC Pack job name, rendezvous id, log folder [default: generated].",
    )  # fmt: skip
    # Nodes and cluster
    node_names: tuple[str, ...] = _option(
        (), flag="--node", kind=NAMES, metavar="NAME", heading=NODES,
        help="An HPC Pack node to run on, repeatable, in order; the first hosts the rendezvous.",
    )  # fmt: skip
    exclude_nodes: tuple[str, ...] = _option(
        (), flag="--exclude-node", kind=NAMES, metavar="NAME", heading=NODES,
        help="Never choose this node, repeatable (when hpcjob chooses the nodes).",
    )  # fmt: skip
    node_group: str | None = _option(
        flag="--node-group", kind=TEXT, metavar="GROUP", heading=NODES, profile=True,
        help="HPC Pack node group the nodes belong to (GPU nodes).",
    )  # fmt: skip
    vm_size: str | None = _option(
        flag="--vm-size", kind=TEXT, metavar="SIZE", heading=NODES, profile=True,
        help="The nodes' Azure VM size, for NCCL's settings on it [default: the profile's vm_size].",
    )  # fmt: skip
    priority: str | None = _option(
        flag="--priority", kind=CHOICE, choices=PRIORITIES, metavar="PRIORITY", heading=NODES,
        help=f"Job priority: {', '.join(PRIORITIES[:-1])} or {PRIORITIES[-1]} [default: the cluster's, "
        "Normal].",
    )  # fmt: skip
    job_template: str | None = _option(
        flag="--job-template", kind=TEXT, metavar="NAME", heading=NODES,
        help="HPC Pack job template [default: the cluster's].",
    )  # fmt: skip
    rdzv_port: int | None = _option(
        flag="--rdzv-port", kind=COUNT, low=1, high=65535, metavar="PORT", heading=NODES, profile=True,
        help="Rendezvous port on the first node [default: 29400].",
    )  # fmt: skip
    command_limit: int | None = _option(
        flag="--command-limit", kind=COUNT, low=1, high=1 << 20, metavar="CHARS", heading=NODES,
        help="The scheduler's CommandLine length limit [default: 480].",
    )  # fmt: skip
    # CPU data nodes
    data_nodes: int | None = _option(
        flag="--data-nodes", kind=COUNT, low=1, high=MAX_NODES, metavar="M", heading=DATA,
        help="CPU data nodes beside the -n trainers: the script's data service runs there and feeds "
        "them (docs/data-nodes.md).",
    )  # fmt: skip
    data_node_names: tuple[str, ...] = _option(
        (), flag="--data-node", kind=NAMES, metavar="NAME", heading=DATA,
        help="A data node to use, repeatable; never a trainer.",
    )  # fmt: skip
    data_node_group: str | None = _option(
        flag="--data-node-group", kind=TEXT, metavar="GROUP", heading=DATA, profile=True,
        help="HPC Pack node group the data nodes come from [default: the profile's data_node_group].",
    )  # fmt: skip
    data_port: int | None = _option(
        flag="--data-port", kind=COUNT, low=1, high=65535, metavar="PORT", heading=DATA,
        help="Port of the data service on the data nodes [default: 29600].",
    )  # fmt: skip
    data_wait_s: float | None = _option(
        flag="--data-wait", kind=DURATION, metavar="DURATION", heading=DATA,
        help="How long a trainer waits for a data node to come up before it fails [default: 5m].",
    )  # fmt: skip
    # Datasets
    datasets: tuple[str, ...] = _option(
        (), flag="--dataset", kind=NAMES, metavar="SOURCE[:ROLE]", heading=DATASETS, profile=True,
        help="Copy SOURCE onto each node's own disk before the program starts, found in $HPCJOB_DATASETS/"
        "NAME (its last path component): a folder on the share (datasets/imagenet) or a Blob URL; ROLE: "
        "trainers (the default), data or all. Repeatable; cached on the nodes between runs.",
    )  # fmt: skip
    dataset_timeout_s: float | None = _option(
        flag="--dataset-timeout", kind=DURATION, metavar="DURATION", heading=DATASETS,
        help="How long the nodes wait for the slowest node's copy before they fail [default: 1h].",
    )  # fmt: skip
    dataset_cache_gb: int | None = _option(
        flag="--dataset-cache-gb", kind=COUNT, low=1, high=1_000_000, metavar="GB", heading=DATASETS,
        profile=True,
        help="Keep at most GB gigabytes of datasets a user on each node, dropping the least recently used "
        "no running job reads [default: all the disk holds, dropped as a copy needs room].",
    )  # fmt: skip
    local_dir: str | None = _option(
        flag=None, kind=TEXT, heading=DATASETS, profile=True,
        help="The nodes' own local folder for datasets (HPCJOB_LOCAL_DIR) [default: by VM size].",
    )  # fmt: skip
    # Share
    share: Share | None = _option(
        flag="--share", kind=SHARE_UNC, metavar="UNC", heading=SHARE, profile=True,
        help="Share folder mounted on the nodes, e.g. //HEADNODE/CcpSpoolDir/app.",
    )  # fmt: skip
    mount_point: str | None = _option(
        flag="--mount-point", kind=TEXT, metavar="PATH", heading=SHARE, profile=True,
        help="Where the nodes mount the share [default: /app/USER, render's /app]; --local: the folder "
        "standing in for it.",
    )  # fmt: skip
    mount_options: str | None = _option(
        flag="--mount-options", kind=TEXT, metavar="OPTS", heading=SHARE,
        help="mount.cifs options; credentials come from a file on the nodes, never a password.",
    )  # fmt: skip
    job_folder: str | None = _option(
        flag="--job-folder", kind=TEXT, metavar="PATH", heading=SHARE,
        help="The job's folder on the share, in hpcjob/USER/ [default: hpcjob/USER/NAME].",
    )  # fmt: skip
    owner: str | None = _option(
        flag=None, kind=TEXT, heading=SHARE,
        help="The cluster user whose folder on the share holds the job folder (a profile's user; "
        "render_job's keyword).",
    )  # fmt: skip
    # Software
    requirements: str | None = _option(
        flag="--requirements", kind=TEXT, metavar="FILE", heading=SOFTWARE, spec=False,
        help="pip requirements, installed once into the job's environment [default: requirements.txt "
        "beside SCRIPT].",
    )  # fmt: skip
    wheelhouse: tuple[str, str] | None = _option(
        flag="--wheelhouse", kind=WHEELHOUSE, metavar="PYTHON[:PLATFORM]", heading=SOFTWARE,
        help="Nodes without an index: the wheels downloaded here for their Python (3.10, "
        "3.10:manylinux2014_x86_64), installed from the share.",
    )  # fmt: skip
    no_env: bool = _option(
        False, flag="--no-env", kind=SWITCH, heading=SOFTWARE, spec=False,
        help="Run with the nodes' Python as it is, even with a requirements.txt beside SCRIPT.",
    )  # fmt: skip
    env_on: str | None = _option(
        flag="--env-on", kind=CHOICE, choices=ENV_PLACES, heading=SOFTWARE, profile=True,
        help="The environment on each node's disk (fast imports) or the share [default: node-local].",
    )  # fmt: skip
    node_env_dir: str | None = _option(
        flag=None, kind=TEXT, heading=SOFTWARE, profile=True,
        help="The nodes' own folder for the environment [default: ~/.cache/hpcjob/envs].",
    )  # fmt: skip
    image: str | None = _option(
        flag="--image", kind=TEXT, metavar="IMAGE", heading=SOFTWARE,
        help="Run each task in a container of IMAGE (its own Python), with the GPUs and the share.",
    )  # fmt: skip
    docker_gpus: str | None = _option(
        flag=None, kind=CHOICE, choices=DOCKER_GPUS, heading=SOFTWARE, profile=True,
        help="How --image containers get the GPUs [default: gpus-all].",
    )  # fmt: skip
    docker_options: str | None = _option(
        flag=None, kind=TEXT, heading=SOFTWARE, profile=True,
        help="More `docker run` options for the cluster's nodes (the InfiniBand devices, for one).",
    )  # fmt: skip
    python: str | None = _option(
        flag="--python", kind=TEXT, metavar="PYTHON", heading=SOFTWARE,
        help="Python on the nodes [default: python3].",
    )  # fmt: skip
    env: tuple[tuple[str, str], ...] = _option(
        (), flag="--env", kind=PAIRS, metavar="K=V", heading=SOFTWARE, powershell="Environment",
        help="Job environment variable, repeatable.",
    )  # fmt: skip
    secrets: tuple[str, ...] = _option(
        (), flag="--secret", kind=NAMES, metavar="NAME", heading=SOFTWARE, profile=True,
        help="Hand the value of this machine's environment variable NAME to the tasks as NAME, "
        "repeatable: in a file in the job folder only you may read, removed when the attempt ends; never "
        "in the job, the history or a log (--local: in the tasks' environment).",
    )  # fmt: skip
    # Failure handling
    hang_timeout_s: float | None = _option(
        flag="--hang-timeout", kind=TIMEOUT, metavar="DURATION", heading=FAILURE,
        help="End the job when no collective moved on this long (120, 10m): the rank and the collective "
        "named, the flight recorders dumped (while hpcjob follows the job).",
    )  # fmt: skip
    max_restarts: int | None = _option(
        flag="--max-restarts", kind=COUNT, low=0, high=1000, metavar="N", heading=FAILURE,
        help="torchrun restarts of the worker group after a failure [default: 0].",
    )  # fmt: skip
    min_nodes: int | None = _option(
        flag="--min-nodes", kind=COUNT, low=1, high=MAX_NODES, metavar="N", heading=FAILURE,
        help="Elastic job: go on while N nodes remain, from the last checkpoint (with --max-restarts).",
    )  # fmt: skip
    resume_from: str | None = _option(
        flag="--resume-from", kind=TEXT, metavar="RUN", heading=FAILURE, spec=False,
        help="Start from the latest checkpoint of an earlier run (run or job id) [default: fresh].",
    )  # fmt: skip
    rdzv_join_timeout: int | None = _option(
        flag="--rdzv-timeout", kind=COUNT, low=1, metavar="SECONDS", heading=FAILURE,
        help="How long torchrun waits for all nodes to join [default: torchrun's, 900].",
    )  # fmt: skip
    rdzv_last_call: int | None = _option(
        flag="--rdzv-last-call", kind=COUNT, low=1, metavar="SECONDS", heading=FAILURE,
        help="Elastic job: wait for more nodes once --min-nodes joined [default: 30].",
    )  # fmt: skip
    rdzv_keep_alive: int | None = _option(
        flag="--rdzv-keep-alive", kind=COUNT, low=1, metavar="SECONDS", heading=FAILURE,
        help="Seconds between heartbeats; a lost node is dropped after three [default: 5].",
    )  # fmt: skip

    @classmethod
    def read(cls, values: Mapping[str, Any]) -> JobOptions:
        """The options from `values` by their names (None or an empty sequence: not said), each read by
        its kind, the command line's text or the API's values alike; a bad one is the command line's
        one-line error, naming its flag (an option without one: name=), as JobSpec's own checks do. An
        unknown name is a SpecError that says the nearest known one."""
        known = {f.name: f for f in fields(cls)}
        read: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise SpecError(f"no job option {name}{_nearest(name, known)}")
            if value is None or (isinstance(value, tuple | list) and not value):
                continue
            if name == "script":
                read[name] = str(value)
            elif name == "script_args":
                read[name] = tuple(str(arg) for arg in value)
            else:
                how = option_of(name)
                read[name] = read_value(how, value, how.flag or f"{name}=")
        if "script" not in read:
            raise SpecError("no script: give the training script to run")
        return cls(**read)

    def given(self) -> dict[str, Any]:
        """The options that say something, by name (what `read` takes back)."""
        return {
            f.name: value
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None and value != () and value is not False
        }

    def spec_fields(self) -> dict[str, Any]:
        """The given options the JobSpec takes by the same names (not the runner's: the run id, the
        requirements file, the run to resume from)."""
        return {
            name: value
            for name, value in self.given().items()
            if name in ("script", "script_args") or option_of(name).spec
        }

    def filled(self, defaults: Mapping[str, Any]) -> JobOptions:
        """These options, with `defaults` (by name, read as the API's) where they say nothing."""
        mine = self.given()
        missing = {name: value for name, value in defaults.items() if name not in mine}
        if not missing:
            return self
        return replace(self, **JobOptions.read({"script": self.script, **missing}).given())


def _nearest(name: str, known: Iterable[str]) -> str:
    """The hint for an unknown name: the option whose flag it spells (runtime: runtime_s, of --runtime),
    else the nearest name (did_you_mean)."""
    by_flag = {how.flag[2:].replace("-", "_"): field_name for field_name, how in job_options() if how.flag}
    return f" (did you mean {by_flag[name]}?)" if name in by_flag else did_you_mean(name, known)


def job_options() -> tuple[tuple[str, Option], ...]:
    """(name, Option) of each option, in the table's order."""
    return tuple((f.name, f.metadata["option"]) for f in fields(JobOptions) if "option" in f.metadata)


def option_of(name: str) -> Option:
    """The Option of the field `name`."""
    return next(how for known, how in job_options() if known == name)


def profile_keys() -> tuple[str, ...]:
    """The options a cluster profile fills in: the ClusterProfile fields of the same names."""
    return tuple(name for name, how in job_options() if how.profile)


def read_value(how: Option, value: Any, said: str) -> Any:
    """`value` (text, or a Python value) as the option's type; `said`: the option as the user gave it."""
    if how.kind == SWITCH:
        if not isinstance(value, bool):
            raise SpecError(f"{said} is a switch: True or False, not {value!r}")
        return value
    if how.kind == NAMES:
        names = (value,) if isinstance(value, str) else tuple(value)
        if not all(isinstance(name, str) and name.strip() for name in names):
            raise SpecError(f"{said} takes names (strings that say something), not {value!r}")
        return names
    if how.kind == PAIRS:
        if isinstance(value, Mapping):
            value = [f"{name}={text}" for name, text in value.items()]
        elif isinstance(value, str):
            value = [value]
        items = [item if isinstance(item, str) else "=".join(map(str, item)) for item in value]
        return parse_env(items)
    if how.kind == COUNT:
        return _count(how, value, said)
    if how.kind in (DURATION, TIMEOUT):
        return _seconds(how, value, said)
    if how.kind == SHARE_UNC and isinstance(value, Share):
        return value
    if isinstance(value, PurePath):  # a file's path (--requirements), as the API may give it
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{said} must say something: a string, not {value!r}")
    if how.kind == CHOICE and value not in how.choices:
        raise SpecError(f"{said} {value!r} must be one of {', '.join(how.choices)}")
    if how.kind == SHARE_UNC:
        return parse_share(value)
    if how.kind == WHEELHOUSE:
        python, _, platform = value.partition(":")
        return python, platform or DEFAULT_NODE_PLATFORM
    return value


def _count(how: Option, value: Any, said: str) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{said} must be a whole number, not {value!r}")
    if how.low is not None and value < how.low:
        raise SpecError(f"{said} {value} must be at least {how.low}")
    if how.high is not None and value > how.high:
        raise SpecError(f"{said} {value} must be at most {how.high}")
    return value


def _seconds(how: Option, value: Any, said: str) -> float:
    """A duration: the command line's text (a DURATION's bare number is minutes, as the scheduler's
    MM; a TIMEOUT's is seconds), or the API's number of seconds. JobSpec checks its bounds."""
    if isinstance(value, str):
        text = value.strip()
        return int(text) if how.kind == TIMEOUT and text.isdigit() else parse_duration(text, said)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return value
    raise SpecError(f"{said} must be a duration (90m, 12h) or a number of seconds above 0, not {value!r}")


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """The hint " (did you mean X?)" with the known word nearest `word`, where one is near enough; else ""."""
    # Fewest edits (two letters swapped is one), then the same length: --nodse is --nodes, not --node.
    candidates = list(known)
    if not candidates:
        return ""
    (edits, _), nearest = min(((_edits(word, k), abs(len(k) - len(word))), k) for k in candidates)
    return f" (did you mean {nearest}?)" if edits <= max(1, len(word) // 4) else ""


def _edits(a: str, b: str) -> int:
    """Letters to insert, delete, change or swap with their neighbour to make `a` into `b`."""
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (x != y)))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                current[j] = min(current[j], before[j - 2] + 1)
        before, row = row, current
    return row[-1]
