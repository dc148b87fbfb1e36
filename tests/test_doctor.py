"""`hpcjob doctor` against the emulated head node, over REST and WinRM. The nodes' nvidia-smi, python3 and
mountpoint are stand-ins (this machine has no GPU, and torch lives in the venv), each answering for the
node that runs it; the probe job, the scheduler and the checks are the real ones."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcjob.backends.local import free_port
from hpcjob.emulator import HeadNode, NodeSpec
from hpcjob.job import sizes

from .conftest import IMAGE, Result

pytestmark = pytest.mark.slow  # real torchrun jobs through the emulator
PASSWORD = "Doctor-pw-1"
NODE = 'node=$(basename "$HPCJOB_NODE_ROOT")\n'
STAND_INS = {
    "nvidia-smi": NODE + 'case "$node" in $NO_GPU) exit 9;; esac\necho "GPU 0: NVIDIA H100 (UUID: GPU-1)"\n'
    'echo "GPU 1: NVIDIA H100 (UUID: GPU-2)"\n',
    # The probe's `python3 -c ...` answers for the node; the all-reduce jobs' torchrun is the real one
    # where the cases below let it through.
    "python3": NODE
    # The all-reduce across one node's GPUs (`--standalone`): the real one where $REAL_GPUS says, else its
    # answer at once, slow on $SLOW_GPUS (each real one imports torch in three processes per node).
    + 'if [ "$2" = torch.distributed.run ] && [ "$3" = --standalone ]; then case "$node" in $REAL_GPUS) ;;\n'
    + '  $SLOW_GPUS) echo \'HPCJOB_METRICS {"allreduce_bus_gbps": 0.0005, "allreduce_correct": true}\'\n'
    + "    exit;;\n"
    + '  *) echo \'HPCJOB_METRICS {"allreduce_bus_gbps": 2.5, "allreduce_correct": true}\'; exit;; esac\n'
    + "fi\n"
    # A pair's all-reduce between two nodes (the doctor's ring): answered at once, slow with $SLOW_NODE.
    # The job's metrics are its last line: the slow node says its figure; else the pair's host node.
    + 'case "$*" in *--rdzv_id=hpcjob-doctor-pair-*) case "$node" in\n'
    + '  $SLOW_NODE) echo \'HPCJOB_METRICS {"allreduce_bus_gbps": 0.2, "allreduce_correct": true}\';;\n'
    + '  *) [ "$HPCJOB_IS_HOST" = 0 ] || echo \'HPCJOB_METRICS {"allreduce_bus_gbps": 1.5}\';;\n'
    + "esac; exit;; esac\n"
    # The 2-node all-reduce: the real one, unless $ANSWER_ALLREDUCE says the host node answers it at once.
    + 'case "$*" in *--rdzv_id=hpcjob-doctor-*) if [ -n "$ANSWER_ALLREDUCE" ]; then\n'
    + '  [ "$HPCJOB_IS_HOST" = 0 ] || echo \'HPCJOB_METRICS {"allreduce_backend": "gloo", '
    + '"allreduce_bus_gbps": 1.5, "allreduce_correct": true}\'; exit; fi;; esac\n'
    + 'if [ "$1" != -c ]; then exec "'
    + sys.executable
    + '" "$@"; fi\n'
    + 'case "$node" in $OLD_PYTHON) echo -n "3.8.10 x86_64 ";; *) echo -n "3.10.12 x86_64 ";; esac\n'
    + 'case "$node" in $NO_TORCH) echo "Traceback (most recent call last):" >&2\n'
    + "  echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1;; esac\n"
    + 'echo -n "2.14.1 True 2 "\n'
    + 'case "$node" in $NO_VENV) echo Traceback; echo "ModuleNotFoundError: No module named ensurepip";;\n'
    + "  *) echo venv;; esac\n",
    "mountpoint": NODE + 'case "$node" in $UNMOUNTED) exit 1;; esac\nexit 0\n',
}


@pytest.fixture
def head(tmp_path: Path) -> Iterator[HeadNode]:
    yield from stand_in_head(tmp_path, {})


def stand_in_head(
    tmp_path: Path, more_env: dict[str, str], nodes: list[NodeSpec] | None = None
) -> Iterator[HeadNode]:
    """The head node (`nodes`: the emulator's own by default), its nodes' tools the stand-ins above
    (before `more_env`'s PATH, if it has one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        **more_env,
        "PATH": f"{bin_dir}:{more_env.get('PATH', os.environ['PATH'])}",
        "NO_GPU": "-",
        "NO_TORCH": "-",
        "UNMOUNTED": "-",
        "OLD_PYTHON": "-",
        "NO_VENV": "-",
        "SLOW_GPUS": "-",
        "REAL_GPUS": "-",
        "SLOW_NODE": "-",
        "ANSWER_ALLREDUCE": "",
    }
    with HeadNode(nodes, users={"alice": PASSWORD}, env=env) as started:
        yield started


def profile(head: HeadNode, backend: str, tmp_path: Path, **changes: object) -> dict[str, object]:
    (tmp_path / "share").mkdir(exist_ok=True)
    return {
        "url": head.url,
        "user": "HPC\\alice",
        "ca_bundle": head.ca_file,
        "backend": backend,
        "winrm_url": head.wsman_url,
        "share": "//HEADNODE/CcpSpoolDir/app",
        "local_share": str(tmp_path / "share"),
        "mount_point": str(tmp_path / "share"),  # the emulated nodes are this machine: the same folder
        "node_group": "GPUNodes",
        "gpus_per_node": 2,
        # The emulated nodes are this machine: the doctor's all-reduce must not take a port another
        # test's may hold (the profile's port, as for nodes whose firewall opens another).
        "rdzv_port": free_port(),
        **changes,
    }


def checks(result: Result) -> dict[str, tuple[str, str]]:
    return {c["check"]: (c["result"], c["detail"]) for c in json.loads(result.out)["checks"]}


def test_a_healthy_cluster_passes_every_check_and_then_a_slow_node_is_found_between_pairs(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    """Over WinRM (the other tests here go over REST); LOCALHOST's all-reduce across its GPUs the real one
    (the others' at once: each real one is three processes importing torch on this machine), the pairs'
    all-reduces the stand-ins' answers, then NODE003 slow in its pairs."""
    hpcjob = cli_with_profile(PASSWORD, **profile(head, "winrm", tmp_path))
    head.cluster.base_env["REAL_GPUS"] = "LOCALHOST"
    done = hpcjob("doctor", "--json")
    assert done.code == 0, done.out + done.err
    found = checks(done)
    assert list(found) == [
        *("head node", "credentials", "nodes", "GPUs", "share mounted", "torch", "Python", "agent"),
        *("local disk", "all-reduce", "fabric", "all-reduce per node", "all-reduce between nodes"),
        *("rendezvous port", "share"),
    ]
    # Each emulated node's own disk (the emulator's HPCJOB_LOCAL_DIR), a folder of this machine's.
    result, detail = found.pop("local disk")
    assert result == "info" and len(detail.split("; ")) == 3, detail
    assert re.search(r"/nodes/NODE002/local on 1 node\(s\)(, on the OS disk)?: [0-9.]+ [GT]B free", detail)
    assert found.pop("fabric") == ("skip", "no NCCL: the all-reduce ran on the CPU (gloo)")
    assert found.pop("rendezvous port")[0] == "info"  # the profile does not say its nodes are here
    # The mount point here is long (tmp_path): no room for the agent (tests/test_doctor_checks.py).
    assert found.pop("agent") == ("skip", "not asked: the probe's command line had no room left for it")
    result, detail = found.pop("all-reduce per node")  # gloo across LOCALHOST's 2 processes, no size
    assert result == "info" and detail.endswith("(the profile names no vm_size: no verdict)"), detail
    assert re.match(r"bus GB/s: LOCALHOST [0-9.e-]+, NODE002 2\.5, NODE003 2\.5 ", detail), detail
    assert found["all-reduce between nodes"][1] == (
        "bus GB/s, each pair of the ring: LOCALHOST-NODE002 1.5, NODE002-NODE003 1.5, NODE003-LOCALHOST 1.5"
    )
    assert {result for result, _ in found.values()} == {"pass"}
    assert found["GPUs"][1].startswith("2 per node (3 node(s)")
    assert found["torch"][1] == "2.14.1 on 3 node(s), CUDA works"
    assert found["Python"][1] == "3.10.12 x86_64 on 3 node(s), venv for a job's environment"
    assert "HPC Pack version not known over this backend" in found["head node"][1]
    assert (tmp_path / "share" / ".hpcjob-doctor").is_file()  # written from here
    # The real all-reduces (between two nodes, across LOCALHOST's GPUs) ran above: the stand-ins answer now.
    head.cluster.base_env.update(SLOW_NODE="NODE003", REAL_GPUS="-", ANSWER_ALLREDUCE="1")
    text = hpcjob("doctor")
    assert text.code == 1 and text.out.splitlines()[-1] == "1 of 10 checks failed", text.out
    assert re.search(
        r"FAIL +all-reduce between nodes +slow: NODE003; bus GB/s: LOCALHOST-NODE002 1\.5, NODE002-NODE003 "
        r"0\.2, NODE003-LOCALHOST 0\.2 \(slow: under 50% of the best pair\)",
        text.out,
    ), text.out


def test_each_failure_is_named_with_its_fix_and_the_exit_is_1(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on: the share is unreachable
    port = closed.getsockname()[1]
    unreachable = {"local_share": None, "smb_server": "127.0.0.1", "smb_port": port}
    hpcjob = cli_with_profile(PASSWORD, **profile(head, "rest", tmp_path, **unreachable))
    head.cluster.set_node("NODE003", state="Offline")
    head.cluster.base_env.update(NO_TORCH="NODE002", UNMOUNTED="LOCALHOST")
    done = hpcjob("doctor")
    closed.close()
    assert done.code == 1, done.err
    lines = done.out.splitlines()
    text = re.sub(" {2,}", "  ", "\n".join(lines))  # the columns' width aside
    assert "FAIL  nodes" in text and "NODE003 (Offline, OK)" in text
    assert "Set-HpcNodeState -Name NODE003 -State online" in text
    assert "FAIL  torch  NODE002: ModuleNotFoundError: No module named 'torch'" in text
    assert (
        f"FAIL  share mounted  //HEADNODE/CcpSpoolDir/app is not mounted at {tmp_path}/share on LOCALHOST"
        in text
    )
    assert "FAIL  share  " in text and "port 445" in text
    assert "PASS  GPUs" in text  # the two usable nodes
    assert "SKIP  all-reduce  cannot run: it needs two nodes that passed the checks above" in text
    assert lines[-1] == "4 of 8 checks failed"


def test_refused_credentials_fail_and_the_rest_cannot_run(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    hpcjob = cli_with_profile("wrong", **profile(head, "winrm", tmp_path))
    done = hpcjob("doctor", "--json")
    assert done.code == 1
    found = checks(done)
    assert (
        found["credentials"][0] == "fail"
        and "refused the credentials of HPC\\alice" in found["credentials"][1]
    )
    assert found["nodes"] == ("skip", "cannot run: the head node did not answer")
    assert "wrong" not in done.out + done.err


def test_a_node_without_its_gpus_with_slow_ones_or_another_python_is_named(
    head: HeadNode,
    cli_with_profile: Callable[..., Callable[..., Result]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over REST: NODE003 has no GPUs and another Python; NODE002's all-reduce across its GPUs is below its
    size's mark (the stand-ins' figures scaled down: 0.001 GB/s for the health checks' 228)."""

    table = sizes.size_table()
    real = table.sizes["Standard_ND96asr_v4"]
    mark = dataclasses.replace(real.marks[0], value=0.001)
    size = dataclasses.replace(real, marks=(mark, *real.marks[1:]))
    monkeypatch.setattr(sizes, "size_table", lambda: dataclasses.replace(table, sizes={size.name: size}))
    hpcjob = cli_with_profile(PASSWORD, **profile(head, "rest", tmp_path, vm_size=size.name))
    head.cluster.base_env.update(
        NO_GPU="NODE003", SLOW_GPUS="NODE002", OLD_PYTHON="NODE003", ANSWER_ALLREDUCE="1"
    )
    done = hpcjob("doctor", "--json")
    found = checks(done)
    assert "HPC Pack 6." in found["head node"][1]  # asked over REST (WinRM: not asked)
    assert found["GPUs"] == ("fail", "NODE003: 0 (the profile says 2)")
    assert found["Python"] == ("fail", "3.10.12 x86_64 on LOCALHOST, NODE002; 3.8.10 x86_64 on NODE003")
    assert found["all-reduce per node"] == (
        "fail",
        "below the mark of 0.001 GB/s for Standard_ND96asr_v4: NODE002 0.0005 GB/s",
    )
    [row] = [row for row in json.loads(done.out)["checks"] if row["check"] == "all-reduce per node"]
    figures = {figure["node"]: figure for figure in row["figures"]}
    assert set(figures) == {"LOCALHOST", "NODE002", "NODE003"} and figures["NODE002"]["bus_gbs"] == 0.0005
    assert {figure["mark_gbs"] for figure in figures.values()} == {0.001}


def test_doctor_checks_the_data_node_group_and_its_port_from_a_trainer(
    cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    """A profile with a data_node_group: its node online, the share mounted there, the trainers' Python
    and torch, and a trainer reaching its data port in one job of both roles (the real probe); then a
    data node with another Python is named."""
    from hpcjob.emulator.headnode import GPU_GROUPS

    nodes = [
        NodeSpec("LOCALHOST", groups=GPU_GROUPS),
        NodeSpec("NODE002", groups=GPU_GROUPS),
        NodeSpec("CPUNODE001", groups=("ComputeNodes", "LinuxNodes", "CPUNodes")),
    ]
    for head in stand_in_head(tmp_path, {"ANSWER_ALLREDUCE": "1"}, nodes):
        head.cluster.base_env["ANSWER_ALLREDUCE"] = "1"
        hpcjob = cli_with_profile(PASSWORD, **profile(head, "rest", tmp_path, data_node_group="CPUNodes"))
        found = checks(done := hpcjob("doctor", "--json"))
        assert list(found)[-6:] == [
            "data nodes", "data nodes: share mounted", "data nodes: Python and torch", "data port",
            "rendezvous port", "share",
        ], done.err  # fmt: skip
        assert found["data nodes"] == ("pass", "1 in node group CPUNodes, all online and healthy")
        assert found["data nodes: Python and torch"] == (
            "pass",
            "Python 3.10.12 x86_64, torch 2.14.1 on 1 data node(s), as the trainers",
        )
        result, detail = found["data port"]
        assert result == "pass" and detail.startswith("LOCALHOST reached CPUNODE001 at "), detail
        head.cluster.base_env["OLD_PYTHON"] = "CPUNODE001"
        found = checks(hpcjob("doctor", "--json"))
        assert found["data nodes: Python and torch"][0] == "fail"
        assert found["data nodes: Python and torch"][1] == (
            "CPUNODE001: Python 3.8.10 x86_64, torch 2.14.1; "
            "the trainers: Python 3.10.12 x86_64, torch 2.14.1"
        )


def test_doctor_builds_the_job_s_environment_and_runs_the_all_reduce_in_it(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    from .test_env import make_wheel, requirements

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinya", "1.0", "VALUE = 1\n")
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(requirements(wheels, "tinya==1.0"))
    bad.write_text(requirements(wheels, "tinyz==9"))
    hpcjob = cli_with_profile(PASSWORD, **profile(head, "rest", tmp_path))
    found = checks(hpcjob("doctor", "--json", "--requirements", str(good)))
    result, detail = found["environment"]
    assert result == "pass" and detail.startswith("good.txt on LOCALHOST and NODE002: the all-reduce ran in")
    assert "torch 2.14.1" in detail and "/hpcjob/envs/" in detail  # the environment's own Python
    failed = hpcjob("doctor", "--json", "--requirements", str(bad))
    assert failed.code == 1
    result, detail = checks(failed)["environment"]
    assert result == "fail" and "ERROR: No matching distribution found for tinyz==9" in detail


@pytest.fixture
def docker_head(tmp_path: Path, fake_docker: dict[str, str]) -> Iterator[HeadNode]:
    yield from stand_in_head(tmp_path, fake_docker)


def test_doctor_runs_its_all_reduce_in_the_image_and_names_docker_s_reason_when_it_cannot(
    docker_head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    hpcjob = cli_with_profile(PASSWORD, **profile(docker_head, "rest", tmp_path))

    def container_check(image: str) -> tuple[str, str, str]:
        done = hpcjob("doctor", "--json", "--image", image)
        found = {row["check"]: row for row in json.loads(done.out)["checks"]}["container"]
        return found["result"], found["detail"], found["fix"]

    result, detail, _ = container_check(IMAGE)
    assert result == "pass" and detail.startswith(f"{IMAGE} on LOCALHOST and NODE002: the all-reduce ran"), (
        detail
    )
    assert "torch 2.14.1" in detail
    result, detail, fix = container_check("contoso/missing:1")
    assert result == "fail" and "pull access denied for contoso/missing" in detail, detail
    assert "NVIDIA container toolkit" in fix


@pytest.mark.slow  # a real 2-node local run of the all-reduce
def test_doctor_local_checks_this_machine_for_a_local_run(tmp_path: Path) -> None:
    """`hpcjob doctor --local`: the lines of the cluster doctor, for this machine."""
    import subprocess

    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "doctor", "--local", "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    report = json.loads(done.stdout)
    results = {c["check"]: c["result"] for c in report["checks"]}
    assert (report["cluster"], report["backend"]) == ("this machine", "local")
    assert [results[k] for k in ("Python", "torch", "all-reduce gloo")] == ["pass"] * 3, done.stdout
    # The disk check judges this machine's free space (a CI machine may be short of it): as it stands.
    import shutil

    from hpcjob.checks.cluster import ENV_SPACE_GB

    roomy = shutil.disk_usage(tmp_path).free / 1e9 >= ENV_SPACE_GB
    assert results["disk"] == ("pass" if roomy else "fail"), done.stdout
    assert set(results) >= {"GPUs", "rendezvous port", "docker"}
    gloo = next(c for c in report["checks"] if c["check"] == "all-reduce gloo")
    assert gloo["figures"][0]["bus_gbps"] > 0
    assert done.returncode == (1 if "fail" in results.values() else 0)
    mixed = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "doctor", "--local", "--image", IMAGE],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert mixed.returncode == 2 and "--local checks this machine" in mixed.stderr


@pytest.mark.parametrize(("gpus", "nccl"), [(None, None), (1, "skip"), (2, "pass")])
def test_doctor_local_tries_nccl_with_two_gpus_and_says_why_not_with_one(
    monkeypatch: pytest.MonkeyPatch, gpus: int | None, nccl: str | None
) -> None:
    """On one GPU (an H200 here, 2026-11-27) a 2-node local run uses gloo: NCCL refuses two ranks on one
    GPU. The line says so instead of leaving NCCL out unsaid."""
    from hpcjob.checks import cluster as steps
    from hpcjob.checks.verdicts import PASS, Check

    tried: list[str] = []

    def allreduce(backend: str, *_: object) -> Check:
        tried.append(backend)
        return Check(f"all-reduce {backend}", PASS, "measured")

    passed = Check("x", PASS, "")
    monkeypatch.setattr(steps, "_local_python", lambda: (passed, passed, gpus))
    monkeypatch.setattr(steps, "_local_gpus", lambda cuda: passed)
    monkeypatch.setattr(steps, "_local_allreduce", allreduce)
    monkeypatch.setattr(steps, "_local_disk", lambda: passed)
    monkeypatch.setattr(steps, "_local_docker", lambda cuda: passed)
    checks = {c.name: c for c in steps.local_checkup(lambda line: None).checks}
    assert tried == (["gloo", "nccl"] if nccl == "pass" else ["gloo"])
    assert (checks["all-reduce nccl"].result if "all-reduce nccl" in checks else None) == nccl
    if nccl == "skip":
        assert checks["all-reduce nccl"].detail == "1 GPU: NCCL needs a GPU for each of 2 ranks"
