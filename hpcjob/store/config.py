"""Cluster profiles: where a cluster is and how to reach it, in a TOML file. Never a password.

`$XDG_CONFIG_HOME/hpcjob/clusters.toml` (default ~/.config/hpcjob/clusters.toml), or the file named
by HPCJOB_CONFIG:

    default = "prod"

    [clusters.prod]
    url = "https://headnode.contoso.com/hpc"
    user = "CONTOSO\\alice"
    password = "env:HPCJOB_PASSWORD"     # or "keyring", or "prompt" (the default)
    ca_bundle = "/etc/ssl/contoso-ca.pem" # TLS verification is on unless insecure = true
    share = "//HEADNODE/CcpSpoolDir/app"
    node_group = "GPUNodes"
    poll_interval = 15                    # the longest wait between looks at a job's state, seconds

The whole file is checked whenever it is read: every key's TOML type and value, with one-line errors
that name the file, the cluster and the key. A profile is checked by `ClusterProfile` itself, so a
hand-edited file and `hpcjob cluster add` obey the same rules. The file is written with tomli-w,
atomically and readable by its owner only.

The password itself comes from the named environment variable, the system keyring (service
"hpcjob", key "<profile>:<user>") when the `keyring` package is installed, or a prompt.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import re
import sys
import tempfile
import tomllib
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hpcjob.extras import missing_extra
from hpcjob.job.prices import check_region
from hpcjob.job.spec import (
    CLUSTER_BACKENDS,
    DEFAULT_DOCKER_GPUS,
    DEFAULT_ENV_ON,
    DEFAULT_NODE_ENV_DIR,
    GROUP_NAME,
    PLAIN_PATH,
    WINRM_TRANSPORTS,
    HpcjobError,
    SpecError,
    check_docker,
    check_env_place,
    check_secret_names,
    check_vm_size,
    parse_share,
)
from hpcjob.store.credentials import ADMIN_PASSWORD_ENV, AUTH_KEY_ENV, SMB_PASSWORD_ENV
from hpcjob.store.folders import user_folder

KEYRING_SERVICE = "hpcjob"
CLUSTER_ENV = "HPCJOB_CLUSTER"
# hpcjob.emulator.headnode.PASSWORD_ENV, named here so that reading profiles never imports the emulator.
EMULATOR_PASSWORD_ENV = "HPCJOB_EMULATOR_PASSWORD"
# A caller's own credential for one command (the PowerShell module's -Credential): it wins over the
# profile's user and password source, and reaches hpcjob through its environment, never its argv.
CREDENTIAL_USER_ENV = "HPCJOB_CREDENTIAL_USER"
CREDENTIAL_PASSWORD_ENV = "HPCJOB_CREDENTIAL_PASSWORD"
# The profile's password variable as this module's docs and docs/options.md name it: kept out of local tasks
# whether or not a profile names it.
DOCUMENTED_PASSWORD_ENV = "HPCJOB_PASSWORD"

# Profile names are TOML keys, keyring keys and command-line arguments: plain, and never an option.
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A host name or an IPv4/IPv6 address, as smbprotocol takes it.
_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9.:-]{0,252}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TOP_LEVEL_KEYS = ("clusters", "default")
# A certificate's SHA-256 fingerprint, or its SHA-1 thumbprint as Windows and Azure Key Vault give it.
_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{64}|[0-9A-Fa-f]{40}")
_RESOURCE_GROUP = re.compile(r"[-\w.()]{1,90}")
WINRM_PORT = 5986
# poll_interval's bounds: a look every 0.1 s at most (an emulated head node on this machine), and at least
# one every 5 minutes.
MIN_POLL_S = 0.1
MAX_POLL_S = 300.0


class NoCluster(SpecError):
    """No profile is configured at all: not a broken one, which says what is wrong with it instead."""


class GoneFile(SpecError):
    """A file or folder of this machine that a profile names is gone: `key` (ca_bundle, local_share) names
    `path`. A stopped emulator's CA file, its temporary folder removed, is one."""

    def __init__(self, message: str, key: str, path: str) -> None:
        super().__init__(message)
        self.key = key
        self.path = path


