"""A private smbd serving a test bed's share folder as //ADDRESS/CcpSpoolDir/<folder name>."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from hpcjob.backends.local import free_port

from .system import PREFIX, Service, closed, kill_all, on_exit, pids_with_arg, sh, sweep_leftovers

_CONF = """\
[global]
  server role = standalone server
  interfaces = {address}
  bind interfaces only = yes
  smb ports = {port}
  disable netbios = yes
  server min protocol = SMB2_02
  map to guest = never
  username map = {tmp}/users.map
  private dir = {tmp}/private
  state directory = {tmp}/state
  lock directory = {tmp}/lock
  pid directory = {tmp}/pid
  cache directory = {tmp}/cache
  ncalrpc dir = {tmp}/ncalrpc
  log file = {tmp}/smbd.log
  load printers = no
  printcap name = /dev/null
  disable spoolss = yes

[{share_name}]
  path = {share_path}
  read only = no
  # Windows ACLs, stored and enforced by smbd itself, as a Windows head node's NTFS does: the security
  # descriptors hpcjob sets and checks on a user's folder (hpcjob/store/smb_acl.py), and smbd then refuses
  # another user's write there. The POSIX modes on disk stay open (0777 folders): smbd alone decides.
  vfs objects = acl_xattr
  acl_xattr:ignore system acls = yes
"""


class SmbServer(Service):
    """Context manager: smbd on `address`:`port` (in network namespace `netns` when given).

    The share `share_name` is the parent of `share_folder`, so `folder_unc` (//ADDRESS/CcpSpoolDir/app)
    is the share folder itself. Log in as `username`/`password`, or with `credentials_file`
    (`username=...`/`password=...`, read by both `smbclient -A` and `mount.cifs credentials=`), which
    is root's identity on the share (an administrator's); `users` log in as themselves.
    """

    def __init__(
        self,
        share_folder: str | os.PathLike[str],
        address: str = "127.0.0.1",
        port: int | None = None,
        *,
        netns: str | None = None,
        share_name: str = "CcpSpoolDir",
        username: str = "hpcuser",
        timeout: float = 20.0,
        users: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        self.share_folder = Path(share_folder).resolve()
        self.address, self.netns, self.share_name, self.username = address, netns, share_name, username
        # 445 is only free in a namespace of our own; on this machine's loopback, a port nobody uses (two
        # test runs at once must not reach each other's smbd).
        self.port = port or (445 if netns else free_port())  # free until smbd binds it
        self.password = secrets.token_urlsafe(18)
        self.unc = f"//{address}/{share_name}"
        self.folder_unc = f"{self.unc}/{self.share_folder.name}"
        self.timeout = timeout
        self.users = dict(users)  # more logins: this machine's own accounts, by name, and their passwords
        self.credentials_file = self.log_file = Path()
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:  # never shows the password
        return f"SmbServer({self.folder_unc!r}, port={self.port}, netns={self.netns!r})"

    def start(self) -> None:
        sweep_leftovers()
        on_exit(self, self.close)
        tmp = self._tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-smb-"))
        for sub in ("private", "state", "lock", "pid", "cache", "ncalrpc"):
            (tmp / sub).mkdir()
        conf = tmp / "smb.conf"
        conf.write_text(
            _CONF.format(
                address=self.address,
                port=self.port,
                tmp=tmp,
                share_name=self.share_name,
                share_path=self.share_folder.parent,
            )
        )
        # smbpasswd only adds users with a Unix account, so the password goes on root's entry in this
        # private passdb and the username map lets clients log in as `username`.
        (tmp / "users.map").write_text(f"root = {self.username}\n")
        sh("smbpasswd", "-c", str(conf), "-s", "-a", "root", input=f"{self.password}\n{self.password}\n")
        for name, password in self.users.items():  # each its own identity (SID) on the share
            sh("smbpasswd", "-c", str(conf), "-s", "-a", name, input=f"{password}\n{password}\n")
        self.credentials_file = tmp / "credentials"
        self.credentials_file.touch(mode=0o600)
        self.credentials_file.write_text(f"username={self.username}\npassword={self.password}\n")
        self.log_file = tmp / "smbd.log"
        enter = ["ip", "netns", "exec", self.netns] if self.netns else []
        with open(tmp / "smbd.stdout", "wb") as out:
            # smbd in the foreground exits when its stdin closes, so it cannot outlive this process. On
            # the way out it signals its whole process group: give it one of its own.
            self._proc = subprocess.Popen(
                [*enter, "smbd", "--foreground", "--no-process-group", "-s", str(conf)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._tmp is not None
        deadline = time.monotonic() + self.timeout
        while self._proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((self.address, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        logs = [(self._tmp / "smbd.stdout"), self.log_file]
        text = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
        state = f"exited with {self._proc.returncode}" if self._proc.poll() is not None else "not listening"
        where = f"{self.address}:{self.port}"
        raise RuntimeError(f"smbd on {where} {state} after {self.timeout} s; its log:\n{text}")

    def close(self) -> None:
        """Stop smbd and the helpers it started (samba-dcerpcd, rpcd_*), remove its files."""
        if self._proc is not None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._tmp is not None:
            # Helpers detach from smbd; each names our config file (under _tmp) on its command line.
            kill_all(functools.partial(pids_with_arg, str(self._tmp)))
            shutil.rmtree(self._tmp)
            self._tmp = None
        closed(self)
