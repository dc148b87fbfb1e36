"""What goes to the share: the script's folder, less what `.hpcjobignore` keeps out, plus the node files.

`code_files` chooses the files (shared by every way of reaching the share); `sync_folder` copies them
into a folder (the local backend's share, or a share mounted on the client), sending only files that
changed since the last copy.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from hpcjob.torchrun import NODE_DIR

IGNORE_FILE = ".hpcjobignore"
# Used when the code folder has no .hpcjobignore: data, checkpoints, logs and caches stay home.
DEFAULT_IGNORE = (
    ".git/",
    ".hpcjob/",
    "__pycache__/",
    ".venv/",
    "venv/",
    ".ipynb_checkpoints/",
    "data/",
    "checkpoints/",
    "logs/",
    "*.pyc",
    "*.pt",
    "*.pth",
    "*.ckpt",
)
NODE_FILES = ("node.sh", "worker.py")


@dataclass(frozen=True)
class CodeFile:
    path: Path
    relative: PurePosixPath
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class SyncReport:
    files_sent: int
    bytes_sent: int
    files_unchanged: int


def parse_ignore(text: str) -> tuple[str, ...]:
    """gitignore-like lines: `#` comments, `dir/` for folders, `a/b` anchored at the top, globs."""
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def is_ignored(relative: PurePosixPath, is_dir: bool, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        pattern = pattern.strip("/")
        if dir_only and not is_dir:
            continue
        target = str(relative) if "/" in pattern else relative.name
        if fnmatch.fnmatchcase(target, pattern):
            return True
    return False


def ignore_patterns(code_dir: Path) -> tuple[str, ...]:
    ignore_file = code_dir / IGNORE_FILE
    if ignore_file.is_file():
        return (*parse_ignore(ignore_file.read_text(encoding="utf-8")), IGNORE_FILE, ".hpcjob/")
    return DEFAULT_IGNORE


def code_files(code_dir: Path) -> Iterator[CodeFile]:
    """The files of `code_dir` that go to the share, in a stable order."""
    patterns = ignore_patterns(code_dir)
    for folder, dirs, files in os.walk(code_dir):
        here = PurePosixPath(Path(folder).relative_to(code_dir).as_posix())
        dirs[:] = sorted(d for d in dirs if not is_ignored(here / d, True, patterns))
        for name in sorted(files):
            relative = here / name
            path = Path(folder) / name
            if is_ignored(relative, False, patterns) or not path.is_file():
                continue
            stat = path.stat()
            yield CodeFile(path, PurePosixPath(os.path.normpath(relative)), stat.st_size, stat.st_mtime_ns)


def node_files() -> Iterator[tuple[PurePosixPath, bytes]]:
    """The helper and worker shim every task uses, as they go into `<job folder>/.hpcjob/`."""
    package = resources.files("hpcjob") / "node"
    for name in NODE_FILES:
        yield PurePosixPath(NODE_DIR) / name, (package / name).read_bytes()


def sync_folder(code_dir: Path, job_dir: Path) -> SyncReport:
    """Copy the code and the node files into `job_dir`, skipping files whose size and time match."""
    sent = unchanged = sent_bytes = 0
    for item in code_files(code_dir):
        target = job_dir / item.relative
        if target.is_file():
            stat = target.stat()
            if stat.st_size == item.size and stat.st_mtime_ns == item.mtime_ns:
                unchanged += 1
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item.path, target)
        sent += 1
        sent_bytes += item.size
    for relative, content in node_files():
        target = job_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_bytes() != content:
            target.write_bytes(content)
            sent += 1
            sent_bytes += len(content)
    return SyncReport(files_sent=sent, bytes_sent=sent_bytes, files_unchanged=unchanged)
