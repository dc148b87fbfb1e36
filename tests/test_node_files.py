"""The node helper and the worker shim, run for real with bash and python."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcjob.store.staging import node_files


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    for relative, content in node_files():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    return tmp_path


def source_helper(job_dir: Path, store: str, then: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    script = f". .hpcjob/node.sh {store} run-1 && {then}"
    return subprocess.run(
        ["/bin/bash", "-c", script], cwd=job_dir, env={**base, **env}, capture_output=True, text=True
    )


SHOW = (
    'echo "$HPCJOB_NODE $HPCJOB_IS_HOST $HPCJOB_ADDR $HPCJOB_IFNAME $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME"'
)


@pytest.mark.parametrize(
    ("ccp_nodes", "store", "is_host"),
    [
        ("1 GPUNODE001 8", "GPUNODE001", "1"),
        ("1 gpunode001 8", "GPUNODE001", "1"),  # node name case differs from the endpoint's
        ("1 GPUNODE001 8", "gpunode001.contoso.com", "1"),  # a domain on either side is ignored
        ("1 GPUNODE002 8", "GPUNODE001", "0"),
        ("1 GPUNODE0011 8", "GPUNODE001", "0"),
    ],
)
def test_store_host_is_decided_from_the_hpc_pack_node_name(
    job_dir: Path, ccp_nodes: str, store: str, is_host: str
) -> None:
    result = source_helper(job_dir, store, SHOW, CCP_NODES=ccp_nodes, HPCJOB_IFNAME="lo")
    assert result.returncode == 0, result.stderr
    node, host, addr, ifname, gloo, nccl = result.stdout.split()
    assert node == ccp_nodes.split()[1]
    assert host == is_host
    assert (addr, ifname, gloo, nccl) == ("127.0.0.1", "lo", "lo", "lo")


def test_without_ccp_nodes_the_host_name_decides(job_dir: Path) -> None:
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    result = source_helper(job_dir, hostname.split(".")[0].upper(), SHOW, HPCJOB_IFNAME="lo")
    assert result.stdout.split()[:2] == [hostname.split(".")[0], "1"]


def test_address_is_the_routable_interface_not_what_the_host_name_resolves_to(job_dir: Path) -> None:
    routes = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    if not routes.stdout.strip():
        pytest.skip("this machine has no global IPv4 address")
    result = source_helper(job_dir, "X", SHOW, CCP_NODES="1 Y 2")
    _, _, addr, ifname, gloo, _ = result.stdout.split()
    assert ifname != "lo" and gloo == ifname
    assert (
        f" {addr}/"
        in subprocess.run(
            ["ip", "-o", "-4", "addr", "show", "dev", ifname], capture_output=True, text=True
        ).stdout
    )


def test_user_choices_of_interface_win(job_dir: Path) -> None:
    result = source_helper(
        job_dir, "X", SHOW, CCP_NODES="1 Y 2", HPCJOB_IFNAME="lo", GLOO_SOCKET_IFNAME="ib0"
    )
    assert result.stdout.split()[4:] == ["ib0", "lo"]


def test_an_interface_without_address_fails_fast(job_dir: Path) -> None:
    result = source_helper(job_dir, "X", "echo started", CCP_NODES="1 Y 2", HPCJOB_IFNAME="nosuch0")
    assert result.returncode == 1
    assert "started" not in result.stdout
    assert "no IPv4 address found on nosuch0; set HPCJOB_IFNAME" in result.stderr


@pytest.mark.parametrize("clock", ["bash", "date"])
def test_the_task_start_is_exported_as_unix_time(job_dir: Path, clock: str) -> None:
    """HPCJOB_TASK_START: bash's clock (EPOCHREALTIME), else date's; what the training program counts its
    first step from."""
    before = time.time()
    show = 'echo "$HPCJOB_TASK_START"; bash -c \'echo "$HPCJOB_TASK_START"\''  # and in a child: exported
    if clock == "date":  # unset, bash's variable is an ordinary one: as on a bash older than 5
        show = f"unset EPOCHREALTIME; . .hpcjob/node.sh X run-1 && {show}"
        base = {"PATH": os.environ["PATH"], "CCP_NODES": "1 Y 2", "HPCJOB_IFNAME": "lo"}
        result = subprocess.run(
            ["/bin/bash", "-c", show], cwd=job_dir, env=base, capture_output=True, text=True
        )
    else:
        result = source_helper(job_dir, "X", show, CCP_NODES="1 Y 2", HPCJOB_IFNAME="lo")
    after = time.time()
    assert result.returncode == 0, result.stderr
    here, child = result.stdout.split()
    assert here == child and re.fullmatch(r"\d+\.\d+", here), result.stdout
    assert before - 0.01 <= float(here) <= after


def write_record(job_dir: Path, rank: int, code: int, node: str, when: float) -> None:
    folder = job_dir / "logs" / "run-1" / ".hpcjob-exits"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}").write_text(f"{when:.6f} {rank} {code} {node} -\n")


def test_task_exits_with_its_first_failing_rank_code(job_dir: Path) -> None:
    write_record(job_dir, 2, 9, "N1", 20.0)
    write_record(job_dir, 3, 7, "N1", 10.0)
    write_record(job_dir, 0, 5, "N0", 1.0)  # another node's rank: not this task's
    env = {"CCP_NODES": "1 N1 2", "HPCJOB_IFNAME": "lo"}
    before = time.time()
    assert source_helper(job_dir, "N0", "exit 1", **env).returncode == 7
    code, when = (job_dir / "logs" / "run-1" / "N1.exit").read_text().split()  # the task's end, for `logs`
    assert code == "7" and before <= float(when) <= time.time()
    assert source_helper(job_dir, "N0", "true", **env).returncode == 0
    assert (job_dir / "logs" / "run-1" / "N1.exit").read_text().split()[0] == "0"
    assert source_helper(job_dir, "N0", "exit 1", CCP_NODES="1 N2 2", HPCJOB_IFNAME="lo").returncode == 1


def test_the_cancel_s_signals_do_not_cut_the_exit_record_short(job_dir: Path, tmp_path: Path) -> None:
    # A cancel (the agent, or hpcjob's local backend) sends SIGINT to every process of the task it sees,
    # again and again while the task stops: the commands of the exit trap are new processes too, and one
    # of them killed by SIGINT made the task report torchrun's 1 instead of its rank's 130.
    interrupted = tmp_path / "interrupted-bin"
    interrupted.mkdir()
    for command in ("cat", "awk", "sort", "head", "date"):
        real = subprocess.run(["/bin/bash", "-c", f"command -v {command}"], capture_output=True, text=True)
        wrapper = interrupted / command
        wrapper.write_text(f'#!/bin/bash\nkill -INT $$\nexec {real.stdout.strip()} "$@"\n')
        wrapper.chmod(0o755)
    write_record(job_dir, 1, 130, "N1", 10.0)
    env = {"CCP_NODES": "1 N1 2", "HPCJOB_IFNAME": "lo", "HPCJOB_ADDR": "127.0.0.1"}
    env["PATH"] = f"{interrupted}:{os.environ['PATH']}"
    assert source_helper(job_dir, "N0", "exit 1", **env).returncode == 130
    assert (job_dir / "logs" / "run-1" / "N1.exit").read_text().split()[0] == "130"


def run_worker(job_dir: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (job_dir / "train.py").write_text(body)
    env = {**os.environ, "HPCJOB_EXIT_DIR": str(job_dir / "exits"), "RANK": "3", "HPCJOB_NODE": "N1"}
    return subprocess.run(
        [sys.executable, ".hpcjob/worker.py", "train.py", *args],
        cwd=job_dir,
        env=env,
        capture_output=True,
        text=True,
    )


def test_worker_runs_the_script_as_main_with_its_argv(job_dir: Path) -> None:
    body = "import sys, os\nprint(__name__, sys.argv, os.path.basename(sys.path[0]))\n"
    result = run_worker(job_dir, body, "a b", "--x")
    assert result.returncode == 0
    assert result.stdout.strip() == f"__main__ ['train.py', 'a b', '--x'] {job_dir.name}"
    assert not (job_dir / "exits").exists()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("import sys\nsys.exit(3)\n", 3),
        ("raise RuntimeError('boom')\n", 1),
        ("import sys\nsys.exit('bye')\n", 1),
    ],
)
def test_worker_records_a_failing_exit_code(job_dir: Path, body: str, code: int) -> None:
    result = run_worker(job_dir, body)
    assert result.returncode == code
    when, rank, recorded, node, how = (job_dir / "exits" / "rank-3").read_text().split()
    assert (rank, int(recorded), node, how) == ("3", code, "N1", "-")
    assert float(when) > 0


@pytest.mark.parametrize(
    ("body", "signal_name"),
    [
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "SIGKILL"),  # the OOM killer
        ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", "SIGTERM"),
    ],
)
def test_worker_records_a_rank_killed_by_a_signal_and_dies_of_it(
    job_dir: Path, body: str, signal_name: str
) -> None:
    number = signal.Signals[signal_name].value
    before = time.time()
    result = run_worker(job_dir, body)
    assert result.returncode == -number  # torchrun sees the rank die as it died
    when, rank, recorded, node, how = (job_dir / "exits" / "rank-3").read_text().split()
    assert (rank, int(recorded), node, how) == ("3", 128 + number, "N1", signal_name)
    assert before <= float(when) <= time.time()


def test_the_script_s_own_code_wins_over_an_abort_at_teardown(job_dir: Path) -> None:
    # A process group left undestroyed can abort the interpreter after sys.exit(3): 3 says why.
    result = run_worker(job_dir, "import atexit, os, sys\natexit.register(os.abort)\nsys.exit(3)\n")
    assert result.returncode == 3
    assert (job_dir / "exits" / "rank-3").read_text().split()[2:] == ["3", "N1", "-"]


def test_worker_records_os_exit(job_dir: Path) -> None:
    result = run_worker(job_dir, "import os\nos._exit(5)\n")
    assert result.returncode == 5
    assert (job_dir / "exits" / "rank-3").read_text().split()[2:] == ["5", "N1", "-"]


def test_the_rank_dies_with_its_watching_parent(job_dir: Path) -> None:
    (job_dir / "train.py").write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    shim = subprocess.Popen(
        [sys.executable, ".hpcjob/worker.py", "train.py"], cwd=job_dir, stdout=subprocess.PIPE, text=True
    )
    assert shim.stdout is not None
    rank = int(shim.stdout.readline())
    assert rank != shim.pid
    shim.kill()
    shim.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{rank}").exists():
        time.sleep(0.05)
    stat = Path(f"/proc/{rank}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stop_signal_to_the_group_reaches_the_rank_once(job_dir: Path) -> None:
    body = (
        "import time\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    time.sleep(0.5)\n    print('cleaned up', flush=True)\n    raise\n"
    )
    (job_dir / "train.py").write_text(body)
    env = {**os.environ, "HPCJOB_EXIT_DIR": str(job_dir / "exits"), "RANK": "0", "HPCJOB_NODE": "N1"}
    shim = subprocess.Popen(
        [sys.executable, ".hpcjob/worker.py", "train.py"],
        cwd=job_dir,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as torchrun starts a worker: then it signals the worker's group
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as hpcjob starts a task
    )
    assert shim.stdout is not None and shim.stdout.readline() == "ready\n"
    os.killpg(shim.pid, signal.SIGINT)
    out, _ = shim.communicate(timeout=10)
    assert out == "cleaned up\n"  # one KeyboardInterrupt: the cleanup was not interrupted again
    assert shim.returncode == -signal.SIGINT
    assert (job_dir / "exits" / "rank-0").read_text().split()[2:] == ["130", "N1", "SIGINT"]