@dataclass(frozen=True)
class ClusterProfile:
    """One cluster. Every field is checked here, whether it comes from the file or from the CLI."""

    name: str
    url: str
    user: str
    password: str = "prompt"
    ca_bundle: str | None = None
    insecure: bool = False
    share: str | None = None
    smb_user: str | None = None
    smb_server: str | None = None
    smb_port: int = 445
    mount_point: str | None = None
    node_group: str | None = None
    # The node group of the CPU data nodes that feed the trainers (`--data-nodes`; issue 34), and their
    # Azure size: the price their part of a run is counted at.
    data_node_group: str | None = None
    data_vm_size: str | None = None
    # The share as mounted on this machine (a drive, a CIFS mount): uploads and logs use it, not SMB.
    local_share: str | None = None
    # How hpcjob reaches the head node: "rest" (the HPC Pack REST API at url) or "winrm" (PowerShell
    # on the head node over WS-Management at winrm_url, default https://<url's host>:5986/wsman).
    backend: str = "rest"
    winrm_url: str | None = None
    winrm_transport: str | None = None  # default ntlm
    # The SHA-256 fingerprint of the head node's certificate (hex, colons allowed): trusted instead of a
    # CA, for the self-signed certificates WinRM listeners often have.
    cert_fingerprint: str | None = None
    # The GPUs of each node (their size's, as onboarding writes it): jobs default to one process each.
    gpus_per_node: int | None = None
    # The Azure resource group `hpcjob cluster onboard` made for this cluster (`cluster delete` removes it).
    resource_group: str | None = None
    # Where jobs keep their environment (`--env-on`: node-local or share), and the nodes' own folder for
    # it (default ~/.cache/hpcjob/envs): checked as the job options are.
    env_on: str | None = None
    node_env_dir: str | None = None
    # How `--image` containers get the GPUs (gpus-all, or nvidia-docker on older nodes), and more
    # `docker run` options for this cluster's nodes (the InfiniBand devices, for one).
    docker_gpus: str | None = None
    docker_options: str | None = None
    # The port the jobs' rendezvous listens on, on their first node (default 29400), for nodes whose
    # firewall opens another.
    rdzv_port: int | None = None
    # The cluster's nodes are all this machine (an emulated head node: `hpcjob emulator`): a job that names
    # no rendezvous port (--rdzv-port, rdzv_port) gets a free one at submission, as `run --local` does, so
    # that two jobs here do not both take 29400 (hpcjob.runner.with_profile).
    nodes_here: bool | None = None
    # The nodes' Azure VM size (onboarding writes it): jobs get the NCCL settings of its HPC image, and
    # with `region` (the Azure region, such as eastus) a run's cost is counted at its price; `spot`: the
    # compute nodes are Spot VMs, counted at the Spot price.
    vm_size: str | None = None
    region: str | None = None
    spot: bool | None = None
    # The longest wait, in seconds, between two looks at a job's state while it does not change
    # (default 15; the first look after a change comes within a second): lower it to hear of a job's end
    # sooner from a small head node, raise it to ask a busy one less.
    poll_interval: float | None = None
    # How many more attempts a run submitted here gets when one ends for a cause outside the program
    # (`submit --retries`, when not given; default 0).
    retries: int | None = None
    # Environment variables of this machine whose values every job of the cluster gets as `--secret`
    # (names only, never a value: hpcjob reads each from the environment at submission).
    secrets: tuple[str, ...] | None = None
    # Datasets every job of the cluster copies onto its nodes (`--dataset`, when a job gives none), and
    # the nodes' own local folder they are copied into (HPCJOB_LOCAL_DIR; default: by the VM size), and
    # what a user's cache of them on a node keeps at most, in GB (default: all the disk holds).
    datasets: tuple[str, ...] | None = None
    local_dir: str | None = None
    dataset_cache_gb: int | None = None
    # The user-assigned managed identity (its resource ID) onboarding gave the nodes, and `cluster grow`
    # gives the new ones: the nodes read Blob datasets with it where a job hands them no credential.
    identity: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        for key, (kind, optional) in _field_kinds().items():
            value = getattr(self, key)
            # Exact types: a bool is an int to Python, and insecure = "no" would be true.
            if not (value is None and optional) and type(value) is not kind:
                raise SpecError(
                    f"cluster {self.name}: {key} must be {_WANTED[kind]}, not {_toml_kind(value)}"
                )
        self._check_values(f"cluster {self.name}")

    @classmethod
    def from_table(cls, name: str, table: object) -> ClusterProfile:
        """The profile of a `[clusters.NAME]` table as the TOML file holds it."""
        _check_name(name)
        if not isinstance(table, dict):
            raise SpecError(f"cluster {name} must be a table ([clusters.{name}]), not {_toml_kind(table)}")
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(table) - known
        if unknown:
            raise SpecError(
                f"cluster {name}: unknown key(s) {', '.join(sorted(map(_show, unknown)))}; "
                f"known: {', '.join(sorted(known))}"
            )
        missing = [key for key in ("url", "user") if key not in table]
        if missing:
            raise SpecError(f"cluster {name}: {' and '.join(missing)} missing")
        # A whole number is a number of seconds too: TOML reads `poll_interval = 5` as an integer.
        kinds = _field_kinds()
        values: dict[str, Any] = {
            key: float(value) if kinds[key][0] is float and type(value) is int else value
            for key, value in table.items()
        }
        for key, value in values.items():  # a TOML array is a list; the profile holds a tuple
            if kinds[key][0] is tuple and type(value) is list:
                values[key] = tuple(value)
        return cls(name=name, **values)

    def _check_values(self, where: str) -> None:
        _check_url(where, self.url)
        _check_user(where, "user", self.user)
        variable = self.password.removeprefix("env:") if self.password.startswith("env:") else None
        if self.password not in ("prompt", "keyring") and not (variable and _ENV_NAME.fullmatch(variable)):
            raise SpecError(
                f"{where}: password must be 'prompt', 'keyring' or 'env:VARIABLE' (a variable name), "
                "never the password itself"
            )
        if self.ca_bundle is not None:
            if self.insecure:
                raise SpecError(f"{where}: ca_bundle and insecure = true contradict each other; choose one")
            _check_ca_bundle(where, self.ca_bundle)
        if self.share is not None:
            try:
                parse_share(self.share)
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
        if self.smb_user is not None:
            _check_user(where, "smb_user", self.smb_user)
        if self.backend not in CLUSTER_BACKENDS:
            raise SpecError(
                f"{where}: backend must be one of {', '.join(CLUSTER_BACKENDS)}, not {self.backend!r}"
            )
        if self.winrm_url is not None:
            _check_url(where, self.winrm_url, "winrm_url")
        if self.winrm_transport is not None and self.winrm_transport not in WINRM_TRANSPORTS:
            raise SpecError(
                f"{where}: winrm_transport must be one of {', '.join(WINRM_TRANSPORTS)}, not "
                f"{self.winrm_transport!r}"
            )
        if self.cert_fingerprint is not None:
            if not _FINGERPRINT.fullmatch(self.cert_fingerprint.replace(":", "")):
                raise SpecError(
                    f"{where}: cert_fingerprint must be a certificate's SHA-256 fingerprint (64 hex digits) "
                    "or SHA-1 thumbprint (40)"
                )
            if self.insecure or self.ca_bundle:
                raise SpecError(f"{where}: cert_fingerprint replaces ca_bundle and insecure: give only one")
        if self.gpus_per_node is not None and not 1 <= self.gpus_per_node <= 64:
            raise SpecError(f"{where}: gpus_per_node {self.gpus_per_node} must be between 1 and 64")
        if self.resource_group is not None and not _RESOURCE_GROUP.fullmatch(self.resource_group):
            raise SpecError(
                f"{where}: resource_group {self.resource_group!r} is not an Azure resource group name"
            )
        if self.smb_server is not None and not _HOST.fullmatch(self.smb_server):
            raise SpecError(f"{where}: smb_server {self.smb_server!r} must be a host name or an address")
        for key in ("smb_port", "rdzv_port"):
            port = getattr(self, key)
            if port is not None and not 1 <= port <= 65535:
                raise SpecError(f"{where}: {key} {port} must be between 1 and 65535")
        if self.poll_interval is not None and not MIN_POLL_S <= self.poll_interval <= MAX_POLL_S:
            raise SpecError(
                f"{where}: poll_interval {self.poll_interval:g} must be between {MIN_POLL_S:g} and "
                f"{MAX_POLL_S:g} seconds"
            )
        from hpcjob.job.spec import MAX_RETRIES

        if self.retries is not None and not 0 <= self.retries <= MAX_RETRIES:
            raise SpecError(f"{where}: retries {self.retries} must be between 0 and {MAX_RETRIES}")
        from hpcjob.job.datasets import parse_datasets

        _check_strings(where, "secrets", self.secrets, "variable names", check_secret_names)
        _check_strings(where, "datasets", self.datasets, "sources", parse_datasets)
        if self.local_dir is not None and not PLAIN_PATH.fullmatch(self.local_dir):
            raise SpecError(f"{where}: local_dir {self.local_dir!r} must be an absolute path on the nodes")
        # The same rules as the job options', so that a profile never makes a job that fails later.
        if self.mount_point is not None and not PLAIN_PATH.fullmatch(self.mount_point):
            raise SpecError(
                f"{where}: mount_point {self.mount_point!r} must be an absolute path on the nodes, of "
                "letters, digits and . _ - /"
            )
        if self.local_share is not None and not (
            os.path.isabs(self.local_share) and os.path.isdir(self.local_share)
        ):
            message = f"{where}: local_share {self.local_share!r} must be an existing folder's absolute path"
            if os.path.isabs(self.local_share) and not os.path.lexists(self.local_share):
                raise GoneFile(message, "local_share", self.local_share)
            raise SpecError(message)
        for key, group in (("node_group", self.node_group), ("data_node_group", self.data_node_group)):
            if group is not None and not GROUP_NAME.fullmatch(group):
                raise SpecError(
                    f"{where}: {key} {group!r} must be a node group name (letters, digits, space and "
                    ". _ -, at most 64)"
                )
        try:
            check_env_place(
                DEFAULT_ENV_ON if self.env_on is None else self.env_on,
                DEFAULT_NODE_ENV_DIR if self.node_env_dir is None else self.node_env_dir,
            )
            check_docker(
                None,
                DEFAULT_DOCKER_GPUS if self.docker_gpus is None else self.docker_gpus,
                self.docker_options or "",
            )
            check_vm_size(self.vm_size)
            check_vm_size(self.data_vm_size)
            if self.region is not None:
                check_region(self.region, "region")
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None

    @property
    def api_base(self) -> str:
        """The REST API root: the URL with /hpc, as HPC Pack 2016 Update 1 and later serve it."""
        url = self.url.rstrip("/")
        return url if url.endswith("/hpc") else f"{url}/hpc"

    @property
    def wsman_url(self) -> str:
        """The head node's WinRM endpoint: winrm_url, else HTTPS on 5986 of the url's host."""
        if self.winrm_url:
            return self.winrm_url
        host = urlsplit(self.url).hostname or ""
        return f"https://{f'[{host}]' if ':' in host else host}:{WINRM_PORT}/wsman"

    @property
    def endpoint(self) -> str:
        """Where the profile's backend reaches the head node."""
        return self.wsman_url if self.backend == "winrm" else self.api_base

    @property
    def verify(self) -> bool | str:
        """What requests' `verify=` takes: False, a CA bundle, or True for the system's CAs."""
        if self.insecure:
            return False
        return self.ca_bundle or True


