"""hpcjob's execution filter, run as HPC Pack's Linux node agent runs it: installed by its install
command (its own files, lock and log under an emulated node's root, HPCJOB_NODE_ROOT), started with PATH
alone from a /dev/shm folder, a task start's JSON on stdin, its stdout and stderr read together and
parsed whole as JSON. The kernel here cannot mount CIFS: `mount` and `mountpoint` are stand-ins that
record what they were given (the filter itself is the real one). The mount root is a folder of the test's
own; the job owner is this machine's own user, so that the filter finds the account it mounts for."""

from __future__ import annotations

import ast
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hpctorch
from hpcjob.job.plan import CONTAINER_OPTIONS, AllowedShare, ContainerPolicy, user_mount_point
from hpcjob.job.render.job_xml import MOUNT_CHECK
from hpcjob.job.render.text import CHAINED_SUFFIX, filter_config, filter_install_command
from hpcjob.job.spec import SpecError
from hpcjob.node import mount_filter

from .conftest import linux_user

PASSWORD = "Own3r-pw; $(reboot) 'x'"  # whatever it holds, it reaches mount only inside a root-only file
USER = linux_user("hpcjob-alice")
OWNER = f"HPC\\{USER}"
SHARE = "//HEADNODE/CcpSpoolDir/app"
FILTERS = mount_filter.FILTERS_DIR.lstrip("/")
# mount -t cifs UNC POINT -o OPTIONS, the password on the pipe PASSWD_FD names (mount.cifs(8)): records
# argv, the password as read and its environment, and marks the point mounted; $STATE is written in
# when the node is made (the agent gives a filter PATH alone).
MOUNT = """#!/bin/bash
printf '%s\\n' "$@" > "$STATE/argv"
cat <&"$PASSWD_FD" > "$STATE/password"; env > "$STATE/env"
[ -e "$STATE/hang" ] && sleep 60
[ -e "$STATE/fail" ] && { echo "mount error(13): Permission denied" >&2; exit 32; }
touch "$STATE/mounted$(echo "$4" | tr / _)"
"""
MOUNTPOINT = '#!/bin/bash\n[ -e "$STATE/mounted$(echo "$2" | tr / _)" ]\n'

Run = Callable[..., subprocess.CompletedProcess[bytes]]


