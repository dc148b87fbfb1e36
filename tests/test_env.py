"""The job's own Python packages (issue 19): an environment built once per content (on each node's disk or
on the share), under a lock, by the first task that gets there, with a real `pip install` from a local
wheelhouse (no index is reachable here), and real torchrun jobs that run in it."""

from __future__ import annotations

import base64
import dataclasses
import getpass
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from hpcjob.job.plan import (
    ENVS_VAR,
    REQUIREMENTS_VAR,
    make_plan,
    node_requirements,
    requirements_file,
    wheel_lock,
)
from hpcjob.job.render import job_xml
from hpcjob.job.spec import SpecError
from hpcjob.store.staging import node_files
from hpcjob.store.wheelhouse import platform_tags

from .conftest import RUN_ID, cluster_spec
from .test_local_e2e import hpcjob_run
from .test_mount_filter import python36

ENV_BUILDER = Path(__file__).resolve().parents[1] / "hpcjob" / "node" / "env.py"


def make_wheel(folder: Path, name: str, version: str, code: str, tag: str = "py3-none-any") -> Path:
    """A wheel made by hand (building one would need setuptools from an index); pure Python unless
    `tag` says otherwise."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: hpcjob-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "tinya", "1.0", "VALUE = 'a1'\n")
    make_wheel(folder, "tinyb", "2.0", "VALUE = 'b2'\n")
    return folder


def requirements(wheelhouse: Path, *names: str) -> str:
    return "".join(f"{line}\n" for line in ("--no-index", f"--find-links {wheelhouse}", *names))


def code_folder(tmp_path: Path, train: str, files: dict[str, str]) -> Path:
    """The user's code: train.py and the files beside it (a requirements file)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(train)
    for name, text in files.items():
        (code / name).write_text(text)
    return code


