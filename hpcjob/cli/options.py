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

from hpcjob.job.options import DATA, DATASETS, FAILURE, NODES, SHAPE, SHARE, SOFTWARE
from hpcjob.job.options import job_options as table
from hpcjob.job.spec import CLUSTER_BACKENDS

if TYPE_CHECKING:
    from hpcjob.job.options import JobOptions, Option
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

# The headings a command's --help lists its options under, in this order (HelpCommand); the job options'
# own are the table's (hpcjob.job.options).
THE_CLUSTER = "The cluster"
AZURE = "Azure resources"
CREDENTIALS = "Credentials and TLS"
FILTER = "Execution filter (HPC administrators, with --install)"
OUTPUT = "Output"
OTHER = "Other options"
HEADINGS = (
    THE_CLUSTER,
    AZURE,
    CREDENTIALS,
    SHAPE,
    NODES,
    DATA,
    DATASETS,
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


# The heading of each option this module defines (and of --json), by parameter name, in the order
# --help lists them under each heading: the job options' in the table's order (hpcjob.job.options); a
# command gives its own options' headings (HelpCommand's `groups`).
GROUPS = {
    **headed({NODES: "cluster_name backend_kind", FAILURE: "retries retry_on node_wait max_cost"}),
    **{name: how.heading for name, how in table() if how.flag is not None},
    **headed({SHARE: "smb_user smb_server smb_port", OUTPUT: "as_json tag_items pull pull_to"}),
}


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
    """The options that describe a job, shared by every command that builds one: one each of the job
    options' table that has a flag (hpcjob.job.options.JobOptions), then SCRIPT and its arguments."""
    options = [_click_option(name, how) for name, how in table() if how.flag is not None]
    options += [
        click.argument("script", type=click.Path(dir_okay=False)),
        click.argument("script_args", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _click_option(name: str, how: Option) -> Callable[[F], F]:
    """The click option of one job option: its flag, bounds or choices, help and metavar from the table;
    the value stays as given (text, a number) for JobOptions.read."""
    from hpcjob.job.options import CHOICE, COUNT, NAMES, PAIRS, SWITCH

    assert how.flag is not None
    flags = (how.short, how.flag) if how.short else (how.flag,)
    kind: dict[str, Any] = {"metavar": how.metavar}
    if how.kind == SWITCH:
        kind = {"is_flag": True}
    elif how.kind == COUNT:
        kind["type"] = click.IntRange(how.low, how.high)
    elif how.kind == CHOICE:
        kind["type"] = click.Choice(how.choices)
    elif how.kind in (NAMES, PAIRS):
        kind["multiple"] = True
    else:
        kind["type"] = TEXT
    return click.option(*flags, name, help=how.help, **kind)


def job_options_of(params: dict[str, Any]) -> JobOptions:
    """The job's options as the command line gave them (the job options' parameters, SCRIPT and its
    arguments); a word before SCRIPT that is no option is said to be one (a typo)."""
    from hpcjob.job.options import JobOptions
    from hpcjob.job.spec import SpecError

    script = params["script"]
    if not Path(script).is_file() and script.startswith("-"):  # before SCRIPT, every word is hpcjob's
        raise SpecError(unknown_option(script))
    names = ("script", "script_args", *(name for name, how in table() if how.flag is not None))
    return JobOptions.read({name: params[name] for name in names})


def job_spec_of(params: dict[str, Any], profile: ClusterProfile | None = None) -> JobSpec:
    """The JobSpec of the command line's job options, the cluster `profile` filling in (if any); the
    requirements file it takes said on stderr."""
    from hpcjob.runner import job_spec

    return job_spec(job_options_of(params), profile, progress=lambda line: click.echo(line, err=True))


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
    from hpcjob.job.options import did_you_mean

    context = click.get_current_context()
    known = [
        o for p in context.command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)
    ]
    name = word.split("=", 1)[0]
    return f"no such option {name}{did_you_mean(name, known)}: see hpcjob {context.info_name} --help"


def named_or_newest(run: str | None) -> str:
    """The run a command was given, else this machine's newest, said on stderr."""
    if run is not None:
        return run
    from hpcjob.store.runs import newest_run

    newest = newest_run().run_id
    click.echo(f"hpcjob: run {newest}, the newest of this machine", err=True)
    return newest


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
