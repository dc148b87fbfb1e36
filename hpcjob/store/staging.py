"""What goes to the share: the script's folder, less what `.hpcjobignore` keeps out, plus the node files.

`code_files` chooses the files; `upload` sends them to the job folder on the share (over SMB, or a
local path where the share is mounted, or the local backend's stand-in), only files that changed
since the last upload.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from hpcjob.job.results import untrusted_json
from hpcjob.job.spec import SHARE_FOLDER
from hpcjob.job.torchrun import NODE_DIR
from hpcjob.store.share import ShareFolder

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
NODE_FILES = ("node.sh", "worker.py", "env.py", "datasets.py")
NODE_LIBRARY = "hpctorch"  # the package a training script imports, shipped with every job
MANIFEST = f"{NODE_DIR}/manifest.json"
MANIFEST_LIMIT = 64 << 20  # bytes: one line per file of the code


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
    """The helper and worker shim every task uses, as they go into `<job folder>/.hpcjob/`, and the
    library a script imports (hpctorch), into `.hpcjob/lib/`, which node.sh puts on PYTHONPATH."""
    package = resources.files("hpcjob") / "node"
    for name in NODE_FILES:
        yield PurePosixPath(NODE_DIR) / name, (package / name).read_bytes()
    library = resources.files(NODE_LIBRARY)
    for entry in sorted(library.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py") and entry.is_file():
            yield PurePosixPath(NODE_DIR) / "lib" / NODE_LIBRARY / entry.name, entry.read_bytes()


def stage_run(
    code_dir: Path,
    folder: ShareFolder,
    job_folder: str,
    run_id: str,
    files: Sequence[tuple[str, str]] = (),
    wheels: Sequence[Path] = (),
    user_folder: str = SHARE_FOLDER,
    private_files: Sequence[tuple[str, bytes]] = (),
) -> str:
    """Upload the code (and the plan's `files`, and `wheels` for the nodes, to `user_folder`'s wheels)
    and make the run's log folder, then close `folder`; returns what was done. `private_files` (path from
    the share's root, bytes: the attempt's secrets) are written last, each readable by this user alone,
    once the user's folder is known to be theirs alone.

    The tasks' stdout/stderr go to the log folder, and the agent checks it can write them before it
    starts a task, so the folder must exist before the job runs.
    """
    try:
        if user_folder != SHARE_FOLDER:  # a cluster user's own folder: theirs alone, or nothing is sent
            folder.ensure_private(user_folder)
        report = upload(code_dir, folder, job_folder, files, wheels, user_folder)
        folder.makedirs(f"{job_folder}/logs/{run_id}")
        for relative, data in private_files:
            folder.write_private(relative, data)
    finally:
        folder.close()
    return (
        f"sent {report.files_sent} file(s), {report.bytes_sent} bytes, to {folder.describe()}/{job_folder} "
        f"({report.files_unchanged} unchanged)"
    )


def upload(
    code_dir: Path,
    folder: ShareFolder,
    job_folder: str,
    files: Sequence[tuple[str, str]] = (),
    wheels: Sequence[Path] = (),
    user_folder: str = SHARE_FOLDER,
) -> SyncReport:
    """Send the code, the node files and `files` (the plan's: path in the job folder, text) to
    `<job_folder>/` on the share, only what changed; and `wheels` to the user's wheels, `user_folder`/wheels
    (hpcjob.store.wheelhouse).

    What was sent is remembered in a manifest in the job folder (size and modification time of each
    file); it is written last, so an interrupted upload is completed by the next one.
    """
    manifest_path = f"{job_folder}/{MANIFEST}"
    try:  # read as what anyone who could write the folder may have put there: capped, plain JSON
        read = untrusted_json(folder.read_capped(manifest_path, MANIFEST_LIMIT))
        previous = read.get("files", {}) if isinstance(read, dict) else {}
    except (OSError, ValueError):
        previous = {}
    previous = previous if isinstance(previous, dict) else {}
    # Code files are known by size and time; hpcjob's node files, which come from the package, by digest.
    current: dict[str, list[int | str]] = {}
    sent = unchanged = sent_bytes = 0
    for item in code_files(code_dir):
        key = str(item.relative)
        current[key] = [item.size, item.mtime_ns]
        if previous.get(key) == current[key]:
            unchanged += 1
            continue
        folder.copy_file(f"{job_folder}/{key}", item.path)
        sent += 1
        sent_bytes += item.size
    extra = ((PurePosixPath(path), text.encode()) for path, text in files)
    for relative, content in (*node_files(), *extra):
        key = str(relative)
        current[key] = [len(content), hashlib.sha256(content).hexdigest()]
        if previous.get(key) != current[key]:
            folder.write_bytes(f"{job_folder}/{key}", content)
            sent += 1
            sent_bytes += len(content)
    folder.write_bytes(manifest_path, json.dumps({"files": current}, indent=0).encode())
    if wheels:
        from hpcjob.store.wheelhouse import upload as upload_wheels

        report = upload_wheels(wheels, folder, user_folder)
        sent, sent_bytes, unchanged = (
            sent + report.sent,
            sent_bytes + report.bytes_sent,
            unchanged + report.already_there,
        )
    return SyncReport(files_sent=sent, bytes_sent=sent_bytes, files_unchanged=unchanged)
