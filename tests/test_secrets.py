"""Secrets reach the job without being written where others read (issue 38 item 3).

Every cluster user can read a job's environment, and the run history keeps the command: a value that
looks like a secret is refused in `--env` and in requirements lines, pointing to `--secret`, and names
that hold a secret's usual words are refused too. Each refusal names what it matched, never the value.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpcjob.backends.local import free_port
from hpcjob.job.options import JobOptions
from hpcjob.job.spec import HpcjobError, JobSpec, SpecError, check_requirements

from .conftest import empty_script, stand_in_python
from .test_bad_input import ONE_CLUSTER
from .test_bad_input import Case as BadCase
from .test_bad_input import S as BAD_SCRIPT
from .test_bad_input import case as bad_case
from .test_bad_input import test_bad_input_is_refused_in_one_line as refused_in_one_line
from .test_rest_e2e import (
    Cluster,
    cluster,  # noqa: F401 - the fixture: the emulated head node, a real smbd
)
from .test_share_private import Share as SmbShare
from .test_share_private import share  # noqa: F401 - the fixture: alice, mallory and a real smbd

# Values and names made up for these tests: none is anyone's.
SECRET_VALUES = [
    ("postgres://app:pw4321@db.contoso.com/x", "a URL with a user and password (postgres://USER:PASSWORD@)"),
    ("redis://:pw4321@cache:6379/0", "a URL with a user and password (redis://USER:PASSWORD@)"),
    ("mongodb+srv://app:pw4321@cluster0.example.net/db", "(mongodb+srv://USER:PASSWORD@)"),
    ("amqp://guest:pw4321@rabbit:5672/", "(amqp://USER:PASSWORD@)"),
    ("s3://AKIAEXAMPLE:pw4321@bucket/key", "(s3://USER:PASSWORD@)"),
    ("ftp://me:pw4321@files.example.com/", "(ftp://USER:PASSWORD@)"),
    ("https://me:pw4321@example.com/", "a URL with a user or token"),
    ("https://graph.example.com/v1?access_token=abc123", "the query parameter access_token="),
    ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=abc%2Bdef", "the query parameter sig="),
    ("https://example.com/hook?Signature=abc", "the query parameter signature="),
    ("https://example.com/x?a=1&token=abc", "the query parameter token="),
    ("https://example.com/login;password=abc", "the query parameter password="),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bm90YXJlYWxrZXk=;EndpointSuffix=core",
        "AccountKey=",
    ),
    ("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=abc", "Shared"),
]


def spec(**fields: object) -> JobSpec:
    return JobSpec(script="train.py", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "matched"), SECRET_VALUES)
def test_a_secret_looking_env_value_is_refused_naming_what_it_matched_and_never_the_value(
    value: str, matched: str
) -> None:
    with pytest.raises(SpecError) as info:
        spec(env=(("SOME_SETTING", value),))
    said = str(info.value)
    assert matched in said and "--secret SOME_SETTING" in said and "\n" not in said
    assert "pw4321" not in said and "abc" not in said and "bm90" not in said


@pytest.mark.parametrize(("value", "matched"), SECRET_VALUES)
def test_a_secret_looking_requirements_line_is_refused_pointing_to_secret(value: str, matched: str) -> None:
    with pytest.raises(SpecError) as info:
        check_requirements(f"torch\n--extra-index-url {value}\n")
    said = str(info.value)
    assert said.startswith("requirements line 2:") and matched in said and "--secret" in said
    assert "pw4321" not in said and "abc" not in said


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        ("AZURE_STORAGE_CONNECTION_STRING", "CONNECTION_STRING"),
        ("DATABASE_URL", "DATABASE_URL"),
        ("SAS", "SAS"),
        ("BLOB_SAS", "SAS"),
        ("SAS_URL", "SAS"),
        ("MY_SAS_URI", "SAS"),
        ("SMTP_PASS", "PASS"),
        ("DB_PASSWORD", "PASSWORD"),
        ("HF_TOKEN", "TOKEN"),
    ],
)
def test_a_secret_looking_env_name_is_refused_naming_the_word_it_holds(name: str, matched: str) -> None:
    with pytest.raises(SpecError) as info:
        spec(env=((name, "x"),))
    said = str(info.value)
    assert f"holds {matched}" in said and "looks like a secret" in said and f"--secret {name}" in said


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATA_URL", "https://example.com/data?key=train/x.bin"),
        ("SASL_MECHANISM", "SCRAM-SHA-256"),
        ("KAFKA_SASL", "plain"),
        ("PASSAGE_DIR", "/data/passages"),
        ("COMPASS", "north"),
        ("BYPASS_CACHE", "1"),
        ("CONNECTION_TIMEOUT", "30"),
        ("DATABASE_NAME", "runs"),
        ("REPO", "ssh://git@github.com/a/b.git"),
        ("MIRROR", "https://pypi.example.com/simple"),
        ("EMAIL", "me@example.com"),
        ("WANDB_PROJECT", "a@b"),
        ("QUERY", "https://example.com/x?tokens=512&signatures=off&design=1"),
        ("STORAGE", "AccountName=acct;EndpointSuffix=core.windows.net"),
        ("NOTE", "postgres://db.example.com/x"),
        ("PROXY", "http://proxy.example.com:3128"),
    ],
)
def test_harmless_values_and_names_still_pass(name: str, value: str) -> None:
    assert spec(env=((name, value),)).env == ((name, value),)
    check_requirements(f"torch\n# {value}\nhttps://example.com/pkg.whl?key=train/x.bin\n")


# --- `--secret NAME`: the value from this machine's environment, to an owner-only file of the attempt's.

SECRET_VALUE = "s3cr3t-Value-4-tests $(touch /tmp/never) `x` \\n 'q' \"dq\" =tail"


@pytest.mark.parametrize(
    ("names", "env", "message"),
    [
        (("1X",), (), "--secret '1X': a variable name"),
        (("A-B",), (), "a variable name"),
        (("TOKEN", "TOKEN"), (), "--secret TOKEN: named twice"),
        (("MY_SETTING",), (("MY_SETTING", "x"),), "--secret MY_SETTING and --env MY_SETTING both"),
        (("HPCJOB_SECRETS_FILE",), (), "hpcjob, the node agent or the task's shell set this name"),
        (("CCP_JOBID",), (), "set this name"),
        (("PATH",), (), "set this name"),
        (("LD_PRELOAD",), (), "set this name"),
        (tuple(f"S{i}" for i in range(65)), (), "more than 64"),
    ],
)
def test_bad_secret_names_are_refused_in_one_line(
    names: tuple[str, ...], env: tuple[tuple[str, str], ...], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        spec(secrets=names, env=env)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_each_attempt_names_a_file_of_its_own_in_the_job_folder_and_the_job_holds_no_value() -> None:
    from hpcjob.job.plan import SECRETS_VAR, make_plan, run_secrets_files, secrets_in_environment
    from hpcjob.job.render import job_xml, plan_json

    from .conftest import cluster_spec

    job = cluster_spec(2, secrets=("WANDB_API_KEY", "HF_TOKEN"))
    first = make_plan(job, job.node_names, "train-1")
    second = make_plan(job, job.node_names, "train-1", attempt=2)
    assert first.secrets_file == "hpcjob/run_ddp/.hpcjob/secrets/train-1.env"
    assert second.secrets_file == "hpcjob/run_ddp/.hpcjob/secrets/train-1.2.env"
    assert dict(second.env)[SECRETS_VAR] == "/app/hpcjob/run_ddp/.hpcjob/secrets/train-1.2.env"
    assert first.secret_names == ("WANDB_API_KEY", "HF_TOKEN")
    xml = job_xml(first)
    assert "/app/hpcjob/run_ddp/.hpcjob/secrets/train-1.env" in xml and "WANDB_API_KEY" not in xml
    assert make_plan(cluster_spec(2), job.node_names, "train-1").secrets_file is None  # none asked for
    listing = ["train-1.env", "train-1.2.env", "train-1.x.env", "train-10.env", "other.env", "train-1"]
    assert run_secrets_files("train-1", listing) == ["train-1.env", "train-1.2.env"]
    # On this machine: no file; the tasks inherit the values, and their names say which.
    local = secrets_in_environment(first)
    assert local.secrets_file is None and SECRETS_VAR not in dict(local.env)
    assert dict(local.env)["HPCJOB_SECRET_NAMES"] == "WANDB_API_KEY,HF_TOKEN"
    assert "secrets_file" in plan_json(first) and SECRET_VALUE not in plan_json(first)


def test_a_container_task_here_gets_each_secret_by_name_from_docker_s_own_environment() -> None:
    from hpcjob.job.plan import container_command

    env = {"CCP_DOCKER_IMAGE": "img:1", "HPCJOB_SECRET_NAMES": "A_KEY,B"}
    words = container_command(env, "true", name="n", env_file="/f", user="1:1", workdir="/w")
    assert words[words.index("-e") : words.index("-e") + 4] == ["-e", "A_KEY", "-e", "B"]
    assert not any("=" in word for word in words if word not in ("/f",))


def test_the_values_come_from_the_environment_and_a_missing_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcjob.store.secrets import secret_values

    assert secret_values(("A", "B"), {"A": "1", "B": "x=y z"}) == {"A": "1", "B": "x=y z"}
    with pytest.raises(SpecError, match=r"^--secret B: no environment variable B here; set it"):
        secret_values(("A", "B"), {"A": "1"})
    with pytest.raises(SpecError, match="holds a line break") as info:
        secret_values(("A",), {"A": "line1\nline2"})
    assert "line1" not in str(info.value)


def test_the_node_helper_reads_the_file_into_the_task_without_tracing_a_value(tmp_path: Path) -> None:
    from hpcjob.job.plan import secrets_text
    from hpcjob.store.staging import node_files

    for relative, content in node_files():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    secrets = tmp_path / ".hpcjob" / "secrets" / "run-1.env"
    secrets.parent.mkdir()
    secrets.write_text(secrets_text({"MY_KEY": SECRET_VALUE, "OTHER": ""}) + "not a line\n1BAD=x\n")
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HPCJOB_IFNAME": "lo", "CCP_NODES": "1 N1 1"}
    # The test's own printing untraced: only the helper's reading is on trial.
    show = 'f=$-; { set +x; } 2>/dev/null; printf "%s|%s|%s" "$MY_KEY" "${OTHER-unset}" "$f"'
    done = subprocess.run(
        ["/bin/bash", "-c", f"set -x; HPCJOB_SECRETS_FILE={secrets} . .hpcjob/node.sh N1 run-1 && {show}"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    value, other, flags = done.stdout.split("|")
    assert (value, other) == (SECRET_VALUE, "") and "x" in flags  # tracing is back on after the file
    assert "s3cr3t" not in done.stderr and not Path("/tmp/never").exists()
    gone = subprocess.run(
        ["/bin/bash", "-c", f"HPCJOB_SECRETS_FILE={secrets}.gone . .hpcjob/node.sh N1 run-1 && echo ran"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert gone.returncode == 1 and "ran" not in gone.stdout
    assert "secrets file" in gone.stderr and "is not there to read" in gone.stderr


def test_a_local_share_s_secrets_file_is_the_owner_s_alone_and_made_anew(tmp_path: Path) -> None:
    from hpcjob.store.secrets import remove_run_secrets, write_secrets
    from hpcjob.store.share import LocalFolder

    folder = LocalFolder(tmp_path)
    old = tmp_path / "job" / ".hpcjob" / "secrets" / "r-1.env"
    old.parent.mkdir(parents=True)
    old.write_text("OLD=1\n")
    old.chmod(0o644)  # left from before, readable by all: replaced, not reused
    write_secrets(folder, "job/.hpcjob/secrets/r-1.env", {"K": SECRET_VALUE})
    assert old.read_text() == f"K={SECRET_VALUE}\n" and stat.S_IMODE(old.stat().st_mode) == 0o600
    write_secrets(folder, "job/.hpcjob/secrets/r-1.2.env", {"K": "2"})
    (old.parent / "r-10.env").write_text("")
    assert sorted(remove_run_secrets(folder, "job", "r-1")) == ["r-1.2.env", "r-1.env"]
    assert [p.name for p in old.parent.iterdir()] == ["r-10.env"]  # another run's stays
    link = old.parent / "r-2.env"
    link.symlink_to(tmp_path / "elsewhere")
    write_secrets(folder, "job/.hpcjob/secrets/r-2.env", {"K": "v"})  # the link is removed, not followed
    assert not (tmp_path / "elsewhere").exists() and not link.is_symlink()


def hpcjob_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def everything_written(*folders: Path) -> bytes:
    """Every byte of every file under `folders`: the history's database, the share, the logs."""
    return b"".join(p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file())


