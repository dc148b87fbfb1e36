"""``python -m hpcjob.emulator``: run an emulated head node until SIGINT or SIGTERM.

Prints the API URL on the first line and the CA file (PEM) on the second, then the `hpcjob cluster add`
command that makes a profile for it, then serves. The password of ``--user`` comes from the environment
variable HPCJOB_EMULATOR_PASSWORD, never from the command line.

Its nodes are processes of this machine: the share is a folder here (``--share-dir``), "mounted" on every
node at the same path, and ``python3`` on the nodes is the emulator's own Python (its folder comes first
in the nodes' PATH), the one that has torch.

With ``--stdin-commands`` it reads commands from stdin, one a line, and answers each with one line on
stdout (``ok: ...`` or ``error: ...``): ``lose NODE [evicted|unreachable]`` loses a node as
``HeadNode.lose_node`` does, ``restore NODE`` brings it back.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import NoReturn

from hpcjob.emulator.base import ApiError
from hpcjob.emulator.headnode import PASSWORD_ENV, HeadNode
from hpcjob.emulator.jobs import NODE_LOST_MESSAGE
from hpcjob.emulator.nodes import LOSSES, NODE_HEALTHS, UNKNOWN_GROUP_NODES, NodeSpec


class _Parser(argparse.ArgumentParser):
    """Errors as every hpcjob command gives them: one line, exit 2, and no argument echoed back (an
    unknown `--password ...` would otherwise be printed)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments"):
            message = "unrecognized arguments (the password comes only from the environment); see --help"
        _fail(message, 2)


def _fail(message: str, code: int) -> NoReturn:
    print(f"hpcjob: error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more)")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m hpcjob.emulator",
        description="An HPC Pack 2019 head node on this machine, with the REST API and WinRM; tasks run "
        "as local processes.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=0, help="REST API port (default 0: any free port)")
    parser.add_argument("--wsman-port", type=_port, default=0, help="WinRM port (default 0: any free port)")
    parser.add_argument(
        "--nodes-file",
        help="JSON list of nodes as GET /cluster/nodes returns them: Name, State, Health, Cores, Groups...",
    )
    parser.add_argument("--user", required=True, help=f"the user (Basic or NTLM); password: ${PASSWORD_ENV}")
    parser.add_argument("--grace-period", type=float, default=5.0, help="seconds from SIGINT to SIGKILL (5)")
    parser.add_argument("--domain", default="HPC", help="domain of job owners (DOMAIN\\user); '' for none")
    parser.add_argument("--step-delay", type=float, default=0.0, help="minimum seconds in each queue state")
    parser.add_argument("--command-line-limit", type=int, default=480, help="0 for no limit (default 480)")
    parser.add_argument(
        "--share-dir",
        help="the folder that stands in for the head node's CcpSpoolDir share (default: a new temporary one)",
    )
    parser.add_argument(
        "--profile", default="emulator", help="the profile name in the printed commands (and NAME-winrm)"
    )
    parser.add_argument(
        "--unknown-group-node",
        choices=UNKNOWN_GROUP_NODES,
        default="skip",
        help="putting a node the cluster does not know in a group: skip it (Add-HpcGroup's page) or "
        "refuse the request (default skip; REST: UNVERIFIED)",
    )
    light = parser.add_argument_group("nodes that cost almost nothing (hpcjob/emulator/standin.py)")
    light.add_argument(
        "--stand-in",
        type=_seconds,
        metavar="SECONDS",
        help="each task's node helper runs, then a stand-in takes torchrun's place for SECONDS (in jobs "
        "that run the nodes' python3): lines, beats, metrics, an exit; no training",
    )
    light.add_argument("--stand-in-fail", metavar="NODE:CODE", help="that node fails halfway with CODE")
    light.add_argument(
        "--stand-in-hang",
        metavar="NODE[:ATTEMPT]",
        help="that node stops halfway (in that attempt of the run only, where given), until killed; the "
        "others then block",
    )
    lost = parser.add_argument_group("lost nodes (see --stdin-commands)")
    lost.add_argument(
        "--detection-delay",
        type=_seconds,
        default=90.0,
        metavar="SECONDS",
        help="how long the head node takes to notice a lost node (90: 30 s heartbeats x 3 missed)",
    )
    lost.add_argument(
        "--unreachable-health",
        choices=NODE_HEALTHS,
        default="Error",
        help="a noticed lost node's health through REST (default Error; UNVERIFIED)",
    )
    lost.add_argument(
        "--node-lost-message",
        default=NODE_LOST_MESSAGE,
        metavar="TEXT",
        help="the ErrorMessage of a task its lost node took; {node} is its name (UNVERIFIED wording)",
    )
    lost.add_argument(
        "--job-retry-count",
        type=_count,
        default=0,
        metavar="N",
        help="JobRetryCount: requeue a job that failed for a lost node up to N times (default 0)",
    )
    lost.add_argument(
        "--auto-requeue-delay",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how long such a job stays Failed before it is queued again (default 2)",
    )
    lost.add_argument(
        "--stdin-commands",
        action="store_true",
        help="read 'lose NODE [evicted|unreachable]' and 'restore NODE' lines from stdin",
    )
    return parser


