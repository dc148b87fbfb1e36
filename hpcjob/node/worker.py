"""hpcjob worker shim: torchrun starts this in place of the training script, on every rank.

    python3 -m torch.distributed.run ... .hpcjob/worker.py SCRIPT [ARGS...]

It forks at once. The child runs SCRIPT as `__main__` (signals, exit codes and tracebacks are the
script's own). This process, the one torchrun knows, waits for it and, when the rank failed, writes
`<time> <rank> <exit code> <node> <signal or ->` to `$HPCJOB_EXIT_DIR/rank-<RANK>`, then ends the same
way as the rank (its exit code, or killed by its signal). Only a parent sees a process die of SIGKILL
(the OOM killer), a segfault or os._exit, so the record is written here, at the moment of death. When
the script itself ends with a failing code (`sys.exit(3)`, an exception), the rank tells the shim that
code through a pipe first: it is recorded even if the process then aborts in a destructor.
torchrun itself exits 1 whatever the failing rank's code was; with these records the task exits with
its first failing rank's code, and hpcjob names the rank, node and signal that failed first.

Stopping signals are not passed on: torchrun signals a worker's whole process group, and the node
agent (or hpcjob) every process of the task, so the child gets them itself. To stop one rank by hand,
signal its group (`kill -INT -- -PID`). The child dies with this process (PR_SET_PDEATHSIG).

With `HPCJOB_BEAT_S` set (the job's --hang-timeout), the rank beats: a thread of its own rewrites
`$HPCJOB_BEAT_DIR/rank-<RANK>.json` every that many seconds with the time and, once the script has a
process group, the newest collective of each group from PyTorch's flight recorder (its sequence number,
its name, when it began). A rank that is stopped, or stuck holding the GIL, stops beating; a rank that
sleeps or loops in Python beats on but falls behind the others' collectives. hpcjob, following the job,
tells these apart (hpcjob/job/hangs.py). When `$HPCJOB_BEAT_DIR/dump` appears (hpcjob found a hang), each
rank that still beats writes, once, where its threads are in Python (`stacks-rank-<RANK>.txt` there) and
its flight recorder, where the job's TORCH_FR_DUMP_TEMP_FILE says, with its process groups named as torch's
analyzer (`torchfrtrace`) looks them up. The beat stops when the script ends.
Runs with any Python 3 on the node; imports nothing from hpcjob.
"""

import contextlib
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def _record(when: float, code: int, signal_name: str) -> None:
    folder = os.environ.get("HPCJOB_EXIT_DIR")
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    node = os.environ.get("HPCJOB_NODE", "-")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank-{rank}"), "w") as record:
            record.write(f"{when:.6f} {rank} {code} {node} {signal_name}\n")
    except OSError:
        pass  # a record is a nicety: never let it hide the script's own failure


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code % 256
    return 1  # sys.exit("message") exits 1


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the watching shim) dies, however it dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the node agent's cleanup still reaches every process of the task
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _watch(child: int, reports: int) -> None:
    """Wait for the rank's process, record its failure, and end as it ended. Never returns.

    `reports` is a pipe on which the rank says what it meant to exit with (`sys.exit(3)`, an exception:
    1) when the script ends so: a process group's destructor may still abort the process after that,
    and the script's own code is the one that says why.
    """
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # the child gets them itself (see above)
    _, status = os.waitpid(child, 0)
    end = time.time()
    os.set_blocking(reports, False)  # the rank's own children may hold the pipe open
    try:
        said = os.read(reports, 64).split()
    except BlockingIOError:
        said = []
    if len(said) == 2:
        _record(float(said[0]), int(said[1]), "-")
        os._exit(int(said[1]))
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        _record(end, 128 + number, signal.Signals(number).name)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the rank dumped core already, if at all
        except (ImportError, ValueError, OSError):
            pass
        with contextlib.suppress(OSError, ValueError):  # SIGKILL, SIGSTOP: at their default already
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        time.sleep(1)  # the signal is delivered at once; this only guards the fall-through
        os._exit(128 + number)
    code = os.WEXITSTATUS(status)
    if code != 0:
        _record(end, code, "-")
    os._exit(code)


