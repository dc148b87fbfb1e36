"""`doctor`'s verdicts from the nodes' answers (hpcjob.checks.verdicts, pure): which HPC Pack agent each node
runs, and what that means for the mount step; each node's all-reduce and the fabric; the slow node among
pairs."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from hpcjob.checks.verdicts import (
    AGENT_DIR,
    FAIL,
    INFO,
    PASS,
    SKIP,
    Check,
    fabric_check,
    local_disk_check,
    local_probe_command,
    node_allreduce_check,
    pair_rounds,
    pairs_check,
    parse_probe,
    probe_checks,
    probe_command,
    rdzv_port_check,
    ring_pairs,
)
from hpcjob.job.sizes import size_table
from hpcjob.job.spec import DEFAULT_RDZV_PORT
from hpcjob.store.config import ClusterProfile

HEALTHY = "HPCJOB_PROBE gpus=8\nHPCJOB_PROBE node=3.10.12,x86_64,2.14.1,True,8,venv\n"


def answer(node: str, agent: str, mounted: str = "yes") -> tuple[str, str]:
    return node, f"{HEALTHY}HPCJOB_PROBE mounted={mounted}\nHPCJOB_PROBE agent={agent}\n"


def agent_check(*answers: tuple[str, str]) -> tuple[str, str, str]:
    [check] = [c for c in probe_checks(answers, 8, "/app/alice", "//HEAD/CcpSpoolDir") if c.name == "agent"]
    return check.result, check.detail, check.fix


def test_the_probe_asks_for_each_agent_s_own_file_where_the_command_line_has_room() -> None:
    command = probe_command("/app/alice")
    assert command.endswith(
        f";echo $P agent=$(cd {AGENT_DIR} 2>&-&&ls StartMpiContainer.sh appsettings.json 2>&-)"
    )
    assert len(command) <= 480  # HPC Pack's CommandLine limit (hpcjob's default --command-limit)
    long = probe_command("/app/" + "a" * 60)
    assert "agent" not in long and len(long) <= 480
    assert agent_check(("N1", HEALTHY)) == (
        SKIP,
        "not asked: the probe's command line had no room left for it",
        "",
    )


@pytest.mark.parametrize(
    ("answers", "result", "said"),
    [
        ([answer("N1", "StartMpiContainer.sh"), answer("N2", "StartMpiContainer.sh")], PASS,
         "the C++ agent on 2 node(s)"),
        ([answer("N1", ""), answer("N2", "")], SKIP,
         "neither agent's files in /opt/hpcnodemanager on N1, N2"),
        # A node moved to the .NET agent whose mount an administrator made: it works, without the filter.
        ([answer("N1", "StartMpiContainer.sh"), answer("N2", "appsettings.json")], PASS,
         "the C++ agent on 1 node(s); the .NET agent on N2: the share is mounted, but the .NET agent runs "
         "no execution filter: submit with --no-mount-step"),
    ],
)  # fmt: skip
def test_the_agent_each_node_runs_is_said(answers: list[tuple[str, str]], result: str, said: str) -> None:
    assert agent_check(*answers)[:2] == (result, said)


def test_a_net_agent_node_without_the_share_fails_with_the_ways_out() -> None:
    result, detail, fix = agent_check(
        answer("N1", "StartMpiContainer.sh"), answer("N2", "appsettings.json", mounted="no")
    )
    assert result == FAIL and detail.endswith("hpcjob's mount step cannot mount the share there")
    assert "--no-mount-step" in fix and "--image" in fix and "render --format clusrun" in fix


def metrics(gbs: float) -> str:
    return f'HPCJOB_METRICS {{"allreduce_bus_gbps": {gbs}, "allreduce_correct": true}}\n'


def test_each_node_s_all_reduce_is_judged_by_its_size_s_mark_or_said_to_have_none() -> None:
    answers = [
        ("N1", metrics(471.2)),
        ("N2", metrics(301.5)),
        ("N3", "torch.distributed...\nRuntimeError: NCCL error\n"),
    ]
    failed = node_allreduce_check(answers, "Standard_ND96isr_H100_v5", 460.0)
    assert (failed.result, failed.detail) == (FAIL, "N3: RuntimeError: NCCL error")
    slow = node_allreduce_check(answers[:2], "Standard_ND96isr_H100_v5", 460.0)
    assert (slow.result, slow.detail) == (
        FAIL,
        "below the mark of 460 GB/s for Standard_ND96isr_H100_v5: N2 301.5 GB/s",
    )
    assert "--exclude-node" in slow.fix
    assert slow.figures == (
        {"node": "N1", "bus_gbs": 471.2, "mark_gbs": 460.0},
        {"node": "N2", "bus_gbs": 301.5, "mark_gbs": 460.0},
    )
    fine = node_allreduce_check(answers[:1], "Standard_ND96isr_H100_v5", 460.0)
    assert (fine.result, fine.detail) == (
        PASS,
        "bus GB/s: N1 471.2, each at least the mark of 460 for Standard_ND96isr_H100_v5",
    )
    gb200 = size_table().find("Standard_ND128isr_NDR_GB200_v6")
    assert gb200 is not None and gb200.allreduce_mark is None  # Microsoft publishes none for it
    unmarked = node_allreduce_check(answers[:1], gb200.name, None)
    assert (unmarked.result, unmarked.detail) == (  # neither pass nor fail
        INFO,
        "bus GB/s: N1 471.2 (no reference mark for Standard_ND128isr_NDR_GB200_v6: no verdict)",
    )


def test_a_node_whose_python_cannot_make_a_job_s_environment_is_named() -> None:
    no_venv = "HPCJOB_PROBE node=3.10.12,x86_64,2.14.1,True,8,Traceback;ModuleNotFoundError...\n"
    answers = [answer("N1", ""), ("N2", no_venv + "HPCJOB_PROBE mounted=yes\n")]
    [python] = [c for c in probe_checks(answers, 8, "/app/alice", None) if c.name == "Python"]
    assert (python.result, python.detail) == (
        FAIL,
        "no venv on N2: a job with a requirements file fails there",
    )
    assert "python3-venv" in python.fix


# NCCL's INFO lines as its transports word them (NVIDIA/nccl net_ib.cc, net_socket.cc; facts §4).
IB = "nd1:2211:2298 [0] NCCL INFO NET/IB : Using [0]mlx5_ib0:1/IB [1]mlx5_ib1:1/IB [RO]; OOB eth0:10.0.0.4<0>"
NO_IB = "nd1:2211:2298 [0] NCCL INFO NET/IB : No device found."
SOCKET = "nc1:3131:3190 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>"


@pytest.mark.parametrize(
    ("size", "infiniband", "lines", "result", "said"),
    [
        ("Standard_ND96isr_H100_v5", "NDR", [IB], PASS,
         "NCCL went over InfiniBand ([0]mlx5_ib0:1/IB [1]mlx5_ib1:1/IB [RO])"),
        ("Standard_ND96isr_H100_v5", "NDR InfiniBand, 400 Gb/s per GPU", [NO_IB, SOCKET], FAIL,
         "NCCL went over TCP sockets ([0]eth0:10.0.0.5<0>), though Standard_ND96isr_H100_v5 has NDR "
         "InfiniBand, 400 Gb/s per GPU"),
        ("Standard_NC24ads_A100_v4", None, [SOCKET], INFO,
         "NCCL went over TCP sockets ([0]eth0:10.0.0.5<0>): Standard_NC24ads_A100_v4 has no InfiniBand"),
        ("Standard_ND96asr_v4", "HDR", ["NCCL INFO Bootstrap : Using eth0"], SKIP,
         "NCCL said nothing of its network (no NET/ line in the job's output)"),
    ],
)  # fmt: skip
def test_whether_nccl_went_over_infiniband_is_read_from_its_own_words(
    size: str, infiniband: str | None, lines: list[str], result: str, said: str
) -> None:
    check = fabric_check(size, infiniband, "nccl", lines)
    assert (check.result, check.detail) == (result, said)
    assert ("ibstat" in check.fix) == (result == FAIL)
    assert (
        fabric_check(size, infiniband, "gloo", lines).detail
        == "no NCCL: the all-reduce ran on the CPU (gloo)"
    )
    assert fabric_check(size, infiniband, None, lines).detail == "the all-reduce did not run to its end"


@pytest.mark.parametrize(
    ("nodes", "rounds"),
    [
        ("AB", [["AB"]]),
        ("ABC", [["AB"], ["BC"], ["CA"]]),
        ("ABCD", [["AB", "CD"], ["BC", "DA"]]),
        ("ABCDE", [["AB", "CD"], ["BC", "DE"], ["EA"]]),
    ],
)
def test_the_ring_s_pairs_run_in_rounds_of_pairs_that_share_no_node(
    nodes: str, rounds: list[list[str]]
) -> None:
    assert [["".join(pair) for pair in round_] for round_ in pair_rounds(ring_pairs(list(nodes)))] == rounds


def measured(figures: dict[str, float | None]) -> list[tuple[tuple[str, str], float | None, str]]:
    return [
        ((pair[0], pair[1]), gbs, "" if gbs is not None else "exit code 1") for pair, gbs in figures.items()
    ]


@pytest.mark.parametrize(
    ("figures", "result", "slow"),
    [
        ({"AB": 40, "BC": 38, "CD": 41, "DA": 39}, PASS, None),
        ({"AB": 40, "BC": 3, "CD": 4, "DA": 39}, FAIL, "C"),  # C is slow with both its neighbours
        ({"AB": 40, "BC": 3, "CD": 38, "DA": 39}, FAIL, "the link B-C"),  # B and C are fast elsewhere
        ({"AB": 40, "BC": None, "CD": None, "DA": 39}, FAIL, "C"),  # C's pairs failed
        ({"AB": 40, "BC": 21, "CD": 19, "DA": 39}, FAIL, "the link C-D"),  # the edge: 19 < 20, 21 is not
    ],
)
def test_the_slow_node_is_told_from_a_slow_link_by_its_two_pairs(
    figures: dict[str, float | None], result: str, slow: str | None
) -> None:
    check = pairs_check(measured(figures))
    assert check.result == result, check
    if slow is None:
        assert check.detail == "bus GB/s, each pair of the ring: A-B 40, B-C 38, C-D 41, D-A 39"
    else:
        assert check.detail.startswith(f"slow: {slow}; bus GB/s: A-B 40"), check.detail
        assert "ibstat" in check.fix
    best = max(gbs for gbs in figures.values() if gbs is not None)
    assert [row["slow"] for row in check.figures] == [
        gbs is None or gbs < 0.5 * best for gbs in figures.values()
    ]  # --json: each pair with the best pair's figure it was judged against
    assert {row["best_gbs"] for row in check.figures} == {best}


def test_pairs_that_all_failed_name_no_slow_node() -> None:
    check = pairs_check(measured({"AB": None, "BC": None, "CA": None}))
    assert (check.result, check.detail) == (
        FAIL,
        "no pair's all-reduce ran; A-B: exit code 1; B-C: exit code 1; C-A: exit code 1",
    )


def fake_tools(folder: Path, **scripts: str) -> str:
    """A PATH of `folder` alone, holding sh scripts by name (rocm-smi, nvidia-smi) and the few tools the
    probe's GPU count needs: no real nvidia-smi can answer."""
    import shutil

    folder.mkdir(exist_ok=True)
    for tool in ("grep", "sh", "bash"):
        found = shutil.which(tool)
        assert found is not None
        (folder / tool).symlink_to(found)
    for name, text in scripts.items():
        script = folder / name.replace("_", "-")
        script.write_text(f"#!/bin/sh\n{text}\n")
        script.chmod(0o755)
    return str(folder)


