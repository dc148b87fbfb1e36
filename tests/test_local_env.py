"""What a local task's environment holds: the agent's variables, and none of hpcjob's passwords."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_passwords_do_not_reach_the_tasks(tmp_path: Path) -> None:
    # A stand-in for the nodes' Python that prints its environment: the task's command runs it.
    python = tmp_path / "bin" / "fakepython"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\nenv\n")
    python.chmod(0o755)
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    config = tmp_path / "clusters.toml"
    config.write_text('[clusters.prod]\nurl = "https://head"\nuser = "alice"\npassword = "env:PROD_PW"\n')
    env = {
        **os.environ,
        "HPCJOB_CONFIG": str(config),
        "PROD_PW": "rest-secret-1",
        "HPCJOB_SMB_PASSWORD": "smb-secret-2",
        "HPCJOB_EMULATOR_PASSWORD": "emu-secret-3",
        "KEEP_ME": "visible",
    }
    share = tmp_path / "share"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcjob.cli",
            "run",
            "--local",
            "--quiet",
            "--run-id",
            "env-1",
            "--mount-point",
            str(share),
            "--python",
            str(python),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    seen = (share / "hpcjob" / "train" / "logs" / "env-1" / "LOCAL1.out").read_text()
    assert "KEEP_ME=visible" in seen and "CCP_NODES=1 LOCAL1 " in seen
    for secret in ("rest-secret-1", "smb-secret-2", "emu-secret-3"):
        assert secret not in seen
