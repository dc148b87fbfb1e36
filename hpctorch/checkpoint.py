"""Checkpoints that cost little and resume anywhere, through torch.distributed.checkpoint (DCP).

Each save is a folder of the run's checkpoint folder (HPCJOB_CHECKPOINT_DIR, which hpcjob gives each
run: two runs never share one), `step-<step>/`, with a file per rank and DCP's `.metadata`. It is
written in the background (`dcp.async_save`): training stops only while the state is copied off the
device, and that time is measured per save. DCP's coordinator, rank 0, writes `.metadata` once every
rank's files are written; rank 0 then writes the marker, `.hpcjob-complete`, last. Only a marked save is
ever resumed, so a save cut short by a lost node is never chosen. The newest `keep` marked saves stay;
older ones go (never the one being written, nor the one this process resumed from).

`resume` loads the newest marked save of the run's own folder (an attempt after a lost node), else of
HPCJOB_RESUME_FROM (`--resume-from RUN`); DCP reshards on load, so a run of fewer nodes resumes a save of
more. Python 3.6 syntax and the standard library at import: torch is imported by the calls.
"""

import atexit
import contextlib
import json
import os
import re
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from hpctorch.process import env_int, node_name, timeline_line, timeline_path

MARKER = ".hpcjob-complete"
SAVE_PREFIX = "step-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or resumed, in one line."""


