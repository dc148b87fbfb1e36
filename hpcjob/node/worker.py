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
Runs with any Python 3 on the node; imports nothing from hpcjob.
"""

import contextlib
import os
import runpy
import signal
import sys
import time
from typing import Optional

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


def _run(script: str, reports: Optional[int]) -> None:
    """Run the script as `__main__`, as the rank; tell the watching shim a failing exit code."""
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


def _report(reports: Optional[int], code: int) -> None:
    if reports is not None and code != 0:
        with contextlib.suppress(OSError):
            os.write(reports, f"{time.time():.6f} {code}\n".encode())


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: worker.py SCRIPT [ARGS...]")
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