_WANTED: dict[type, str] = {
    str: "a string",
    bool: "true or false (unquoted)",
    int: "an integer",
    float: "a number of seconds",
    tuple: "an array of names",
}


@functools.cache
def _field_kinds() -> dict[str, tuple[type, bool]]:
    """Each field's type and whether it may be absent, read from the annotations: declared once."""
    kinds: dict[str, tuple[type, bool]] = {}
    for key, hint in typing.get_type_hints(ClusterProfile).items():
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        kind, optional = (args[0], True) if args else (hint, False)
        kinds[key] = (typing.get_origin(kind) or kind, optional)  # tuple[str, ...]: a tuple
    return kinds


def _toml_kind(value: object) -> str:
    """What a value read from TOML is, in TOML's words."""
    if value is None:
        return "missing"
    for kind, words in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string")):
        if isinstance(value, kind):
            return words
    if isinstance(value, list):
        return "an array"
    return "a table" if isinstance(value, dict) else "a date or time"


def _show(text: str) -> str:
    """A name from the file as it is, or quoted when it holds what would break the line."""
    return text if text.isprintable() else repr(text)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not _PROFILE_NAME.fullmatch(name):
        raise SpecError(
            f"cluster name {name!r} must be letters, digits and . _ -, starting with a letter or digit, "
            "at most 64"
        )