class Node:
    """An emulated node: its root folder, the stand-ins on its PATH, and the agent's way of running a
    filter (PATH alone, /dev/shm, stdout and stderr merged)."""

    def __init__(self, tmp: Path) -> None:
        self.root, self.state, self.bin = tmp / "node", tmp / "state", tmp / "bin"
        for folder in (self.root, self.state, self.bin):
            folder.mkdir()
        self.mount_root = tmp / "app"  # made by the filter, as root
        self.allowed = AllowedShare.checked(SHARE, str(self.mount_root), "vers=3.0")
        self.point = user_mount_point(str(self.mount_root), OWNER)
        for name, text in (("mount", MOUNT), ("mountpoint", MOUNTPOINT)):
            (self.bin / name).write_text(text.replace("$STATE", str(self.state)))
            (self.bin / name).chmod(0o755)
        self.path = f"{self.bin}:{os.environ['PATH']}"
        self.filters = self.root / FILTERS

    def shell(self, script: str) -> subprocess.CompletedProcess[bytes]:
        """`script` run by an administrator on the node (the install command)."""
        env = {"PATH": self.path, mount_filter.NODE_ROOT_VAR: str(self.root)}
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=30)

    def install(self, *shares: AllowedShare, timeout_s: float | None = None) -> None:
        done = self.shell(filter_install_command(shares or (self.allowed,)))
        assert done.returncode == 0, done.stderr
        if timeout_s is not None:
            config = json.loads((self.filters / mount_filter.CONFIG_FILE).read_text())
            (self.filters / mount_filter.CONFIG_FILE).write_text(
                json.dumps({**config, "timeout_s": timeout_s})
            )

    def start(
        self,
        request: bytes | str,
        event: str = "OnJobTaskStart",
        path: str | None = None,
        code: int | None = 0,
    ) -> bytes:
        """The agent's call: the whole merged output, which must be the JSON and nothing else. SIGPIPE
        ignored, as the agent leaves it where its daemon is a Python 2 program (CentOS 7's hpcagent).
        `code`: the exit code it must end with; None: either."""
        data = request.encode() if isinstance(request, str) else request
        env = {"PATH": path or self.path, mount_filter.NODE_ROOT_VAR: str(self.root)}
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        done = subprocess.run(
            ["/bin/bash", "-c", str(self.filters / f"{event}.sh")],  # named by cmd.sh: run as a program
            input=data,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
            timeout=60,
            restore_signals=False,
            preexec_fn=lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN),
        )
        assert code is None or done.returncode == code, done.stdout
        return done.stdout

    def result(
        self,
        env: dict[str, str] | None = None,
        event: str = "OnJobTaskStart",
        owner: str = OWNER,
        job: int = 7,
    ) -> str:
        answer = json.loads(
            self.start(task_start(self.asking() if env is None else env, owner, event, job), event)
        )
        variables: dict[str, str] = answer["m_Item2"]["environmentVariables"]
        return variables.get(mount_filter.RESULT_VAR, "")

    def asking(self, point: str | None = None, share: str = SHARE) -> dict[str, str]:
        return {mount_filter.REQUEST_VAR: f"{share}|{point or self.point}"}

    def log(self) -> str:
        path = self.root / mount_filter.LOG_FILE.lstrip("/")
        return path.read_text() if path.exists() else ""

    def leaked(self) -> list[str]:
        """Where the password is to be found on the node, the stand-ins' records of the credentials
        file (which stands for the root-only file mount.cifs reads) aside."""
        places = [p for p in self.root.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
        places += [p for p in self.state.iterdir() if p.name != "password" and PASSWORD in p.read_text()]
        return [str(p) for p in places]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def task_start(env: dict[str, str], owner: str = OWNER, event: str = "OnJobTaskStart", job: int = 7) -> str:
    """A task start as the agent gives it: the owner's name and password at a job's first task on the
    node (startjobandtask, OnJobTaskStart.sh), m_Item1 and m_Item2 alone at its later tasks (starttask,
    OnTaskStart.sh). LinuxCommunicator.cs L287-357, StartTaskArgs.cpp L13-21."""
    start: dict[str, Any] = {
        "m_Item1": {"JobId": job, "ResIds": [1], "TaskId": 1},
        "m_Item2": {"commandLine": "hostname", "environmentVariables": env, "workingDirectory": "/tmp"},
    }
    if event == "OnJobTaskStart":
        start.update(m_Item3=owner, m_Item4=PASSWORD, m_Item5=None, m_Item6=None)
    return json.dumps(start)


def test_the_filter_mounts_the_owners_own_folder_with_their_credentials_and_nothing_else_leaves_it(
    node: Node,
) -> None:
    node.install()
    answer = node.start(task_start(node.asking()))
    start = json.loads(answer)  # the whole output, stderr included, is the one JSON value
    assert start["m_Item2"]["environmentVariables"][mount_filter.RESULT_VAR] == "mounted"
    argv = (node.state / "argv").read_text().splitlines()
    account = pwd.getpwnam(USER)
    assert argv[:5] == ["-t", "cifs", SHARE, node.point, "-o"]
    assert argv[5].split(",") == [
        f"username={USER}",
        "domain=HPC",
        "vers=3.0",
        *["nosuid", "nodev", "nounix", "forceuid", "forcegid", "file_mode=0700", "dir_mode=0700"],
        f"uid={account.pw_uid}",
        f"gid={account.pw_gid}",
    ]
    assert (node.state / "password").read_text() == PASSWORD  # through the pipe, never a file or argv
    assert PASSWORD not in (node.state / "env").read_text()
    assert node.leaked() == [] and sorted(p.name for p in (node.root / "run" / "hpcjob").iterdir()) == [
        "jobs", "mount.lock"
    ]  # fmt: skip
    assert "mounted" in node.log() and PASSWORD not in node.log()
    assert stat.S_IMODE((node.root / mount_filter.LOG_FILE.lstrip("/")).stat().st_mode) == 0o600
    assert node.result() == "already mounted"


def test_the_local_disks_result_reaches_the_task_beside_the_share_s(node: Node, tmp_path: Path) -> None:
    """Where the administrator's file names local disks, each task start says what the filter did with
    them (here: no such disk on this machine), and the share is mounted all the same; the mount job's
    task says it before its own line, and `hpcjob mount` shows it."""
    from hpcjob.backends.scheduler import mount_results
    from hpcjob.job.results import JobInfo, State, TaskInfo

    point = tmp_path / "nvme"
    done = node.shell(filter_install_command((node.allowed,), None, str(point)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip().endswith(f"with no container policy, its free NVMe disks at {point}")
    answer = json.loads(node.start(task_start(node.asking())))["m_Item2"]["environmentVariables"]
    assert answer[mount_filter.RESULT_VAR] == "mounted"
    said = f"failed: no free disk matches {mount_filter.NVME_DEVICES} to assemble at {point}"
    assert answer[mount_filter.LOCAL_DISK_RESULT_VAR] == said
    assert "local disks: " + said in node.log()
    check = subprocess.run(["bash", "-c", MOUNT_CHECK], env={**answer, "PATH": os.environ["PATH"]},
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0 and check.stdout.splitlines() == ["local disks: " + said, "mounted"]
    task = TaskInfo(1, "mount NODE1", State.FINISHED, 0, "NODE1")
    info = JobInfo("7", "mount", State.FINISHED, "", (task,))
    assert mount_results(info, [("NODE1", check.stdout)])[0].message == "local disks: " + said
    with pytest.raises(ValueError, match="is not a pattern of devices below /dev"):
        mount_filter.check_local_disks({"mount": "/mnt/nvme", "devices": "/etc/../dev/sda"})


@pytest.mark.parametrize(
    ("request_value", "why"),
    [
        ("//EVIL/share|{point}", "not a share the administrator allowed"),
        (f"{SHARE}|/etc", f"mount point for {SHARE} is {{point}}"),
        (f"{SHARE}|/root", "mount point"),
        (f"{SHARE}|/usr/bin", "mount point"),
        (f"{SHARE}|{mount_filter.FILTERS_DIR}", "mount point"),
        (f"{SHARE}|{{point}}/../someoneelse", "mount point"),
        (f"{SHARE}|{{point}}/../../etc", "mount point"),
        (f"{SHARE}|{{point}}|suid,exec", "the options are the administrator's"),
        (f"{SHARE}|{{point}}|credentials=/etc/shadow", "the options are the administrator's"),
        (f"{SHARE}|{{point}},suid", "mount point"),
        (f"{SHARE}|{{point}}|", "the options are the administrator's"),
    ],
)
def test_a_hostile_request_is_refused_in_one_line_with_nothing_mounted_and_nothing_leaked(
    node: Node, request_value: str, why: str
) -> None:
    node.install()
    result = node.result({mount_filter.REQUEST_VAR: request_value.format(point=node.point)})
    assert result.startswith("failed: ") and why.format(point=node.point) in result and "\n" not in result
    assert not (node.state / "argv").exists()  # mount never ran
    assert not node.mount_root.exists() and node.leaked() == []


def test_a_second_user_never_gets_the_first_users_mount(node: Node) -> None:
    """Another user's job asking for this user's folder is refused, and its own folder is its own."""
    node.install()
    assert node.result() == "mounted"
    refused = node.result(None, owner="HPC\\mallory")
    assert (
        refused
        == f"failed: the mount point for {SHARE} is {node.mount_root}/mallory for mallory, not {node.point}"
    )
    mine = node.result(node.asking(f"{node.mount_root}/mallory"), owner="HPC\\mallory")
    assert mine.startswith(f"failed: mallory {mount_filter.NO_ACCOUNT_YET}: the node agent makes it")


def test_a_mount_point_reached_through_a_symlink_is_refused(node: Node) -> None:
    node.install()
    etc = node.root / "etc"
    etc.mkdir()
    node.mount_root.symlink_to(etc)
    result = node.result()
    assert result == f"failed: {node.mount_root} is a symlink: the filter never mounts through one"
    assert not (node.state / "argv").exists() and list(etc.iterdir()) == []


def test_a_mount_root_others_may_change_is_refused(node: Node) -> None:
    node.install()
    node.mount_root.mkdir()
    node.mount_root.chmod(0o777)  # anyone could swap the user's folder for a symlink before the mount
    assert node.result() == f"failed: {node.mount_root} may be changed by others than root"


@pytest.mark.parametrize(
    ("options", "root"),
    [("sec=krb5", "/app"), ("vers=1.0", "/app"), ("hard", "/app"), ("unix", "/app"),
     ("vers=3.0,suid", "/app"), ("credentials=/x", "/app"), ("uid=0", "/app"), ("vers=3.0", "/etc"),
     ("vers=3.0", "/opt/hpcnodemanager/filters"), ("vers=3.0", "/"), ("vers=3.0", "/app/../etc"),
     ("noperm", "/app"), ("multiuser", "/app")],
)  # fmt: skip
def test_the_install_refuses_a_share_the_filter_would_refuse(options: str, root: str) -> None:
    with pytest.raises(SpecError, match="execution filter would refuse this share"):
        AllowedShare.checked(SHARE, root, options)


def test_a_hand_edited_or_loose_config_is_not_trusted(node: Node) -> None:
    node.install()
    config = node.filters / mount_filter.CONFIG_FILE
    entry = {"unc": SHARE, "mount_root": "/app", "options": "vers=3.0,suid"}
    config.write_text(json.dumps({"shares": [entry]}))
    assert "'suid' is not one the filter allows" in node.result()
    config.write_text(filter_config([node.allowed]))
    config.chmod(0o666)
    assert node.result() == f"failed: {config} is not root's alone: the filter ignores it"
    assert not (node.state / "argv").exists()


def test_a_failed_mount_is_said_to_the_task_in_the_nodes_words(node: Node) -> None:
    node.install()
    (node.state / "fail").touch()
    assert node.result() == "failed: mount error(13): Permission denied"


def test_a_mount_that_hangs_ends_within_the_administrators_bound(node: Node) -> None:
    node.install(timeout_s=2)
    (node.state / "hang").touch()
    began = time.monotonic()
    result = node.result()
    assert time.monotonic() - began < 10
    assert result.startswith(f"failed: mount of {SHARE} gave no answer in ")
    assert sorted(p.name for p in (node.root / "run" / "hpcjob").iterdir()) == ["jobs", "mount.lock"]


def test_a_lock_held_elsewhere_or_a_lock_folder_others_can_enter_never_stalls_the_filter(node: Node) -> None:
    node.install(timeout_s=2)
    run_dir = node.root / "run" / "hpcjob"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o777)  # a folder any user's task could have made, to hold or plant the lock in
    began = time.monotonic()
    assert node.result() == "failed: /run/hpcjob is not root's alone: the filter will not use it"
    run_dir.chmod(0o700)
    holder = subprocess.Popen(
        ["python3", "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a'); fcntl.flock(f, 2); time.sleep(30)",
         str(run_dir / "mount.lock")],
    )  # fmt: skip
    try:
        time.sleep(0.5)
        assert node.result() == "failed: another mount on this node held the lock too long"
    finally:
        holder.kill()
        holder.wait()
    assert time.monotonic() - began < 15
    assert node.result() == "mounted"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_mount_point_another_user_made_in_a_sticky_root_is_refused(node: Node) -> None:
    """Under a folder like /tmp (sticky, anyone may add) others cannot touch root's folders, so a mount
    root that root made there is safe; but another user can make the owner's folder first, as their own:
    the filter mounts only on a folder root made, and the mount root itself may not be open to others."""
    node.install()
    node.mount_root.mkdir()
    Path(node.point).mkdir()
    os.chown(node.point, 65534, 65534)
    assert node.result() == f"failed: {node.point} may be changed by others than root"
    assert not (node.state / "argv").exists()
    node.mount_root.chmod(0o1777)
    assert node.result() == f"failed: {node.mount_root} may be changed by others than root"
    node.mount_root.chmod(0o755)
    os.chown(node.point, 0, 0)
    assert node.result() == "mounted"


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's symlink needs root to make")
def test_another_users_symlink_in_an_open_mount_root_is_never_already_mounted(node: Node) -> None:
    """The mount root /tmp (`--mount-point /tmp/<user>`): another user's symlink /tmp/<victim> -> /dev/shm,
    and the system's `mountpoint`, which follows it to a real mount, says "mounted". The install refuses
    such a root, a filter installed before refuses it too, and a link is never already mounted."""
    (node.bin / "mountpoint").unlink()  # the system's own, which follows links
    mallory = pwd.getpwnam(linux_user("hpcjob-mallory"))
    node.mount_root.mkdir(mode=0o1777)
    node.mount_root.chmod(0o1777)
    refused = node.shell(filter_install_command([node.allowed]))
    assert refused.returncode != 0 and not node.filters.joinpath(mount_filter.CONFIG_FILE).exists()
    assert refused.stdout.decode().strip().endswith(f"{node.mount_root} may be changed by others than root")
    assert {p.name for p in node.filters.iterdir()} == set()  # nothing half-installed
    node.mount_root.chmod(0o755)
    node.install()
    node.mount_root.chmod(0o1777)  # opened after the install
    Path(node.point).symlink_to("/dev/shm")
    os.lchown(node.point, mallory.pw_uid, mallory.pw_gid)
    assert node.result() == f"failed: {node.mount_root} may be changed by others than root"
    node.mount_root.chmod(0o755)  # an administrator's folder, and a link in it made before
    os.lchown(node.point, 0, 0)
    assert node.result() == f"failed: {node.point} is a symlink: the filter never mounts through one"
    assert not (node.state / "argv").exists()


def test_the_mount_point_is_an_empty_folder_and_never_a_system_one(node: Node) -> None:
    """A user named like a folder root uses (mount root /opt, user hpcnodemanager) never gets their share
    over it, and a folder that holds files is never hidden under a mount."""
    node.install(AllowedShare.checked(SHARE, "/opt", "vers=3.0"))
    asked = {mount_filter.REQUEST_VAR: f"{SHARE}|/opt/hpcnodemanager", "CCP_ISADMIN": "1"}
    refused = node.result(asked, owner="HPC\\hpcnodemanager")
    assert refused == "failed: mount point /opt/hpcnodemanager is a system folder"
    node.install()
    Path(node.point).mkdir(parents=True)
    (Path(node.point) / "kept.txt").write_text("x")
    assert node.result() == f"failed: {node.point} is not empty: the filter mounts only on an empty folder"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_lock_folder_of_another_user_is_refused(node: Node) -> None:
    node.install()
    run_dir = node.root / "run" / "hpcjob"
    run_dir.mkdir(parents=True, mode=0o700)
    os.chown(run_dir, 65534, 65534)
    assert node.result() == "failed: /run/hpcjob is not root's alone: the filter will not use it"


def test_a_later_task_of_the_job_has_no_password_and_says_so_or_finds_the_mount(node: Node) -> None:
    """OnTaskStart names no owner: the filter takes the one it recorded at the job's first task here."""
    node.install()
    result = node.result(None, event="OnTaskStart")
    assert result == (
        "failed: job 7 started no task here with its owner named, so the filter does not know whose "
        "mount this task may use"
    )
    (node.state / "fail").touch()
    assert node.result() == "failed: mount error(13): Permission denied"
    result = node.result(None, event="OnTaskStart")
    assert result.startswith(
        f"failed: {node.point} is not mounted, and the node agent hands the owner's password"
    )
    (node.state / "fail").unlink()
    assert node.result() == "mounted"
    assert node.result(None, event="OnTaskStart") == "already mounted"


@pytest.mark.skipif(os.geteuid() != 0, reason="a second real account needs root to make")
def test_a_later_task_gets_the_recorded_owners_mount_never_the_one_its_path_names(node: Node) -> None:
    """Before, the owner of a later task was read from the mount point it named: another user's job
    naming Alice's folder got "already mounted", and ran there."""
    mallory = linux_user("hpcjob-mallory")
    node.install()
    assert node.result() == "mounted"  # Alice's job 7
    theirs = node.result(owner=f"HPC\\{mallory}", job=8)  # their first task here: named, and recorded
    assert theirs.startswith(
        f"failed: the mount point for {SHARE} is {node.mount_root}/{mallory} for {mallory}"
    )
    assert node.result(event="OnTaskStart", job=8) == (
        f"failed: the mount point for {SHARE} is {node.mount_root}/{mallory} for {mallory}, not {node.point}"
    )
    records = node.root / "run" / "hpcjob" / "jobs"
    assert stat.S_IMODE(records.stat().st_mode) == 0o700 and sorted(p.name for p in records.iterdir()) == [
        "7.json", "8.json"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("admin", "as_root"),
    [({"CCP_ISADMIN": "1"}, True), ({"CCP_ISADMIN": "1", "CCP_MAP_ADMIN_USER": "1"}, False)],
)
def test_the_mounts_owner_is_who_the_agent_runs_the_task_as(
    node: Node, admin: dict[str, str], as_root: bool
) -> None:
    """RemoteExecutor.cpp L42-62: an administrator's task runs as root, unless CCP_MAP_ADMIN_USER=1."""
    node.install()
    assert node.result({**node.asking(), **admin}) == "mounted"
    account = pwd.getpwnam(USER)
    uid, gid = (0, 0) if as_root else (account.pw_uid, account.pw_gid)
    assert (node.state / "argv").read_text().splitlines()[5].endswith(f",uid={uid},gid={gid}")


def test_a_user_named_root_is_never_mounted_for_as_root(node: Node) -> None:
    """The agent runs a user named root (not an administrator) as hpc_faked_root (RemoteExecutor.cpp
    L56-69), an account this machine has not got."""
    node.install()
    asked = {mount_filter.REQUEST_VAR: f"{SHARE}|{node.mount_root}/root"}
    assert node.result(asked, owner="HPC\\root") == (
        f"failed: root {mount_filter.NO_ACCOUNT_YET}: the node agent makes it when their first job starts "
        "there"
    )
    assert not (node.state / "argv").exists()


@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity"])
def test_a_number_json_cannot_carry_back_leaves_the_start_as_the_agent_wrote_it(
    node: Node, number: str
) -> None:
    node.install()
    start = task_start(node.asking()).replace('"ResIds": [1]', f'"ResIds": [{number}]')
    assert node.start(start) == start.encode()
    assert not (node.state / "argv").exists()


def test_a_refusal_keeps_its_reason_whatever_the_job_names(node: Node) -> None:
    node.install()
    long_point = str(node.mount_root) + "/" + "x" * 1000
    result = node.result(node.asking(long_point))
    assert result.startswith(f"failed: the mount point for {SHARE} is {node.point} for {USER}, not ")
    assert len(result) <= len("failed: ") + 300 and "x" * (mount_filter.SHOWN + 1) not in result
    result = node.result(node.asking(share="//EVIL/" + "s" * 1000))
    assert result.startswith(f"failed: not a share the administrator allowed on this node (allowed: {SHARE})")
    too_long = "a" * 33  # past useradd's 32: no account the agent could make
    assert node.result(node.asking(f"{node.mount_root}/{too_long}"), owner=f"HPC\\{too_long}") == (
        "failed: the node agent named no job owner for this task"
    )


def test_a_job_without_a_share_and_what_is_not_a_task_start_pass_through_byte_for_byte(node: Node) -> None:
    node.install()
    for event in ("OnJobTaskStart", "OnTaskStart"):
        plain = task_start({"FOO": "bär"}, event=event).encode()
        assert node.start(plain, event) == plain
    assert node.start(b"not json \xff") == b"not json \xff"
    assert not (node.state / "argv").exists()


def test_non_ascii_task_text_passes_unchanged_without_a_locale(node: Node) -> None:
    node.install()
    env = {**node.asking(), "LABEL": "Grüße 训练 \u2028 ✓"}
    request = json.loads(task_start(env))
    request["m_Item2"]["commandLine"] = "echo 'naïve \u2014 例'"
    answer = json.loads(node.start(json.dumps(request, ensure_ascii=False).encode("utf-8")))
    assert answer["m_Item2"]["commandLine"] == "echo 'naïve \u2014 例'"
    assert answer["m_Item2"]["environmentVariables"]["LABEL"] == env["LABEL"]


def test_with_no_python3_the_start_passes_unchanged_and_the_log_says_why(node: Node, tmp_path: Path) -> None:
    node.install()
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "cat", "dirname", "basename", "date", "mkdir", "timeout"):
        (bare / tool).symlink_to(shutil.which(tool) or tool)
    plain = task_start(node.asking()).encode()
    assert node.start(plain, path=str(bare)) == plain
    assert "no python3: the start passed on unchanged" in node.log()


def test_a_python3_too_old_to_read_the_start_passes_a_large_one_unchanged(node: Node, tmp_path: Path) -> None:
    """A python3 older than 3.6 stops at the filter's syntax before it reads stdin: bash's write to the
    closed pipe fails (SIGPIPE ignored), and that error must not reach the answer."""
    node.install()
    old = tmp_path / "old-python"
    old.mkdir()
    (old / "python3").write_text("#!/bin/bash\necho 'SyntaxError: invalid syntax' >&2\nexit 1\n")
    (old / "python3").chmod(0o755)
    large = task_start({**node.asking(), "BIG": "x" * 300_000}).encode()
    assert node.start(large, path=f"{old}:{node.path}") == large
    assert "hpcjob_mount_filter.py failed: the start passed on unchanged" in node.log()


def test_a_crash_of_the_python_filter_passes_the_start_unchanged(node: Node) -> None:
    node.install()
    (node.filters / "hpcjob_mount_filter.py").write_text(
        "import sys\nprint('Traceback: boom')\nsys.exit(1)\n"
    )
    plain = task_start(node.asking()).encode()
    assert node.start(plain) == plain
    assert "hpcjob_mount_filter.py failed: the start passed on unchanged" in node.log()


def test_installing_keeps_the_sites_filters_chained_after_hpcjobs_and_again_changes_nothing(
    node: Node,
) -> None:
    node.filters.mkdir(parents=True)
    for event in ("OnJobTaskStart", "OnTaskStart"):
        # A site's own filter: it adds a variable, and must still run, after hpcjob's.
        theirs = node.filters / f"{event}.sh"
        theirs.write_text(
            "#!/bin/bash\npython3 -c 'import json,sys; d=json.load(sys.stdin); "
            'd["m_Item2"]["environmentVariables"]["SITE"]="1"; json.dump(d, sys.stdout)\'\n'
        )
        theirs.chmod(0o755)
    node.install()
    node.install()
    expected = {"hpcjob_mount_filter.py", "hpcjob_filter.sh", mount_filter.CONFIG_FILE}
    expected |= {
        f"{e}{suffix}" for e in ("OnJobTaskStart", "OnTaskStart") for suffix in (".sh", CHAINED_SUFFIX)
    }
    assert {p.name for p in node.filters.iterdir()} == expected
    assert "SITE" in (node.filters / f"OnTaskStart{CHAINED_SUFFIX}").read_text()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in node.filters.iterdir()}
    assert modes.pop(mount_filter.CONFIG_FILE) == 0o644 and set(modes.values()) == {0o755}
    for event, result in (("OnJobTaskStart", "mounted"), ("OnTaskStart", "already mounted")):
        answer = json.loads(node.start(task_start(node.asking(), event=event), event))["m_Item2"][
            "environmentVariables"
        ]
        assert answer["SITE"] == "1" and answer[mount_filter.RESULT_VAR] == result


@pytest.mark.parametrize(
    ("owner", "name"), [("HPC\\alice", "alice"), ("alice", "alice"), ("CONTOSO\\Alice.B-2", "Alice.B-2")]
)
def test_the_client_and_the_filter_agree_on_the_owners_mount_point(owner: str, name: str) -> None:
    """The account the agent runs the owner's tasks as: the name without its domain, case kept."""
    assert mount_filter.user_name(owner) == name and user_mount_point("/app/", owner) == f"/app/{name}"


@pytest.mark.parametrize("owner", ["alice@contoso.com", "HPC\\", "HPC\\-x", "HPC\\a,noperm"])
def test_an_owner_name_the_agent_would_not_strip_to_a_plain_account_is_refused(owner: str) -> None:
    assert mount_filter.user_name(owner) == ""
    with pytest.raises(SpecError, match="has no name a node can take"):
        user_mount_point("/app", owner)


NODE_PYTHON_FILES = [
    *(
        Path(mount_filter.__file__).parent / name
        for name in ("mount_filter.py", "env.py", "worker.py", "datasets.py")
    ),
    *sorted(Path(hpctorch.__file__).parent.glob("*.py")),  # the library scripts import
]


@pytest.mark.parametrize("path", NODE_PYTHON_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_what_runs_on_the_nodes_python_is_python_3_6(path: Path) -> None:
    """Nodes run CentOS 7 and Ubuntu 18.04 (Python 3.6) and later: no syntax past 3.6, nothing they call
    newer (worker.py's `int | None` failed on 3.9 before)."""
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 6))
    newer = {"capture_output", "text", "removeprefix", "removesuffix", "fromisoformat", "monotonic_ns",
             "isascii", "annotations", "cached_property", "unlink_missing_ok"}  # fmt: skip
    used = {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }
    used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert used & newer == set()
    # Annotations are evaluated at definition in 3.6: `int | None` parses there, and fails when run.
    annotations = [n.returns for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.returns]
    annotations += [n.annotation for n in ast.walk(tree) if isinstance(n, ast.arg) and n.annotation]
    assert not [ast.unparse(a) for a in annotations if any(isinstance(x, ast.BinOp) for x in ast.walk(a))]


