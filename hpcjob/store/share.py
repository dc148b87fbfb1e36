"""The share as the client sees it: a folder reached over SMB, or a local path where it is mounted.

Paths are relative to the share folder (the `//HEAD/CcpSpoolDir/app` of `--share`, the `/app` of the
nodes) and use forward slashes. SMB needs the optional `share` extra (smbprotocol), imported only
when used. The password lives in the SmbFolder object only; it is never printed or logged.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal, Protocol

from hpcjob.job.spec import HpcjobError, Share

COPY_CHUNK = 1 << 20
# How a file another user may have put on the share is opened on this machine: never through a link (one
# to /dev/zero would never end), never waiting (a FIFO with no writer would block for ever), never making
# a terminal this process's own (Windows has none of these: read_capped's lstat holds there).
_UNTRUSTED_OPEN = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
# A folder of the share listed on this machine: opened as a folder, never through a link.
_FOLDER_OPEN = (
    os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
# SMB's file attributes of what is not a plain file (a link or other reparse point, a device), and
# smbprotocol's CreateOptions.FILE_OPEN_REPARSE_POINT: open a link rather than what it names.
_SMB_NOT_PLAIN = 0x400 | 0x40
_SMB_OPEN_REPARSE_POINT = 0x00200000
_SMB_DELETE_ON_CLOSE = 0x00001000
_SMB_WRITE_DATA = 0x2  # FILE_WRITE_DATA (MS-SMB2 2.2.13.1.1)
_ACCESS_DENIED = "0xc0000022"  # STATUS_ACCESS_DENIED, as smbprotocol's errors name it
NOT_PLAIN = "not a regular file (a link, a FIFO, a device): not read"
NOT_A_FOLDER = "not a folder (a link, a file)"


class ShareError(HpcjobError):
    """The share could not be reached or refused us."""


class UnreadableFile(OSError):
    """A file on the share that was not read: missing (errno ENOENT), not a regular file (a link, a
    FIFO, a device), or refused by the share. Whoever can write the run's folder may have put it there,
    so a reader skips that one file and goes on with the others."""


@dataclass(frozen=True)
class ShareEntry:
    """One name in a folder of the share, as it is: never what a link names. `kind` "other" is what is
    neither a plain file nor a folder (a link, a FIFO, a device, a reparse point). `ident`: the file id
    where the share gives one (a folder reached twice, through a link the server follows, has one id)."""

    name: str
    kind: Literal["file", "folder", "other"]
    size: int
    mtime_ns: int
    ident: int | None = None


class ShareFolder(Protocol):
    def describe(self) -> str: ...

    def read_bytes(self, relative: str, offset: int = 0) -> bytes:
        """The file's bytes from `offset` on; FileNotFoundError when it does not exist."""
        ...

    def read_capped(self, relative: str, limit: int, *, offset: int = 0, from_end: bool = False) -> bytes:
        """At most `limit` bytes of a regular file: from `offset` on, or with `from_end` its last `limit`
        bytes. For what the nodes (or anyone who can write the share) wrote: every failure to read this
        file, its absence included, is an UnreadableFile."""
        ...

    def write_bytes(self, relative: str, data: bytes) -> None: ...

    def copy_file(self, relative: str, source: Path) -> None: ...

    def makedirs(self, relative: str) -> None: ...

    def listdir(self, relative: str) -> list[str]:
        """Names in the folder; FileNotFoundError when it does not exist."""
        ...

    def stat(self, relative: str) -> tuple[int, int] | None:
        """The file's size and modification time (ns); None when it is not there."""
        ...

    def sha256(self, relative: str) -> str:
        """The SHA-256 of the file's bytes, read in pieces."""
        ...

    def scan(self, relative: str) -> list[ShareEntry]:
        """What the folder holds, by name, each as it is (a link is "other", never followed); the folder
        itself opened only where it is a folder, not a link. FileNotFoundError when it is not there; an
        OSError when it cannot be listed."""
        ...

    def copy_out(self, relative: str, target: IO[bytes]) -> int:
        """A regular file's bytes, to its end, written to `target` a piece at a time; the bytes written.
        For what anyone who can write the share put there: what is not a regular file is never read, and
        every failure to read this file, its absence included, is an UnreadableFile."""
        ...

    def ensure_private(self, relative: str) -> None:
        """The folder (a user's own on the share, hpcjob/<user>), made if missing so that only this user
        may write in it; a ShareError when someone else may write in it, or move it away."""
        ...

    def write_private(self, relative: str, data: bytes) -> None:
        """A file only this user may read (a secret's), made anew: whatever was there is removed first,
        and the new one is this user's alone before `data` goes into it; a ShareError when it cannot be."""
        ...

    def remove(self, relative: str) -> bool:
        """The file removed; False when it was not there."""
        ...

    def prepare_common(self, relative: str) -> None:
        """An administrator's: the folder of every user's folders (hpcjob/), where each may make their
        own and nobody may move another's."""
        ...

    def close(self) -> None: ...


