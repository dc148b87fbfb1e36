"""`hpcjob cluster stop` and `hpcjob cluster start`: an onboarded cluster's compute nodes taken offline
and their VMs deallocated, so that idle nodes stop costing, and later started and brought online again.
The head node stays (it holds the scheduler, the share and the nodes' records), and its cost is said.

The order is the one HPC Pack's sources make safe (shared/reference/facts/hpcpack-two-roles-and-recovery.md
§D.2): take the nodes offline (the backend's take_offline: nothing new starts there; without force, a
node that runs a job drains first) and wait for Offline, then deallocate their VMs; to come back, start
the VMs, wait until the head node hears each node's agent again (health OK), then bring them online.

The VMs are those of the cluster's resource group but the head node: the template names the head node
VM after the cluster (`hnName: _clusterName`) and its compute nodes `<prefix>NNN`, and the VM's computer
name is its name, which HPC Pack shows as the node's name (Azure/hpcpack-template @dea762e, the pinned
GeneratedTemplates/new-1hn-lnxcn-no-ad.json: `computerName: vmName`). Nodes added later (`cluster grow`)
are VMs of the same group: they are found the same way.

`az` (azure-cli 2.91.0, read in its wheel; Azure/azure-cli @15a01aed and @078639df for the two commands'
sources): `az vm deallocate` and `az vm start` take several VMs by `--ids` (`id_part="name"`,
vm/aaz/latest/vm/_deallocate.py and _start.py); core runs one job per id, ten at a time
(azure/cli/core/commands/__init__.py, `_run_jobs_concurrently`), and when some ids fail it only warns
and exits 0: hpcjob therefore sends `--no-wait` and reads every VM's power state afterwards with
`az vm list --show-details` (its `powerState`: the instance view's PowerState display statuses joined,
vm/custom.py `get_vm_details`; "VM running" for PowerState/running: MicrosoftDocs/azure-compute-docs
@3255b21d articles/virtual-machines/states-billing.md, the other display words by the same pattern,
UNVERIFIED). `--show-details` asks Azure a few more requests per VM: slow for hundreds of nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcjob.backends import OFFLINE_TIMEOUT_S, ONLINE_TIMEOUT_S
from hpcjob.backends.scheduler import OFFLINE, ONLINE, PollPolicy, wait_for_nodes
from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner import Progress

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.results import NodeInfo
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.power import PowerRecord

# Bounds (seconds): a VM deallocated or started (Azure takes minutes), and a started node's agent heard
# by the head node again (the VM boots, the agent starts and reports: minutes; UNVERIFIED figures).
VM_TIMEOUT_S = 900.0
BOOT_TIMEOUT_S = 900.0
# Between two looks at the VMs when the profile names no poll interval.
VM_POLL_S = 10.0
HEALTHY = "OK"
DEALLOCATED, RUNNING = "deallocated", "running"


@dataclass(frozen=True)
class Limits:
    """How long each wait may last, and how often the VMs are looked at (None: the profile's
    poll_interval, else VM_POLL_S)."""

    vm_timeout_s: float = VM_TIMEOUT_S
    boot_timeout_s: float = BOOT_TIMEOUT_S
    offline_timeout_s: float = OFFLINE_TIMEOUT_S
    online_timeout_s: float = ONLINE_TIMEOUT_S
    vm_poll_s: float | None = None


@dataclass(frozen=True)
class Vm:
    """A VM of the cluster's resource group as `az vm list --show-details` gives it: its power state in
    one word (running, deallocated, deallocating, starting, stopped, ...; "unknown" when az gives none)."""

    name: str
    id: str
    size: str
    power: str
    spot: bool
    windows: bool
    location: str

    @classmethod
    def from_az(cls, row: Mapping[str, Any]) -> Vm:
        os_disk = ((row.get("storageProfile") or {}).get("osDisk")) or {}
        return cls(
            name=str(row.get("name") or ""),
            id=str(row.get("id") or ""),
            size=str((row.get("hardwareProfile") or {}).get("vmSize") or ""),
            power=power_word(str(row.get("powerState") or "")),
            spot=str(row.get("priority") or "") == "Spot",
            windows=str(os_disk.get("osType") or "").lower() == "windows",
            location=str(row.get("location") or ""),
        )


def power_word(display: str) -> str:
    """`VM deallocated` -> deallocated; several statuses joined by az: the last; none: unknown."""
    last = display.split(",")[-1].strip().lower()
    return last.removeprefix("vm ").strip() or "unknown"


def list_command(resource_group: str) -> list[str]:
    return ["az", "vm", "list", "--resource-group", resource_group, "--show-details", "--output", "json"]


def deallocate_command(vms: Sequence[Vm]) -> list[str]:
    return ["az", "vm", "deallocate", "--ids", *(vm.id for vm in vms), "--no-wait"]


def start_command(vms: Sequence[Vm]) -> list[str]:
    return ["az", "vm", "start", "--ids", *(vm.id for vm in vms), "--no-wait"]


def split_vms(rows: Sequence[Mapping[str, Any]], cluster: str) -> tuple[Vm | None, list[Vm]]:
    """The head node's VM (named after the cluster, a Windows VM) and the compute nodes' (every other,
    by name)."""
    vms = [Vm.from_az(row) for row in rows if isinstance(row, Mapping)]
    head = next((vm for vm in vms if vm.name.lower() == cluster.lower()), None)
    nodes = [vm for vm in vms if vm is not head and not vm.windows]
    return head, sorted(nodes, key=lambda vm: vm.name.lower())


def by_hand(profile: ClusterProfile, stop: bool) -> list[str]:
    """What stop (or start) does, as commands a person can run: `--print-only`."""
    rg, name, group = profile.resource_group, profile.name, profile.node_group or "LinuxNodes"
    ids = f"$(az vm list --resource-group {rg} --query \"[?name!='{name}'].id\" --output tsv)"
    nodes = f"Get-HpcNode -GroupName {group}"
    if stop:
        return [
            f"# cluster {name}: its compute nodes offline, then their VMs deallocated; the head node stays",
            "# 1. on the head node, as an HPC administrator (PowerShell; -Force: without waiting for jobs):",
            f"{nodes} | Set-HpcNodeState -State Offline",
            f"# 2. once `{nodes}` shows them Offline, every VM of {rg} but the head node {name}:",
            f"az vm deallocate --ids {ids}",
        ]
    return [
        f"# cluster {name}: its compute nodes' VMs started, then the nodes brought online",
        f"# 1. every VM of {rg} but the head node {name}:",
        f"az vm start --ids {ids}",
        f"# 2. once `{nodes}` shows them healthy (NodeHealth OK), on the head node:",
        f"{nodes} | Set-HpcNodeState -State Online",
    ]


def onboarded(name: str | None) -> ClusterProfile:
    """The profile of a cluster `hpcjob cluster onboard` made (it names the resource group), else a
    SpecError: hpcjob knows nothing of another cluster's VMs."""
    from hpcjob.store.config import get_profile

    profile = get_profile(name)
    if profile.resource_group is None:
        raise SpecError(
            f"cluster {profile.name} was not onboarded by hpcjob (its profile names no resource group): "
            "stop and start its nodes in HPC Pack and Azure yourself"
        )
    return profile


