"""Options shared by the commands that build a job or reach the share, defined once."""

from __future__ import annotations

import inspect
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from hpcjob.job.spec import CLUSTER_BACKENDS, ENV_PLACES, PRIORITIES

if TYPE_CHECKING:
    from hpcjob.job.results import JobSummary
    from hpcjob.job.spec import JobSpec
    from hpcjob.runner import Retries
    from hpcjob.store.config import ClusterProfile

PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}
F = TypeVar("F", bound=Callable[..., Any])


if TYPE_CHECKING:  # ParamType is generic in click's newer type hints, not at run time in click 8.1
    _TextType = click.ParamType[str]
    _SecondsType = click.ParamType[float]
else:
    _TextType = _SecondsType = click.ParamType


class Text(_TextType):
    """A string option that must say something: `--name ''` is a mistake, never "the default"."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail("must not be empty", param, ctx)
        return text


class Seconds(_SecondsType):
    """A time in seconds: a finite number, at least `minimum` (above it when `above`)."""

    name = "seconds"

    def __init__(self, minimum: float = 0.0, above: bool = False) -> None:
        self.minimum = minimum
        self.above = above

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low = seconds <= self.minimum if self.above else seconds < self.minimum
        if not math.isfinite(seconds) or low:
            word = "more than" if self.above else "at least"
            self.fail(f"{value} must be a number of seconds, {word} {self.minimum:g}", param, ctx)
        return seconds


TEXT = Text()
PORT = click.IntRange(1, 65535)

# The headings a command's --help lists its options under, in this order (HelpCommand).
THE_CLUSTER = "The cluster"
AZURE = "Azure resources"
CREDENTIALS = "Credentials and TLS"
SHAPE = "Job shape"
NODES = "Nodes and cluster"
SHARE = "Share"
FILTER = "Execution filter (HPC administrators, with --install)"
SOFTWARE = "Software"
OUTPUT = "Output"
FAILURE = "Failure handling"
DATA = "CPU data nodes"
OTHER = "Other options"
HEADINGS = (
    THE_CLUSTER,
    AZURE,
    CREDENTIALS,
    SHAPE,
    NODES,
    DATA,
    SHARE,
    FILTER,
    SOFTWARE,
    OUTPUT,
    FAILURE,
    OTHER,
)


def headed(names: dict[str, str]) -> dict[str, str]:
    """{heading: "name name ..."} (parameter names) as {name: heading}, in that order: HelpCommand's
    `groups`."""
    return {name: heading for heading, listed in names.items() for name in listed.split()}


# The heading of each option this module defines (and of --json), by parameter name, in the
# order --help lists them; a command gives its own options' headings (HelpCommand's `groups`).
GROUPS = headed(
    {
        SHAPE: "nodes nproc_per_node gpus_per_node runtime name run_id",
        NODES: "cluster_name backend_kind node_names exclude_nodes node_group vm_size priority job_template "
        "rdzv_port command_limit",
        DATA: "data_nodes data_node_names data_node_group data_port data_wait",
        SHARE: "share mount_point mount_options job_folder smb_user smb_server smb_port",
        SOFTWARE: "requirements wheelhouse no_env env_on image python env_items secrets",
        OUTPUT: "as_json tag_items pull pull_to",
        FAILURE: "retries retry_on node_wait max_cost hang_timeout max_restarts min_nodes resume_from "
        "rdzv_timeout rdzv_last_call rdzv_keep_alive",
    }
)


class _Examples(click.Command):
    """The epilog (a command's examples) flush left, under its own heading as the options are."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.epilog:
            formatter.write_paragraph()
            formatter.write_text(inspect.cleandoc(self.epilog))


class HelpCommand(_Examples):
    """A command of hpcjob: with `groups` (parameter name -> heading, over GROUPS), its --help lists the
    options under headings in HEADINGS order, instead of one flat list of them all: under each, the
    command's own options first, as `groups` orders them, then the shared ones in GROUPS order."""

    def __init__(self, *args: Any, groups: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups = (
            None if groups is None else {**groups, **{k: v for k, v in GROUPS.items() if k not in groups}}
        )

    def heading(self, param: click.Parameter) -> str | None:
        """The option's heading; None: the command has none for it (the tests make that a mistake)."""
        if self.groups is None:
            return None
        if "--help" in param.opts:  # its name is click's own: help, or _click_default_help in click 8.3+
            return OTHER
        return self.groups.get(param.name or "")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.groups is None:
            super().format_options(ctx, formatter)
            return
        order = list(self.groups)
        sections: dict[str, list[tuple[str, str]]] = {heading: [] for heading in HEADINGS}
        params = [p for p in self.get_params(ctx) if isinstance(p, click.Option)]
        for param in sorted(params, key=lambda p: order.index(p.name) if p.name in order else len(order)):
            record = param.get_help_record(ctx)
            if record is not None:
                sections[self.heading(param) or OTHER].append(record)
        for heading, records in sections.items():
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)


class HelpGroup(click.Group, _Examples):
    """hpcjob and its command groups: their commands and groups are HelpCommands and HelpGroups."""

    command_class = HelpCommand
    group_class = type


def job_options(command: F) -> F:
    """The options that describe a job, shared by every command that builds one."""
    options = [
        click.option(
            "-n",
            "--nodes",
            type=click.IntRange(1),
            metavar="N",
            help="Number of nodes [default: the number of --node names].",
        ),
        click.option(
            "--nproc-per-node",
            type=click.IntRange(1),
            metavar="N",
            help="Processes per node, one per GPU [default: --gpus-per-node, else 1].",
        ),
        click.option(
            "--gpus-per-node",
            type=click.IntRange(1),
            metavar="N",
            help="GPUs per node, to check --nproc-per-node against [default: the profile's gpus_per_node, "
            "else the size table's for the nodes' --vm-size].",
        ),
        click.option(
            "--node",
            "node_names",
            multiple=True,
            metavar="NAME",
            help="An HPC Pack node to run on, repeatable, in order; the first hosts the rendezvous.",
        ),
        click.option(
            "--node-group",
            type=TEXT,
            metavar="GROUP",
            help="HPC Pack node group the nodes belong to (GPU nodes).",
        ),
        click.option(
            "--data-nodes",
            type=click.IntRange(1),
            metavar="M",
            help="CPU data nodes beside the -n trainers: the script's data service runs there and feeds "
            "them (docs/data-nodes.md).",
        ),
        click.option(
            "--data-node",
            "data_node_names",
            multiple=True,
            metavar="NAME",
            help="A data node to use, repeatable; never a trainer.",
        ),
        click.option(
            "--data-node-group",
            type=TEXT,
            metavar="GROUP",
            help="HPC Pack node group the data nodes come from [default: the profile's data_node_group].",
        ),
        click.option(
            "--data-port",
            type=PORT,
            metavar="PORT",
            help="Port of the data service on the data nodes [default: 29600].",
        ),
        click.option(
            "--data-wait",
            type=TEXT,
            metavar="DURATION",
            help="How long a trainer waits for a data node to come up before it fails [default: 5m].",
        ),
        click.option(
            "--name",
            type=TEXT,
            metavar="NAME",
            help="Job name: its folder's and the run id's start [default: the script's name].",
        ),
        click.option(
            "--share",
            type=TEXT,
            metavar="UNC",
            help="Share folder mounted on the nodes, e.g. //HEADNODE/CcpSpoolDir/app.",
        ),
        click.option(
            "--mount-point",
            type=TEXT,
            metavar="PATH",
            help="Where the nodes mount the share [default: /app/USER, render's /app]; --local: the "
            "folder standing in for it.",
        ),
        click.option(
            "--mount-options",
            type=TEXT,
            metavar="OPTS",
            help="mount.cifs options; credentials come from a file on the nodes, never a password.",
        ),
        click.option(
            "--job-folder",
            type=TEXT,
            metavar="PATH",
            help="The job's folder on the share, in hpcjob/USER/ [default: hpcjob/USER/NAME].",
        ),
        click.option(
            "--rdzv-port",
            type=PORT,
            metavar="PORT",
            help="Rendezvous port on the first node [default: 29400].",
        ),
        click.option(
            "--rdzv-timeout",
            type=click.IntRange(1),
            metavar="SECONDS",
            help="How long torchrun waits for all nodes to join [default: torchrun's, 900].",
        ),
        click.option(
            "--rdzv-last-call",
            type=click.IntRange(1),
            metavar="SECONDS",
            help="Elastic job: wait for more nodes once --min-nodes joined [default: 30].",
        ),
        click.option(
            "--rdzv-keep-alive",
            type=click.IntRange(1),
            metavar="SECONDS",
            help="Seconds between heartbeats; a lost node is dropped after three [default: 5].",
        ),
        click.option(
            "--env", "env_items", multiple=True, metavar="K=V", help="Job environment variable, repeatable."
        ),
        click.option(
            "--secret",
            "secrets",
            multiple=True,
            metavar="NAME",
            help="Hand the value of this machine's environment variable NAME to the tasks as NAME, "
            "repeatable: in a file in the job folder only you may read, removed when the attempt ends; "
            "never in the job, the history or a log (--local: in the tasks' environment).",
        ),
        click.option(
            "--max-restarts",
            type=click.IntRange(0),
            metavar="N",
            default=0,
            show_default=True,
            help="torchrun restarts of the worker group after a failure.",
        ),
        click.option(
            "--min-nodes",
            type=click.IntRange(1),
            metavar="N",
            help="Elastic job: go on while N nodes remain, from the last checkpoint (with --max-restarts).",
        ),
        click.option(
            "--python",
            type=TEXT,
            default="python3",
            show_default=True,
            metavar="PYTHON",
            help="Python on the nodes.",
        ),
        click.option(
            "--command-limit",
            type=click.IntRange(1),
            metavar="CHARS",
            help="The scheduler's CommandLine length limit [default: 480].",
        ),
        click.option(
            "--run-id",
            type=TEXT,
            metavar="RUN",
            help="Unique id of this run: HPC Pack job name, rendezvous id, log folder [default: generated].",
        ),
        click.option(
            "--resume-from",
            type=TEXT,
            metavar="RUN",
            help="Start from the latest checkpoint of an earlier run (run or job id) [default: fresh].",
        ),
        click.option(
            "--runtime",
            type=TEXT,
            metavar="DURATION",
            help="Run-time limit (90m, 12h, 1d12h, DD:HH:MM), canceled past it [default: the cluster's].",
        ),
        click.option(
            "--hang-timeout",
            type=TEXT,
            metavar="DURATION",
            help="End the job when no collective moved on this long (120, 10m): the rank and the "
            "collective named, the flight recorders dumped (while hpcjob follows the job).",
        ),
        click.option(
            "--priority",
            type=click.Choice(PRIORITIES),
            metavar="PRIORITY",
            help=f"Job priority: {', '.join(PRIORITIES[:-1])} or {PRIORITIES[-1]} [default: the cluster's, "
            "Normal].",
        ),
        click.option(
            "--job-template",
            type=TEXT,
            metavar="NAME",
            help="HPC Pack job template [default: the cluster's].",
        ),
        click.option(
            "--exclude-node",
            "exclude_nodes",
            multiple=True,
            metavar="NAME",
            help="Never choose this node, repeatable (when hpcjob chooses the nodes).",
        ),
        click.option(
            "--requirements",
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="pip requirements, installed once into the job's environment [default: "
            "requirements.txt beside SCRIPT].",
        ),
        click.option(
            "--wheelhouse",
            metavar="PYTHON[:PLATFORM]",
            help="Nodes without an index: the wheels downloaded here for their Python (3.10, "
            "3.10:manylinux2014_x86_64), installed from the share.",
        ),
        click.option(
            "--no-env",
            is_flag=True,
            help="Run with the nodes' Python as it is, even with a requirements.txt beside SCRIPT.",
        ),
        click.option(
            "--image",
            metavar="IMAGE",
            help="Run each task in a container of IMAGE (its own Python), with the GPUs and the share.",
        ),
        click.option(
            "--env-on",
            type=click.Choice(ENV_PLACES),
            help="The environment on each node's disk (fast imports) or the share [default: node-local].",
        ),
        click.option(
            "--vm-size",
            type=TEXT,
            metavar="SIZE",
            help="The nodes' Azure VM size, for NCCL's settings on it [default: the profile's vm_size].",
        ),
        click.argument("script", type=click.Path(dir_okay=False)),
        click.argument("script_args", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def requirements_text(script: Path, given: str | None, no_env: bool) -> str | None:
    """The job's requirements (hpcjob.runner.requirements_text), the file beside the script said here."""
    from hpcjob.runner import requirements_text as text_of

    return text_of(script, given, no_env, lambda line: click.echo(line, err=True))


def wheelhouse_target(value: str | None) -> tuple[str, str] | None:
    """`--wheelhouse 3.10[:PLATFORM]` as (Python, platform); JobSpec checks both."""
    from hpcjob.job.spec import DEFAULT_NODE_PLATFORM

    if value is None:
        return None
    python, _, platform = value.partition(":")
    return python, platform or DEFAULT_NODE_PLATFORM


class Dollars(_SecondsType):
    """An amount of US dollars: a finite number, 0 or more."""

    name = "usd"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            usd = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of US dollars", param, ctx)
        if not math.isfinite(usd) or usd < 0:
            self.fail(f"{value!r} must be a number of US dollars, 0 or more", param, ctx)
        return usd


# A run's attempts stop at a cost (submit, run, wait).
MAX_COST_OPTION = click.option(
    "--max-cost",
    type=Dollars(),
    metavar="USD",
    help="Start no other attempt once the run's attempts cost more than USD (at its cluster's prices).",
)


def retry_options(command: F) -> F:
    """A run that goes on in a new attempt when one ends for a cause outside the program (issue 33)."""
    from hpcjob.job.spec import MAX_RETRIES, RETRY_ON

    options = [
        click.option(
            "--retries",
            type=click.IntRange(0, MAX_RETRIES),
            metavar="N",
            help="Attempts after the first, each a new job on healthy nodes, from the last checkpoint "
            "[default: the cluster profile's retries, else 0].",
        ),
        click.option(
            "--retry-on",
            type=click.Choice(RETRY_ON),
            default=RETRY_ON[0],
            show_default=True,
            help="Retry causes outside the program (a lost node, the network, a hang), or any failure.",
        ),
        click.option(
            "--node-wait",
            type=TEXT,
            default="10m",
            show_default=True,
            metavar="DURATION",
            help="How long a next attempt waits for enough healthy nodes.",
        ),
        MAX_COST_OPTION,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def retries_of(params: dict[str, Any], profile: ClusterProfile | None = None) -> Retries:
    """The Retries the options ask for (hpcjob.runner.Retries): --retries, else the cluster `profile`'s
    retries, else none."""
    from hpcjob.job.spec import parse_duration
    from hpcjob.runner import Retries

    node_wait = parse_duration(params["node_wait"], "--node-wait")
    retries = params["retries"]
    if retries is None:
        retries = (profile.retries if profile is not None else None) or 0
    return Retries(retries, params["retry_on"], node_wait_s=float(node_wait), max_cost_usd=params["max_cost"])


def smb_options(command: F) -> F:
    """How to reach the share over SMB; the password comes from HPCJOB_SMB_PASSWORD or a prompt."""
    options = [
        click.option("--smb-user", type=TEXT, metavar="USER", help="SMB user [default: $HPCJOB_SMB_USER]."),
        click.option(
            "--smb-server", type=TEXT, metavar="HOST", help="Connect here instead of the share's host name."
        ),
        click.option(
            "--smb-port", type=PORT, metavar="PORT", default=445, show_default=True, help="SMB port."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def pull_options(command: F) -> F:
    """--pull and --pull-to: the run's results brought home once it has ended (run, submit --wait)."""
    options = [
        click.option(
            "--pull",
            is_flag=True,
            help="Once the run has ended, copy its checkpoints, outputs and logs here, as `hpcjob pull`.",
        ),
        click.option(
            "--pull-to",
            type=TEXT,
            metavar="DIR",
            help="Pull them into DIR (implies --pull) [default: ./RUN_ID].",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def pull_after(summary: JobSummary, pull_to: str | None, progress: Callable[[str], None]) -> int:
    """The run's results pulled once it has ended (--pull), unless it was canceled: the exit code to end
    with, the run's, else 1 when they could not be pulled (said in one line, with how to try again)."""
    from hpcjob.job.results import State
    from hpcjob.job.spec import HpcjobError
    from hpcjob.runner import pull_run

    run_id, exit_code = summary.run_id, summary.exit_code
    if summary.state == State.CANCELED:
        progress(
            f"hpcjob: run {run_id} was canceled: nothing pulled (`hpcjob pull {run_id}` copies what is there)"
        )
        return exit_code
    try:
        report = pull_run(run_id, pull_to, progress=progress)
    except (HpcjobError, OSError) as exc:
        reason = exc if isinstance(exc, HpcjobError) else f"{exc.strerror or exc}"
        click.echo(
            f"hpcjob: error: run {run_id} ended, but its results were not pulled: {reason} (try again: "
            f"hpcjob pull {run_id})",
            err=True,
        )
        return exit_code or 1
    progress(report.line())
    return exit_code


def local_folder(path: str, option: str) -> Path:
    """A folder here that hpcjob may create: not a file, and not below one."""
    from hpcjob.job.spec import SpecError

    folder = Path(path).expanduser().resolve()
    for step in (folder, *folder.parents):
        if step.exists():
            if not step.is_dir():
                raise SpecError(f"{option} {path}: {step} is a file, not a folder")
            return folder
    return folder


def unknown_option(word: str) -> str:
    """An option the command does not have, in one line, with the nearest one it has (the words after
    the script's name are the script's: only a word before it gets here)."""
    context = click.get_current_context()
    known = [
        o for p in context.command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)
    ]
    name = word.split("=", 1)[0]
    # Fewest edits (two letters swapped is one), then the same length: --nodse is --nodes, not --node.
    (edits, _), nearest = min(((_edits(name, o), abs(len(o) - len(name))), o) for o in known)
    hint = f" (did you mean {nearest}?)" if edits <= max(1, len(name) // 4) else ""
    return f"no such option {name}{hint}: see hpcjob {context.info_name} --help"


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


def named_or_newest(run: str | None) -> str:
    """The run a command was given, else this machine's newest, said on stderr."""
    if run is not None:
        return run
    from hpcjob.store.runs import newest_run

    newest = newest_run().run_id
    click.echo(f"hpcjob: run {newest}, the newest of this machine", err=True)
    return newest


def build_spec(params: dict[str, Any]) -> JobSpec:
    """The JobSpec from the job options; checks that the script exists."""
    from hpcjob.runner import job_spec

    return job_spec(job_fields(params))


def job_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The job options by their JobSpec names, parsed (the share stays a UNC)."""
    from hpcjob.job.spec import (
        DEFAULT_COMMAND_LIMIT,
        DEFAULT_MOUNT_OPTIONS,
        SpecError,
        parse_duration,
        parse_env,
        parse_hang_timeout,
    )

    script = Path(params["script"])
    if not script.is_file():  # before its requirements.txt is looked for beside it
        if params["script"].startswith("-"):  # before the script, every word is hpcjob's: a typo
            raise SpecError(unknown_option(params["script"]))
        raise SpecError(f"script {params['script']} does not exist")
    fields: dict[str, Any] = {
        "script": str(script),
        "script_args": tuple(params["script_args"]),
        "name": params["name"] or "",  # TEXT: never an empty string, only None
        "nodes": params["nodes"],
        "node_names": tuple(params["node_names"]),
        "node_group": params["node_group"],
        "nproc_per_node": params["nproc_per_node"],
        "gpus_per_node": params["gpus_per_node"],
        "share": params["share"],
        "mount_options": DEFAULT_MOUNT_OPTIONS
        if params["mount_options"] is None
        else params["mount_options"],
        "job_folder": params["job_folder"] or "",
        "rdzv_join_timeout": params["rdzv_timeout"],
        "rdzv_last_call": params["rdzv_last_call"],
        "rdzv_keep_alive": params["rdzv_keep_alive"],
        "max_restarts": params["max_restarts"],
        "min_nodes": params["min_nodes"],
        "env": parse_env(params["env_items"]),
        "secrets": tuple(params["secrets"]),
        "python": params["python"],
        "command_limit": DEFAULT_COMMAND_LIMIT
        if params["command_limit"] is None
        else params["command_limit"],
        "runtime_s": parse_duration(params["runtime"]) if params["runtime"] else None,
        "hang_timeout_s": parse_hang_timeout(params["hang_timeout"]) if params["hang_timeout"] else None,
        "priority": params["priority"],
        "job_template": params["job_template"],
        "exclude_nodes": tuple(params["exclude_nodes"]),
        "requirements": requirements_text(script, params["requirements"], params["no_env"]),
        "wheelhouse": wheelhouse_target(params["wheelhouse"]),
        "resume_from": params["resume_from"],
        "data_nodes": params["data_nodes"] or len(params["data_node_names"]),
        "data_node_names": tuple(params["data_node_names"]),
        "data_node_group": params["data_node_group"],
    }
    if params["data_port"] is not None:
        fields["data_port"] = params["data_port"]
    if params["data_wait"]:
        fields["data_wait_s"] = float(parse_duration(params["data_wait"], "--data-wait"))
    for key in ("env_on", "node_env_dir", "image", "docker_gpus", "docker_options", "vm_size"):  # or profile
        if params.get(key):
            fields[key] = params[key]
    if params["mount_point"]:
        fields["mount_point"] = params["mount_point"]
    if params.get("owner"):  # a cluster user's (hpcjob.runner.with_profile, render_owner)
        fields["owner"] = params["owner"]
    if params["rdzv_port"] is not None:
        fields["rdzv_port"] = params["rdzv_port"]
    return fields


tag_option = click.option(
    "--tag",
    "tag_items",
    multiple=True,
    type=TEXT,
    metavar="KEY=VALUE",
    help="Label the run in this machine's history (`hpcjob runs --tag KEY=VALUE`), repeatable.",
)


def started_command() -> str:
    """The hpcjob command line as it was given, for the run's history: hpcjob takes no secret as an
    argument, but the script's arguments and --env values are there as the user gave them."""
    return shlex.join(["hpcjob", *sys.argv[1:]])


cluster_option = click.option(
    "--cluster",
    "cluster_name",
    type=TEXT,
    metavar="NAME",
    help="Cluster profile [default: $HPCJOB_CLUSTER, else the configured default].",
)

backend_option = click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(CLUSTER_BACKENDS),
    help="How to reach the head node [default: as the cluster profile says].",
)
