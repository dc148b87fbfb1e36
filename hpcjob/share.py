"""The share as the client sees it: a folder reached over SMB, or a local path where it is mounted.

Paths are relative to the share folder (the `//HEAD/CcpSpoolDir/app` of `--share`, the `/app` of the
nodes) and use forward slashes. SMB needs the optional `share` extra (smbprotocol), imported only
when used. The password lives in the SmbFolder object only; it is never printed or logged.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from hpcjob.spec import HpcjobError, Share

COPY_CHUNK = 1 << 20


class ShareError(HpcjobError):
    """The share could not be reached or refused us."""


class ShareFolder(Protocol):
    def describe(self) -> str: ...

    def read_bytes(self, relative: str, offset: int = 0) -> bytes:
        """The file's bytes from `offset` on; FileNotFoundError when it does not exist."""
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


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