def _check_url(where: str, url: str, key: str = "url") -> None:
    # Never echo the URL: it may carry a password.
    if _CONTROL.search(url) or " " in url:
        raise SpecError(f"{where}: {key} must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        _ = parts.port  # urlsplit checks the port only when asked for it
    except ValueError:
        raise SpecError(f"{where}: {key} is not a valid URL: give https://HEADNODE[:PORT][/PATH]") from None
    if "@" in parts.netloc:
        raise SpecError(
            f"{where}: {key} must not hold a user or password (user@host): give the user with --user and "
            "the password with --password-env or --keyring"
        )
    if parts.scheme.lower() != "https":
        raise SpecError(f"{where}: {key} must start with https:// (the password travels in it: TLS only)")
    if not parts.hostname:
        raise SpecError(f"{where}: {key} names no host: give https://HEADNODE[:PORT][/PATH]")
    if "?" in url or "#" in url:
        raise SpecError(f"{where}: url must not have a ?query or #fragment: give https://HEADNODE[/hpc]")


def _check_user(where: str, key: str, user: str) -> None:
    # Not echoed: a user field is where a careless hand puts "alice:password".
    if not user.strip() or _CONTROL.search(user) or ":" in user:
        raise SpecError(
            f"{where}: {key} must be a user name such as CONTOSO\\alice, not empty, without ':' or "
            "control characters"
        )


def _check_ca_bundle(where: str, path: str) -> None:
    if not os.path.isabs(path):
        raise SpecError(f"{where}: ca_bundle {path!r} must be an absolute path")
    if not os.path.isfile(path):
        message = f"{where}: ca_bundle {path!r}: no such file"
        raise GoneFile(message, "ca_bundle", path) if not os.path.lexists(path) else SpecError(message)
    import ssl  # here: reading the history reads no profile, and starts without it

    # A bundle that holds no certificate would fail every request, after the read retries.
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        raise SpecError(f"{where}: ca_bundle {path!r} holds no PEM certificate ({exc.reason})") from None
    except OSError as exc:
        raise SpecError(f"{where}: ca_bundle {path!r}: {exc.strerror}") from None


def _check_strings(
    where: str, key: str, values: tuple[str, ...] | None, what: str, check: Callable[[Any], object]
) -> None:
    """A profile's array of strings (None: not given), each read as a job option reads them."""
    if values is None:
        return
    if not all(type(value) is str for value in values):
        raise SpecError(f"{where}: {key} must be an array of {what} (strings)")
    try:
        check(values)
    except SpecError as exc:
        raise SpecError(f"{where}: {key}: {exc}") from None


def config_path() -> Path:
    if os.environ.get("HPCJOB_CONFIG"):
        return Path(os.environ["HPCJOB_CONFIG"])
    return user_folder("config") / "clusters.toml"


def _read(path: Path) -> dict[str, Any]:
    """The file's TOML, its top level checked, profiles not yet; {} when there is no file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SpecError(f"{path}: cannot read it: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # -sig: Notepad's byte order mark
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(f"{path}: not UTF-8 text (line {line}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: {exc}") from None
    unknown = set(data) - set(_TOP_LEVEL_KEYS)
    if unknown:
        raise SpecError(
            f"{path}: unknown key(s) {', '.join(sorted(map(_show, unknown)))}; known: "
            f"{', '.join(_TOP_LEVEL_KEYS)}, and the keys of each [clusters.NAME] table"
        )
    if not isinstance(data.get("clusters", {}), dict):
        raise SpecError(
            f"{path}: clusters must be [clusters.NAME] tables, not {_toml_kind(data['clusters'])}"
        )
    if not isinstance(data.get("default", ""), str):
        raise SpecError(
            f"{path}: default must be a string, the name of a cluster, not {_toml_kind(data['default'])}"
        )
    return data


def load_config() -> tuple[dict[str, ClusterProfile], str | None]:
    """Every profile, checked, and the name of the one used without --cluster (None: no choice)."""
    profiles, _, chosen = _load_config(keep_gone=False)
    return profiles, chosen


def listed_config() -> tuple[dict[str, ClusterProfile], dict[str, dict[str, str]], str | None]:
    """load_config for `hpcjob cluster list`: a profile that names a file or folder of this machine that is
    gone (a stopped emulator's CA file) is there without it, and what is gone, {name: {key: path}}, comes
    with the profiles, so that the list shows it instead of failing; any other mistake is an error still."""
    return _load_config(keep_gone=True)


def _load_config(keep_gone: bool) -> tuple[dict[str, ClusterProfile], dict[str, dict[str, str]], str | None]:
    path = config_path()
    data = _read(path)
    profiles = {}
    gone: dict[str, dict[str, str]] = {}
    for name, table in data.get("clusters", {}).items():
        missing: dict[str, str] = {}
        while name not in profiles:  # each gone file found is left out: two at most
            try:
                kept = {k: v for k, v in table.items() if k not in missing} if missing else table
                profiles[name] = ClusterProfile.from_table(name, kept)
            except GoneFile as exc:
                if not keep_gone:
                    raise SpecError(f"{path}: {exc}") from None
                missing[exc.key] = exc.path
            except SpecError as exc:
                raise SpecError(f"{path}: {exc}") from None
        if missing:
            gone[name] = missing
    default = data.get("default")
    if default is not None and default not in profiles:
        raise SpecError(
            f"{path}: default {default!r} names no cluster; configured: "
            f"{', '.join(sorted(profiles)) or 'none'}"
        )
    chosen = os.environ.get(CLUSTER_ENV) or default
    if chosen is None and len(profiles) == 1:
        chosen = next(iter(profiles))
    return profiles, gone, chosen


def load_profiles() -> dict[str, ClusterProfile]:
    return load_config()[0]


def get_profile(name: str | None) -> ClusterProfile:
    """The named profile, else $HPCJOB_CLUSTER, else the file's default, else the only one. Another
    profile's file that is gone (a stopped emulator's CA file) is no reason to refuse this one."""
    profiles, gone, default = _load_config(keep_gone=True)
    chosen = name or default
    if chosen is None:
        if not profiles:
            raise NoCluster(
                "no cluster configured: add one with `hpcjob cluster add NAME --url https://HEAD ...`"
            )
        raise SpecError(
            f"several clusters configured ({', '.join(sorted(profiles))}): choose one with --cluster"
        )
    if chosen not in profiles:
        raise SpecError(
            f"no cluster {chosen!r} in {config_path()}; configured: {', '.join(sorted(profiles)) or 'none'}"
        )
    for key, path in gone.get(chosen, {}).items():
        raise SpecError(f"{config_path()}: cluster {chosen}: {key} {path!r}: no such file")
    return profiles[chosen]


def save_profile(profile: ClusterProfile, make_default: bool = False) -> Path:
    """Add or replace one profile. The others are kept as they are, so that a broken one can be fixed.
    It becomes the default where `make_default` asks, or where there is none yet: the only profile of a
    file without `default` is its default (load_config), and stays so."""
    path = config_path()
    data = _read(path)
    clusters = data.get("clusters", {})
    others = [name for name in clusters if name != profile.name]
    clusters[profile.name] = {k: v for k, v in asdict(profile).items() if k != "name" and v is not None}
    if make_default:
        default = profile.name
    elif "default" in data:
        default = data["default"]
    else:  # the one other profile was the default without being named: name it, so that it stays
        default = others[0] if len(others) == 1 else profile.name
    _write(path, {"default": default, "clusters": clusters})
    return path


def remove_profile(name: str) -> None:
    path = config_path()
    data = _read(path)
    clusters = data.get("clusters", {})
    if name not in clusters:
        raise SpecError(f"no cluster {name!r} in {path}")
    del clusters[name]
    kept = {"default": data["default"]} if data.get("default", name) != name else {}
    _write(path, {**kept, "clusters": clusters})


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace the file in one step: a crash leaves the old file or the new one, never half of one."""
    import tomli_w  # writing alone needs it: reading profiles (every command) is tomllib's

    text = tomli_w.dumps(data)
    target = Path(os.path.realpath(path))  # through a symlink (kept dotfiles) to the file it names
    temp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, 0o600)  # it names users and hosts: the owner's only
        os.replace(temp, target)
    except OSError as exc:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise HpcjobError(f"{path}: cannot write it: {exc.strerror or exc}") from None


