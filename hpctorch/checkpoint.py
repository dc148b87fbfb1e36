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
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from hpctorch.process import env_int, node_name, timeline_line, timeline_path

MARKER = ".hpcjob-complete"
SAVE_PREFIX = "step-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or resumed, in one line."""


def _marker(path: str) -> Optional[Dict[str, Any]]:
    """A save's marker (None: no marker, or one that is not whole: the save is not complete)."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as marker:
            written = dict(json.load(marker))
        written["step"] = int(written["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return written


def complete_saves(folder: str) -> List[Tuple[int, str]]:
    """The marked saves of `folder`, (step, path), oldest first: in the order they were completed (a
    run that started afresh in a folder of older saves makes the newest), then by step."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        marker = _marker(path) if name.startswith(SAVE_PREFIX) else None
        if marker is not None:
            at = marker.get("at")
            found.append((at if isinstance(at, (int, float)) else 0.0, marker["step"], path))
    return [(step, path) for _, step, path in sorted(found)]


def _newest_save(folder: str, resume_from: Optional[str]) -> Any:
    """The save a run resumes: (step, path, extra) of the newest marked one of its own `folder`, else
    of `resume_from`; None for a fresh start; the error's line where `resume_from` holds none."""
    found = complete_saves(folder)
    if not found and resume_from:
        found = complete_saves(resume_from)
        if not found:
            return "hpctorch: {} holds no complete save (a folder with {}) to resume from".format(
                resume_from, MARKER
            )
    if not found:
        return None
    step, path = found[-1]
    marker = _marker(path) or {}
    extra = marker.get("extra")
    return step, path, extra if isinstance(extra, dict) else {}


