"""A non-editable install (`pip install .`) carries every file hpcjob reads at run time: the wheel of the
checkout holds them, and hpcjob installed from it, with the checkout out of reach, reads them as the
checkout does (the size table, the parameters template, the node files, the templates).

The base install (`pip install hpcjob`, no extras) gives every command: each one's help, and a real run of
each, against the emulated head node where it needs a cluster, ends without a traceback; a command that
needs an extra says so in one line that names it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from hpcjob.azure.template import ADD_NODES_SHA256, TEMPLATE_SHA256
from hpcjob.backends.local import free_port
from hpcjob.extras import EXTRAS

from .conftest import GOLDEN, REFERENCE, REPO

# Files the code reads by path at run time (beside the modules): the onboarding data, what goes to the
# nodes, the probe `hpcjob doctor` submits. The templates are checked as a folder (TEMPLATE_DIRS).
RUNTIME_FILES = (
    "hpcjob/job/sizes.json",
    "hpcjob/azure/arm/parameters.json.j2",
    "hpcjob/azure/arm/new-1hn-lnxcn-no-ad.json",
    "hpcjob/azure/arm/add-lnx-compute-nodes.json",
    "hpcjob/azure/arm/hpcpack-template-LICENSE",
    "hpcjob/node/node.sh",
    "hpcjob/node/worker.py",
    "hpcjob/node/filter.sh",
    "hpcjob/node/mount_filter.py",
    "hpcjob/checks/probes/allreduce.py",
)
# Folders of package data: every file in them is read by some command (READMEs are for people) or is the
# licence of one that is (hpcpack-template-LICENSE).
DATA_DIRS = ("hpcjob/azure/arm", "hpcjob/node", "hpcjob/job/render/templates")

# Run in the installed copy and in the checkout: what each read of package data gives, as JSON.
READER = """
import hashlib, json, sys
from pathlib import Path

import hpcjob
from hpcjob import runner
from hpcjob.checks import cluster as doctor
from hpcjob.azure import data, onboard
from hpcjob.azure.template import OnboardRequest, template_parameters
from hpcjob.job.sizes import size_table
from hpcjob.job.plan import AllowedShare
from hpcjob.job.render.text import filter_install_command, templates
from hpcjob.job.render.winrm import SCRIPTS, bootstrap_command, winrm_script
from hpcjob.store.staging import node_files

home = Path(hpcjob.__file__).resolve().parent
assert home.is_relative_to(Path(sys.argv[1]).resolve()), f"hpcjob imported from {home}"
table = size_table()
request = OnboardRequest(
    name="gpu1", resource_group="rg-gpu1", location="eastus", vm_size="Standard_NC24ads_A100_v4", nodes=2,
    admin_user="hpcadmin", image="Ubuntu_22.04_HPC_Gen2", node_prefix="IaaSLnxCN", head_node_size=None,
)
probe = Path(doctor.__file__).resolve().parent / "probes" / "allreduce.py"  # as `doctor` names it
json.dump({
    "sizes": sorted(table.sizes),
    "parameters": onboard.parameters_text(template_parameters(request, table)),
    "filter": filter_install_command([AllowedShare("//HEAD/CcpSpoolDir", "/app", "vers=3.0")]),
    "node_files": {str(p): hashlib.sha256(b).hexdigest() for p, b in node_files()},
    "templates": {t: templates().get_template(t).filename is not None for t in templates().list_templates()},
    "winrm": {name: winrm_script(name) for name in sorted(SCRIPTS)},
    "bootstrap": list(bootstrap_command()),
    "probe": probe.is_file() and probe.resolve().is_relative_to(home),
    "template": hashlib.sha256(data.packaged_template()[1]).hexdigest(),
    "add_nodes": hashlib.sha256(data.packaged_template("add-lnx-compute-nodes.json")[1]).hexdigest(),
}, sys.stdout, sort_keys=True)
"""


def _can_build_offline() -> bool:
    """setuptools in this interpreter, with its own bdist_wheel (70.1 on) or the wheel package."""
    try:
        version = tuple(int(part) for part in metadata.version("setuptools").split(".")[:2])
    except metadata.PackageNotFoundError:
        return False
    return version >= (70, 1) or any(True for _ in metadata.distributions(name="wheel"))


def _source(root: Path) -> Path:
    """A copy of what the build reads: building in the checkout would write build/ and *.egg-info there,
    and a build/ left from an earlier build could hand the wheel files the package data no longer lists."""
    source = root / "source"
    for package in ("hpcjob", "hpctorch"):  # hpctorch: the library each job ships to its nodes
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    return source


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in with `pip install --target`)."""
    if not _can_build_offline():
        pytest.skip("no setuptools able to build a wheel without the network in this Python")
    root = tmp_path_factory.mktemp("packaging")
    source = _source(root)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    wheels, target = root / "wheels", root / "site"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(source)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = wheels.glob("*.whl")
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return wheel, target


