"""How a local run shares this machine's GPUs out among its nodes, as a cluster gives each node its own.

Without this, every local "node" sees every GPU, and two ranks on one GPU make NCCL stop ("Duplicate
GPU detected"). Each node gets its own GPUs through CUDA_VISIBLE_DEVICES; the processes per node default
to the GPUs each node gets. When there are fewer GPUs than ranks, the job still runs, on the CPU with
gloo (NCCL cannot put two ranks on one GPU), and says so once. A cluster's nodes are not touched: each
task sees its node's GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the NVIDIA driver has


@dataclass(frozen=True)
class GpuShare:
    """Per node, its CUDA_VISIBLE_DEVICES ("" for none; None: leave the environment as it is), and the
    one line to say when the job cannot have a GPU per rank."""

    devices: tuple[str | None, ...]
    note: str | None = None


def visible_gpus(environ: Mapping[str, str], gpu_dir: str = NVIDIA_GPUS) -> tuple[str, ...]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names them: its own value when set (a chosen subset,
    or "" for none), else one index per GPU the NVIDIA driver lists. No torch import: hpcjob starts fast."""
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is not None:
        return tuple(name.strip() for name in chosen.split(",") if name.strip())
    try:
        count = len(os.listdir(gpu_dir))
    except OSError:
        count = 0
    return tuple(str(index) for index in range(count))


def default_procs_per_node(gpus: Sequence[str], nodes: int) -> int:
    """The GPUs each node gets (1 without GPUs, or with fewer GPUs than nodes)."""
    return max(1, len(gpus) // nodes)


def share_gpus(gpus: Sequence[str], nodes: int, procs_per_node: int) -> GpuShare:
    """Each node its own `procs_per_node` GPUs, in order; all on the CPU when there are too few."""
    if not gpus:
        return GpuShare((None,) * nodes)
    needed = nodes * procs_per_node
    if needed <= len(gpus):
        return GpuShare(
            tuple(",".join(gpus[i * procs_per_node : (i + 1) * procs_per_node]) for i in range(nodes))
        )
    note = (
        f"hpcjob: {len(gpus)} GPU(s) for {nodes} node(s) x {procs_per_node} process(es): every rank needs "
        "a GPU of its own (NCCL refuses two ranks on one), so the job runs on the CPU with gloo; use at "
        f"most {len(gpus)} ranks in all to train on the GPUs"
    )
    return GpuShare(("",) * nodes, note)