def python36() -> str | None:
    found = shutil.which("python3.6")
    pyenv = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".pyenv" / "versions"  # the tests' HOME is their own
    candidates = [found] if found else []
    candidates += sorted(str(p) for p in pyenv.glob("3.6*/bin/python3.6")) if pyenv.is_dir() else []
    for candidate in candidates:
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(python36() is None, reason="no Python 3.6 on this machine")
def test_under_a_real_python_3_6_it_mounts_passes_through_and_ends_a_hung_mount(
    node: Node, tmp_path: Path
) -> None:
    node.install(timeout_s=2)
    only36 = tmp_path / "py36"
    only36.mkdir()
    (only36 / "python3").symlink_to(python36() or "")
    path = f"{only36}:{node.path}"
    (node.state / "hang").touch()  # Python 3.6's subprocess.run would wait for the hung mount's pipe
    began = time.monotonic()
    hung: Any = json.loads(node.start(task_start(node.asking()), path=path))
    assert time.monotonic() - began < 10
    assert hung["m_Item2"]["environmentVariables"][mount_filter.RESULT_VAR].startswith("failed: mount of")
    (node.state / "hang").unlink()
    answer: Any = json.loads(node.start(task_start(node.asking()), path=path))
    assert answer["m_Item2"]["environmentVariables"][mount_filter.RESULT_VAR] == "mounted"
    plain = task_start({"FOO": "ü"}).encode()
    assert node.start(plain, path=path) == plain
    assert "passed on unchanged" not in node.log()