# What a ROCm node's rocm-smi lists, a line a GPU (the form Microsoft's health checks count: lines with GPU).
ROCM_LIST = (
    "echo '=== ROCm System Management Interface ==='; "
    'for i in 0 1 2 3 4 5 6 7; do echo "GPU[$i] : MI300X"; done'
)


def test_where_nvidia_smi_is_missing_the_probe_counts_gpus_with_rocm_smi(tmp_path: Path) -> None:
    import subprocess

    def gpus_said(path: str) -> dict[str, str]:
        done = subprocess.run(
            [f"{path}/bash", "-c", probe_command("/app/alice")], capture_output=True, text=True,
            env={"PATH": path}, timeout=30,
        )  # fmt: skip
        return parse_probe(done.stdout)

    rocm = fake_tools(tmp_path / "amd", rocm_smi=ROCM_LIST)
    assert gpus_said(rocm)["gpus"] == "8"
    nvidia = fake_tools(tmp_path / "nv", nvidia_smi="echo 'GPU 0: H100 (UUID: GPU-1)'; echo 'GPU 1: H100'",
                        rocm_smi=ROCM_LIST)  # fmt: skip
    assert gpus_said(nvidia)["gpus"] == "2"  # nvidia-smi first
    assert gpus_said(fake_tools(tmp_path / "cpu"))["gpus"] == "0"  # neither: a CPU node
    [check] = [c for c in probe_checks([("N1", HEALTHY)], 8, "/app", None) if c.name == "GPUs"]
    assert check.detail == "8 per node (1 node(s), `nvidia-smi -L`, else `rocm-smi -l`)"


