"""What `hpcjob cluster stop` and `cluster start` last found and did to each onboarded cluster: its state
(running or stopped) as of when, its compute nodes (how many, of which size, Spot or not) and its head
node's size, in `clusters.json` of hpcjob's state folder (~/.local/state/hpcjob). `hpcjob cluster list`
reads it to say each cluster's state and what it costs an hour without asking Azure (no network: the
prices are hpcjob.store.prices's answer from the cache, else the size table).

The record says what hpcjob saw then, not what the cluster is now: a VM started or deallocated in the
Azure portal since is not in it, and the list says "as of" when.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

RUNNING, STOPPED = "running", "stopped"
FILE_VERSION = 1


@dataclass(frozen=True)
class NodeKind:
    """Compute nodes of one size, Spot or not: `count` of them."""

    size: str
    spot: bool
    count: int

    @classmethod
    def from_dict(cls, data: Any) -> NodeKind | None:
        if not isinstance(data, dict) or set(data) != {"size", "spot", "count"}:
            return None
        size, spot, count = data["size"], data["spot"], data["count"]
        if not isinstance(size, str) or not isinstance(spot, bool):
            return None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return None
        return cls(size, spot, count)


@dataclass(frozen=True)
class PowerRecord:
    """One cluster as stop or start left it: `state` RUNNING or STOPPED, `as_of` (UTC, ISO 8601), its
    compute nodes by kind and its head node's size, in `region`."""

    cluster: str
    resource_group: str
    state: str
    as_of: str
    nodes: tuple[NodeKind, ...]
    head_size: str | None
    region: str | None

    @property
    def node_count(self) -> int:
        return sum(kind.count for kind in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nodes": [asdict(kind) for kind in self.nodes]}

    @classmethod
    def from_dict(cls, data: Any) -> PowerRecord | None:
        """From the file's form; None for an entry hpcjob cannot read (it is not trusted)."""
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            return None
        strings = ("cluster", "resource_group", "state", "as_of")
        if not all(isinstance(data[k], str) for k in strings) or data["state"] not in (RUNNING, STOPPED):
            return None
        if not all(data[k] is None or isinstance(data[k], str) for k in ("head_size", "region")):
            return None
        kinds = (
            [NodeKind.from_dict(kind) for kind in data["nodes"]]
            if isinstance(data["nodes"], list)
            else [None]
        )
        if any(kind is None for kind in kinds):
            return None
        return cls(**{**data, "nodes": tuple(kind for kind in kinds if kind is not None)})

    @property
    def when(self) -> str:
        """`as_of` in this machine's time, to the minute (`2026-11-27 14:02`)."""
        try:
            return dt.datetime.fromisoformat(self.as_of).astimezone().strftime("%Y-%m-%d %H:%M")
        except ValueError:
            return self.as_of


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def power_file() -> Path:
    from hpcjob.store.folders import user_folder

    return user_folder("state") / "clusters.json"


def power_records() -> dict[str, PowerRecord]:
    """The records by cluster name ({} without a file, or with one hpcjob cannot read)."""
    try:
        data = json.loads(power_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
        return {}
    clusters = data.get("clusters")
    if not isinstance(clusters, dict):
        return {}
    found = {name: PowerRecord.from_dict(entry) for name, entry in clusters.items()}
    return {name: record for name, record in found.items() if record is not None and record.cluster == name}


def power_record(cluster: str, resource_group: str) -> PowerRecord | None:
    """The cluster's record, if it is of the same resource group (a profile made again for another
    cluster of the same name has none)."""
    record = power_records().get(cluster)
    return record if record is not None and record.resource_group == resource_group else None


def keep_power_record(record: PowerRecord) -> Path:
    """Write the cluster's record in one step (a reader sees the old file or the new one)."""
    path = power_file()
    records = power_records()
    records[record.cluster] = record
    text = json.dumps(
        {"version": FILE_VERSION, "clusters": {name: r.to_dict() for name, r in sorted(records.items())}},
        indent=1,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".clusters.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text + "\n")
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return path


@dataclass(frozen=True)
class HourlyCost:
    """What a cluster costs an hour in its recorded state, US dollars: its compute nodes (none while
    stopped: deallocated VMs cost nothing, their disks a little) and its head node (always); `approximate`
    when a price is the package's own table or another region's. None where a price is unknown, and
    `unknown` says why (one line each)."""

    nodes: float | None
    head: float | None
    approximate: bool
    unknown: tuple[str, ...] = ()

    @property
    def total(self) -> float | None:
        return None if self.nodes is None or self.head is None else self.nodes + self.head


def hourly_cost(record: PowerRecord) -> HourlyCost:
    """The record's cost an hour, as hpcjob.store.prices answers without the network: the prices
    cache, else the size table (a Spot node there only where the table has a sourced Spot price)."""
    from hpcjob.job.prices import LINUX, SPOT, WINDOWS
    from hpcjob.store.prices import hourly_price

    nodes: float | None = 0.0
    approximate = False
    unknown: list[str] = []
    for kind in record.nodes if record.state == RUNNING else ():
        price = hourly_price(kind.size, record.region, SPOT if kind.spot else LINUX, network=False)
        per_node = price.usd_per_hour
        nodes = None if nodes is None or per_node is None else nodes + kind.count * per_node
        approximate = approximate or price.approximate
        if price.unknown:
            unknown.append(f"{kind.size}{' (Spot)' if kind.spot else ''}: {price.unknown}")
    head = hourly_price(record.head_size, record.region, WINDOWS, network=False)
    if head.unknown and record.head_size:
        unknown.append(f"the head node ({record.head_size}): {head.unknown}")
    return HourlyCost(nodes, head.usd_per_hour, approximate or head.approximate, tuple(unknown))
