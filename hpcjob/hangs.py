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
from the follower's. Pure: the reading is done by the caller (hpcjob.logs.read_beats).
"""

from __future__ import annotations

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
    def from_json(cls, data: Mapping[str, object]) -> Beat:
        """A beat as worker.py writes it: groups as [seq, name, began, state, in flight]."""
        groups = data.get("collectives") or {}
        if not isinstance(groups, Mapping):
            raise ValueError("collectives: not an object")
        return cls(
            rank=int(str(data["rank"])),
            node=str(data.get("node") or "-"),
            t=float(str(data["t"])),
            collectives={
                str(group): Collective(int(entry[0]), str(entry[1]), bool(entry[4]))
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
    """The innermost frame of a rank's main thread, from faulthandler's dump of its threads: the thread
    that runs hpcjob's worker shim, at the frame most recently called ("train.py:42 in step")."""
    for block in stacks.split("\n\n"):
        frames = [m.groups() for m in _FRAME.finditer(block)]
        if any(file.endswith("/worker.py") and function == "_run" for file, _, function in frames):
            file, line, function = frames[0]
            return f"{file.rsplit('/', 1)[-1]}:{line} in {function}"
    return None


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


def _ranks(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return f"rank {listed[0]}" if len(listed) == 1 else "ranks " + ", ".join(map(str, listed))


class HangWatch:
    """Follows the beats of one job, `look` after `look`, until it has hung (see the module's notes)."""

    def __init__(self, hang_timeout_s: float, world_size: int) -> None:
        self.timeout_s = hang_timeout_s
        self.world_size = world_size
        self.stale_s = STALE_BEATS * beat_interval(hang_timeout_s)
        self._changed: dict[int, tuple[float, float]] = {}  # rank -> (its beat's t, when it last changed)
        self._progress: tuple[object, ...] | None = None
        self._progress_at = 0.0

    def look(self, beats: Iterable[Beat], now: float) -> Hang | None:
        """The hang, if the job has hung by `now` (the follower's clock) with these latest beats."""
        latest = {beat.rank: beat for beat in beats}
        for rank, beat in latest.items():
            if rank not in self._changed or self._changed[rank][0] != beat.t:
                self._changed[rank] = (beat.t, now)
        progress = tuple(
            sorted(
                (rank, group, c.seq, c.in_flight)
                for rank, b in latest.items()
                for group, c in b.collectives.items()
            )
        )
        if progress != self._progress:
            self._progress, self._progress_at = progress, now
        waited = now - self._progress_at
        if not progress or waited < self.timeout_s:
            return None  # no collective yet (nothing to wait in), or one moved on within the bound
        stale = {rank for rank, (_, at) in self._changed.items() if now - at >= self.stale_s}
        beating = set(latest) - stale
        waiting = {rank for rank in beating if any(c.in_flight for c in latest[rank].collectives.values())}
        if not waiting:
            return None  # no rank that still beats waits: the ranks compute, or the beats cannot be read
        group, awaited = max(
            ((g, c) for rank in waiting for g, c in latest[rank].collectives.items() if c.in_flight),
            key=lambda item: item[1].seq,
        )
        waiters = {r for r in waiting if latest[r].collectives.get(group) == awaited}
        how_long = f"for {waited:.0f} s"
        missing = set(range(self.world_size)) - set(latest)
        if stale:
            rank = min(stale)
            last = latest[rank].collectives.get(group)
            where = f"its last beat: {last.describe()}" if last else "its last beat showed no collective"
            return Hang(
                rank,
                latest[rank].node,
                f"hung: stopped beating ({where}) while {_ranks(waiters)} waited in {awaited.describe()} "
                f"{how_long}",
                frozenset(beating),
            )
        behind = {r for r in beating - waiters if latest[r].collectives.get(group) != awaited}
        if behind:
            rank = min(behind)
            last = latest[rank].collectives.get(group)
            doing = (
                f"it is in {last.describe()}"
                if last and last.in_flight
                else f"its last: {last.describe()}"
                if last
                else "it has had no collective"
            )
            return Hang(
                rank,
                latest[rank].node,
                f"hung: never entered {awaited.describe()}, in which {_ranks(waiters)} waited {how_long} "
                f"({doing})",
                frozenset(beating),
            )
        if missing:
            rank = min(missing)
            return Hang(
                rank,
                None,
                f"hung: {_ranks(missing)} never beat, while {_ranks(waiters)} waited in "
                f"{awaited.describe()} {how_long}",
                frozenset(beating),
            )
        return Hang(
            None,
            None,
            f"hung: every rank waited in {awaited.describe()} {how_long}: none is missing (the network "
            "or NCCL itself: see the flight recorder's dumps in the run's log folder)",
            frozenset(beating),
        )
