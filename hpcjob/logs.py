"""Reading a run's per-node stdout/stderr files from the share, whichever backend ran it.

The log folder holds `<NODE>.out` and `<NODE>.err` (the tasks' StdOutFilePath/StdErrFilePath),
`<NODE>.exit` written by each task as it ends (hpcjob/node/node.sh), and `summary.json` when the
local backend ran the job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from hpcjob.backends.base import RootCause, parse_exit_records
from hpcjob.share import ShareFolder

SUMMARY_FILE = "summary.json"
# Where the worker shim records failing ranks (hpcjob/node/node.sh sets HPCJOB_EXIT_DIR to it).
EXIT_RECORDS = ".hpcjob-exits"


@dataclass
class Tail:
    """The lines appended to one file since the last look; a line is shown once it is complete."""

    folder: ShareFolder
    relative: str
    prefix: str
    offset: int = 0
    partial: bytes = b""

    def read(self, final: bool = False) -> list[str]:
        try:
            data = self.folder.read_bytes(self.relative, self.offset)
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = b"" if final else lines.pop()
        if final and lines and lines[-1] == b"":
            lines.pop()
        return [self.prefix + line.decode("utf-8", "replace") for line in lines]


def node_tails(folder: ShareFolder, log_folder: str, node: str) -> list[Tail]:
    """A node's stdout and stderr; `log_folder` is relative to `folder` ("" for the folder itself)."""
    base = f"{log_folder}/{node}" if log_folder else node
    return [Tail(folder, f"{base}.out", f"[{node}] "), Tail(folder, f"{base}.err", f"[{node} err] ")]


class RunLogs:
    """The logs of one run: its nodes' files and whether the run has ended."""

    def __init__(self, folder: ShareFolder, log_folder: str, nodes: Sequence[str]) -> None:
        self.folder = folder
        self.log_folder = log_folder
        self.nodes = list(nodes) or self._nodes_found()
        self.tails = [tail for node in self.nodes for tail in node_tails(folder, log_folder, node)]

    def _nodes_found(self) -> list[str]:
        try:
            names = self.folder.listdir(self.log_folder)
        except FileNotFoundError:
            return []
        return sorted({n.rsplit(".", 1)[0] for n in names if n.endswith((".out", ".err"))})

    def read(self, final: bool = False) -> list[str]:
        return [line for tail in self.tails for line in tail.read(final)]

    def ended(self) -> int | None:
        """The run's exit code once it has ended, else None.

        The local backend's summary says so; otherwise every node's task wrote its exit code (node
        names are matched ignoring case: HPC Pack may spell them differently from the job file).
        """
        try:
            summary = json.loads(self.folder.read_bytes(f"{self.log_folder}/{SUMMARY_FILE}"))
            return int(summary["exit_code"])
        except (FileNotFoundError, ValueError, KeyError):
            pass
        codes = self.exit_codes()
        if self.nodes and all(node.upper() in codes for node in self.nodes):
            return next((code for code in codes.values() if code != 0), 0)
        return None

    def root_cause(self) -> RootCause | None:
        """The rank that failed first in the whole job, if any rank recorded a failure."""
        return read_root_cause(self.folder, self.log_folder)

    def exit_codes(self) -> dict[str, int]:
        """Exit codes of the tasks that have ended, by upper-case node name."""
        try:
            names = self.folder.listdir(self.log_folder)
        except FileNotFoundError:
            return {}
        codes = {}
        for name in names:
            if name.endswith(".exit"):
                try:
                    codes[name[: -len(".exit")].upper()] = int(
                        self.folder.read_bytes(f"{self.log_folder}/{name}")
                    )
                except (FileNotFoundError, ValueError):
                    continue
        return codes


def read_root_cause(folder: ShareFolder, log_folder: str) -> RootCause | None:
    records_folder = f"{log_folder}/{EXIT_RECORDS}" if log_folder else EXIT_RECORDS
    try:
        names = folder.listdir(records_folder)
    except FileNotFoundError:
        return None
    lines: list[str] = []
    for name in names:
        try:
            lines.extend(
                folder.read_bytes(f"{records_folder}/{name}").decode("utf-8", "replace").splitlines()
            )
        except FileNotFoundError:
            continue
    return parse_exit_records(lines)