def _recorded_collectives() -> List[Dict[str, Any]]:
    """The flight recorder's entries of this process (both of torch's recorders: the generic one, which
    gloo records in, and ProcessGroupNCCL's own), [] before the script has a process group. Never
    imports torch itself: a rank that has not imported it has no collective."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return []
    c10d = sys.modules["torch"]._C._distributed_c10d
    entries: List[Dict[str, Any]] = []
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            entries.extend(json.loads(dump()).get("entries") or [])
        except Exception:  # a recorder that is off, or not built in (NCCL on a CPU torch)
            continue
    return entries


def newest_collectives(entries: List[Dict[str, Any]]) -> Dict[str, List[Any]]:
    """Per process group: [sequence number, name, when it began (s since the epoch), state, in flight] of
    its newest collective (point-to-point operations have sequences of their own and are left out). In
    flight: not yet retired (gloo leaves its state at "scheduled"; NCCL's says "completed" first)."""
    newest: Dict[str, List[Any]] = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or [entry.get("pg_id", "0")]
        key = str(group[0])
        seq = int(entry.get("collective_seq_id") or 0)
        if key not in newest or seq > newest[key][0]:
            began = float(entry.get("time_created_ns") or 0) / 1e9
            state = str(entry.get("state"))
            in_flight = not entry.get("retired") and state != "completed"
            newest[key] = [seq, str(entry.get("profiling_name") or ""), round(began, 3), state, in_flight]
    return newest


def _write_whole(path: str, data: bytes) -> None:
    """Write `path` so that a reader sees the old content or the new, never half (over SMB too): through a
    file of a name nobody can guess, made anew (O_EXCL: never a link someone planted in the folder)."""
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".hpcjob-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _dump_flight_recorder(rank: str) -> None:
    """This rank's flight recorder, as torch itself writes it on a timeout (a pickle that torch's
    `torchfrtrace` reads), to TORCH_FR_DUMP_TEMP_FILE + rank: of the two recorders, the one that holds
    entries (NCCL's own on GPUs; the generic one, gloo's, answers as well, empty, and vice versa)."""
    import pickle

    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    dist = sys.modules.get("torch.distributed")
    if not prefix or dist is None or not dist.is_initialized():
        return
    c10d = sys.modules["torch"]._C._distributed_c10d
    best: Optional[bytes] = None
    most = -1
    loaded: Dict[str, Any] = {}
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        dump = getattr(c10d, name, None)
        try:  # without C++ stack traces: symbolising them takes seconds, and the job is being ended
            trace = dump(includeStackTraces=False) if dump is not None else None
            content = pickle.loads(trace) if trace else {}
            entries = len(content.get("entries") or []) if trace else -1
        except Exception:  # that recorder is not there, or says nothing we can read: the other one
            continue
        if entries > most:
            best, most, loaded = trace, entries, content
    if best is None:
        return
    try:
        groups = _named_groups(loaded.get("entries") or [], loaded.get("pg_config") or {})
        if groups is not None:
            # Protocol 2, as torch's own dump (its first bytes say so).
            best = pickle.dumps(dict(loaded, pg_config=groups), protocol=2)
    except Exception:  # the dump as torch wrote it is still worth more than none
        pass
    _write_whole(prefix + rank, best)


def _named_groups(entries: List[Dict[str, Any]], config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The dump's `pg_config` as torch's analyzer (`torchfrtrace`) needs it, or None where it has it already:
    keyed by each process group's name as its entries name it (`process_group`: (name, desc)), with the
    group's global ranks. The analyzer looks each entry's group up by that name
    (torch/distributed/flight_recorder/components/builder.py L108-116 and L211-212), and torch 2.14.1's
    generic recorder, gloo's, writes one group under the name '' (its ranks: the newest group's, numbered
    in it) while its entries name ('0', 'default_pg'): KeyError. The names, descs and ranks come from
    torch.distributed's own table of this process's groups (distributed_c10d.py, _World.pg_names)."""
    named = {str(e["process_group"][0]) for e in entries if e.get("process_group")}
    if all(name in config for name in named) and "" not in config:
        return None
    world = sys.modules["torch.distributed.distributed_c10d"]._world
    groups = {name: value for name, value in config.items() if name}  # '' names no group of torch's
    for group, key in world.pg_names.items():
        name = str(key)
        if name in named and name not in groups:
            groups[name] = {
                "name": name,
                "desc": str(getattr(group, "group_desc", "undefined")),
                "ranks": str(sorted(world.pg_group_ranks[group])),  # global ranks, "[0, 1]" as torch writes
            }
    return groups


def _dump_stacks(folder: str, rank: str) -> None:
    """Where each thread of this rank is in Python, to stacks-rank-<RANK>.txt beside the beats, as
    Python's tracebacks say it (innermost last), the main thread first: the rank that held the others up
    says what it was doing."""
    import traceback

    main = threading.main_thread().ident
    frames = sys._current_frames()
    blocks = []
    for ident in sorted(frames, key=lambda i: i != main):
        name = "main thread" if ident == main else f"thread {ident}"
        blocks.append(f"{name}:\n" + "".join(traceback.format_stack(frames[ident])))
    _write_whole(os.path.join(folder, f"stacks-rank-{rank}.txt"), "\n".join(blocks).encode())


def _beat(folder: str, every_s: float, stop: threading.Event) -> None:
    """The rank's beat (see the module's notes), until `stop`. Never raises: a beat lost is a beat late,
    and a share that is slow to write must not disturb the training."""
    rank = os.environ.get("RANK", "0")
    path = os.path.join(folder, f"rank-{rank}.json")
    dumped = False
    while not stop.is_set():
        try:
            os.makedirs(folder, exist_ok=True)
            beat = {
                "t": round(time.time(), 3),
                "rank": int(rank),
                "node": os.environ.get("HPCJOB_NODE", "-"),
                "pid": os.getpid(),
                "collectives": newest_collectives(_recorded_collectives()),
            }
            _write_whole(path, json.dumps(beat).encode())
            if not dumped and os.path.exists(os.path.join(folder, "dump")):
                dumped = True
                _dump_stacks(folder, rank)
                _dump_flight_recorder(rank)
        except Exception:  # see above
            pass
        stop.wait(every_s)


def _start_beat() -> Optional[Callable[[], None]]:
    """Start the rank's beat if the job asks for one; what stops it (None: no beat)."""
    try:
        every_s = float(os.environ.get("HPCJOB_BEAT_S") or 0)
    except ValueError:
        return None
    folder = os.environ.get("HPCJOB_BEAT_DIR")
    if every_s <= 0 or not folder:
        return None
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(folder, every_s, stop), name="hpcjob-beat", daemon=True)
    beat.start()

    def stopped() -> None:  # before Python's shutdown: never inside torch while it is torn down
        stop.set()
        beat.join(timeout=10)

    return stopped


