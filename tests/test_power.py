"""`hpcjob cluster stop` and `cluster start` against a fake `az` (tests/fake_az.py) and the emulated head
node, joined as on Azure: a VM the fake az deallocates is a node lost to the head node (its processes
die; the head node notices after its detection delay), and a VM it starts is the node back once it has
booted. The order is checked as it happens: no VM is deallocated before its node is Offline, and no node
is Online before it is heard again. Then `cluster list`'s state and cost an hour, refusals, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hpcjob.emulator import HeadNode, NodeSpec

from .conftest import Result
from .emulator.conftest import Client, job_xml, task_xml

PASSWORD = "Power-Pw-1234"
GROUP = "rg-emu"
NODES = ("IAASLNXCN000", "IAASLNXCN001")
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"  # fake_az's
BOOT_S = 0.5  # how long a started VM takes before its agent reports again
DETECTION_S = 0.5  # the head node's detection delay


def vm_row(name: str, size: str) -> dict[str, Any]:
    """A VM as fake_az keeps it (its `vm` shape)."""
    return {
        "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
        f"virtualMachines/{name}",
        "name": name,
        "type": "Microsoft.Compute/virtualMachines",
        "location": "eastus",
        "tags": {},
        "hardwareProfile": {"vmSize": size},
        "priority": "Regular",
        "provisioningState": "Succeeded",
    }


@pytest.fixture
def az(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """fake_az on PATH, with the cluster `emu`'s resource group: its head node VM (named after the
    cluster, as the template names it) and two compute node VMs, all running. Its state file."""
    bin_dir, state = tmp_path / "az-bin", tmp_path / "az-state"
    bin_dir.mkdir()
    state.mkdir()
    fake = Path(__file__).resolve().parent / "fake_az.py"
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    (bin_dir / "az").chmod(0o755)
    vms = [vm_row("emu", "Standard_DS4_v2")] + [vm_row(n, "Standard_NC24ads_A100_v4") for n in NODES]
    (state / "state.json").write_text(
        json.dumps(
            {"groups": {GROUP: GROUP}, "vaults": {}, "deleted_vaults": {}, "deployments": {},
             "vms": {GROUP: vms}, "grows": {}}
        )
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_AZ_STATE", str(state))
    monkeypatch.setenv("FAKE_AZ_LOG", str(tmp_path / "az-calls.jsonl"))
    monkeypatch.setenv("FAKE_AZ_VM_DELAY", "0.3")
    return state / "state.json"


def az_commands(tmp_path: Path) -> list[str]:
    log = tmp_path / "az-calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [" ".join(json.loads(line)["argv"][:2]) for line in lines]


def power_of(state_file: Path) -> dict[str, str]:
    """Each VM's power state now, as fake_az computes it."""
    state = json.loads(state_file.read_text())
    found = {}
    for row in state["vms"][GROUP]:
        change = state.get("power", {}).get(row["id"].lower())
        if change is None:
            found[row["name"]] = "running"
        elif time.time() < change["at"]:
            found[row["name"]] = "deallocating" if change["action"] == "deallocate" else "starting"
        else:
            found[row["name"]] = "deallocated" if change["action"] == "deallocate" else "running"
    return found


@dataclass
class Azure:
    """Joins the fake az's VMs to the emulated nodes, and notes what breaks the order."""

    head: HeadNode
    state_file: Path
    broken: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        seen: dict[str, str] = {}
        booted_at: dict[str, float] = {}
        while not self.stop.wait(0.02):
            try:
                powers = power_of(self.state_file)
            except (OSError, ValueError):
                continue  # fake_az writing its file
            cluster = self.head.cluster
            for name in NODES:
                power, node = powers[name], cluster.node(name)
                if power != seen.get(name, "running"):
                    self.events.append((time.monotonic(), f"{name} VM {power} (node {node.state})"))
                    if power == "deallocating" and node.state not in ("Offline", "Draining"):
                        self.broken.append(f"{name} deallocated while {node.state}")
                    if power in ("deallocating", "deallocated") and node.lost is None:
                        self.head.lose_node(name, "evicted")
                    if power == "running":
                        booted_at[name] = time.monotonic() + BOOT_S
                    seen[name] = power
                if name in booted_at and time.monotonic() >= booted_at[name] and node.lost is not None:
                    del booted_at[name]
                    self.head.restore_node(name)
                    self.events.append((time.monotonic(), f"{name} heard again"))
                if node.state == "Online" and node.lost is not None:
                    self.broken.append(f"{name} Online before it was heard again")


@pytest.fixture
def azure(az: Path) -> Iterator[Azure]:
    specs = [NodeSpec(name, groups=("ComputeNodes", "LinuxNodes")) for name in NODES]
    with HeadNode(
        [NodeSpec("LOCALHOST"), *specs],
        users={"alice": PASSWORD},
        grace_period=0.5,
        detection_delay_s=DETECTION_S,
        node_operation_delay_s=0.2,
    ) as head:
        joined = Azure(head, az)
        thread = threading.Thread(target=joined.run, daemon=True)
        thread.start()
        yield joined
        joined.stop.set()
        thread.join()


