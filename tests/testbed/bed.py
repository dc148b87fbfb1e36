"""The whole bed: a share folder, the hosts that mount it, and the SMB server that serves it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

from .hosts import Host, Hosts
from .smb import SmbServer
from .system import PREFIX


class TestBed:
    """Context manager: `hosts` with the share folder at `mount_point`, and `smb` on the head address.

    The share folder is `<temp>/CcpSpoolDir/app` (the last part is `folder`): on every host it is
    `/app`, over SMB it is //HEADNODE/CcpSpoolDir/app, and from the test it is `share_folder`.
    """

    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        names: Sequence[str] = ("node1", "node2"),
        hpc_names: Sequence[str] | None = None,
        *,
        mount_point: str = "/app",
        head_name: str = "HEADNODE",
        folder: str = "app",
        smb: bool = True,
    ) -> None:
        self.names, self.hpc_names, self.folder, self._want_smb = names, hpc_names, folder, smb
        self.head_name, self.mount_point = head_name, mount_point
        self.share_unc = f"//{head_name}/CcpSpoolDir/{folder}"  # as the hosts name it
        self.share_folder = Path()  # set, with hosts and smb, on entering
        self.hosts: Hosts
        self.smb: SmbServer | None = None
        self._stack = contextlib.ExitStack()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def local_folder(self, hpc_name: str) -> Path:
        """A host's own local disk: a folder of the bed's, made on first use, removed with the bed."""
        folder = self.share_folder.parents[1] / "local" / hpc_name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def __enter__(self) -> Self:
        with contextlib.ExitStack() as stack:
            tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-share-"))
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            self.share_folder = tmp / "CcpSpoolDir" / self.folder
            self.share_folder.mkdir(parents=True)
            self.hosts = Hosts(
                self.names,
                self.hpc_names,
                share_folder=self.share_folder,
                mount_point=self.mount_point,
                head_name=self.head_name,
            )
            stack.enter_context(self.hosts)
            if self._want_smb:
                server = SmbServer(self.share_folder, self.hosts.head_address, netns=self.hosts.head_netns)
                self.smb = stack.enter_context(server)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()  # smbd first, then the hosts, then the share folder


@contextlib.contextmanager
def smbnetfs_share(bed: TestBed, host: str) -> Iterator[str]:
    """The bed's share as `host` reads and writes it over SMB from the bed's smbd, through smbnetfs
    (libsmbclient under FUSE: this kernel cannot mount CIFS), mounted for the block: the share folder's
    path there. The password goes in a file only root reads, never on a command line. Needs root, samba
    and smbnetfs (the benchmarks check and say so)."""
    assert bed.smb is not None, "a bed with its SMB server"
    with tempfile.TemporaryDirectory() as config:
        smb_conf = Path(config) / ".smb"
        smb_conf.mkdir()
        (smb_conf / "smb.conf").write_text("[global]\n")
        login = smb_conf / "smbnetfs.conf"
        login.touch(mode=0o600)
        login.write_text(f'auth "{bed.smb.address}" "{bed.smb.username}" "{bed.smb.password}"\n')
        bed[host].check_output(f"mkdir -p /mnt/smbnetfs && HOME={config} smbnetfs /mnt/smbnetfs")
        try:
            yield f"/mnt/smbnetfs/{bed.smb.address}/CcpSpoolDir/{bed.share_folder.name}"
        finally:
            bed[host].check_output("fusermount -u /mnt/smbnetfs")
