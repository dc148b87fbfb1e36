"""The share as the client sees it: a folder reached over SMB, or a local path where it is mounted.

Paths are relative to the share folder (the `//HEAD/CcpSpoolDir/app` of `--share`, the `/app` of the
nodes) and use forward slashes. SMB needs the optional `share` extra (smbprotocol), imported only
when used. The password lives in the SmbFolder object only; it is never printed or logged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from hpcjob.spec import HpcjobError, Share

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
# SMB's file attributes of what is not a plain file (a link or other reparse point, a device), and
# smbprotocol's CreateOptions.FILE_OPEN_REPARSE_POINT: open a link rather than what it names.
_SMB_NOT_PLAIN = 0x400 | 0x40
_SMB_OPEN_REPARSE_POINT = 0x00200000
NOT_PLAIN = "not a regular file (a link, a FIFO, a device): not read"


class ShareError(HpcjobError):
    """The share could not be reached or refused us."""


class UnreadableFile(OSError):
    """A file on the share that was not read: missing (errno ENOENT), not a regular file (a link, a
    FIFO, a device), or refused by the share. Whoever can write the run's folder may have put it there,
    so a reader skips that one file and goes on with the others."""


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
        try:
            smbclient.register_session(
                self.server, username=username, password=password, port=port, encrypt=encrypt
            )
        except Exception as exc:  # smbprotocol raises many types; one line is what the user needs
            raise ShareError(f"cannot log on to {share.unc} as {username}: {_reason(exc)}") from None

    def describe(self) -> str:
        return self.share.unc

    def _path(self, relative: str) -> str:
        parts = [p for p in PurePosixPath(relative).parts if p not in ("", ".")]
        return "\\".join([self._base, *parts])

    def read_bytes(self, relative: str, offset: int = 0) -> bytes:
        with _not_found(relative), self._smb.open_file(self._path(relative), mode="rb", port=self.port) as f:
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
                port=self.port,
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
        with self._smb.open_file(self._path(relative), mode="wb", port=self.port) as f:
            f.write(data)

    def copy_file(self, relative: str, source: Path) -> None:
        self.makedirs(str(PurePosixPath(relative).parent))
        with (
            source.open("rb") as src,
            self._smb.open_file(self._path(relative), mode="wb", port=self.port) as dst,
        ):
            shutil.copyfileobj(src, dst, COPY_CHUNK)

    def makedirs(self, relative: str) -> None:
        if relative not in ("", "."):
            self._smb.makedirs(self._path(relative), exist_ok=True, port=self.port)

    def listdir(self, relative: str) -> list[str]:
        with _not_found(relative):
            names: list[str] = self._smb.listdir(self._path(relative), port=self.port)
        return sorted(names)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._smb.delete_session(self.server, port=self.port)


@contextlib.contextmanager
def _not_found(relative: str) -> Iterator[None]:
    """smbprotocol reports a missing file as an OSError with errno ENOENT, not FileNotFoundError."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such file on the share", relative) from None
        raise


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
