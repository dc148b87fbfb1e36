"""A training script's figures, as hpcjob reads them: over time and at the end.

Over time: each rank appends JSON lines to `<run log folder>/metrics/<NODE>-<local rank>.jsonl`
(HPCJOB_LOG_DIR, which hpcjob's node helper names): a `start` line when the process starts (each restart
of an elastic job's workers too), `first_step` when its first step is done, a `step` line every
`every_s` seconds with the loss, samples/s and data-wait share of the steps since the last one and the
script's own figures, an `epoch` line when the script says one ended. Each line is written whole and
flushed; a figure the script does not give is absent, never a zero. At the end: rank 0 prints one line,
`HPCJOB_METRICS {...}`, the run's totals over every rank, which the summary, `hpcjob runs` and `--json`
show. Without hpcjob (no HPCJOB_LOG_DIR and no folder given), rank 0 prints the step lines instead.

Python 3.6 and the standard library: torch is imported only by `summary`, where the ranks' figures are
summed (a collective, when torch.distributed is initialized).
"""

import contextlib
import json
import math
import os
import sys
import time
from typing import IO, Any, Dict, Optional

from hpctorch.process import env_int, timeline_line, timeline_path

# What hpcjob looks for in a task's output (hpcjob.job.results.METRICS_PREFIX; a test keeps them one).
METRICS_PREFIX = "HPCJOB_METRICS "


def _figures(figures: Dict[str, Any]) -> Dict[str, Any]:
    """The script's own figures a step or epoch line can hold: numbers and short text (a bool is not a
    number)."""
    kept: Dict[str, Any] = {}
    for key, value in figures.items():
        number = isinstance(value, (int, float)) and (isinstance(value, bool) or math.isfinite(value))
        if number or (isinstance(value, str) and len(value) <= 200):
            kept[key] = value
    return kept