def test_the_install_command_is_the_golden_one(golden: Callable[[str, str], None]) -> None:
    """The same text for every user and node of a cluster: it holds no secret, only the allowed share."""
    allowed = AllowedShare.checked(SHARE, "/app", "vers=3.0")
    golden("filter-install.sh", filter_install_command([allowed]) + "\n")


# hpcjob's own container task, as plan.docker_env makes it for a user's mount point.
def container_env(point: str, **changed: str) -> dict[str, str]:
    volumes = f"{point}:{point},/etc/passwd:/etc/passwd:ro,/etc/group:/etc/group:ro,/home:/home"
    env = {
        "CCP_DOCKER_IMAGE": "nvcr.io/nvidia/pytorch:24.05-py3",
        "CCP_DOCKER_START_OPTION": CONTAINER_OPTIONS + " --gpus=all",
        "CCP_DOCKER_VOLUMES": volumes,
        "CCP_DOCKER_SKIP_SSH_SETUP": "1",
        "LABEL": "x",
    }
    return {**env, **changed}


def with_policy(node: Node) -> None:
    policy = ContainerPolicy.checked(["nvcr.io/nvidia/"], [], [], [str(node.mount_root)])
    done = node.shell(filter_install_command([node.allowed], policy))
    assert done.returncode == 0 and b"with a container policy" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"CCP_DOCKER_IMAGE": "docker.io/evil/root:latest"}, "image docker.io/evil/root:latest is not one"),
        ({"CCP_DOCKER_START_OPTION": "--network=host --privileged"}, "docker option --privileged is not one"),
        ({"CCP_DOCKER_START_OPTION": "--ulimit --privileged"}, "docker option --ulimit is not one"),
        ({"CCP_DOCKER_VOLUMES": "/:/host"}, "volume /:/host is not one"),
        ({"CCP_DOCKER_VOLUMES": "/etc/passwd:/etc/passwd"}, "volume /etc/passwd:/etc/passwd is not one"),
        ({"CCP_DOCKER_VOLUMES": "/home/../etc:/home/../etc"}, "volume /home/../etc:/home/../etc is not one"),
        ({"A_CCP_DOCKER_IMAGE": "--privileged"}, "only the node agent's own names may hold CCP_DOCKER_"),
        ({"LABEL": "a\nCCP_DOCKER_START_OPTION=--privileged"}, "a line break in a container's variables"),
        ({"LABEL": "CCP_DOCKER_VOLUMES=/:/host"}, "its value names the node agent's Docker settings"),
        ({"CCP_DOCKER_NVIDIA": "1 --privileged"}, "CCP_DOCKER_NVIDIA: a plain word"),
        ({"CCP_DOCKER_VOLUMES": "/home:/home,,/:/host"}, "volume  is not one"),  # a bare -v takes a word
        ({"CCP_DOCKER_IMAGE": "nvcr.io/nvidia-evil/x:1"}, "image nvcr.io/nvidia-evil/x:1 is not one"),
    ],
)
def test_the_administrators_container_policy_refuses_what_it_does_not_allow(
    node: Node, changed: dict[str, str], why: str
) -> None:
    """Any job's start, hpcjob's or not: the agent runs `docker run` as root with these, unquoted."""
    with_policy(node)
    hostile = task_start(container_env(node.point, **changed))
    said = node.start(hostile, code=1).decode()
    assert said.startswith("hpcjob's execution filter refused this task: ") and why in said, said
    assert said.count("\n") == 1 and "refused a container" in node.log()
    assert node.start(task_start(container_env(node.point)))  # hpcjob's own container passes
    mounted = json.loads(node.start(task_start({**node.asking(), **container_env(node.point)})))
    assert mounted["m_Item2"]["environmentVariables"][mount_filter.RESULT_VAR] == "mounted"
    node.install()  # installed again with no policy: containers as the agent runs them
    assert node.start(hostile) == hostile.encode()


