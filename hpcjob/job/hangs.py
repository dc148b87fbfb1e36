"""A hung job told from its ranks' beats: which rank holds the others up, and in which collective.

With --hang-timeout, every rank beats (hpcjob/node/worker.py): a file rewritten every few seconds with
the time and, per process group, the newest collective from PyTorch's flight recorder (its sequence
number, its name, when it began, whether it is still in flight). Whoever follows the job reads the beats
and gives them to a `HangWatch`. The job has hung when no collective has moved on for the whole bound
while some rank waits in one. Then the rank to blame is, in this order:
- a rank that stopped beating while others beat (stopped, killed without its task ending, stuck in C
  code holding Python's lock);
- a rank behind the others in the collective they wait in (it sleeps, loops or waits on something of
  its own, or it is in another collective: the ranks disagree on the order);
- none: every rank waits in the same collective (the fabric, or NCCL itself).

Times are the follower's own clock (when it saw a beat change), never the nodes': their clocks may differ
from the follower's. Pure: the reading is done by the caller (hpcjob.store.logs.read_beats).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

# The beat, from the bound: several beats fit in it, one every 2 s at the most, every 30 s at the least.
MIN_BEAT_S = 2.0
MAX_BEAT_S = 30.0
# The shortest bound: below it a job's first collectives (NCCL's communicators, a first compile) would
# look like a hang.
MIN_HANG_TIMEOUT_S = 10.0
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600.0
# A rank whose beat has not changed for this many beats has stopped beating.
STALE_BEATS = 3
# The exit code of a job hpcjob ended as hung: timeout(1)'s.
HANG_EXIT_CODE = 124


def beat_interval(hang_timeout_s: float) -> float:
    """How often each rank beats for a job with this bound."""
    return min(max(hang_timeout_s / 6, MIN_BEAT_S), MAX_BEAT_S)


@dataclass(frozen=True)
class Collective:
    """A process group's newest collective on one rank."""

    seq: int
    name: str  # the flight recorder's profiling name, such as nccl:all_reduce
    in_flight: bool

    def describe(self) -> str:
        return f"collective #{self.seq} {self.name}".rstrip()


@dataclass(frozen=True)
class Beat:
    """One rank's latest beat: its node, when it beat (the node's clock: compared with itself only),
    and each process group's newest collective."""

    rank: int
    node: str
    t: float
    collectives: Mapping[str, Collective] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object) -> Beat:
        """A beat as worker.py writes it: groups as [seq, name, began, state, in flight]. ValueError,
        KeyError, IndexError or TypeError where it is not one (anyone who can write the share could have
        written it)."""
        if not isinstance(data, Mapping):
            raise ValueError("a beat is an object")
        groups = data.get("collectives") or {}
        if not isinstance(groups, Mapping):
            raise ValueError("collectives: not an object")
        t = float(str(data["t"]))
        if not math.isfinite(t):  # a time that never changes, or always does
            raise ValueError("t: not a finite number")
        return cls(
            rank=int(str(data["rank"])),
            node=_printable(str(data.get("node") or "-")),
            t=t,
            collectives={
                str(group): Collective(int(entry[0]), _printable(str(entry[1])), bool(entry[4]))
                for group, entry in groups.items()
            },
        )


@dataclass(frozen=True)
class Hang:
    """What hpcjob found: the rank to blame (None: every rank waits in the same collective), its node
    (None where it never beat), and one line that says what the ranks were doing (of the rank to blame,
    where it has a node: "hung: stopped beating ...")."""

    rank: int | None
    node: str | None
    reason: str
    beating: frozenset[int] = frozenset()  # the ranks that still beat: they can say where they are

    def with_place(self, stacks: str) -> Hang:
        """The hang, with where the blamed rank's script was (from its stacks, faulthandler's format)."""
        place = script_frame(stacks)
        return replace(self, reason=f"{self.reason}; it was at {place}") if place else self


def script_frame(stacks: str) -> str | None:
    """Where the rank's script was, from the stacks worker.py wrote (its main thread first, innermost
    frame last, as Python's tracebacks): the innermost frame that is not in Python's own library or an
    installed package ("train.py:42 in load_batch"), else the innermost one."""
    main = stacks.split("\n\n", 1)[0]
    frames = [m.groups() for m in _FRAME.finditer(main)]
    if not frames:
        return None
    own = [f for f in frames if not _LIBRARY.search(f[0]) and not f[0].endswith("/worker.py")]
    file, line, function = (own or frames)[-1]
    return _printable(f"{file.rsplit('/', 1)[-1]}:{line} in {function}")


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)', re.MULTILINE)
# Python's own library, installed packages, frozen modules: not where a script's own code is.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3[.\d]*/|^<frozen ")


