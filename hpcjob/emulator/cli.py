"""``python -m hpcjob.emulator``: run an emulated head node until SIGINT or SIGTERM.

Prints the API URL on the first line and the CA file (PEM) on the second, then serves. The password of
``--user`` comes from the environment variable HPCJOB_EMULATOR_PASSWORD, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from hpcjob.emulator.cluster import NodeSpec
from hpcjob.emulator.headnode import PASSWORD_ENV, HeadNode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpcjob.emulator",
        description="An HPC Pack 2019 REST head node on this machine; tasks run as local processes.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    parser.add_argument(
        "--nodes-file",
        help="JSON list of nodes as GET /cluster/nodes returns them: Name, State, Health, Cores, Groups...",
    )
    parser.add_argument("--user", required=True, help=f"the Basic-auth user; password from ${PASSWORD_ENV}")
    parser.add_argument("--grace-period", type=float, default=5.0, help="seconds from SIGINT to SIGKILL (5)")
    parser.add_argument("--domain", default="HPC", help="domain of job owners (DOMAIN\\user); '' for none")
    parser.add_argument("--step-delay", type=float, default=0.0, help="minimum seconds in each queue state")
    parser.add_argument("--command-line-limit", type=int, default=480, help="0 for no limit (default 480)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    password = os.environ.pop(PASSWORD_ENV, None)  # tasks inherit the environment: drop it at once
    if not password:
        print(f"error: set {PASSWORD_ENV} to the password of {args.user}", file=sys.stderr)
        return 2
    nodes: list[NodeSpec] | None = None
    if args.nodes_file:
        try:
            with open(args.nodes_file, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, list):
                raise ValueError("the nodes file must hold a JSON list of nodes")
            nodes = [NodeSpec.from_json(item) for item in data]
        except (OSError, ValueError, TypeError) as err:
            print(f"error: {args.nodes_file}: {err}", file=sys.stderr)
            return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with HeadNode(
            nodes,
            users={args.user: password},
            grace_period=args.grace_period,
            host=args.host,
            port=args.port,
            domain=args.domain or None,
            step_delay=args.step_delay,
            command_line_limit=args.command_line_limit or None,
        ) as head:
            print(head.url, flush=True)
            print(head.ca_file, flush=True)
            while not stop.wait(0.5):
                pass
    except (OSError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