def run_builder(job_dir: Path, envs: Path, text: str, node: str = "N1", **env: str) -> subprocess.Popen[str]:
    """env.py as a task runs it: in the job folder, with the requirements file the plan names."""
    path = requirements_file(text)
    (job_dir / path).parent.mkdir(parents=True, exist_ok=True)
    (job_dir / path).write_text(text)
    logs = job_dir / "logs" / "run-1"
    logs.mkdir(parents=True, exist_ok=True)
    variables = {
        "PATH": os.environ["PATH"],
        REQUIREMENTS_VAR: path,
        ENVS_VAR: str(envs),
        "HPCJOB_LOG_DIR": str(logs),
        "HPCJOB_NODE": node,
        **env,
    }
    return subprocess.Popen(
        [sys.executable, str(ENV_BUILDER)],
        cwd=job_dir,
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a task's processes, as one group
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=180)
    return process.returncode, out.strip(), err


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_a_killed_build_is_never_complete_and_the_next_task_builds_it_again(
    tmp_path: Path, wheelhouse: Path
) -> None:
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "envs"
    first = run_builder(tmp_path, envs, text, HPCJOB_ENV_STALE_S="2")
    assert first.stderr is not None
    line = first.stderr.readline()
    assert "hpcjob: building environment" in line
    # SIGKILL to the task's every process mid-build, as the agent ends a task: nothing runs on the way
    # out, the lock stays behind (pip alone left running would go on writing into the dead build).
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    owner = envs / next(p.name for p in envs.iterdir())
    assert not list(owner.glob("*.ready")) and list(owner.glob("*.lock"))
    started = time.monotonic()
    code, python, err = finish(run_builder(tmp_path, envs, text, HPCJOB_ENV_STALE_S="2"))
    assert code == 0, err
    assert "stopped beating: taking over" in err and "ready in" in err
    assert time.monotonic() - started < 60
    check = subprocess.run(
        [python, "-c", "import tinya, torch; print(tinya.VALUE)"], capture_output=True, text=True
    )
    assert check.stdout.strip() == "a1", check.stderr  # its packages and the base Python's (torch)
    assert not list(owner.glob("*.lock")) and len(list(owner.glob("*-*"))) == 1  # the dead build is gone


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_a_builder_taken_over_while_paused_marks_nothing_and_harms_nobody(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """A builder stopped (SIGSTOP: a node that froze) stops beating; another task takes over and builds in
    a folder of its own. The first, resumed, finds the lock no longer its own: it neither marks its build
    ready nor removes the other's lock, and waits for the other's build."""
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "envs"
    paused = run_builder(tmp_path, envs, text, node="A", HPCJOB_ENV_STALE_S="2")
    assert paused.stderr is not None and "building environment" in paused.stderr.readline()
    paused.send_signal(signal.SIGSTOP)
    try:
        code, python, err = finish(run_builder(tmp_path, envs, text, node="B", HPCJOB_ENV_STALE_S="2"))
        assert code == 0 and "taking over" in err, err
    finally:
        paused.send_signal(signal.SIGCONT)
    code, resumed, err = finish(paused)
    assert (code, resumed) == (0, python), err  # the build B marked ready, whatever A had done
    owner = envs / next(p.name for p in envs.iterdir())
    record = json.loads(next(owner.glob("*.ready")).read_text())
    assert record["node"] == "B" and Path(python).parts[-3] == record["build"]
    assert subprocess.run([python, "-c", "import tinya"]).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a folder as another user")
def test_an_environment_folder_another_user_planted_is_never_used(tmp_path: Path, wheelhouse: Path) -> None:
    """Anyone can work out a key (the requirements and the node's Python): a user's folder that someone
    else owns, or may write to, is refused before anything in it runs."""
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "envs"
    planted = envs / "root"
    planted.mkdir(parents=True)
    os.chown(planted, 65534, 65534)
    code, python, err = finish(run_builder(tmp_path, envs, text))
    assert code == 1 and python == "" and "is not a folder of yours that only you may write to" in err
    os.chown(planted, 0, 0)
    planted.chmod(0o777)
    code, python, err = finish(run_builder(tmp_path, envs, text))
    assert code == 1 and "is not a folder of yours" in err


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_a_node_s_folder_of_environments_that_other_users_may_change_is_refused(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """On a node's own disk (an administrator's node_env_dir), another user could put a folder of theirs
    in place of this user's if the folder above is writable by all and not sticky, as /tmp is."""
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "shared-envs"
    envs.mkdir()
    envs.chmod(0o777)
    code, python, err = finish(run_builder(tmp_path, envs, text, HPCJOB_ENV_ON="node-local"))
    assert code == 1 and python == ""
    assert err.strip().splitlines()[-1] == (
        f"hpcjob: error: {envs} may be changed by other users (it must be yours, or root's and, if everyone "
        "may write to it, sticky: mode 1777): its environments are not used"
    )
    envs.chmod(0o1777)  # as /tmp: each user's folder is theirs alone
    code, python, err = finish(run_builder(tmp_path, envs, text, HPCJOB_ENV_ON="node-local"))
    assert code == 0 and python.startswith(str(envs / pwd.getpwuid(os.getuid()).pw_name)), err


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_a_changed_requirements_file_builds_another_environment(tmp_path: Path, wheelhouse: Path) -> None:
    envs = tmp_path / "envs"
    code, first, err = finish(run_builder(tmp_path, envs, requirements(wheelhouse, "tinya==1.0")))
    assert code == 0, err
    code, again, err = finish(run_builder(tmp_path, envs, requirements(wheelhouse, "tinya==1.0")))
    assert (code, again) == (0, first) and "built before" in err and "building" not in err
    code, other, err = finish(
        run_builder(tmp_path, envs, requirements(wheelhouse, "tinya==1.0", "tinyb==2.0"))
    )
    assert code == 0 and other != first, err
    assert subprocess.run([other, "-c", "import tinyb"]).returncode == 0
    assert subprocess.run([first, "-c", "import tinyb"], capture_output=True).returncode != 0


SYSTEM_PYTHON = "/usr/bin/python3"  # a node's own Python, which another user may run


@pytest.mark.slow  # builds virtual environments with pip: seconds each
@pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip"]).returncode != 0,
    reason="needs root (to run as two users) and a system python3 with venv",
)
def test_two_users_never_share_an_environment(wheelhouse: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="hpcjob-env-users-"))  # pytest's own folders are root's only
    try:
        base.chmod(0o755)
        envs = base / "envs"
        envs.mkdir()
        envs.chmod(0o1777)  # a share folder both users write to
        logs = base / "logs" / "run-1"
        logs.mkdir(parents=True)
        logs.chmod(0o777)
        house = base / "wheels"
        shutil.copytree(wheelhouse, house)
        text = requirements(house, "tinya==1.0")
        (base / requirements_file(text)).parent.mkdir()
        (base / requirements_file(text)).write_text(text)
        variables = {
            "PATH": os.environ["PATH"],
            REQUIREMENTS_VAR: requirements_file(text),
            ENVS_VAR: str(envs),
            "HPCJOB_LOG_DIR": str(logs),
        }
        builder = base / "env.py"
        shutil.copy(ENV_BUILDER, builder)

        def build(user: int | None, node: str) -> str:
            def become() -> None:
                if user is not None:
                    os.setgid(user)
                    os.setuid(user)

            done = subprocess.run(
                [SYSTEM_PYTHON, str(builder)], cwd=base, capture_output=True, text=True, timeout=180,
                env={**variables, "HPCJOB_NODE": node}, preexec_fn=become,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        mine, theirs = build(None, "N1"), build(65534, "N2")
        assert Path(mine).parts[-4] == "root" and Path(theirs).parts[-4] == "nobody", (mine, theirs)
        assert (envs / "root").stat().st_mode & 0o777 == 0o700  # nobody cannot touch root's environments
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_job_s_environment_is_built_once_and_a_second_job_installs_nothing(
    tmp_path: Path, wheelhouse: Path
) -> None:
    code = code_folder(
        tmp_path,
        "import os, tinya\nprint('rank', os.environ['RANK'], tinya.VALUE, flush=True)\n",
        {"requirements.txt": requirements(wheelhouse, "tinya==1.0")},
    )  # requirements.txt: used as it is, beside the script; torchrun itself imports the base's torch
    share = tmp_path / "share"

    def job(run_id: str) -> tuple[dict[str, object], str, str, str]:
        done = subprocess.run(
            [*hpcjob_run(share, run_id, "-n", "2", str(code / "train.py"))],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        logs = share / "hpcjob" / "train" / "logs" / run_id
        errs = "".join((logs / f"LOCAL{n}.err").read_text() for n in (1, 2))
        outs = "".join((logs / f"LOCAL{n}.out").read_text() for n in (1, 2))
        return json.loads(done.stdout), errs, outs, done.stderr

    summary, errs, outs, said = job("env-1")
    assert summary["state"] == "Finished"
    assert "the job's packages from requirements.txt beside train.py" in said
    assert errs.count("building environment") == 1 and errs.count("waiting for environment") == 1
    assert outs.count(" a1") == 2  # both ranks imported the environment's package
    summary, errs, _, _ = job("env-2")
    assert errs.count("built before") == 2 and "building" not in errs and "waiting" not in errs


@pytest.mark.slow
def test_a_failed_install_fails_the_job_before_training_with_pip_s_reason(
    tmp_path: Path, wheelhouse: Path
) -> None:
    code = code_folder(
        tmp_path,
        "print('training started')\n",
        {"reqs.txt": requirements(wheelhouse, "tinya==1.0", "tinyz==9")},
    )
    share = tmp_path / "share"
    done = subprocess.run(
        [
            *hpcjob_run(share, "env-bad", "-n", "2", "--env-on", "share"),
            *("--requirements", str(code / "reqs.txt"), str(code / "train.py")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads(done.stdout)
    assert done.returncode == 1 and summary["state"] == "Failed"
    reason = summary["root_cause"]["reason"]
    assert reason.startswith(
        "hpcjob: error: the job's environment did not build: ERROR: No matching distribution"
    )
    assert "tinyz==9" in reason and "training started" not in done.stderr
    logs = share / "hpcjob" / "train" / "logs" / "env-bad"
    assert "Looking in links" in next(logs.glob("*.env.log")).read_text()  # pip's whole log, kept
    left = {path.suffix for path in (share / "hpcjob" / "envs").glob("*/*")}
    assert left == {".failed"}  # on the share (--env-on): nothing ready, no lock or build folder left


def test_the_task_runs_in_the_environment_the_node_builds(golden: Callable[[str, str], None]) -> None:
    spec = cluster_spec(2, requirements="torchvision==0.29.1\n")
    plan = make_plan(spec, spec.node_names, RUN_ID)
    text = job_xml(plan)
    golden("job-2node-requirements.xml", text)
    task = ET.fromstring(text).find(".//{*}Task")
    assert task is not None
    line = task.get("CommandLine") or ""
    assert ' && HPCJOB_PYTHON=$(python3 .hpcjob/env.py) && "$HPCJOB_PYTHON" -m torch.distributed.run ' in line
    assert dict(plan.env)[ENVS_VAR] == "~/.cache/hpcjob/envs"  # each node's own disk: env.py expands ~
    on_share = make_plan(dataclasses.replace(spec, env_on="share"), spec.node_names, RUN_ID)
    assert dict(on_share.env)[ENVS_VAR] == "/app/hpcjob/envs"
    assert on_share.tasks == plan.tasks
    assert plan.files == ((dict(plan.env)[REQUIREMENTS_VAR], "torchvision==0.29.1\n"),)
    assert ".hpcjob/env.py" in {str(path) for path, _ in node_files()}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("--index-url https://alice:s3cret@pypi.contoso.com/simple\n", "line 1: a URL with a user or token"),
        ("torch\ngit+https://tok:x-oauth@github.com/a/b.git\n", "requirements line 2: a URL with a user"),
        ("torch\x07\n", "requirements line 1 holds a control character"),
        ("git+https://ghp_abc123@github.com/a/b.git\n", "line 1: a URL with a user or token"),
        ("torch\n-r base.txt\n", "requirements line 2: -r, -c, -e and relative paths are not taken"),
        ("--constraint=c.txt\n", "line 1: -r, -c, -e and relative paths"),
        ("-e .\n", "line 1: -r, -c, -e and relative paths"),
        ("./mypkg\n", "line 1: -r, -c, -e and relative paths"),
    ],
)  # fmt: skip
def test_requirements_that_would_leak_a_secret_or_name_files_beside_them_are_refused(
    text: str, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        cluster_spec(2, requirements=text)


def test_requirements_may_name_absolute_paths_and_ssh_urls_on_the_nodes() -> None:
    text = "--find-links /app/wheels\n/app/wheels/tinya-1.0-py3-none-any.whl\ngit+ssh://git@host/a/b.git\n"
    assert cluster_spec(2, requirements=text).requirements == text


def test_no_job_takes_the_environments_or_wheels_folder() -> None:
    with pytest.raises(SpecError, match="job folder hpcjob/envs is where your jobs' envs live"):
        cluster_spec(2, name="envs")  # its folder would be hpcjob/envs
    with pytest.raises(SpecError, match="job folder hpcjob/alice/wheels is where your jobs' wheels live"):
        cluster_spec(2, name="wheels", owner="HPC\\alice")


def test_a_cluster_users_jobs_wheels_and_environments_are_in_their_own_folder() -> None:
    """Job folders on the share were one namespace for every user (hpcjob/<name>/), whose node files run
    in every task: each user's are under hpcjob/<user>/ now, and a job folder elsewhere is refused."""
    text = "tinya==1.0\n"
    spec = cluster_spec(
        2,
        owner="CONTOSO\\alice",
        requirements=text,
        env_on="share",
        wheelhouse=("3.10", "manylinux_2_28_x86_64"),
    )
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert spec.job_folder == "hpcjob/alice/run_ddp" and plan.job_dir == "/app/hpcjob/alice/run_ddp"
    env = dict(plan.env)
    assert env[ENVS_VAR] == "/app/hpcjob/alice/envs"
    assert "--find-links /app/hpcjob/alice/wheels\n" in dict(plan.files)[env[REQUIREMENTS_VAR]]
    for elsewhere in ("hpcjob/bob/run_ddp", "hpcjob/run_ddp", "shared/run_ddp"):
        with pytest.raises(SpecError, match=f"job folder {elsewhere} is not in hpcjob/alice/, your own"):
            cluster_spec(2, owner="CONTOSO\\alice", job_folder=elsewhere)


def test_requirements_beside_the_script_are_used_and_no_env_turns_them_off(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "requirements.txt").write_text("tinya==1.0\n")

    def render(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", "render", "--node", "A", *extra, str(tmp_path / "train.py")],
            capture_output=True,
            text=True,
        )

    used = render()
    assert used.returncode == 0, used.stderr
    assert used.stderr.splitlines() == [
        "hpcjob: the job's packages from requirements.txt beside train.py (--no-env: the nodes' Python as "
        "it is)"
    ]
    assert "HPCJOB_REQUIREMENTS" in used.stdout
    plain = render("--no-env")
    assert plain.returncode == 0 and "HPCJOB_REQUIREMENTS" not in plain.stdout
    assert "the job's packages" not in plain.stderr
    both = render("--no-env", "--requirements", str(tmp_path / "requirements.txt"))
    assert both.returncode == 2 and "--requirements and --no-env contradict each other" in both.stderr
    missing = render("--requirements", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.slow  # builds virtual environments with pip: seconds each
@pytest.mark.skipif(python36() is None, reason="no Python 3.6 on this machine")
def test_a_node_with_python_3_6_builds_its_own_environment(tmp_path: Path, wheelhouse: Path) -> None:
    """CentOS 7 and Ubuntu 18.04 nodes: env.py runs there, and their Python is part of the key."""
    python = python36()
    assert python is not None
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "envs"
    process = run_builder(tmp_path, envs, text)
    code, newest, err = finish(process)
    assert code == 0, err
    (tmp_path / "logs" / "run-1").mkdir(parents=True, exist_ok=True)
    old = subprocess.run(
        [python, str(ENV_BUILDER)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
        env={"PATH": os.environ["PATH"], REQUIREMENTS_VAR: requirements_file(text), ENVS_VAR: str(envs),
             "HPCJOB_LOG_DIR": str(tmp_path / "logs" / "run-1"), "HPCJOB_NODE": "OLD"},
    )  # fmt: skip
    assert old.returncode == 0, old.stderr
    built = old.stdout.strip()
    assert built != newest  # another Python, another environment
    check = subprocess.run([built, "-c", "import sys, tinya; print(sys.version_info[:2], tinya.VALUE)"],
                           capture_output=True, text=True)  # fmt: skip
    assert check.stdout.strip() == "(3, 6) a1", check.stderr


def render_copy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "render", "--node", "A", "--copy-to", str(tmp_path / "mounted"),
         *args, str(tmp_path / "code" / "train.py")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip


def test_a_wheelhouse_puts_the_nodes_wheels_on_the_share_once_and_the_nodes_install_from_it_alone(
    tmp_path: Path, wheelhouse: Path
) -> None:
    code_folder(tmp_path, "", {"requirements.txt": requirements(wheelhouse, "tinya==1.0")})
    first = render_copy(tmp_path, "--wheelhouse", "3.10")
    assert first.returncode == 0, first.stderr
    assert "wheels for Python 3.10 on manylinux_2_28_x86_64: pip download" in first.stderr
    mine = tmp_path / "mounted" / "hpcjob" / getpass.getuser()
    wheels = mine / "wheels"
    assert sorted(p.name for p in wheels.iterdir()) == ["manifest.json", "tinya-1.0-py3-none-any.whl"]
    staged = next((mine / "train" / ".hpcjob").glob("requirements-*.txt")).read_text()
    digest = hashlib.sha256((wheels / "tinya-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    assert staged == (
        f"--no-index\n--find-links /app/hpcjob/{getpass.getuser()}/wheels\n--require-hashes\n"
        f"tinya==1.0 --hash=sha256:{digest}\n"
    )  # the nodes' index: the share; what they install: the lock of what was downloaded here
    again = render_copy(tmp_path, "--wheelhouse", "3.10")
    assert again.returncode == 0, again.stderr
    assert "sent 0 file(s)" in again.stderr  # the wheel and the code, all there already


def test_a_package_without_a_wheel_for_the_nodes_is_named_before_anything_is_uploaded(
    tmp_path: Path, wheelhouse: Path
) -> None:
    make_wheel(wheelhouse, "tinyc", "1.0", "", tag="cp310-cp310-manylinux_2_17_x86_64")
    code_folder(tmp_path, "", {"requirements.txt": requirements(wheelhouse, "tinya==1.0", "tinyc==1.0")})
    fits = render_copy(tmp_path, "--wheelhouse", "3.10:manylinux2014_x86_64")
    assert fits.returncode == 0, fits.stderr
    refused = render_copy(tmp_path, "--run-id", "r-2", "--wheelhouse", "3.10:manylinux_2_28_aarch64")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "hpcjob: error: no wheel of tinyc==1.0 for Python 3.10 on manylinux_2_28_aarch64: nothing was "
        "uploaded (build one, or install that package on the nodes another way)"
    )
    assert not (tmp_path / "mounted" / "hpcjob" / getpass.getuser() / "train" / "logs" / "r-2").exists()
    assert (tmp_path / "mounted" / "hpcjob" / getpass.getuser() / "train" / "logs").is_dir()  # r-1's


@pytest.mark.slow
def test_a_local_run_with_a_wheelhouse_installs_from_the_share_s_wheels(
    tmp_path: Path, wheelhouse: Path
) -> None:
    code = code_folder(
        tmp_path,
        "import tinya\nprint('tinya', tinya.VALUE)\n",
        {"reqs.txt": requirements(wheelhouse, "tinya==1.0")},
    )
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    share = tmp_path / "share"
    done = subprocess.run(
        hpcjob_run(share, "wh-1", "-n", "1", "--requirements", str(code / "reqs.txt"), "--wheelhouse",
                   python, str(code / "train.py")),
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    log = (share / "hpcjob" / "train" / "logs" / "wh-1" / "LOCAL1.env.log").read_text()
    assert f"{share}/hpcjob/wheels" in log and str(wheelhouse) not in log


def test_a_node_s_platform_takes_the_wheels_of_every_older_glibc() -> None:
    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags
    assert platform_tags("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert platform_tags("musllinux_1_2_x86_64") == ["musllinux_1_2_x86_64"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a small disk: root")
def test_a_full_disk_is_said_to_be_one_with_venv_s_own_words(tmp_path: Path, wheelhouse: Path) -> None:
    """venv hides ensurepip's "No space left on device" behind "returned non-zero exit status 1": the
    builder says the disk is full, and keeps venv's line."""
    job_dir, envs = tmp_path / "job", tmp_path / "envs"
    job_dir.mkdir()
    envs.mkdir()
    variables = {"PATH": os.environ["PATH"], REQUIREMENTS_VAR: requirements_file(requirements(wheelhouse))}
    variables |= {ENVS_VAR: str(envs), "HPCJOB_LOG_DIR": str(job_dir), "HPCJOB_NODE": "N1"}
    (job_dir / variables[REQUIREMENTS_VAR]).parent.mkdir(parents=True)
    (job_dir / variables[REQUIREMENTS_VAR]).write_text(requirements(wheelhouse))
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=2m tmpfs "$0" && exec "$@"', str(envs),
         sys.executable, str(ENV_BUILDER)],
        cwd=job_dir, env=variables, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("hpcjob: error: the job's environment did not build: the disk of ") and (
        " is full (" in said and "-m venv said: Error: " in said
    ), said
    assert "python3-venv" not in said


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_the_nodes_install_the_lock_and_refuse_a_replaced_or_added_wheel(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """The wheels' folder is the user's own, and the nodes' pip is the guard besides: with the lock
    (every wheel name==version with its SHA-256, --require-hashes), a replaced tinya-1.0 is refused by pip
    itself, and an added tinya-99.0 is never taken."""
    wheel = wheelhouse / "tinya-1.0-py3-none-any.whl"
    lock = wheel_lock([(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())])
    text = node_requirements(lock, str(wheelhouse))
    make_wheel(wheelhouse, "tinya", "99.0", "VALUE = 'evil'\n")  # added by someone else: never taken
    code, python, err = finish(run_builder(tmp_path / "a", tmp_path / "envs-a", text))
    assert code == 0, err
    done = subprocess.run([python, "-c", "import tinya; print(tinya.VALUE)"], capture_output=True, text=True)
    assert done.stdout.strip() == "a1", done.stderr
    make_wheel(wheelhouse, "tinya", "1.0", "VALUE = 'replaced'\n")  # the same name, other bytes
    code, _, err = finish(run_builder(tmp_path / "b", tmp_path / "envs-b", text))
    assert code != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in err, err


@pytest.mark.slow  # builds virtual environments with pip: seconds each
def test_an_environment_that_changed_after_its_build_is_built_again(tmp_path: Path, wheelhouse: Path) -> None:
    text = requirements(wheelhouse, "tinya==1.0")
    envs = tmp_path / "envs"
    code, python, err = finish(run_builder(tmp_path, envs, text))
    assert code == 0, err
    owner = envs / next(p.name for p in envs.iterdir())
    ready = json.loads(next(owner.glob("*.ready")).read_text())
    assert len(ready["digest"]) == 64
    code, again, err = finish(run_builder(tmp_path, envs, text))
    assert (code, again) == (0, python) and "built before" in err  # the digest holds
    planted = next(Path(python).parents[1].glob("lib/python*/site-packages/tinya")) / "__init__.py"
    planted.write_text("VALUE = 'changed'\n")  # what pip installed, changed after the build
    code, rebuilt, err = finish(run_builder(tmp_path, envs, text))
    assert code == 0 and "changed since it was built: building it again" in err, err
    done = subprocess.run([rebuilt, "-c", "import tinya; print(tinya.VALUE)"], capture_output=True, text=True)
    assert done.stdout.strip() == "a1" and rebuilt != python


def test_the_wheels_on_the_share_are_compared_by_digest_only_where_size_or_time_differ(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """The manifest names each wheel's SHA-256, size and time on the share: trusted while they hold."""
    from hpcjob.store.share import LocalFolder
    from hpcjob.store.wheelhouse import upload

    class Counting(LocalFolder):
        digests: ClassVar[list[str]] = []

        def sha256(self, relative: str) -> str:
            self.digests.append(relative)
            return super().sha256(relative)

    share = Counting(tmp_path / "share")
    wheels = sorted(wheelhouse.glob("*.whl"))
    assert upload(wheels, share, "hpcjob/alice").sent == 2
    report = upload(wheels, share, "hpcjob/alice")
    assert (report.sent, report.already_there, share.digests) == (0, 2, [])  # size and time hold: not read
    on_share = tmp_path / "share" / "hpcjob" / "alice" / "wheels" / wheels[0].name
    os.utime(on_share, (1, 1))  # the time differs, the bytes do not: read and compared, not sent
    assert upload(wheels, share, "hpcjob/alice").sent == 0
    assert share.digests == [f"hpcjob/alice/wheels/{wheels[0].name}"]
    on_share.write_bytes(bytes(len(wheels[0].read_bytes())))  # the same size, other bytes: sent again
    assert upload(wheels, share, "hpcjob/alice").sent == 1 and on_share.read_bytes() == wheels[0].read_bytes()