def test_a_container_policy_that_cannot_be_applied_fails_closed(node: Node, tmp_path: Path) -> None:
    """The mount part fails open (a broken filter never stops every job on a node); the policy does not:
    with no python3, or a filter that crashes, a start that may name a container is refused."""
    with_policy(node)
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "cat", "dirname", "basename", "date", "mkdir", "timeout", "grep"):
        (bare / tool).symlink_to(shutil.which(tool) or tool)
    container, plain = task_start(container_env(node.point)), task_start({"FOO": "1"})
    said = node.start(container, path=str(bare), code=1).decode()
    assert said == (
        "hpcjob's execution filter could not apply the administrator's container policy (no python3): the "
        "task is refused\n"
    )
    assert node.start(plain, path=str(bare)) == plain.encode()
    (node.filters / "hpcjob_mount_filter.py").write_text("import sys\nsys.exit(1)\n")
    assert "could not apply the administrator's container policy" in node.start(container, code=1).decode()
    assert node.start(plain) == plain.encode()
    assert "a container start refused" in node.log()


@pytest.mark.slow  # waits out the entry script's 20 s bound
def test_a_container_policy_fails_closed_on_a_filter_that_hangs(node: Node, tmp_path: Path) -> None:
    with_policy(node)
    hung = tmp_path / "hung"
    hung.mkdir()
    (hung / "python3").write_text("#!/bin/bash\nsleep 60\n")
    (hung / "python3").chmod(0o755)
    began = time.monotonic()
    said = node.start(task_start(container_env(node.point)), path=f"{hung}:{node.path}", code=1).decode()
    assert said.startswith("hpcjob's execution filter could not apply the administrator's container policy")
    assert 20 <= time.monotonic() - began < 30


