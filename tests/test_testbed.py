"""The multi-host test bed itself: separate hosts named as on an HPC Pack cluster, /app, SMB, teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.testbed import TestBed, prerequisites, require_testbed, sweep_leftovers
from tests.testbed.system import pids_with_arg, sh

pytest_plugins = ["tests.testbed.fixtures"]

REPO = Path(__file__).resolve().parent.parent

# Serves one connection on a free port: prints the port, then answers with this host's name.
ECHO_SERVER = """
import socket
server = socket.create_server(("0.0.0.0", 0))
print(server.getsockname()[1], flush=True)
conn, peer = server.accept()
conn.sendall(f"{socket.gethostname()} saw {peer[0]}".encode())
"""
CLIENT = """
import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).recv(100).decode())
"""


def mounts() -> set[str]:
    """Mount points of the root mount namespace, but /run/netns that `ip netns` keeps for itself."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    others = ("/run/netns/hpcjt-", f"/run/netns/hpcjt-{os.getpid()}-")  # another test worker's beds
    points = {line.split()[4] for line in lines} - {"/run/netns"}
    return {p for p in points if not (p.startswith(others[0]) and not p.startswith(others[1]))}


def temp_dirs() -> set[Path]:
    """This process's test beds' folders (another test worker's come and go meanwhile)."""
    return set(Path(tempfile.gettempdir()).glob(f"hpcjt-{os.getpid()}-*"))


def test_each_host_has_its_own_name_address_and_default_route(testbed: TestBed) -> None:
    for host in testbed.hosts:
        assert host.check_output("hostname").strip() == host.name
        assert "dev eth0" in host.check_output("ip -o -4 route show default")
        assert f"inet {host.address}/24" in host.check_output("ip -o -4 addr show dev eth0")


def test_names_resolve_as_on_a_debian_node_of_a_cluster(testbed: TestBed) -> None:
    node1, node2 = testbed["node1"], testbed["node2"]
    assert testbed.smb is not None
    assert node1.check_output(["getent", "hosts", "NODE2"]).split()[0] == node2.address
    assert node2.check_output(["getent", "hosts", "NODE1"]).split()[0] == node1.address
    assert node1.check_output(["getent", "hosts", "node1"]).split()[0] == "127.0.1.1"
    assert node2.check_output(["getent", "hosts", "HEADNODE"]).split()[0] == testbed.smb.address


def test_hosts_reach_each_other_and_nothing_else(testbed: TestBed) -> None:
    node1, node2 = testbed["node1"], testbed["node2"]
    server = node2.run([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        reply = node1.check_output([sys.executable, "-c", CLIENT, "NODE2", port], timeout=10)
        assert reply.strip() == f"node2 saw {node1.address}"
    finally:
        server.kill()
        server.communicate()
    # Anything outside the bed's subnet is refused at the head at once (TEST-NET-3, never routed).
    start = time.monotonic()
    with pytest.raises(subprocess.CalledProcessError, match="No route to host"):
        node1.check_output([sys.executable, "-c", CLIENT, "203.0.113.1", "80"])
    assert time.monotonic() - start < 5


def test_share_folder_is_app_on_every_host(testbed: TestBed) -> None:
    node1, node2 = testbed["node1"], testbed["node2"]
    node1.check_output("mountpoint -q /app && echo from node1 > /app/from-node1.txt")
    assert (testbed.share_folder / "from-node1.txt").read_text() == "from node1\n"
    (testbed.share_folder / "from-test.txt").write_text("from the test\n")
    assert node2.check_output(["cat", "from-test.txt"], cwd="/app") == "from the test\n"
    assert not Path("/app/from-node1.txt").exists()  # /app exists only inside the hosts


def test_smb_server_serves_the_share_folder(testbed: TestBed, tmp_path: Path) -> None:
    require_testbed(["smbclient"])
    smb = testbed.smb
    assert smb is not None and smb.password not in repr(smb)
    (testbed.share_folder / "listed.txt").write_text("x")
    local = tmp_path / "put.txt"
    local.write_text("over SMB\n")

    def smbclient(address: str, command: str) -> list[str]:
        # The password only ever travels in the credentials file, never on a command line.
        creds = ["-A", str(smb.credentials_file), "-p", str(smb.port)]
        return ["smbclient", f"//{address}/CcpSpoolDir", *creds, "-c", command]

    listing = sh(*smbclient(smb.address, "ls app/*"))
    assert "listed.txt" in listing
    sh(*smbclient(smb.address, f"put {local} app/put.txt"))
    assert (testbed.share_folder / "put.txt").read_text() == "over SMB\n"
    # The hosts reach the same server by the head node's name.
    assert "put.txt" in testbed["node1"].check_output(smbclient("HEADNODE", "ls app/put.txt"))


def test_teardown_leaves_nothing_behind() -> None:
    require_testbed()
    mounts_before, files_before = mounts(), temp_dirs()
    with TestBed(["alpha"]) as bed:
        assert bed.smb is not None
        smb_files = str(bed.smb.credentials_file.parent)
        namespaces, ifname = bed.hosts.namespaces(), bed.hosts.root_ifname
        assert len(namespaces) == 2 and pids_with_arg(smb_files) and len(temp_dirs() - files_before) == 3
        stray = bed["alpha"].run(["sleep", "300"])  # a process the test forgot
    assert stray.wait(timeout=5) != 0
    assert not set(namespaces) & set(sh("ip", "netns", "list").split())
    assert sh("ip", "link", "show", ifname, check=False) == ""
    assert mounts() == mounts_before
    assert not pids_with_arg(smb_files)
    assert temp_dirs() == files_before


def test_sweeper_removes_what_a_crashed_run_left() -> None:
    require_testbed()
    crash = "from tests.testbed import TestBed; import os; TestBed(['x1']).__enter__(); os._exit(1)"
    child = subprocess.Popen([sys.executable, "-c", crash], cwd=REPO)
    assert child.wait(timeout=60) == 1
    prefix = f"hpcjt-{child.pid}-"

    def left() -> list[str]:
        namespaces = [ns for ns in sh("ip", "netns", "list").split() if ns.startswith(prefix)]
        return namespaces + [str(p) for p in Path(tempfile.gettempdir()).glob(f"{prefix}*")]

    leftovers = left()
    assert len(leftovers) == 5  # two namespaces and three temp dirs: no atexit ran
    assert set(sweep_leftovers()) >= set(leftovers)
    assert left() == []


def test_missing_prerequisite_skips_but_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prerequisites, "missing_prerequisites", lambda tools: ["the `smbd` command"])
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="smbd"):
        require_testbed()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="smbd"):
        require_testbed()
