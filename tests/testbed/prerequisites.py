"""What a test bed needs, and what a test does when the machine lacks it: skip, or fail under CI."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

TOOLS = ("ip", "unshare", "nsenter", "chroot", "mount", "smbd", "smbpasswd")


def missing_prerequisites(tools: Sequence[str] = TOOLS) -> list[str]:
    """What this machine lacks for a test bed, as readable reasons (empty: all there)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces and mounts need it)"]
    missing += [f"the `{tool}` command" for tool in tools if shutil.which(tool) is None]
    if not missing:
        # Root in a container may still lack the capability to create namespaces.
        probe = subprocess.run(["unshare", "-n", "-u", "-m", "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            missing.append(f"namespace support (unshare: {probe.stderr.strip()})")
    return missing


def require_testbed(tools: Sequence[str] = TOOLS) -> None:
    """Skip the test when this machine cannot host a test bed; with CI=true fail it, never skip."""
    import pytest  # here, so that benchmarks can use the bed without pytest

    missing = missing_prerequisites(tools)
    if not missing:
        return
    message = "the test bed needs " + ", ".join(missing)
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{message} (CI=true: a missing prerequisite fails the run)", pytrace=False)
    pytest.skip(message)
