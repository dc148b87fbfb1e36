"""`hpcjob doctor`'s steps against a cluster: reach the head node, probe the nodes with one short job,
run an all-reduce job through the same path as `hpcjob submit`, write the share from here. The checks'
verdicts are hpcjob.checks.verdicts's (pure); this module does the asking, and prints nothing."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcjob.checks.verdicts import Check
from hpcjob.runner import ClusterAccess, Progress, new_run_id, profile_mount_point, submit_and_follow

if TYPE_CHECKING:
    from hpcjob.job.sizes import GpuSize
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder

SHARE_PROBE_FILE = ".hpcjob-doctor"  # written (and overwritten) at the share's root to prove it writable


@dataclass(frozen=True)
class Checkup:
    """A cluster's checks, in the order they ran."""

    cluster: str
    backend: str
    endpoint: str
    checks: list[Check]

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.failed]


def checkup(
    access: ClusterAccess,
    *,
    requirements: tuple[str, str] | None = None,
    image: str | None = None,
    progress: Progress,
    command: str = "hpcjob doctor",
) -> Checkup:
    """Every check of the cluster `access` opens; `requirements` (a file's name and text): the all-reduce
    runs in the job's environment built from them; `image`: in containers of it."""
    from hpcjob.checks.verdicts import (
        FAIL,
        SKIP,
        fit_nodes,
        node_check,
        probe_checks,
        probe_command,
        reach_checks,
        share_check,
    )
    from hpcjob.job.render import JobShape
    from hpcjob.job.sizes import gpus_per_node
    from hpcjob.job.spec import HpcjobError

    profile, backend = access.profile, access.backend
    mount_point = profile_mount_point(profile)
    checks: list[Check] = []
    started = time.monotonic()
    error: str | None = None
    try:
        nodes = backend.nodes(profile.node_group)
        version = backend.version()
    except HpcjobError as exc:
        error, nodes, version = " ".join(str(exc).split()), [], None
    checks += reach_checks(profile.endpoint, profile.user, version, error, time.monotonic() - started)
    if error is not None:
        checks.append(Check("nodes", SKIP, "cannot run: the head node did not answer"))
    else:
        nodes_checked, usable = node_check(nodes, profile.node_group)
        checks.append(nodes_checked)
        if usable:
            shape = JobShape(tuple(usable), profile.node_group)
            progress(f"hpcjob: probing {len(usable)} node(s) with a short job ...")
            try:
                _, answers = backend.run_on_nodes(
                    f"hpcjob-doctor-{int(time.time())}", probe_command(mount_point), shape, lambda line: None
                )
                expected, _ = gpus_per_node(None, profile.gpus_per_node, profile.vm_size)
                checks += probe_checks(answers, expected, mount_point, profile.share)
                checks.append(_nodes_local_disk(access, usable))
                checks += _allreduce(
                    access, fit_nodes(answers), mount_point, requirements, image, progress, command
                )
                if profile.data_node_group:
                    checks += _data_nodes(access, answers, mount_point, progress, command)
            except HpcjobError as exc:
                checks.append(
                    Check("probe", FAIL, " ".join(str(exc).split()), "see `hpcjob status` of the job")
                )
    checks.append(_rdzv_port(profile))
    checks.append(share_check(profile.share, _share_error(access)))
    return Checkup(profile.name, backend.kind, profile.endpoint, checks)


def _rdzv_port(profile: ClusterProfile) -> Check:
    """Whether the jobs' rendezvous port is free: asked here where the profile's nodes are this machine."""
    from hpcjob.checks.verdicts import rdzv_port_check

    in_use = None
    if profile.nodes_here and profile.rdzv_port is not None:
        from hpcjob.backends.local import port_in_use

        in_use = port_in_use(profile.rdzv_port, reuse_address=True)  # an ended job's TIME_WAIT is no bar
    return rdzv_port_check(profile.rdzv_port, bool(profile.nodes_here), in_use)


