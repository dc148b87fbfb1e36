"""Cluster profiles: what is stored (never a password), where the password comes from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcjob.config import ClusterProfile, config_path, get_profile, load_profiles, password_for
from hpcjob.spec import SpecError


@pytest.fixture(autouse=True)
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "clusters.toml"
    monkeypatch.setenv("HPCJOB_CONFIG", str(path))
    monkeypatch.delenv("HPCJOB_CLUSTER", raising=False)
    return path


def hpcjob(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_cluster_add_writes_a_profile_without_a_password(config_file: Path) -> None:
    result = hpcjob(
        "cluster",
        "add",
        "prod",
        "--url",
        "https://head.contoso.com",
        "--user",
        "CONTOSO\\alice",
        "--password-env",
        "PROD_PW",
        "--share",
        "//HEAD/CcpSpoolDir/app",
        "--node-group",
        "GPUNodes",
    )
    assert result.returncode == 0, result.stderr
    text = config_file.read_text()
    assert text == (
        'default = "prod"\n\n[clusters.prod]\nurl = "https://head.contoso.com"\nuser = "CONTOSO\\\\alice"\n'
        'password = "env:PROD_PW"\ninsecure = false\nshare = "//HEAD/CcpSpoolDir/app"\nsmb_port = 445\n'
        'node_group = "GPUNodes"\n'
    )
    profile = get_profile(None)
    assert (profile.user, profile.api_base, profile.verify) == (
        "CONTOSO\\alice",
        "https://head.contoso.com/hpc",
        True,
    )
    listed = hpcjob("cluster", "list")
    assert listed.stdout == "prod\thttps://head.contoso.com/hpc\tCONTOSO\\alice\t//HEAD/CcpSpoolDir/app\n"


def test_insecure_warns_and_ca_bundle_is_verified(tmp_path: Path) -> None:
    result = hpcjob("cluster", "add", "lab", "--url", "https://lab", "--user", "u", "--insecure")
    assert "TLS verification is off" in result.stderr
    assert get_profile("lab").verify is False
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    hpcjob("cluster", "add", "lab2", "--url", "https://lab2/hpc", "--user", "u", "--ca-bundle", str(ca))
    assert get_profile("lab2").verify == str(ca)
    assert get_profile("lab2").api_base == "https://lab2/hpc"


def test_choosing_a_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError, match="no cluster configured"):
        get_profile(None)
    hpcjob("cluster", "add", "a", "--url", "https://a", "--user", "u")
    hpcjob("cluster", "add", "b", "--url", "https://b", "--user", "u", "--default")
    assert get_profile(None).name == "b"
    monkeypatch.setenv("HPCJOB_CLUSTER", "a")
    assert get_profile(None).name == "a"
    assert get_profile("b").name == "b"
    with pytest.raises(SpecError, match=r"no cluster 'c' in .*; configured: a, b"):
        get_profile("c")
    assert hpcjob("cluster", "remove", "b").returncode == 0
    assert set(load_profiles()) == {"a"}


def test_bad_profiles_are_one_line_errors(config_file: Path) -> None:
    with pytest.raises(SpecError, match="must start with https://"):
        ClusterProfile(name="x", url="http://head", user="u")
    with pytest.raises(SpecError, match="never the password itself"):
        ClusterProfile(name="x", url="https://head", user="u", password="hunter2")
    config_file.write_text('[clusters.x]\nurl = "https://h"\nuser = "u"\npasword = "env:P"\n')
    with pytest.raises(SpecError, match=r"unknown key\(s\) pasword; known: .*password"):
        load_profiles()
    config_file.write_text("[clusters.x\n")
    with pytest.raises(SpecError, match=str(config_path())):
        load_profiles()


def test_password_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = ClusterProfile(name="x", url="https://h", user="u", password="env:X_PW")
    with pytest.raises(SpecError, match="the password variable X_PW is not set"):
        password_for(profile)
    monkeypatch.setenv("X_PW", "s3cret")
    assert password_for(profile) == "s3cret"
    prompt = ClusterProfile(name="x", url="https://h", user="u")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(SpecError, match="no terminal to ask for the password"):
        password_for(prompt)
