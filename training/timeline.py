"""A rank's metrics over time, as JSON lines: what `hpcjob runs plot` draws and elastic summaries read.

Each rank appends to ``<folder>/<NODE>-<local rank>.jsonl`` (hpcjob's run log folder, ``metrics/``):
one ``start`` line at each start of the workers (a restart of an elastic job too), a ``first_step``
line when the first training step of that start is done (``t``, and ``after_start_s``: seconds since the
task started), a ``step`` line every N steps (the loss, samples/s and data-wait share of those steps,
this rank's GPU utilisation and memory when a GPU is watched) and an ``epoch`` line with the epoch's
global results. Each line is written whole and flushed (a reader skips one cut short); fields it cannot
know are absent, never zeros.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from gpu_monitor import GpuMonitor, node_name
from operations import EpochMetrics


def default_folder(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """The run's metrics folder under hpcjob (its log folder, which node.sh names), else none."""
    log_dir = environ.get("HPCJOB_LOG_DIR")
    return Path(log_dir) / "metrics" if log_dir else None


class Timeline:
    """One rank's file of metrics over time."""

    def __init__(
        self,
        folder: Path,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        restart: int,
        monitor: GpuMonitor | None = None,
    ) -> None:
        self.node = node_name()
        self.common = {"node": self.node, "rank": rank, "world_size": world_size, "restart": restart}
        self.monitor = monitor
        folder.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = (folder / f"{self.node}-{local_rank}.jsonl").open("a", encoding="utf-8")
        self._last: tuple[float, float, int, float] | None = None  # time, loss sum, samples, data wait

    def _write(self, event: str, **fields: Any) -> None:
        line = {"t": round(time.time(), 3), "event": event, **self.common, **fields}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def start(self, first_epoch: int) -> None:
        """The workers (re)started here, to train from `first_epoch`."""
        self._write("start", first_epoch=first_epoch)

    def first_step(self, when: float, after_start_s: float) -> None:
        """The first training step since the workers started was done at `when` (Unix time), this long
        after the task started."""
        self._write("first_step", t=round(when, 3), after_start_s=round(after_start_s, 3))

    def begin_epoch(self) -> None:
        self._last = (time.perf_counter(), 0.0, 0, 0.0)

    def step(self, epoch: int, steps: int, loss_sum: float, samples: int, data_wait_s: float) -> None:
        """The figures of the steps since the last line (the epoch's running totals are given)."""
        now = time.perf_counter()
        if self._last is None:
            self.begin_epoch()
        assert self._last is not None
        then, loss_then, samples_then, wait_then = self._last
        self._last = (now, loss_sum, samples, data_wait_s)
        count, seconds = samples - samples_then, now - then
        if count <= 0 or seconds <= 0:
            return
        fields: dict[str, Any] = {
            "epoch": epoch,
            "step": steps,
            "loss": (loss_sum - loss_then) / count,
            "samples_per_sec": count / seconds,
            "data_wait_fraction": min(1.0, (data_wait_s - wait_then) / seconds),
        }
        sample = self.monitor.latest if self.monitor is not None else None
        if sample is not None:
            fields.update(gpu_util_pct=sample.util_pct, gpu_memory_mib=sample.memory_mib)
        self._write("step", **fields)

    def epoch(self, metrics: EpochMetrics) -> None:
        self._write("epoch", **asdict(metrics))

    def close(self) -> None:
        self.file.close()
