"""What a run used and cost: each attempt's own figures (its start and end, its trainers and data nodes,
node-hours, GPU-hours and cost) and the run's, which are their sums. Every view of a run (`runs`, `runs
show`, `--json`, the summary at the end of `submit --wait`, `runs plot`) and `--max-cost` read them here.

One rule for the run's cost: an attempt that ran without a price (a profile that names no size, a size
without a Spot price offline) makes the run's cost unknown, and the figures name that attempt. An attempt
whose submission was cut short ran nothing: it held no node and cost nothing. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AttemptUsage:
    """One attempt's figures: `started` on this machine's clock (seconds since the epoch; None where the
    history of an older hpcjob did not keep it), its wall time (what its nodes were held: 0 for one that
    ran nothing), its trainers and data nodes, each trainer's GPUs, and its cost (None: no price)."""

    attempt: int
    started: float | None
    wall_s: float
    nodes: tuple[str, ...]
    data_node_names: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    cost_usd: float | None = None
    ran: bool = True

    @property
    def ended(self) -> float | None:
        return None if self.started is None else self.started + self.wall_s

    @property
    def node_hours(self) -> float:
        """Every node the attempt held, trainers and data nodes, for its wall time."""
        return (len(self.nodes) + len(self.data_node_names)) * self.wall_s / 3600 if self.ran else 0.0

    @property
    def gpu_hours(self) -> float | None:
        """The trainers' GPUs for its wall time (a data node has none); None where the GPUs are unknown."""
        if not self.ran:
            return 0.0
        return None if not self.gpus_per_node else len(self.nodes) * self.gpus_per_node * self.wall_s / 3600

    @property
    def priced(self) -> bool:
        return self.cost_usd is not None or not self.ran

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "started": self.started,
            "ended": self.ended,
            "wall_s": self.wall_s,
            "nodes": list(self.nodes),
            "data_node_names": list(self.data_node_names),
            "gpus_per_node": self.gpus_per_node,
            "node_hours": self.node_hours,
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd if self.ran else 0.0,
            "ran": self.ran,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptUsage:
        """The figures back from to_dict's form; ValueError where a value is not one."""

        def number(key: str) -> float | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{key} is not a number")
            return float(value)

        def names(key: str) -> tuple[str, ...]:
            value = data.get(key) or []
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise ValueError(f"{key} is not a list of names")
            return tuple(value)

        attempt, gpus = data.get("attempt"), data.get("gpus_per_node")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            raise ValueError("attempt is not a number")
        if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool)):
            raise ValueError("gpus_per_node is not a number")
        return cls(
            attempt,
            number("started"),
            number("wall_s") or 0.0,
            names("nodes"),
            names("data_node_names") or names("data_nodes"),  # an older hpcjob's name for them
            gpus,
            number("cost_usd"),
            bool(data.get("ran", True)),
        )


@dataclass(frozen=True)
class RunUsage:
    """A run's figures: the sums of its attempts'. `cost_usd` is None where an attempt that ran has no
    price (`unpriced` names them) or the run has no attempt with a price at all."""

    attempts: tuple[AttemptUsage, ...]

    @property
    def wall_s(self) -> float:
        """The time the run held nodes: its attempts' wall times together (not the waits between them)."""
        return sum(a.wall_s for a in self.attempts if a.ran)

    @property
    def node_hours(self) -> float:
        return sum(a.node_hours for a in self.attempts)

    @property
    def gpu_hours(self) -> float | None:
        hours = [a.gpu_hours for a in self.attempts]
        return None if any(h is None for h in hours) else sum(h for h in hours if h is not None)

    @property
    def unpriced(self) -> tuple[int, ...]:
        """The attempts that ran without a price."""
        return tuple(a.attempt for a in self.attempts if not a.priced)

    @property
    def cost_usd(self) -> float | None:
        if self.unpriced or not any(a.cost_usd is not None for a in self.attempts):
            return None
        return sum(a.cost_usd for a in self.attempts if a.cost_usd is not None and a.ran)

    def unknown_cost(self) -> str | None:
        """Why the run's cost is unknown where some attempts have a price and others not, in words
        ("attempt 2 has no price"); None where it is known or no attempt has one (a local run)."""
        if not self.unpriced or not any(a.cost_usd is not None for a in self.attempts):
            return None
        if len(self.unpriced) == 1:
            return f"attempt {self.unpriced[0]} has no price"
        return f"attempts {', '.join(str(n) for n in self.unpriced)} have no price"

    def to_dict(self) -> dict[str, Any]:
        """The run's figures (its attempts' are each theirs)."""
        return {
            "attempts": len(self.attempts),
            "wall_s": self.wall_s,
            "node_hours": self.node_hours,
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd,
            "unknown_cost": self.unknown_cost(),
        }


def run_usage(attempts: Sequence[AttemptUsage]) -> RunUsage:
    """The run's figures from its attempts' (in any order; one per attempt number, the last given wins)."""
    by_number = {a.attempt: a for a in attempts}
    return RunUsage(tuple(by_number[n] for n in sorted(by_number)))
