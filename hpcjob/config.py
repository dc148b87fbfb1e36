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

The password itself comes from the named environment variable, the system keyring (service
"hpcjob", key "<profile>:<user>") when the `keyring` package is installed, or a prompt.
"""

from __future__ import annotations

import getpass
import os
import sys
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hpcjob.spec import SpecError, parse_share

KEYRING_SERVICE = "hpcjob"
CLUSTER_ENV = "HPCJOB_CLUSTER"


@dataclass(frozen=True)
class ClusterProfile:
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

    def __post_init__(self) -> None:
        if not self.url.startswith("https://"):
            raise SpecError(
                f"cluster {self.name}: url {self.url!r} must start with https:// (the API needs TLS)"
            )
        if not (self.password in ("prompt", "keyring") or self.password.startswith("env:")):
            raise SpecError(
                f"cluster {self.name}: password must be 'prompt', 'keyring' or 'env:VARIABLE', "
                "never the password itself"
            )
        if self.share:
            parse_share(self.share)

    @property
    def api_base(self) -> str:
        """The REST API root: the URL with /hpc, as HPC Pack 2016 Update 1 and later serve it."""
        url = self.url.rstrip("/")
        return url if url.endswith("/hpc") else f"{url}/hpc"

    @property
    def verify(self) -> bool | str:
        """What requests' `verify=` takes: False, a CA bundle, or True for the system's CAs."""
        if self.insecure:
            return False
        return self.ca_bundle or True


def config_path() -> Path:
    if os.environ.get("HPCJOB_CONFIG"):
        return Path(os.environ["HPCJOB_CONFIG"])
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "hpcjob" / "clusters.toml"


def _load() -> dict[str, Any]:
    path = config_path()
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: {exc}") from None


def load_profiles() -> dict[str, ClusterProfile]:
    known = {f.name for f in fields(ClusterProfile)}
    profiles = {}
    for name, table in _load().get("clusters", {}).items():
        unknown = set(table) - known
        if unknown:
            raise SpecError(
                f"{config_path()}: cluster {name}: unknown key(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(known - {'name'}))}"
            )
        try:
            profiles[name] = ClusterProfile(name=name, **table)
        except TypeError as exc:
            raise SpecError(f"{config_path()}: cluster {name}: {exc}") from None
    return profiles


def get_profile(name: str | None) -> ClusterProfile:
    """The named profile, else $HPCJOB_CLUSTER, else the file's default, else the only one."""
    profiles = load_profiles()
    chosen = name or os.environ.get(CLUSTER_ENV) or _load().get("default")
    if chosen is None and len(profiles) == 1:
        chosen = next(iter(profiles))
    if chosen is None:
        if not profiles:
            raise SpecError(
                "no cluster configured: add one with `hpcjob cluster add NAME --url https://HEAD ...`"
            )
        raise SpecError(
            f"several clusters configured ({', '.join(sorted(profiles))}): choose one with --cluster"
        )
    if chosen not in profiles:
        raise SpecError(
            f"no cluster {chosen!r} in {config_path()}; configured: {', '.join(sorted(profiles)) or 'none'}"
        )
    return profiles[chosen]


def save_profile(profile: ClusterProfile, make_default: bool = False) -> Path:
    data = _load()
    clusters = data.setdefault("clusters", {})
    table = {k: v for k, v in asdict(profile).items() if k != "name" and v is not None}
    clusters[profile.name] = table
    if make_default or "default" not in data:
        data["default"] = profile.name
    _write(data)
    return config_path()


def remove_profile(name: str) -> None:
    data = _load()
    if name not in data.get("clusters", {}):
        raise SpecError(f"no cluster {name!r} in {config_path()}")
    del data["clusters"][name]
    if data.get("default") == name:
        del data["default"]
    _write(data)


def _write(data: dict[str, Any]) -> None:
    lines = []
    if "default" in data:
        lines.append(f"default = {_toml_value(data['default'])}")
    for name, table in data.get("clusters", {}).items():
        lines.append(f"\n[clusters.{_toml_key(name)}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).lstrip("\n") + "\n", encoding="utf-8")


def _toml_key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else _toml_value(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def password_for(profile: ClusterProfile) -> str:
    """The REST password, from where the profile says; never stored by hpcjob."""
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
            raise SpecError(
                f"cluster {profile.name}: password = 'keyring' needs the keyring package"
            ) from None
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
