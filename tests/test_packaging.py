"""A non-editable install (`pip install .`) carries every file hpcjob reads at run time: the wheel of the
checkout holds them, and hpcjob installed from it, with the checkout out of reach, reads them as the
checkout does (the size table, the parameters template, the node files, the templates)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from .conftest import GOLDEN, REFERENCE, REPO

# Files the code reads by path at run time (beside the modules): the onboarding data, what goes to the
# nodes, the probe `hpcjob doctor` submits. The templates are checked as a folder (TEMPLATE_DIRS).
RUNTIME_FILES = (
    "hpcjob/arm/sizes.json",
    "hpcjob/arm/parameters.json.j2",
    "hpcjob/node/node.sh",
    "hpcjob/node/worker.py",
    "hpcjob/node/filter.sh",
    "hpcjob/node/mount_filter.py",
    "hpcjob/probes/allreduce.py",
)
# Folders of package data: every file in them is read by some command (READMEs are for people).
DATA_DIRS = ("hpcjob/arm", "hpcjob/node", "hpcjob/render/templates")

# Run in the installed copy and in the checkout: what each read of package data gives, as JSON.
READER = """
import hashlib, json, sys
from pathlib import Path

import hpcjob
from hpcjob import runner
from hpcjob.runner import doctor, onboard
from hpcjob.onboard import OnboardRequest, template_parameters
from hpcjob.plan import AllowedShare
from hpcjob.render.text import filter_install_command, templates
from hpcjob.render.winrm import SCRIPTS, bootstrap_command, winrm_script
from hpcjob.staging import node_files

home = Path(hpcjob.__file__).resolve().parent
assert home.is_relative_to(Path(sys.argv[1]).resolve()), f"hpcjob imported from {home}"
table = runner.size_table()
request = OnboardRequest(
    name="gpu1", resource_group="rg-gpu1", location="eastus", vm_size="Standard_NC24ads_A100_v4", nodes=2,
    admin_user="hpcadmin", image="Ubuntu_22.04_HPC_Gen2", node_prefix="IaaSLnxCN", head_node_size=None,
)
probe = Path(doctor.__file__).resolve().parents[1] / "probes" / "allreduce.py"  # as `doctor` names it
json.dump({
    "sizes": sorted(table.sizes),
    "parameters": onboard.parameters_text(template_parameters(request, table)),
    "filter": filter_install_command([AllowedShare("//HEAD/CcpSpoolDir", "/app", "vers=3.0")]),
    "node_files": {str(p): hashlib.sha256(b).hexdigest() for p, b in node_files()},
    "templates": {t: templates().get_template(t).filename is not None for t in templates().list_templates()},
    "winrm": {name: winrm_script(name) for name in sorted(SCRIPTS)},
    "bootstrap": list(bootstrap_command()),
    "probe": probe.is_file() and probe.resolve().is_relative_to(home),
}, sys.stdout, sort_keys=True)
"""


def _can_build_offline() -> bool:
    """setuptools in this interpreter, with its own bdist_wheel (70.1 on) or the wheel package."""
    try:
        version = tuple(int(part) for part in metadata.version("setuptools").split(".")[:2])
    except metadata.PackageNotFoundError:
        return False
    return version >= (70, 1) or any(True for _ in metadata.distributions(name="wheel"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in with `pip install --target`)."""
    if not _can_build_offline():
        pytest.skip("no setuptools able to build a wheel without the network in this Python")
    root = tmp_path_factory.mktemp("packaging")
    # A copy of what the build reads: building in the checkout would write build/ and *.egg-info there,
    # and a build/ left from an earlier build could hand the wheel files the package data no longer lists.
    source = root / "source"
    shutil.copytree(REPO / "hpcjob", source / "hpcjob", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
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
        for path in (REPO / "hpcjob").rglob("*")
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
    assert seen == json.loads(checkout.stdout)


def test_cluster_onboard_runs_from_a_non_editable_install(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, target = built
    template = REFERENCE / "arm" / "GeneratedTemplates" / "new-1hn-lnxcn-no-ad.json"
    done = _run(
        ["-m", "hpcjob.cli", "cluster", "onboard", "gpu1", "--resource-group", "rg-gpu1",
         "--location", "eastus", "--vm-size", "Standard_NC24ads_A100_v4", "--nodes", "2",
         "--template", str(template), "--print-only", "--out", str(tmp_path / "out")],
        target,
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parameters = (tmp_path / "out" / "parameters.json").read_text(encoding="utf-8")
    assert parameters == (GOLDEN / "onboard-parameters.json").read_text(encoding="utf-8")