def profile_of(head: HeadNode, backend: str, **more: Any) -> dict[str, Any]:
    return {
        "url": head.url,
        "user": "HPC\\alice",
        "ca_bundle": head.ca_file,
        "backend": backend,
        "winrm_url": head.wsman_url if backend == "winrm" else None,
        "node_group": "LinuxNodes",
        "resource_group": GROUP,
        "vm_size": "Standard_NC24ads_A100_v4",
        "region": "eastus",
        **more,
    }


def node_states(head: HeadNode) -> dict[str, tuple[str, str]]:
    cluster = head.cluster
    with cluster.lock:
        return {name: (cluster.node(name).state, cluster.node(name).health) for name in NODES}


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_stop_deallocates_the_nodes_after_taking_them_offline_and_start_brings_them_back(
    azure: Azure,
    az: Path,
    tmp_path: Path,
    cli_with_profile: Callable[..., Callable[..., Result]],
    backend: str,
) -> None:
    hpcjob = cli_with_profile(PASSWORD, **profile_of(azure.head, backend))
    start = time.monotonic()
    stopped = hpcjob("cluster", "stop")
    stop_s = time.monotonic() - start
    assert stopped.code == 0, stopped.err
    assert power_of(az) == {"emu": "running", NODES[0]: "deallocated", NODES[1]: "deallocated"}
    assert {state for state, _ in node_states(azure.head).values()} == {"Offline"}
    assert stopped.out.startswith("cluster emu stopped in ")
    assert "2 compute node(s) offline and deallocated" in stopped.out
    assert "the head node emu (Standard_DS4_v2) still runs: $1.17 an hour" in stopped.out  # the table's
    assert "taking 2 node(s) offline: IAASLNXCN000, IAASLNXCN001" in stopped.err
    assert f"{NODES[0]}: VM deallocated" in stopped.err
    made = az_commands(tmp_path)  # the VMs, the deallocation, then their power states until deallocated
    assert made[:2] == ["vm list", "vm deallocate"] and set(made[2:]) == {"vm list"}
    wait_for(lambda: {h for _, h in node_states(azure.head).values()} == {"Error"})  # the head node noticed
    again = hpcjob("cluster", "stop")  # nothing left to do: said, and no az deallocate
    assert again.code == 0 and f"every compute node VM of {GROUP} is deallocated already" in again.err
    assert az_commands(tmp_path).count("vm deallocate") == 1

    listed = hpcjob("cluster", "list")
    header, row = listed.out.splitlines()
    assert header.split()[-2:] == ["STATE", "$/H"]
    assert " stopped, as of " in row and row.endswith("~$1.17")
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    refused = hpcjob("submit", "-n", "2", str(script))  # no nodes to run on: how to start them
    assert refused.code == 2 and refused.err.splitlines()[-1].endswith(
        "; cluster emu's compute nodes were stopped by `hpcjob cluster stop` ("
        + row.split(", as of ")[1][:16]
        + "): `hpcjob cluster start emu` starts them"
    ), refused.err

    start = time.monotonic()
    started = hpcjob("cluster", "start")
    start_s = time.monotonic() - start
    assert started.code == 0, started.err
    assert power_of(az) == {"emu": "running", NODES[0]: "running", NODES[1]: "running"}
    assert node_states(azure.head) == {name: ("Online", "OK") for name in NODES}
    assert started.out.startswith("cluster emu started in ")
    assert started.out.rstrip().endswith(
        "2 compute node(s) online; it costs $8.51 an hour while it runs, the head node emu (Standard_DS4_v2) "
        "$1.17 of it"
    )
    assert "waiting for the head node to hear 2 node(s) again" in started.err
    assert "bringing 2 node(s) online" in started.err
    assert azure.broken == []
    again = hpcjob("cluster", "start")
    assert again.code == 0 and az_commands(tmp_path).count("vm start") == 1
    assert "bringing" not in again.err
    listed = hpcjob("cluster", "list")
    assert " running, as of " in listed.out and listed.out.rstrip().endswith("~$8.51")
    print(f"\n{backend}: stop {stop_s:.1f} s, start {start_s:.1f} s")  # the figures (pytest -s)


