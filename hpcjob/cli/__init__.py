"""The `hpcjob` command line: parse, call, print. Thin on purpose.

Imports only click and the standard library at start-up, and each command's module when that command
runs (hpcjob.cli.app.COMMAND_MODULES), so `hpcjob --help` and every command start fast; the core and
the backends are imported by the commands that use them.
"""

from hpcjob.cli.app import cli, main

__all__ = ["cli", "main"]