def _run(script: str, reports: Optional[int]) -> None:
    """Run the script as `__main__`, as the rank; tell the watching shim a failing exit code."""
    stop_beat = _start_beat()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        _report(reports, _exit_code(exc))
        raise
    except KeyboardInterrupt:
        raise  # Python ends by SIGINT: the shim records the signal
    except BaseException:
        _report(reports, 1)  # an uncaught exception exits 1
        raise
    finally:
        if stop_beat is not None:
            stop_beat()


def _report(reports: Optional[int], code: int) -> None:
    if reports is not None and code != 0:
        with contextlib.suppress(OSError):
            os.write(reports, f"{time.time():.6f} {code}\n".encode())


# The flight recorder's size: torch 2.14 reads TORCH_FR_BUFFER_SIZE, and warns once a rank that
# TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated when that is set too; an older torch reads only the older
# name (torch/include/torch/csrc/distributed/c10d/FlightRecorder.hpp L111 in 2.14.1: getCvarInt of both,
# the new first). The job sets both; the rank keeps the one its own torch reads.
BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
RECORDER_HEADER = ("include", "torch", "csrc", "distributed", "c10d", "FlightRecorder.hpp")


def _one_buffer_name() -> None:
    """Leave set only the buffer size name the torch this task imports reads, judged from its own
    FlightRecorder.hpp (without importing torch); both where it cannot be told."""
    if not all(name in os.environ for name in BUFFER_NAMES):
        return
    import importlib.util

    try:
        found = importlib.util.find_spec("torch")
        origin = found.origin if found else None
        if not origin:
            return
        with open(os.path.join(os.path.dirname(origin), *RECORDER_HEADER), "rb") as header:
            knows_new = BUFFER_NAMES[0].encode() in header.read()
    except (OSError, ImportError, ValueError):
        return
    del os.environ[BUFFER_NAMES[1] if knows_new else BUFFER_NAMES[0]]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: worker.py SCRIPT [ARGS...]")
    _one_buffer_name()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    reports = None
    if hasattr(os, "fork"):
        sys.stdout.flush()
        sys.stderr.flush()
        reports, said = os.pipe()
        child = os.fork()
        if child:
            os.close(said)
            _watch(child, reports)
        os.close(reports)
        reports = said
        _die_with_parent()
    _run(script, reports)


if __name__ == "__main__":
    main()
