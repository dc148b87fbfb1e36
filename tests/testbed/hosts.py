"""Several "hosts" on this one machine, each with its own network stack, host name and /etc/hosts.

Layout (X is a free third octet, picked per bed):

    root namespace  hpcjt-<id> 10.200.X.1 ──┐       (where the hpcjob client runs)
    head namespace  br0 10.200.X.254 ───────┼── bridge; HEADNODE, the SMB server and the gateway
    host namespaces eth0 10.200.X.11, .12 ──┘       (node1, node2, ...)

The hosts' default route points at the head namespace, which answers anything outside the subnet
with "no route to host": nothing ever leaves the bed, yet `ip route show default` names eth0 as on a
real node. The bridge lives in the head namespace so the root namespace only gains one veth.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .system import PREFIX, Service, closed, kill_all, machine_lock, netns_pids, on_exit, sh, sweep_leftovers

# Runs in each host's fresh UTS + mount namespace (inside its network namespace) and then holds them.
# /app must not appear on the real root file system, so the host gets its own root: a tmpfs with every
# top-level entry of / bind-mounted into it, plus the mount point, /etc/hosts and /etc/resolv.conf.
_HOLDER = r"""
set -eu
hostname "$1"; root=$2; hosts=$3; resolv=$4; share=$5; mount_point=$6; private=$7; shift 7
mount -t tmpfs -o mode=0755 hpcjt-root "$root"
mount --make-unbindable "$root"  # keeps the new root out of the rbind of the directory that holds it
for path in /* /.[!.]*; do
    [ -e "$path" ] || [ -L "$path" ] || continue
    target=$root/${path#/}
    if [ -L "$path" ]; then ln -s "$(readlink "$path")" "$target"
    elif [ -d "$path" ]; then mkdir "$target"; mount --rbind "$path" "$target"
    else touch "$target"; mount --bind "$path" "$target"; fi
done
mount --bind "$hosts" "$root/etc/hosts"
[ ! -f "$root/etc/resolv.conf" ] || mount --bind "$resolv" "$root/etc/resolv.conf"
if [ -n "$share" ]; then mkdir -p "$root$mount_point"; mount --bind "$share" "$root$mount_point"; fi
for dir in "$@"; do  # host-local state, such as smbclient's name cache, must not leak between hosts
    [ ! -d "$root$dir" ] || { mkdir -p "$private$dir"; mount --bind "$private$dir" "$root$dir"; }
done
echo $$
exec chroot "$root" cat  # ends when the test process closes our stdin, or dies
"""
# nsenter's --wd=DIR resolves DIR outside the new root here, so change directory once inside.
_CD_AND_EXEC = 'cd -- "$0" && exec "$@"'
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class HostCommandError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {self.stderr}"


@dataclass
class Host:
    """One host: `run` and `check_output` execute inside its namespaces, chroot and /etc/hosts."""

    name: str  # the lower-case Linux host name
    hpc_name: str  # the HPC Pack node name (upper case), resolvable on every host
    address: str
    netns: str
    _pid: int = field(default=0, repr=False)  # the process holding its UTS and mount namespaces

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        **popen: Any,
    ) -> subprocess.Popen[str]:
        """Start `cmd` (bash text or argv) on this host; env as for Popen, cwd defaults to ours."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        enter = ["nsenter", "-t", str(self._pid), "-n", "-u", "-m", "-r", "-w", "--"]
        wrapped = [*enter, "sh", "-c", _CD_AND_EXEC, str(cwd or os.getcwd()), *argv]
        popen.setdefault("text", True)
        return subprocess.Popen(wrapped, env=env, **popen)

    def check_output(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> str:
        """Run `cmd` to completion and return its stdout; a non-zero exit raises with its stderr."""
        stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
        proc = self.run(cmd, env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        if proc.returncode:
            raise HostCommandError(proc.returncode, cmd, out, err)
        return out


class Hosts(Service):
    """Context manager: the hosts `names` (Linux host names) known to each other as `hpc_names`.

    `share_folder`, when given, is bind-mounted at `mount_point` on every host (in place of the CIFS
    mount of //HEADNODE/CcpSpoolDir/app). `head_name` resolves to `head_address` on every host.
    Each host gets its own empty copy of the existing `private_dirs`, and shares the rest of the files.
    """

    def __init__(
        self,
        names: Sequence[str] = ("node1", "node2"),
        hpc_names: Sequence[str] | None = None,
        *,
        share_folder: str | os.PathLike[str] | None = None,
        mount_point: str = "/app",
        head_name: str = "HEADNODE",
        subnet: int | None = None,
        private_dirs: Sequence[str] = ("/var/cache/samba", "/run/samba"),
    ) -> None:
        hpc_names = list(hpc_names) if hpc_names is not None else [n.upper() for n in names]
        if len(hpc_names) != len(names) or not 0 < len(names) <= 200:
            raise ValueError("names and hpc_names need the same number (1 to 200) of entries")
        if any(not _NAME.fullmatch(n) for n in names) or len({*names}) < len(names):
            raise ValueError(f"host names must be unique lower-case host labels: {names}")
        if not re.fullmatch(r"/[A-Za-z0-9_.-]+", mount_point):
            raise ValueError(f"mount_point must be a top-level directory like /app: {mount_point}")
        self.names, self.hpc_names = list(names), hpc_names
        self.share_folder = Path(share_folder) if share_folder is not None else None
        self.mount_point, self.head_name, self.subnet = mount_point, head_name, subnet
        self.private_dirs = list(private_dirs)
        self.id = secrets.token_hex(3)
        self.prefix = f"{PREFIX}{os.getpid()}-{self.id}"  # owner pid first: see system.sweep_leftovers
        self.head_netns = f"{self.prefix}-head"
        self.root_ifname = f"{PREFIX}{self.id}"  # interface names are limited to 15 characters
        self.hosts: list[Host] = []
        self.head_address = self.client_address = ""
        self._holders: list[subprocess.Popen[str]] = []
        self._tmp: Path | None = None

    def __getitem__(self, name: str) -> Host:
        """A host by its Linux or HPC Pack name."""
        for host in self.hosts:
            if name in (host.name, host.hpc_name):
                return host
        raise KeyError(name)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def start(self) -> None:
        sweep_leftovers()
        on_exit(self, self.close)
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        with machine_lock():  # the subnet must be free until our address claims it
            self.subnet = self._free_subnet(self.subnet)
            net = f"10.200.{self.subnet}"
            self.head_address, self.client_address = f"{net}.254", f"{net}.1"
            self._add_head()
        self.hosts = [
            Host(name, hpc, f"{net}.{11 + i}", f"{self.prefix}-{name}")
            for i, (name, hpc) in enumerate(zip(self.names, self.hpc_names, strict=True))
        ]
        for index, host in enumerate(self.hosts):
            self._add_host(index, host)

    @staticmethod
    def _free_subnet(wanted: int | None) -> int:
        seen = sh("ip", "-4", "route", "show", "table", "all") + sh("ip", "-4", "addr", "show")
        used = {int(x) for x in re.findall(r"\b10\.200\.(\d+)\.", seen)}
        if wanted is not None:
            if wanted in used or not 0 < wanted < 255:
                raise RuntimeError(f"10.200.{wanted}.0/24 is in use on this machine or invalid")
            return wanted
        free = [x for x in range(1, 255) if x not in used]
        if not free:
            raise RuntimeError("no free 10.200.X.0/24 subnet")
        return random.choice(free)

    def _add_head(self) -> None:
        head = self.head_netns
        sh("ip", "netns", "add", head)
        for args in (
            ["link", "set", "lo", "up"],
            ["link", "add", "br0", "type", "bridge"],
            ["addr", "add", f"{self.head_address}/24", "dev", "br0"],
            ["link", "set", "br0", "up"],
            ["route", "add", "unreachable", "default"],  # hosts' traffic to anywhere else stops here
        ):
            sh("ip", "-n", head, *args)
        # Forwarding lets the head answer with ICMP unreachable at once instead of dropping silently.
        sh("ip", "netns", "exec", head, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        sh("ip", "link", "add", self.root_ifname, "type", "veth", "peer", "name", "uplink", "netns", head)
        sh("ip", "-n", head, "link", "set", "uplink", "master", "br0", "up")
        sh("ip", "addr", "add", f"{self.client_address}/24", "dev", self.root_ifname)
        sh("ip", "link", "set", self.root_ifname, "up")

    def _add_host(self, index: int, host: Host) -> None:
        assert self._tmp is not None
        sh("ip", "netns", "add", host.netns)
        port = f"p{index}"
        head = ["ip", "-n", self.head_netns, "link"]
        sh(*head, "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        sh(*head, "set", port, "master", "br0", "up")
        for args in (
            ["addr", "add", f"{host.address}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["link", "set", "lo", "up"],
            ["route", "add", "default", "via", self.head_address],
        ):
            sh("ip", "-n", host.netns, *args)
        files = self._tmp / host.name
        (files / "root").mkdir(parents=True)
        (files / "hosts").write_text(self._hosts_file(host))
        # Name lookups that miss /etc/hosts get "port unreachable" from the head at once, not a timeout.
        (files / "resolv.conf").write_text(f"nameserver {self.head_address}\noptions timeout:1 attempts:1\n")
        share = str(self.share_folder.resolve()) if self.share_folder else ""
        paths = [str(files / name) for name in ("root", "hosts", "resolv.conf")]
        args = [host.name, *paths, share, self.mount_point, str(files / "private"), *self.private_dirs]
        unshare = ["unshare", "--uts", "--mount", "--propagation", "private"]
        holder = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, *unshare, "sh", "-c", _HOLDER, "sh", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._holders.append(holder)
        assert holder.stdout is not None and holder.stderr is not None
        pid = holder.stdout.readline().strip()
        if not pid.isdigit():
            raise RuntimeError(f"host {host.name} did not start: {holder.stderr.read().strip()}")
        host._pid = int(pid)

    def _hosts_file(self, host: Host) -> str:
        # As on stock Debian/Ubuntu, the host's own name is 127.0.1.1: the product must cope with it.
        # glibc matches names case-insensitively, so NODE1 is 127.0.1.1 on node1 itself as well.
        lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{host.name}", "::1\tlocalhost ip6-localhost"]
        lines += [f"{other.address}\t{other.hpc_name}" for other in self.hosts]
        lines.append(f"{self.head_address}\t{self.head_name}")
        return "\n".join(lines) + "\n"

    def namespaces(self) -> list[str]:
        """This bed's network namespaces that currently exist."""
        listed = sh("ip", "netns", "list", check=False).split()
        return [ns for ns in listed if ns.startswith(f"{self.prefix}-")]

    def close(self) -> None:
        """Kill every process in the bed, delete its namespaces and interfaces, remove its files."""
        for holder in self._holders:
            with contextlib.suppress(OSError, ValueError):
                holder.stdin.close()  # type: ignore[union-attr]
        namespaces = self.namespaces()
        for ns in namespaces:
            kill_all(functools.partial(netns_pids, ns))
        while self._holders:
            holder = self._holders.pop()
            holder.wait(10)
            holder.stdout.close()  # type: ignore[union-attr]
            holder.stderr.close()  # type: ignore[union-attr]
        # The root-side veth would go with the head namespace, but lazily: delete it now.
        if sh("ip", "link", "show", self.root_ifname, check=False):
            sh("ip", "link", "del", self.root_ifname)
        for ns in namespaces:
            sh("ip", "netns", "del", ns)
        if self._tmp is not None:
            shutil.rmtree(self._tmp)
            self._tmp = None
        closed(self)
