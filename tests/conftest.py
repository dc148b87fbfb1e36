"""Shared fixtures: the repository layout, golden files, a job spec like the README's, the CLI run in this
process with a cluster profile."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hpcjob.job.spec import JobSpec, parse_share

if TYPE_CHECKING:
    from .test_rest_e2e import Cluster

PROFILE_PASSWORD_ENV = "EMU_PW"

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
# Copies of the public HPC Pack material the tests need, with their sources (tests/reference/README.md).
REFERENCE = Path(__file__).resolve().parent / "reference"
# The team's reference beside the checkout, when there: the copies are compared with it.
SHARED_REFERENCE = REPO.parent / "shared" / "reference"
RUN_ID = "run_ddp-20261122-000000-abcd"
# The one image tests/fake_docker.py has (`fake_docker`).
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
FAKE_DOCKER = Path(__file__).resolve().parent / "fake_docker.py"
# The profiles' poll_interval in the tests: the emulated head node is on this machine, and its jobs of
# stand-in nodes end within a second, so following them is asked every quarter second.
POLL_S = 0.25


def linux_user(name: str) -> str:
    """A real account of this machine that is not root, for a cluster user whose jobs the node agent runs
    as that account: `name`, made here when the tests run as root (the account stays, as the agent's do),
    else the user running the tests. The agent runs a user named root as hpc_faked_root, never as root."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    for _ in range(50):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
        made = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], capture_output=True)
        if made.returncode in (0, 9):  # 9: made meanwhile by another test worker
            return name
        time.sleep(0.1)  # 10: another worker holds /etc/passwd's lock
    raise RuntimeError(f"useradd {name} failed: {made.stderr.decode(errors='replace').strip()}")


def pytest_configure(config: pytest.Config) -> None:
    """The tests' jobs are processes of this one machine: every local and emulated node shares its cores.
    One compute thread each (what torchrun gives each of several ranks on a node), rather than each
    node's ranks taking every core and spinning idle OpenMP threads against the others'."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads -n
def pytest_cmdline_main(config: pytest.Config) -> None:
    """With pytest-xdist: a worker per core and one more (`-n auto`), each taking the next test when it
    is done with one (`--maxschedchunk 1`), the slow ones first (pytest_collection_modifyitems): the
    longest are spread over the workers, not queued on one. Where the command line says otherwise (`-n`,
    `-n 0` for none, `-p no:xdist`), or xdist is not installed, its word stands: the tests run either way.
    """
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):  # not in a worker
        return
    if config.option.numprocesses is None:
        config.option.numprocesses = "auto"
    if config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: a worker more than this machine has cores. The end-to-end tests wait on their jobs' polls
    and processes a good part of their time; the extra worker keeps the cores busy meanwhile. xdist's own
    count where asked for: $PYTEST_XDIST_AUTO_NUM_WORKERS, or `-n logical`."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.option.numprocesses == "logical":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow end-to-end tests first: the workers start the longest ones at once and fill the rest in
    around them, instead of one worker finishing alone on a long test at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs recorded, local shares, cached prices and the nodes' environments (~/.cache/hpcjob/envs) made
    by tests stay out of the user's home; and no test asks the real Azure Retail Prices API (a port
    where nothing listens: its tests point HPCJOB_PRICES_URL at a server of their own)."""
    home = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("HPCJOB_PRICES_URL", "http://127.0.0.1:9/api/retail/prices")
    (home / "home").mkdir()
    monkeypatch.setenv("HOME", str(home / "home"))


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare text with tests/golden/NAME whole; HPCJOB_UPDATE_GOLDEN=1 rewrites the file."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if os.environ.get("HPCJOB_UPDATE_GOLDEN") == "1" or not path.exists():
            path.write_text(text, encoding="utf-8")
            if os.environ.get("HPCJOB_UPDATE_GOLDEN") != "1":
                pytest.fail(f"golden file {name} did not exist and was written: review it and rerun")
        assert text == path.read_text(encoding="utf-8"), (
            f"{name} differs from the golden file; if intended, rerun with HPCJOB_UPDATE_GOLDEN=1"
        )

    return check