def test_doctor_local_counts_amd_gpus_with_rocm_smi_where_nvidia_smi_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcjob.checks.cluster import _local_gpus

    monkeypatch.setenv("PATH", fake_tools(tmp_path / "amd", rocm_smi=ROCM_LIST))
    assert (_local_gpus(8).result, _local_gpus(8).detail) == (PASS, "8 (`rocm-smi -l`), all seen by torch")
    wrong = _local_gpus(None)  # a CUDA build of torch on an AMD node sees none
    assert (wrong.result, wrong.detail) == (FAIL, "rocm-smi lists 8, torch sees 0")
    assert "ROCm build of torch" in wrong.fix
    monkeypatch.setenv("PATH", fake_tools(tmp_path / "none"))
    assert _local_gpus(None).result == SKIP


# The rendezvous port: asked here where the profile's nodes are this machine (nodes_here)


def test_doctor_says_whether_the_rendezvous_port_is_free_here() -> None:
    assert rdzv_port_check(None, True, None).result == PASS
    free = rdzv_port_check(30001, True, None)
    assert (free.result, free.detail) == (PASS, "port 30001 is free on this machine, where the nodes are")
    taken = rdzv_port_check(30001, True, "Address already in use")
    assert taken.result == FAIL and taken.detail == (
        "port 30001 is in use on this machine, where the nodes are: Address already in use"
    )
    elsewhere = rdzv_port_check(None, False, None)
    assert elsewhere.result == INFO and elsewhere.detail.startswith(f"port {DEFAULT_RDZV_PORT} not asked: ")


