"""A failing script's own error first: the nodes' output as hpcjob echoes it, with each Python traceback
cut to the script's own frames, a traceback already shown named in one line, and torchrun's report of a
failed worker left out (hpcjob's first-failure line says which rank failed, and how). Pure: lines in,
lines out. The nodes' log files keep everything; `hpcjob logs` shows them whole.

A traceback as Python 3 prints it (and as torch's hook does once the script has a process group, each
line after `[rankN]: `; its blank lines bare):

    Traceback (most recent call last):
      File ".../.hpcjob/worker.py", line 367, in <module>     hpcjob's shim: hidden
        main()
      File "<frozen runpy>", line 88, in _run_code           Python's machinery: hidden
      File "train.py", line 5, in step                       the script's: shown
        raise RuntimeError("boom")
    RuntimeError: boom

or several, chained ("During handling of the above exception, ..."). A traceback with no frame but
hidden ones (hpcjob's shim failing itself) is shown whole. What does not read as a traceback (an
exception group, the lines of ranks that failed at the same moment mixed) is shown as it came.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

HEADER = "Traceback (most recent call last):"
CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# What torch.distributed's excepthook writes before each line (distributed_c10d.py, init_process_group).
RANK_PREFIX = re.compile(r"\[rank(\d+)\]: ")
_FRAME = re.compile(r'  File "(?P<file>[^"]*)", line \d+')
_HIDDEN = re.compile(
    r"(^|[/\\])(\.hpcjob|hpcjob[/\\]node)[/\\]worker\.py$"  # the worker shim, staged or in the package
    r"|^<frozen (runpy|importlib\._bootstrap(_external)?)>$"  # runpy and the import system, Python 3.11+
    r"|[/\\]python3[.\d]*[/\\](runpy|importlib[/\\]_bootstrap(_external)?)\.py$"  # the same before
)
# The line that ends a traceback: the exception (`RuntimeError: boom`, `KeyboardInterrupt`, `a.b.Error:`).
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(:.*)?$")
# torchrun's report of a failed worker: its log line, then its own traceback, ChildFailedError, and a box
# ruled with "=" that names the failed ranks.
_TORCHRUN_FAILED = re.compile(r"torch/distributed/elastic/multiprocessing/api\.py:\d+\] failed \(exitcode: ")
_WRAPPER = "ChildFailedError"
_RULE = re.compile(r"={20,}$")
_BOX_LINES = 500  # a box never closed stops being swallowed after this many lines
_MOST_LINES = 5000  # a traceback longer than this is shown as it came (what is held stays bounded)
_MOST_SEEN = 1000  # the tracebacks remembered as shown, the newest
# torch's words (c10d's TCPStore and torchrun's rendezvous, torch 2.x) on a node whose rendezvous store
# went away: what another node's failure makes it print when that node hosted the store.
_STORE_LOST = re.compile(
    r"Connection was likely closed|TCPStore\.cpp:\d+\].*(Broken pipe|Connection reset)|DistNetworkError|"
    r"has failed to shutdown the rendezvous"
)

Shown = tuple[str, str, str]  # (node, "stdout" or "stderr", line)


@dataclass
class _Part:
    """One traceback of a chain: its frames (each a `File` line and the lines under it), its exception."""

    joined: str = ""  # the line that chains it to the one before (CHAIN), "" for the first
    frames: list[list[str]] = field(default_factory=list)
    exception: str = ""

    def trimmed(self) -> list[str]:
        kept = [frame for frame in self.frames if not _hidden(frame[0])]
        frames = kept if any(_FRAME.match(frame[0]) for frame in kept) else self.frames
        joined = ["", self.joined, ""] if self.joined else []
        return [*joined, HEADER, *(line for frame in frames for line in frame), self.exception]


def _hidden(line: str) -> bool:
    found = _FRAME.match(line)
    return found is not None and _HIDDEN.search(found["file"]) is not None


@dataclass
class _Stream:
    """Where the reading of one node's stdout or stderr is."""

    state: str = "idle"  # idle, body (in a traceback's frames), after (one ended), box (torchrun's)
    prefix: str = ""  # the rank's prefix of the traceback being read
    parts: list[_Part] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # its lines as they came
    gap: list[str] = field(default_factory=list)  # after one: the lines that may join the next to it
    rules: int = 0  # the box's "=" lines seen
    boxed: int = 0


