"""Profiles whose nodes are all this machine (`nodes_here`, what `hpcjob emulator`'s profile lines say):
each job's rendezvous on a free port of its own; the emulator's lines never take over a default profile;
`run` without --local says what is wrong with a broken default profile (doctor's rendezvous port check:
tests/test_doctor_checks.py)."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcjob.backends.local import KEPT_CLEAR, PICKED_PORTS_FROM
from hpcjob.emulator import HeadNode
from hpcjob.emulator.cli import profile_command
from hpcjob.emulator.tls import make_certificate
from hpcjob.job.options import JobOptions
from hpcjob.job.spec import DEFAULT_RDZV_PORT
from hpcjob.runner import with_profile
from hpcjob.store.config import ClusterProfile, get_profile, load_config

from .conftest import Result, empty_script

PASSWORD = "emu-Pw-3"


@pytest.fixture(autouse=True)
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "clusters.toml"
    monkeypatch.setenv("HPCJOB_CONFIG", str(path))
    monkeypatch.delenv("HPCJOB_CLUSTER", raising=False)
    return path


def hpcjob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("hpcjob: error: "), result.stderr
    return result.stderr.removeprefix("hpcjob: error: ").rstrip("\n")


# `run` without --local on a broken default profile


def test_run_without_local_names_what_is_wrong_with_the_default_profile(
    config_file: Path, tmp_path: Path
) -> None:
    """A stopped emulator's CA file gone: the profile's fault is named, not "none is configured"."""
    gone = tmp_path / "hpcjob-emulator-x" / "head.crt"
    config_file.write_text(
        f'default = "emu"\n[clusters.emu]\nurl = "https://127.0.0.1:9"\nuser = "alice"\n'
        f'ca_bundle = "{gone}"\n'
    )
    script = empty_script(tmp_path)
    said = one_line_error(hpcjob("run", "-n", "1", str(script)))
    assert said == f"{config_file}: cluster emu: ca_bundle {str(gone)!r}: no such file"


# The emulator's profile lines and the default


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_certificate(str(tmp_path_factory.mktemp("pki")))[0]


def emulator_line(ca_file: str, share: Path, *more: str) -> list[str]:
    """The arguments of the `hpcjob cluster add` line `hpcjob emulator` prints."""
    line = profile_command("emulator", "https://127.0.0.1:40837/hpc", "alice", ca_file, str(share), None)
    words = shlex.split(line)
    assert words[:3] == ["hpcjob", "cluster", "add"]
    return [*words[1:], *more]


LAB = '[clusters.lab]\nurl = "https://lab"\nuser = "alice"\n'
WORK = '[clusters.work]\nurl = "https://work"\nuser = "alice"\n'


@pytest.mark.parametrize(
    ("before", "more", "default"),
    [
        (LAB, (), "lab"),  # the only profile is the default without being named: it stays so
        (f'default = "work"\n{LAB}{WORK}', (), "work"),
        ("", (), "emulator"),  # none yet
        (f"{LAB}{WORK}", (), "emulator"),  # several and none the default: none yet
        (LAB, ("--default",), "emulator"),  # asked for
    ],
)
def test_the_emulators_profile_lines_take_the_default_only_where_asked_or_there_is_none(
    config_file: Path, tmp_path: Path, ca_file: str, before: str, more: tuple[str, ...], default: str
) -> None:
    if before:
        config_file.write_text(before)
    added = hpcjob(*emulator_line(ca_file, tmp_path, *more))
    assert added.returncode == 0, added.stderr
    profiles, chosen = load_config()
    assert chosen == default
    assert profiles["emulator"].nodes_here is True
    assert f"default = {default!r}".replace("'", '"') in config_file.read_text()


def test_nodes_here_is_written_only_when_given(config_file: Path) -> None:
    assert hpcjob("cluster", "add", "lab", "--url", "https://lab", "--user", "alice").returncode == 0
    assert "nodes_here" not in config_file.read_text() and get_profile("lab").nodes_here is None
    assert "--nodes-here" in hpcjob("cluster", "add", "--help").stdout


# The rendezvous port of a profile whose nodes are here


def profile(**changes: object) -> ClusterProfile:
    return ClusterProfile(name="p", url="https://head", user="alice", **changes)  # type: ignore[arg-type]


def picked(port: object) -> bool:
    """A port as free_port picks them: below the ephemeral range, clear of hpcjob's defaults."""
    return isinstance(port, int) and port >= PICKED_PORTS_FROM and port not in KEPT_CLEAR


def test_a_job_on_nodes_here_without_a_port_gets_a_free_one() -> None:
    port = with_profile(JobOptions("x.py"), profile(nodes_here=True)).rdzv_port
    assert picked(port) and port != DEFAULT_RDZV_PORT
    with socket.socket() as sock:
        sock.bind(("", port))  # free when picked


@pytest.mark.parametrize(
    ("options", "changes", "port"),
    [
        ({"rdzv_port": 30001}, {"nodes_here": True, "rdzv_port": 30002}, 30001),  # the command line's
        ({}, {"nodes_here": True, "rdzv_port": 30002}, 30002),  # the profile's
        ({}, {}, None),  # a profile without the key: unchanged, the spec's default
        ({}, {"rdzv_port": 30002}, 30002),
    ],
)
def test_a_port_given_and_a_profile_without_nodes_here_are_kept(
    options: dict[str, object], changes: dict[str, object], port: int | None
) -> None:
    assert with_profile(JobOptions("x.py", **options), profile(**changes)).rdzv_port == port  # type: ignore[arg-type]


@pytest.fixture
def head() -> Iterator[HeadNode]:
    with HeadNode(users={"alice": PASSWORD}) as started:
        yield started


def endpoint_port(head: HeadNode, job_id: int) -> int:
    """The rendezvous port in the CommandLine of the job's first task, as the head node has it."""
    command = head.cluster.task(job_id, 1).props["CommandLine"]
    found = re.search(r"--rdzv_endpoint=\S*?:([0-9]+)", command)
    assert found, command
    return int(found.group(1))


def submitted_job(hpcjob: Callable[..., Result], script: Path, run_id: str) -> int:
    result = hpcjob("submit", "--no-mount-step", "-n", "1", "--run-id", run_id, str(script))
    assert result.code == 0, result.err
    found = re.search(r"submitted job ([0-9]+)", result.out)
    assert found, result.out
    return int(found.group(1))


@pytest.mark.parametrize("nodes_here", [True, False])
def test_two_jobs_on_the_emulator_take_29400_only_without_nodes_here(
    head: HeadNode,
    cli_with_profile: Callable[..., Callable[..., Result]],
    tmp_path: Path,
    nodes_here: bool,
) -> None:
    """Jobs submitted through the emulated head node, as its profile lines make them: with nodes_here,
    each job's rendezvous is on a port of its own, not 29400; without, both take 29400 as before."""
    share = tmp_path / "share"
    share.mkdir()
    hpcjob = cli_with_profile(
        PASSWORD,
        url=head.url,
        user="alice",
        ca_bundle=head.ca_file,
        local_share=str(share),
        mount_point=str(share),
        **({"nodes_here": True} if nodes_here else {}),
    )
    script = empty_script(tmp_path)
    ports = [endpoint_port(head, submitted_job(hpcjob, script, f"exp-{n}")) for n in (1, 2)]
    if nodes_here:
        assert all(picked(port) for port in ports), ports
    else:
        assert ports == [DEFAULT_RDZV_PORT, DEFAULT_RDZV_PORT]
