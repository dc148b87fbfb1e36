"""`hpcjob cluster onboard` and `cluster delete` against a fake `az` (tests/fake_az.py) that records every
call and validates deployments against the real template (the copy in tests/reference/arm)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import click
import pytest

import hpcjob as hpcjob_package
from hpcjob.azure.data import packaged_template
from hpcjob.azure.template import (
    ADD_NODES_PATH,
    ADD_NODES_SHA256,
    ADD_NODES_URL,
    TEMPLATE_COMMIT,
    TEMPLATE_PATH,
    TEMPLATE_SHA256,
    TEMPLATE_URL,
    OnboardRequest,
    check_parameters,
    fabric_warning,
)
from hpcjob.backends import open_backend
from hpcjob.backends.local import free_port
from hpcjob.emulator import HeadNode, NodeSpec
from hpcjob.job.sizes import SizeTable
from hpcjob.job.spec import HpcjobError
from hpcjob.store.config import ADMIN_PASSWORD_ENV, AUTH_KEY_ENV, get_profile
from hpcjob.store.power import NodeKind, power_record

from .conftest import REFERENCE

TEMPLATE = REFERENCE / "arm" / "GeneratedTemplates" / "new-1hn-lnxcn-no-ad.json"
PASSWORD = "Onboard-Pw-1234!"
KEY = "auth-key-5678-secret"
A100 = ["--vm-size", "Standard_NC24ads_A100_v4"]
CommandRunner = Callable[..., subprocess.CompletedProcess[str]]


def template_certificate(folder: Path) -> tuple[str, str]:
    """A certificate as the template's Key Vault makes it: self-signed CN=HPCPackCommunication, no host
    name or address in it (Azure/hpcpack-template @dea762e Bicep/shared/key-vault-with-cert.ps1)."""
    folder.mkdir()
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=HPCPackCommunication"],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture
def az_env(tmp_path: Path) -> dict[str, str]:
    bin_dir, state = tmp_path / "bin", tmp_path / "az-state"
    bin_dir.mkdir()
    state.mkdir()
    fake = Path(__file__).resolve().parent / "fake_az.py"
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    (bin_dir / "az").chmod(0o755)
    cert, _ = template_certificate(tmp_path / "tls")
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


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What hpcjob said was wrong (its progress lines left out)."""
    return [line for line in done.stderr.splitlines() if line.startswith("hpcjob: error:")]


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
    made = commands(calls)
    assert made[:6] == [
        "account show --output",
        "vm list-skus --location",
        "vm list-usage --location",
        "group exists --name",
        "keyvault list-deleted --resource-type",
        "group create --name",
    ]
    # The deployment runs in a process of its own while hpcjob polls its operations: either logs first.
    assert "deployment group create" in made[6:8], made
    assert "keyvault certificate download" not in commands(calls)  # Forbidden: the vault uses RBAC
    deploy = next(c for c in calls if c["argv"][:3] == ["deployment", "group", "create"])  # type: ignore[index]
    argv = list(deploy["argv"])  # type: ignore[call-overload]
    assert argv[argv.index("--template-uri") + 1] == TEMPLATE_URL and TEMPLATE_COMMIT in TEMPLATE_URL
    assert deploy["stdin_parameters"] == ["adminPassword", "authenticationKey"]  # the secrets: stdin only
    # Each resource as it finished, then the profile.
    assert "Microsoft.Compute/virtualMachines IaaSLnxCN001: Succeeded" in done.stderr
    # 2 nodes of a size without InfiniBand: said once, before anything is made.
    assert done.stderr.count("hpcjob: warning: Standard_NC24ads_A100_v4 has no InfiniBand") == 1
    profile = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]["gpu1"]
    assert profile == {
        "url": "https://gpu1abc.eastus.cloudapp.azure.com",
        "user": "gpu1\\hpcadmin",
        "password": f"env:{ADMIN_PASSWORD_ENV}",
        "cert_fingerprint": thumbprint(az_env["FAKE_AZ_CERT"]),
        "share": "//GPU1/CcpSpoolDir",
        "smb_server": "gpu1abc.eastus.cloudapp.azure.com",
        "node_group": "LinuxNodes",
        "gpus_per_node": 1,
        "resource_group": "rg-gpu1",
        "vm_size": "Standard_NC24ads_A100_v4",
        "region": "eastus",  # with the size, the price runs are counted at
        "spot": False,
    } | {k: v for k, v in profile.items() if k in ("backend", "insecure", "smb_port")}
    assert not list(Path(az_env["HPCJOB_CONFIG"]).parent.glob("*.pem"))  # no certificate file to leave
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


def thumbprint(cert: str) -> str:
    return hashlib.sha1(ssl.PEM_cert_to_DER_cert(Path(cert).read_text())).hexdigest().upper()


