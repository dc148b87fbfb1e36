"""hpcjob worker shim: torchrun starts this in place of the training script, on every rank.

    python3 -m torch.distributed.run ... .hpcjob/worker.py SCRIPT [ARGS...]

It forks at once. The child runs SCRIPT as `__main__` (signals, exit codes and tracebacks are the
script's own). This process, the one torchrun knows, waits for it and, when the rank failed, writes
`<time> <rank> <exit code> <node> <signal or ->` to `$HPCJOB_EXIT_DIR/rank-<RANK>`, then ends the same
way as the rank (its exit code, or killed by its signal). Only a parent sees a process die of SIGKILL
(the OOM killer), a segfault or os._exit, so the record is written here, at the moment of death.
torchrun itself exits 1 whatever the failing rank's code was; with these records the task exits with
its first failing rank's code, and hpcjob names the rank, node and signal that failed first.

Stopping signals are not passed on: torchrun signals a worker's whole process group, and the node
agent (or hpcjob) every process of the task, so the child gets them itself. To stop one rank by hand,
signal its group (`kill -INT -- -PID`). The child dies with this process (PR_SET_PDEATHSIG).
Runs with any Python 3 on the node; imports nothing from hpcjob.
"""

import contextlib
import os
import runpy
import signal
import sys
import time

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def _record(code: int, signal_name: str) -> None:
    folder = os.environ.get("HPCJOB_EXIT_DIR")
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    node = os.environ.get("HPCJOB_NODE", "-")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank-{rank}"), "w") as record:
            record.write(f"{time.time():.6f} {rank} {code} {node} {signal_name}\n")
    except OSError:
        pass  # a record is a nicety: never let it hide the script's own failure


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


def _watch(child: int) -> None:
    """Wait for the rank's process, record its failure, and end as it ended. Never returns."""
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # the child gets them itself (see above)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        _record(128 + number, signal.Signals(number).name)
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
        _record(code, "-")
    os._exit(code)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: worker.py SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if hasattr(os, "fork"):
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child:
            _watch(child)
        _die_with_parent()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
