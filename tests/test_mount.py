"""`hpcjob mount`: the share on the nodes with no password handled by hand, through the emulated head
node (WinRM and REST) and hpcjob's execution filter, which its nodes run at each task start as the Linux
node agent does. The kernel here cannot mount CIFS: the nodes' `mount` and `mountpoint` are stand-ins
that record what they were given (the filter itself is the real one)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcjob.emulator import HeadNode
from hpcjob.store.config import get_profile

from .conftest import Result, linux_user

PASSWORD = "Mount-s3cret; $(id) 'x'"
NODES = ("LOCALHOST", "NODE002", "NODE003")
# The cluster user is this machine's, so that the filter finds the account it mounts for.
USER = linux_user("hpcjob-alice")
GHOST = "hpcjobghost"  # a cluster user with no account on this machine: the agent has not made it yet
# The node is its root folder (HPCJOB_NODE_ROOT=.../nodes/NODE); the filter's environment is PATH
# alone, so $STATE is written into the stand-ins. A node fails while $STATE/fail-NODE exists.
MOUNT = """#!/bin/bash
node=$(basename "$HPCJOB_NODE_ROOT")
printf '%s\\n' "$@" > "$STATE/argv-$node"
[ -e "$STATE/fail-$node" ] && { echo "mount error(112): Host is down" >&2; exit 32; }
touch "$STATE/mounted-$node$(echo "${4#$HPCJOB_NODE_ROOT}" | tr / _)"
"""
MOUNTPOINT = """#!/bin/bash
node=$(basename "$HPCJOB_NODE_ROOT")
[ -e "$STATE/mounted-$node$(echo "${2#$HPCJOB_NODE_ROOT}" | tr / _)" ]
"""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir()
    return folder


@pytest.fixture
def head(tmp_path: Path, state: Path) -> Iterator[HeadNode]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("mount", MOUNT), ("mountpoint", MOUNTPOINT)):
        (bin_dir / name).write_text(text.replace("$STATE", str(state)))
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with HeadNode(users={USER: PASSWORD, GHOST: PASSWORD}, env=env, command_line_limit=None) as started:
        yield started


@pytest.fixture
def hpcjob(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> Callable[..., Result]:
    return cli_with_profile(
        PASSWORD,
        url=head.url,
        user=f"HPC\\{USER}",
        ca_bundle=head.ca_file,
        backend="winrm",
        winrm_url=head.wsman_url,
        share="//HEADNODE/CcpSpoolDir/app",
        mount_point=f"{tmp_path}/app/{USER}",
        node_group="GPUNodes",
    )


def results(result: Result) -> list[tuple[str, str]]:
    return [(r["node"], r["result"]) for r in json.loads(result.out)]


def test_mount_installs_once_then_mounts_then_leaves_mounted_nodes_alone(
    hpcjob: Callable[..., Result], head: HeadNode, state: Path, tmp_path: Path
) -> None:
    before = hpcjob("mount", "--json")
    assert before.code == 1, before.err
    said = json.loads(before.out)
    assert [(r["node"], r["result"]) for r in said] == [(n, "failed") for n in NODES]
    assert "the hpcjob execution filter is not installed on this node" in said[0]["message"]

    installed = hpcjob("mount", "--install", "--json")
    assert installed.code == 0, installed.err
    assert results(installed) == [(n, "mounted") for n in NODES]
    assert "execution filter installed in" in installed.err  # each node said so, through clusrun
    argv = (state / "argv-NODE002").read_text().splitlines()
    assert argv[:5] == ["-t", "cifs", "//HEADNODE/CcpSpoolDir/app", f"{tmp_path}/app/{USER}", "-o"]
    assert argv[5].startswith(f"username={USER},domain=HPC,") and "credentials" not in argv[5]

    again = hpcjob("mount")
    assert again.code == 0, again.err
    assert [line.split()[:3] for line in again.out.splitlines()[1:]] == [
        [n, "already", "mounted"] for n in NODES
    ]


def test_a_node_that_fails_is_named_with_its_own_words_and_the_exit_is_1(
    hpcjob: Callable[..., Result], head: HeadNode, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hpcjob("mount", "--install", "--node", "LOCALHOST").code == 0
    (state / "fail-NODE002").touch()
    assert hpcjob("mount", "--install", "--node", "NODE002", "--node", "NODE003").code == 1
    shown = hpcjob("mount", "--json", "--node", "LOCALHOST", "--node", "NODE002")
    assert shown.code == 1
    assert json.loads(shown.out) == [
        {"node": "LOCALHOST", "result": "already mounted", "message": ""},
        {"node": "NODE002", "result": "failed", "message": "mount error(112): Host is down"},
    ]


def test_no_password_anywhere_but_the_agent_to_filter_handover(
    hpcjob: Callable[..., Result], head: HeadNode, state: Path, tmp_path: Path
) -> None:
    done = hpcjob("mount", "--install")
    assert done.code == 0, done.err
    for path in state.iterdir():
        assert PASSWORD not in path.read_text()  # mount's argv holds a credentials file's name
    assert all(PASSWORD not in line for line in head.wsman.command_lines)
    assert all(PASSWORD not in text for text in head.powershell.scripts_run)
    with head.cluster.lock:
        for job in head.cluster.jobs.values():
            assert PASSWORD not in json.dumps(job.props) + json.dumps(job.env)
            assert all(PASSWORD not in json.dumps(t.props) + json.dumps(t.env) for t in job.tasks)
    assert PASSWORD not in done.out + done.err


def test_over_rest_the_same_mount_and_the_install_as_an_administrators_job(
    hpcjob: Callable[..., Result], head: HeadNode
) -> None:
    installed = hpcjob("mount", "--backend", "rest", "--install", "--json", "--node", "NODE003")
    assert installed.code == 0, installed.err
    assert results(installed) == [("NODE003", "mounted")]


def test_dry_run_prints_the_install_and_the_job_and_sends_nothing(
    hpcjob: Callable[..., Result], head: HeadNode, tmp_path: Path
) -> None:
    dry = hpcjob("mount", "--dry-run", "--install", "--node", "NODE002")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("# would run as root on NODE002") and "base64 -d" in dry.out
    assert f"<Value>//HEADNODE/CcpSpoolDir/app|{tmp_path}/app/{USER}</Value>" in dry.out
    assert len(head.wsman_requests) == 0 and len(head.requests) == 0


def test_a_filter_that_writes_anything_but_the_json_stops_the_task_as_the_agent_does(
    hpcjob: Callable[..., Result], head: HeadNode
) -> None:
    """The agent reads the filter's stdout and stderr together as one JSON value: a filter that says a
    word on stderr (as hpcjob's did before) makes the start fail, and the task never runs."""
    filters = Path(head.cluster.filters_dir("NODE002"))
    filters.mkdir(parents=True)
    (filters / "OnJobTaskStart.sh").write_text("#!/bin/bash\necho 'filter: mounted' >&2\ncat\n")
    (filters / "OnJobTaskStart.sh").chmod(0o755)
    shown = hpcjob("mount", "--json", "--node", "NODE002")
    assert shown.code == 1
    [result] = json.loads(shown.out)
    assert result["result"] == "failed"
    assert "The execution filter OnJobTaskStart.sh answered what is not a task start" in result["message"]


def test_a_users_first_mount_on_a_node_goes_again_once_the_agent_made_their_account(
    hpcjob: Callable[..., Result], head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    """The agent makes a user's account after the filter ran (RemoteExecutor.cpp L37-137), so the first
    mount job of a new user finds none: hpcjob mount sends one more job to such nodes. The emulator
    makes no accounts, so here the second finds none either, and says so."""
    assert hpcjob("mount", "--install", "--node", "NODE002").code == 0
    profile = {k: v for k, v in vars(get_profile("emu")).items() if k not in ("name", "password")}
    ghost = cli_with_profile(
        PASSWORD,
        **{
            **profile,
            "user": f"HPC\\{GHOST}",
            "mount_point": f"{profile['mount_point'].rpartition('/')[0]}/{GHOST}",
        },
    )
    shown = ghost("mount", "--json", "--node", "NODE002")
    assert shown.code == 1
    assert "your account was made just now on NODE002: mounting there again" in shown.err
    [result] = json.loads(shown.out)
    assert result["result"] == "failed" and f"{GHOST} has no account on this node yet" in result["message"]
    with head.cluster.lock:
        assert sum(job.props["Owner"].endswith(GHOST) for job in head.cluster.jobs.values()) == 2
