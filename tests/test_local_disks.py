"""The node's local disks assembled by hpcjob's execution filter (as root, where the administrator's file
names them): real loop devices, the real lsblk, blkid, mkfs and mount of this machine's kernel. Skipped
where this machine refuses loop devices or is not root (failing with CI=true); several disks need the
kernel's RAID (md) driver, which some kernels lack: there the filter says so in one line."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcjob.node import mount_filter


def _refused(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}")
    pytest.skip(why)


class LoopDisks:
    """Files of `size` bytes as block devices, detached and unmounted at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.devices: list[str] = []
        self.points: list[Path] = []

    def add(self, size: int = 64 << 20) -> str:
        image = self.folder / f"disk{len(self.devices)}.img"
        with open(image, "wb") as out:
            out.truncate(size)
        done = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
        if done.returncode != 0:
            _refused(f"loop devices are refused here: {done.stderr.strip()}")
        self.devices.append(done.stdout.strip())
        return self.devices[-1]

    def close(self) -> None:
        for point in self.points:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)
        for device in self.devices:
            subprocess.run(["losetup", "-d", device], capture_output=True)


@pytest.fixture
def disks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopDisks]:
    if os.geteuid() != 0:
        _refused("the filter's disks need root")
    for tool in ("losetup", "lsblk", "blkid", "mkfs.ext4", "mount"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            _refused(f"{tool} is not installed")
    monkeypatch.setattr(mount_filter, "NODE_ROOT", str(tmp_path / "node"))  # its lock and log
    # One test at a time takes loop devices: another's, detached and taken again, must not be this one's.
    with open("/tmp/hpcjob-test-loop-devices.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        loops = LoopDisks(tmp_path)
        try:
            yield loops
        finally:
            loops.close()


def assemble(point: Path, devices: list[str]) -> str:
    config = {"local_disks": {"mount": str(point), "devices": devices}}
    return mount_filter.local_disks(config, time.monotonic() + 15)


def mounted(point: Path) -> str:
    """What is mounted at `point`, as findmnt says: "SOURCE FSTYPE OPTIONS", "" where nothing is."""
    done = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", str(point)], capture_output=True,
                          text=True)  # fmt: skip
    return done.stdout.strip()


def test_a_free_disk_becomes_the_local_volume_once_and_is_mounted_again_after_a_reboot(
    disks: LoopDisks, tmp_path: Path
) -> None:
    free = disks.add()
    point = tmp_path / "nvme"
    disks.points.append(point)
    assert assemble(point, [free]) == f"assembled 1 disk(s) into one volume at {point}"
    source, fstype, options = mounted(point).split()
    assert (
        source == free
        and fstype in ("xfs", "ext4")
        and {"nosuid", "nodev", "noatime"} <= set(options.split(","))
    )
    shared = point / "hpcjob"  # everyone's to make a folder of their own in, as /tmp
    assert shared.stat().st_mode & 0o7777 == 0o1777 and shared.stat().st_uid == 0
    (shared / "kept").write_text("a user's data\n")

    assert assemble(point, [free]) == "ready"  # idempotent: nothing made again
    subprocess.run(["umount", str(point)], check=True)  # a reboot: the volume is there, not mounted
    assert assemble(point, [free]) == f"mounted its volume again at {point}"
    assert (shared / "kept").read_text() == "a user's data\n"  # never made anew


def test_a_disk_that_holds_anything_is_never_taken(disks: LoopDisks, tmp_path: Path) -> None:
    """A file system, a partition table: such a disk is someone's (the OS disk, the resource disk, a disk an
    administrator uses); nothing is written to it, and where nothing is free the filter says so."""
    with_fs, with_table = disks.add(), disks.add()
    subprocess.run(["mkfs.ext4", "-q", "-L", "theirs", with_fs], check=True)
    with open(with_table, "r+b") as disk:  # an MBR with one Linux partition, as fdisk writes it
        disk.seek(446)
        disk.write(struct.pack("<B3sB3sII", 0, b"\x00\x02\x00", 0x83, b"\xff\xff\xff", 2048, 129024))
        disk.seek(510)
        disk.write(b"\x55\xaa")
    before = [_head(device) for device in (with_fs, with_table)]
    point = tmp_path / "nvme"
    with pytest.raises(
        mount_filter.Refused, match=f"^no free disk matches {with_fs} {with_table} to assemble"
    ):
        assemble(point, [with_fs, with_table])
    assert [_head(device) for device in (with_fs, with_table)] == before
    assert mounted(point) == ""


def _head(device: str) -> bytes:
    with open(device, "rb") as disk:
        return disk.read(1 << 20)


def test_several_free_disks_are_one_raid0_volume_or_the_kernel_s_lack_is_said(
    disks: LoopDisks, tmp_path: Path
) -> None:
    free = [disks.add(), disks.add()]
    point = tmp_path / "nvme"
    disks.points.append(point)
    if not os.path.exists("/proc/mdstat"):  # this machine's kernel: no md driver (said, nothing written)
        with pytest.raises(mount_filter.Refused, match=r"^2 disks to assemble, and this kernel has no RAID"):
            assemble(point, free)
        return
    if subprocess.run(["sh", "-c", "command -v mdadm"], capture_output=True).returncode != 0:
        _refused("mdadm is not installed (scripts/bootstrap.sh --test installs it as root)")
    try:
        assert assemble(point, free) == f"assembled 2 disk(s) into one volume at {point}"
        assert mounted(point).split()[0].startswith("/dev/md")
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        with contextlib.suppress(OSError):
            subprocess.run(
                ["mdadm", "--stop", f"/dev/md/{mount_filter.LOCAL_DISK_LABEL}"], capture_output=True
            )
