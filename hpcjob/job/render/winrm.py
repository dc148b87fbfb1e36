"""What hpcjob sends to the head node over WinRM: one fixed command line, and the script with its data
over the command's stdin. Pure: no I/O.

Every script is a template (templates/winrm/) that reads its values from `$Data`, so no value (a job
name, a node name, a path, an argument, the environment, the password) is ever part of a script's
text or of a command line: the command line is the same short text for every call, and the stdin is
one ASCII JSON object {Script, Data} that the bootstrap reads, parses and runs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

from hpcjob.job.render.text import templates

SCRIPTS = (
    "submit", "find", "status", "outputs", "cancel", "nodes", "busy", "clusrun", "offline", "online", "group",
)  # fmt: skip
POWERSHELL = "powershell.exe"


@cache
def winrm_script(name: str) -> str:
    """The PowerShell text of one operation (`SCRIPTS`)."""
    if name not in SCRIPTS:
        raise ValueError(f"no WinRM script {name!r}")
    return templates().get_template(f"winrm/{name}.ps1").render()


@cache
def bootstrap_command() -> tuple[str, tuple[str, ...]]:
    """The command and arguments that run a script from stdin: the same for every call (a few hundred
    characters), whatever the job's size."""
    text = templates().get_template("winrm/bootstrap.ps1").render()
    # Shorter: no comments, no indentation (PowerShell needs neither).
    script = "\n".join(line.strip() for line in text.splitlines() if not line.lstrip().startswith("#"))
    encoded = base64.b64encode(script.encode("utf-16-le")).decode("ascii")
    return POWERSHELL, ("-NoLogo", "-NoProfile", "-NonInteractive", "-EncodedCommand", encoded)


def script_input(name: str, data: Mapping[str, Any]) -> bytes:
    """The stdin of the bootstrap for script `name` with `data`: ASCII, whatever the console's code
    page (JSON escapes every other character)."""
    return json.dumps({"Script": winrm_script(name), "Data": dict(data)}, ensure_ascii=True).encode("ascii")
