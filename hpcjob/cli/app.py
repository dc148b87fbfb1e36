"""The `hpcjob` command group and its entry point."""

from __future__ import annotations

import sys

import click

from hpcjob.cli.options import HelpGroup


@click.group(
    cls=HelpGroup,
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
    from hpcjob.runner import close_backends

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
        close_backends()