def serve_commands(head: HeadNode, lines: Iterable[str], answer: Callable[[str], None]) -> None:
    """Do each command line (`lose NODE [evicted|unreachable]`, `restore NODE`; blank lines and
    `#` comments are skipped) and `answer` it in one line: `ok: ...` or `error: ...`."""
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        verb, args = words[0].lower(), words[1:]
        try:
            if verb == "lose" and len(args) in (1, 2) and (len(args) == 1 or args[1] in LOSSES):
                how = args[1] if len(args) == 2 else "evicted"
                head.lose_node(args[0], how)  # type: ignore[arg-type]
                answer(f"ok: {args[0]} {how}")
            elif verb == "restore" and len(args) == 1:
                head.restore_node(args[0])
                answer(f"ok: {args[0]} restored")
            else:
                usage = "lose NODE [evicted|unreachable] or restore NODE"
                answer(f"error: not a command: {' '.join(words)!r}; {usage}")
        except (ValueError, ApiError) as err:
            answer(f"error: {' '.join(str(err).split())}")


def profile_command(
    profile: str,
    url: str,
    user: str,
    ca_file: str,
    share_dir: str,
    group: str | None,
    wsman_url: str | None = None,
) -> str:
    """The `hpcjob cluster add` line for this head node: its URL (over WinRM when `wsman_url` is given),
    CA, and the share as a folder here. Its jobs are this machine's processes: asked every second, and
    marked as this machine's (--nodes-here), so that each job's rendezvous gets a free port of its own."""
    words = ["hpcjob", "cluster", "add", profile, "--url", url.removesuffix("/hpc"), "--user", user]
    if wsman_url is not None:
        words += ["--backend", "winrm", "--winrm-url", wsman_url]
    words += ["--password-env", PASSWORD_ENV, "--ca-bundle", ca_file, "--share", "//HEADNODE/CcpSpoolDir"]
    words += ["--local-share", share_dir, "--mount-point", share_dir, "--poll-interval", "1", "--nodes-here"]
    return shlex.join(words + (["--node-group", group] if group else []))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    password = os.environ.pop(PASSWORD_ENV, None)  # tasks inherit the environment: drop it at once
    if not password:
        _fail(f"set {PASSWORD_ENV} to the password of {args.user}", 2)
    nodes: list[NodeSpec] | None = None
    if args.nodes_file:
        try:
            with open(args.nodes_file, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, list):
                raise ValueError("the nodes file must hold a JSON list of nodes")
            nodes = [NodeSpec.from_json(item) for item in data]
        except (OSError, ValueError, TypeError) as err:
            _fail(f"{args.nodes_file}: {err}", 2)
    try:
        socket.getaddrinfo(args.host, args.port)
    except (OSError, UnicodeError):
        _fail(f"--host {args.host!r} is not an address or a name of this machine", 2)
    share_dir = os.path.abspath(args.share_dir or tempfile.mkdtemp(prefix="hpcjob-emulator-share-"))
    if not os.path.isdir(share_dir):
        _fail(f"--share-dir {share_dir}: no such folder", 2)
    # The nodes are this machine: `python3` on them is this Python, which has what hpcjob needs.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    if args.stand_in is not None:
        from hpcjob.emulator.standin import stand_in_env

        folder = tempfile.mkdtemp(prefix="hpcjob-emulator-stand-in-")
        env = stand_in_env(
            folder, env, seconds=args.stand_in, fail=args.stand_in_fail, hang=args.stand_in_hang
        )
    elif args.stand_in_fail or args.stand_in_hang:
        _fail("--stand-in-fail and --stand-in-hang go with --stand-in SECONDS", 2)
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
            wsman_port=args.wsman_port,
            domain=args.domain or None,
            step_delay=args.step_delay,
            command_line_limit=args.command_line_limit or None,
            env=env,
            detection_delay_s=args.detection_delay,
            unreachable_health=args.unreachable_health,
            node_lost_message=args.node_lost_message,
            job_retry_count=args.job_retry_count,
            auto_requeue_delay_s=args.auto_requeue_delay,
            unknown_group_node=args.unknown_group_node,
        ) as head:
            print(head.url, flush=True)
            print(head.ca_file, flush=True)
            group = "GPUNodes" if nodes is None else None  # a nodes file names its own groups
            where = (args.user, head.ca_file, share_dir, group)
            print(f"# cluster profiles for it (the password stays in ${PASSWORD_ENV}):", flush=True)
            print(profile_command(args.profile, head.url, *where), flush=True)
            winrm = profile_command(f"{args.profile}-winrm", head.url, *where, wsman_url=head.wsman_url)
            print(winrm, flush=True)
            if args.stdin_commands:
                threading.Thread(
                    target=serve_commands,
                    args=(head, sys.stdin, lambda line: print(line, flush=True)),
                    name="hpcjob-emulator-commands",
                    daemon=True,
                ).start()
            while not stop.wait(0.5):
                pass
    except (OSError, RuntimeError, ValueError) as err:
        _fail(str(err), 1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
