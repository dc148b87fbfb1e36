"""A task's processes, found and stopped the way HPC Pack's Linux agent does with its per-task cgroup.

The agent signals every pid in the task's cgroup. Here a task is: the wrapper started in its own
session, every descendant seen while it runs (parent links in /proc, polled), and every process whose
environment carries the task's marker variable (which also finds daemons that double-forked away
between two polls). Processes are remembered as (pid, start time) so a reused pid is never signalled.
Used by the local backend and by the emulator's nodes. Linux: without /proc, only the wrapper's
session is found.

Two more things the agent gives a task: it starts with the default signal dispositions, whatever the
starter ignored (`DEFAULT_SIGNALS`); and it does not outlive its starter, however the starter dies,
SIGKILL by the OOM killer included (`Watchdog`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

# Put into each task's environment by whoever starts it, with a value unique to the task.
MARKER_VAR = "HPCJOB_TASK_MARKER"
LOCAL_CPUS_VAR = "HPCJOB_LOCAL_CPUS"  # a local node's CPUs: DEFAULT_SIGNALS sets its affinity from it

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)

# Run in front of every task's command: ignored signals survive exec, and a script's background job
# ignores SIGINT and SIGQUIT, nohup SIGHUP, and Python itself SIGPIPE and SIGXFSZ. A task that ignored
# SIGINT could not be stopped gracefully, so each is reset to the default, then the task's program
# replaces this Python (same pid). Its starter (TaskProcess) blocks the stopping signals from before the
# fork, and the block survives exec: one that came while this Python starts up, or holds its own SIGINT
# handler, would otherwise raise KeyboardInterrupt in its start-up or be lost at exec; blocked, it waits
# in the kernel and ends the process as soon as the defaults are back and this unblocks it.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
# The signals that cancel a job where it is run (SIGQUIT keeps its default: the way to stop hpcjob itself).
CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_cancel_signals() -> dict[int, Any]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt here, whatever was inherited (a script's
    background job starts with SIGINT ignored, and Python then leaves it ignored). The handlers they had,
    to put back with `signal.signal`."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    return {stop: signal.signal(stop, interrupt) for stop in CANCEL_SIGNALS}


DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "for s in signal.valid_signals():\n"
    "    try:\n"
    "        if s not in (signal.SIGKILL, signal.SIGSTOP) and (\n"
    "            s == signal.SIGINT or signal.getsignal(s) is signal.SIG_IGN\n"
    "        ):\n"
    "            signal.signal(s, signal.SIG_DFL)\n"
    "    except (OSError, ValueError):\n"
    "        pass\n"
    # A local node's own CPUs (a job with data nodes): set before bash starts, so all it runs inherits them.
    "cpus = os.environ.pop('HPCJOB_LOCAL_CPUS', '')\n"
    "if cpus and hasattr(os, 'sched_setaffinity'):\n"
    "    os.sched_setaffinity(0, {int(c) for c in cpus.split(',')})\n"
    "stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def process_table(pids: Iterable[int] | None = None) -> dict[int, tuple[int, int, bytes]]:
    """pid -> (parent pid, start time, state letter) for every process (or those of `pids`), from /proc."""
    table: dict[int, tuple[int, int, bytes]] = {}
    try:
        entries = [str(pid) for pid in pids] if pids is not None else os.listdir("/proc")
    except FileNotFoundError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def children_of(table: Mapping[int, tuple[int, int, bytes]]) -> dict[int, list[int]]:
    """parent pid -> its children's pids, from one process table: made once for every task that reads it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    return children


def marked_processes(needle: bytes, table: Mapping[int, tuple[int, int, bytes]] | None = None) -> set[Proc]:
    """Live processes whose environment holds a variable starting with ``needle`` (``NAME=value...``)."""
    table = process_table() if table is None else table
    return {
        (pid, start)
        for pid, start, environ in _environments(table)
        if environ.startswith(needle) or b"\0" + needle in environ
    }


def _environments(table: Mapping[int, tuple[int, int, bytes]]) -> Iterator[tuple[int, int, bytes]]:
    """(pid, start time, environment) of each live process of `table` but this one that can be read."""
    for pid, (_, start, state) in table.items():
        if state in (b"Z", b"X") or pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                yield pid, start, f.read()
        except OSError:
            continue


@dataclass(frozen=True)
class Snapshot:
    """The processes at one moment: the table, its parent-to-children map, and each marker's processes
    (keyed by the whole ``NAME=value\0`` entry)."""

    table: dict[int, tuple[int, int, bytes]]
    children: dict[int, list[int]]
    marked: dict[bytes, set[Proc]]


def read_snapshot() -> Snapshot:
    """One read of /proc: every process's stat and the marker in its environment."""
    table = process_table()
    marked: dict[bytes, set[Proc]] = {}
    prefix = f"{MARKER_VAR}=".encode()
    for pid, start, environ in _environments(table):
        if environ.startswith(prefix):
            at = 0
        else:
            at = environ.find(b"\0" + prefix) + 1
            if not at:
                continue  # no marker: not a task's
        end = environ.find(b"\0", at)
        entry = environ[at:] + b"\0" if end < 0 else environ[at : end + 1]
        marked.setdefault(entry, set()).add((pid, start))
    return Snapshot(table, children_of(table), marked)