def test_stop_refuses_while_a_job_runs_there_unless_forced(
    azure: Azure, az: Path, tmp_path: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    hpcjob = cli_with_profile(PASSWORD, **profile_of(azure.head, "rest"))
    client = Client(azure.head, "alice", PASSWORD)
    job_id = client.submit_xml(
        job_xml(task_xml("sleep 60", RequiredNodes=NODES[0]), UnitType="Node", RequestedNodes=NODES[0])
    )
    client.wait_task(job_id, 1, ("Running",))
    refused = hpcjob("cluster", "stop")
    assert refused.code == 1
    assert refused.err.splitlines()[-1] == (
        f"hpcjob: error: a job runs on {NODES[0]} of cluster emu: wait for it to end or cancel it, or stop "
        "with --force (what runs there ends when the VMs are deallocated)"
    )
    assert "vm deallocate" not in az_commands(tmp_path)
    assert node_states(azure.head)[NODES[0]] == ("Online", "OK")

    forced = hpcjob("cluster", "stop", "--force")
    assert forced.code == 0, forced.err
    assert "(--force: without waiting for the jobs there)" in forced.err
    assert power_of(az)[NODES[0]] == "deallocated"
    assert client.wait(job_id) == "Failed"  # its node's VM went: the head node noticed, the task failed
    wait_for(lambda: node_states(azure.head)[NODES[0]][0] == "Offline")  # drained once the job ended
    assert azure.broken == []


def test_a_cluster_hpcjob_did_not_onboard_is_one_line_and_exit_2(
    az: Path, tmp_path: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    hpcjob = cli_with_profile(PASSWORD, url="https://127.0.0.1:1", user="alice")
    for command in ("stop", "start"):
        for extra in ((), ("--print-only",)):
            done = hpcjob("cluster", command, *extra)
            assert done.code == 2 and done.out == ""
            assert done.err == (
                "hpcjob: error: cluster emu was not onboarded by hpcjob (its profile names no resource "
                "group): stop and start its nodes in HPC Pack and Azure yourself\n"
            )
    unknown = hpcjob("cluster", "stop", "nope")
    assert unknown.code == 2 and len(unknown.err.splitlines()) == 1
    assert az_commands(tmp_path) == []


def test_print_only_prints_the_commands_and_runs_nothing(
    az: Path, tmp_path: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    hpcjob = cli_with_profile(PASSWORD, url="https://127.0.0.1:1", user="alice", resource_group=GROUP)
    stop = hpcjob("cluster", "stop", "--print-only")
    assert stop.code == 0 and stop.err == ""
    assert "Get-HpcNode -GroupName LinuxNodes | Set-HpcNodeState -State Offline" in stop.out
    assert (
        f"az vm deallocate --ids $(az vm list --resource-group {GROUP} --query \"[?name!='emu'].id\" "
        "--output tsv)"
    ) in stop.out
    start = hpcjob("cluster", "start", "--print-only")
    assert start.code == 0 and "az vm start --ids $(" in start.out and "-State Online" in start.out
    assert az_commands(tmp_path) == []


def test_cluster_list_shows_each_cluster_s_state_and_cost_an_hour(
    cli_with_profile: Callable[..., Callable[..., Result]],
) -> None:
    from hpcjob.store.power import NodeKind, PowerRecord, keep_power_record

    hpcjob = cli_with_profile(PASSWORD, url="https://127.0.0.1:1", user="alice", resource_group=GROUP)
    first = hpcjob("cluster", "list").out.splitlines()
    assert first[0].split()[-2:] == ["STATE", "$/H"]
    assert first[1].split()[-2:] == ["unknown", "-"]  # onboarded, never stopped or started here
    nodes = (NodeKind("Standard_NC24ads_A100_v4", False, 2), NodeKind("Standard_NC24ads_A100_v4", True, 1))
    keep_power_record(
        PowerRecord("emu", GROUP, "running", "2026-11-27T14:02:00+00:00", nodes, "Standard_DS4_v2", "eastus")
    )
    listed = hpcjob("cluster", "list")
    running = listed.out.splitlines()[1]
    # 2 x 3.67 + the head node's 1.17, and a Spot node the table has no Spot price for: unknown.
    assert running.split()[-1] == "-" and " running, as of 2026-11-27 " in running
    assert listed.err.splitlines() == [
        "hpcjob: warning: cluster emu's cost an hour: Standard_NC24ads_A100_v4 (Spot): unknown (no Spot "
        "price offline)"
    ]
    keep_power_record(
        PowerRecord("emu", "another-group", "stopped", "2026-11-27T15:00:00+00:00", nodes[:1], None, None)
    )
    assert hpcjob("cluster", "list").out.splitlines()[1].split()[-2:] == ["unknown", "-"]  # another's


def test_a_head_node_that_is_not_running_is_said_and_nothing_is_done(
    az: Path, tmp_path: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    hpcjob = cli_with_profile(PASSWORD, url="https://127.0.0.1:1", user="alice", resource_group=GROUP)
    head_id = vm_row("emu", "Standard_DS4_v2")["id"]
    subprocess.run(["az", "vm", "deallocate", "--ids", head_id], check=True, env=os.environ)
    for command in ("stop", "start"):
        done = hpcjob("cluster", command)
        assert done.code == 1 and done.err.splitlines() == [
            f"hpcjob: error: the head node VM emu of cluster emu is deallocated: start it first (az vm start "
            f"--resource-group {GROUP} --name emu)"
        ]
    assert az_commands(tmp_path) == ["vm deallocate", "vm list", "vm list"]
    assert power_of(az)[NODES[0]] == "running"
