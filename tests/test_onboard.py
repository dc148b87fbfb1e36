"""`hpcjob cluster onboard` and `cluster delete` against a fake `az` (tests/fake_az.py) that records every
call and validates deployments against the real template (the copy in tests/reference/arm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcjob.config import ADMIN_PASSWORD_ENV, AUTH_KEY_ENV
from hpcjob.emulator.tls import make_certificate
from hpcjob.onboard import TEMPLATE_COMMIT, TEMPLATE_URL, check_parameters

from .conftest import REFERENCE

TEMPLATE = REFERENCE / "arm" / "GeneratedTemplates" / "new-1hn-lnxcn-no-ad.json"
PASSWORD = "Onboard-Pw-1234!"
KEY = "auth-key-5678-secret"
A100 = ["--vm-size", "Standard_NC24ads_A100_v4"]
CommandRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def az_env(tmp_path: Path) -> dict[str, str]:
    bin_dir, state = tmp_path / "bin", tmp_path / "az-state"
    bin_dir.mkdir()
    state.mkdir()
    fake = Path(__file__).resolve().parent / "fake_az.py"
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    (bin_dir / "az").chmod(0o755)
    (tmp_path / "tls").mkdir()
    cert, _ = make_certificate(str(tmp_path / "tls"))
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_AZ_LOG": str(tmp_path / "az-calls.jsonl"),
        "FAKE_AZ_STATE": str(state),
        "FAKE_AZ_CERT": cert,
        "HPCJOB_CONFIG": str(tmp_path / "config" / "clusters.toml"),
        ADMIN_PASSWORD_ENV: PASSWORD,
        AUTH_KEY_ENV: KEY,
    }


@pytest.fixture
def hpcjob(az_env: dict[str, str], tmp_path: Path) -> CommandRunner:
    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcjob.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**az_env, **env},
            cwd=tmp_path,
        )

    return run


def onboard(hpcjob: CommandRunner, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return hpcjob(
        "cluster", "onboard", "gpu1", "--resource-group", "rg-gpu1", "--location", "eastus", *A100,
        "--nodes", "2", "--template", str(TEMPLATE), "--no-check", "--poll-interval", "0.1", *extra, **env,
    )  # fmt: skip


def az_calls(az_env: dict[str, str]) -> list[dict[str, object]]:
    log = Path(az_env["FAKE_AZ_LOG"])
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def commands(calls: list[dict[str, object]]) -> list[str]:
    return [" ".join(str(a) for a in list(call["argv"])[:3]) for call in calls]  # type: ignore[call-overload]


def test_onboarding_deploys_the_pinned_template_and_writes_the_profile(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    done = onboard(hpcjob, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    calls = az_calls(az_env)
    assert commands(calls)[:4] == [
        "account show --output",
        "vm list-usage --location",
        "group create --name",
        "deployment group create",
    ]
    deploy = next(c for c in calls if c["argv"][:3] == ["deployment", "group", "create"])  # type: ignore[index]
    argv = list(deploy["argv"])  # type: ignore[call-overload]
    assert argv[argv.index("--template-uri") + 1] == TEMPLATE_URL and TEMPLATE_COMMIT in TEMPLATE_URL
    assert deploy["stdin_parameters"] == ["adminPassword", "authenticationKey"]  # the secrets: stdin only
    # Each resource as it finished, then the profile.
    assert "Microsoft.Compute/virtualMachines IaaSLnxCN001: Succeeded" in done.stderr
    profile = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]["gpu1"]
    assert profile == {
        "url": "https://gpu1abc.eastus.cloudapp.azure.com",
        "user": "gpu1\\hpcadmin",
        "password": f"env:{ADMIN_PASSWORD_ENV}",
        "ca_bundle": str(Path(az_env["HPCJOB_CONFIG"]).parent / "gpu1-ca.pem"),
        "share": "//GPU1/CcpSpoolDir",
        "smb_server": "gpu1abc.eastus.cloudapp.azure.com",
        "node_group": "LinuxNodes",
        "gpus_per_node": 1,
        "resource_group": "rg-gpu1",
    } | {k: v for k, v in profile.items() if k in ("backend", "insecure", "smb_port")}
    # The parameters file: no secret, and the template accepts it (the fake az checked it too).
    parameters = json.loads((tmp_path / "out" / "parameters.json").read_text())["parameters"]
    values = {name: p["value"] for name, p in parameters.items()}
    assert (
        check_parameters({**values, "adminPassword": PASSWORD, "authenticationKey": KEY}, _template()) == {}
    )
    assert values["computeNodeImage"] == "Ubuntu_22.04_HPC_Gen2" and values["computeNodeNumber"] == 2
    # No secret in any argument az got, any file written, or anything printed.
    for secret in (PASSWORD, KEY):
        assert all(secret not in " ".join(map(str, call["argv"])) for call in calls)  # type: ignore[call-overload]
        assert secret not in done.stdout + done.stderr
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def test_the_parameters_file_is_the_golden_one(
    hpcjob: CommandRunner, tmp_path: Path, golden: Callable[[str, str], None]
) -> None:
    done = onboard(hpcjob, "--print-only", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    golden("onboard-parameters.json", (tmp_path / "out" / "parameters.json").read_text())


def test_print_only_runs_nothing_and_prints_the_commands(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    done = onboard(hpcjob, "--print-only", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert az_calls(az_env) == []
    lines = done.stdout.splitlines()
    assert lines[0] == "az group create --name rg-gpu1 --location eastus --tags created-by=hpcjob " + (
        "hpcjob-cluster=gpu1 --output json"
    )
    assert f"--template-uri {TEMPLATE_URL}" in lines[1] and "--parameters @-" in lines[1]
    assert "standard input" in lines[2]
    assert "about $8.51 an hour" in done.stderr  # 2 x 3.67 + the head node's 1.17


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("name", "abcdefghijklmnop"), "must be 3 to 15 lowercase letters and digits"),
        (("--image", "Ubuntu_22.04_Gen2"), "has no NVIDIA driver"),
        (("--image", "AlmaLinux_8_HPC_Gen1"), "runs Generation 2 images only"),
        (("--vm-size", "Standard_NV6ads_A10_v5"), "not whole GPUs"),
        (("--nodes", "0"), "computeNodeNumber is 0; the template allows 1 to 500"),
        (("--nodes", "501"), "computeNodeNumber is 501; the template allows 1 to 500"),
        (("--admin-user", "admin"), "not a name Azure reserves"),
    ],
)
def test_bad_input_fails_before_az_with_one_line(
    hpcjob: CommandRunner, az_env: dict[str, str], change: tuple[str, str], message: str
) -> None:
    options = {"--resource-group": "rg-gpu1", "--location": "eastus", "--vm-size": A100[1], "--nodes": "2"}
    key, value = change
    options[key] = value
    name = options.pop("name", "gpu1")
    args = [name, *(word for pair in options.items() for word in pair)]
    done = hpcjob("cluster", "onboard", *args, "--template", str(TEMPLATE), "--print-only")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert az_calls(az_env) == []


def test_a_weak_password_and_a_full_quota_stop_before_the_deployment(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    weak = onboard(hpcjob, **{ADMIN_PASSWORD_ENV: "short"})
    assert weak.returncode == 2 and "admin password must be 12 to 123" in weak.stderr
    assert "short" not in weak.stderr and az_calls(az_env) == []
    full = onboard(hpcjob, FAKE_AZ_QUOTA="24")
    assert full.returncode == 2
    assert "2 x Standard_NC24ads_A100_v4 need 48 vCPUs of standardNCADSA100v4Family" in full.stderr
    assert "group create --name" not in commands(az_calls(az_env))


def test_a_failed_deployment_says_which_resource_and_why_in_one_line(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    done = onboard(hpcjob, FAKE_AZ_FAIL="1")
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last == (
        "hpcjob: error: Microsoft.Compute/virtualMachines IaaSLnxCN001 failed: SkuNotAvailable: The "
        "requested size for resource 'IaaSLnxCN001' is currently not available in location 'eastus'. "
        "(more: az deployment operation group list --resource-group rg-gpu1 --name hpcjob-gpu1 "
        "--output table)"
    )
    assert not Path(az_env["HPCJOB_CONFIG"]).exists()  # no profile of a cluster that is not there


def test_not_logged_in_is_one_line(hpcjob: CommandRunner) -> None:
    done = onboard(hpcjob, FAKE_AZ_LOGGED_OUT="1")
    assert done.returncode == 1
    assert done.stderr == "hpcjob: error: az account show failed: Please run 'az login' to setup account.\n"


def test_a_template_that_is_not_the_pinned_one_is_refused(hpcjob: CommandRunner, tmp_path: Path) -> None:
    other = tmp_path / "template.json"
    other.write_bytes(TEMPLATE.read_bytes().replace(b'"maxValue": 500', b'"maxValue": 5000'))
    done = hpcjob(
        "cluster", "onboard", "gpu1", "--resource-group", "rg", "--location", "eastus", *A100, "--nodes", "2",
        "--template", str(other), "--print-only",
    )  # fmt: skip
    assert done.returncode == 2 and "is not the pinned one" in done.stderr


def test_delete_removes_the_resource_group_and_the_profile(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    assert onboard(hpcjob).returncode == 0
    done = hpcjob("cluster", "delete", "gpu1", "--yes")
    assert done.returncode == 0, done.stderr
    assert az_calls(az_env)[-1]["argv"] == ["group", "delete", "--name", "rg-gpu1", "--yes", "--no-wait"]
    assert "gpu1" not in tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text()).get("clusters", {})
    other = hpcjob("cluster", "add", "by-hand", "--url", "https://head", "--user", "alice")
    assert other.returncode == 0, other.stderr
    refused = hpcjob("cluster", "delete", "by-hand", "--yes")
    assert refused.returncode == 2 and "was not made by `hpcjob cluster onboard`" in refused.stderr


def test_the_cli_names_the_secret_variables_that_the_tasks_never_see() -> None:
    from hpcjob.cli import onboard as cli_onboard

    assert (cli_onboard.PASSWORD_ENV, cli_onboard.KEY_ENV) == (ADMIN_PASSWORD_ENV, AUTH_KEY_ENV)


def _template() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(TEMPLATE.read_text())
    return loaded


def test_the_bash_entry_hands_every_argument_to_the_command(az_env: dict[str, str], tmp_path: Path) -> None:
    # The PowerShell entry is New-HpcTorchCluster: tests/test_powershell_module.py checks it.
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    # The bash entry hands every argument over as it is.
    done = subprocess.run(
        [str(scripts / "onboard.sh"), "gpu1", "--resource-group", "rg-gpu1", "--location", "eastus", *A100,
         "--nodes", "2", "--template", str(TEMPLATE), "--print-only", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env=az_env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("az group create --name rg-gpu1")


def test_jobs_on_the_new_cluster_run_one_process_per_gpu_of_its_size(
    hpcjob: CommandRunner, tmp_path: Path
) -> None:
    done = onboard(hpcjob, "--vm-size", "Standard_NC96ads_A100_v4")  # 4 GPUs a node (the later option wins)
    assert done.returncode == 0, done.stderr
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    nodes = ["--node", "IaaSLnxCN000", "--node", "IaaSLnxCN001"]
    shown = hpcjob("submit", "--dry-run", "--cluster", "gpu1", *nodes, str(script))
    assert shown.returncode == 0, shown.stderr
    assert "--nproc_per_node=4" in shown.stdout and 'NodeGroups="LinuxNodes"' in shown.stdout
    explicit = hpcjob(
        "submit", "--dry-run", "--cluster", "gpu1", *nodes, "--nproc-per-node", "2", str(script)
    )
    assert "--nproc_per_node=2" in explicit.stdout  # the job's own option wins