def test_the_emulated_agent_reads_its_docker_settings_as_the_real_one_does(tmp_path: Path) -> None:
    """common.sh's unanchored greps: another variable's line that holds CCP_DOCKER_IMAGE= reaches `docker
    run`, here before the image (what the spec and the policy refuse)."""
    from types import SimpleNamespace

    from hpcjob.emulator.agent import container_start

    log = tmp_path / "docker.log"
    (tmp_path / "docker").write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n'
        'if [ "$1" = run ]; then while [ $# -gt 0 ]; do\n'
        '[ "$1" = --cidfile ] && echo c1 > "$2"; shift; done; fi\n'
    )
    (tmp_path / "docker").chmod(0o755)
    job = SimpleNamespace(props={"Owner": "HPC\\alice"})
    task = SimpleNamespace(system_id=5, props={"RequeueCount": "0"})
    variables = {"A_CCP_DOCKER_IMAGE": "--privileged", "CCP_DOCKER_IMAGE": "img:1"}
    script = container_start(job, task, str(tmp_path), variables, 2)  # type: ignore[arg-type]
    subprocess.run(
        ["bash", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True, capture_output=True
    )
    run = log.read_text().splitlines()[0]
    assert run.startswith("run -id") and run.endswith("--privileged img:1"), run


@pytest.mark.parametrize("prefix", ["registry.corp", "nvcr.io/nvidia", "a b/", "$(x)/"])
def test_an_image_prefix_is_a_whole_registry_or_repository(prefix: str) -> None:
    """`registry.corp` would allow registry.corp.evil.com/x; `nvcr.io/nvidia` nvcr.io/nvidia-evil/x."""
    with pytest.raises(SpecError, match="would refuse this container policy"):
        ContainerPolicy.checked([prefix], [], [], ["/app"])


# The container policy reads an image as Docker reads it, and a volume as what docker would mount.
DIGEST = "sha256:" + "0123456789abcdef" * 4
ALLOWED_IMAGES = [
    "nvcr.io/nvidia/",  # every repository below nvcr.io/nvidia
    "ubuntu:",  # docker.io/library/ubuntu, any tag or digest
    "localhost:5000/team/",
    "ok/",  # docker.io/ok/...
    "ghcr.io/org/app:1.0",  # that tag alone
    "quay.io/org/tool@",  # that repository, by digest only
    f"busybox@{DIGEST}",  # that image alone
]


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/pytorch:24.05-py3", f"nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}",
        "nvcr.io/nvidia/sub/tool", "ubuntu", "ubuntu:22.04", "docker.io/library/ubuntu:22.04",
        "index.docker.io/library/ubuntu", "docker.io/ubuntu", "library/ubuntu", f"ubuntu@{DIGEST}",
        "localhost:5000/team/x:1", "ok/tool", "ghcr.io/org/app:1.0", f"quay.io/org/tool@{DIGEST}",
        f"busybox@{DIGEST}", f"docker.io/library/busybox:1@{DIGEST}",
    ],
)  # fmt: skip
def test_an_allowed_image_passes_in_every_spelling_docker_reads_the_same(image: str) -> None:
    assert mount_filter.image_refusal(image, ALLOWED_IMAGES) == ""


