"""Local runs share the GPUs out: each local node its own (CUDA_VISIBLE_DEVICES), one process per GPU
by default, the CPU with gloo when there are fewer GPUs than ranks. The device count is faked with
CUDA_VISIBLE_DEVICES, which hpcjob honours as "these GPUs"; the nodes' Python is a stand-in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcjob.backends.local.gpus import default_procs_per_node, share_gpus, visible_gpus
from hpcjob.store.runs import history

from .conftest import empty_script, run_local, stand_in_python


@pytest.mark.parametrize("count", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("nodes", [1, 2, 3])
@pytest.mark.parametrize("procs", [None, 1, 2])
def test_each_node_gets_its_own_gpus_or_the_job_runs_on_the_cpu(
    count: int, nodes: int, procs: int | None
) -> None:
    gpus = tuple(str(i) for i in range(count))
    per_node = procs or default_procs_per_node(gpus, nodes)
    share = share_gpus(gpus, nodes, per_node)
    assert len(share.devices) == nodes
    if count == 0:
        assert share == share_gpus((), nodes, per_node) and share.devices == (None,) * nodes
        assert share.note is None and per_node == (procs or 1)
    elif nodes * per_node <= count:
        given = [d.split(",") for d in share.devices if d is not None]
        assert all(len(g) == per_node for g in given)
        flat = [gpu for g in given for gpu in g]
        assert len(flat) == len(set(flat)) == nodes * per_node  # no GPU for two ranks
        assert share.note is None
        if procs is None:
            assert per_node == count // nodes  # one process per GPU the node gets
    else:
        assert share.devices == ("",) * nodes  # no GPU at all: gloo on the CPU
        assert share.note is not None and "\n" not in share.note
        assert f"{count} GPU(s) for {nodes} node(s) x {per_node} process(es)" in share.note


def test_visible_gpus_honours_cuda_visible_devices_else_asks_the_driver(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ("2", "3")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    driver = tmp_path / "gpus"
    driver.mkdir()
    for bus in ("0000:01:00.0", "0000:41:00.0", "0000:81:00.0"):
        (driver / bus).mkdir()
    assert visible_gpus({}, str(driver)) == ("0", "1", "2")
    assert visible_gpus({}, str(tmp_path / "none")) == ()


def local_run(tmp_path: Path, gpus: str, *args: str) -> tuple[str, dict[str, str]]:
    """run --local with `gpus` visible; each node's CUDA_VISIBLE_DEVICES and its torchrun arguments."""
    python = stand_in_python(tmp_path, 'echo "devices=${CUDA_VISIBLE_DEVICES-unset} args=$*"')
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}
    result = run_local("--quiet", "--python", str(python), *args, str(empty_script(tmp_path)), env=env)
    assert result.returncode == 0, result.stderr
    log = Path(result.stdout.split("logs: ")[1].strip())
    return result.stdout, {n.stem: n.read_text() for n in log.glob("LOCAL*.out")}


def test_two_local_nodes_on_four_gpus_get_two_each(tmp_path: Path) -> None:
    shown, seen = local_run(tmp_path, "0,1,2,3", "-n", "2")
    assert "2 node(s) x 2 process(es), GPUs 0,1 | 2,3," in shown
    assert "devices=0,1 " in seen["LOCAL1"] and "devices=2,3 " in seen["LOCAL2"]
    assert "--nproc_per_node=2" in seen["LOCAL1"]
    [entry] = history()
    assert entry.gpus_per_node == 2  # the history's GPU-hours count each node's two


def test_two_local_nodes_on_one_gpu_run_on_the_cpu_and_say_so_once(tmp_path: Path) -> None:
    shown, seen = local_run(tmp_path, "0", "-n", "2")
    assert shown.count("runs on the CPU with gloo") == 1
    assert "devices= " in seen["LOCAL1"] and "devices= " in seen["LOCAL2"]
    assert "--nproc_per_node=1" in seen["LOCAL1"]


def test_without_gpus_the_environment_is_left_alone(tmp_path: Path) -> None:
    _, seen = local_run(tmp_path, "", "-n", "2")
    assert "devices= " in seen["LOCAL1"]  # "" as it was given: no GPU for anyone
    assert "--nproc_per_node=1" in seen["LOCAL2"]


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not visible_gpus(os.environ), reason="needs a CUDA GPU")
def test_the_readme_job_runs_with_two_local_nodes_on_one_real_gpu(tmp_path: Path) -> None:
    """The first command of the README on a one-GPU machine: it used to stop with NCCL's "Duplicate GPU
    detected"; now it says once what it does, and trains."""
    script = Path(__file__).resolve().parents[1] / "training" / "run_ddp.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_gpus(os.environ)[0]}
    result = run_local(
        "-n", "2", "--mount-point", str(tmp_path / "share"), str(script), "--epochs", "1",
        "--max-steps-per-epoch", "20", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.count("runs on the CPU with gloo") + result.stderr.count("runs on the CPU with gloo")
        == 1
    )
    assert "Duplicate GPU" not in result.stdout + result.stderr