class LocalFolder:
    """The share mounted on this machine (a drive, a CIFS mount), or the local backend's stand-in."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return str(self.root)

    def _path(self, relative: str) -> Path:
        return self.root / PurePosixPath(relative)

    def read_bytes(self, relative: str, offset: int = 0) -> bytes:
        with self._path(relative).open("rb") as f:
            f.seek(offset)
            return f.read()

    def read_capped(self, relative: str, limit: int, *, offset: int = 0, from_end: bool = False) -> bytes:
        path = self._path(relative)
        try:
            # What is not a regular file is never opened (opening some devices acts); the flags and
            # fstat below hold if the name is replaced in between.
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
            fd = os.open(path, _UNTRUSTED_OPEN)
        except UnreadableFile:
            raise
        except OSError as exc:
            raise _unreadable(exc, relative) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
            os.lseek(fd, max(info.st_size - limit, 0) if from_end else offset, os.SEEK_SET)
            chunks: list[bytes] = []
            left = limit
            while left > 0:  # one read may return less than asked (Linux: under 2 GiB at once)
                chunk = os.read(fd, min(left, COPY_CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except UnreadableFile:
            raise
        except OSError as exc:
            raise _unreadable(exc, relative) from None
        finally:
            os.close(fd)

    def write_bytes(self, relative: str, data: bytes) -> None:
        path = self._path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def copy_file(self, relative: str, source: Path) -> None:
        path = self._path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)

    def makedirs(self, relative: str) -> None:
        self._path(relative).mkdir(parents=True, exist_ok=True)

    def listdir(self, relative: str) -> list[str]:
        return sorted(p.name for p in self._path(relative).iterdir())

    def stat(self, relative: str) -> tuple[int, int] | None:
        try:
            info = self._path(relative).stat()
        except FileNotFoundError:
            return None
        return info.st_size, info.st_mtime_ns

    def sha256(self, relative: str) -> str:
        with self._path(relative).open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def scan(self, relative: str) -> list[ShareEntry]:
        path = self._path(relative)
        if os.scandir in os.supports_fd:  # the folder opened once, never through a link, and read as opened
            try:
                fd = os.open(path, _FOLDER_OPEN)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise NotADirectoryError(errno.ENOTDIR, NOT_A_FOLDER, str(path)) from None
                raise
            try:
                return _local_entries(os.scandir(fd))
            finally:
                os.close(fd)
        if not stat.S_ISDIR(os.lstat(path).st_mode):  # Windows: a link (a junction) is not gone into
            raise NotADirectoryError(errno.ENOTDIR, NOT_A_FOLDER, str(path))
        return _local_entries(os.scandir(path))

    def copy_out(self, relative: str, target: IO[bytes]) -> int:
        path = self._path(relative)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):  # never opened: opening some devices acts
                raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
            fd = os.open(path, _UNTRUSTED_OPEN)
        except UnreadableFile:
            raise
        except OSError as exc:
            raise _unreadable(exc, relative) from None
        try:
            written = 0
            while True:
                try:
                    if not written and not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced in between
                        raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
                    chunk = os.read(fd, COPY_CHUNK)
                except UnreadableFile:
                    raise
                except OSError as exc:
                    raise _unreadable(exc, relative) from None
                if not chunk:
                    return written
                target.write(chunk)  # a failure to write here is this machine's, raised as it comes
                written += len(chunk)
        finally:
            os.close(fd)

    def prepare_common(self, relative: str) -> None:
        """Made, as the mount's own permissions allow: a local folder shows no other user's rights."""
        self._path(relative).mkdir(parents=True, exist_ok=True)

    def ensure_private(self, relative: str) -> None:
        """Mode 0700, this user's, never through a link. On Windows (a mapped drive), and on a CIFS mount
        that shows every file as the mounting user's, the server's own permissions decide: not seen here."""
        path = self._path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        if sys.platform == "win32":  # mypy's check for Windows reads this test, not os.name's
            return
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ShareError(
                f"{path} is not a folder of yours that only you may write in: nothing was copied (remove "
                "it, or make it yours alone)"
            )

    def write_private(self, relative: str, data: bytes) -> None:
        """Mode 0600 in a folder of mode 0700, made with O_EXCL and never through a link (os.open's mode is
        the file's from its making on). On Windows (a mapped drive), the server's own permissions decide."""
        path = self._path(relative)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.remove(relative)
        flags = (
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        )
        try:
            fd = os.open(path, flags | getattr(os, "O_BINARY", 0), 0o600)
        except OSError as exc:
            raise ShareError(f"cannot write {path} for you alone: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as out:
            out.write(data)

    def remove(self, relative: str) -> bool:
        try:
            self._path(relative).unlink()
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        pass


class SmbFolder:
    """The share folder over SMB 2/3 (smbprotocol's smbclient), with no mount on the client.

    `server` is where to connect when the head node's name does not resolve here (an address).
    """

    def __init__(
        self,
        share: Share,
        username: str,
        password: str,
        *,
        server: str | None = None,
        port: int = 445,
        encrypt: bool | None = None,
    ) -> None:
        import smbclient  # smbprotocol, a base dependency, imported here to keep the CLI's start-up light

        self._smb: Any = smbclient
        self.share = share
        self.server = server or share.host
        self.port = port
        self._base = "\\\\" + "\\".join((self.server, share.name, *share.folder))
        # A connection of this folder's own: smbclient's shared cache would give one process's two users
        # (a test's, an administrator's beside a user's) whichever session was registered first.
        self._cache: dict[str, Any] = {}
        self._on = {"port": port, "connection_cache": self._cache}
        try:
            smbclient.register_session(
                self.server, username=username, password=password, encrypt=encrypt, **self._on
            )
        except Exception as exc:  # smbprotocol raises many types; one line is what the user needs
            raise ShareError(f"cannot log on to {share.unc} as {username}: {_reason(exc)}") from None

    def describe(self) -> str:
        return self.share.unc

    def _path(self, relative: str) -> str:
        parts = [p for p in PurePosixPath(relative).parts if p not in ("", ".")]
        return "\\".join([self._base, *parts])

    def read_bytes(self, relative: str, offset: int = 0) -> bytes:
        with _not_found(relative), self._smb.open_file(self._path(relative), mode="rb", **self._on) as f:
            f.seek(offset)
            data: bytes = f.read()
            return data

    def read_capped(self, relative: str, limit: int, *, offset: int = 0, from_end: bool = False) -> bytes:
        from smbprotocol.exceptions import SMBResponseException

        # The link itself is opened, not what it names (SMB's O_NOFOLLOW), and shared with the writers:
        # the follower must never lock a node out of its own files. smbd itself refuses links that leave
        # the share and reads a FIFO as empty.
        try:
            with self._smb.open_file(
                self._path(relative),
                mode="rb",
                **self._on,
                share_access="rwd",
                create_options=_SMB_OPEN_REPARSE_POINT,
            ) as f:
                raw = f.raw
                if raw.fd.file_attributes & _SMB_NOT_PLAIN:
                    raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
                f.seek(max(raw.fd.end_of_file - limit, 0) if from_end else offset)
                data: bytes = f.read(limit)
                return data
        except UnreadableFile:
            raise
        except (OSError, SMBResponseException) as exc:
            # What the server answers about this file (refused, gone, a sharing violation); a connection
            # that failed is no file's fault and is raised as it comes.
            raise _unreadable(exc, relative) from None

    def write_bytes(self, relative: str, data: bytes) -> None:
        self.makedirs(str(PurePosixPath(relative).parent))
        with self._smb.open_file(self._path(relative), mode="wb", **self._on) as f:
            f.write(data)

    def copy_file(self, relative: str, source: Path) -> None:
        self.makedirs(str(PurePosixPath(relative).parent))
        with (
            source.open("rb") as src,
            self._smb.open_file(self._path(relative), mode="wb", **self._on) as dst,
        ):
            shutil.copyfileobj(src, dst, COPY_CHUNK)

    def makedirs(self, relative: str) -> None:
        if relative not in ("", "."):
            self._smb.makedirs(self._path(relative), exist_ok=True, **self._on)

    def listdir(self, relative: str) -> list[str]:
        with _not_found(relative):
            names: list[str] = self._smb.listdir(self._path(relative), **self._on)
        return sorted(names)

    def stat(self, relative: str) -> tuple[int, int] | None:
        try:
            with _not_found(relative):
                info = self._smb.stat(self._path(relative), **self._on)
        except FileNotFoundError:
            return None
        return int(info.st_size), int(info.st_mtime_ns)

    def sha256(self, relative: str) -> str:
        with _not_found(relative), self._smb.open_file(self._path(relative), mode="rb", **self._on) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def scan(self, relative: str) -> list[ShareEntry]:
        """The server's own listing: what it shows as a link or other reparse point, or a device, is
        "other". smbd hides a link that leaves the share, shows one within it as what it names (its file
        id that one's), and a FIFO as an empty file."""
        entries = []
        with _not_found(relative):
            for item in self._smb.scandir(self._path(relative), **self._on):
                info = item.smb_info
                attributes = int(info.file_attributes)
                kind: Literal["file", "folder", "other"] = (
                    "other" if attributes & _SMB_NOT_PLAIN else "folder" if attributes & 0x10 else "file"
                )
                when = _nanoseconds(info.last_write_time)
                entries.append(ShareEntry(item.name, kind, int(info.end_of_file), when, int(info.file_id)))
        return sorted(entries, key=lambda entry: entry.name)

    def copy_out(self, relative: str, target: IO[bytes]) -> int:
        from smbprotocol.exceptions import SMBResponseException

        # As read_capped: the link itself opened, shared with the writers (a node may still write it).
        try:
            opened = self._smb.open_file(
                self._path(relative),
                mode="rb",
                **self._on,
                share_access="rwd",
                create_options=_SMB_OPEN_REPARSE_POINT,
            )
        except (OSError, SMBResponseException) as exc:
            raise _unreadable(exc, relative) from None
        with opened as f:
            if f.raw.fd.file_attributes & _SMB_NOT_PLAIN:
                raise UnreadableFile(errno.EINVAL, NOT_PLAIN, relative)
            written = 0
            while True:
                try:
                    chunk: bytes = f.read(COPY_CHUNK)
                except (OSError, SMBResponseException) as exc:
                    raise _unreadable(exc, relative) from None
                if not chunk:
                    return written
                target.write(chunk)  # a failure to write here is this machine's, raised as it comes
                written += len(chunk)

    def ensure_private(self, relative: str) -> None:
        """Made with a DACL of its owner's alone (hpcjob.store.smb_acl), and checked, with the folder above,
        at every upload: the server's own security descriptors, read over SMB."""
        from hpcjob.store import smb_acl

        above = str(PurePosixPath(relative).parent)
        where = f"{self.describe()}/{relative}"
        made = None
        try:
            self.makedirs(above)
            me = self._my_sid(above)
            made = self._make_folder(relative)
            with self._open_folder(relative, smb_acl.READ_CONTROL | (smb_acl.WRITE_DAC if made else 0)) as f:
                if made:
                    smb_acl.set_dacl(f.fd, smb_acl.owner_only(me))
                mine = smb_acl.read_security(f.fd)
            with self._open_folder(above, smb_acl.READ_CONTROL) as f:
                common = smb_acl.read_security(f.fd)
            with self._open_folder("", smb_acl.READ_CONTROL) as f:
                share_folder = smb_acl.read_security(f.fd)
            # Between its making and its DACL, the folder had the rights of the one above: it must be
            # empty, nobody having put anything in it meanwhile.
            planted = made and bool(self.listdir(relative))
        except Exception as exc:  # smbprotocol's refusals are of many types: one line
            if made is False and _ACCESS_DENIED in str(exc):  # another user's, closed to this one
                raise ShareError(
                    f"{where} is not yours alone (another user's: you may not read who may write in it): "
                    "nothing was uploaded; an HPC administrator removes it"
                ) from None
            raise ShareError(f"cannot make {where} yours alone: {_reason(exc)}") from None
        problems = smb_acl.others_who_may_write(mine, me) + (["something was put in it"] if planted else [])
        if problems:
            raise ShareError(
                f"{where} is not yours alone ({problems[0]}): nothing was uploaded; remove it or make it "
                "yours alone, then try again"
            )
        # The folders above: whoever may rename hpcjob/ (or the user's folder in it) could put their own
        # in its place. The share's own folder is an administrator's by definition: its owner is trusted.
        for folder, security in ((above, common), ("", share_folder)):
            moved = smb_acl.others_who_may_move(security, me, share_folder.owner)
            if moved:
                raise ShareError(
                    f"{self.describe()}/{folder} lets another user move your folder away ({moved[0]}): "
                    "nothing was uploaded; an HPC administrator makes hpcjob/ theirs with "
                    "`hpcjob mount --install`"
                )

    def write_private(self, relative: str, data: bytes) -> None:
        """Made anew, opened by this user alone (no sharing) with a protected DACL of this user's alone
        (hpcjob.store.smb_acl.owner_only_file), checked, and only then written."""
        from hpcjob.store import smb_acl

        above = str(PurePosixPath(relative).parent)
        where = f"{self.describe()}/{relative}"
        try:
            self.makedirs(above)
            self.remove(relative)
            me = self._my_sid(above)
            access = _SMB_WRITE_DATA | smb_acl.READ_CONTROL | smb_acl.WRITE_DAC
            with self._smb.open_file(
                self._path(relative), mode="xb", buffering=0, **self._on, desired_access=access
            ) as f:  # no share_access: nobody else opens it meanwhile
                smb_acl.set_dacl(f.fd, smb_acl.owner_only_file(me))
                others = smb_acl.others_who_may_read(smb_acl.read_security(f.fd), me)
                if others:
                    raise ValueError(f"the server left it readable: {others[0]}")
                f.write(data)
        except Exception as exc:  # smbprotocol's refusals are of many types: one line
            with contextlib.suppress(Exception):
                self.remove(relative)
            raise ShareError(f"cannot write {where} for you alone: {_reason(exc)}") from None

    def remove(self, relative: str) -> bool:
        try:
            with _not_found(relative):
                self._smb.remove(self._path(relative), **self._on)
        except FileNotFoundError:
            return False
        return True

    def prepare_common(self, relative: str) -> None:
        """An administrator's: `relative` (hpcjob/) made, and given a DACL in which every cluster user may
        make a folder of their own and nobody else may remove or rename it (hpcjob.store.smb_acl)."""
        from hpcjob.store import smb_acl

        try:
            self.makedirs(relative)
            access = smb_acl.READ_CONTROL | smb_acl.WRITE_DAC | smb_acl.WRITE_OWNER
            with self._open_folder(relative, access) as f:
                smb_acl.set_dacl(f.fd, smb_acl.common_folder())
                # The Administrators' rather than this administrator's own: users check that hpcjob/ is
                # an administrator's, and a domain account's SID does not say so. Where the server will
                # not (UNVERIFIED on a Windows head node), the owner of the share's folder is one too.
                with contextlib.suppress(Exception):
                    smb_acl.set_owner(f.fd, smb_acl.ADMINISTRATORS)
                prepared = smb_acl.read_security(f.fd)
            with self._open_folder("", smb_acl.READ_CONTROL) as f:
                share_owner = smb_acl.read_security(f.fd).owner
        except Exception as exc:  # smbprotocol's refusals are of many types: one line
            raise ShareError(f"cannot prepare {self.describe()}/{relative}: {_reason(exc)}") from None
        left = smb_acl.others_who_may_move(prepared, "", share_owner)  # as every user will judge it
        if left:
            raise ShareError(
                f"{self.describe()}/{relative} is prepared, but users' uploads will be refused ({left[0]}): "
                "make BUILTIN\\Administrators its owner on the head node"
            )

    def _make_folder(self, relative: str) -> bool:
        """Make the folder; False when it was there."""
        try:
            self._smb.mkdir(self._path(relative), **self._on)
            return True
        except OSError as exc:  # smbprotocol's SMBOSError: FileExistsError's errno, not its class
            if exc.errno != errno.EEXIST:
                raise
            return False

    def _my_sid(self, folder: str) -> str:
        """This user's SID as the server knows it: the owner of a folder made in `folder` (gone on close)."""
        import secrets

        from hpcjob.store import smb_acl

        probe = f"{folder}/.hpcjob-probe-{secrets.token_hex(8)}"
        with self._smb.open_file(
            self._path(probe), mode="xb", buffering=0, file_type="dir", **self._on, share_access="rwd",
            desired_access=smb_acl.READ_CONTROL | smb_acl.DELETE, create_options=_SMB_DELETE_ON_CLOSE,
        ) as f:  # fmt: skip
            owner = smb_acl.read_security(f.fd).owner
        if owner is None:
            raise ValueError("the server names no owner of what you make")
        return owner

    def _open_folder(self, relative: str, access: int) -> Any:
        """The folder opened for its security descriptor (its smbprotocol Open is `.fd`)."""
        return self._smb.open_file(
            self._path(relative), mode="rb", buffering=0, file_type="dir", **self._on, share_access="rwd",
            desired_access=access,
        )  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._smb.reset_connection_cache(connection_cache=self._cache)


@dataclass
class ShareCounts:
    """What was asked of the share: each call by method name, and the bytes the reads gave back."""

    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_read: int = 0

    def reset(self) -> None:
        self.calls.clear()
        self.bytes_read = 0


@contextlib.contextmanager
def counting_share_calls() -> Iterator[ShareCounts]:
    """Count every call of every share folder (local and SMB alike, however made) while the block runs:
    what a follower costs the share, measured at hpcjob's own interface (benchmarks/bench_many_nodes.py,
    the tests of a poll's reads). Not thread-safe against another counter: one at a time."""
    counts = ShareCounts()
    names = [name for name in vars(ShareFolder) if not name.startswith("_")]
    saved = [
        (cls, name, vars(cls)[name])
        for cls in (LocalFolder, SmbFolder)
        for name in names
        if name in vars(cls)
    ]

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: object, *args: Any, **kwargs: Any) -> Any:
            counts.calls[name] += 1
            result = method(self, *args, **kwargs)
            if name in ("read_bytes", "read_capped"):
                counts.bytes_read += len(result)
            return result

        return call

    try:
        for cls, name, method in saved:
            setattr(cls, name, counted(name, method))
        yield counts
    finally:
        for cls, name, method in saved:
            setattr(cls, name, method)


def _local_entries(listing: Any) -> list[ShareEntry]:
    """A local folder's entries (an os.scandir), each as it is: a link's own lstat, never its target's."""
    entries = []
    with listing as scanned:
        for item in scanned:
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone since the listing
                continue
            kind: Literal["file", "folder", "other"] = (
                "folder" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
            )
            entries.append(ShareEntry(item.name, kind, info.st_size, info.st_mtime_ns, info.st_ino))
    return sorted(entries, key=lambda entry: entry.name)


@contextlib.contextmanager
def _not_found(relative: str) -> Iterator[None]:
    """smbprotocol reports a missing file as an OSError with errno ENOENT, not FileNotFoundError."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such file on the share", relative) from None
        raise


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _nanoseconds(when: datetime) -> int:
    """An SMB time (smbprotocol's datetime, UTC, to the microsecond) as Unix nanoseconds."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def _unreadable(exc: Exception, relative: str) -> UnreadableFile:
    """`exc`, met reading one file, as that file's UnreadableFile (ENOENT where it is missing)."""
    code = getattr(exc, "errno", None)
    if isinstance(exc, FileNotFoundError) or code == errno.ENOENT:
        return UnreadableFile(errno.ENOENT, "no such file on the share", relative)
    if code == errno.ELOOP:  # O_NOFOLLOW's answer on a link
        return UnreadableFile(errno.ELOOP, NOT_PLAIN, relative)
    return UnreadableFile(code if isinstance(code, int) else errno.EIO, _reason(exc), relative)


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