class _Save:
    """A save in flight: its step and folder, when it began, the seconds training was held, the script's
    extra; set by DCP's writer thread when its writes end (`ended`), with why it failed (`error`)."""

    def __init__(self, step: int, path: str, began: float, held: float, extra: Dict[str, Any]) -> None:
        self.step, self.path, self.began, self.held, self.extra = step, path, began, held, extra
        self.ended = threading.Event()
        self.error: Optional[str] = None


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
        resume_from: Optional[str] = None,
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
        # Where a run with no save of its own starts from: an earlier run's folder, only read.
        self.resume_from = resume_from or os.environ.get("HPCJOB_RESUME_FROM") or None
        self.every_steps = every_steps
        self.every_s = 600.0 if every_steps is None and every_s is None else every_s
        self.keep = keep
        self.rank = env_int("RANK", 0)
        self.resumed_from: Optional[str] = None
        self.resumed_step = 0
        # The script's own small figures saved with each save (an epoch, counters), as `save` was given
        # them; after `resume`, the resumed save's.
        self.extra: Dict[str, Any] = {}
        self._last_step = 0
        self._last_at = time.monotonic()
        self._pending: Optional[_Save] = None  # the save in flight
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
        the one `resume_from` (HPCJOB_RESUME_FROM) names. The step it was saved after (0: none, a fresh
        start); `extra` then holds the script's figures saved with it. Rank 0 chooses the save and every
        rank loads that one (a rank whose view of the share lags cannot pick an older one)."""
        found = self._agreed(_newest_save(self.folder, self.resume_from))
        if isinstance(found, str):
            raise CheckpointError(found)
        if found is None:
            return 0  # a fresh start: DCP (seconds to import) is not needed before the first save
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
        from torch.distributed.checkpoint.state_dict_loader import load

        step, path, extra = int(found[0]), str(found[1]), dict(found[2])
        state = self._state(model, optimizer)
        options = {} if self._distributed() else {"no_dist": True}  # the load runs in training's group
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
        self.resumed_from, self.resumed_step, self.extra = path, step, extra
        self._last_step, self._last_at = step, time.monotonic()
        own = os.path.dirname(path) == os.path.normpath(self.folder)
        self._say("resumed from step {} ({})".format(step, os.path.basename(path) if own else path))
        told = {"step": step}
        if isinstance(extra.get("epoch"), int):
            told["epoch"] = extra["epoch"]
        _tell_timeline("resume", **told)
        return step

    def _agreed(self, choice: Any) -> Any:
        """Rank 0's `choice`, on every rank (a collective where a process group is up)."""
        if not self._distributed():
            return choice
        import torch.distributed as dist

        chosen = [choice]
        dist.broadcast_object_list(chosen, src=0)
        return chosen[0]

    def step(
        self, step: int, model: Any, optimizer: Any = None, extra: Optional[Dict[str, Any]] = None
    ) -> bool:
        """After training step `step`: a save begins when one is due (True), and a save in flight that
        has ended is marked. `extra`: as `save`'s."""
        self._finish(wait=False)
        due = (self.every_steps is not None and step - self._last_step >= self.every_steps) or (
            self.every_s is not None and time.monotonic() - self._last_at >= self.every_s
        )
        if due:
            self.save(step, model, optimizer, extra)
        return due

    def save(
        self, step: int, model: Any, optimizer: Any = None, extra: Optional[Dict[str, Any]] = None
    ) -> None:
        """Begin a save of `step` now (the one before it finished first: one in flight at most).
        `extra`: the script's own small figures to keep with it (an epoch, counters: JSON values, rank
        0's), which `resume` gives back in `extra`."""
        from torch.distributed.checkpoint.state_dict_saver import async_save

        kept = dict(extra or {})
        try:
            json.dumps(kept, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CheckpointError("hpctorch: extra must hold JSON values: {}".format(exc)) from None
        self._finish(wait=True)
        path = os.path.join(self.folder, "{}{:09d}".format(SAVE_PREFIX, step))
        if self.rank == 0:
            # A save of this step already there (an earlier run's, in a folder started afresh) is no
            # longer complete once it is written over: its marker goes before any rank writes (they
            # begin after DCP's first collective, which rank 0 joins after this).
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(path, MARKER))
        state = self._state(model, optimizer)
        began = time.perf_counter()
        future = async_save(state, checkpoint_id=path, **self._options())
        held = time.perf_counter() - began  # the state copied off the device: training waits for this
        pending = _Save(step, path, began, held, kept)
        # Marked as soon as it is written (DCP's writer thread runs this), not at the next call: a node
        # lost in the meantime finds it complete.
        written: Any = getattr(future, "upload_completion", future)  # AsyncSaveResponse, or a Future
        written.add_done_callback(lambda done: self._written(pending, done))
        self._pending = pending
        self._last_step, self._last_at = step, time.monotonic()

    def close(
        self,
        step: Optional[int] = None,
        model: Any = None,
        optimizer: Any = None,
        extra: Optional[Dict[str, Any]] = None,
    ) -> None:
        """At the end of training: with `step` and `model`, that step saved unless it is saved already
        (a later run may go on from it: `--resume-from`); the save in flight finished and marked."""
        if step is not None and model is not None and step > self._last_step:
            self.save(step, model, optimizer, extra)
        self._finish(wait=True)

    def _at_exit(self) -> None:
        """The script ended with a save in flight (no close): Python has waited for DCP's writer thread
        before this runs; the save is marked, or left unmarked (never resumed) where it failed (its
        process group gone first, say), said in one line."""
        if self._pending is None:
            return
        step = self._pending.step
        try:
            self._finish(wait=True)
        except CheckpointError as exc:
            print(
                "hpctorch: the save of step {} was in flight when the script ended, and is left unmarked "
                "(never resumed): {}".format(step, str(exc).replace("hpctorch: ", "", 1)),
                file=sys.stderr,
                flush=True,
            )

    def _written(self, save: "_Save", done: Any) -> None:
        """A save's writes ended (in DCP's writer thread): where they all succeeded, rank 0 marks it (DCP
        wrote `.metadata` once every rank's files were in) and prunes, and it is said; else why not is
        kept for `_finish` to raise."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

        try:
            done.result()
            written = time.perf_counter() - save.began
            if self.rank == 0:
                marker = {
                    "step": save.step,
                    "held_s": round(save.held, 3),
                    "written_s": round(written, 3),
                    "at": time.time(),
                    "extra": save.extra,
                }
                with open(os.path.join(save.path, MARKER), "w", encoding="utf-8") as out:
                    json.dump(marker, out)
                self._prune()
        except (Exception, CheckpointException) as exc:
            save.error = (
                "hpctorch: the save of step {} on {} failed ({} free there): {}; the last complete save is "
                "untouched".format(save.step, node_name(), _free_space(self.folder), _first_line(exc))
            )
        else:
            self.saved.append({"step": save.step, "held_s": save.held, "written_s": written})
            said = "saved step {} (training held {:.2f} s, written in {:.1f} s)"
            self._say(said.format(save.step, save.held, written))
            _tell_timeline(
                "checkpoint", step=save.step, held_s=round(save.held, 3), written_s=round(written, 3)
            )
        finally:
            save.ended.set()

    def _finish(self, wait: bool) -> None:
        """The save in flight, once its writes ended (waited for, with `wait`), done with: its failure
        raised here, in the script's thread."""
        save = self._pending
        if save is None or (not wait and not save.ended.is_set()):
            return
        save.ended.wait()
        self._pending = None
        if save.error is not None:
            raise CheckpointError(save.error)

    def _prune(self) -> None:
        """The marked saves past the newest `keep` removed, with the unmarked ones of a step before the
        newest marked one's (saves cut short; a later one may be in flight), never the one resumed
        from."""
        marked = complete_saves(self.folder)
        if not marked:
            return
        keep = {path for _, path in marked[-self.keep :]}
        newest = marked[-1][0]
        done = {path for _, path in marked}
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if not name.startswith(SAVE_PREFIX) or path in keep or path == self.resumed_from:
                continue
            try:
                step = int(name[len(SAVE_PREFIX) :])
            except ValueError:
                continue
            if path in done or step < newest:
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
