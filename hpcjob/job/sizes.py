"""The one table of Azure VM sizes hpcjob knows (hpcjob/job/sizes.json, package data beside this module):
each GPU size's GPUs (count, model, vendor), vCPUs, memory, local NVMe disks, CPU architecture,
InfiniBand, NCCL topology family and RDMA, quota family, Microsoft's health-check marks with their
sources, and its prices with their dates and sources; the CPU sizes for data nodes; the head node's.

Onboarding (hpcjob.azure), the prices (hpcjob.store.prices), the NCCL settings (hpcjob.job.fabric),
doctor's marks (hpcjob.checks) and the GPUs a node has when nothing else says (gpus_per_node) all read
it here, on the ground floor. Pure: the file is package data, read like the render's templates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

SIZES_FILE = "sizes.json"
# GPU vendors and CPU architectures, as the table spells them (the latter as `platform.machine()` does).
NVIDIA, AMD = "nvidia", "amd"
X86_64, AARCH64 = "x86_64", "aarch64"
# The health checks' all-reduce marks: nccl-tests' bus GB/s on NVIDIA GPUs, rccl-tests' on AMD ones.
ALLREDUCE_CHECKS = ("nccl_allreduce", "rccl_allreduce")
# The meters a table price may be of (hpcjob.job.prices's LINUX, SPOT, WINDOWS).
METERS = ("linux", "spot", "windows")


class SizeTableError(ValueError):
    """The packaged table is not what this module reads: a bug of the package, said in one line."""


@dataclass(frozen=True)
class Mark:
    """One of Microsoft's health checks for a size (Azure/azurehpc-health-checks conf/<size>.conf):
    `check` as the conf names it without `check_` (nccl_allreduce, rccl_allreduce, ib_bw_gdr,
    ib_bw_non_gdr, nvme_count), its pass mark in `unit`, the all-reduce's message in MiB, and where it is
    written (`source`: repository, commit, file and line)."""

    check: str
    value: float
    unit: str
    source: str
    message_mb: int | None = None


@dataclass(frozen=True)
class TablePrice:
    """A price in the table: US dollars an hour on one meter, in `region`, as of `as_of` (YYYY-MM or
    YYYY-MM-DD), from `source`. Every price has both: none enters the table without them."""

    usd_per_hour: float
    region: str
    as_of: str
    source: str


@dataclass(frozen=True)
class GpuSize:
    name: str
    gpus: int
    gpu: str
    vcpus: int
    gen2_only: bool
    quota_family: str | None  # None: none published (onboarding asks `az vm list-skus`)
    gpu_vendor: str = NVIDIA
    gpu_memory_gb: float | None = None  # all the VM's GPUs together
    memory_gb: float | None = None  # None: no source read
    nvme_disks: int | None = None  # local NVMe disks (None: unknown)
    nvme_total_gb: float | None = None  # their size together (None: unknown)
    cpu_arch: str = X86_64
    infiniband: str | None = None  # as Microsoft's size pages name it; None: they name none
    rdma: bool = False  # the HPC Pack templates' RDMA rule for the size
    nccl_family: str | None = None  # the Azure HPC image's topology family (hpcjob.job.fabric)
    marks: tuple[Mark, ...] = ()
    prices: Mapping[str, TablePrice] = field(default_factory=dict)
    retiring: str | None = None

    def mark(self, check: str) -> Mark | None:
        return next((mark for mark in self.marks if mark.check == check), None)

    @property
    def allreduce_mark(self) -> Mark | None:
        """The health checks' pass mark for an all-reduce across one VM's GPUs (NCCL's, or RCCL's on AMD
        GPUs), None: Microsoft publishes none for the size."""
        return next((mark for mark in self.marks if mark.check in ALLREDUCE_CHECKS), None)


@dataclass(frozen=True)
class CpuSize:
    """A CPU size for data nodes: its vCPUs, quota family and prices."""

    name: str
    vcpus: int
    quota_family: str
    cpu_arch: str = X86_64
    prices: Mapping[str, TablePrice] = field(default_factory=dict)


@dataclass(frozen=True)
class SizeTable:
    """The GPU sizes hpcjob onboards, the fractional ones it refuses, the CPU sizes for data nodes, the
    head node's size."""

    sizes: Mapping[str, GpuSize]
    fractional: Mapping[str, str]
    head_node_size: str
    head_node_vcpus: int
    head_node_quota_family: str
    cpu_sizes: Mapping[str, CpuSize] = field(default_factory=dict)
    head_node_prices: Mapping[str, TablePrice] = field(default_factory=dict)

    def any_size(self, name: str) -> GpuSize | CpuSize:
        """A GPU or a CPU size of the table (KeyError: neither): its vCPUs, quota family and prices."""
        return self.sizes[name] if name in self.sizes else self.cpu_sizes[name]

    def find(self, name: str) -> GpuSize | None:
        """The GPU size of that name, compared without case (Azure's names are not case-sensitive)."""
        return self.sizes.get(name) or next(
            (size for known, size in self.sizes.items() if known.casefold() == name.casefold()), None
        )

    def canonical(self, name: str) -> str:
        """The size as the table spells it (any kind, compared without case), else as given."""
        every = (*self.sizes, *self.cpu_sizes, self.head_node_size)
        return next((known for known in every if known.casefold() == name.casefold()), name)

    def prices_of(self, name: str) -> Mapping[str, TablePrice] | None:
        """The table's prices of any of its sizes by meter (None: not a size of the table)."""
        name = self.canonical(name)
        if name in self.sizes:
            return self.sizes[name].prices
        if name in self.cpu_sizes:
            return self.cpu_sizes[name].prices
        return self.head_node_prices if name == self.head_node_size else None

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SizeTable:
        """From the file's form; SizeTableError where a price lacks its date or source, or a figure is not
        a number."""
        sizes = {name: _gpu_size(name, row) for name, row in data["sizes"].items()}
        head = data["head_node"]
        return cls(
            sizes,
            dict(data["fractional"]),
            str(head["size"]),
            int(head["vcpus"]),
            str(head["quota_family"]),
            {
                name: CpuSize(
                    name,
                    int(row["vcpus"]),
                    str(row["quota_family"]),
                    str(row.get("cpu_arch", X86_64)),
                    _prices(name, row.get("prices", {})),
                )
                for name, row in data.get("cpu_sizes", {}).items()
            },
            _prices(str(head["size"]), head.get("prices", {})),
        )