def test_doctors_rendezvous_check_binds_the_profiles_port_here() -> None:
    from hpcjob.backends.local import free_port
    from hpcjob.checks.cluster import _rdzv_port

    port = free_port()
    assert _rdzv_port(here_profile(nodes_here=True, rdzv_port=port)).result == PASS
    with socket.create_server(("127.0.0.1", port)):  # one address taken: a rendezvous on all would fail
        check = _rdzv_port(here_profile(nodes_here=True, rdzv_port=port))
    assert check.result == FAIL and check.detail.startswith(f"port {port} is in use on this machine")
    assert _rdzv_port(here_profile(rdzv_port=port)).result == INFO


def test_an_ended_jobs_connections_on_the_rendezvous_port_are_no_bar() -> None:
    """The rendezvous binds with SO_REUSEADDR, as torch's TCPStore does: the port's connections left in
    TIME_WAIT by a job that ended (the side that closed first keeps them) do not make it "in use"."""
    from hpcjob.backends.local import free_port, port_in_use
    from hpcjob.checks.cluster import _rdzv_port

    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as server, socket.create_connection(("127.0.0.1", port)):
        accepted, _ = server.accept()
        accepted.close()  # the listener's side closes first: its end of the connection waits (TIME_WAIT)
    assert port_in_use(port) is not None  # a plain bind meets it
    assert _rdzv_port(here_profile(nodes_here=True, rdzv_port=port)).result == PASS