def cluster_spec(nodes: int, **overrides: object) -> JobSpec:
    """A GPU job as a user would ask for it on a cluster of GPUNODE001...GPUNODEnnn."""
    fields: dict[str, object] = {
        "script": "training/run_ddp.py",
        "script_args": ("--epochs", "5", "--data", "fashion-mnist", "--data-root", "/app/data"),
        "node_names": tuple(f"GPUNODE{i:03d}" for i in range(1, nodes + 1)),
        "node_group": "GPUNodes",
        "gpus_per_node": 4,
        "share": parse_share("//HEADNODE/CcpSpoolDir/app"),
        "env": (("NCCL_DEBUG", "WARN"),),
    }
    fields.update(overrides)
    return JobSpec(**fields)  # type: ignore[arg-type]


def stand_in_python(folder: Path, shell: str) -> Path:
    """A stand-in for the nodes' Python (`--python`): a shell script that a task's command line runs
    in its place, so that a local run tests hpcjob's side in a second, without torch."""
    path = folder / "bin" / "python-stand-in"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{shell}\n")
    path.chmod(0o755)
    return path


def empty_script(folder: Path, relative: str = "code/train.py") -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def run_local(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hpcjob run --local ARGS` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@dataclass
class Result:
    """What `hpcjob ARGS` did: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str


@pytest.fixture
def cli_with_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Callable[..., Result]]:
    """`cli_with_profile(password, **profile)`: saves the cluster profile `emu` (the default, its
    password in $EMU_PW, polled every POLL_S unless `profile` says) and returns a runner of `hpcjob ARGS`
    in this process."""
    from hpcjob.cli.app import main
    from hpcjob.store.config import ClusterProfile, save_profile

    def make(password: str, **profile: Any) -> Callable[..., Result]:
        monkeypatch.setenv("HPCJOB_CONFIG", str(tmp_path / "clusters.toml"))
        monkeypatch.setenv(PROFILE_PASSWORD_ENV, password)
        monkeypatch.delenv("HPCJOB_CLUSTER", raising=False)
        save_profile(
            ClusterProfile(
                name="emu", password=f"env:{PROFILE_PASSWORD_ENV}", **{"poll_interval": POLL_S, **profile}
            ),
            make_default=True,
        )

        def run(*args: str) -> Result:
            capsys.readouterr()
            monkeypatch.setattr(sys, "argv", ["hpcjob", *args])
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
            out, err = capsys.readouterr()
            return Result(code, out, err)

        return run

    return make


@pytest.fixture
def fake_docker(tmp_path: Path) -> dict[str, str]:
    """docker on PATH, with one image: this machine's Python as the image's, under another PATH."""
    bin_dir = tmp_path / "docker-bin"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_DOCKER} "$@"\n')
    shim.chmod(0o755)
    image_bin = tmp_path / "image-bin"  # the image's own PATH: its python3, and the usual tools
    image_bin.mkdir()
    (image_bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # its own name
    (image_bin / "python3").chmod(0o755)
    images = tmp_path / "images.json"
    images.write_text(
        json.dumps({IMAGE: {"env": {"PATH": f"{image_bin}:/usr/bin:/bin", "IMAGE_SAYS": "inside"}}})
    )
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DOCKER_IMAGES": str(images),
        "FAKE_DOCKER_STATE": str(tmp_path / "containers"),
        "FAKE_DOCKER_LOG": str(tmp_path / "docker.log"),
    }


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The emulated head node and alice's profile, for this process (what runs through the API here)."""
    from .test_rest_e2e import emulated_cluster

    for cluster in emulated_cluster(tmp_path):
        for name in ("HPCJOB_CONFIG", "EMU_PW", "HPCJOB_SMB_PASSWORD"):
            monkeypatch.setenv(name, cluster.env[name])
        yield cluster