class _Version(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'"6.3.8328.0"' if self.path == "/hpc/cluster/version" else b"null"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_profile_connects_over_tls_to_the_head_node_s_self_signed_certificate(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    """The head node's certificate is the Key Vault's, self-signed with no host name: the profile pins
    it by the thumbprint the deployment gives, and the REST API answers; any other certificate is refused."""
    key = str(Path(az_env["FAKE_AZ_CERT"]).with_name("key.pem"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Version)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(az_env["FAKE_AZ_CERT"], key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        head = f"127.0.0.1:{server.server_address[1]}"
        assert onboard(hpcjob, FAKE_AZ_DNS=head).returncode == 0
        os.environ["HPCJOB_CONFIG"] = az_env["HPCJOB_CONFIG"]
        try:
            profile = get_profile("gpu1")
        finally:
            del os.environ["HPCJOB_CONFIG"]
        assert profile.url == f"https://{head}" and profile.ca_bundle is None and not profile.insecure
        assert open_backend("rest", profile, PASSWORD).version() == "6.3.8328.0"
        other, _ = template_certificate(tmp_path / "other")
        impostor = replace(profile, cert_fingerprint=thumbprint(other))
        with pytest.raises(
            HpcjobError, match="its fingerprint is not the cluster profile's cert_fingerprint"
        ):
            open_backend("rest", impostor, PASSWORD).version()
    finally:
        server.shutdown()
        server.server_close()


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


@pytest.mark.parametrize("password", ["short", "Aa1!" * 18 + "x"])  # 73 characters: over Linux's 72
def test_a_password_out_of_the_nodes_limits_stops_before_az(
    hpcjob: CommandRunner, az_env: dict[str, str], password: str
) -> None:
    weak = onboard(hpcjob, **{ADMIN_PASSWORD_ENV: password})
    assert weak.returncode == 2 and "admin password must be 12 to 72 characters" in weak.stderr
    assert password not in weak.stderr and az_calls(az_env) == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAKE_AZ_QUOTA": "24"},
         "2 x Standard_NC24ads_A100_v4 need 48 vCPUs of StandardNCADSA100v4Family in eastus, and the quota "
         "leaves 24"),
        ({"FAKE_AZ_REGIONAL": "50"}, "2 x Standard_NC24ads_A100_v4 and the head node need 56 vCPUs of Total "
         "Regional vCPUs in eastus, and the quota leaves 50"),
        ({"FAKE_AZ_NOT_OFFERED": "Standard_NC24ads_A100_v4"},
         "Standard_NC24ads_A100_v4 is not offered to this subscription in eastus"),
    ],
)  # fmt: skip
def test_quota_and_size_problems_stop_before_anything_is_created(
    hpcjob: CommandRunner, az_env: dict[str, str], env: dict[str, str], message: str
) -> None:
    done = onboard(hpcjob, **env)
    errors = error_lines(done)
    assert done.returncode == 2 and len(errors) == 1 and message in errors[0], done.stderr
    assert "group create --name" not in commands(az_calls(az_env))


@pytest.mark.parametrize(
    "size",
    ["Standard_NC4as_T4_v3", "Standard_ND96asr_v4", "Standard_ND96isr_H100_v5", "Standard_NC96ads_A100_v4"],
)
def test_each_size_s_family_is_found_in_the_quotas_however_azure_spells_it(
    hpcjob: CommandRunner, az_env: dict[str, str], size: str
) -> None:
    """list-skus says "Standard NDASv4_A100 Family", list-usage standardNDASv4_A100Family: one quota."""
    done = onboard(hpcjob, "--vm-size", size, "--what-if")
    assert done.returncode == 0, done.stderr
    assert "Resource changes: 23 to create." in done.stdout


def test_what_if_makes_a_missing_resource_group_for_the_preview_and_deletes_it(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    done = onboard(hpcjob, "--what-if")
    assert done.returncode == 0, done.stderr
    assert "Resource changes: 23 to create." in done.stdout
    calls = [call["argv"] for call in az_calls(az_env)]
    assert ["group", "exists", "--name", "rg-gpu1", "--output", "json"] in calls
    assert calls[-3] == [
        "group", "create", "--name", "rg-gpu1", "--location", "eastus", "--tags", "created-by=hpcjob",
        "hpcjob-cluster=gpu1", "--output", "json",
    ]  # fmt: skip
    assert calls[-2][:3] == ["deployment", "group", "what-if"]
    assert calls[-1] == ["group", "delete", "--name", "rg-gpu1", "--yes"]  # waited for: nothing left
    assert json.loads((Path(az_env["FAKE_AZ_STATE"]) / "state.json").read_text())["groups"] == {}
    assert not Path(az_env["HPCJOB_CONFIG"]).exists()


def test_onboarding_again_after_delete_purges_the_old_vault_with_consent(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    assert onboard(hpcjob).returncode == 0
    assert hpcjob("cluster", "delete", "gpu1", "--yes").returncode == 0
    # The vault is soft-deleted with its group: the template would make one of the same name.
    refused = onboard(hpcjob)
    assert refused.returncode == 2 and len(error_lines(refused)) == 1, refused.stderr
    assert "is soft-deleted, and the template makes one of the same name: rg-gpu1-kv-" in refused.stderr
    assert "purge it with --purge-deleted-vault" in refused.stderr
    assert "group create --name" not in commands(az_calls(az_env)[-4:])
    before = len(az_calls(az_env))
    again = onboard(hpcjob, "--purge-deleted-vault")
    assert again.returncode == 0, again.stderr
    calls = [call["argv"][:2] for call in az_calls(az_env)[before:]]
    assert calls.index(["keyvault", "purge"]) < calls.index(["group", "create"])
    assert "gpu1" in tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]


def test_onboarding_into_a_group_still_being_deleted_says_so_before_anything_else(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    assert onboard(hpcjob).returncode == 0
    assert hpcjob("cluster", "delete", "gpu1", "--yes", FAKE_AZ_SLOW_DELETE="1").returncode == 0
    before = len(az_calls(az_env))
    again = onboard(hpcjob)
    assert again.returncode == 2 and error_lines(again) == [
        "hpcjob: error: resource group rg-gpu1 is still being deleted: wait for it (az group wait --deleted "
        "--name rg-gpu1), then onboard again"
    ]
    assert ["group", "create"] not in [call["argv"][:2] for call in az_calls(az_env)[before:]]


def test_what_if_warns_of_a_soft_deleted_vault_that_azure_s_preview_does_not_see(
    hpcjob: CommandRunner,
) -> None:
    assert onboard(hpcjob).returncode == 0
    assert hpcjob("cluster", "delete", "gpu1", "--yes").returncode == 0
    preview = onboard(hpcjob, "--what-if")
    assert preview.returncode == 0, preview.stderr
    assert (
        "warning: the deployment itself would need the soft-deleted Key Vault rg-gpu1-kv-" in preview.stderr
    )


def test_the_fake_az_refuses_what_az_refuses(az_env: dict[str, str], tmp_path: Path) -> None:
    """So that the tests above cannot pass on an option or a download that the real az would refuse."""

    def az(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["az", *args], capture_output=True, text=True, env=az_env, timeout=60)

    unknown = az("vm", "list-usage", "--location", "eastus", "--size", "x")
    assert unknown.returncode == 2 and "unrecognized arguments: --size x" in unknown.stderr
    missing = az("group", "exists")
    assert missing.returncode == 2 and "the following arguments are required: --name" in missing.stderr
    existing = tmp_path / "cert.pem"
    existing.write_text("")
    args = ["keyvault", "certificate", "download", "--vault-name", "v", "--name", "HPCPackCommunication"]
    assert "already exists" in az(*args, "--file", str(existing)).stderr
    forbidden = az(*args, "--file", str(tmp_path / "new.pem"))
    assert forbidden.returncode == 1 and "(Forbidden) Caller is not authorized" in forbidden.stderr
    assert az("deployment", "group", "what-if", "--resource-group", "nowhere").returncode == 3


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


# A sitecustomize that makes every connection fail in the Python that imports it.
NO_NETWORK = """
import socket

def _refused(*args, **kwargs):
    raise OSError("no network in this test")

socket.socket.connect = socket.socket.connect_ex = _refused
socket.create_connection = socket.getaddrinfo = _refused
"""


def offline(tmp_path: Path, package: Path | None = None) -> dict[str, str]:
    """The environment of an hpcjob with no network (and `package`'s copy of hpcjob, if given)."""
    cut = tmp_path / "no-network"
    cut.mkdir()
    (cut / "sitecustomize.py").write_text(NO_NETWORK)
    paths = [str(cut), *([str(package)] if package else []), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        "HTTPS_PROXY": f"http://127.0.0.1:{free_port()}",  # and a proxy that refuses, in case
        "NO_PROXY": "",
        "no_proxy": "",
    }


def test_print_only_needs_no_network_the_template_comes_with_the_package(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    env = offline(tmp_path)
    probe = [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 9), timeout=5)"]
    cut = subprocess.run(probe, capture_output=True, text=True, timeout=60, env={**az_env, **env})
    assert cut.returncode != 0 and "no network in this test" in cut.stderr  # the cut holds
    args = ["gpu1", "--resource-group", "rg-gpu1", "--location", "eastus", *A100, "--nodes", "2"]
    done = hpcjob("cluster", "onboard", *args, "--print-only", "--out", str(tmp_path / "out"), **env)
    assert done.returncode == 0, done.stderr
    assert f"--template-uri {TEMPLATE_URL}" in done.stdout  # what az deploys: the pinned URL, as before
    with_copy = tmp_path / "with-copy"
    again = onboard(hpcjob, "--print-only", "--out", str(with_copy))  # --template: the same parameters
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "parameters.json").read_text() == (with_copy / "parameters.json").read_text()
    assert az_calls(az_env) == []


def test_the_packaged_template_is_the_pinned_one() -> None:
    where, data = packaged_template()
    assert hashlib.sha256(data).hexdigest() == TEMPLATE_SHA256
    assert data == TEMPLATE.read_bytes() and where.endswith(TEMPLATE_PATH.rsplit("/", 1)[-1])


def test_a_tampered_packaged_template_is_refused_in_one_line(hpcjob: CommandRunner, tmp_path: Path) -> None:
    package = tmp_path / "copy"
    shutil.copytree(
        Path(hpcjob_package.__file__).parent, package / "hpcjob", ignore=shutil.ignore_patterns("__pycache__")
    )
    packaged = package / "hpcjob" / "azure" / "arm" / TEMPLATE_PATH.rsplit("/", 1)[-1]
    packaged.write_bytes(packaged.read_bytes().replace(b'"maxValue": 500', b'"maxValue": 5000'))
    args = ["gpu1", "--resource-group", "rg-gpu1", "--location", "eastus", *A100, "--nodes", "2"]
    done = hpcjob("cluster", "onboard", *args, "--print-only", **offline(tmp_path, package))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"hpcjob: error: the ARM template {packaged} is not the pinned one")
    assert done.stderr.rstrip().endswith("reinstall hpcjob")


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
    from hpcjob.cli import cli

    cluster = cli.get_command(click.Context(cli), "cluster")
    assert isinstance(cluster, click.Group)
    onboard = cluster.get_command(click.Context(cluster), "onboard")
    assert onboard is not None
    defaults = {p.name: p.default for p in onboard.params}
    assert (defaults["password_env"], defaults["key_env"]) == (ADMIN_PASSWORD_ENV, AUTH_KEY_ENV)


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


def test_the_ports_the_readme_names_are_those_the_template_s_security_group_opens() -> None:
    def rules(node: object) -> list[dict[str, object]]:
        """Every security rule anywhere in the template (its network security group is nested)."""
        if isinstance(node, dict):
            found = (
                list(node.get("securityRules") or []) if isinstance(node.get("securityRules"), list) else []
            )
            return found + [rule for value in node.values() for rule in rules(value)]
        if isinstance(node, list):
            return [rule for value in node for rule in rules(value)]
        return []

    opened = sorted(
        int(str(props["destinationPortRange"]).strip())
        for rule in rules(_template())
        if isinstance(props := rule.get("properties"), dict)
        and props.get("access") == "Allow"
        and props.get("direction") == "Inbound"
    )
    assert opened == [443, 3389, 9087, 9090, 9091, 9094]
    readme = " ".join(
        (Path(__file__).resolve().parents[1] / "hpcjob" / "azure" / "arm" / "README.md").read_text().split()
    )
    assert f"opens only {', '.join(map(str, opened[:-1]))} and {opened[-1]}" in readme


def test_a_multi_node_cluster_of_a_size_without_infiniband_is_warned_of() -> None:
    sizes = Path(__file__).resolve().parent.parent / "hpcjob" / "job" / "sizes.json"
    table = SizeTable.from_data(json.loads(sizes.read_text()))

    def warned(size: str, nodes: int) -> str | None:
        return fabric_warning(OnboardRequest("c", "rg", "eastus", size, nodes), table)

    assert warned("Standard_NC24ads_A100_v4", 4) == (
        "Standard_NC24ads_A100_v4 has no InfiniBand: DDP across its 4 nodes goes over TCP on Ethernet, many "
        "times slower than on a size with it (Standard_ND128isr_NDR_GB200_v6, Standard_ND40rs_v2, "
        "Standard_ND96amsr_A100_v4, Standard_ND96asr_v4, Standard_ND96isr_H100_v5, Standard_ND96isr_H200_v5, "
        "Standard_ND96isr_MI300X_v5)"
    )
    assert warned("Standard_NC24ads_A100_v4", 1) is None  # one node: NVLink or PCIe, no network
    assert warned("Standard_ND96isr_H100_v5", 16) is None
    assert warned("Standard_NC24rs_v3", 2) is None  # an RDMA size, UNVERIFIED: not warned of


# Spot nodes and more nodes: `cluster onboard --spot` and `cluster grow`; the new nodes come online on the
# head node emulator.

ADD_NODES = REFERENCE / "arm" / "GeneratedTemplates" / "add-lnx-compute-nodes.json"
A100_SIZE = "Standard_NC24ads_A100_v4"


def parameters_of(folder: Path) -> dict[str, object]:
    data = json.loads((folder / "parameters.json").read_text())["parameters"]
    return {name: p["value"] for name, p in data.items()}


def profile_of(az_env: dict[str, str], name: str = "gpu1") -> dict[str, object]:
    loaded: dict[str, object] = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"][name]
    return loaded


def vms(az_env: dict[str, str], group: str = "rg-gpu1") -> dict[str, dict[str, object]]:
    state = json.loads((Path(az_env["FAKE_AZ_STATE"]) / "state.json").read_text())
    return {vm["name"]: vm for vm in state["vms"].get(group, [])}


def test_onboarding_spot_nodes_sets_the_template_s_parameter_and_the_profile(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    done = onboard(hpcjob, "--spot", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert parameters_of(tmp_path / "out")["useSpotInstanceForComputeNodes"] == "Yes"
    assert profile_of(az_env)["spot"] is True  # runs are counted at the Spot price
    made = vms(az_env)
    assert (
        made["IaaSLnxCN000"]["priority"] == "Spot" and made["IaaSLnxCN000"]["evictionPolicy"] == "Deallocate"
    )
    assert made["gpu1"]["priority"] == "Regular"  # the head node is not Spot
    assert "each Spot node the Spot price of the hour" in done.stderr
    # Without --spot the parameter is left to the template's default (No).
    assert onboard(hpcjob, "--print-only", "--out", str(tmp_path / "regular")).returncode == 0
    assert "useSpotInstanceForComputeNodes" not in parameters_of(tmp_path / "regular")


def test_spot_nodes_count_against_the_regional_spot_quota_not_their_family_s(
    hpcjob: CommandRunner, az_env: dict[str, str]
) -> None:
    refused = onboard(hpcjob, "--spot", FAKE_AZ_SPOT_QUOTA="24")
    assert refused.returncode == 2 and error_lines(refused) == [
        "hpcjob: error: 2 x Standard_NC24ads_A100_v4 (Spot) need 48 vCPUs of Total Regional Low-priority "
        "vCPUs in eastus, and the quota leaves 24: ask for more (Azure portal, Quotas) or choose fewer nodes"
    ]
    # No room left in the A100 family: Spot nodes do not need it.
    preview = onboard(hpcjob, "--spot", "--what-if", FAKE_AZ_QUOTA="0")
    assert preview.returncode == 0, preview.stderr


def test_grow_print_only_needs_no_network(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    assert onboard(hpcjob).returncode == 0
    before = len(az_calls(az_env))
    out = tmp_path / "grow"
    done = hpcjob(
        "cluster", "grow", "gpu1", "2", "--spot", "--print-only", "--out", str(out), **offline(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert len(az_calls(az_env)) == before  # nothing asked of az
    lines = done.stdout.splitlines()
    assert lines[0] == "az vm list --resource-group rg-gpu1 --output json"
    assert f"--template-uri {ADD_NODES_URL}" in lines[1] and TEMPLATE_COMMIT in ADD_NODES_URL
    assert "--parameters computeNodeNameStartIndex=START --parameters @-" in lines[1]
    assert lines[2].startswith("# START: the first index after the existing IaaSLnxCN<index> nodes")
    assert "standard input" in lines[3]
    assert parameters_of(out) == {
        "computeNodeNamePrefix": "IaaSLnxCN",
        "computeNodeNumber": 2,
        "computeNodeImage": "Ubuntu_22.04_HPC_Gen2",
        "computeNodeVMSize": A100_SIZE,
        "adminUsername": "hpcadmin",
        "authenticationType": "password",
        "virtualNetworkName": "gpu1vnet",
        "subnetName": "Subnet-1",
        "availabilitySetName": "",  # not an RDMA size: the template puts none of its nodes in one
        "clusterConnectionString": "gpu1",
        "useSpotInstances": "Yes",
    }
    rdma = hpcjob(
        "cluster", "grow", "gpu1", "1", "--vm-size", "Standard_ND96asr_v4", "--print-only", "--out", str(out)
    )
    assert rdma.returncode == 0, rdma.stderr
    assert parameters_of(out)["availabilitySetName"] == "gpu1-avset"  # with the cluster's RDMA nodes


# A new VM's node agent registers with the head node this long after the VM is made: long enough that a
# `cluster grow` on a loaded 2-core machine still sees it missing first (0.5 s was not, in CI).
REGISTERS_AFTER_S = 2.0


@pytest.fixture
def head_node(az_env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[HeadNode]:
    """The cluster's head node: it knows IaaSLnxCN000 and 001 (the template's) and IaaSLnxCN002, a node
    whose VM is not in the resource group; a VM that a deployment adds registers REGISTERS_AFTER_S later,
    as its node agent would, once (a node removed later stays removed). An indirect parameter: more
    HeadNode settings."""
    nodes = [NodeSpec(f"IaaSLnxCN{index:03d}") for index in range(3)]
    settings = getattr(request, "param", {})
    with HeadNode(nodes, users={"hpcadmin": PASSWORD}, domain="GPU1", **settings) as head:
        stop = threading.Event()

        def register() -> None:
            seen: dict[str, float] = {}
            registered: set[str] = set()
            while not stop.wait(0.1):
                try:
                    made = vms(az_env)
                except (OSError, ValueError):
                    continue
                known = {node.name.lower() for node in head.nodes} | registered
                for name in made:
                    if name != "gpu1" and name.lower() not in known:
                        seen.setdefault(name, time.monotonic())
                        if time.monotonic() - seen[name] > REGISTERS_AFTER_S:
                            with head.cluster.lock:
                                head.cluster.registry.add(NodeSpec(name))
                                head.cluster.changed.notify_all()
                            registered.add(name.lower())

        thread = threading.Thread(target=register, daemon=True)
        thread.start()
        try:
            yield head
        finally:
            stop.set()
            thread.join()


def hourly(row: str) -> float:
    """The $/H column of a `cluster list` row ("~$8.51"; a Spot size the package's table has no price
    for: "-")."""
    return float(row.split()[-1].lstrip("~$"))


def test_grow_adds_spot_nodes_after_every_existing_one_and_waits_for_them_online(
    hpcjob: CommandRunner, az_env: dict[str, str], head_node: HeadNode, tmp_path: Path
) -> None:
    at = {"FAKE_AZ_DNS": f"127.0.0.1:{head_node.port}", "FAKE_AZ_CERT": head_node.ca_file}
    assert onboard(hpcjob, **at).returncode == 0  # the profile pins the emulator's certificate
    onboarded = hpcjob("cluster", "list").stdout.splitlines()[1]
    assert " running, as of " in onboarded and hourly(onboarded) > 0  # known from the start
    out = tmp_path / "grow"
    done = hpcjob(
        "cluster", "grow", "gpu1", "2", "--spot", "--no-check", "--poll-interval", "0.2", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout == f"cluster gpu1: 2 new nodes online ({A100_SIZE}, Spot): IaaSLnxCN003, IaaSLnxCN004\n"
    )
    # After 000 and 001 (VMs) and 002 (a node the head node knows): 003 on.
    calls = az_calls(az_env)
    grown = [c for c in calls if c["argv"][:3] == ["deployment", "group", "create"]][-1]  # type: ignore[index]
    argv = list(grown["argv"])  # type: ignore[call-overload]
    assert argv[argv.index("--template-uri") + 1] == ADD_NODES_URL
    assert "computeNodeNameStartIndex=3" in argv
    assert grown["stdin_parameters"] == ["adminPasswordOrKey", "authenticationKey"]  # the secrets: stdin only
    values = parameters_of(out)
    spot = (values["computeNodeNumber"], values["computeNodeVMSize"], values["useSpotInstances"])
    assert spot == (2, A100_SIZE, "Yes")
    made = vms(az_env)
    assert [made[n]["priority"] for n in ("IaaSLnxCN003", "IaaSLnxCN004")] == ["Spot", "Spot"]
    assert made["IaaSLnxCN001"]["priority"] == "Regular"
    assert (
        "hpcjob: IaaSLnxCN003: not seen yet" in done.stderr
        and "hpcjob: IaaSLnxCN003: Online, OK" in done.stderr
    )
    assert (
        "warning: the new nodes are Standard_NC24ads_A100_v4, Spot and cluster gpu1's profile says"
        in done.stderr
    )
    for secret in (PASSWORD, KEY):
        assert all(secret not in " ".join(map(str, call["argv"])) for call in calls)  # type: ignore[call-overload]
        assert secret not in done.stdout + done.stderr
        assert secret not in (out / "parameters.json").read_text()
    # The new VMs cost from now on: counted in the cluster's cost an hour.
    grown = power_record("gpu1", "rg-gpu1")
    assert grown is not None and grown.state == "running"
    assert grown.nodes == (NodeKind(A100_SIZE, False, 2), NodeKind(A100_SIZE, True, 2))
    # Again: after the new ones.
    named = hpcjob("cluster", "grow", "gpu1", "1", "--no-check", "--poll-interval", "0.2", "--out", str(out))
    assert named.returncode == 0, named.stderr
    assert named.stdout.endswith("): IaaSLnxCN005\n")


def test_grow_data_puts_cpu_nodes_in_their_group_and_the_profile_names_it(
    hpcjob: CommandRunner, az_env: dict[str, str], head_node: HeadNode, tmp_path: Path
) -> None:
    """`cluster grow --data`: CPU data nodes (issue 34) the same way Spot nodes are added, then put in the
    data nodes' group (made, as the cluster has none), which the profile names with their size."""
    at = {"FAKE_AZ_DNS": f"127.0.0.1:{head_node.port}", "FAKE_AZ_CERT": head_node.ca_file}
    assert onboard(hpcjob, **at).returncode == 0
    out = tmp_path / "grow"
    grown = (
        "cluster",
        "grow",
        "gpu1",
        "2",
        "--data",
        "--no-check",
        "--poll-interval",
        "0.2",
        "--out",
        str(out),
    )
    done = hpcjob(*grown, "--vm-size", "Standard_F16s_v2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cluster gpu1: 2 new nodes online (Standard_F16s_v2): IaaSCpuDN000, IaaSCpuDN001\n"
    assert parameters_of(out)["computeNodeVMSize"] == "Standard_F16s_v2"
    assert head_node.cluster.group_members("CPUNodes") == ["IaaSCpuDN000", "IaaSCpuDN001"]
    assert "hpcjob: node group CPUNodes now holds IaaSCpuDN000, IaaSCpuDN001" in done.stderr
    profile = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]["gpu1"]
    assert (profile["data_node_group"], profile["data_vm_size"]) == ("CPUNodes", "Standard_F16s_v2")
    assert profile["vm_size"] == A100_SIZE  # the GPU nodes' size stays
    assert "32 of" not in done.stderr and "2 x Standard_F16s_v2: about $1.35 an hour more" in done.stderr
    refused = hpcjob(*grown, "--vm-size", A100_SIZE)
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("is not a CPU size hpcjob knows for data nodes; choose one of "
        "Standard_D16s_v5, Standard_D32s_v5, Standard_F16s_v2, Standard_F32s_v2, Standard_F72s_v2, "
        "Standard_F8s_v2 (hpcjob/job/sizes.json)")  # fmt: skip


@pytest.mark.parametrize(
    ("head_node", "said"),
    [
        (
            {"unknown_group_node": "skip"},
            "node IaaSCpuDN001 did not join node group CPUNodes (IaaSCpuDN000 did); the head node raised no "
            "error",
        ),
        (
            {"unknown_group_node": "error"},
            "nodes IaaSCpuDN000, IaaSCpuDN001 did not join node group CPUNodes; the head node said: PATCH "
            "/cluster/nodeGroups/CPUNodes/nodes: HTTP 404: The node IaaSCpuDN001 was not found.",
        ),
    ],
    indirect=["head_node"],
    ids=["skipped", "refused"],
)
def test_grow_data_names_a_node_that_did_not_join_the_group(
    hpcjob: CommandRunner, az_env: dict[str, str], head_node: HeadNode, tmp_path: Path, said: str
) -> None:
    """Issue 38: a new node that is gone from the cluster by the time it is put in the data nodes' group
    (removed between the look that saw it online and the group's request) is named in one line, exit 1,
    whether the head node leaves it out without a word (Add-HpcGroup's -NodeName is a filter) or refuses
    the request; the profile names the group where some node joined."""
    at = {"FAKE_AZ_DNS": f"127.0.0.1:{head_node.port}", "FAKE_AZ_CERT": head_node.ca_file}
    assert onboard(hpcjob, **at).returncode == 0
    request = head_node.inject(method="PATCH", path="/cluster/nodeGroups/", delay_before=1.0)

    def remove_when_asked() -> None:
        deadline = time.monotonic() + 120
        while request.hits == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        head_node.remove_node("IaaSCpuDN001")  # while the request waits, before the head node reads it

    remover = threading.Thread(target=remove_when_asked, daemon=True)
    remover.start()
    done = hpcjob(
        "cluster", "grow", "gpu1", "2", "--data", "--vm-size", "Standard_F16s_v2", "--no-check",
        "--poll-interval", "0.2", "--out", str(tmp_path / "grow"),
    )  # fmt: skip
    remover.join()
    assert done.returncode == 1
    assert error_lines(done) == [f"hpcjob: error: {said}"]
    joined = head_node.cluster.group_members("CPUNodes")
    profile = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]["gpu1"]
    if joined:
        assert joined == ["IaaSCpuDN000"]
        assert (profile["data_node_group"], profile["data_vm_size"]) == ("CPUNodes", "Standard_F16s_v2")
    else:
        assert "data_node_group" not in profile
    assert "now holds" not in done.stderr


def test_onboarding_with_data_nodes_adds_them_once_the_cluster_is_up(
    hpcjob: CommandRunner, az_env: dict[str, str], head_node: HeadNode, tmp_path: Path
) -> None:
    at = {"FAKE_AZ_DNS": f"127.0.0.1:{head_node.port}", "FAKE_AZ_CERT": head_node.ca_file}
    data = ("--data-nodes", "1", "--data-vm-size", "Standard_F16s_v2", "--no-check", "--poll-interval", "0.2")
    printed = onboard(hpcjob, *data, "--print-only", "--out", str(tmp_path / "p"))
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.rstrip().endswith(
        "# then the data nodes: hpcjob cluster grow gpu1 1 --data --vm-size Standard_F16s_v2"
    )
    refused = onboard(hpcjob, "--data-nodes", "1", "--print-only")
    assert refused.returncode == 2 and "--data-nodes and --data-vm-size go together" in refused.stderr
    done = onboard(hpcjob, *data, "--out", str(tmp_path / "out"), **at)
    assert done.returncode == 0, done.stderr
    assert "cluster gpu1: 1 data node(s) in their group: IaaSCpuDN000" in done.stdout
    assert head_node.cluster.group_members("CPUNodes") == ["IaaSCpuDN000"]
    assert (tmp_path / "out" / "data-nodes" / "parameters.json").is_file()  # onboarding's file kept
    assert json.loads((tmp_path / "out" / "parameters.json").read_text())["parameters"]["computeNodeNumber"]
    profile = tomllib.loads(Path(az_env["HPCJOB_CONFIG"]).read_text())["clusters"]["gpu1"]
    assert (profile["data_node_group"], profile["data_vm_size"]) == ("CPUNodes", "Standard_F16s_v2")


def test_new_nodes_the_head_node_does_not_see_online_are_said_after_the_timeout(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    with HeadNode(
        [NodeSpec("IaaSLnxCN000"), NodeSpec("IaaSLnxCN001")], users={"hpcadmin": PASSWORD}, domain="GPU1"
    ) as head:
        assert (
            onboard(hpcjob, FAKE_AZ_DNS=f"127.0.0.1:{head.port}", FAKE_AZ_CERT=head.ca_file).returncode == 0
        )
        done = hpcjob(
            "cluster", "grow", "gpu1", "1", "--no-check", "--poll-interval", "0.2", "--online-timeout", "2s",
            "--out", str(tmp_path / "grow"),
        )  # fmt: skip
    assert done.returncode == 1
    assert error_lines(done) == [
        "hpcjob: error: the new VMs are there, and after 2 seconds the head node sees 0 of 1 online: "
        "IaaSLnxCN002 (not seen yet); look again with `hpcjob nodes --cluster gpu1`"
    ]


def test_the_fake_az_refuses_new_nodes_of_names_that_exist(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    """So that a grow that names a node after nothing can pass only where Azure would take it."""
    assert onboard(hpcjob).returncode == 0
    out = tmp_path / "grow"
    assert hpcjob("cluster", "grow", "gpu1", "1", "--print-only", "--out", str(out)).returncode == 0
    secrets = json.dumps({"adminPasswordOrKey": {"value": PASSWORD}, "authenticationKey": {"value": KEY}})

    def deploy(start: str) -> subprocess.CompletedProcess[str]:
        argv = ["az", "deployment", "group", "create", "--resource-group", "rg-gpu1", "--name", f"add{start}",
                "--template-uri", ADD_NODES_URL, "--parameters", f"@{out / 'parameters.json'}",
                "--parameters", f"computeNodeNameStartIndex={start}", "--parameters", "@-"]  # fmt: skip
        return subprocess.run(argv, input=secrets, capture_output=True, text=True, env=az_env, timeout=60)

    taken = deploy("1")
    assert (
        taken.returncode == 1
        and "(PropertyChangeNotAllowed)" in taken.stderr
        and "IaaSLnxCN001" in taken.stderr
    )
    assert deploy("2").returncode == 0
    unknown = deploy("2").args  # a parameter the template does not have is refused as az refuses it
    bad = subprocess.run(
        [*unknown[:-4], "--parameters", "noSuchParameter=1", "--parameters", "@-"],
        input=secrets, capture_output=True, text=True, env=az_env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1 and "unrecognized template parameter 'noSuchParameter'" in bad.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["by-hand", "2"], {}, "cluster by-hand was not made by `hpcjob cluster onboard`"),
        (["gpu1", "0"], {}, "parameter computeNodeNumber is 0; the template allows 1 to 50"),
        (["gpu1", "51"], {}, "parameter computeNodeNumber is 51; the template allows 1 to 50"),
        (["gpu1", "100000000000000000000"], {}, "the template allows 1 to 50"),
        (["gpu1", "x"], {}, "N 'x' must be a whole number of nodes"),
        (["gpu1", "2", "3"], {}, "cluster grow takes [NAME] N, not 3 arguments"),
        (["gpu1", "2", "--vm-size", "Standard_X"], {}, "Standard_X is not a GPU size hpcjob knows"),
        (["gpu1", "2", "--vm-size", "Standard_NV6ads_A10_v5"], {}, "not whole GPUs"),
        (["gpu1", "2", "--node-prefix", "no-dashes"], {}, "node prefix 'no-dashes' must be 1 to 12 letters"),
        (["gpu1", "2", "--online-timeout", "soon"], {}, "--online-timeout 'soon' must be a duration"),
        # No key given and none kept (no keyring here): asked before anything is.
        (
            ["gpu1", "2"],
            {"HPCJOB_AUTH_KEY": ""},
            "the nodes' authentication key of cluster gpu1 is not known here",
        ),
    ],
)
def test_bad_grow_input_is_one_line_before_az(
    hpcjob: CommandRunner, az_env: dict[str, str], args: list[str], env: dict[str, str], message: str
) -> None:
    assert onboard(hpcjob).returncode == 0
    assert hpcjob("cluster", "add", "by-hand", "--url", "https://head", "--user", "alice").returncode == 0
    before = len(az_calls(az_env))
    done = hpcjob("cluster", "grow", *args, "--no-check", **env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert len(az_calls(az_env)) == before


def test_onboarding_says_when_the_key_it_made_is_kept_nowhere(hpcjob: CommandRunner) -> None:
    done = onboard(hpcjob, HPCJOB_AUTH_KEY="")
    assert done.returncode == 0, done.stderr
    assert (
        "warning: the nodes' authentication key hpcjob made for cluster gpu1 is kept nowhere" in done.stderr
    )


def test_the_packaged_add_nodes_template_is_the_pinned_one() -> None:
    where, data = packaged_template(ADD_NODES_PATH.rsplit("/", 1)[-1])
    assert hashlib.sha256(data).hexdigest() == ADD_NODES_SHA256
    assert data == ADD_NODES.read_bytes() and where.endswith("add-lnx-compute-nodes.json")
    parameters = json.loads(data)["parameters"]
    assert parameters["useSpotInstances"]["defaultValue"] == "No"
    assert parameters["computeNodeNumber"]["maxValue"] == 50


IDENTITY = (
    "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-ids/providers/"
    "Microsoft.ManagedIdentity/userAssignedIdentities/hpc-data"
)


def test_onboarding_gives_every_node_the_managed_identity_and_grow_the_new_ones(
    hpcjob: CommandRunner, az_env: dict[str, str], tmp_path: Path
) -> None:
    """The pinned template passes its compute nodes no identity: each node VM gets it once deployed (az
    vm identity assign), the profile keeps it, and `cluster grow` hands it to the add-nodes template's own
    parameter. A malformed ID is one line before az runs."""
    from hpcjob.azure.template import GrowRequest, grow_parameters

    done = onboard(hpcjob, "--identity", IDENTITY)
    assert done.returncode == 0, done.stderr
    state = json.loads((Path(az_env["FAKE_AZ_STATE"]) / "state.json").read_text())
    assert state["identities"] == {"rg-gpu1/iaaslnxcn000": IDENTITY, "rg-gpu1/iaaslnxcn001": IDENTITY}
    assert "hpcjob: giving the 2 node(s) the managed identity hpc-data" in done.stderr
    assert profile_of(az_env)["identity"] == IDENTITY
    # The deployment first, then the identity: the VMs must be there.
    order = commands(az_calls(az_env))
    assert order.index("vm identity assign") > order.index("deployment group create")

    printed = onboard(hpcjob, "--identity", IDENTITY, "--print-only", "--out", str(tmp_path / "p"))
    assert printed.returncode == 0, printed.stderr
    assert (f"az vm identity assign --resource-group rg-gpu1 --name IaaSLnxCN001 --identities {IDENTITY} "
            "--output json") in printed.stdout.splitlines()  # fmt: skip

    grow = GrowRequest("gpu1", "rg-gpu1", "eastus", A100_SIZE, 2, "hpcadmin", identity=IDENTITY)
    add_nodes = json.loads((TEMPLATE.parent / "add-lnx-compute-nodes.json").read_text())
    assert grow_parameters(grow)["userAssignedIdentity"] == IDENTITY
    assert "userAssignedIdentity" in add_nodes["parameters"]  # the template's own name for it
    assert "userAssignedIdentity" not in grow_parameters(replace(grow, identity=None))

    before = len(az_calls(az_env))
    bad = onboard(hpcjob, "--identity", "hpc-data")
    assert bad.returncode == 2 and error_lines(bad)[0].startswith(
        "hpcjob: error: --identity 'hpc-data' must be a user-assigned identity's resource ID"
    )
    assert len(az_calls(az_env)) == before
