"""The `hpcjob` command group and its entry point."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from hpcjob.cli.options import HelpGroup

# Each command's module (hpcjob/cli/<module>.py, which adds it to its group when imported), by group:
# a command line imports only the module of the command it runs (the help, all of them), and starts
# about twice as fast as with every command built (issue 42: `hpcjob runs --last 20` under 200 ms).
COMMAND_MODULES: dict[str, dict[str, str]] = {
    "hpcjob": {
        "run": "commands", "render": "commands", "logs": "commands", "pull": "commands",
        "submit": "cluster", "status": "cluster", "wait": "cluster", "cancel": "cluster",
        "nodes": "cluster", "mount": "cluster", "emulator": "cluster",
        "doctor": "doctor", "prices": "prices", "runs": "runs",
    },
    "cluster": {
        "add": "cluster", "list": "cluster", "remove": "cluster",
        "onboard": "onboard", "grow": "onboard", "delete": "onboard",
        "start": "power", "stop": "power",
    },
}  # fmt: skip


class LazyGroup(HelpGroup):
    """A group whose commands are imported when asked for (COMMAND_MODULES)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modules = COMMAND_MODULES.get(kwargs.get("name") or "hpcjob", {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.modules})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.modules:
            importlib.import_module(f"hpcjob.cli.{self.modules[cmd_name]}")
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=LazyGroup,
    name="hpcjob",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
    Examples:
      hpcjob run --local -n 2 train.py --epochs 1  # two nodes on this machine
      hpcjob cluster add lab --url https://headnode --user 'CONTOSO\\alice'
      hpcjob doctor                                # is the cluster fit?
      hpcjob run -n 2 --gpus-per-node 4 train.py   # on the cluster
      hpcjob COMMAND --help                        # each command's options
    """,
)
@click.version_option(package_name="hpcjob")
def cli() -> None:
    """Run PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters.

    A job is one single-node torchrun task per node, pinned to its node, all with the same command
    and c10d rendezvous on the first node, over code on the head node's share.
    Options go before SCRIPT; everything after SCRIPT goes to the script.
    """


@cli.group(
    cls=LazyGroup,
    name="cluster",
    short_help="Cluster profiles: head node, user, TLS, share, node group.",
    epilog="""\b
    Examples:
      hpcjob cluster add lab --url https://headnode --user 'CONTOSO\\alice' \\
          --share //HEADNODE/CcpSpoolDir --node-group GPUNodes --default
      hpcjob cluster list
    """,
)
def cluster() -> None:
    """Cluster profiles: the head node's URL, user, TLS, share and node group (never a password)."""


def _show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    click.echo(f"hpcjob: warning: {message}", err=True)


def main() -> None:
    """Entry point: errors are one line on stderr; bad input exits 2, other errors 1. hpcjob's warnings
    (hpcjob.runner.HpcjobWarning) are one line each; every head node opened is let go of at the end."""
    import warnings

    from hpcjob.job.spec import HpcjobError, SpecError

    warnings.showwarning = _show_warning
    try:
        cli.main(prog_name="hpcjob", standalone_mode=False)
    except SpecError as exc:
        click.echo(f"hpcjob: error: {exc}", err=True)
        sys.exit(2)
    except HpcjobError as exc:  # the cluster or the share said no: not the user's input
        click.echo(f"hpcjob: error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("hpcjob: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        message = exc.format_message()
        if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            # The message is the whole help: one line instead, and where the help is.
            context = getattr(exc, "ctx", None)
            path = context.command_path if context else "hpcjob"
            message = f"missing command: see `{path} --help`"
        click.echo(f"hpcjob: error: {' '.join(message.split())}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # a file or folder the checks before could not foresee
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"hpcjob: error: {exc.strerror or exc}{where}", err=True)
        sys.exit(1)
    finally:
        access = sys.modules.get("hpcjob.runner.access")  # where head nodes are opened, if any was
        if access is not None:
            access.close_backends()