def complete_saves(folder: str) -> List[Tuple[int, str]]:
    """The marked saves of `folder`, (step, path), oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        if not name.startswith(SAVE_PREFIX) or not os.path.isfile(os.path.join(path, MARKER)):
            continue
        try:
            with open(os.path.join(path, MARKER), encoding="utf-8") as marker:
                step = int(json.load(marker)["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append((step, path))
    return sorted(found)


class Checkpoints:
    """The run's checkpoints: `resume(model, optimizer)` once before training, `step(step, model,
    optimizer)` after each step (it saves when `every_steps` steps or `every_s` seconds have passed since
    the last save), `close(step, model, optimizer)` at the end (the last step saved, every save finished
    and marked). Every rank makes one and calls each of them: they are collectives."""

    def __init__(
        self,
        folder: Optional[str] = None,
        every_steps: Optional[int] = None,
        every_s: Optional[float] = None,
        keep: int = 2,
    ) -> None:
        folder = folder or os.environ.get("HPCJOB_CHECKPOINT_DIR")
        if not folder:
            raise CheckpointError(
                "hpctorch: no checkpoint folder: run under hpcjob (HPCJOB_CHECKPOINT_DIR), or give "
                "Checkpoints(folder=...)"
            )
        if keep < 1:
            raise CheckpointError("hpctorch: keep must be at least 1")
        self.folder = folder
        self.every_steps = every_steps
        self.every_s = 600.0 if every_steps is None and every_s is None else every_s
        self.keep = keep
        self.rank = env_int("RANK", 0)
        self.resumed_from: Optional[str] = None
        self.resumed_step = 0
        self._last_step = 0
        self._last_at = time.monotonic()
        # The save in flight: (step, path, future, when it began, seconds training was held).
        self._pending: Optional[Tuple[int, str, Any, float, float]] = None
        self._group: Any = None
        # Each save's figures once marked: step, the seconds training was held, the seconds to write it.
        self.saved: List[Dict[str, Any]] = []
        atexit.register(self._at_exit)  # a script that ends without close(): its save said, not lost
        try:
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, ".hpcjob-probe-{}-{}".format(node_name(), os.getpid()))
            with open(probe, "w") as written:
                written.write("")
        except OSError as exc:
            raise CheckpointError(
                "hpctorch: checkpoint folder {} cannot be written on {}: {}".format(
                    folder, node_name(), exc.strerror or exc
                )
            ) from None
        # Written, so writable; a share may hold a closed file a moment (smbnetfs: EBUSY): left, then.
        with contextlib.suppress(OSError):
            os.remove(probe)

    def _say(self, line: str) -> None:
        if self.rank == 0:
            print("hpctorch: " + line, flush=True)

    def _distributed(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def _options(self) -> Dict[str, Any]:
        """How DCP reaches the other ranks: a gloo group of its own for saves (an async save's collectives
        run beside training's), none without a process group."""
        if not self._distributed():
            return {"no_dist": True}
        import torch.distributed as dist

        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return {"process_group": self._group}

    @staticmethod
    def _state(model: Any, optimizer: Any) -> Dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"model": get_model_state_dict(model)}
        model_state, optimizer_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def resume(self, model: Any, optimizer: Any = None) -> int:
        """Load the newest complete save into `model` (and `optimizer`), in place: this run's own, else
        the one HPCJOB_RESUME_FROM names. The step it was saved after (0: none, a fresh start)."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
        from torch.distributed.checkpoint.state_dict_loader import load

        found = complete_saves(self.folder)
        source = self.folder
        if not found and os.environ.get("HPCJOB_RESUME_FROM"):
            source = os.environ["HPCJOB_RESUME_FROM"]
            found = complete_saves(source)
            if not found:
                raise CheckpointError(
                    "hpctorch: {} holds no complete save (a folder with {}) to resume from".format(
                        source, MARKER
                    )
                )
        if not found:
            return 0
        step, path = found[-1]
        state = self._state(model, optimizer)
        options = self._options()
        options.pop("process_group", None)  # the load runs in the foreground: training's group
        if "no_dist" not in options and not self._distributed():
            options["no_dist"] = True
        try:
            load(state, checkpoint_id=path, **options)
        except (Exception, CheckpointException) as exc:  # another model's missing key, a torn file
            raise CheckpointError(
                "hpctorch: cannot resume from {}: {}".format(path, _first_line(exc))
            ) from None
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        self.resumed_from, self.resumed_step = path, step
        self._last_step, self._last_at = step, time.monotonic()
        self._say(
            "resumed from step {} ({})".format(
                step, path if source != self.folder else os.path.basename(path)
            )
        )
        _tell_timeline("resume", step=step)
        return step

    def step(self, step: int, model: Any, optimizer: Any = None) -> bool:
        """After training step `step`: a save begins when one is due (True), and a save in flight that
        has ended is marked."""
        self._finish(wait=False)
        due = (self.every_steps is not None and step - self._last_step >= self.every_steps) or (
            self.every_s is not None and time.monotonic() - self._last_at >= self.every_s
        )
        if due:
            self.save(step, model, optimizer)
        return due

    def save(self, step: int, model: Any, optimizer: Any = None) -> None:
        """Begin a save of `step` now (the one before it finished first: one in flight at most)."""
        from torch.distributed.checkpoint.state_dict_saver import async_save

        self._finish(wait=True)
        path = os.path.join(self.folder, "{}{:09d}".format(SAVE_PREFIX, step))
        state = self._state(model, optimizer)
        began = time.perf_counter()
        future = async_save(state, checkpoint_id=path, **self._options())
        held = time.perf_counter() - began  # the state copied off the device: training waits for this
        self._pending = (step, path, future, began, held)
        self._last_step, self._last_at = step, time.monotonic()

    def close(self, step: Optional[int] = None, model: Any = None, optimizer: Any = None) -> None:
        """At the end of training: with `step` and `model`, that step saved unless it is saved already
        (a later run may go on from it: `--resume-from`); the save in flight finished and marked."""
        if step is not None and model is not None and step > self._last_step:
            self.save(step, model, optimizer)
        self._finish(wait=True)

    def _at_exit(self) -> None:
        """The script ended with a save in flight (no close): Python has waited for DCP's writer thread
        before this runs; the save is marked, or left unmarked (never resumed) where it failed (its
        process group gone first, say), said in one line."""
        if self._pending is None:
            return
        step = self._pending[0]
        try:
            self._finish(wait=True)
        except CheckpointError as exc:
            print(
                "hpctorch: the save of step {} was in flight when the script ended, and is left unmarked "
                "(never resumed): {}".format(step, str(exc).replace("hpctorch: ", "", 1)),
                file=sys.stderr,
                flush=True,
            )

    def _finish(self, wait: bool) -> None:
        if self._pending is None:
            return
        step, path, future, began, held = self._pending
        done = getattr(future, "upload_completion", future)  # AsyncSaveResponse, or a Future
        if not wait and not done.done():
            return
        self._pending = None
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

        try:
            done.result()
        except (Exception, CheckpointException) as exc:
            free = _free_space(self.folder)
            raise CheckpointError(
                "hpctorch: the save of step {} on {} failed ({} free there): {}; the last complete save is "
                "untouched".format(step, node_name(), free, _first_line(exc))
            ) from None
        written = time.perf_counter() - began
        if self.rank == 0:
            marker = {
                "step": step,
                "held_s": round(held, 3),
                "written_s": round(written, 3),
                "at": time.time(),
            }
            with open(os.path.join(path, MARKER), "w", encoding="utf-8") as out:
                json.dump(marker, out)
            self._prune()
        self.saved.append({"step": step, "held_s": held, "written_s": written})
        self._say("saved step {} (training held {:.2f} s, written in {:.1f} s)".format(step, held, written))
        _tell_timeline("checkpoint", step=step, held_s=round(held, 3), written_s=round(written, 3))

    def _prune(self) -> None:
        """The marked saves past the newest `keep` removed, with the unmarked ones older than the newest
        marked one (saves cut short), never the one resumed from."""
        marked = complete_saves(self.folder)
        keep = {path for _, path in marked[-self.keep :]}
        newest = marked[-1][0] if marked else -1
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if not name.startswith(SAVE_PREFIX) or path in keep or path == self.resumed_from:
                continue
            try:
                step = int(name[len(SAVE_PREFIX) :])
            except ValueError:
                continue
            if step < newest:
                shutil.rmtree(path, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    """Why, in one line: DCP's CheckpointException holds each rank's traceback; its cause is the last line
    that names an error (a missing key of another model), else the message's first line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[A-Za-z_.]*(Error|Exception): ", line)]
    if named:
        return named[-1]
    return lines[0] if lines else type(exc).__name__


def _free_space(folder: str) -> str:
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return "unknown"
    return "{:.1f} MiB".format(usage.free / 2**20)


def _tell_timeline(event: str, **fields: Any) -> None:
    """A line in this rank's timeline (hpctorch.metrics's file), where hpcjob runs it."""
    try:
        path = timeline_path()
        if path is not None:
            with open(path, "a", encoding="utf-8") as out:
                out.write(timeline_line(event, fields))
    except OSError as exc:
        print("hpctorch: warning: the timeline was not written: {}".format(exc), file=sys.stderr)