def here_profile(**changes: object) -> ClusterProfile:
    return ClusterProfile(name="p", url="https://head", user="alice", **changes)  # type: ignore[arg-type]


def test_each_node_s_local_folder_and_free_space_are_said_from_the_probe_run_here(tmp_path: Path) -> None:
    """The probe runs in a real shell: the folder the profile names, the node's own HPCJOB_LOCAL_DIR before
    it, a folder that is not there (a failure only where the profile copies datasets); many nodes are said
    by the least and most free."""
    import os
    import subprocess

    def probe(folder: str | None, **env: str) -> str:
        done = subprocess.run(["bash", "-c", local_probe_command(folder)], capture_output=True, text=True,
                              env={**os.environ, **env}, check=True)  # fmt: skip
        return done.stdout

    here = probe(str(tmp_path))
    check = local_disk_check([("GPU1", here)], datasets=True)
    assert check.result == INFO and check.detail.startswith(f"{tmp_path} on 1 node(s)"), check
    free = float(check.detail.split(": ")[-1].split()[0]) * {"GB": 1e9, "TB": 1e12}[check.detail.split()[-2]]
    assert abs(free - shutil.disk_usage(tmp_path).free) < 0.1 * free  # df's figure, as Python sees it
    own = probe("/nowhere", HPCJOB_LOCAL_DIR=str(tmp_path))  # the node's own name for it wins
    assert local_disk_check([("GPU1", own)], datasets=True).detail.startswith(f"{tmp_path} on 1 node(s)")

    gone = probe(str(tmp_path / "missing"))
    failed = local_disk_check([("GPU1", here), ("GPU2", gone)], datasets=True)
    assert failed.result == FAIL and failed.detail.startswith(
        f"GPU2: no local folder at {tmp_path}/missing; "
    )
    assert "local_dir" in failed.fix
    assert local_disk_check([("GPU2", gone)], datasets=False) == Check(
        "local disk", INFO, f"GPU2: no local folder at {tmp_path}/missing (--dataset needs one)"
    )


def test_the_resource_disk_is_a_mount_point_of_its_own_and_many_nodes_say_least_and_most() -> None:
    def said(rows: str) -> str:
        return f"HPCJOB_PROBE local=/mnt/resource /mnt\nHPCJOB_PROBE df={rows}\n"

    resource = "/dev/sdb1,,,300000000,,100,,,299000000,,,1%,/mnt;"
    os_disk = "/dev/sda1,,,30000000,,100,,,20000000,,,40%,/;"
    answers = [("GPU1", said(resource)), ("GPU2", said(resource.replace("299000000", "100000000")))]
    assert local_disk_check(answers, datasets=True) == Check(
        "local disk", INFO, "/mnt on 2 node(s): 102.4 GB free at least (GPU2), 306.2 GB at most"
    )
    # /mnt/resource and /mnt there, but on the OS disk: no resource disk.
    check = local_disk_check([("GPU3", said(os_disk + os_disk))], datasets=True)
    assert check.result == FAIL and check.detail == "GPU3: no local folder at /mnt/resource or /mnt"
    on_os = "HPCJOB_PROBE local=/scratch\nHPCJOB_PROBE df=" + os_disk
    assert local_disk_check([("GPU1", on_os)], datasets=False).detail == (
        "/scratch on 1 node(s), on the OS disk: 20.5 GB free"
    )