def _allreduce(
    access: ClusterAccess,
    fit: list[str],
    mount_point: str,
    requirements: tuple[str, str] | None,
    image: str | None,
    progress: Progress,
    command: str,
) -> list[Check]:
    """A 2-node all-reduce job (hpcjob/checks/probes/allreduce.py) through the same path as `hpcjob submit`;
    with `requirements` (a file's name and text), in the job's environment built from them; with
    `image`, in containers of it, with the profile's GPUs and Docker options."""
    from hpcjob.checks.verdicts import SKIP, allreduce_check, container_check, environment_check, fabric_check
    from hpcjob.job.sizes import size_table

    profile = access.profile
    if len(fit) < 2:
        why = "cannot run: it needs two nodes that passed the checks above"
        skipped = [Check("all-reduce", SKIP, why)]
        skipped += [Check("environment", SKIP, why)] if requirements else []
        skipped += [Check("container", SKIP, why)] if image else []
        return [*skipped, Check("fabric", SKIP, why), Check("all-reduce per node", SKIP, why)]
    nodes = tuple(fit[:2])
    # NCCL_DEBUG: NCCL names its transport, for the fabric check.
    nccl_debug = (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"))
    spec = _allreduce_spec(access, mount_point, nodes, "hpcjob-doctor", nccl_debug, requirements, image)
    progress(f"hpcjob: an all-reduce job on {' and '.join(nodes)} ...")
    smb = (profile.smb_user, profile.smb_server, profile.smb_port)
    record, plan, summary = submit_and_follow(
        access,
        spec,
        new_run_id(spec.name),
        smb,
        mount_step=False,
        wait=True,
        progress=lambda line: None,
        command=command,
    )
    assert summary is not None  # waited
    cause = summary.root_cause.describe() if summary.root_cause else ""
    checks = [allreduce_check(nodes, summary.state, summary.metrics, cause)]
    if requirements:
        checks.append(environment_check(requirements[0], nodes, summary.state, summary.metrics, cause))
    if image:
        checks.append(container_check(image, nodes, summary.state, summary.metrics, cause))
    size = size_table().find(profile.vm_size) if profile.vm_size else None
    backend = (summary.metrics or {}).get("allreduce_backend")
    checks.append(
        fabric_check(profile.vm_size, size.infiniband if size else None, backend, _said(access, record))
    )
    if summary.state != "Finished" or requirements or image:
        why = (
            "not run: the 2-node all-reduce failed"
            if summary.state != "Finished"
            else "not run with --requirements or --image (it runs in the nodes' own Python)"
        )
        checks.append(Check("all-reduce per node", SKIP, why))
        return [*checks, Check("all-reduce between nodes", SKIP, why)] if len(fit) > 2 else checks
    checks.append(_node_allreduce(access, fit, plan.job_dir, size, progress))
    if len(fit) > 2:
        checks.append(_pairs_allreduce(access, fit, mount_point, progress, command))
    return checks


def _nodes_local_disk(access: ClusterAccess, usable: list[str]) -> Check:
    """Each node's local folder and free space, from a short job of its own (the first probe's line has
    no room left for it under the scheduler's limit)."""
    from hpcjob.checks.verdicts import local_disk_check, local_probe_command
    from hpcjob.job.datasets import local_dir
    from hpcjob.job.render import JobShape

    profile = access.profile
    _, answers = access.backend.run_on_nodes(
        f"hpcjob-doctor-disk-{int(time.time())}",
        local_probe_command(local_dir(profile.local_dir, profile.vm_size)),
        JobShape(tuple(usable), profile.node_group),
        lambda line: None,
    )
    return local_disk_check(answers, bool(profile.datasets))


def _data_nodes(
    access: ClusterAccess,
    trainer_answers: list[tuple[str, str]],
    mount_point: str,
    progress: Progress,
    command: str,
) -> list[Check]:
    """The profile's data node group (`--data-nodes`): its nodes online, the share mounted there, the
    trainers' Python and torch, and its data port reached from a trainer in one job of both roles
    (hpcjob/checks/probes/dataport.py), as a run with data nodes is made."""
    from dataclasses import replace

    from hpcjob.checks.verdicts import (
        DATA_CHECKS,
        SKIP,
        data_node_checks,
        data_port_check,
        fit_nodes,
        node_check,
        probe_command,
    )
    from hpcjob.job.render import JobShape
    from hpcjob.job.spec import DEFAULT_DATA_PORT

    profile = access.profile
    group = profile.data_node_group
    checked, usable = node_check(access.backend.nodes(group), group)
    checks = [replace(checked, name="data nodes")]
    if not usable:
        return [*checks, *(Check(name, SKIP, "no data node to ask") for name in (*DATA_CHECKS, "data port"))]
    progress(f"hpcjob: probing {len(usable)} data node(s) of {group} ...")
    _, answers = access.backend.run_on_nodes(
        f"hpcjob-doctor-data-{int(time.time())}", probe_command(mount_point), JobShape(tuple(usable), group),
        lambda line: None,
    )  # fmt: skip
    checks += data_node_checks(trainer_answers, answers, mount_point, profile.share)
    trainers, data = fit_nodes(trainer_answers), fit_nodes(answers)
    if not trainers or not data:
        return [
            *checks,
            Check("data port", SKIP, "cannot run: it needs a trainer and a data node that passed"),
        ]
    nodes = (trainers[0], data[0])
    spec = replace(
        _allreduce_spec(access, mount_point, nodes[:1], "hpcjob-dataport", ()),
        script=str(Path(__file__).resolve().parent / "probes" / "dataport.py"),
        data_nodes=1,
        data_node_names=nodes[1:],
        data_wait_s=60.0,
    )
    progress(f"hpcjob: a trainer on {nodes[0]} reaching a data node on {nodes[1]} ...")
    smb = (profile.smb_user, profile.smb_server, profile.smb_port)
    _, _, summary = submit_and_follow(
        access, spec, new_run_id(spec.name), smb, mount_step=False, wait=True, progress=lambda line: None,
        command=command,
    )  # fmt: skip
    assert summary is not None  # waited
    cause = summary.root_cause.describe() if summary.root_cause else ""
    port = spec.data_port or DEFAULT_DATA_PORT
    return [*checks, data_port_check(nodes, port, summary.state, summary.metrics, cause)]


def _allreduce_spec(
    access: ClusterAccess,
    mount_point: str,
    nodes: tuple[str, ...],
    name: str,
    env: tuple[tuple[str, str], ...],
    requirements: tuple[str, str] | None = None,
    image: str | None = None,
) -> JobSpec:
    """The all-reduce probe (hpcjob/checks/probes/allreduce.py) on `nodes`, as a job of the profile's is: its
    share and folder, environment and containers' settings, one process per node."""
    from dataclasses import replace

    from hpcjob.job.options import JobOptions
    from hpcjob.job.spec import JobSpec
    from hpcjob.runner import with_profile

    probe = str(Path(__file__).resolve().parent / "probes" / "allreduce.py")
    asked = JobOptions(probe, name=name, node_names=nodes, mount_point=mount_point, image=image)
    # Its environment alone: no secret of the profile's, one process per node whatever their GPUs.
    options = replace(
        with_profile(asked, access.profile), secrets=(), gpus_per_node=None, nproc_per_node=1, env=env
    )
    return JobSpec(
        **options.spec_fields(),
        runtime_s=600 if requirements or image else 300,  # building the environment takes its time
        requirements=requirements[1] if requirements else None,
    )


def _pairs_allreduce(
    access: ClusterAccess, fit: list[str], mount_point: str, progress: Progress, command: str
) -> Check:
    """The all-reduce between each node and the next of a ring of the fit nodes (hpcjob.checks.verdicts's
    ring_pairs), a 2-node job a pair, the pairs that share no node at once: two or three rounds of jobs
    of at most 5 minutes each, however many nodes. On the profile's rendezvous port: each pair's first
    node hosts its own rendezvous."""
    from hpcjob.checks.verdicts import pair_rounds, pairs_check, ring_pairs
    from hpcjob.job.spec import HpcjobError
    from hpcjob.runner import follow_run

    def quiet(line: str) -> None:
        """The pair jobs' own progress: the doctor says what it does in one line."""

    pairs = ring_pairs(fit)
    rounds = pair_rounds(pairs)
    progress(f"hpcjob: the all-reduce between {len(pairs)} pairs of nodes, in {len(rounds)} rounds ...")
    smb = (access.profile.smb_user, access.profile.smb_server, access.profile.smb_port)
    measured: dict[tuple[str, str], tuple[float | None, str]] = {}
    for round_ in rounds:
        started = []
        try:
            for pair in round_:
                spec = _allreduce_spec(access, mount_point, pair, "hpcjob-doctor-pair", ())
                record, plan, _ = submit_and_follow(
                    access, spec, new_run_id(spec.name), smb, mount_step=False, wait=False,
                    progress=quiet, command=command,
                )  # fmt: skip
                started.append((pair, record, plan, time.monotonic()))
        except BaseException:  # a round half submitted: its jobs are not left running
            for _, record, _, _ in started:
                with contextlib.suppress(HpcjobError):
                    access.backend.cancel(record, force=True)
            raise
        for pair, record, plan, at in started:
            summary = follow_run(access.backend, record, plan, lambda: _profile_share(access), at, quiet)
            gbs = (summary.metrics or {}).get("allreduce_bus_gbps")
            if summary.state == "Finished" and isinstance(gbs, int | float):
                measured[pair] = (float(gbs), "")
            else:
                cause = summary.root_cause
                measured[pair] = (None, cause.describe() if cause else f"the job {summary.state}")
    return pairs_check([(pair, *measured[pair]) for pair in pairs])


def _profile_share(access: ClusterAccess) -> ShareFolder | None:
    """The profile's share as it reaches it from here (None: the profile names none)."""
    from hpcjob.job.spec import parse_share

    profile = access.profile
    if profile.share is None:
        return None
    return access.share(parse_share(profile.share), profile.smb_user, profile.smb_server, profile.smb_port)


def _said(access: ClusterAccess, record: RunRecord) -> list[str]:
    """Every line the run's nodes wrote, from the share (none where it cannot be read from here)."""
    from hpcjob.job.spec import HpcjobError
    from hpcjob.store.logs import RunLogs

    try:
        folder = _profile_share(access)
    except HpcjobError:
        return []
    if folder is None:
        return []
    try:
        return [line for _, _, line in RunLogs(folder, record.log_folder, record.nodes).lines(final=True)]
    finally:
        folder.close()


def _node_allreduce(
    access: ClusterAccess, fit: list[str], job_dir: str, size: GpuSize | None, progress: Progress
) -> Check:
    """The all-reduce across each node's own GPUs, a task per node (the probe the 2-node job put in its
    folder on the share, under a single-node torchrun), judged by the health checks' mark for the
    profile's VM size (`size`, from the size table hpcjob.job.sizes: NCCL's mark, or RCCL's on AMD
    GPUs), at the message size of that mark."""
    from hpcjob.checks.verdicts import FAIL, SKIP, node_allreduce_check
    from hpcjob.job.render import JobShape
    from hpcjob.job.sizes import gpus_per_node
    from hpcjob.job.spec import HpcjobError

    profile = access.profile
    gpus, told = gpus_per_node(None, profile.gpus_per_node, profile.vm_size)
    if (gpus or 1) < 2:
        why = f"one GPU per node ({told or 'nothing says more'}): nothing to reduce"
        return Check("all-reduce per node", SKIP, why)
    assert gpus is not None
    mark = size.allreduce_mark if size else None
    message = f" --mb {mark.message_mb}" if mark and mark.message_mb else ""
    # Its metrics line comes last, and the scheduler keeps a task's first 1500 bytes: the end is kept.
    probe = (
        f"cd {job_dir} && python3 -m torch.distributed.run --standalone --nproc_per_node={gpus} "
        f"allreduce.py{message} 2>&1 | tail -c 1200"
    )
    progress(f"hpcjob: an all-reduce across each node's {gpus} GPUs, on {len(fit)} node(s) ...")
    try:
        _, answers = access.backend.run_on_nodes(
            f"hpcjob-doctor-gpus-{int(time.time())}",
            probe,
            JobShape(tuple(fit), profile.node_group),
            lambda line: None,
        )
    except HpcjobError as exc:  # the checks made so far stand
        return Check(
            "all-reduce per node", FAIL, " ".join(str(exc).split()), "see `hpcjob status` of the job"
        )
    return node_allreduce_check(answers, profile.vm_size, mark.value if mark else None)


def _share_error(access: ClusterAccess) -> str | None:
    """Whether the share can be written from here (None: it can; the profile may name none)."""
    from hpcjob.job.spec import HpcjobError

    try:
        folder = _profile_share(access)
        if folder is None:
            return None
        try:
            folder.write_bytes(SHARE_PROBE_FILE, b"written by hpcjob doctor\n")
            folder.read_bytes(SHARE_PROBE_FILE)
        finally:
            folder.close()
    except (HpcjobError, OSError) as exc:
        return " ".join(str(exc).split())
    return None


# `doctor --local`: what a local run needs, on this machine.
ENV_SPACE_GB = 10.0  # free space for a job's environments below which the check fails: torch's is ~5 GB


def local_checkup(progress: Progress, share_root: Path | None = None) -> Checkup:
    """Is this machine fit for `hpcjob run --local`: its Python and torch, CUDA and the GPUs, a 2-node
    all-reduce on loopback (gloo; NCCL too with two GPUs or more) through a real local run, the rendezvous
    port, the disk for environments, and Docker with its runtimes where it is installed."""
    import socket

    from hpcjob.checks.verdicts import PASS, SKIP
    from hpcjob.job.spec import DEFAULT_RDZV_PORT

    checks: list[Check] = []
    python, torch_check, cuda = _local_python()
    checks += [python, torch_check]
    gpus = _local_gpus(cuda)
    checks.append(gpus)
    if torch_check.failed:
        checks.append(Check("all-reduce gloo", SKIP, "cannot run: no torch"))
    else:
        checks.append(_local_allreduce("gloo", progress, share_root))
        if cuda is not None and cuda >= 2:
            checks.append(_local_allreduce("nccl", progress, share_root))
        elif cuda:  # NCCL refuses two ranks on one GPU: a local run of 2 nodes uses gloo there
            checks.append(Check("all-reduce nccl", SKIP, f"{cuda} GPU: NCCL needs a GPU for each of 2 ranks"))
    with socket.socket() as probe:
        try:
            probe.bind(("", DEFAULT_RDZV_PORT))
            checks.append(
                Check("rendezvous port", PASS, f"{DEFAULT_RDZV_PORT} free (a local run takes any free one)")
            )
        except OSError as exc:
            taken = f"{DEFAULT_RDZV_PORT} in use ({exc.strerror}): a local run takes another free one"
            checks.append(Check("rendezvous port", SKIP, taken))
    checks.append(_local_disk())
    checks.append(_local_docker(cuda))
    import platform

    return Checkup("this machine", "local", platform.node(), checks)


def _local_python() -> tuple[Check, Check, int | None]:
    """The Python local nodes run (this one: its folder leads their PATH), and its torch: (Python's
    check, torch's, the GPUs torch sees or None without CUDA)."""
    import subprocess
    import sys

    from hpcjob.checks.verdicts import FAIL, NODE_PROBE, PASS

    done = subprocess.run([sys.executable, "-c", NODE_PROBE], capture_output=True, text=True, timeout=120)
    words = done.stdout.split()
    version = ".".join(map(str, sys.version_info[:3]))
    if done.returncode != 0 or len(words) < 5:
        said = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        python = Check("Python", PASS, f"{version} ({sys.executable})")
        fix = "pip install 'hpcjob[train]' (torch==2.14.1, as scripts/bootstrap.sh installs)"
        return python, Check("torch", FAIL, said, fix), None
    venv = "venv for a job's environment" if words[-1] == "venv" else "no venv (install python3-venv)"
    python = Check("Python", PASS if words[-1] == "venv" else FAIL, f"{version} ({sys.executable}), {venv}")
    cuda = int(words[4]) if words[3] == "True" else None
    detail = f"{words[2]}, " + (
        f"CUDA with {cuda} GPU(s)" if cuda is not None else "no CUDA: ranks run on the CPU"
    )
    return python, Check("torch", PASS, detail), cuda


def _local_gpus(cuda: int | None) -> Check:
    """This machine's GPUs as NVIDIA's nvidia-smi lists them, else (AMD GPUs) as ROCm's rocm-smi does,
    each against what torch sees (a ROCm build of torch sees AMD GPUs as CUDA devices)."""
    import shutil
    import subprocess

    from hpcjob.checks.verdicts import FAIL, GPU_LIST, PASS, ROCM_GPU_LIST, SKIP

    tool = next((line for line in (GPU_LIST, ROCM_GPU_LIST) if shutil.which(line.split()[0])), None)
    if tool is None:
        return Check(
            "GPUs",
            SKIP,
            "no nvidia-smi or rocm-smi: none to check" + ("" if cuda is None else f" (torch sees {cuda})"),
        )
    listed = subprocess.run(tool.split(), capture_output=True, text=True, timeout=60)
    count = sum(line.startswith("GPU") for line in listed.stdout.splitlines())
    if listed.returncode != 0 or (cuda or 0) != count:
        lists = f"{tool.split()[0]} lists {count}, torch sees {cuda or 0}"
        said = listed.stderr.strip().splitlines() or [lists]
        fix = (
            "a CUDA build of torch that matches the driver (nvidia-smi's CUDA)"
            if tool == GPU_LIST
            else "a ROCm build of torch that matches the driver (yours to install: pip's ROCm index)"
        )
        return Check("GPUs", FAIL, said[-1], fix)
    return Check("GPUs", PASS, f"{count} (`{tool}`), all seen by torch")


def _local_allreduce(backend: str, progress: Progress, share_root: Path | None) -> Check:
    """hpcjob's all-reduce probe as a real 2-node local run (torchrun, the rendezvous on loopback)."""
    progress(f"all-reduce over {backend}: a 2-node local run")
    import os
    import tempfile

    from hpcjob.checks.verdicts import FAIL, PASS
    from hpcjob.runner import LocalOptions, run_local

    probe = Path(__file__).resolve().parent / "probes" / "allreduce.py"
    from hpcjob.job.options import JobOptions

    run_id = new_run_id("doctor-local")
    options = JobOptions(str(probe), nodes=2, nproc_per_node=1, name="doctor-local", run_id=run_id)
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if backend == "gloo":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the probe takes NCCL wherever it sees CUDA
    try:
        with tempfile.TemporaryDirectory(prefix="hpcjob-doctor-") as scratch:
            summary = run_local(
                options, LocalOptions(share_root or Path(scratch)),
                progress=lambda line: None, command="hpcjob doctor --local",
            )  # fmt: skip
    finally:
        if hidden is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    metrics = summary.metrics or {}
    name = f"all-reduce {backend}"
    if summary.exit_code != 0 or not metrics.get("allreduce_correct"):
        cause = summary.root_cause.reason if summary.root_cause else f"exit code {summary.exit_code}"
        return Check(
            name, FAIL, cause, "hpcjob run --local -n 2 hpcjob/checks/probes/allreduce.py shows it whole"
        )
    figure = {"backend": backend, "bus_gbps": metrics.get("allreduce_bus_gbps")}
    detail = (
        f"2 nodes on loopback, {metrics.get('allreduce_mb')} MB: {metrics.get('allreduce_bus_gbps')} GB/s bus"
    )
    return Check(name, PASS, detail, figures=(figure,))


def _local_disk() -> Check:
    import shutil

    from hpcjob.checks.verdicts import FAIL, PASS
    from hpcjob.job.spec import DEFAULT_NODE_ENV_DIR

    folder = Path(DEFAULT_NODE_ENV_DIR).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free / 1e9
    detail = f"{free:.1f} GB free for environments in {folder}"
    if free < ENV_SPACE_GB:
        return Check("disk", FAIL, detail, f"at least {ENV_SPACE_GB:.0f} GB: a torch environment takes ~5 GB")
    return Check("disk", PASS, detail)


def _local_docker(cuda: int | None) -> Check:
    import json
    import shutil
    import subprocess

    from hpcjob.checks.verdicts import FAIL, PASS, SKIP

    if shutil.which("docker") is None:
        return Check("docker", SKIP, "not installed: only `run --local --image` needs it")
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True, timeout=60
    )
    if info.returncode != 0:  # installed, not reachable: only --image runs need it
        said = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        return Check(
            "docker", SKIP, f"installed, its daemon not reachable ({said}): `run --local --image` needs it"
        )
    try:
        runtimes = sorted(json.loads(info.stdout or "{}"))
    except ValueError:
        runtimes = []
    if cuda and "nvidia" not in runtimes:
        return Check(
            "docker", FAIL, f"runtimes {', '.join(runtimes)}: no nvidia", "the NVIDIA container toolkit"
        )
    return Check("docker", PASS, f"runtimes {', '.join(runtimes) or 'none listed'}")
