"""docs/cluster-setup.md, "Try the whole REST and WinRM paths on this machine": its commands, exactly as
written, work."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # its jobs, the only ones of the tests on the default rendezvous port
HEADING = "### Try the whole REST and WinRM paths on this machine"


def walkthrough() -> str:
    page = (REPO / "docs" / "cluster-setup.md").read_text(encoding="utf-8")
    section = page[page.index(HEADING) :]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found is not None, "the walkthrough has no bash block"
    return found.group(1)


def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    # A folder laid out like the checkout (the commands name training/ and .venv/ relative to it).
    (tmp_path / "training").symlink_to(REPO / "training")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    env = {**os.environ, "HPCJOB_CONFIG": str(tmp_path / "clusters.toml")}
    env.pop("HPCJOB_CLUSTER", None)
    script = "set -euo pipefail\n" + walkthrough()
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    out = result.stdout
    assert "job run_ddp Finished in " in out and ", exit code 0 (run run_ddp-" in out  # submit --wait
    # status, through each front door: the same job
    assert len(re.findall(r"^job 1 \(run_ddp-\S+\) Finished, exit code 0$", out, re.M)) == 2
    assert "] epoch 2/2" in out  # logs, from the share (a folder here)
    assert "job 2 canceled" in out
    assert "cluster emulator saved in" in out and "cluster emulator-winrm saved in" in out
    # The profiles the emulator printed poll it every second: its jobs are this machine's processes.
    assert (tmp_path / "clusters.toml").read_text().count("\npoll_interval = 1.0\n") == 2
    assert "try-it-1" not in out + result.stderr  # the password never shows