class SharedReads:
    """Threads that ask for the processes at once share one read of /proc.

    A caller needs a read that began after it asked (what it killed must be seen gone); whoever finds
    none running starts one, the others wait for it or the next. 1,000 tasks of the emulator ending
    together each searched every process's environment in its own thread, a million reads that starved
    the REST API for over a minute (issue 42); shared, that is one search per round for all of them."""

    def __init__(self, read: Callable[[], Snapshot] = read_snapshot) -> None:
        self._read = read
        self._changed = threading.Condition()
        self._latest: tuple[float, Snapshot] | None = None
        self._reading = False

    def after(self, moment: float) -> Snapshot:
        """A snapshot whose read began at `moment` or later (time.monotonic)."""
        with self._changed:
            while True:
                if self._latest is not None and self._latest[0] >= moment:
                    return self._latest[1]
                if not self._reading:
                    self._reading = True
                    break
                self._changed.wait()
        began = time.monotonic()
        snapshot: Snapshot | None = None
        try:
            snapshot = self._read()
            return snapshot
        finally:
            with self._changed:
                self._reading = False
                if snapshot is not None:
                    self._latest = (began, snapshot)
                self._changed.notify_all()


SHARED_READS = SharedReads()


class TaskProcess:
    """The wrapper process of one task and everything it started."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        marker: str,
        stdout: int,
        stderr: int,
    ) -> None:
        self.marker = f"{MARKER_VAR}={marker}\0".encode()
        self._lock = threading.Lock()
        # Blocked from before the fork, unblocked by DEFAULT_SIGNALS once the defaults are set (above).
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", DEFAULT_SIGNALS, *argv],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # its own session, like a task forked by the agent
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        # Its own start time alone: a whole table a start made starting 1,000 tasks read /proc a million
        # times (issue 42); its descendants are found at the next refresh, or by the marker.
        start = process_table((self.popen.pid,)).get(self.popen.pid, (0, -1, b""))[1]
        self._seen: set[Proc] = {(self.popen.pid, start)}
        self._interrupted: set[Proc] = set()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def refresh(
        self,
        table: Mapping[int, tuple[int, int, bytes]] | None = None,
        children: Mapping[int, list[int]] | None = None,
    ) -> None:
        """Record the descendants of every live process of the task (called while it runs); `children`:
        the table's parent-to-children map, where the caller made it once for many tasks."""
        table = process_table() if table is None else table
        children = children_of(table) if children is None else children
        with self._lock:
            stack = [pid for pid, start in self._seen if table.get(pid, (0, -1, b""))[1] == start]
            while stack:
                pid = stack.pop()
                for child in children.get(pid, []):
                    entry = (child, table[child][1])
                    if entry not in self._seen:
                        self._seen.add(entry)
                        stack.append(child)

    def live(self, deep: bool = True) -> set[Proc]:
        """Processes of the task that still exist and are not zombies. ``deep`` also searches every
        process's environment for the marker (slower; finds what left the tree between two polls)."""
        snapshot = SHARED_READS.after(time.monotonic())
        table = snapshot.table
        self.refresh(table, snapshot.children)
        with self._lock:
            if deep:
                self._seen |= snapshot.marked.get(self.marker, set())
            seen = set(self._seen)
        return {
            (pid, start)
            for pid, start in seen
            if pid in table and table[pid][1] == start and table[pid][2] not in (b"Z", b"X")
        }

    def signal(self, sig: signal.Signals) -> int:
        live = self.live()
        for pid, _ in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(live)

    def interrupt(self) -> bool:
        """SIGINT to each live process of the task that has not had one yet; whether any is live.

        Called again and again while the task stops: a process forked just after the first SIGINT (a
        shell starting its next command) gets its own when it is seen. A shell waits for its
        foreground child, so a child that missed the signal would hold the task until the SIGKILL."""
        live = self.live(deep=not self._interrupted)  # the marker search is needed only once
        for pid, start in live - self._interrupted:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)
            self._interrupted.add((pid, start))
        return bool(live)

    def stop(self, grace_period: float, kill_now: threading.Event) -> None:
        """SIGINT to every process, SIGKILL to whatever is left after the grace period (or at once)."""
        if grace_period > 0 and not kill_now.is_set():
            deadline = time.monotonic() + grace_period
            while self.interrupt() and time.monotonic() < deadline and not kill_now.is_set():
                kill_now.wait(0.1)
        self.kill()

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL until no process of the task is left (a process may fork while being killed)."""
        deadline = time.monotonic() + timeout
        while self.signal(signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.02)


class Watchdog:
    """A process that kills every process marked with `marker` (a prefix of the marker values) when the
    process that made the watchdog dies, however it dies.

    PR_SET_PDEATHSIG would reach only a task's first process, not torchrun and its workers below it.
    The watchdog runs in its own session (a closed terminal's SIGHUP does not reach it) and holds the
    read end of a pipe whose write end only its maker has: end of file without the word "done" first
    means the maker died, and the watchdog kills the marked processes, then itself ends.
    """

    def __init__(self, marker: str) -> None:
        read_end, self._write_end = os.pipe()  # not inherited by tasks: pipes are not inheritable
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, f"{MARKER_VAR}={marker}"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_end)

    def close(self) -> None:
        """The maker ends normally: the watchdog leaves the processes alone and ends."""
        if self._write_end < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_end, b"done")
        os.close(self._write_end)
        self._write_end = -1
        self.popen.wait()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _watch(needle: bytes) -> None:
    """The watchdog's side: wait for the maker's word or its death."""
    if sys.stdin.buffer.read() == b"done":
        return
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        found = marked_processes(needle)
        if not found:
            return
        for pid, _ in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def exit_code(returncode: int) -> int:
    """As bash reports a child: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


if __name__ == "__main__":  # the watchdog, started by Watchdog with only the standard library
    _watch(sys.argv[1].encode())
