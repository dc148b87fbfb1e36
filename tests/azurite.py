"""Azurite, Microsoft's emulator of Azure Blob Storage, for the tests of Blob datasets: the npm package
azurite@3.37.0, which `scripts/bootstrap.sh --test` installs into .tools/azurite. Its account and key are
the emulator's well-known, public ones (../shared/reference/facts/azure-blob-and-local-disks.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpcjob.backends.local import free_port

REPO = Path(__file__).resolve().parent.parent
AZURITE = REPO / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass(frozen=True)
class Azurite:
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        account = f"AccountName={ACCOUNT};AccountKey={KEY}"
        return f"DefaultEndpointsProtocol=http;{account};BlobEndpoint={self.endpoint};"


def require_azurite() -> None:
    """Skip without Azurite (npm missing: bootstrap says so); with CI=true fail, never skip."""
    import pytest

    if AZURITE.is_file():
        return
    message = f"Azurite is not installed ({AZURITE}): scripts/bootstrap.sh --test installs it with npm"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{message} (CI=true: a missing prerequisite fails the run)", pytrace=False)
    pytest.skip(message)


@contextmanager
def azurite() -> Iterator[Azurite]:
    """A fresh Azurite blob service on a free port of 127.0.0.1, stopped and its data gone after."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="azurite-") as data:
        process = subprocess.Popen(
            [str(AZURITE), "--location", data, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--silent",
             "--skipApiVersionCheck", "--loose"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60  # about 15 s on a loaded 2-core machine
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"Azurite did not start: {process.communicate()[1]!r}") from None
                    time.sleep(0.2)
            yield Azurite(port)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
