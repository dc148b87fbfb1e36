"""`hpcjob pull`: a run's results come home, from the share to a folder here.

A run's results are three folders on the share: its checkpoints (HPCJOB_CHECKPOINT_DIR,
`<job folder>/checkpoints/<run id>`), its outputs (HPCJOB_OUTPUT_DIR, `<job folder>/outputs/<run id>`:
what the training program keeps besides checkpoints) and its logs (`<job folder>/logs/<run id>`: every
attempt's output and metrics). `pull_run` copies them into `checkpoints/`, `outputs/` and `logs/` of a
folder here, only what changed since the last pull into it: `.hpcjob-pull.json` there remembers each
file's size and time on the share and here. It never deletes a file here.

Whoever can write the run's folders on the share may have put anything there (issue 31): only regular
files are copied, each read to its end a piece at a time and never through a link; a link, a FIFO or a
device, a name that is no plain file name here, a folder reached again (a link the server follows) or
deeper than MAX_DEPTH is skipped alone, and said. Nothing is written outside the folder, or through a
link in it: each file goes to a temporary file of its folder, then takes its name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hpcjob.job.spec import SpecError
from hpcjob.runner.access import Progress, run_folder

if TYPE_CHECKING:
    from hpcjob.store.runs import HistoryEntry
    from hpcjob.store.share import ShareEntry, ShareFolder

PULL_MANIFEST = ".hpcjob-pull.json"
MANIFEST_LIMIT = 64 << 20  # bytes: one line per file pulled
MAX_DEPTH = 32  # folders below each of a run's folders
SKIPS_SHOWN = 10  # skipped files said one by one; then how many more
_TEMPORARY = ".hpcjob-pull-"
NOT_PLAIN = "not a regular file (a link, a FIFO, a device)"
# Names Windows keeps for devices, with any extension (CON, nul.txt, COM1.log).
_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"{p}{n}" for p in ("COM", "LPT") for n in range(1, 10))}


@dataclass(frozen=True)
class PullReport:
    """What a pull did: into `target`; files copied and their bytes, files already here and unchanged,
    and each thing skipped ("where: why")."""

    run_id: str
    target: Path
    files_copied: int = 0
    bytes_copied: int = 0
    files_unchanged: int = 0
    skipped: tuple[str, ...] = ()

    def line(self) -> str:
        """The pull in one line, as the command line ends it."""
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        return (
            f"pulled run {self.run_id} into {self.target}: {self.files_copied} file(s) copied, "
            f"{self.bytes_copied} bytes; {self.files_unchanged} unchanged{skipped}"
        )


def result_folders(entry: HistoryEntry) -> list[tuple[str, str | None, str]]:
    """The run's folders to pull, as (name here, folder on the share relative to its root, or None
    where it is not on the share, and then why)."""
    from hpcjob.job.layout import CHECKPOINT_VAR, OUTPUT_VAR, output_folder
    from hpcjob.runner.resume import recorded_folder, run_checkpoints

    record = entry.record
    folders: list[tuple[str, str | None, str]] = []
    try:
        folders.append(("checkpoints", run_checkpoints(entry), ""))
    except SpecError:  # its --env put them on the nodes' own disks
        folders.append(("checkpoints", None, f"in {recorded_folder(entry, CHECKPOINT_VAR)}"))
    outputs = recorded_folder(entry, OUTPUT_VAR) or output_folder(record.job_folder, record.run_id)
    if outputs.startswith("/"):
        folders.append(("outputs", None, f"in {outputs}"))
    else:
        folders.append(("outputs", outputs, ""))
    # The run's logs folder: the first attempt's logs, and a later attempt's in a folder of it (N/).
    folders.append(("logs", f"{record.job_folder}/logs/{record.run_id}", ""))
    return folders


def pull_target(to: str | os.PathLike[str] | None, run_id: str, option: str = "--to") -> Path:
    """The folder to pull into: `to` (given as `option`), else ./RUN_ID; a SpecError when it, or a
    folder above it, is a file."""
    path = Path(to if to is not None else run_id).expanduser().absolute()
    for step in (path, *path.parents):
        if step.exists():
            if not step.is_dir():
                said = f"{option} {to}" if to is not None else str(path)
                raise SpecError(f"{said}: {step} is a file, not a folder")
            break
    return path


def pull_run(
    run: str,
    to: str | os.PathLike[str] | None = None,
    *,
    smb_user: str | None = None,
    smb_server: str | None = None,
    smb_port: int = 445,
    progress: Progress = lambda line: None,
) -> PullReport:
    """Copy RUN's checkpoints, outputs and logs (a run of this machine's history, by run id or job id)
    from its share, or its local folder, into `to` [default: ./RUN_ID], only what changed: a line per
    folder to `progress`, and what was done. A run of a cluster is reached as `hpcjob logs` reaches it
    (the cluster profile's user and password, or the --smb-* options)."""
    from hpcjob.store.runs import find_entry

    try:
        entry = find_entry(run)
    except SpecError:
        raise SpecError(
            f"pull {run}: no such run in this machine's history (`hpcjob runs` lists them)"
        ) from None
    record = entry.record
    target = pull_target(to, record.run_id)
    folders = result_folders(entry)
    if record.local_root:  # never into the folders it reads: each pull would find the last one's files
        for _, folder, _ in folders:
            source = (Path(record.local_root) / folder).resolve() if folder else None
            if source is not None and target.resolve().is_relative_to(source):
                raise SpecError(f"--to {target}: that is inside the run's own folder {source}")
    share = run_folder(record, smb_user, smb_server, smb_port)
    puller = _Puller(share, target, record.run_id, progress)
    done = False
    try:
        for name, folder, why in folders:
            if folder is None:
                progress(f"{name}: {why}, on the nodes and not on the share: not pulled")
                continue
            puller.pull_folder(name, folder)
        done = True
    finally:
        share.close()
        puller.save(final=done)
    return puller.report()


@dataclass
class _Puller:
    share: ShareFolder
    target: Path
    run_id: str
    progress: Progress
    copied: int = 0
    bytes: int = 0
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)
    previous: dict[str, list[int]] = field(default_factory=dict)
    current: dict[str, list[int]] = field(default_factory=dict)
    folders_here: set[PurePosixPath] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.previous = _read_manifest(self.target / PULL_MANIFEST, self.run_id)

    def report(self) -> PullReport:
        return PullReport(
            self.run_id, self.target, self.copied, self.bytes, self.unchanged, tuple(self.skipped)
        )

    def pull_folder(self, name: str, folder: str) -> None:
        """One of the run's folders, whole, into `name` here; its line to `progress`."""
        before = (self.copied, self.bytes, self.unchanged, len(self.skipped))
        try:
            entries = self.share.scan(folder)
        except FileNotFoundError:
            self.progress(f"{name}: none in {self.share.describe()}/{folder}")
            return
        except OSError as exc:  # a link or a file in its place, refused: the other folders are pulled
            self._skip(name, f"{self.share.describe()}/{folder} cannot be listed: {_reason(exc)}")
            return
        self._walk(folder, PurePosixPath(name), (), entries)
        copied, sent, unchanged, skipped = (
            now - then
            for now, then in zip(
                (self.copied, self.bytes, self.unchanged, len(self.skipped)), before, strict=True
            )
        )
        more = f", {skipped} skipped" if skipped else ""
        self.progress(f"{name}: {copied} file(s) copied, {sent} bytes; {unchanged} unchanged{more}")
        self.save(final=False)  # an interrupted pull keeps what it did

    def _skip(self, where: PurePosixPath | str, why: str) -> None:
        self.skipped.append(f"{_shown(str(where))}: {why}")
        if len(self.skipped) <= SKIPS_SHOWN:
            self.progress(f"hpcjob: warning: {self.skipped[-1]}: not pulled")
        elif len(self.skipped) == SKIPS_SHOWN + 1:
            self.progress("hpcjob: warning: more skipped: the summary counts them")

    def _walk(
        self,
        folder: str,
        here: PurePosixPath,
        above: tuple[int, ...],
        entries: list[ShareEntry] | None = None,
    ) -> None:
        """`folder` into `here`; `above`: the file ids of the folders it is in (a link the server
        follows back to one of them would go round for ever)."""
        if entries is None:
            try:
                entries = self.share.scan(folder)
            except FileNotFoundError:
                return  # gone since its folder was listed
            except OSError as exc:
                self._skip(here, f"cannot be listed: {_reason(exc)}")
                return
        for entry in entries:
            if entry.name.startswith("."):  # a writer's temporary file, hpcjob's own marks (.hpcjob-beats)
                continue
            problem = _name_problem(entry.name)
            if problem:
                self._skip(f"{here}/{entry.name}", problem)
                continue
            remote, local = f"{folder}/{entry.name}", here / entry.name
            if entry.kind == "other":
                self._skip(local, NOT_PLAIN)
            elif entry.kind == "file":
                self._file(remote, local, entry)
            elif len(above) >= MAX_DEPTH:
                self._skip(local, f"more than {MAX_DEPTH} folders deep")
            elif entry.ident and entry.ident in above:
                self._skip(local, "the folder it is in, again (a link to it)")
            else:
                self._walk(remote, local, (*above, entry.ident or 0))

    def _file(self, remote: str, local: PurePosixPath, entry: ShareEntry) -> None:
        from hpcjob.store.share import UnreadableFile

        key, path = str(local), self.target / local
        known = self.previous.get(key)
        if known is not None and known[:2] == [entry.size, entry.mtime_ns] and _here_as(path, known[2:]):
            self.current[key] = known
            self.unchanged += 1
            return
        folder = self._folder_here(local.parent)
        if folder is None:
            return
        fd, temporary = tempfile.mkstemp(prefix=_TEMPORARY, dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                written = self.share.copy_out(remote, out)
            os.utime(temporary, ns=(entry.mtime_ns, entry.mtime_ns))
            os.replace(temporary, path)  # a link of that name is replaced, never written through
        except UnreadableFile as exc:
            _remove(temporary)
            if exc.errno != errno.ENOENT:  # gone since the listing: nothing to say
                self._skip(local, (exc.strerror or "cannot be read").removesuffix(": not read"))
            return
        except IsADirectoryError:
            _remove(temporary)
            self._skip(local, "a folder of that name is here")
            return
        except BaseException:
            _remove(temporary)
            raise
        info = path.lstat()
        self.current[key] = [entry.size, entry.mtime_ns, info.st_size, info.st_mtime_ns]
        self.copied += 1
        self.bytes += written

    def _folder_here(self, relative: PurePosixPath) -> Path | None:
        """`relative` under the target, made where missing, each step a folder and not a link; None
        (and said) where one is not."""
        step = PurePosixPath()
        for part in relative.parts:
            step = step / part
            if step in self.folders_here:
                continue
            path = self.target / step
            try:
                path.mkdir(parents=step.parent == PurePosixPath())
            except FileExistsError:
                if not stat.S_ISDIR(path.lstat().st_mode):
                    self._skip(relative, f"{path} is here and not a folder")
                    return None
            self.folders_here.add(step)
        return self.target / relative

    def save(self, *, final: bool) -> None:
        """The manifest of what is here: once the pull is done, of the files the share had; before, of
        those and the last pull's."""
        kept = self.current if final else {**self.previous, **self.current}
        if not kept and not self.previous:
            return
        with contextlib.suppress(FileNotFoundError):  # nothing was pulled, and the folder was never made
            temporary = self.target / f"{_TEMPORARY}manifest"
            temporary.write_text(json.dumps({"run_id": self.run_id, "files": kept}, indent=0))
            os.replace(temporary, self.target / PULL_MANIFEST)


def _read_manifest(path: Path, run_id: str) -> dict[str, list[int]]:
    """What the last pull into the folder copied, of this run; {} when unreadable or another run's."""
    from hpcjob.job.results import untrusted_json

    try:
        with path.open("rb") as f:
            read = untrusted_json(f.read(MANIFEST_LIMIT))
    except (OSError, ValueError):
        return {}
    if not isinstance(read, dict) or read.get("run_id") != run_id or not isinstance(read.get("files"), dict):
        return {}
    return {
        str(key): value
        for key, value in read["files"].items()
        if isinstance(value, list) and len(value) == 4 and all(type(v) is int for v in value)
    }


def _here_as(path: Path, recorded: list[int]) -> bool:
    """The file here is a regular file of the size and time the last pull left it with."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and [info.st_size, info.st_mtime_ns] == recorded


def _name_problem(name: str) -> str | None:
    """Why `name` from the share is no name to give a file here (None: it is one): a path rather than
    a name, a control character, or on Windows a name it reads as something else."""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        return "not a plain file name"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a control character in its name"
    if sys.platform == "win32" and (
        any(c in name for c in ':*?"<>|')
        or name[-1] in ". "
        or name.split(".")[0].upper() in _WINDOWS_DEVICES
    ):
        return "not a file name Windows can keep"
    return None


def _shown(text: str) -> str:
    """A path from the share as a line may show it: printable as it is, else escaped."""
    return text if text.isprintable() else ascii(text)[1:-1]


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _reason(exc: OSError) -> str:
    if exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