def _run(args: list[str], pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "HPCJOB_CONFIG": str(cwd / "clusters.toml")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_the_wheel_holds_every_module_and_every_file_the_code_reads(built: tuple[Path, Path]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    assert set(RUNTIME_FILES) - inside == set()
    data_dirs = [REPO / folder for folder in DATA_DIRS]
    wanted = {
        path.relative_to(REPO).as_posix()
        for package in ("hpcjob", "hpctorch")
        for path in (REPO / package).rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (path.suffix == ".py" or (path.name != "README.md" and any(map(path.is_relative_to, data_dirs))))
    }
    assert wanted - inside == set()


def test_the_installed_package_reads_its_data_as_the_checkout_does(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    _, target = built
    installed = _run(["-c", READER, str(target)], target, tmp_path)
    assert installed.returncode == 0, installed.stderr
    checkout = _run(["-c", READER, str(REPO)], REPO, tmp_path)
    assert checkout.returncode == 0, checkout.stderr
    seen = json.loads(installed.stdout)
    assert seen["sizes"] and seen["probe"] and all(seen["templates"].values()), seen
    assert seen["template"] == TEMPLATE_SHA256  # the pinned ARM template: onboarding needs no network
    assert seen["add_nodes"] == ADD_NODES_SHA256  # and the add-nodes template: `cluster grow --print-only`
    assert seen == json.loads(checkout.stdout)


def test_cluster_onboard_runs_from_a_non_editable_install(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, target = built
    # No --template: the installed package's own copy of the pinned template.
    done = _run(
        ["-m", "hpcjob.cli", "cluster", "onboard", "gpu1", "--resource-group", "rg-gpu1",
         "--location", "eastus", "--vm-size", "Standard_NC24ads_A100_v4", "--nodes", "2",
         "--print-only", "--out", str(tmp_path / "out")],
        target,
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parameters = (tmp_path / "out" / "parameters.json").read_text(encoding="utf-8")
    assert parameters == (GOLDEN / "onboard-parameters.json").read_text(encoding="utf-8")


# What only an extra installs (distribution -> extra): the commands below report each one missing in the
# base install, so none of them may come with it.
EXTRA_ONLY = {"torch": "train", "pywinrm": "winrm", "matplotlib": "plot", "keyring": "keyring"}

# Run in the base install: where hpcjob comes from, what is installed, hpcjob's extras, and every command
# path of the click group, with whether it is a group that only holds subcommands.
INSPECT = """
import json, sys
from importlib import metadata

import click
import hpcjob
from hpcjob.cli import cli

def walk(command, path):
    group = isinstance(command, click.Group)
    yield path, group and not command.invoke_without_command
    if group:
        context = click.Context(command)
        for name in command.list_commands(context):
            yield from walk(command.get_command(context, name), [*path, name])

json.dump({
    "home": hpcjob.__file__,
    "installed": sorted(d.metadata["Name"] for d in metadata.distributions()),
    "extras": metadata.metadata("hpcjob").get_all("Provides-Extra"),
    "commands": list(walk(cli, [])),
}, sys.stdout)
"""


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised as pip compares them."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


@pytest.fixture(scope="module")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with hpcjob and its base dependencies only, from the package index (pip's
    cache makes it a few seconds after the first time); its bin folder."""
    root = tmp_path_factory.mktemp("base-install")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # This pip, run for the new environment's Python: no pip of its own to install first.
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "--no-input", "-q", "install", str(_source(root))],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    # No index to install from (offline): nothing to test here. pip's words for it.
    unreachable = (
        "No matching distribution",
        "Could not find a version",
        "NewConnectionError",
        "name resolution",
    )
    if done.returncode != 0 and any(words in done.stderr for words in unreachable):
        pytest.skip(f"the package index is out of reach: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


@dataclass(frozen=True)
class Installed:
    """What INSPECT saw in the base install."""

    distributions: frozenset[str]  # normalised names
    extras: frozenset[str]
    commands: tuple[tuple[tuple[str, ...], bool], ...]  # (path, whether it only holds subcommands)


@pytest.fixture(scope="module")
def inspected(base_install: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """INSPECT's answer, run with the base install's Python."""
    cwd = tmp_path_factory.mktemp("inspect")  # not the checkout, whose hpcjob would be imported instead
    done = subprocess.run(
        [str(base_install / "python"), "-c", INSPECT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=_isolated(cwd),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert Path(seen["home"]).is_relative_to(base_install.parent), seen["home"]
    return Installed(
        distributions=frozenset(map(_name, seen["installed"])),
        extras=frozenset(seen["extras"]),
        commands=tuple(
            (tuple(path), only_holds_subcommands) for path, only_holds_subcommands in seen["commands"]
        ),
    )


def _isolated(folder: Path) -> dict[str, str]:
    """This environment without hpcjob's variables or the checkout on the path, its state in `folder`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("HPCJOB_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    (folder / "home").mkdir(exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    env.update(
        HOME=str(folder / "home"),
        XDG_STATE_HOME=str(folder / "state"),
        XDG_DATA_HOME=str(folder / "data"),
        XDG_CONFIG_HOME=str(folder / "config"),
        HPCJOB_CONFIG=str(folder / "clusters.toml"),
        TMPDIR=str(folder / "tmp"),  # the emulator's certificate and anything else made on the way
    )
    return env


@pytest.mark.slow
def test_the_base_install_has_rest_and_smb_and_no_extra(inspected: Installed) -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {_name(requirement) for requirement in pyproject["dependencies"]}
    assert {"requests", "smbprotocol"} <= base
    assert base <= inspected.distributions
    assert set(EXTRA_ONLY) & inspected.distributions == set()
    extras = inspected.extras
    # Every extra a one-line error names is one; the old install lines (`hpcjob[rest,share]`) still work.
    assert set(EXTRAS) | set(EXTRA_ONLY.values()) | {"rest", "share"} <= extras
    assert extras == set(pyproject["optional-dependencies"])


@pytest.mark.slow
def test_every_command_has_its_help_in_the_base_install(
    base_install: Path, inspected: Installed, tmp_path: Path
) -> None:
    commands = inspected.commands
    assert len(commands) > 10 and (("cluster", "onboard"), False) in commands
    for path, _ in commands:
        done = subprocess.run(
            [str(base_install / "hpcjob"), *path, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=_isolated(tmp_path),
        )
        said = f"hpcjob {' '.join(path)} --help: {done.stdout}{done.stderr}"
        assert done.returncode == 0 and "Traceback" not in said, said
        assert done.stdout.lower().startswith("usage:"), said


@pytest.mark.slow
def test_every_command_runs_in_the_base_install_without_a_traceback(
    base_install: Path, inspected: Installed, tmp_path: Path
) -> None:
    """One real run of every command: against the emulated head node (itself run from the base install)
    where it needs a cluster, its share a folder here; an extra's absence is one line naming it."""
    commands = inspected.commands
    env = {**_isolated(tmp_path), "HPCJOB_EMULATOR_PASSWORD": "emu-Pw-1"}
    ran: set[tuple[str, ...]] = set()

    def hpcjob(
        *args: str, code: int = 0, says: str = "", error: str = "", extra_env: Mapping[str, str] = {}
    ) -> subprocess.CompletedProcess[str]:
        """`hpcjob ARGS`: no traceback, exit `code`, `says` in its output (either stream); `error`: its
        stderr is that one line."""
        done = subprocess.run(
            [str(base_install / "hpcjob"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**env, **extra_env},
            stdin=subprocess.DEVNULL,
        )
        said = f"hpcjob {shlex.join(args)} (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        assert "Traceback" not in said, said
        assert done.returncode == code, said
        assert says in done.stdout + done.stderr, said
        if error:
            assert done.stderr.startswith("hpcjob: error: ") and len(done.stderr.splitlines()) == 1, said
            assert error in done.stderr, said
        ran.add(max((path for path, _ in commands if args[: len(path)] == path), key=len))
        return done

    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('trained')\n")
    # The nodes' Python: the job ends at once, with no torch (the base install has none).
    stand_in = tmp_path / "python-stand-in"
    stand_in.write_text('#!/bin/sh\necho "stand-in on $HPCJOB_NODE"\n')
    stand_in.chmod(0o755)
    share = tmp_path / "share"
    share.mkdir()

    # Commands that need no cluster.
    hpcjob("cluster", "list", says="no cluster configured")
    hpcjob("render", "--node", "NODE1", "--share", "//HEAD/CcpSpoolDir/app", str(script), says="<Job")
    hpcjob("run", "--local", str(script), code=2, error="pip install 'hpcjob[train]'")
    template = REFERENCE / "arm" / "GeneratedTemplates" / "new-1hn-lnxcn-no-ad.json"
    onboard = ["cluster", "onboard", "gpu1", "--resource-group", "rg-gpu1", "--location", "eastus",
               "--vm-size", "Standard_NC24ads_A100_v4", "--nodes", "2", "--print-only"]  # fmt: skip
    out = str(tmp_path / "onboard")
    hpcjob(*onboard, "--template", str(template), "--out", out, says="az deployment group create")
    # Without --template, the copy that comes with the package (once a download, and a traceback here):
    # through a proxy that refuses, to show that nothing is downloaded.
    proxy = {"HTTPS_PROXY": f"http://127.0.0.1:{free_port()}", "NO_PROXY": "", "no_proxy": ""}
    hpcjob(*onboard, "--out", out, says="az deployment group create", extra_env=proxy)
    # The upload over SMB (smbprotocol) to a port where nothing listens.
    upload = ["--upload", "--smb-user", "u", "--smb-server", "127.0.0.1", "--smb-port", str(free_port())]
    hpcjob(
        "render", "--node", "NODE1", "--share", "//HEAD/CcpSpoolDir/app", *upload, str(script),
        code=1, error="cannot log on to //HEAD/CcpSpoolDir/app", extra_env={"HPCJOB_SMB_PASSWORD": "x"},
    )  # fmt: skip
    hpcjob(
        "cluster", "add", "kr", "--url", "https://head.example", "--user", "bob", "--keyring",
        code=2, error="pip install 'hpcjob[keyring]'",
    )  # fmt: skip

    # The rest against the emulated head node, over REST; its WinRM profile needs the winrm extra.
    started = ["emulator", "--user", "alice", "--profile", "emu", "--share-dir", str(share)]
    emulator = subprocess.Popen(
        [str(base_install / "hpcjob"), *started],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert emulator.stdout is not None
        printed = [emulator.stdout.readline() for _ in range(5)]
        assert printed[-1].startswith("hpcjob cluster add emu-winrm "), printed
        for line in printed[-2:]:  # the profiles it prints, as printed
            hpcjob(*shlex.split(line)[1:], says="saved")
        hpcjob("nodes", says="LOCALHOST")
        submitted = hpcjob(
            "submit", "--wait", "--json", "--no-mount-step", "-n", "2", "--python", str(stand_in), str(script)
        )
        run = json.loads(submitted.stdout)
        assert run["state"] == "Finished", run
        run_id = run["run_id"]
        hpcjob("status", run_id, says="Finished")
        hpcjob("wait", run_id, says="Finished")  # a run that has ended: summed up again
        hpcjob("logs", run_id, says="stand-in on NODE002")
        hpcjob("runs", says=run_id)
        hpcjob("runs", "show", run_id, says=run_id)
        plot = ["runs", "plot", run_id, "-o", str(tmp_path / "run.png")]
        hpcjob(*plot, code=2, error="pip install 'hpcjob[plot]'")
        hpcjob("cancel", run_id, says="already ended")
        hpcjob("mount", "--dry-run", "--node", "LOCALHOST", "--mount-point", str(tmp_path / "mnt" / "alice"))
        # The nodes' Python is the base install's: the torch check fails, and says so.
        hpcjob("doctor", code=1, says="checks failed")
        hpcjob("nodes", "--cluster", "emu-winrm", code=2, error="pip install 'hpcjob[winrm]'")
        hpcjob("cluster", "delete", "emu", code=2, error="was not made by `hpcjob cluster onboard`")
        hpcjob("cluster", "grow", "emu", "2", code=2, error="was not made by `hpcjob cluster onboard`")
        for power in ("stop", "start"):
            hpcjob("cluster", power, "emu", code=2, error="was not onboarded by hpcjob")
        # No network here (the tests point the price API at a closed port): the package's own table.
        hpcjob("prices", "--size", "Standard_ND96isr_H100_v5", "--region", "eastus", says="ND96isr_H100_v5")
        hpcjob("pull", run_id, "--to", str(tmp_path / "pulled"), says="copied")
        hpcjob("cluster", "remove", "emu-winrm", says="removed")
    finally:
        emulator.send_signal(signal.SIGINT)
        try:
            _, emulator_said = emulator.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            emulator.kill()
            raise
    assert emulator.returncode == 0 and "Traceback" not in emulator_said, emulator_said
    ran.add(("emulator",))
    untried = {" ".join(path) for path, only_holds_subcommands in commands if not only_holds_subcommands}
    assert untried - {" ".join(path) for path in ran} == set(), "commands with no real run in this test"
