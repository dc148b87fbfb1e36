"""How busy a rank's GPU is while it trains: NVML (the nvidia-ml-py package) read by a background thread
about once a second, so that the training loop never waits on it; the figures count from the first step.

Each rank watches its own GPU. Every `report_every_s` the thread prints one ``HPCJOB_GPU {...}`` line
(the latest figures) into the node's output, where ``hpcjob status`` and ``hpcjob logs`` of a running
job find them; at the end the run's metrics carry each rank's mean and peak utilisation and peak memory.
Without a GPU, or without nvidia-ml-py, there is no monitor and no GPU field at all (not zeros).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import torch

GPU_PREFIX = "HPCJOB_GPU "
MIB = 1 << 20


@dataclass(frozen=True)
class GpuSample:
    util_pct: float  # share of the last sample period in which a kernel ran
    memory_mib: float  # memory in use on the device, by all its processes


def node_name(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The node as hpcjob names it: HPCJOB_NODE on local runs (several "nodes" on one host), else the host."""
    return environ.get("HPCJOB_NODE") or socket.gethostname().split(".")[0].upper()


class GpuMonitor:
    """Samples `read` every `interval_s` in a daemon thread; keeps the mean, the peaks and the latest."""

    def __init__(
        self,
        read: Callable[[], GpuSample],
        gpu: str,
        *,
        rank: int = 0,
        node: str = "",
        interval_s: float = 1.0,
        report_every_s: float = 0.0,
        out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read, self.gpu, self.rank, self.node = read, gpu, rank, node
        self.interval_s, self.report_every_s, self.out, self.clock = interval_s, report_every_s, out, clock
        self.count = 0
        self.util_sum = self.util_peak = self.memory_peak = 0.0
        self.window_sum, self.window_count = 0.0, 0
        self.latest: GpuSample | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)

    def start(self) -> GpuMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample(self) -> None:
        """One reading (the thread calls it; tests call it directly)."""
        reading = self.read()
        with self._lock:
            self.latest = reading
            self.count += 1
            self.util_sum += reading.util_pct
            self.window_sum += reading.util_pct
            self.window_count += 1
            self.util_peak = max(self.util_peak, reading.util_pct)
            self.memory_peak = max(self.memory_peak, reading.memory_mib)

    def training_begins(self) -> None:
        """From the first step on, the mean and the peak utilisation are the training's: the start-up
        before it (a CUDA context, the rendezvous, the data), with the GPU idle, is left out of them.
        The memory peak stays."""
        with self._lock:
            self.count, self.util_sum, self.util_peak = 0, 0.0, 0.0
            self.window_sum, self.window_count = 0.0, 0

    def training_ended(self) -> None:
        """A last reading where the training was shorter than an interval: NVML's utilisation covers
        its own last sample period (1/6 s to 1 s: nvmlDeviceGetUtilizationRates), the training's end."""
        with self._lock:
            if self.count:
                return
        try:
            self.sample()
        except Exception:  # a driver hiccup: no figure rather than no run
            return

    def window_util(self) -> float | None:
        """The mean utilisation since the last call (an epoch's), None without a sample."""
        with self._lock:
            mean = self.window_sum / self.window_count if self.window_count else None
            self.window_sum, self.window_count = 0.0, 0
        return mean

    def summary(self) -> dict[str, Any] | None:
        """This rank's GPU use so far: what the metrics line carries; None before the first sample."""
        with self._lock:
            if not self.count:
                return None
            return {
                "rank": self.rank,
                "node": self.node,
                "gpu": self.gpu,
                "util_mean_pct": round(self.util_sum / self.count, 1),
                "util_peak_pct": round(self.util_peak, 1),
                "memory_peak_mib": round(self.memory_peak),
                "samples": self.count,
            }

    def report_line(self) -> str | None:
        """The latest figures as one ``HPCJOB_GPU`` line."""
        with self._lock:
            if self.latest is None or not self.count:  # none yet, or none since the first step
                return None
            payload = {
                "rank": self.rank,
                "node": self.node,
                "util_pct": round(self.latest.util_pct, 1),
                "memory_mib": round(self.latest.memory_mib),
                "util_mean_pct": round(self.util_sum / self.count, 1),
                "time": round(time.time(), 1),
            }
        return GPU_PREFIX + json.dumps(payload, sort_keys=True)

    def _run(self) -> None:
        next_report = self.clock() + self.report_every_s
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a driver hiccup must not end the run: stop watching, keep training
                return
            if self.report_every_s > 0 and self.clock() >= next_report:
                next_report = self.clock() + self.report_every_s
                line = self.report_line()
                if line:
                    print(line, file=self.out, flush=True)


def open_monitor(
    device: torch.device, rank: int, *, interval_s: float = 1.0, report_every_s: float = 0.0
) -> GpuMonitor | None:
    """A started monitor of `device`'s GPU, or None: not a CUDA device, no nvidia-ml-py, or NVML fails."""
    if device.type != "cuda":
        return None
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: the optional `gpu` extra
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        # By UUID: CUDA's device numbers (after CUDA_VISIBLE_DEVICES) are not NVML's.
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(device).uuid}")
        name = pynvml.nvmlDeviceGetName(handle)
    except Exception:  # pynvml.NVMLError and its many subclasses: no monitor, the run goes on
        return None

    def read() -> GpuSample:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        return GpuSample(float(util), pynvml.nvmlDeviceGetMemoryInfo(handle).used / MIB)

    monitor = GpuMonitor(
        read,
        name.decode() if isinstance(name, bytes) else str(name),
        rank=rank,
        node=node_name(),
        interval_s=interval_s,
        report_every_s=report_every_s,
    )
    return monitor.start()