def _gpu_size(name: str, row: Mapping[str, Any]) -> GpuSize:
    def number(key: str) -> float | None:
        value = row.get(key)
        return None if value is None else float(value)

    def count(key: str) -> int | None:
        value = row.get(key)
        return None if value is None else int(value)

    return GpuSize(
        name=name,
        gpus=int(row["gpus"]),
        gpu=str(row["gpu"]),
        vcpus=int(row["vcpus"]),
        gen2_only=row["generation"] == "gen2",
        quota_family=None if row.get("quota_family") is None else str(row["quota_family"]),
        gpu_vendor=str(row.get("gpu_vendor", NVIDIA)),
        gpu_memory_gb=number("gpu_memory_gb"),
        memory_gb=number("memory_gb"),
        nvme_disks=count("nvme_disks"),
        nvme_total_gb=number("nvme_total_gb"),
        cpu_arch=str(row.get("cpu_arch", X86_64)),
        infiniband=row.get("infiniband"),
        rdma=bool(row.get("rdma", False)),
        nccl_family=row.get("nccl_family"),
        marks=tuple(
            Mark(
                str(mark["check"]),
                float(mark["value"]),
                str(mark["unit"]),
                str(mark["source"]),
                None if mark.get("message_mb") is None else int(mark["message_mb"]),
            )
            for mark in row.get("marks", ())
        ),
        prices=_prices(name, row.get("prices", {})),
        retiring=row.get("retiring"),
    )


def _prices(size: str, rows: Mapping[str, Any]) -> dict[str, TablePrice]:
    prices = {}
    for meter, row in rows.items():
        value = row.get("usd_per_hour")
        if meter not in METERS or isinstance(value, bool) or not isinstance(value, int | float):
            raise SizeTableError(f"{size}: {meter} is not a price of a meter hpcjob knows")
        if not (math.isfinite(value) and 0 <= value < 1e6):
            raise SizeTableError(f"{size}: {meter} price {value} is not a price")
        missing = [key for key in ("region", "as_of", "source") if not str(row.get(key) or "").strip()]
        if missing:  # no price without its date and source
            raise SizeTableError(f"{size}: its {meter} price has no {' and no '.join(missing)}")
        prices[meter] = TablePrice(float(value), str(row["region"]), str(row["as_of"]), str(row["source"]))
    return prices


def read_table(text: str) -> SizeTable:
    return SizeTable.from_data(json.loads(text))


@cache
def size_table() -> SizeTable:
    """The packaged table (hpcjob/job/sizes.json), read once."""
    return read_table((resources.files(__package__) / SIZES_FILE).read_text(encoding="utf-8"))


# Where gpus_per_node came from (`render` says it).
FROM_COMMAND_LINE = "the command line"
FROM_PROFILE = "the cluster profile's gpus_per_node"


def gpus_per_node(
    given: int | None, profile_gpus: int | None, vm_size: str | None, table: SizeTable | None = None
) -> tuple[int | None, str | None]:
    """Each node's GPUs and where that comes from: the command line (`given`), else the profile's
    gpus_per_node, else the size table's GPUs of the profile's vm_size; (None, None) when none says."""
    if given is not None:
        return given, FROM_COMMAND_LINE
    if profile_gpus:
        return profile_gpus, FROM_PROFILE
    size = (table or size_table()).find(vm_size) if vm_size else None
    if size is None:
        return None, None
    return size.gpus, f"the size table ({size.name}: {size.gpus} GPUs)"
