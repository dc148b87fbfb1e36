"""Cluster profiles: what is stored (never a password), where the password comes from."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcjob.emulator.tls import make_certificate
from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.store import config
from hpcjob.store.config import (
    ClusterProfile,
    config_path,
    get_profile,
    load_config,
    load_profiles,
    password_for,
    save_profile,
    secret_variables,
)

from .conftest import Result, empty_script


@pytest.fixture(autouse=True)
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "clusters.toml"
    monkeypatch.setenv("HPCJOB_CONFIG", str(path))
    monkeypatch.delenv("HPCJOB_CLUSTER", raising=False)
    return path


def hpcjob(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error of a command that failed on bad input: exit 2, one line on stderr, nothing else."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("hpcjob: error: "), result.stderr
    return result.stderr.removeprefix("hpcjob: error: ").rstrip("\n")


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
        'node_group = "GPUNodes"\nbackend = "rest"\n'
    )
    profile = get_profile(None)
    assert (profile.user, profile.api_base, profile.verify) == (
        "CONTOSO\\alice",
        "https://head.contoso.com/hpc",
        True,
    )
    assert result.stdout == f"cluster prod saved in {config_file}\n"


def test_insecure_warns_and_ca_bundle_is_verified(tmp_path: Path) -> None:
    result = hpcjob("cluster", "add", "lab", "--url", "https://lab", "--user", "u", "--insecure")
    assert "TLS verification is off" in result.stderr
    assert get_profile("lab").verify is False
    ca, _ = make_certificate(str(tmp_path))
    # A relative path is stored absolute: later commands run from other folders.
    added = hpcjob(
        "cluster", "add", "lab2", "--url", "https://lab2/hpc", "--user", "u", "--ca-bundle", "head.crt",
        cwd=tmp_path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert get_profile("lab2").verify == ca
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


def test_cluster_list_is_a_table_that_marks_the_default(config_file: Path) -> None:
    added = hpcjob("cluster", "add", "prod", "--url", "https://head.contoso.com", "--user", "CONTOSO\\alice",
                   "--share", "//HEAD/CcpSpoolDir/app", "--node-group", "GPU Nodes")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert hpcjob("cluster", "add", "lab", "--url", "https://lab:8443/hpc", "--user", "bob").returncode == 0
    listed = hpcjob("cluster", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "DEFAULT  NAME  BACKEND  URL                           USER           SHARE                   "
        "NODE GROUP  STATE  $/H",
        "         lab   rest     https://lab:8443/hpc          bob            -                       "
        "-           -      -",
        "*        prod  rest     https://head.contoso.com/hpc  CONTOSO\\alice  //HEAD/CcpSpoolDir/app  "
        "GPU Nodes   -      -",
    ]
    # $HPCJOB_CLUSTER chooses another for the commands, and the list says so.
    chosen = hpcjob("cluster", "list", env={**os.environ, "HPCJOB_CLUSTER": "lab"})
    assert [line[:1] for line in chosen.stdout.splitlines()] == ["D", "*", " "]
    assert hpcjob("cluster", "remove", "prod").returncode == 0
    assert hpcjob("cluster", "remove", "lab").returncode == 0
    empty = hpcjob("cluster", "list")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr.startswith("no cluster configured in ")


def test_cluster_list_marks_a_profile_whose_ca_file_is_gone_and_says_the_fix(
    tmp_path: Path, config_file: Path
) -> None:
    """A stopped emulator takes its folder, CA file and all, with it (and a cleaned /tmp its share): the
    list still lists every profile, marks those, and says the fix of each in one line."""
    from hpcjob.emulator.headnode import PASSWORD_ENV

    emulator, other, share = tmp_path / "hpcjob-emulator-x", tmp_path / "pki", tmp_path / "share"
    for folder in (emulator, other, share):
        folder.mkdir()
    emulator_ca, _ = make_certificate(str(emulator))
    other_ca, _ = make_certificate(str(other))
    for args in (
        ["emu", "--url", "https://127.0.0.1:4443", "--user", "alice", "--password-env", PASSWORD_ENV,
         "--ca-bundle", emulator_ca, "--local-share", str(share), "--node-group", "GPUNodes"],
        ["lab", "--url", "https://lab", "--user", "bob", "--ca-bundle", other_ca],
        ["prod", "--url", "https://prod", "--user", "carol", "--default"],
    ):  # fmt: skip
        assert hpcjob("cluster", "add", *args).returncode == 0
    shutil.rmtree(emulator)
    shutil.rmtree(other)
    shutil.rmtree(share)
    listed = hpcjob("cluster", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.endswith("NODE GROUP  STATE  $/H  PROBLEM")
    rows = {line.removeprefix("*").split()[0]: line for line in lines}
    assert rows["emu"].endswith("GPUNodes    -      -    CA file missing, local share missing")
    assert rows["lab"].endswith("  CA file missing") and rows["prod"].startswith("*")
    assert rows["prod"].split()[-5:] == ["carol", "-", "-", "-", "-"]  # nothing missing: nothing said
    assert listed.stderr.splitlines() == [
        f"hpcjob: warning: cluster emu: CA file {emulator_ca} and local share {share} are gone; start "
        "`hpcjob emulator --user alice --profile emu` again and run the `hpcjob cluster add` line it prints",
        f"hpcjob: warning: cluster lab: CA file {other_ca} is gone; put it back, or add the profile again: "
        "`hpcjob cluster add lab --url ... --ca-bundle FILE`",
    ]
    # A command uses the profile it names: the default, whole, is used; a gone one says what is gone.
    assert get_profile(None).name == "prod"
    assert one_line(lambda: get_profile("emu")).endswith(
        f"cluster emu: ca_bundle {emulator_ca!r}: no such file"
    )
    assert one_line(load_config).endswith(f"cluster emu: ca_bundle {emulator_ca!r}: no such file")


BASE = {"url": '"https://head"', "user": '"alice"'}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("url = 5", "url must be a string, not an integer"),
        ("password = 7", "password must be a string, not an integer"),
        ('insecure = "no"', "insecure must be true or false (unquoted), not a string"),
        ("insecure = 1", "insecure must be true or false (unquoted), not an integer"),
        ('smb_port = "x"', "smb_port must be an integer, not a string"),
        ("smb_port = true", "smb_port must be an integer, not a boolean"),
        ("smb_port = 70000", "smb_port 70000 must be between 1 and 65535"),
        ("smb_port = 0", "smb_port 0 must be between 1 and 65535"),
        ("rdzv_port = 65536", "rdzv_port 65536 must be between 1 and 65535"),
        ('nodes_here = "yes"', "nodes_here must be true or false (unquoted), not a string"),
        ("poll_interval = 0.05", "poll_interval 0.05 must be between 0.1 and 300 seconds"),
        ('poll_interval = "fast"', "poll_interval must be a number of seconds, not a string"),
        ("poll_interval = true", "poll_interval must be a number of seconds, not a boolean"),
        ("retries = 101", "retries 101 must be between 0 and 100"),
        ('retries = "2"', "retries must be an integer, not a string"),
        ("share = ['//HEAD/CcpSpoolDir']", "share must be a string, not an array"),
        ("node_group = 1979-05-27", "node_group must be a string, not a date or time"),
        ('ca_bundle = "/nonexistent/ca.pem"', "ca_bundle '/nonexistent/ca.pem': no such file"),
        ('ca_bundle = "ca.pem"', "ca_bundle 'ca.pem' must be an absolute path"),
        ('ca_bundle = "/etc/hostname"', "ca_bundle '/etc/hostname' holds no PEM certificate"),
        ('share = "HEAD/CcpSpoolDir"', "share 'HEAD/CcpSpoolDir' must look like //HEADNODE/CcpSpoolDir"),
        ('node_group = "GPU;reboot"', "node_group 'GPU;reboot' must be a node group name"),
        ('mount_point = "app"', "mount_point 'app' must be an absolute path on the nodes"),
        ('smb_server = "head node"', "smb_server 'head node' must be a host name or an address"),
        ('user = ""', "user must be a user name such as CONTOSO\\alice"),
        ('smb_user = "a\\nb"', "smb_user must be a user name such as CONTOSO\\alice"),
        ('url = "http://head"', "url must start with https:// (the password travels in it: TLS only)"),
        ('url = "https://"', "url names no host"),
        ('url = "https://head:99999"', "url is not a valid URL"),
        ('url = "https://head/hpc?api-version=2"', "url must not have a ?query or #fragment"),
        ('password = "env:"', "password must be 'prompt', 'keyring' or 'env:VARIABLE'"),
        ('password = "env:A B"', "password must be 'prompt', 'keyring' or 'env:VARIABLE'"),
        ('backend = "ssh"', "backend must be one of rest, winrm, not 'ssh'"),
        ('winrm_url = "http://head:5985/wsman"', "winrm_url must start with https://"),
        ('winrm_url = "https://bob:secret@head/wsman"', "winrm_url must not hold a user or password"),
        ('winrm_transport = "digest"', "winrm_transport must be one of ntlm, kerberos, credssp, basic"),
        ('cert_fingerprint = "nothex"', "cert_fingerprint must be a certificate's SHA-256 fingerprint"),
        (f'cert_fingerprint = "{"ab" * 31}"', "cert_fingerprint must be a certificate's SHA-256 fingerprint"),
        (f'cert_fingerprint = "{"ab" * 32}"\ninsecure = true', "cert_fingerprint replaces ca_bundle and"),
    ],
)
def test_a_bad_value_in_the_file_is_one_line_naming_file_cluster_and_key(
    config_file: Path, line: str, error: str
) -> None:
    key = line.split(" = ")[0]
    kept = [f"{k} = {v}" for k, v in BASE.items() if k != key]
    config_file.write_text("\n".join(["[clusters.p]", *kept, line]) + "\n")
    assert one_line(load_config).startswith(f"{config_file}: cluster p: {error}")


def one_line(read: Callable[[], object]) -> str:
    """The error reading the file raises: one line, what the command line prints after `hpcjob: error: `
    (as `test_the_command_line_says_what_is_wrong_with_the_file_in_one_line` sees it do)."""
    with pytest.raises(SpecError) as raised:
        read()
    message = str(raised.value)
    assert "\n" not in message and message.isprintable(), message
    return message


def test_the_command_line_says_what_is_wrong_with_the_file_in_one_line(config_file: Path) -> None:
    config_file.write_text('[clusters.p]\nurl = "https://head"\nuser = "alice"\nsmb_port = 0\n')
    said = one_line_error(hpcjob("cluster", "list"))
    assert said == one_line(load_config) and said.startswith(f"{config_file}: cluster p: smb_port 0 must be")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b'clusters = "x"\n', "clusters must be [clusters.NAME] tables, not a string"),
        (b"[clusters]\np = 5\n", "cluster p must be a table ([clusters.p]), not an integer"),
        (b'default = 3\n[clusters.p]\nurl = "https://h"\nuser = "u"\n', "default must be a string"),
        (b'default = "q"\n[clusters.p]\nurl = "https://h"\nuser = "u"\n', "default 'q' names no cluster"),
        (b'defualt = "p"\n', "unknown key(s) defualt; known: clusters, default"),
        (b'[clusters."p q"]\nurl = "https://h"\nuser = "u"\n', "cluster name 'p q' must be letters"),
        (b'[clusters."p\\nq"]\nurl = "https://h"\nuser = "u"\n', "cluster name 'p\\nq' must be letters"),
        (b'[clusters.p]\nuser = "u"\n', "cluster p: url missing"),
        (b'[clusters.p]\nurl = "https://h"\nuser = "\xe9"\n', "not UTF-8 text (line 3); save it as UTF-8"),
    ],
)
def test_a_broken_file_is_one_line_naming_the_file(config_file: Path, text: bytes, error: str) -> None:
    config_file.write_bytes(text)
    assert one_line(load_config).startswith(f"{config_file}: {error}")
    assert one_line(lambda: get_profile("p")).startswith(str(config_file))


def test_a_profile_written_with_a_byte_order_mark_is_read(config_file: Path) -> None:
    config_file.write_bytes('\ufeff[clusters.p]\nurl = "https://h"\nuser = "u"\n'.encode())
    assert get_profile(None).url == "https://h"


@pytest.mark.parametrize("name", ["p\nq", "p q", "../x", "p]", "a" * 65, "é", ".hidden"])
def test_cluster_add_refuses_a_name_that_would_break_the_file(config_file: Path, name: str) -> None:
    error = one_line_error(hpcjob("cluster", "add", name, "--url", "https://h", "--user", "u"))
    assert error.startswith(f"cluster name {name!r} must be letters, digits and . _ -")
    assert not config_file.exists()


def test_names_with_dots_round_trip_and_a_broken_profile_can_be_removed(config_file: Path) -> None:
    for name in ("a.b", "A-1_z"):
        assert hpcjob("cluster", "add", name, "--url", "https://h", "--user", "u").returncode == 0
    assert set(load_profiles()) == {"a.b", "A-1_z"}
    assert '[clusters."a.b"]' in config_file.read_text()
    assert hpcjob("cluster", "remove", "a.b").returncode == 0
    assert set(load_profiles()) == {"A-1_z"}
    # A hand-made mistake in one profile: cluster add and remove still mend the file.
    config_file.write_text(config_file.read_text() + '\n[clusters.bad]\nurl = "https://h"\nuser = "u"\n'
                           'insecure = "no"\n')  # fmt: skip
    assert "insecure" in one_line_error(hpcjob("cluster", "list"))
    assert hpcjob("cluster", "remove", "bad").returncode == 0
    assert set(load_profiles()) == {"A-1_z"}


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://alice:hunter2@head", "url must not hold a user or password (user@host)"),
        ("https://hunter2@head/hpc", "url must not hold a user or password (user@host)"),
        ("http://alice:hunter2@head", "url must not hold a user or password (user@host)"),
        ("https://head/hpc?token=hunter2", "url must not have a ?query or #fragment"),
        ("https://head/hpc#hunter2", "url must not have a ?query or #fragment"),
        ("https://head /hunter2", "url must not contain spaces or control characters"),
    ],
)
def test_a_url_with_credentials_is_refused_without_echoing_them(
    config_file: Path, url: str, error: str
) -> None:
    result = hpcjob("cluster", "add", "p", "--url", url, "--user", "alice")
    assert one_line_error(result).startswith(f"cluster p: {error}")
    assert "hunter2" not in result.stdout + result.stderr
    assert not config_file.exists()
    config_file.write_text(f'[clusters.p]\nurl = "{url}"\nuser = "alice"\n')
    listed = hpcjob("cluster", "list")
    assert one_line_error(listed).startswith(f"{config_file}: cluster p: {error}")
    assert "hunter2" not in listed.stdout + listed.stderr


def test_cluster_add_checks_what_it_is_given(tmp_path: Path, config_file: Path) -> None:
    def add(*args: str) -> str:
        return one_line_error(hpcjob("cluster", "add", "p", "--url", "https://h", "--user", "u", *args))

    assert add("--password-env", "").startswith("cluster p: password must be")
    assert add("--password-env", "hunter2!").startswith("cluster p: password must be")
    assert add("--smb-port", "70000") == "cluster p: smb_port 70000 must be between 1 and 65535"
    assert "'--smb-port'" in add("--smb-port", "x")
    assert add("--ca-bundle", str(tmp_path / "none.pem")).startswith("cluster p: ca_bundle ")
    ca, _ = make_certificate(str(tmp_path))
    assert add("--ca-bundle", ca, "--insecure").startswith("cluster p: ca_bundle and insecure = true")
    assert add("--node-group", "a;b").startswith("cluster p: node_group 'a;b'")
    assert not config_file.exists()


def test_the_file_is_replaced_at_once_and_private(
    tmp_path: Path, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hpcjob("cluster", "add", "a", "--url", "https://a", "--user", "u").returncode == 0
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    before = config_file.read_bytes()

    def crash(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(HpcjobError, match=r"cannot write it: No space left on device$"):
        save_profile(ClusterProfile(name="b", url="https://b", user="u"))
    assert config_file.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["clusters.toml"]  # no temporary file left
    monkeypatch.undo()
    # A symbolic link (kept dotfiles) stays a link to the file it names.
    link = tmp_path / "link.toml"
    link.symlink_to(config_file)
    monkeypatch.setenv("HPCJOB_CONFIG", str(link))
    save_profile(ClusterProfile(name="b", url="https://b", user="u"))
    assert link.is_symlink() and set(load_profiles()) == {"a", "b"}


def test_secret_variables_name_every_password_variable_and_never_raise(config_file: Path) -> None:
    from hpcjob.emulator.headnode import PASSWORD_ENV
    from hpcjob.store.credentials import SMB_PASSWORD_ENV

    fixed = {
        SMB_PASSWORD_ENV, PASSWORD_ENV, config.ADMIN_PASSWORD_ENV, config.AUTH_KEY_ENV,
        config.CREDENTIAL_PASSWORD_ENV, config.DOCUMENTED_PASSWORD_ENV,
    }  # fmt: skip
    assert fixed == {
        "HPCJOB_PASSWORD",
        "HPCJOB_SMB_PASSWORD",
        "HPCJOB_EMULATOR_PASSWORD",
        "HPCJOB_ADMIN_PASSWORD",
        "HPCJOB_AUTH_KEY",
        "HPCJOB_CREDENTIAL_PASSWORD",
    }
    assert secret_variables() == fixed  # no file
    config_file.write_text(
        '[clusters.a]\nurl = "https://a"\nuser = "u"\npassword = "env:A_PW"\n'
        '[clusters.b]\nurl = "https://b"\nuser = "u"\npassword = "keyring"\n'
        # broken in another key: its variable is still a secret
        '[clusters.c]\nurl = 5\nuser = "u"\npassword = "env:C_PW"\n'
        "[clusters.d]\npassword = 3\n"
    )
    assert secret_variables() == fixed | {"A_PW", "C_PW"}
    for broken in (b"[clusters.a\n", b'clusters = "x"\n', b"\xff\xfe", b"[clusters]\na = 1\n"):
        config_file.write_bytes(broken)
        assert secret_variables() == fixed
    config_file.unlink()
    config_file.mkdir()  # a folder where the file should be
    assert secret_variables() == fixed


def test_profiles_are_checked_once_for_the_file_and_the_cli() -> None:
    # The same class checks both: a profile made in Python obeys the file's rules.
    with pytest.raises(SpecError, match=r"^cluster x: insecure must be true or false"):
        ClusterProfile(name="x", url="https://h", user="u", insecure="no")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^cluster x: unknown key\(s\) name"):
        ClusterProfile.from_table("x", {"url": "https://h", "user": "u", "name": "y"})
    assert config.EMULATOR_PASSWORD_ENV == "HPCJOB_EMULATOR_PASSWORD"


@pytest.mark.parametrize("backend", ["rest", "winrm"])
@pytest.mark.parametrize("fingerprint", ["AB" * 20, ":".join(["ab"] * 32)])
def test_either_backend_pins_a_sha1_thumbprint_or_a_sha256_fingerprint(
    config_file: Path, backend: str, fingerprint: str
) -> None:
    config_file.write_text(
        f'[clusters.p]\nurl = "https://h"\nuser = "u"\nbackend = "{backend}"\n'
        f'cert_fingerprint = "{fingerprint}"\n'
    )
    assert get_profile("p").cert_fingerprint == fingerprint


def test_a_profile_s_rendezvous_port_is_its_jobs_unless_the_job_names_one(
    cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    hpcjob = cli_with_profile("pw", url="https://head", user="alice", rdzv_port=29555)
    script = empty_script(tmp_path)
    shown = hpcjob("submit", "--dry-run", "--node", "N1", "--node", "N2", str(script))
    assert shown.code == 0 and "--rdzv_endpoint=N1:29555 " in shown.out, shown.err
    given = hpcjob("submit", "--dry-run", "--node", "N1", "--rdzv-port", "29600", str(script))
    assert given.code == 0 and "--rdzv_endpoint=N1:29600 " in given.out, given.err


def test_a_profile_s_poll_interval_is_a_number_of_seconds_whole_or_not(config_file: Path) -> None:
    config_file.write_text('[clusters.p]\nurl = "https://head"\nuser = "alice"\npoll_interval = 5\n')
    assert get_profile("p").poll_interval == 5.0 and type(get_profile("p").poll_interval) is float
    added = hpcjob(
        "cluster", "add", "q", "--url", "https://head", "--user", "alice", "--poll-interval", "0.5"
    )
    assert added.returncode == 0, added.stderr
    assert get_profile("q").poll_interval == 0.5 and get_profile("p").poll_interval == 5.0