def test_render_says_where_the_file_would_be_and_reads_no_value(tmp_path: Path) -> None:
    from .conftest import empty_script

    script = empty_script(tmp_path)
    env = {"MY_KEY": SECRET_VALUE}
    done = hpcjob_cli(
        "render",
        "--node",
        "GPU1",
        "--secret",
        "MY_KEY",
        "--share",
        "//HEAD/CcpSpoolDir",
        str(script),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    xml = "".join(done.stdout.split())
    assert re.search(
        r"<Name>HPCJOB_SECRETS_FILE</Name><Value>/app/hpcjob/[^/]+/train/\.hpcjob/secrets/train-", xml
    )
    assert "secrets (MY_KEY) from /app/hpcjob/" in done.stderr and "//HEAD/CcpSpoolDir/hpcjob/" in done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr
    unset = {k: v for k, v in os.environ.items() if k != "MY_KEY"}
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "render", "--node", "GPU1", "--secret", "MY_KEY", str(script)],
        capture_output=True, text=True, timeout=120, env=unset,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr  # render needs no value: it reads none
    assert "--secret" in hpcjob_cli("run", "--help").stdout
    assert "environment variable NAME" in " ".join(hpcjob_cli("submit", "--help").stdout.split())


def test_a_missing_secret_is_one_line_exit_2_and_nothing_is_started_or_recorded(tmp_path: Path) -> None:
    from hpcjob.store.runs import history_file

    from .conftest import empty_script

    share_dir = tmp_path / "share"
    unset = {k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"}
    done = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", "run", "--local", "--mount-point", str(share_dir), "--secret",
         "NOT_SET_ANYWHERE", str(empty_script(tmp_path))],
        capture_output=True, text=True, timeout=120, env=unset,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("hpcjob: error: --secret NOT_SET_ANYWHERE: no environment variable")
    assert not share_dir.exists() and not history_file().exists()