@dataclass
class PowerReport:
    """What stop or start did: the compute nodes (`nodes`), the VMs it deallocated or started
    (`changed`), how long it took, the head node's VM and what the cluster costs an hour now
    (`head_usd`, `nodes_usd`; None: no price known, with `price_notes` saying why and where prices came
    from), and the state recorded."""

    cluster: str
    nodes: list[str]
    changed: list[str]
    seconds: float
    head: Vm | None
    head_usd: float | None
    nodes_usd: float | None
    record: PowerRecord
    price_notes: list[str] = field(default_factory=list)


class _Clock:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def stamp(self) -> str:
        minutes, seconds = divmod(int(self.elapsed()), 60)
        return f"[{minutes:02d}:{seconds:02d}]"


def stop_cluster(
    name: str | None,
    *,
    force: bool,
    progress: Progress,
    limits: Limits | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> PowerReport:
    """Take the cluster's compute nodes offline and deallocate their VMs; refused while a job runs on
    them unless `force` (what runs there then ends with the VMs)."""
    from hpcjob.azure.az import run_az
    from hpcjob.store.power import STOPPED

    limits = limits or Limits()
    profile = onboarded(name)
    timer = _Clock(clock)
    head, vms = _cluster_vms(profile, run_az)
    _head_runs(profile, head)  # the nodes go offline through it
    backend = _open(profile)
    known = _known_nodes(backend, vms, progress)
    busy = sorted(backend.busy_nodes() & {node.upper() for node in known})
    if busy and not force:
        raise HpcjobError(
            f"a job runs on {', '.join(busy)} of cluster {profile.name}: wait for it to end or cancel it, or "
            "stop with --force (what runs there ends when the VMs are deallocated)"
        )
    to_take = [node for node, info in known.items() if info.state != OFFLINE]
    if to_take:
        how = " (--force: without waiting for the jobs there)" if busy else ""
        progress(f"hpcjob: {timer.stamp()} taking {len(to_take)} node(s) offline{how}: {', '.join(to_take)}")
        backend.take_offline(
            to_take, force=force, progress=_indented(progress), timeout_s=limits.offline_timeout_s
        )
    running = [vm for vm in vms if vm.power != DEALLOCATED]
    if running:
        progress(f"hpcjob: {timer.stamp()} deallocating {len(running)} VM(s) (minutes): "
                 f"{', '.join(vm.name for vm in running)}")  # fmt: skip
        run_az(deallocate_command(running))
        _wait_for_vms(profile, running, DEALLOCATED, limits, timer, progress, sleep, run_az)
    else:
        progress(f"hpcjob: every compute node VM of {profile.resource_group} is deallocated already")
    return _report(profile, head, vms, STOPPED, timer, progress, [vm.name for vm in running])


def start_cluster(
    name: str | None,
    *,
    progress: Progress,
    limits: Limits | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> PowerReport:
    """Start the cluster's compute node VMs, wait until the head node hears each node again (health
    OK), and bring them online."""
    from hpcjob.azure.az import run_az
    from hpcjob.store.power import RUNNING as RECORDED_RUNNING

    limits = limits or Limits()
    profile = onboarded(name)
    timer = _Clock(clock)
    head, vms = _cluster_vms(profile, run_az)
    _head_runs(profile, head)
    stopped = [vm for vm in vms if vm.power != RUNNING]
    if stopped:
        progress(f"hpcjob: {timer.stamp()} starting {len(stopped)} VM(s) (minutes): "
                 f"{', '.join(vm.name for vm in stopped)}")  # fmt: skip
        run_az(start_command(stopped))
        _wait_for_vms(profile, stopped, RUNNING, limits, timer, progress, sleep, run_az)
    backend = _open(profile)
    known = _known_nodes(backend, vms, progress)
    names = list(known)
    if names:
        progress(f"hpcjob: {timer.stamp()} waiting for the head node to hear {len(names)} node(s) again")
        seen = wait_for_nodes(
            lambda: backend.nodes(None),
            names,
            lambda node: node.health == HEALTHY,
            wanted="heard by the head node (health OK)",
            timeout_s=limits.boot_timeout_s,
            progress=_indented(progress),
            poll=PollPolicy.at_most(profile.poll_interval),
            sleep=sleep,
            clock=clock,
        )
        to_bring = [node.name for node in seen if node.state != ONLINE]
        if to_bring:
            progress(
                f"hpcjob: {timer.stamp()} bringing {len(to_bring)} node(s) online: {', '.join(to_bring)}"
            )
            backend.bring_online(to_bring, progress=_indented(progress), timeout_s=limits.online_timeout_s)
    return _report(profile, head, vms, RECORDED_RUNNING, timer, progress, [vm.name for vm in stopped])


def _head_runs(profile: ClusterProfile, head: Vm | None) -> None:
    """Refuse when the head node's VM is not running: the nodes are taken offline and brought online
    through it."""
    if head is not None and head.power != RUNNING:
        raise HpcjobError(
            f"the head node VM {head.name} of cluster {profile.name} is {head.power}: start it first (az vm "
            f"start --resource-group {profile.resource_group} --name {head.name})"
        )


def _open(profile: ClusterProfile) -> Backend:
    from hpcjob.runner import ClusterAccess

    return ClusterAccess(profile.name).backend


def _indented(progress: Progress) -> Progress:
    return lambda line: progress(f"hpcjob:   {line}")


def _cluster_vms(profile: ClusterProfile, run_az: Callable[[list[str]], Any]) -> tuple[Vm | None, list[Vm]]:
    assert profile.resource_group is not None
    rows = run_az(list_command(profile.resource_group)) or []
    head, vms = split_vms(rows if isinstance(rows, list) else [], profile.name)
    if not vms:
        raise HpcjobError(
            f"resource group {profile.resource_group} has no compute node VMs (az vm list): nothing to do"
        )
    return head, vms


def _known_nodes(backend: Backend, vms: Sequence[Vm], progress: Progress) -> dict[str, NodeInfo]:
    """The compute node VMs the head node lists, by the node's name; a VM it does not know is said
    (its VM is deallocated or started all the same)."""
    listed = {node.name.upper(): node for node in backend.nodes(None)}
    known: dict[str, NodeInfo] = {}
    for vm in vms:
        node = listed.get(vm.name.upper())
        if node is None:
            progress(f"hpcjob: warning: VM {vm.name} is no node of the head node's: its VM only")
        else:
            known[node.name] = node
    return known


def _wait_for_vms(
    profile: ClusterProfile,
    vms: Sequence[Vm],
    wanted: str,
    limits: Limits,
    timer: _Clock,
    progress: Progress,
    sleep: Callable[[float], None],
    run_az: Callable[[list[str]], Any],
) -> None:
    """Read the VMs' power states (`az vm list --show-details`) until each is `wanted`, saying each
    change; a bound, and az's own failures, end it with the VMs not there named."""
    assert profile.resource_group is not None
    poll = limits.vm_poll_s or profile.poll_interval or VM_POLL_S
    deadline = timer.elapsed() + limits.vm_timeout_s
    names = {vm.name.lower(): vm.power for vm in vms}
    while True:
        _, now = _cluster_vms(profile, run_az)
        states = {vm.name.lower(): vm for vm in now if vm.name.lower() in names}
        for key, vm in states.items():
            if names[key] != vm.power:
                names[key] = vm.power
                progress(f"hpcjob: {timer.stamp()} {vm.name}: VM {vm.power}")
        gone = sorted(set(names) - set(states))
        if gone:
            raise HpcjobError(
                f"VM(s) {', '.join(gone)} left resource group {profile.resource_group} meanwhile"
            )
        left = [vm for vm in states.values() if vm.power != wanted]
        if not left:
            return
        if timer.elapsed() >= deadline:
            said = ", ".join(f"{vm.name} {vm.power}" for vm in left)
            raise HpcjobError(
                f"{len(left)} VM(s) not {wanted} after {limits.vm_timeout_s:.0f} s: {said} "
                f"(az vm list --resource-group {profile.resource_group} --show-details --output table)"
            )
        sleep(poll)


def _report(
    profile: ClusterProfile,
    head: Vm | None,
    vms: Sequence[Vm],
    state: str,
    timer: _Clock,
    progress: Progress,
    changed: list[str],
) -> PowerReport:
    """Record the state, and what the cluster costs an hour now (the prices cache, the API, else the
    package's table; each price's source in `price_notes`)."""
    from hpcjob.store.power import RUNNING as RECORDED_RUNNING
    from hpcjob.store.power import NodeKind, PowerRecord, keep_power_record, now_utc

    region = profile.region or (head.location if head else None) or (vms[0].location if vms else None)
    kinds: dict[tuple[str, bool], int] = {}
    for vm in vms:
        kinds[(vm.size, vm.spot)] = kinds.get((vm.size, vm.spot), 0) + 1
    record = PowerRecord(
        cluster=profile.name,
        resource_group=profile.resource_group or "",
        state=state,
        as_of=now_utc(),
        nodes=tuple(NodeKind(size, spot, count) for (size, spot), count in sorted(kinds.items())),
        head_size=head.size if head else None,
        region=region,
    )
    keep_power_record(record)
    notes: list[str] = []
    warned: set[str] = set()
    head_usd = _price(head.size, region, "windows", notes, warned, progress) if head and region else None
    nodes_usd: float | None = 0.0
    for kind in record.nodes if state == RECORDED_RUNNING else ():
        meter = "spot" if kind.spot else "linux"
        each = _price(kind.size, region, meter, notes, warned, progress) if region else None
        nodes_usd = None if nodes_usd is None or each is None else nodes_usd + kind.count * each
    return PowerReport(
        cluster=profile.name,
        nodes=[vm.name for vm in vms],
        changed=changed,
        seconds=timer.elapsed(),
        head=head,
        head_usd=head_usd,
        nodes_usd=nodes_usd,
        record=record,
        price_notes=notes,
    )


def _price(
    size: str, region: str, meter: str, notes: list[str], warned: set[str], progress: Progress
) -> float | None:
    """`size`'s price an hour on `meter` (linux, spot, windows) in `region`: hpcjob.store.prices's
    answer. Where it came from goes in `notes` once (the API's), or is warned of once (a cache past its
    age, hpcjob's own table, no price)."""
    from hpcjob.job.prices import FROM_API
    from hpcjob.store.prices import hourly_price

    def warn(text: str) -> None:
        if text not in warned:
            warned.add(text)
            progress(f"hpcjob: warning: {text}")

    answer = hourly_price(size, region, meter)
    if answer.warning:
        warn(answer.warning)
    elif answer.prices is not None and answer.prices.source == FROM_API:
        note = f"{size}: the Azure Retail Prices API, {answer.prices.region}, asked {answer.prices.asked}"
        if note not in notes:
            notes.append(note)
    if answer.unknown:  # the API's own reason, or which meter the prices lack
        warn(f"no {meter} price for {size} in {region}: {answer.unknown}")
    return answer.usd_per_hour
