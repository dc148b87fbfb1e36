"""Reading a run's per-node stdout/stderr files from the share, whichever backend ran it.

The log folder holds `<NODE>.out` and `<NODE>.err` (the tasks' StdOutFilePath/StdErrFilePath),
`<NODE>.exit` ("<exit code> <time>") written by each task as it ends (hpcjob/node/node.sh), the worker
shim's records of failed ranks in `.hpcjob-exits/`, and `summary.json` when the local backend ran the job.

Every file there is read as untrusted input (whoever can write the share could have written it):
through ShareFolder.read_capped, a bounded number of bytes each (a tail from the end), regular files
only; one that cannot be read, or says nothing hpcjob can take, is skipped alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hpcjob.job.datasets import DONE_FOLDER, DatasetCopy, dataset_copies
from hpcjob.job.hangs import Beat
from hpcjob.job.results import (
    GpuUse,
    RootCause,
    TaskEnd,
    find_metrics,
    first_failure,
    gpu_use_of_run,
    latest_gpu_use,
    parse_exit_records,
    signal_of_exit_code,
    untrusted_json,
)
from hpcjob.job.tracebacks import RANK_PREFIX, cause_of, plain_reason
from hpcjob.store.share import ShareEntry, ShareFolder, UnreadableFile

SUMMARY_FILE = "summary.json"
# Where the training program writes each rank's metrics over time (training/timeline.py).
TIMELINE_FOLDER = "metrics"
# Where the worker shim records failing ranks (hpcjob/node/node.sh sets HPCJOB_EXIT_DIR to it).
EXIT_RECORDS = ".hpcjob-exits"
# Where each rank beats when the job has a --hang-timeout (HPCJOB_BEAT_DIR), and the file in it that asks
# the ranks to dump their flight recorders.
BEATS_FOLDER = ".hpcjob-beats"
DUMP_REQUEST = "dump"
# How much of the end of a node's stderr is searched for the line that says why it failed, and of a
# rank's stacks is read.
REASON_BYTES = 64 * 1024
# The most read of each other file: a beat (a line per process group), a `.exit` or a rank's exit record
# (one line), the local backend's summary, the end of a node's stdout where the metrics and the GPUs'
# latest figures are, a rank's timeline (its newest lines), and a followed output at each look.
BEAT_BYTES = 1 << 20
RECORD_BYTES = 4 * 1024
SUMMARY_BYTES = 4 << 20
OUTPUT_TAIL_BYTES = 8 << 20
TIMELINE_BYTES = 16 << 20
DONE_BYTES = 64 << 10  # a task's dataset figures: a line a source
FOLLOW_BYTES = 4 << 20
# A line longer than this is shown in pieces: what a Tail keeps between looks stays bounded.
LINE_BYTES = 1 << 20
# A Python exception line (`module.SomeError: message`), and torchrun's own wrapper of a worker's
# failure, which says only that a worker failed.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")
_WRAPPER = re.compile(r"ChildFailedError")


@dataclass
class Tail:
    """The lines appended to one file since the last look; a line is shown once it is complete."""

    folder: ShareFolder
    relative: str
    prefix: str
    offset: int = 0
    partial: bytes = b""

    def read(self, final: bool = False) -> Iterator[str]:
        """The new lines: at most FOLLOW_BYTES of them a look, and once `final`, all the rest, handed on
        a piece at a time (a node's output of any size costs FOLLOW_BYTES here, not its size)."""
        while True:
            try:
                data = self.folder.read_capped(self.relative, FOLLOW_BYTES, offset=self.offset)
            except UnreadableFile:  # not there (yet), or not a file hpcjob reads
                data = b""
            self.offset += len(data)
            pieces = (self.partial + data).split(b"\n")
            self.partial = pieces.pop()
            while len(self.partial) >= LINE_BYTES:
                pieces.append(self.partial[:LINE_BYTES])
                self.partial = self.partial[LINE_BYTES:]
            yield from (self.prefix + line.decode("utf-8", "replace") for line in pieces)
            if not final or len(data) < FOLLOW_BYTES:
                break
        if final and self.partial:
            line, self.partial = self.partial, b""
            yield self.prefix + line.decode("utf-8", "replace")


def node_tails(folder: ShareFolder, log_folder: str, node: str) -> list[Tail]:
    """A node's stdout and stderr, each line prefixed as `output_line` says; `log_folder` is relative to
    `folder` ("" for the folder itself)."""
    base = f"{log_folder}/{node}" if log_folder else node
    return [
        Tail(folder, f"{base}.out", output_line(node, "stdout", "")),
        Tail(folder, f"{base}.err", output_line(node, "stderr", "")),
    ]


def output_line(node: str, stream: str, line: str) -> str:
    """A node's line as hpcjob shows it: `[NODE] line`, `[NODE err] line` from its stderr."""
    return f"[{node}{' err' if stream == 'stderr' else ''}] {line}"


# A node's output is read when the folder's listing says it grew, and at least every this many looks
# anyway: a Windows server may list a file that a node keeps open for writing at an older size (NTFS
# updates a directory entry lazily: UNVERIFIED over SMB for the head node's share).
UNCHANGED_LOOKS = 10


class RunLogs:
    """The logs of one run: its nodes' files and whether the run has ended.

    What it reads of the share does not grow with the nodes where it need not (issue 42): a follower
    calls `look()` once a poll, one listing of the log folder, and the poll's reads take from it what
    changed: the outputs that grew (each also every UNCHANGED_LOOKS looks), the exit records not read
    yet (each is written once), the local backend's summary once it is there."""

    def __init__(self, folder: ShareFolder, log_folder: str, nodes: Sequence[str]) -> None:
        self.folder = folder
        self.log_folder = log_folder
        self.nodes = list(nodes) or self._nodes_found()
        self._streams = [
            (node, stream, Tail(folder, _join(log_folder, f"{node}.{ending}"), ""))
            for node in self.nodes
            for stream, ending in (("stdout", "out"), ("stderr", "err"))
        ]
        self._listed: dict[str, ShareEntry] | None = None
        self._looks = 0
        # Each exit record read, by file name, with its time and size as listed: read again only where
        # they changed (a job HPC Pack requeued writes its tasks' records again).
        self._ends: dict[str, tuple[int, int, TaskEnd]] = {}

    def look(self) -> None:
        """List the log folder once: what the reads until the next look go by."""
        self._looks += 1
        try:
            self._listed = {entry.name: entry for entry in self.folder.scan(self.log_folder)}
        except OSError:  # not there yet, or not a folder hpcjob reads
            self._listed = {}

    def _listing(self) -> dict[str, ShareEntry]:
        if self._listed is None:
            self.look()
        assert self._listed is not None
        return self._listed

    def _nodes_found(self) -> list[str]:
        try:
            names = self.folder.listdir(self.log_folder)
        except FileNotFoundError:
            return []
        return sorted({n.rsplit(".", 1)[0] for n in names if n.endswith((".out", ".err"))})

    def lines(self, final: bool = False) -> Iterator[tuple[str, str, str]]:
        """The lines written since they were last read, as (node, "stdout" or "stderr", line), node by
        node: of the files the last look saw grow (`final`: of every file, to its end)."""
        listed = self._listing()
        for index, (node, stream, tail) in enumerate(self._streams):
            if not final:
                entry = listed.get(tail.relative.rpartition("/")[2])
                if entry is None or entry.kind != "file":
                    continue
                if entry.size <= tail.offset and (self._looks + index) % UNCHANGED_LOOKS:
                    continue
            for line in tail.read(final):
                yield node, stream, line

    def ended(self) -> int | None:
        """The run's exit code once it has ended, else None.

        The local backend's summary says so; otherwise every node's task wrote its exit code (node
        names are matched ignoring case: HPC Pack may spell them differently from the job file).
        """
        try:
            if SUMMARY_FILE in self._listing():  # the local backend's
                summary = untrusted_json(
                    self.folder.read_capped(_join(self.log_folder, SUMMARY_FILE), SUMMARY_BYTES)
                )
                if isinstance(summary, dict):
                    return int(summary["exit_code"])
        except (UnreadableFile, ValueError, KeyError, TypeError):
            pass
        codes = self.exit_codes()
        if self.nodes and all(node.upper() in codes for node in self.nodes):
            return next((code for code in codes.values() if code != 0), 0)
        return None

    def root_cause(self) -> RootCause | None:
        """The rank that failed first in the whole job, if any rank recorded a failure."""
        return read_root_cause(self.folder, self.log_folder)

    def exit_codes(self) -> dict[str, int]:
        """Exit codes of the tasks that have ended, by upper-case node name: the records the last look
        saw, each read once."""
        listed = self._listing()
        new = [
            name
            for name, entry in listed.items()
            if name.endswith(".exit") and self._ends.get(name, (0, 0))[:2] != (entry.mtime_ns, entry.size)
        ]
        for end in read_task_ends(self.folder, self.log_folder, new):
            name = f"{end.node}.exit"
            self._ends[name] = (listed[name].mtime_ns, listed[name].size, end)
        return {end.node.upper(): end.exit_code for _, _, end in self._ends.values()}

    def gpu_use(self) -> list[GpuUse]:
        """Per node: the run's GPU use once the metrics line is there, else the ranks' latest figures."""
        lines = [line for node in self.nodes for line in output_tail(self.folder, self.log_folder, node)]
        return gpu_use_of_run(find_metrics(lines)) or latest_gpu_use(lines)

    def _files(self, folder: str, ending: str) -> list[str]:
        """The names in a folder of the run's logs that end so, sorted; none where the folder is not."""
        try:
            return sorted(n for n in self.folder.listdir(folder) if n.endswith(ending))
        except FileNotFoundError:
            return []

    def datasets(self) -> list[DatasetCopy]:
        """What each task copied of the job's datasets (hpcjob/node/datasets.py's figures files)."""
        folder = _join(self.log_folder, DONE_FOLDER)
        copies = []
        for name in self._files(folder, ".json"):
            with contextlib.suppress(UnreadableFile, ValueError):
                copies += dataset_copies(
                    untrusted_json(self.folder.read_capped(f"{folder}/{name}", DONE_BYTES))
                )
        return copies

    def timeline(self) -> list[dict[str, Any]]:
        """Every rank's metrics over time (metrics/*.jsonl, written by the training program; of each, its
        newest TIMELINE_BYTES), in time order; a line cut short or not JSON is skipped."""
        folder = _join(self.log_folder, TIMELINE_FOLDER)
        lines = []
        for name in self._files(folder, ".jsonl"):
            try:
                data = self.folder.read_capped(f"{folder}/{name}", TIMELINE_BYTES, from_end=True)
            except UnreadableFile:
                continue
            for line in _tail_lines(data, TIMELINE_BYTES):
                with contextlib.suppress(ValueError):
                    # A diverged step's NaN loss is dropped, its step kept (timeline_line).
                    clean = timeline_line(untrusted_json(line, null_for_non_finite=True))
                    if clean is not None:
                        lines.append(clean)
        return sorted(lines, key=lambda d: float(d["t"]))


# The timeline's fields and their types (hpctorch.Metrics writes them); others are dropped.
_TIMELINE_TEXT = ("event", "node")
_TIMELINE_INTS = ("rank", "world_size", "restart", "epoch", "step", "first_epoch")


def timeline_line(data: object) -> dict[str, Any] | None:
    """A timeline line with its fields of the right types only (a hand, or another program, may have
    written anything there): the time, text, whole numbers, and finite figures; None without a time."""
    if not isinstance(data, dict) or not _finite(data.get("t")):
        return None
    clean: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TIMELINE_TEXT:
            if isinstance(value, str):
                clean[key] = value
        elif key in _TIMELINE_INTS:
            if isinstance(value, int) and not isinstance(value, bool):
                clean[key] = value
        elif _finite(value):
            clean[key] = float(value)
    return clean


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _join(log_folder: str, name: str) -> str:
    return f"{log_folder}/{name}" if log_folder else name


def _tail_lines(data: bytes, limit: int) -> list[str]:
    """The lines of a file's last `limit` bytes: where the file was longer, the first is cut short and
    dropped (a cut line may still read as JSON)."""
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if len(data) >= limit else lines


def output_tail(folder: ShareFolder, log_folder: str, node: str) -> list[str]:
    """The lines of the end of a node's stdout (its last OUTPUT_TAIL_BYTES), where the training program
    prints its metrics and GPU figures; [] where it cannot be read."""
    try:
        data = folder.read_capped(_join(log_folder, f"{node}.out"), OUTPUT_TAIL_BYTES, from_end=True)
    except UnreadableFile:
        return []
    return _tail_lines(data, OUTPUT_TAIL_BYTES)


def read_task_ends(folder: ShareFolder, log_folder: str, names: Iterable[str] | None = None) -> list[TaskEnd]:
    """Each ended task's `<NODE>.exit`: its exit code and, when the node wrote it, its end time; of the
    files `names` (a listing already made), else of every one in the folder."""
    if names is None:
        try:
            names = folder.listdir(log_folder)
        except FileNotFoundError:
            return []
    ends = []
    for name in names:
        if not name.endswith(".exit"):
            continue
        try:
            fields = folder.read_capped(_join(log_folder, name), RECORD_BYTES).split()
            when = float(fields[1]) if len(fields) > 1 else math.inf
            ends.append(
                TaskEnd(
                    node=name[: -len(".exit")],
                    exit_code=int(fields[0]),
                    time=when if math.isfinite(when) else math.inf,  # "nan" orders nothing: no time
                )
            )
        except (UnreadableFile, ValueError, IndexError):
            continue
    return ends


def read_beats(folder: ShareFolder, log_folder: str, ranks: Iterable[int] | None = None) -> list[Beat]:
    """Each rank's latest beat (none yet: []), or only those of `ranks` (no listing: a read each). A beat
    that cannot be read or taken (being replaced, from another hpcjob, or hostile: not a file, too long,
    NaN, nested too deep, another rank's) is skipped alone: the watch keeps that rank's last beat, and
    goes on with the others'."""
    beats_folder = _join(log_folder, BEATS_FOLDER)
    if ranks is not None:
        names = [f"rank-{rank}.json" for rank in ranks]
    else:
        try:
            names = folder.listdir(beats_folder)
        except FileNotFoundError:
            return []
    beats = []
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            beat = Beat.from_json(untrusted_json(folder.read_capped(f"{beats_folder}/{name}", BEAT_BYTES)))
        except (UnreadableFile, ValueError, KeyError, IndexError, TypeError, RecursionError):
            continue  # RecursionError: what is nested just short of the parser's limit, in str()
        if name == f"rank-{beat.rank}.json":  # a file never speaks for another rank
            beats.append(beat)
    return beats


def request_dumps(folder: ShareFolder, log_folder: str) -> None:
    """Ask every rank that still beats to write where it is and its flight recorder (worker.py)."""
    folder.write_bytes(f"{_join(log_folder, BEATS_FOLDER)}/{DUMP_REQUEST}", b"")


def read_stacks(folder: ShareFolder, log_folder: str, rank: int) -> str | None:
    """Where a rank's threads were when it was asked (None: it has not said)."""
    try:
        data = folder.read_capped(f"{_join(log_folder, BEATS_FOLDER)}/stacks-rank-{rank}.txt", REASON_BYTES)
    except UnreadableFile:
        return None
    return data.decode("utf-8", "replace")


def read_rank_ends(folder: ShareFolder, log_folder: str) -> list[RootCause]:
    """The worker shim's records of the ranks that failed."""
    records_folder = _join(log_folder, EXIT_RECORDS)
    try:
        names = folder.listdir(records_folder)
    except FileNotFoundError:
        return []
    lines: list[str] = []
    for name in names:
        try:
            data = folder.read_capped(f"{records_folder}/{name}", RECORD_BYTES)
        except UnreadableFile:
            continue
        lines.extend(data.decode("utf-8", "replace").splitlines())
    return parse_exit_records(lines)


def reason_line(folder: ShareFolder, log_folder: str, node: str, rank: int | None = None) -> str:
    """The line of a node's stderr that says why it failed: the last exception that is not torchrun's
    wrapper (of `rank`'s, where torch's hook wrote its `[rankN]: ` before them, when there are any), else
    the last line that is not decoration ('bash: ...: command not found')."""
    try:
        data = folder.read_capped(_join(log_folder, f"{node}.err"), REASON_BYTES, from_end=True)
    except UnreadableFile as exc:
        if exc.errno != errno.ENOENT:
            return ""
        # The node as HPC Pack spells it (CCP_NODES) may differ in case from the job file's name.
        try:
            names = [n for n in folder.listdir(log_folder) if n.upper() == f"{node}.ERR".upper()]
            data = (
                folder.read_capped(_join(log_folder, names[0]), REASON_BYTES, from_end=True) if names else b""
            )
        except (FileNotFoundError, UnreadableFile):
            return ""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line and line.strip("=-* ") and not line.startswith("hpcjob: node ")]
    exceptions: list[tuple[str, str]] = []  # (the rank that wrote it, or "", the line without its prefix)
    for line in lines:
        prefix = RANK_PREFIX.match(line)
        text = line[prefix.end() :] if prefix else line
        if _EXCEPTION.match(text) and not _WRAPPER.search(text):
            exceptions.append((prefix.group(1) if prefix else "", text))
    of_rank = [text for who, text in exceptions if who == str(rank)]
    found = cause_of(of_rank or [text for _, text in exceptions]) or (lines or [""])[-1]
    found = plain_reason(found, node)
    return found if len(found) <= 300 else found[:297] + "..."


def output_reason(text: str) -> str:
    """Why a task failed, from what the node agent kept of its output (a failed container start, say):
    its last line that speaks of an error, else its last line."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    found = (errors or lines or [""])[-1]
    return found if len(found) <= 300 else found[:297] + "..."


def read_root_cause(
    folder: ShareFolder,
    log_folder: str,
    task_ends: Iterable[TaskEnd] | None = None,
    stopped_at: float | None = None,
) -> RootCause | None:
    """What failed first in the run (`first_failure`), with the line of its node's stderr that says
    why. `task_ends` are the failed tasks as the backend saw them end; by default the tasks' own
    `.exit` files on the share say so."""
    ends = read_task_ends(folder, log_folder) if task_ends is None else list(task_ends)
    cause = first_failure(read_rank_ends(folder, log_folder), ends, stopped_at)
    if cause is None:
        return None
    signal = cause.signal or (signal_of_exit_code(cause.exit_code) if cause.rank is None else None)
    reason = reason_line(folder, log_folder, cause.node, cause.rank)
    return dataclasses.replace(cause, signal=signal, reason=reason)
