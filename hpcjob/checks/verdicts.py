"""`hpcjob doctor`: whether a cluster is fit for a first job, one check at a time, each with its fix.

Pure: the CLI asks the backend and the share, and hands the answers here; this turns them into checks.
A probe job runs `probe_command` on every node (one task per node, not a gang, so that each node
answers for itself): its GPUs, torch and CUDA, and whether the share is mounted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpcjob.job.results import NodeInfo, State, find_metrics
from hpcjob.job.spec import DEFAULT_COMMAND_LIMIT, DEFAULT_RDZV_PORT

PASS, FAIL, SKIP = "pass", "fail", "skip"
INFO = "info"  # a figure with no mark to judge it by
PROBE_PREFIX = "HPCJOB_PROBE"
# One Python run answers for the node, on its first line: its Python and platform, torch's version,
# whether CUDA works and the GPUs it sees, and whether it can make a job's environment (venv with pip:
# ensurepip, which Debian and Ubuntu leave out without python3-venv): "3.10.12 x86_64 2.14.1 True 2 venv".
# Where an import fails, the rest is its traceback, whose last line says why.
NODE_PROBE = (
    "import platform as p;print(p.python_version(),p.machine(),end=' ');import torch as t;"
    "print(t.__version__,t.cuda.is_available(),t.cuda.device_count(),end=' ');import ensurepip;print('venv')"
)


@dataclass(frozen=True)
class Check:
    name: str
    result: str  # PASS, FAIL, SKIP (could not run: `detail` says why) or INFO (no mark to judge by)
    detail: str
    fix: str = ""
    figures: tuple[dict[str, object], ...] = ()  # what was measured, each with its mark (--json)

    @property
    def failed(self) -> bool:
        return self.result == FAIL


# Where both HPC Pack Linux agents live. Only the C++ agent's package ships StartMpiContainer.sh there; the
# .NET agent's is an ASP.NET publish (appsettings.json, UNVERIFIED) whose update removes the *.sh files
# (docs/facts/hpcpack-agent-filters-and-cmdlets.md §11).
AGENT_DIR = "/opt/hpcnodemanager"
AGENT_MARKS = {"StartMpiContainer.sh": "c++", "appsettings.json": ".net"}


# How a node's GPUs are counted: NVIDIA's list, one `GPU n: ...` line a GPU; where nvidia-smi is missing
# (AMD GPUs: ND MI300X v5), ROCm's, as Microsoft's health checks count them (`rocm-smi -l | grep 'GPU'`:
# Azure/azurehpc-health-checks @0e0a1ac customTests/azure_gpu_count.nhc L11-12; that its lines start with
# GPU, as the count here takes them, is UNVERIFIED). The HPC Pack node agent itself knows only nvidia-smi
# (Azure/hpcpack-linux-agent @f50e911 nodemanager/utils/System.cpp L443-449, core/Monitor.cpp L633-635):
# AMD nodes report no GPUs to the scheduler.
GPU_LIST, ROCM_GPU_LIST = "nvidia-smi -L", "rocm-smi -l"


def probe_command(mount_point: str, python: str = "python3", limit: int = DEFAULT_COMMAND_LIMIT) -> str:
    """One shell line for every node, within the scheduler's CommandLine `limit`: `HPCJOB_PROBE key=value`
    lines (the scheduler keeps the first 1500 bytes of a task's output: these fit). The agent's question
    comes last, and only where the line has room for it (a long mount point leaves none).
    `mount_point` is a plain path (the spec's rules)."""
    command = (
        f"P={PROBE_PREFIX};echo $P gpus=$( ({GPU_LIST}||{ROCM_GPU_LIST})2>&-|grep -c ^GPU);"
        f'echo $P node=$({python} -c "{NODE_PROBE}" 2>&1|tr "\\n " ";,");'
        f"echo $P mounted=$(mountpoint -q {mount_point}&&echo yes||echo no)"
    )
    agent = f";echo $P agent=$(cd {AGENT_DIR} 2>&-&&ls {' '.join(AGENT_MARKS)} 2>&-)"
    return command + agent if len(command + agent) <= limit else command


def local_probe_command(folder: str | None) -> str:
    """One shell line for every node: where its local folder is (the node's own HPCJOB_LOCAL_DIR where it
    has one, else `folder`, else the resource disk's mount points) and `df`'s line for it."""
    from hpcjob.job.datasets import LOCAL_DIR_VAR, RESOURCE_DISKS

    asked = folder or " ".join(RESOURCE_DISKS)
    return (
        f"P={PROBE_PREFIX};d=${{{LOCAL_DIR_VAR}:-{asked}}};echo $P local=$d;"
        f'echo $P df=$(df -Pk $d 2>&-|tail -n +2|tr " \n" ",;")'
    )


def local_disk_check(answers: Sequence[tuple[str, str]], datasets: bool) -> Check:
    """Each node's local folder (`local_probe_command`'s answers) and its free space: the datasets' and
    the checkpoints' place on the node. A node without one fails only where the profile copies datasets
    (`datasets`); the least free space is what a dataset may take."""
    from hpcjob.job.datasets import size_text

    found: dict[str, tuple[str, str, int]] = {}  # node: (folder, its file system's mount point, free bytes)
    missing: dict[str, str] = {}
    for node, output in answers:
        said = parse_probe(output)
        asked = said.get("local", "").split()
        if not asked:
            continue
        rows = [[field for field in row.split(",") if field] for row in said.get("df", "").split(";")]
        rows = [row for row in rows if len(row) >= 6 and row[3].isdigit()]
        if len(asked) == 1 and rows:  # the folder named: df's line is its file system's
            found[node] = (asked[0], rows[0][5], int(rows[0][3]) * 1024)
            continue
        mounted = [row for row in rows if row[5] in asked]  # the resource disk: a mount point of its own
        if len(asked) > 1 and mounted:
            found[node] = (mounted[0][5], mounted[0][5], int(mounted[0][3]) * 1024)
        else:
            missing[node] = " or ".join(asked)
    if not found and not missing:
        return Check("local disk", SKIP, "no node answered the probe")
    parts = []
    for folder in sorted({where for where, _, _ in found.values()}):
        nodes = sorted((free, node) for node, (where, _, free) in found.items() if where == folder)
        mounts = {mount for node, (where, mount, _) in found.items() if where == folder}
        on = "" if mounts == {folder} or "/" not in mounts else ", on the OS disk"
        least, most = nodes[0], nodes[-1]
        range_ = (
            f"{size_text(least[0])} free"
            if least[0] == most[0]
            else (f"{size_text(least[0])} free at least ({least[1]}), {size_text(most[0])} at most")
        )
        parts.append(f"{folder} on {len(nodes)} node(s){on}: {range_}")
    if missing:
        where = sorted(set(missing.values()))
        detail = f"{', '.join(sorted(missing))}: no local folder at {'; '.join(where)}"
        fix = (
            "set local_dir in the cluster's profile to a folder on the nodes' own disk (a size with NVMe "
            "disks: the share's mount step assembles them at /mnt/nvme)"
        )
        if datasets:
            return Check("local disk", FAIL, "; ".join([detail, *parts]), fix)
        return Check("local disk", INFO, "; ".join([detail + " (--dataset needs one)", *parts]))
    return Check("local disk", INFO, "; ".join(parts))


def parse_probe(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        if line.startswith(f"{PROBE_PREFIX} ") and "=" in line:
            key, _, value = line[len(PROBE_PREFIX) + 1 :].partition("=")
            found[key.strip()] = value.strip()
    return found


def reach_checks(
    endpoint: str, user: str, version: str | None, error: str | None, seconds: float
) -> list[Check]:
    """The head node answered, and took the credentials (`error`: what the first request raised)."""
    if error is None:
        said = f"HPC Pack {version}" if version else "HPC Pack version not known over this backend"
        return [
            Check("head node", PASS, f"{endpoint} answered in {seconds:.2f} s, {said}"),
            Check("credentials", PASS, f"accepted for {user}"),
        ]
    if "refused the credentials" in error:
        return [
            Check("head node", PASS, f"{endpoint} answered"),
            Check(
                "credentials",
                FAIL,
                error,
                "check the user name (DOMAIN\\user) and the password the profile reads",
            ),
        ]
    fix = "check the URL, the network path (VPN, firewall, the head node's port) and the certificate settings"
    return [
        Check("head node", FAIL, error, fix),
        Check("credentials", SKIP, "cannot run: the head node did not answer"),
    ]


def node_check(nodes: Sequence[NodeInfo], group: str | None) -> tuple[Check, list[str]]:
    """The group's nodes online and healthy; the usable ones."""
    where = f"node group {group}" if group else "the cluster"
    usable = [n.name for n in nodes if n.usable]
    if not nodes:
        return Check(
            "nodes", FAIL, f"{where} has no nodes", "check the profile's node_group (`hpcjob nodes`)"
        ), []
    others = [f"{n.name} ({n.state}, {n.health})" for n in nodes if not n.usable]
    if others:
        names = " ".join(n.name for n in nodes if not n.usable)
        return (
            Check(
                "nodes",
                FAIL,
                f"{len(usable)} of {len(nodes)} in {where} usable; not: {', '.join(others)}",
                f"bring them online (on the head node: Set-HpcNodeState -Name {names} -State online) or "
                "leave them out of jobs (--exclude-node)",
            ),
            usable,
        )
    return Check("nodes", PASS, f"{len(usable)} in {where}, all online and healthy"), usable


@dataclass(frozen=True)
class NodeProbe:
    """One node's answer to `probe_command`, read once."""

    node: str
    said: dict[str, str]

    @classmethod
    def of(cls, node: str, output: str) -> NodeProbe:
        return cls(node, parse_probe(output))

    @property
    def gpus(self) -> int | None:
        value = self.said.get("gpus", "")
        return int(value) if value.isdigit() else None

    def _words(self) -> list[str]:
        """The node's Python run: its first line's words."""
        return self.said.get("node", "").split(";")[0].split(",")

    @property
    def python(self) -> tuple[str, str, bool | None] | None:
        """The node's Python version and machine, and whether it has venv (None: not known, torch did not
        import before it); None when the node did not say."""
        words = self._words()
        if len(words) < 2 or not words[0][:1].isdigit():
            return None
        return words[0], words[1], (words[5:6] == ["venv"]) if self.torch is not None else None

    @property
    def torch(self) -> tuple[str, bool] | None:
        """torch's version and whether CUDA works; None when it could not be imported."""
        words = self._words()
        return (words[2], words[3] == "True") if len(words) >= 5 and words[2][:1].isdigit() else None

    @property
    def torch_error(self) -> str:
        lines = [line for line in self.said.get("node", "").split(";") if line.strip(",")]
        return " ".join(lines[-1].split(",")) if len(lines) > 1 else "no answer"

    @property
    def agent(self) -> str | None:
        """The node's HPC Pack agent: "c++", ".net", or None (neither's mark found, not asked, or no
        answer)."""
        kinds = {AGENT_MARKS.get(name) for name in self.said.get("agent", "").split()}
        return ".net" if ".net" in kinds else "c++" if "c++" in kinds else None

    @property
    def fit(self) -> bool:
        """Where a job can run: torch there and the share mounted."""
        return self.torch is not None and self.said.get("mounted") == "yes"


def probe_checks(
    answers: Sequence[tuple[str, str]], expected_gpus: int | None, mount_point: str, share: str | None
) -> list[Check]:
    """GPUs, the share's mount and torch on every node, from each node's probe output."""
    probes = [NodeProbe.of(node, output) for node, output in answers]
    answered = [probe for probe in probes if probe.said]
    if not answered:
        return [
            Check(name, SKIP, "no node answered the probe") for name in ("GPUs", "share mounted", "torch")
        ]
    checks = [
        _gpu_check(answered, expected_gpus),
        _mount_check(answered, mount_point, share),
        _torch_check(answered),
        _python_check(answered),
        _agent_check(answered),
    ]
    silent = [probe.node for probe in probes if not probe.said]
    if silent:
        checks.append(
            Check(
                "probe",
                FAIL,
                f"no answer from {', '.join(silent)}",
                "see the probe job's tasks: hpcjob status JOB",
            )
        )
    return checks


def _gpu_check(probes: Sequence[NodeProbe], expected: int | None) -> Check:
    counts = {probe.node: probe.gpus for probe in probes if probe.gpus is not None}
    if not counts:
        return Check("GPUs", SKIP, "no node said how many GPUs it has")
    wrong = [node for node, count in counts.items() if expected is not None and count != expected]
    if wrong:
        return Check(
            "GPUs",
            FAIL,
            ", ".join(f"{node}: {counts[node]}" for node in wrong) + f" (the profile says {expected})",
            "a node without its GPUs has no NVIDIA driver (use an HPC image) or a GPU fault; "
            "check `nvidia-smi` on it",
        )
    per_node = "/".join(str(count) for count in sorted(set(counts.values())))
    return Check(
        "GPUs", PASS, f"{per_node} per node ({len(counts)} node(s), `{GPU_LIST}`, else `{ROCM_GPU_LIST}`)"
    )


def _mount_check(probes: Sequence[NodeProbe], mount_point: str, share: str | None) -> Check:
    unmounted = [probe.node for probe in probes if probe.said.get("mounted") == "no"]
    if unmounted:
        return Check(
            "share mounted",
            FAIL,
            f"{share or 'the share'} is not mounted at {mount_point} on {', '.join(unmounted)}",
            "hpcjob mount --install (once, as an HPC administrator), then hpcjob mount",
        )
    return Check("share mounted", PASS, f"at {mount_point} on {len(probes)} node(s)")


def _torch_check(probes: Sequence[NodeProbe]) -> Check:
    missing = [f"{probe.node}: {probe.torch_error}" for probe in probes if probe.torch is None]
    if missing:
        return Check(
            "torch",
            FAIL,
            "; ".join(missing),
            "install torch on every node (for example clusrun, or a virtual environment on the share "
            "given with --python)",
        )
    versions = ", ".join(sorted({probe.torch[0] for probe in probes if probe.torch}))
    no_cuda = [probe.node for probe in probes if probe.gpus and probe.torch and not probe.torch[1]]
    if no_cuda:
        return Check(
            "torch",
            FAIL,
            f"torch {versions} cannot use CUDA on {', '.join(no_cuda)}",
            "install a torch build for the node's CUDA driver (pip install torch from the CUDA index)",
        )
    cuda = "CUDA works" if any(probe.gpus for probe in probes) else "no GPUs: gloo on the CPU"
    return Check("torch", PASS, f"{versions} on {len(probes)} node(s), {cuda}")


def _python_check(probes: Sequence[NodeProbe]) -> Check:
    """One Python on every node, able to make a job's environment (--requirements, a requirements.txt
    beside the script): each Python gets an environment of its own, and the ranks of one job should run
    the same torch."""
    said = {probe.node: probe.python for probe in probes if probe.python is not None}
    if not said:
        return Check("Python", SKIP, "no node said which Python it has")
    kinds: dict[str, list[str]] = {}
    for node, (version, machine, _) in said.items():
        kinds.setdefault(f"{version} {machine}", []).append(node)
    if len(kinds) > 1:
        return Check(
            "Python",
            FAIL,
            "; ".join(f"{kind} on {', '.join(nodes)}" for kind, nodes in sorted(kinds.items())),
            "give every node the same Python: a job's environment is built once per Python, and the ranks "
            "of one job should run the same torch",
        )
    no_venv = [node for node, (_, _, venv) in said.items() if venv is False]
    if no_venv:
        return Check(
            "Python",
            FAIL,
            f"no venv on {', '.join(no_venv)}: a job with a requirements file fails there",
            "install python3-venv on those nodes (Debian, Ubuntu), or run jobs with --no-env",
        )
    return Check("Python", PASS, f"{next(iter(kinds))} on {len(said)} node(s), venv for a job's environment")


def _agent_check(probes: Sequence[NodeProbe]) -> Check:
    """Which HPC Pack agent each node runs. hpcjob's mount step (and its remount at each task's start)
    is the C++ agent's execution filter; the .NET agent runs no filter (its source: a TODO)."""
    if not any("agent" in probe.said for probe in probes):
        return Check("agent", SKIP, "not asked: the probe's command line had no room left for it")
    dotnet = [probe for probe in probes if probe.agent == ".net"]
    cpp = [probe.node for probe in probes if probe.agent == "c++"]
    unknown = [probe.node for probe in probes if probe.agent is None]
    known = "; ".join(
        ([f"the C++ agent on {len(cpp)} node(s)"] if cpp else [])
        + ([f"the .NET agent on {', '.join(p.node for p in dotnet)}"] if dotnet else [])
        + ([f"neither agent's files in {AGENT_DIR} on {', '.join(unknown)}"] if unknown else [])
    )
    if not dotnet:
        return Check("agent", PASS if cpp else SKIP, known)
    if any(probe.said.get("mounted") != "yes" for probe in dotnet):
        return Check(
            "agent",
            FAIL,
            f"{known}: it runs no execution filter, so hpcjob's mount step cannot mount the share there",
            "mount the share there another way (`hpcjob render --format clusrun` prints a mount step for an "
            "administrator) and submit with --no-mount-step, or run the job in a container (--image)",
        )
    return Check(
        "agent",
        PASS,
        f"{known}: the share is mounted, but the .NET agent runs no execution filter: submit with "
        "--no-mount-step",
    )


def share_check(share: str | None, error: str | None) -> Check:
    if share is None:
        return Check(
            "share", SKIP, "the profile names no share", "hpcjob cluster add ... --share //HEAD/CcpSpoolDir"
        )
    if error is None:
        return Check("share", PASS, f"{share} readable and writable from this machine")
    return Check(
        "share",
        FAIL,
        error,
        "check the share's path and rights, the SMB user and password, and that port 445 is open to this "
        "machine",
    )


def rdzv_port_check(port: int | None, nodes_here: bool, in_use: str | None) -> Check:
    """Whether the jobs' rendezvous port (the profile's rdzv_port; None: none named) is free where their
    first node listens on it. Only where the profile's nodes are this machine (`nodes_here`) is that
    here: `in_use` says why it cannot be bound (None: free). A node's port is not asked."""
    if nodes_here and port is None:
        return Check(
            "rendezvous port", PASS, "each job takes a free port of this machine at submission (nodes_here)"
        )
    shown = port or DEFAULT_RDZV_PORT
    if not nodes_here:
        return Check(
            "rendezvous port",
            INFO,
            f"port {shown} not asked: checked only where the profile's nodes are this machine (nodes_here)",
        )
    if in_use is None:
        return Check("rendezvous port", PASS, f"port {shown} is free on this machine, where the nodes are")
    return Check(
        "rendezvous port",
        FAIL,
        f"port {shown} is in use on this machine, where the nodes are: {in_use}",
        "stop what listens on it, or remove rdzv_port from the profile: each job then takes a free port",
    )


def fit_nodes(answers: Sequence[tuple[str, str]]) -> list[str]:
    """The nodes whose probe found torch and the share mounted: where a job can run."""
    return [node for node, output in answers if NodeProbe.of(node, output).fit]


def data_node_checks(
    trainers: Sequence[tuple[str, str]],
    data: Sequence[tuple[str, str]],
    mount_point: str,
    share: str | None,
) -> list[Check]:
    """The data node group's nodes, from their probe's answers beside the trainers': the share mounted
    (hpcjob's filter installed there), and the trainers' Python and torch build (a data node builds each
    epoch's permutation with torch: the same build gives the same indices)."""
    probes = [NodeProbe.of(node, output) for node, output in data]
    answered = [probe for probe in probes if probe.said]
    if not answered:
        return [Check(name, SKIP, "no data node answered the probe") for name in DATA_CHECKS]
    mounted = _mount_check(answered, mount_point, share)
    checks = [replace(mounted, name=DATA_CHECKS[0])]
    theirs = {_software(probe) for probe in (NodeProbe.of(n, o) for n, o in trainers) if probe.said}
    theirs.discard(None)
    wrong = [f"{probe.node}: {_software(probe) or probe.torch_error}" for probe in answered
             if _software(probe) is None or (theirs and _software(probe) not in theirs)]  # fmt: skip
    if wrong:
        trainers_have = "; the trainers: " + ", ".join(sorted(str(s) for s in theirs)) if theirs else ""
        checks.append(
            Check(
                DATA_CHECKS[1],
                FAIL,
                "; ".join(wrong) + trainers_have,
                "give the data nodes the trainers' Python and torch build (a job's --requirements and "
                "--image reach them too): each epoch's indices come from torch's permutation",
            )
        )
    else:
        same = next(iter(theirs), None) or _software(answered[0])
        checks.append(Check(DATA_CHECKS[1], PASS, f"{same} on {len(answered)} data node(s), as the trainers"))
    return checks


DATA_CHECKS = ("data nodes: share mounted", "data nodes: Python and torch")


def _software(probe: NodeProbe) -> str | None:
    """`Python 3.10.12 x86_64, torch 2.14.1`, or None where torch did not import."""
    if probe.python is None or probe.torch is None:
        return None
    return f"Python {probe.python[0]} {probe.python[1]}, torch {probe.torch[0]}"


def data_port_check(
    nodes: Sequence[str], port: int, state: str, metrics: dict[str, object] | None, cause: str
) -> Check:
    """The data-port job's result (hpcjob/checks/probes/dataport.py): a trainer reached a data node."""
    trainer, data_node = nodes
    if state == State.FINISHED and metrics and metrics.get("data_port_reachable") is True:
        return Check(
            "data port",
            PASS,
            f"{trainer} reached {data_node} at {metrics.get('data_port_at')} in "
            f"{metrics.get('data_port_s')} s, in one job of both roles",
        )
    return Check(
        "data port",
        FAIL,
        f"{trainer} could not reach {data_node} on port {port}: {cause or f'the job {state}'}",
        f"open port {port} (--data-port) from the trainers to the data nodes, and check the interface "
        "node.sh picks (HPCJOB_IFNAME)",
    )


def allreduce_check(nodes: Sequence[str], state: str, metrics: dict[str, object] | None, cause: str) -> Check:
    """The 2-node all-reduce job's result (hpcjob/checks/probes/allreduce.py's metrics line)."""
    between = " and ".join(nodes)
    if state == State.FINISHED and metrics and metrics.get("allreduce_correct") is True:
        return Check(
            "all-reduce",
            PASS,
            f"{metrics.get('allreduce_backend')}, {metrics.get('allreduce_mb')} MB between {between}: "
            f"{metrics.get('allreduce_bus_gbps')} GB/s bus bandwidth",
        )
    why = cause or (
        "the sum came out wrong"
        if metrics and metrics.get("allreduce_correct") is False
        else f"the job {state}"
    )
    return Check(
        "all-reduce",
        FAIL,
        f"between {between}: {why}",
        "check that the nodes reach each other on the rendezvous port and the interface node.sh picks "
        "(HPCJOB_IFNAME); the job ran with NCCL_DEBUG=INFO: `hpcjob logs RUN` shows what NCCL said",
    )


def _ran_in(
    check: str, what: str, between: str, state: str, metrics: dict[str, object] | None
) -> Check | None:
    """The all-reduce job ran in `what` (an environment, an image) and said with which torch: a pass."""
    if state != State.FINISHED or not metrics or not metrics.get("torch"):
        return None
    cuda = "with CUDA" if metrics.get("cuda") else "without CUDA"
    python = metrics.get("python")
    return Check(
        check,
        PASS,
        f"{what} on {between}: the all-reduce ran in it, torch {metrics['torch']} {cuda} ({python})",
    )


def environment_check(
    file: str, nodes: Sequence[str], state: str, metrics: dict[str, object] | None, cause: str
) -> Check:
    """`doctor --requirements FILE`: the all-reduce job ran in the job's environment built from FILE."""
    between = " and ".join(nodes)
    ran = _ran_in("environment", file, between, state, metrics)
    if ran is not None:
        return ran
    if "environment did not build" in cause:
        return Check(
            "environment",
            FAIL,
            f"{file} on {between}: {cause}",
            "fix the requirements (pip's whole log: <node>.env.log in the run's log folder), or give the "
            "nodes an index or a --wheelhouse",
        )
    return Check("environment", SKIP, f"cannot say: the all-reduce job in it ended {state}")


def container_check(
    image: str, nodes: Sequence[str], state: str, metrics: dict[str, object] | None, cause: str
) -> Check:
    """`doctor --image IMAGE`: the all-reduce job ran in containers of IMAGE, started by the node agent."""
    between = " and ".join(nodes)
    ran = _ran_in("container", image, between, state, metrics)
    if ran is not None:
        return ran
    if state == State.FINISHED:
        return Check("container", SKIP, f"cannot say: the all-reduce job in {image} said nothing of torch")
    return Check(
        "container",
        FAIL,
        f"{image} on {between}: {cause or 'the job ' + state}",
        "every node needs Docker, the image (or a registry it can pull from), and for GPUs the NVIDIA "
        'container toolkit (or docker_gpus = "nvidia-docker" in the profile where nodes have that '
        "command); the node agent must be the C++ one (the .NET agent runs no containers)",
    )


def node_allreduce_check(
    answers: Sequence[tuple[str, str]], vm_size: str | None, mark_gbs: float | None
) -> Check:
    """Each node's all-reduce across its own GPUs (hpcjob/checks/probes/allreduce.py under a single-node
    torchrun, a task per node), against the mark Microsoft's health checks set for its size (`mark_gbs`;
    None: the size has none, or the profile names no size: figures without a verdict)."""
    name = "all-reduce per node"
    measured: dict[str, float] = {}
    failed: list[str] = []
    for node, output in answers:
        metrics = find_metrics(output.splitlines()) or {}
        gbs = metrics.get("allreduce_bus_gbps")
        if isinstance(gbs, int | float) and metrics.get("allreduce_correct") is True:
            measured[node] = float(gbs)
        else:
            said = [line.strip() for line in output.splitlines() if line.strip()]
            failed.append(f"{node}: {said[-1] if said else 'no output'}")
    figures: tuple[dict[str, object], ...] = tuple(
        {"node": node, "bus_gbs": gbs, "mark_gbs": mark_gbs} for node, gbs in measured.items()
    )
    shown = ", ".join(f"{node} {gbs:.4g}" for node, gbs in measured.items())
    if failed:
        fix = "see the node's GPUs and torch above; rerun with NCCL_DEBUG=INFO in the environment"
        return Check(name, FAIL, "; ".join(failed), fix, figures)
    if mark_gbs is None:  # neither pass nor fail: Microsoft publishes no mark (GB200 v6), or no size named
        why = f"no reference mark for {vm_size}" if vm_size else "the profile names no vm_size"
        return Check(name, INFO, f"bus GB/s: {shown} ({why}: no verdict)", "", figures)
    slow = {node: gbs for node, gbs in measured.items() if gbs < mark_gbs}
    if slow:
        return Check(
            name,
            FAIL,
            f"below the mark of {mark_gbs:g} GB/s for {vm_size}: "
            + ", ".join(f"{node} {gbs:.4g} GB/s" for node, gbs in slow.items()),
            "a slow node: check its NVLink (`nvidia-smi nvlink --status`), its topology (`nvidia-smi "
            "topo -m`) and Fabric Manager, run Microsoft's health checks on it "
            "(Azure/azurehpc-health-checks), or leave it out of jobs (--exclude-node)",
            figures,
        )
    return Check(
        name, PASS, f"bus GB/s: {shown}, each at least the mark of {mark_gbs:g} for {vm_size}", "", figures
    )


# A pair of nodes whose all-reduce reaches less than this share of the best pair's is slow. No mark is
# published for an all-reduce between two VMs (the health checks' marks are within one VM, and per
# InfiniBand link with ib_write_bw), so the pairs are judged against each other: a link that fell back
# to TCP is many times slower, not a few percent. One process per node: the pairs measure the network
# port NCCL picks for the first GPU, not every port of the node.
SLOW_PAIR_SHARE = 0.5


def ring_pairs(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Each node with the next, the last with the first: every node is in two pairs (three nodes or more),
    so a slow node is told from a slow link."""
    if len(nodes) < 3:
        return [(nodes[0], nodes[1])] if len(nodes) == 2 else []
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def pair_rounds(pairs: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The pairs in rounds whose pairs share no node, so that each round's jobs run at once: two rounds
    for a ring of an even number of nodes, three for an odd one."""
    rounds: list[list[tuple[str, str]]] = []
    for pair in pairs:
        for round_ in rounds:
            if not {node for taken in round_ for node in taken} & set(pair):
                round_.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def pairs_check(results: Sequence[tuple[tuple[str, str], float | None, str]]) -> Check:
    """The all-reduce between the pairs of a ring of three nodes or more (`results`: the pair, its bus
    GB/s or None when it failed, and why it failed): a node whose two pairs are both slow (or failed) is
    named; a slow pair of two nodes each fast with its other neighbour is a slow link between them."""
    name = "all-reduce between nodes"
    best = max((gbs for _, gbs, _ in results if gbs is not None), default=0.0)
    slow = {pair for pair, gbs, _ in results if gbs is None or gbs < SLOW_PAIR_SHARE * best}
    rows: tuple[dict[str, object], ...] = tuple(
        {"nodes": list(pair), "bus_gbs": gbs, "best_gbs": best, "slow": pair in slow}
        for pair, gbs, _ in results
    )
    shown = ", ".join(f"{a}-{b} {'failed' if gbs is None else f'{gbs:.4g}'}" for (a, b), gbs, _ in results)
    failed = "".join(f"; {a}-{b}: {why}" for (a, b), gbs, why in results if gbs is None and why)
    if best == 0.0:  # no pair measured: nothing to tell a slow node by
        fix = "the 2-node all-reduce above ran: see `hpcjob logs` of the pairs' jobs (hpcjob-doctor-pair-...)"
        return Check(name, FAIL, f"no pair's all-reduce ran{failed}", fix, rows)
    if not slow:
        return Check(name, PASS, f"bus GB/s, each pair of the ring: {shown}", "", rows)
    nodes = sorted({n for pair in slow for n in pair if all(p in slow for p, _, _ in results if n in p)})
    links = sorted(f"the link {a}-{b}" for a, b in slow if a not in nodes and b not in nodes)
    return Check(
        name,
        FAIL,
        f"slow: {', '.join([*nodes, *links])}; bus GB/s: {shown} (slow: under {SLOW_PAIR_SHARE:.0%} of the "
        f"best pair){failed}",
        "check the slow node's InfiniBand (`ibstat`: a port Down or at a lower rate), run Microsoft's "
        "health checks on it (Azure/azurehpc-health-checks), or leave it out of jobs (--exclude-node)",
        rows,
    )


# NCCL's own words for its network transport, with NCCL_DEBUG=INFO (NVIDIA/nccl src/transport/net_ib.cc
# and net_socket.cc: docs/facts/azure-gpu-fabric-and-nccl.md §4).
_NCCL_IB = re.compile(r"NET/IB : Using (.*?)(?:; OOB .*)?$|via NET/IB")
_NCCL_SOCKET = re.compile(r"NET/Socket : Using (.*)$|via NET/Socket")


def fabric_check(vm_size: str | None, infiniband: str | None, backend: object, lines: Sequence[str]) -> Check:
    """Whether the 2-node all-reduce's NCCL went over InfiniBand or TCP sockets (its INFO lines), against
    what the size has (`infiniband`: as the size table says it, None: none)."""
    if backend is None:
        return Check("fabric", SKIP, "the all-reduce did not run to its end")
    if backend != "nccl":
        return Check("fabric", SKIP, "no NCCL: the all-reduce ran on the CPU (gloo)")
    ib = [m for m in map(_NCCL_IB.search, lines) if m]
    sockets = [m for m in map(_NCCL_SOCKET.search, lines) if m]
    devices = next((m.group(1).strip() for m in ib + sockets if m.group(1)), "")
    size = vm_size or "the profile's size (none named)"
    if ib:
        return Check("fabric", PASS, f"NCCL went over InfiniBand ({devices or 'NET/IB'})")
    if not sockets:
        return Check("fabric", SKIP, "NCCL said nothing of its network (no NET/ line in the job's output)")
    if infiniband:
        return Check(
            "fabric",
            FAIL,
            f"NCCL went over TCP sockets ({devices or 'NET/Socket'}), though {size} has {infiniband}",
            "check the node's InfiniBand (`ibstat`: an Azure HPC image has the drivers), that "
            "NCCL_IB_DISABLE is not set, and in containers the devices (docker_options: "
            "--device=/dev/infiniband --cap-add=IPC_LOCK)",
        )
    return Check(
        "fabric", INFO, f"NCCL went over TCP sockets ({devices or 'NET/Socket'}): {size} has no InfiniBand"
    )
