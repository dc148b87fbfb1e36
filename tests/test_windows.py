"""The client commands on Windows, proved here without Windows: mypy as for win32 over the client
modules, the modules imported and the commands run with POSIX-only modules unavailable, and the
configuration and run records in the Windows locations."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hpcjob"
# What never runs on a Windows client, and why.
POSIX_ONLY = {
    "backends/local": "run --local: bash and torchrun in POSIX process groups (says it needs Linux)",
    "node": "runs on the Linux nodes",
    "checks/probes": "runs on the Linux nodes",
    "emulator": "the test head node, for Linux test machines",
}
CLIENT_COMMANDS = ("render", "submit", "status", "logs", "pull", "cancel", "nodes", "mount", "doctor", "runs")


def client_modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not any(
            path.relative_to(PACKAGE).as_posix() == skip
            or path.relative_to(PACKAGE).as_posix().startswith(f"{skip}/")
            for skip in POSIX_ONLY
        )
    )


def test_the_client_modules_type_check_for_windows() -> None:
    modules = client_modules()
    assert (
        PACKAGE / "cli" / "cluster.py" in modules
        and PACKAGE / "backends" / "local" / "procs.py" not in modules
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--platform", "win32", "--follow-imports=silent", *map(str, modules)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_client_commands_run_without_posix_only_modules(tmp_path: Path) -> None:
    """Every client module imports, and each client command parses and runs as far as it can without
    a cluster, with fcntl, termios, pwd, grp, resource, pty and the like missing, as on Windows."""
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    names = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in client_modules()
        if p.name != "__main__.py"  # runs the CLI when imported
    ]
    program = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys
        BLOCKED = {{"fcntl", "termios", "pwd", "grp", "resource", "pty", "tty", "syslog", "posix_ipc"}}
        for name in BLOCKED:
            sys.modules.pop(name, None)

        class NoPosix(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name in BLOCKED:
                    raise ImportError(f"no module named {{name!r}} (as on Windows)")
                return None

        sys.meta_path.insert(0, NoPosix())
        for name in {names!r}:
            importlib.import_module(name)
        from click.testing import CliRunner
        from hpcjob.cli import cli
        runner = CliRunner()
        for command in {CLIENT_COMMANDS!r}:
            assert runner.invoke(cli, [command, "--help"]).exit_code == 0, command
        job = ["render", "-n", "2", "--node", "GPU1", "--node", "GPU2", "--share",
               r"\\\\HEADNODE\\CcpSpoolDir\\app", {str(script)!r}]
        for form in ("xml", "clusrun", "powershell", "json"):
            done = runner.invoke(cli, [*job, "--format", form, "--run-id", "win-1"])
            assert done.exit_code == 0, (form, done.output)
        done = runner.invoke(cli, ["runs", "--json"])
        assert done.exit_code == 0, done.output
        assert not BLOCKED & set(sys.modules), BLOCKED & set(sys.modules)
        print("ok")
        """
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    env["USERNAME"] = "alice"  # Windows always sets it: render's owner, without a profile
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_configuration_and_records_live_in_the_windows_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hpcjob.store.config import config_path
    from hpcjob.store.folders import user_folder
    from hpcjob.store.runs import history_file

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delenv("HPCJOB_CONFIG", raising=False)
    monkeypatch.setenv("APPDATA", str(tmp_path / "Roaming"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "Local"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # not read on Windows
    assert config_path() == tmp_path / "Roaming" / "hpcjob" / "clusters.toml"
    assert history_file() == tmp_path / "Local" / "hpcjob" / "runs.db"
    monkeypatch.delenv("LOCALAPPDATA")
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "user"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert user_folder("state") == tmp_path / "user" / "AppData" / "Local" / "hpcjob"
    monkeypatch.setattr(sys, "platform", "linux")
    assert config_path() == tmp_path / "xdg" / "hpcjob" / "clusters.toml"


def test_run_local_on_windows_says_it_needs_linux(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hpcjob.cli.app import main

    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "argv", ["hpcjob", "run", "--local", "-n", "2", str(script)])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    assert not list(tmp_path.glob("*/")), "nothing was started"


def test_the_caller_s_credential_wins_over_the_profile_and_never_reaches_the_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcjob.store.config import (
        CREDENTIAL_PASSWORD_ENV,
        CREDENTIAL_USER_ENV,
        ClusterProfile,
        password_for,
        secret_variables,
        with_caller_user,
    )

    profile = ClusterProfile(
        name="prod", url="https://head/hpc", user="CONTOSO\\alice", password="env:NOT_SET"
    )
    assert with_caller_user(profile) == profile
    monkeypatch.setenv(CREDENTIAL_USER_ENV, "CONTOSO\\bob")
    monkeypatch.setenv(CREDENTIAL_PASSWORD_ENV, "b0b's secret")
    assert with_caller_user(profile).user == "CONTOSO\\bob"
    assert password_for(profile) == "b0b's secret"  # not the profile's variable, which is not set
    assert CREDENTIAL_PASSWORD_ENV in secret_variables()
