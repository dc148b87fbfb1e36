"""The `hpcjob` command line: parse, call, print. Thin on purpose.

Imports only click and the standard library at start-up, so `hpcjob --help` stays fast; the core and
the backends are imported by the commands that use them.
"""

from hpcjob.cli import cluster, commands, doctor, onboard, power, prices, runs
from hpcjob.cli.app import cli, main

__all__ = ["cli", "cluster", "commands", "doctor", "main", "onboard", "power", "prices", "runs"]