@pytest.mark.parametrize(
    ("image", "why"),
    [
        # `ubuntu:` allowed Docker Hub's ubuntu; Docker reads this as the registry ubuntu:5000.
        (
            "ubuntu:5000/evil/img",
            "not one the administrator allowed: Docker reads it as ubuntu:5000/evil/img:latest",
        ),
        ("ubuntu/evil", "not one the administrator allowed: Docker reads it as docker.io/ubuntu/evil:latest"),
        ("nvcr.io/nvidia-evil/x:1", "Docker reads it as nvcr.io/nvidia-evil/x:1"),
        ("nvcr.io/nvidia:1", "Docker reads it as nvcr.io/nvidia:1"),  # the namespace is not below itself
        ("nvcr.io.evil.com/nvidia/x", "Docker reads it as nvcr.io.evil.com/nvidia/x:latest"),
        ("NVCR.IO/nvidia/x", "Docker reads it as NVCR.IO/nvidia/x:latest"),
        ("localhost/team/x", "Docker reads it as localhost/team/x:latest"),
        ("localhost:5000/team", "Docker reads it as localhost:5000/team:latest"),
        ("ghcr.io/org/app:1.1", "Docker reads it as ghcr.io/org/app:1.1"),
        ("ghcr.io/org/app", "Docker reads it as ghcr.io/org/app:latest"),
        (f"ghcr.io/org/app:1.0@{DIGEST}", "is not one"),  # the digest, not the tag, is what runs
        ("quay.io/org/tool:1", "is not one"),
        ("busybox", "is not one"),
        ("ok/../evil", "not a well-formed image reference: repository path component '..' is not"),
        ("nvcr.io/nvidia/../evil/x:1", "repository path component '..' is not"),
        ("nvcr.io/nvidia//x", "repository path component '' is not"),
        ("nvcr.io/nvidia/X", "repository path component 'X' is not"),
        ("nvcr.io/nvidia/a b", "repository path component 'a b' is not"),
        ("-nvcr.io/nvidia/x", "registry '-nvcr.io' is not"),
        ("nvcr.io:x/nvidia/x", "registry 'nvcr.io:x' is not"),
        ("[::1]:5000/nvidia/x", "registry '[::1]:5000' is not"),
        ("nvcr.io/nvidia/x:", "tag '' is not"),
        ("nvcr.io/nvidia/x:" + "a" * 129, "is not 1 to 128 letters"),
        ("nvcr.io/nvidia/x@sha256:abc", "digest 'sha256:abc' is not"),
        ("nvcr.io/nvidia/x@md5:" + "0" * 32, "is not sha256:<64 hex digits>"),
        ("nvcr.io/nvidia/" + "x" * 250, "longer than 255 characters"),
    ],
)
def test_an_image_is_refused_by_what_docker_reads_in_one_line(image: str, why: str) -> None:
    """Whole registries and path components, the tag or digest Docker would use; nothing Docker would
    read otherwise than the filter (a registry, a path that climbs, an image ID) gets through."""
    said = mount_filter.image_refusal(image, ALLOWED_IMAGES)
    assert said.startswith(f"image {mount_filter.shown(image)} ") and why in said and "\n" not in said, said


@pytest.mark.parametrize(
    "image", ["0" * 64, "deadbeef", "abc123", DIGEST, "sha256:abc", "sha512:" + "0" * 128]
)
def test_what_docker_may_read_as_a_local_image_id_is_refused_where_docker_hub_is_allowed(image: str) -> None:
    """The daemon reads 64 hex digits and a digest as an image's ID, and a name it has no image for as
    the start of one: an image already on the node, of any name, would run."""
    assert mount_filter.image_refusal("ubuntu:22.04", ["docker.io/"]) == ""
    said = mount_filter.image_refusal(image, ["docker.io/"])
    assert said == (
        f"image {image}: Docker may read it as the ID of an image already on the node; name it with its "
        "registry (docker.io/library/NAME)"
    )


@pytest.mark.parametrize(
    "prefix",
    [
        "ok/../",
        "nvcr.io//",
        "nvcr.io/NVIDIA/",
        "ubuntu::",
        "x:1:",
        "x@sha256:abc",
        "[::1]/",
        "/",
        "nvcr.io/nvidia/x",
    ],
)
def test_an_image_prefix_is_a_reference_docker_reads(prefix: str) -> None:
    with pytest.raises(
        SpecError, match=re.escape(f"would refuse this container policy: image prefix {prefix!r}")
    ):
        ContainerPolicy.checked([prefix], [], [], ["/app"])