def test_a_local_run_hands_the_value_to_the_tasks_environment_alone(tmp_path: Path) -> None:
    """A local job whose script says whether it got the secret; no byte of the value in the run's history,
    its plan, its folder or its logs; no secrets file."""
    from hpcjob.store.runs import find_entry, history_file

    from .conftest import empty_script, run_local, stand_in_python

    said = 'if [ "$MY_KEY" = "$EXPECTED" ]; then echo "got the secret"; else echo "no secret"; fi'
    python = stand_in_python(tmp_path, said)
    share_dir = tmp_path / "share"
    env = {**os.environ, "MY_KEY": SECRET_VALUE, "EXPECTED": SECRET_VALUE}
    args = ("--run-id", "sec-local-1", "--python", str(python), "--mount-point", str(share_dir), "-n", "2")
    done = run_local(*args, "--secret", "MY_KEY", str(empty_script(tmp_path)), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("got the secret") == 2 and "no secret" not in done.stdout
    plan = find_entry("sec-local-1").plan or {}
    assert plan["secret_names"] == ["MY_KEY"] and plan["env"]["HPCJOB_SECRET_NAMES"] == "MY_KEY"
    assert "HPCJOB_SECRETS_FILE" not in plan["env"] and not list(share_dir.rglob("*.env"))
    assert b"s3cr3t" not in everything_written(history_file().parent, share_dir)
    assert "s3cr3t" not in done.stdout + done.stderr


needs_smbd_and_root = [
    pytest.mark.skipif(
        shutil.which("smbd") is None, reason="needs samba's smbd (scripts/bootstrap.sh --test)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="two accounts of this machine log in: root makes them"),
]


@needs_smbd_and_root[0]
@needs_smbd_and_root[1]
def test_another_user_of_the_share_cannot_read_the_secrets_file(
    share: SmbShare,  # noqa: F811 - the fixture of that name
    tmp_path: Path,
) -> None:
    """Through a real smbd that enforces Windows ACLs: alice's secrets file has a DACL of hers alone, and
    the server refuses mallory, who reads it as herself; removing it leaves nothing."""
    from hpcjob.store import smb_acl
    from hpcjob.store.secrets import remove_run_secrets, write_secrets
    from hpcjob.store.staging import stage_run

    from .test_share_private import code, refused

    admin = share.as_user("hpcuser")
    admin.prepare_common("hpcjob")
    admin.close()
    alice = share.as_user("hpcjob-alice")
    relative = "hpcjob/alice/train/.hpcjob/secrets/r-1.env"
    data = f"MY_KEY={SECRET_VALUE}\n".encode()
    stage_run(code(tmp_path), alice, "hpcjob/alice/train", "r-1", user_folder="hpcjob/alice",
              private_files=[(relative, data)])  # fmt: skip
    alice = share.as_user("hpcjob-alice")  # stage_run closed the first
    assert alice.read_bytes(relative) == data
    with alice._smb.open_file(
        alice._path(relative), mode="rb", buffering=0, **alice._on, desired_access=smb_acl.READ_CONTROL
    ) as f:
        security = smb_acl.read_security(f.fd)
    assert security.protected and [(a.sid, a.allow) for a in security.dacl or ()] == [(security.owner, True)]
    assert smb_acl.others_who_may_read(security, str(security.owner)) == []
    mallory = share.as_user("hpcjob-mallory")
    assert "0xc0000022" in refused(lambda: mallory.read_bytes(relative)).lower()  # STATUS_ACCESS_DENIED
    assert "0xc0000022" in refused(lambda: mallory.remove(relative)).lower()
    write_secrets(alice, "hpcjob/alice/train/.hpcjob/secrets/r-1.2.env", {"MY_KEY": "2"})  # attempt 2's
    assert remove_run_secrets(alice, "hpcjob/alice/train", "r-1") == ["r-1.2.env", "r-1.env"]
    assert alice.listdir("hpcjob/alice/train/.hpcjob/secrets") == []
    alice.close()
    mallory.close()


def test_a_cluster_job_gets_its_secret_from_an_owner_only_file_that_is_gone_when_it_ends(
    cluster: Cluster,  # noqa: F811 - the fixture of that name
    tmp_path: Path,
) -> None:
    """On the emulated cluster, its share a real smbd: `submit --wait --secret` writes the attempt's file
    (mode 0600) before the job, the tasks say they got the value, the follower removes the file at the
    end; no byte of the value in the job the scheduler holds, the history, the share or the logs. Without
    --wait the file stays while the job runs, and `hpcjob status` of the ended run removes it."""
    from hpcjob.store.runs import history_file

    said = 'if [ "$MY_KEY" = "$EXPECTED" ]; then echo "got the secret"; else echo "no secret"; fi'
    python = stand_in_python(tmp_path, f"{said}; sleep ${{SLEEP_S:-0}}")
    cluster.env.update(MY_KEY=SECRET_VALUE)
    cluster.head.cluster.base_env["EXPECTED"] = SECRET_VALUE  # the nodes' own, to compare with
    job = ["-n", "2", "--python", str(python), "--rdzv-port", str(free_port()), "--secret", "MY_KEY"]
    done = cluster.hpcjob(
        "submit", "--wait", "--json", "--run-id", "sec-1", *job, str(empty_script(tmp_path))
    )
    assert done.returncode == 0, done.stderr[-3000:]
    secrets = cluster.share_dir / "hpcjob" / "alice" / "train" / ".hpcjob" / "secrets"
    assert (
        "1 secret(s) for the job in hpcjob/alice/train/.hpcjob/secrets/sec-1.env, yours alone" in done.stderr
    )
    assert list(secrets.iterdir()) == []  # removed by the follower at the attempt's end
    logs = cluster.hpcjob("logs", "sec-1")
    assert logs.stdout.count("got the secret") == 2 and "no secret" not in logs.stdout, logs.stdout
    with cluster.head.cluster.lock:
        held = json.dumps(
            [
                [j.props, j.env, [[t.props, t.env] for t in j.tasks]]
                for j in cluster.head.cluster.jobs.values()
            ]
        )
    assert "s3cr3t" not in held and "sec-1.env" in held  # the job names the file, never the value
    state = Path(cluster.env.get("XDG_STATE_HOME", str(history_file().parent.parent)))
    assert b"s3cr3t" not in everything_written(state, cluster.share_dir)
    assert "s3cr3t" not in done.stdout + done.stderr + logs.stdout + logs.stderr

    cluster.head.cluster.base_env["SLEEP_S"] = "4"
    started = cluster.hpcjob("submit", "--run-id", "sec-2", *job, str(empty_script(tmp_path)))
    assert started.returncode == 0, started.stderr[-3000:]
    mine = secrets / "sec-2.env"
    assert mine.read_text() == f"MY_KEY={SECRET_VALUE}\n"  # while the job runs, nobody asking about it
    deadline = time.monotonic() + 120  # a 4 s job, on a loaded 2-core CI machine
    state = ""
    while time.monotonic() < deadline and state != "Finished":  # the job's, not a task's that ended first
        state = json.loads(cluster.hpcjob("status", "--json", "sec-2").stdout)["state"]
        time.sleep(1)
    assert state == "Finished", state
    assert not mine.exists()  # the status that saw it ended removed it


def test_a_later_attempt_gets_a_file_of_its_own_read_from_the_environment_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcjob.job.plan import make_plan
    from hpcjob.store.secrets import hand_over_secrets
    from hpcjob.store.share import LocalFolder

    from .conftest import cluster_spec

    job = cluster_spec(2, secrets=("MY_KEY",))
    second = make_plan(job, job.node_names, "train-1", attempt=2)
    opened: list[LocalFolder] = []

    def share_here() -> LocalFolder:
        opened.append(LocalFolder(tmp_path))
        return opened[-1]

    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(SpecError, match=r"^--secret MY_KEY: no environment variable MY_KEY here"):
        hand_over_secrets(job, second, share_here, local=False)  # the attempt does not start
    assert opened == []
    monkeypatch.setenv("MY_KEY", SECRET_VALUE)
    assert hand_over_secrets(job, second, share_here, local=False) == second
    written = tmp_path / "hpcjob" / "run_ddp" / ".hpcjob" / "secrets" / "train-1.2.env"
    assert written.read_text() == f"MY_KEY={SECRET_VALUE}\n" and stat.S_IMODE(written.stat().st_mode) == 0o600
    here = hand_over_secrets(job, second, share_here, local=True)  # this machine's: no file
    assert here.secrets_file is None and dict(here.env)["HPCJOB_SECRET_NAMES"] == "MY_KEY"
    assert len(opened) == 1


def test_a_later_attempt_whose_submission_fails_leaves_no_secrets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No job of it will read the file: it goes with the failed submission, not at the next `status`."""
    from hpcjob.job.plan import make_plan
    from hpcjob.runner import Retries, submit_attempt
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import LocalFolder

    from .conftest import cluster_spec

    job = cluster_spec(2, secrets=("MY_KEY",))
    monkeypatch.setenv("MY_KEY", SECRET_VALUE)

    class Refusing:
        kind = "rest"

        def plan(self, spec: Any, run_id: str, attempt: int = 1) -> Any:
            return make_plan(spec, spec.node_names, run_id, attempt=attempt)

        def submit(self, plan: Any, **kwargs: Any) -> str:
            raise HpcjobError("the head node refused the job")

    first = RunRecord("train-1", "run_ddp", "rest", job.job_folder, job.node_names, cluster="lab")
    with pytest.raises(HpcjobError, match="refused"):
        submit_attempt(
            Refusing(), job, first, lambda: LocalFolder(tmp_path), Retries(1), mount_step=False,  # type: ignore[arg-type]
            progress=lambda line: None,
        )  # fmt: skip
    secrets = tmp_path / "hpcjob" / "run_ddp" / ".hpcjob" / "secrets"
    assert list(secrets.iterdir()) == []  # train-1.2.env was written, then removed


@pytest.mark.parametrize("command", ["status", "wait", "cancel"])
def test_status_wait_or_cancel_of_an_ended_run_removes_a_left_over_file(tmp_path: Path, command: str) -> None:
    """A file its follower could not remove (the share away, the follower killed): the next look at the
    ended run removes every one of its attempts', and no other run's."""
    from .conftest import run_local

    run_id = f"left-{command}"  # its own: a cancel finds a local run's processes by its id
    python = stand_in_python(tmp_path, "true")
    share_dir = tmp_path / "share"
    env = {**os.environ, "MY_KEY": SECRET_VALUE}
    args = (
        "--run-id",
        run_id,
        "--python",
        str(python),
        "--mount-point",
        str(share_dir),
        "--secret",
        "MY_KEY",
    )
    assert run_local(*args, str(empty_script(tmp_path)), env=env).returncode == 0
    secrets = share_dir / "hpcjob" / "train" / ".hpcjob" / "secrets"
    secrets.mkdir(parents=True)
    for name in (f"{run_id}.env", f"{run_id}.2.env", f"{run_id}0.env"):
        (secrets / name).write_text("MY_KEY=x\n")
    done = hpcjob_cli(command, run_id)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in secrets.iterdir()) == [f"{run_id}0.env"]


def test_a_profile_s_secrets_come_first_and_bad_ones_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcjob.runner import job_spec
    from hpcjob.store.config import ClusterProfile

    profile = ClusterProfile.from_table(
        "lab", {"url": "https://head", "user": "alice", "secrets": ["WANDB_API_KEY", "HF_TOKEN"]}
    )
    assert profile.secrets == ("WANDB_API_KEY", "HF_TOKEN")
    for bad, said in ((["1X"], "a variable name"), ("HF_TOKEN", "must be an array of names"), ([1], "array")):
        with pytest.raises(SpecError, match=said) as info:
            ClusterProfile.from_table("lab", {"url": "https://head", "user": "alice", "secrets": bad})
        assert str(info.value).startswith("cluster lab: ")
    script = empty_script(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "a")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    options = JobOptions(str(script), node_names=("N1",), secrets=("MINE", "HF_TOKEN"))
    with pytest.raises(SpecError, match=r"^--secret HF_TOKEN: no environment variable"):
        job_spec(options, profile)  # a job to run: its values are read before anything else
    monkeypatch.setenv("HF_TOKEN", "b")
    monkeypatch.setenv("MINE", "c")
    assert job_spec(options, profile).secrets == ("WANDB_API_KEY", "HF_TOKEN", "MINE")
    unread = dataclasses.replace(options, secrets=("NOT_HERE_FOR_RENDER",))
    assert job_spec(unread).secrets == ("NOT_HERE_FOR_RENDER",)


def test_the_python_api_takes_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcjob

    monkeypatch.setenv("MY_KEY", SECRET_VALUE)
    monkeypatch.setenv("EXPECTED", SECRET_VALUE)
    python = stand_in_python(tmp_path, 'if [ "$MY_KEY" = "$EXPECTED" ]; then echo got; else echo none; fi')
    run = hpcjob.submit(empty_script(tmp_path), nodes=1, python=str(python), secrets=["MY_KEY"], wait=True)
    assert run.summary is not None and run.summary.state == "Finished"
    assert [line for _, stream, line in run.logs() if stream == "stdout"] == ["got"]
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(hpcjob.SpecError, match=r"^--secret MY_KEY: no environment variable MY_KEY"):
        hpcjob.submit(empty_script(tmp_path, "b/train.py"), nodes=1, secrets=["MY_KEY"])


# The red-team battery's rule (tests/test_bad_input.py) for the new options and refusals: one line, exit
# 2, nothing started or recorded, the value never printed.
LEAKED = "Xyzzy-Leak-42"
SECRET_CASES = [
    bad_case("run-secret-unset", f"run --local --secret NOT_SET_HERE_X {BAD_SCRIPT}"),
    bad_case("submit-secret-unset", f"submit --secret NOT_SET_HERE_X {BAD_SCRIPT}", config=ONE_CLUSTER),
    bad_case("submit-secret-line-break", f"submit --secret TWO_LINES {BAD_SCRIPT}", config=ONE_CLUSTER,
             env={"TWO_LINES": f"a\n{LEAKED}"}, secrets=(LEAKED,)),
    bad_case("render-secret-bad-name", f"render --node A --secret 1X {BAD_SCRIPT}"),
    bad_case("render-secret-hpcjob-s-own", f"render --node A --secret HPCJOB_SECRETS_FILE {BAD_SCRIPT}"),
    bad_case("render-secret-twice", f"render --node A --secret K --secret K {BAD_SCRIPT}"),
    bad_case("render-secret-and-env", f"render --node A --secret K --env K=1 {BAD_SCRIPT}"),
    bad_case("run-env-postgres-url", f"run --local --env DB=postgres://u:{LEAKED}@db/x {BAD_SCRIPT}",
             secrets=(LEAKED,)),
    bad_case("render-env-sas-url", ["render", "--node", "A", "--env",
             f"T=https://a.blob.core.windows.net/c?sv=1&sig={LEAKED}", BAD_SCRIPT], secrets=(LEAKED,)),
    bad_case("submit-env-access-token", f"submit --env U=https://x/api?access_token={LEAKED} {BAD_SCRIPT}",
             config=ONE_CLUSTER, secrets=(LEAKED,)),
    bad_case("run-env-storage-connection-string", ["run", "--local", "--env",
             f"C=DefaultEndpointsProtocol=https;AccountName=a;AccountKey={LEAKED}", BAD_SCRIPT],
             secrets=(LEAKED,)),
    bad_case("render-env-connection-string-name",
             f"render --node A --env AZURE_STORAGE_CONNECTION_STRING=x {BAD_SCRIPT}"),
    bad_case("run-requirements-token", f"run --local --requirements code/req.txt {BAD_SCRIPT}",
             files={"code/req.txt": f"torch\n--extra-index-url https://x/simple?token={LEAKED}\n"},
             secrets=(LEAKED,)),
    bad_case("submit-profile-secrets-bad", f"submit {BAD_SCRIPT}",
             config=ONE_CLUSTER + 'secrets = ["1X"]\n'),
]  # fmt: skip


@pytest.mark.parametrize("bad", SECRET_CASES)
def test_bad_secret_input_is_refused_as_the_battery_says(bad: BadCase, tmp_path: Path) -> None:
    refused_in_one_line(bad, tmp_path)


def test_powershell_s_secret_parameter_is_submit_s_and_run_s_secret_option() -> None:
    from .test_powershell_module import MOD, build_arguments, parse_with_click

    for command in ("Submit-HpcTorchJob", "Invoke-HpcTorchJob"):
        entry = MOD.cli[command]
        assert MOD.functions[command].parameters["Secret"].type == "string[]"
        parsed = parse_with_click(entry, build_arguments(entry, {"Script": "t.py", "Secret": ["A_KEY", "B"]}))
        assert parsed["secrets"] == ("A_KEY", "B")


def test_a_submission_that_fails_leaves_no_secrets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No job will read the file of an attempt whose job never reached the scheduler: it goes at once."""
    from hpcjob.job.plan import JobPlan, make_plan
    from hpcjob.job.results import Submission
    from hpcjob.runner.submit import submit_run
    from hpcjob.store.share import LocalFolder

    from .conftest import cluster_spec

    class Refusing:  # a cluster's backend whose head node refuses the job once it is made
        kind = "rest"

        def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
            return make_plan(spec, spec.node_names, run_id, attempt=attempt)

        def submit(self, plan: JobPlan, *, mount: bool, progress: object, record: Any) -> str:
            record(Submission("created", job_id="7"))
            raise HpcjobError("the head node refused the job")

    monkeypatch.setenv("MY_KEY", SECRET_VALUE)
    job = cluster_spec(1, script=str(empty_script(tmp_path)), secrets=("MY_KEY",))
    written: list[bool] = []

    def open_share(plan: JobPlan) -> LocalFolder:
        written.append((tmp_path / "share" / str(plan.secrets_file)).exists())
        return LocalFolder(tmp_path / "share")

    with pytest.raises(HpcjobError, match="refused"):
        submit_run(Refusing(), job, "fail-1", open_folder=open_share, where=lambda plan: {}, mount_step=False,  # type: ignore[arg-type]
                   progress=lambda line: None, command="hpcjob submit")  # fmt: skip
    secrets = tmp_path / "share" / "hpcjob" / "train" / ".hpcjob" / "secrets"
    assert written[0] is False and secrets.is_dir() and list(secrets.iterdir()) == []


def test_submit_dry_run_says_it_would_write_the_file_and_shows_no_value(
    cli_with_profile: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hpcjob = cli_with_profile("pw", url="https://127.0.0.1:1", user="alice", share="//HEAD/CcpSpoolDir")
    monkeypatch.setenv("MY_KEY", SECRET_VALUE)
    script = str(empty_script(tmp_path))
    done = hpcjob("submit", "--dry-run", "--node", "N1", "--secret", "MY_KEY", "--run-id", "dry-1", script)
    assert done.code == 0, done.err
    assert (
        "# would write the secrets MY_KEY, from this machine's environment, to hpcjob/alice/train/"
        in done.out
    )
    assert "HPCJOB_SECRETS_FILE" in done.out and "s3cr3t" not in done.out + done.err
