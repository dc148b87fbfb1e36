"""hpcjob's execution filter, run here as the node agent runs it: installed by its install command, fed
a task start's JSON on stdin, mounting with the job owner's credentials through a stand-in `mount` (the
kernel here cannot mount CIFS) that records what it was given."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcjob.render.text import CHAINED_FILTER, filter_install_command

PASSWORD = "Own3r-pw; $(reboot) 'x'"  # whatever it holds, it reaches mount only inside a root-only file
MOUNT = """#!/bin/bash
# mount -t cifs UNC POINT -o credentials=FILE,OPTIONS: record argv and the credentials file as seen
printf '%s\\n' "$@" > "$STATE/argv"
file=$(echo "$6" | sed 's/^credentials=\\([^,]*\\).*/\\1/')
stat -c %a "$file" > "$STATE/mode"; cat "$file" > "$STATE/credentials"; echo "$file" > "$STATE/file"
[ -n "$MOUNT_FAILS" ] && { echo "mount error(13): Permission denied" >&2; exit 32; }
touch "$STATE/mounted$(echo "$4" | tr / _)"
"""
MOUNTPOINT = '#!/bin/bash\n[ -e "$STATE/mounted$(echo "$2" | tr / _)" ]\n'


@pytest.fixture
def node(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A node: stand-ins for mount and mountpoint first on PATH, the filters in a folder of its own.
    Returns a runner of bash text on it."""
    bin_dir, state, filters = tmp_path / "bin", tmp_path / "state", tmp_path / "filters"
    for folder in (bin_dir, state):
        folder.mkdir()
    for name, text in (("mount", MOUNT), ("mountpoint", MOUNTPOINT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    base = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    base["HPCJOB_FILTERS_DIR"] = str(filters)

    def run(script: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", script],
            input=stdin,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )

    return run


def task_start(env: dict[str, str]) -> str:
    """A task start as the agent gives it to OnJobTaskStart.sh (hpcpack-samples, filters README)."""
    return json.dumps(
        {
            "m_Item1": {"JobId": 7, "ResIds": [1], "TaskId": 1},
            "m_Item2": {"commandLine": "hostname", "environmentVariables": env, "workingDirectory": "/tmp"},
            "m_Item3": "HPC\\alice",
            "m_Item4": PASSWORD,
            "m_Item5": "",
            "m_Item6": "",
        }
    )


def filtered(node: Callable[..., subprocess.CompletedProcess[str]], env: dict[str, str], **extra: str) -> Any:
    done = node('"$HPCJOB_FILTERS_DIR/OnJobTaskStart.sh"', task_start(env), **extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_filter_mounts_once_with_the_owners_credentials_and_no_password_in_argv(
    node: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    assert node(filter_install_command()).returncode == 0
    point = tmp_path / "app"
    wanted = {"HPCJOB_MOUNT": f"//HEADNODE/CcpSpoolDir/app|{point}|vers=3.0,dir_mode=0777"}
    first = filtered(node, wanted)
    assert first["m_Item2"]["environmentVariables"]["HPCJOB_MOUNT_RESULT"] == "mounted"
    state = tmp_path / "state"
    argv = (state / "argv").read_text().splitlines()
    assert argv[:5] == ["-t", "cifs", "//HEADNODE/CcpSpoolDir/app", str(point), "-o"]
    assert argv[5].endswith(",vers=3.0,dir_mode=0777") and PASSWORD not in "".join(argv)
    assert (state / "mode").read_text().strip() == "600"
    assert (state / "credentials").read_text() == f"username=alice\npassword={PASSWORD}\ndomain=HPC\n"
    assert not Path((state / "file").read_text().strip()).exists()  # removed right after the mount
    assert point.is_dir()
    again = filtered(node, wanted)
    assert again["m_Item2"]["environmentVariables"]["HPCJOB_MOUNT_RESULT"] == "already mounted"


def test_a_failed_mount_is_said_to_the_task_in_the_nodes_words(
    node: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    assert node(filter_install_command()).returncode == 0
    wanted = {"HPCJOB_MOUNT": f"//HEADNODE/CcpSpoolDir|{tmp_path / 'app'}|"}
    result = filtered(node, wanted, MOUNT_FAILS="1")["m_Item2"]["environmentVariables"]
    assert result["HPCJOB_MOUNT_RESULT"] == "failed: mount error(13): Permission denied"


def test_a_job_without_a_share_passes_through_unchanged(
    node: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    assert node(filter_install_command()).returncode == 0
    assert filtered(node, {"FOO": "bar"}) == json.loads(task_start({"FOO": "bar"}))
    assert not (tmp_path / "state" / "argv").exists()


def test_installing_keeps_the_filter_that_was_there_and_again_changes_nothing(
    node: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    filters = tmp_path / "filters"
    filters.mkdir()
    theirs = filters / "OnJobTaskStart.sh"
    # A site's own filter: it adds a variable, and must still run, after hpcjob's.
    theirs.write_text(
        "#!/bin/bash\npython3 -c 'import json,sys; d=json.load(sys.stdin); "
        'd["m_Item2"]["environmentVariables"]["SITE"]="1"; json.dump(d, sys.stdout)\'\n'
    )
    theirs.chmod(0o755)
    installed = node(filter_install_command())
    assert installed.returncode == 0 and "execution filter installed in" in installed.stdout
    assert node(filter_install_command()).returncode == 0
    assert sorted(p.name for p in filters.iterdir()) == sorted(
        ["OnJobTaskStart.sh", CHAINED_FILTER, "hpcjob_mount_filter.py"]
    )
    assert "SITE" in (filters / CHAINED_FILTER).read_text()
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o755 for p in filters.iterdir())
    env = filtered(node, {"HPCJOB_MOUNT": f"//HEADNODE/CcpSpoolDir|{tmp_path / 'app'}|"})
    assert env["m_Item2"]["environmentVariables"]["SITE"] == "1"
    assert env["m_Item2"]["environmentVariables"]["HPCJOB_MOUNT_RESULT"] == "mounted"


def test_the_install_command_is_the_golden_one(golden: Callable[[str, str], None]) -> None:
    """It takes no input at all: the same text for every cluster, user and node, so it holds no secret."""
    golden("filter-install.sh", filter_install_command() + "\n")