def secret_variables() -> frozenset[str]:
    """The environment variables that hold passwords hpcjob knows of, to keep out of the tasks.

    Never raises: with a broken or missing file, only the fixed names. A profile that fails its checks
    still names its variable.
    """
    names = {
        SMB_PASSWORD_ENV,
        EMULATOR_PASSWORD_ENV,
        ADMIN_PASSWORD_ENV,
        AUTH_KEY_ENV,
        CREDENTIAL_PASSWORD_ENV,
        DOCUMENTED_PASSWORD_ENV,
    }
    with contextlib.suppress(Exception):  # scrubbing goes on whatever the file holds
        for table in _read(config_path()).get("clusters", {}).values():
            source = table.get("password") if isinstance(table, dict) else None
            if isinstance(source, str) and source.startswith("env:") and len(source) > 4:
                names.add(source[4:])
    return frozenset(names)


def with_caller_user(profile: ClusterProfile) -> ClusterProfile:
    """The profile with the caller's user (CREDENTIAL_USER_ENV) in place of its own, when one is given."""
    user = os.environ.get(CREDENTIAL_USER_ENV)
    return replace(profile, user=user) if user else profile


def password_for(profile: ClusterProfile) -> str:
    """The head node's password: the caller's (CREDENTIAL_PASSWORD_ENV), else from where the profile
    says; never stored by hpcjob."""
    if CREDENTIAL_PASSWORD_ENV in os.environ:
        return os.environ[CREDENTIAL_PASSWORD_ENV]
    source = profile.password
    if source.startswith("env:"):
        variable = source[4:]
        if variable not in os.environ:
            raise SpecError(f"cluster {profile.name}: the password variable {variable} is not set")
        return os.environ[variable]
    if source == "keyring":
        try:
            import keyring
        except ImportError:
            raise missing_extra("keyring", f"cluster {profile.name}: password = 'keyring'") from None
        stored = keyring.get_password(KEYRING_SERVICE, f"{profile.name}:{profile.user}")
        if stored is None:
            raise SpecError(f"cluster {profile.name}: no password for {profile.user} in the keyring")
        return str(stored)
    if not sys.stdin.isatty():
        raise SpecError(
            f"cluster {profile.name}: no terminal to ask for the password; "
            "use password = 'env:VARIABLE' or 'keyring'"
        )
    return getpass.getpass(f"Password for {profile.user} on {profile.name}: ")