@pytest.mark.parametrize(
    "prefix", ["ubuntu:22.04", f"nvcr.io/nvidia/pytorch@{DIGEST}", "docker.io/", "Registry.Corp/"]
)
def test_an_image_prefix_may_name_one_image_by_its_tag_or_digest(prefix: str) -> None:
    assert ContainerPolicy.checked([prefix], [], [], ["/app"]).images == (prefix,)


def test_the_filter_on_the_node_reads_an_image_as_docker_does(node: Node) -> None:
    """On the node, as the agent starts the filter: `ubuntu:` allowed is no way to another registry, a
    path that climbs out of an allowed one is refused, and the image allowed still runs."""
    policy = ContainerPolicy.checked(["nvcr.io/nvidia/", "ubuntu:"], [], [], [str(node.mount_root)])
    assert node.shell(filter_install_command([node.allowed], policy)).returncode == 0
    for image, why in [
        (
            "ubuntu:5000/evil/img",
            "is not one the administrator allowed: Docker reads it as ubuntu:5000/evil/img",
        ),
        ("nvcr.io/nvidia/../../evil/x:1", "is not a well-formed image reference"),
    ]:
        said = node.start(task_start(container_env(node.point, CCP_DOCKER_IMAGE=image)), code=1).decode()
        assert said.startswith(f"hpcjob's execution filter refused this task: image {image} ") and why in said
        assert said.count("\n") == 1
    allowed = task_start(container_env(node.point, CCP_DOCKER_IMAGE="ubuntu:22.04"))
    assert node.start(allowed) == allowed.encode()  # passed on as the agent wrote it


def container_verdict(node: Node, volumes: str) -> str:
    """What the filter says of a container start with these volumes: "" when it passes it on."""
    said = node.start(task_start(container_env(node.point, CCP_DOCKER_VOLUMES=volumes)), code=None).decode()
    refused = "hpcjob's execution filter refused this task: "
    if said.startswith(refused):
        assert said.count("\n") == 1, said
        return said[len(refused) :].rstrip("\n")
    json.loads(said)  # passed on: the start's JSON
    return ""


def allow_volumes(node: Node, *volumes: str) -> None:
    policy = ContainerPolicy.checked(["nvcr.io/nvidia/"], [], list(volumes), [str(node.mount_root)])
    done = node.shell(filter_install_command([node.allowed], policy))
    assert done.returncode == 0, done.stdout


@pytest.fixture
def scratch(node: Node, tmp_path: Path) -> Path:
    """A folder the administrator allows as a volume, root's and written by nobody else."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    folder.chmod(0o755)
    allow_volumes(node, str(folder))
    return folder


def test_a_volume_through_a_symlink_below_the_allowed_folder_is_refused(node: Node, scratch: Path) -> None:
    """`/scratch` allowed is not `/scratch/link` whose link points at `/`: docker mounts what it points to."""
    (scratch / "link").symlink_to("/")
    (scratch / "etc").symlink_to("/etc")
    (scratch / "data" / "deep").mkdir(parents=True)
    for volume, link in [
        (f"{scratch}/link:{scratch}/link", f"{scratch}/link"),
        (f"{scratch}/link:{scratch}/link:ro", f"{scratch}/link"),
        (f"{scratch}/etc/shadow:{scratch}/etc/shadow:ro", f"{scratch}/etc"),
    ]:
        why = (
            f"volume {mount_filter.shown(volume)}: {link} is a symlink: docker would mount what it points to"
        )
        assert container_verdict(node, volume) == why
    for source in (scratch, scratch / "data", scratch / "data" / "deep", scratch / "new" / "folder"):
        assert container_verdict(node, f"{source}:{source}") == ""  # a missing one docker makes, as root


@pytest.mark.parametrize("loose", ["group-writable", "world-writable", "sticky", "a user's"])
def test_a_volume_in_a_folder_others_than_root_may_write_is_refused(
    node: Node, scratch: Path, loose: str
) -> None:
    """Whoever may write a folder between the allowed one and the source could put a link there after the
    check: refused, from the allowed folder down. The source itself may be a user's."""
    shared = scratch / "shared"
    (shared / "data").mkdir(parents=True)
    if loose == "a user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a folder to another user")
        os.chown(shared, pwd.getpwnam(USER).pw_uid, -1)
    else:
        shared.chmod({"group-writable": 0o775, "world-writable": 0o777, "sticky": 0o1777}[loose])
    volume = f"{shared}/data:{shared}/data"
    said = container_verdict(node, volume)
    # The job's own text is cut to SHOWN characters (a long tmp path under xdist is): the reason is whole.
    assert said.startswith("volume ") and f": {shared} may be written by others than root" in said, said
    # The loose folder itself passes: only root may write the folder it is in, so none can swap it.
    assert container_verdict(node, f"{shared}:{shared}") == ""
    scratch.chmod(0o777)  # the allowed folder itself, when the source is below it
    said = container_verdict(node, f"{shared}:{shared}")
    assert said.startswith("volume ") and f": {scratch} may be written by others than root" in said, said


def test_a_link_made_after_the_check_is_what_docker_mounts(node: Node) -> None:
    """The limit of any check before `docker run`: it cannot stop a link made after it. The filter passes
    a plain folder; replaced by a link to / afterwards, that folder is / for whatever mounts it next (the
    kernel resolves the path when docker mounts it). What keeps users from doing so is the administrator's
    allowed folder being root's and written by no one else, which a user cannot get round."""
    import tempfile

    # Beside /tmp, so that the user can reach it (pytest's own folders are root's, 0700).
    scratch = Path(tempfile.mkdtemp(prefix="hpcjob-scratch-", dir="/tmp"))
    try:
        scratch.chmod(0o755)
        allow_volumes(node, str(scratch))
        data = scratch / "data"
        data.mkdir()
        volume = f"{data}:{data}"
        assert container_verdict(node, volume) == ""  # checked: a plain folder of root's
        data.rmdir()
        data.symlink_to("/")  # after the check, by whoever may write the allowed folder (here root)
        assert os.path.realpath(data) == "/"  # what `docker run -v` would mount: the check cannot undo it
        assert container_verdict(node, volume).endswith(
            f"{data} is a symlink: docker would mount what it points to"
        )
        if os.geteuid() == 0:  # a user cannot make that link in the allowed folder
            made = subprocess.run(["ln", "-s", "/", str(scratch / "mine")], user=USER, capture_output=True)
            assert made.returncode != 0 and b"Permission denied" in made.stderr, made.stderr
            assert not os.path.lexists(scratch / "mine")
    finally:
        shutil.rmtree(scratch)