class TracebackFilter:
    """The nodes' lines, fed as they come (`feed`), come back as they are to be shown: a traceback once it
    has ended, cut to the script's frames, or one line where the job showed the same one already (from any
    node or rank); torchrun's report of a failed worker not at all. `flush` at the end of each look hands
    on a traceback that may still have had one chained to it; `final`, everything held."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._seen: dict[tuple[str, ...], str] = {}  # a traceback shown -> where it came from
        self._stopped: dict[str, int] = {}  # a node hpcjob stopped -> its lines since, left out
        self._failed: str | None = None  # the node of the first traceback: the job's failure

    def stopping(self, nodes: Iterable[str]) -> None:
        """hpcjob stops `nodes` now (another node failed; an interrupt): what they print from here on is
        what the stop did to them (torchrun's SignalException, a KeyboardInterrupt in each rank, C++
        frames), left out with what they held, and said in one line a node at the end. A node that
        says it lost the rendezvous store once another node's traceback began is stopping too."""
        for node in nodes:
            if node in self._stopped:
                continue
            held = 0
            for (name, _), state in self._streams.items():
                if name == node:
                    held += len(state.raw) + len(state.gap)
                    self._reset(state)
            self._stopped[node] = held

    def feed(self, node: str, stream: str, line: str) -> list[Shown]:
        if self._failed not in (None, node) and node not in self._stopped and _STORE_LOST.search(line):
            # Another node failed, and this one lost the store it hosted: it is stopping, as if hpcjob
            # had stopped it already (it will, as soon as it sees the failure).
            self.stopping([node])
        if node in self._stopped:
            self._stopped[node] += 1
            return []
        state = self._streams.setdefault((node, stream), _Stream())
        shown: list[Shown] = []
        self._line(node, stream, state, line, shown)
        return shown

    def flush(self, final: bool = False) -> list[Shown]:
        shown: list[Shown] = []
        folded = {node: count for node, count in self._stopped.items() if count}
        if final and folded:  # one line for them all, whatever the nodes
            names = list(folded)
            who = ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]} and {len(names) - 2} more"
            said = f"stopped by hpcjob: {sum(folded.values())} line(s) printed as they stopped, left out"
            shown.append((who, "stderr", f"{said} (`hpcjob logs` has them)"))
            self._stopped = dict.fromkeys(self._stopped, 0)
        for (node, stream), state in self._streams.items():
            if state.state == "after":
                self._end(node, stream, state, shown)
            elif final and state.state == "body":
                shown.extend((node, stream, raw) for raw in state.raw)
                self._reset(state)
        return shown

    def _line(self, node: str, stream: str, state: _Stream, line: str, shown: list[Shown]) -> None:
        rank = RANK_PREFIX.match(line)
        prefix = rank.group(0) if rank else ""
        text = line[len(prefix) :]
        same = prefix == state.prefix
        if state.state == "box":
            state.boxed += 1
            if _RULE.match(line):
                state.rules += 1
            elif state.rules == 0:  # not the box after all
                self._reset(state)
                self._line(node, stream, state, line, shown)
                return
            if state.rules == 2 or state.boxed > _BOX_LINES:
                self._reset(state)
            return
        if state.state == "body":
            if same and text.startswith("  ") and len(state.raw) < _MOST_LINES:
                part = state.parts[-1]
                if _FRAME.match(text) or not part.frames:
                    part.frames.append([text])
                else:
                    part.frames[-1].append(text)
                state.raw.append(line)
            elif same and text and text != HEADER and _EXCEPTION.match(text):
                state.parts[-1].exception = text
                state.raw.append(line)
                if _WRAPPER in text:  # torchrun's own: its box follows
                    self._reset(state)
                    state.state = "box"
                else:
                    state.state = "after"
            else:  # not a traceback after all: as it came, and the line read afresh
                shown.extend((node, stream, raw) for raw in state.raw)
                self._reset(state)
                self._line(node, stream, state, line, shown)
            return
        if state.state == "after":
            gap = [g[len(state.prefix) :] for g in state.gap]  # a blank line is bare, rank or not
            chained = len(gap) >= 2 and gap[0] == "" and gap[1] in CHAIN
            if line == "" and (not gap or (chained and len(gap) == 2)):
                state.gap.append(line)
                return
            if same and text in CHAIN and gap == [""]:
                state.gap.append(line)
                return
            if same and text == HEADER and chained and len(gap) == 3:
                state.raw += [*state.gap, line]
                state.parts.append(_Part(joined=gap[1]))
                state.gap, state.state = [], "body"
                return
            self._end(node, stream, state, shown)
        # idle
        if text == HEADER:
            state.state, state.prefix, state.parts, state.raw = "body", prefix, [_Part()], [line]
            self._failed = self._failed or node
        elif not _TORCHRUN_FAILED.search(line):
            shown.append((node, stream, line))

    def _end(self, node: str, stream: str, state: _Stream, shown: list[Shown]) -> None:
        """A traceback read to its end: cut to the script's frames, or named where it was shown before."""
        lines = [line for part in state.parts for line in part.trimmed()]
        key = tuple(lines)
        rank = RANK_PREFIX.match(state.prefix)
        where = f"rank {rank.group(1)} on {node}" if rank else node
        if key in self._seen:
            shown.append(
                (node, stream, f"{state.prefix}(the same traceback as above, from {self._seen[key]})")
            )
        else:
            self._seen[key] = where
            if len(self._seen) > _MOST_SEEN:
                del self._seen[next(iter(self._seen))]
            shown.extend((node, stream, f"{state.prefix}{text}" if text else "") for text in lines)
        shown.extend((node, stream, line) for line in state.gap)
        self._reset(state)

    @staticmethod
    def _reset(state: _Stream) -> None:
        state.state, state.prefix, state.parts, state.raw, state.gap = "idle", "", [], [], []
        state.rules = state.boxed = 0


