"""A job's packages for a cluster without internet (`--wheelhouse PYTHON[:PLATFORM]`): every wheel the
requirements need, for the nodes' Python and platform, downloaded here and put on the user's share folder
once, and the lock the nodes install from.

`pip download --only-binary=:all: --platform P --python-version V` runs on this machine (which reaches
the index, or the file's own --find-links) into a cache, `~/.cache/hpcjob/wheels/<python>-<platform>/`.
A package without a wheel for the nodes is named in one line before anything is uploaded. The wheels go
to `<share>/hpcjob/<user>/wheels/`, each once: what is there is listed in `manifest.json` (each wheel's
SHA-256, size and time on the share), written after the wheels, so a wheel whose upload was cut off is
sent again. The nodes then install the lock of these wheels (hpcjob.job.plan.wheel_lock: name==version with
its SHA-256, --require-hashes) with `--no-index --find-links <mount point>/hpcjob/<user>/wheels`
(hpcjob.job.plan.node_requirements).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcjob.job.results import untrusted_json
from hpcjob.job.spec import WHEELS_NAME, SpecError
from hpcjob.store.share import ShareFolder

MANIFEST = "manifest.json"  # in the wheels folder
MANIFEST_LIMIT = 16 << 20  # bytes of the manifest read: it names one line per wheel


@dataclass(frozen=True)
class WheelReport:
    sent: int
    bytes_sent: int
    already_there: int


def cache_folder(python: str, platform: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hpcjob" / "wheels" / f"{python}-{platform}"


# PEP 600's names of the older manylinux tags (the glibc each stands for).
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def platform_tags(platform: str) -> list[str]:
    """Every tag a node of `platform` takes: pip's --platform takes each as it is given, and a
    manylinux_2_28 node runs the wheels of every older glibc too (torch's are manylinux_2_28, most
    others manylinux2014)."""
    found = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014|manylinux_(\d+)_(\d+))_(\w+)", platform)
    if found is None:
        return [platform]
    legacy, major, minor, arch = found.groups()
    glibc = _LEGACY_MANYLINUX.get(legacy) or (int(major), int(minor))
    tags = [f"manylinux_{glibc[0]}_{m}_{arch}" for m in range(glibc[1], 4, -1)]
    tags += [f"{name}_{arch}" for name, (_, m) in _LEGACY_MANYLINUX.items() if glibc >= (2, m)]
    return tags


def download(requirements: str, python: str, platform: str, progress: Callable[[str], None]) -> list[Path]:
    """Every wheel the requirements need on the nodes (their dependencies too), from pip run here."""
    folder = cache_folder(python, platform)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as listed:
        listed.write(requirements)
    progress(f"wheels for Python {python} on {platform}: pip download into {folder}")
    platforms = [word for tag in platform_tags(platform) for word in ("--platform", tag)]
    try:
        done = subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
                "--only-binary=:all:", *platforms,
                "--python-version", python,
                "--implementation", "cp", "--dest", str(folder), "-r", listed.name,
            ],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    finally:
        os.unlink(listed.name)
    if done.returncode != 0:
        raise SpecError(_no_wheel(done.stdout + done.stderr, python, platform))
    saved = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", done.stdout)
    return sorted({Path(path).resolve() for path in saved})


def _no_wheel(output: str, python: str, platform: str) -> str:
    """pip's reason in one line, naming the package without a wheel for the nodes when it says so."""
    missing = re.search(r"Could not find a version that satisfies the requirement (\S+)", output)
    if missing:
        return (
            f"no wheel of {missing.group(1)} for Python {python} on {platform}: nothing was uploaded "
            "(build one, or install that package on the nodes another way)"
        )
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR:")]
    said = (errors or [line.strip() for line in output.splitlines() if line.strip()] or ["no output"])[-1]
    return f"pip download failed for Python {python} on {platform}: {said}"


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def upload(wheels: Sequence[Path], folder: ShareFolder, user_folder: str) -> WheelReport:
    """Put the wheels in the user's wheel folder on the share (`user_folder`/wheels), only those it does
    not hold yet. The manifest names each wheel's SHA-256 and its size and time on the share: a wheel
    whose size and time are as recorded is taken as there; where they differ, its digest on the share
    decides (the nodes' pip checks every wheel against the job's lock anyway)."""
    wheels_folder = f"{user_folder}/{WHEELS_NAME}"
    try:
        read = untrusted_json(folder.read_capped(f"{wheels_folder}/{MANIFEST}", MANIFEST_LIMIT))
    except (OSError, ValueError):
        read = {}
    known: dict[str, Any] = read if isinstance(read, dict) else {}
    sent = sent_bytes = there = 0
    folder.makedirs(wheels_folder)
    for wheel in wheels:
        digest, path = sha256_of(wheel), f"{wheels_folder}/{wheel.name}"
        on_share = folder.stat(path)
        entry = known.get(wheel.name)
        recorded = (
            [entry.get("sha256"), entry.get("size"), entry.get("mtime_ns")] if isinstance(entry, dict) else []
        )
        # As recorded; else, the size being the same, the digest of what the share holds.
        same = on_share is not None and (
            recorded == [digest, *on_share]
            or (on_share[0] == wheel.stat().st_size and folder.sha256(path) == digest)
        )
        if same:
            there += 1
        else:
            folder.copy_file(path, wheel)
            on_share = folder.stat(path)
            sent += 1
            sent_bytes += wheel.stat().st_size
        size, mtime = on_share or (0, 0)
        known[wheel.name] = {"sha256": digest, "size": size, "mtime_ns": mtime}
    manifest = json.dumps(known, indent=0, sort_keys=True).encode()
    folder.write_bytes(f"{wheels_folder}/{MANIFEST}", manifest)
    return WheelReport(sent, sent_bytes, there)
