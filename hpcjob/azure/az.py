"""Running the Azure CLI (`az`) for `hpcjob cluster onboard` and `cluster delete`: the command lines come
from hpcjob.azure.template; secrets go to `az` on its standard input only (`--parameters @-`, which az reads
with its `@-` file prefix), so that they are in no argument list, file or log.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcjob.azure.template import AzCommands, GrowCommands, Operation
from hpcjob.job.spec import HpcjobError, SpecError

INSTALL_AZ = "https://learn.microsoft.com/cli/azure/install-azure-cli"


class AzError(HpcjobError):
    """`az` failed: its own error line."""


def _az(argv: Sequence[str]) -> list[str]:
    found = shutil.which(argv[0])  # az.cmd on Windows
    if found is None:
        raise SpecError(f"the Azure CLI (az) is not installed or not on PATH: see {INSTALL_AZ}")
    return [found, *argv[1:]]


def _error_line(stderr: str, argv: Sequence[str]) -> str:
    """az's own words: its last ERROR line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    said = errors[-1] if errors else lines[-1] if lines else "no message"
    words = itertools.takewhile(lambda word: not word.startswith("-"), argv)  # az and its command
    return f"{' '.join(words)} failed: {' '.join(said.split())}"


def run_az_text(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run one `az` command (`stdin`: what it reads for `@-`) and return what it printed."""
    done = subprocess.run(_az(argv), input=stdin or "", capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AzError(_error_line(done.stderr, argv))
    return done.stdout


def run_az(argv: Sequence[str], stdin: str | None = None) -> Any:
    """Run one `az` command and return its JSON answer (None when it printed nothing)."""
    text = run_az_text(argv, stdin)
    return json.loads(text) if text.strip() else None


def load_template(source: Path | None, sha256: str, name: str | None = None) -> dict[str, Any]:
    """A pinned template (the cluster's, else the packaged file `name`), from `source` (a local copy) or
    the copy the package holds (no network); refused unless its SHA-256 is the pinned one (a copy that
    is not the template hpcjob was written for, or a damaged install)."""
    from hpcjob.azure.data import packaged_template

    if source is not None:
        where, data = str(source), source.read_bytes()
    else:
        try:
            where, data = packaged_template() if name is None else packaged_template(name)
        except OSError as exc:
            raise HpcjobError(
                f"cannot read the ARM template that comes with hpcjob ({' '.join(str(exc).split())}): "
                "reinstall hpcjob"
            ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        said = f"the ARM template {where} is not the pinned one (its SHA-256 differs from {sha256})"
        if source is not None:
            raise SpecError(said)  # the user's copy: exit 2
        raise HpcjobError(f"{said}: reinstall hpcjob")  # the package's own copy: a damaged install
    template: dict[str, Any] = json.loads(data)
    return template


def deploy(
    commands: AzCommands | GrowCommands,
    secrets_json: str,
    progress: Callable[[str], None],
    *,
    poll_s: float = 15.0,
) -> dict[str, Any]:
    """`az deployment group create`, showing each resource as it finishes (the deployment takes tens of
    minutes). On failure, the failed resource's error in one line and the command that shows more."""
    process = subprocess.Popen(
        _az(commands.deploy),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    answers: list[tuple[str, str]] = []
    # communicate() feeds stdin and drains both pipes; a thread, so that progress shows meanwhile.
    talker = threading.Thread(target=lambda: answers.append(process.communicate(secrets_json)), daemon=True)
    talker.start()
    started = time.monotonic()
    seen: dict[str, str] = {}
    while True:
        talker.join(timeout=poll_s)
        ended = not talker.is_alive()
        operations = _operations(commands)
        for operation in operations:
            if seen.get(operation.resource) != operation.state and operation.state in ("Succeeded", "Failed"):
                seen[operation.resource] = operation.state
                minutes, seconds = divmod(int(time.monotonic() - started), 60)
                progress(f"[{minutes:02d}:{seconds:02d}] {operation.resource}: {operation.state}")
        if ended:
            break
    stdout, stderr = answers[0]
    if process.returncode == 0:
        answer: dict[str, Any] = json.loads(stdout)
        return answer
    failed = [op for op in _operations(commands) if op.state == "Failed" and op.error]
    see = " ".join(commands.operations[:-2])  # without --output json: a table a person reads
    if failed:
        raise AzError(f"{failed[0].resource} failed: {failed[0].error} (more: {see} --output table)")
    raise AzError(f"{_error_line(stderr, commands.deploy)} (more: {see} --output table)")


def _operations(commands: AzCommands | GrowCommands) -> list[Operation]:
    """The deployment's resources so far ([] before the deployment exists)."""
    done = subprocess.run(_az(commands.operations), capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return []
    rows = json.loads(done.stdout)
    return [op for op in map(Operation.from_az, rows if isinstance(rows, list) else []) if op is not None]