# torch's words for a rendezvous store that cannot bind its port (c10d's TCPStore, torch 2.x): the
# exception torchrun raises over it says only "See inner exception for details".
_WRAPPED = "See inner exception for details"
_PORT_IN_USE = re.compile(r"\bport: (?P<port>\d+)\b.*\bEADDRINUSE\b")


def cause_of(exceptions: Sequence[str]) -> str:
    """Of the exception lines of one failure, in the order printed, the one that says why: the last, or
    where it only wraps the one before ("See inner exception for details"), that one."""
    found = exceptions[-1] if exceptions else ""
    if _WRAPPED in found and len(exceptions) > 1:
        return exceptions[-2]
    return found


def plain_reason(reason: str, node: str) -> str:
    """An exception line as a person acts on it, where hpcjob knows its plain words: a rendezvous port
    in use says so, with the node."""
    port = _PORT_IN_USE.search(reason)
    if port:
        return f"port {port['port']} is in use on {node}: another program holds it (give another --rdzv-port)"
    return reason


def filter_output(lines: Iterable[Shown]) -> list[Shown]:
    """Lines read all at once (a finished run's), as `TracebackFilter` shows them."""
    tracebacks = TracebackFilter()
    shown = [line for node, stream, text in lines for line in tracebacks.feed(node, stream, text)]
    return shown + tracebacks.flush(final=True)