def _printable(text: str) -> str:
    """Text from a rank's files (anyone who can write the share could have written them) without the
    control characters a terminal would act on."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:200]


def _ranks(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return f"rank {listed[0]}" if len(listed) == 1 else "ranks " + ", ".join(map(str, listed))


class HangWatch:
    """Follows the beats of one job, `look` after `look`, until it has hung (see the module's notes)."""

    def __init__(self, hang_timeout_s: float, world_size: int) -> None:
        self.timeout_s = hang_timeout_s
        self.world_size = world_size
        self.stale_s = STALE_BEATS * beat_interval(hang_timeout_s)
        self._latest: dict[int, Beat] = {}  # each rank's last beat read (a read may miss one)
        self._changed: dict[int, float] = {}  # rank -> when its beat last changed
        self._progress: tuple[object, ...] | None = None
        self._progress_at = 0.0

    def moved(self, beats: Iterable[Beat], now: float) -> bool:
        """Merge the beats read `now` (the follower's clock) into those read before (a rank whose file
        was not read this time keeps its last beat): whether a collective moved on since the last look.
        If it did, the job has not hung, whatever the ranks not read this time do: a follower reads one
        rank's beat first, and every rank's only when that one did not move (issue 42: 8,000 ranks'
        files each beat otherwise)."""
        for beat in beats:
            if not 0 <= beat.rank < self.world_size:
                continue  # no rank of this job: a file someone put among the beats
            if beat.rank not in self._latest or self._latest[beat.rank].t != beat.t:
                self._changed[beat.rank] = now
            self._latest[beat.rank] = beat
        latest = self._latest
        progress = tuple(
            sorted(
                (r, group, c.seq, c.in_flight)
                for r, b in latest.items()
                for group, c in b.collectives.items()
            )
        )
        if progress == self._progress:
            return False
        self._progress, self._progress_at = progress, now
        return True

    def silent_s(self, rank: int, now: float) -> float:
        """How long the rank's beat has not changed, as of `now` (infinite where it never beat)."""
        return now - self._changed.get(rank, -math.inf)

    def look(self, beats: Iterable[Beat], now: float) -> Hang | None:
        """The hang, if the job has hung by `now`, with `beats` merged as `moved` does."""
        self.moved(beats, now)
        latest, progress = self._latest, self._progress
        waited = now - self._progress_at
        if not progress or waited < self.timeout_s:
            return None  # no collective yet (nothing to wait in), or one moved on within the bound
        stale = {rank for rank, at in self._changed.items() if now - at >= self.stale_s}
        beating = set(latest) - stale

        def in_flight(rank: int) -> list[tuple[str, Collective]]:
            return [(g, c) for g, c in latest[rank].collectives.items() if c.in_flight]

        # The collective the most ranks that still beat wait in (sequence numbers count per group).
        waits = [wait for rank in beating for wait in in_flight(rank)]
        if not waits:
            return None  # no rank that still beats waits: the ranks compute, or the beats cannot be read
        group, awaited = max(set(waits), key=lambda wait: (waits.count(wait), wait[1].seq, wait[0]))
        waiters = {r for r in beating if (group, awaited) in in_flight(r)}
        how_long = f"for {waited:.0f} s"
        beat_on = frozenset(beating)
        if stale:
            rank = min(stale)
            last = latest[rank].collectives.get(group)
            where = f"its last beat: {last.describe()}" if last else "its last beat showed no collective"
            return Hang(
                rank,
                latest[rank].node,
                f"hung: stopped beating ({where}) while {_ranks(waiters)} waited in {awaited.describe()} "
                f"{how_long}",
                beat_on,
            )
        # Behind: a member of the group (it has had a collective in it) that has not reached the awaited
        # one; first a rank that waits in nothing (it sleeps, loops, waits on its own), then one that waits
        # in another collective (the ranks disagree on the order).
        members = {r for r in beating - waiters if group in latest[r].collectives}
        behind = sorted(
            (bool(in_flight(r)), r)
            for r in members
            if latest[r].collectives[group].seq < awaited.seq or in_flight(r)
        )
        if behind:
            rank = behind[0][1]
            last = latest[rank].collectives[group]
            elsewhere = in_flight(rank)
            doing = f"it is in {elsewhere[0][1].describe()}" if elsewhere else f"its last: {last.describe()}"
            return Hang(
                rank,
                latest[rank].node,
                f"hung: never entered {awaited.describe()}, in which {_ranks(waiters)} waited {how_long} "
                f"({doing})",
                beat_on,
            )
        missing = set(range(self.world_size)) - set(latest)
        if missing:
            return Hang(
                min(missing),
                None,
                f"hung: {_ranks(missing)} never beat, while {_ranks(waiters)} waited in "
                f"{awaited.describe()} {how_long}",
                beat_on,
            )
        return Hang(
            None,
            None,
            f"hung: every rank waited in {awaited.describe()} {how_long}: none is missing (the network "
            "or NCCL itself: see the flight recorder's dumps in the run's log folder)",
            beat_on,
        )
