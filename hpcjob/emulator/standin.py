"""Nodes that cost almost nothing (`python -m hpcjob.emulator --stand-in SECONDS`; issue 42): each task's
real node helper (node.sh, the node files, the datasets) runs, then a stand-in takes torchrun's and the
script's place, doing for hpcjob's client what the node's ranks would (hpcjob/emulator/standin.sh says
what: output lines, beats, metrics, an exit record, a chosen failure or hang). The job XML and command
lines are the client's own: the nodes' `python3` is a shim that runs the stand-in for `-m
torch.distributed.run` and the real Python for everything else. A job that runs another Python (its
environment's, `--python`) runs for real."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from importlib import resources

SECONDS_VAR = "HPCJOB_STANDIN_SECONDS"
FAIL_VAR = "HPCJOB_STANDIN_FAIL"  # NODE:CODE
HANG_VAR = "HPCJOB_STANDIN_HANG"  # NODE or NODE:ATTEMPT
LINE_VAR = "HPCJOB_STANDIN_LINE_S"


def stand_in_env(
    folder: str,
    env: Mapping[str, str],
    *,
    seconds: float,
    fail: str | None = None,
    hang: str | None = None,
    line_s: float = 2.0,
) -> dict[str, str]:
    """The nodes' environment `env` with the stand-in first on their PATH (its files made in `folder`):
    every node runs `seconds`, `fail` ("NODE:CODE") fails halfway with CODE, `hang` ("NODE") stops
    halfway and waits to be killed."""
    os.makedirs(folder, exist_ok=True)
    script = os.path.join(folder, "standin.sh")
    with open(script, "wb") as out:
        out.write((resources.files("hpcjob") / "emulator" / "standin.sh").read_bytes())
    real = shutil.which("python3", path=env.get("PATH", os.defpath)) or sys.executable
    shim = os.path.join(folder, "python3")
    with open(shim, "w", encoding="utf-8") as out:
        out.write(
            "#!/bin/bash\n# hpcjob emulator --stand-in: torchrun's place taken, the rest the real Python's\n"
            'if [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then shift 2; '
            f'exec /bin/bash {shlex.quote(script)} "$@"; fi\n'
            f'exec {shlex.quote(real)} "$@"\n'
        )
    os.chmod(shim, 0o755)
    said = {SECONDS_VAR: str(int(seconds)), LINE_VAR: str(int(max(1, line_s)))}
    if fail:
        said[FAIL_VAR] = fail
    if hang:
        said[HANG_VAR] = hang
    return {**env, **said, "PATH": os.pathsep.join([folder, env.get("PATH", os.defpath)])}
