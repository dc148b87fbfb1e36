"""hpcjob worker shim: torchrun starts this in place of the training script, on every rank.

    python3 -m torch.distributed.run ... .hpcjob/worker.py SCRIPT [ARGS...]

It runs SCRIPT as `__main__` in this same process (signals, exit codes and tracebacks are the
script's own) and, when the script fails, writes `<time> <rank> <exit code> <node>` to
`$HPCJOB_EXIT_DIR/rank-<RANK>`. torchrun itself exits 1 whatever the failing rank's code was; with
these records the task exits with its first failing rank's code, and hpcjob can name the rank that
failed first in the whole job. Runs with any Python 3 on the node; imports nothing from hpcjob.
"""

import os
import runpy
import sys
import time


def _record(code: int) -> None:
    folder = os.environ.get("HPCJOB_EXIT_DIR")
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    node = os.environ.get("HPCJOB_NODE", "-")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank-{rank}"), "w") as record:
            record.write(f"{time.time():.6f} {rank} {code} {node}\n")
    except OSError:
        pass  # a record is a nicety: never let it hide the script's own failure


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code % 256
    return 1  # sys.exit("message") exits 1


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: worker.py SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 1
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
        raise
    except KeyboardInterrupt:
        code = 130
        raise
    finally:
        if code != 0:
            _record(code)


if __name__ == "__main__":
    main()