def _json_value(value: Any, depth: int = 0) -> Any:
    """`value` as the metrics line holds it: JSON values, a number that is not finite (a diverged run)
    as null; what JSON cannot hold is left out (`_LEFT_OUT`)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if depth < 8 and isinstance(value, (list, tuple)):
        items = [_json_value(item, depth + 1) for item in value]
        return [item for item in items if item is not _LEFT_OUT]
    if depth < 8 and isinstance(value, dict):
        pairs = {str(k): _json_value(v, depth + 1) for k, v in value.items()}
        return {k: v for k, v in pairs.items() if v is not _LEFT_OUT}
    return _LEFT_OUT


_LEFT_OUT = object()


class Metrics:
    """One process's figures (every rank makes one, where its training loop begins): `step` after each
    training step, `epoch` when one ends, `summary` at the end. `folder`: where the lines go [default:
    the run's metrics folder under hpcjob, else none: the console]; a `step` line every `every_s`
    seconds."""

    def __init__(self, folder: Optional[str] = None, every_s: float = 10.0) -> None:
        self.rank = env_int("RANK", 0)
        self.world_size = env_int("WORLD_SIZE", 1)
        self.every_s = every_s
        path = timeline_path(folder)
        self.file: Optional[IO[str]] = None
        if path is not None:
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - until close
        self.began = time.perf_counter()  # the loop's time counts from here
        self.steps = 0
        self.samples = 0
        self.data_wait_s = 0.0
        self.last_step_at = self.began
        # Since the last step line: when it was written, samples, their loss summed, data wait, samples
        # with a loss; a tensor loss is summed on its device (`_loss_on_device`) and read at the line.
        self._since = (self.began, 0, 0.0, 0.0, 0)
        self._loss_on_device: Any = None
        self._write("start")

    def _write(self, event: str, **fields: Any) -> None:
        if self.file is None:
            return
        self.file.write(timeline_line(event, fields))
        self.file.flush()

    def step(
        self,
        samples: int,
        loss: Any = None,
        data_wait_s: float = 0.0,
        epoch: Optional[int] = None,
        step: Optional[int] = None,
        **figures: Any,
    ) -> None:
        """One training step done: `samples` this rank trained on, their mean `loss` (a number, or a
        torch tensor: summed where it is and read only when a line is written, so a GPU step is not made
        to wait for it), the seconds it
        waited for its data (`data_wait_s`), the `epoch`, the script's own count of steps (`step`, the one
        its checkpoints go by: what a later attempt redoes is counted in it; default: the steps of this
        process), and figures of the script's own (numbers; the newest of each is shown)."""
        now = time.perf_counter()
        self.steps += 1
        self.samples += samples
        self.data_wait_s += data_wait_s
        self.last_step_at = now
        then, count, loss_sum, waited, losses = self._since
        count += samples
        waited += data_wait_s
        if hasattr(loss, "detach"):
            summed = loss.detach().double() * samples
            self._loss_on_device = summed if self._loss_on_device is None else self._loss_on_device + summed
            losses += samples
        elif loss is not None and math.isfinite(loss):
            loss_sum += loss * samples
            losses += samples
        self._since = (then, count, loss_sum, waited, losses)
        if self.steps == 1:
            started = os.environ.get("HPCJOB_TASK_START")
            after: Dict[str, Any] = {}
            if started:
                with contextlib.suppress(ValueError):
                    after["after_start_s"] = round(time.time() - float(started), 3)
            self._write("first_step", **after)
        seconds = now - then
        if seconds < self.every_s or count <= 0:
            return
        line: Dict[str, Any] = {
            "step": self.steps if step is None else step,
            "samples_per_sec": count / seconds,
            "data_wait_fraction": min(1.0, waited / seconds),
        }
        if epoch is not None:
            line["epoch"] = epoch
        if self._loss_on_device is not None:
            loss_sum += float(self._loss_on_device.item())
            self._loss_on_device = None
        if losses and math.isfinite(loss_sum):
            line["loss"] = loss_sum / losses
        line.update(_figures(figures))
        self._write("step", **line)
        if self.file is None and self.rank == 0:
            said = ", ".join("{} {:.4g}".format(k, v) for k, v in sorted(line.items()) if k != "step")
            print("step {}: {}".format(self.steps, said), flush=True)
        self._since = (now, 0, 0.0, 0.0, 0)

    def epoch(self, epoch: int, **figures: Any) -> None:
        """An epoch ended, with the script's figures of it (accuracy, test loss, ...)."""
        self._write("epoch", epoch=epoch, **_figures(figures))

    def summary(self, **figures: Any) -> Dict[str, Any]:
        """The run's figures over every rank, with the script's own: steps, samples, samples/s over the
        loop's time (the slowest rank's, from this object's making to its last step), the share of it
        spent waiting for data; the script's figures (JSON values, rank 0's) beside them, or in their
        place where they share a name. Rank 0 prints them as the HPCJOB_METRICS line (a number that is
        not finite as null). Where torch.distributed is initialized it sums the ranks' figures: call it
        on every rank, as any collective."""
        seconds = max(self.last_step_at - self.began, 0.0)
        samples, waited, total_s, slowest = float(self.samples), self.data_wait_s, seconds, seconds
        world = 1
        if "torch" in sys.modules:
            samples, waited, total_s, slowest, world = _summed(samples, waited, total_s, slowest)
        result: Dict[str, Any] = {
            "steps": self.steps,
            "samples": int(samples),
            "wall_time_s": round(slowest, 3),
            "world_size": max(world, self.world_size),
        }
        if slowest > 0 and self.steps:
            result["samples_per_sec"] = round(samples / slowest, 3)
        if total_s > 0 and waited > 0:
            result["data_wait_fraction"] = round(min(1.0, waited / total_s), 4)
        result.update(_json_value(figures))
        if self.rank == 0:
            print(METRICS_PREFIX + json.dumps(result, sort_keys=True, allow_nan=False), flush=True)
        self.close()
        return result

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> "Metrics":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _summed(samples: float, waited: float, total_s: float, slowest: float) -> Any:
    """The figures summed over the ranks (the slowest rank's time: their maximum) where the script's
    process group is up; else as they are."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return samples, waited, total_s, slowest, 1
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    sums = torch.tensor([samples, waited, total_s], dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    longest = torch.tensor([slowest], dtype=torch.float64, device=device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    got = sums.tolist()
    return got[0], got[1], got[2], float(longest.item()), dist.get_world_size()
