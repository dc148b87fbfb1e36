"""Datasets copied onto each node's own disk before the job's program starts (`--dataset`; issue 41). Pure.

`--dataset SOURCE[:ROLE]` names a source: an Azure Blob container or prefix by its URL, in the account's
own host name (`https://ACCOUNT.blob.core.windows.net/CONTAINER[/PREFIX]`) or path-style
(`http://HOST:PORT/ACCOUNT/CONTAINER[/PREFIX]`, as Azurite and Azure Stack serve it), or a folder on the
job's share, relative to the share's root (`datasets/imagenet`). ROLE says which tasks copy it: the
trainers (the default), the data nodes (`data`) or both (`all`). Each task copies what its role needs
into its node's local folder (HPCJOB_LOCAL_DIR) with the node helper `.hpcjob/datasets.py`
(hpcjob.node.datasets) and finds it in HPCJOB_DATASETS, one subfolder per source named by its last path
component. The job names all of it in one variable, `SOURCES_VAR` (a JSON object), whatever the number
of sources or files: nothing else grows a task's environment (HPC Pack's 2,048 characters a task).

"Staging" is the upload of the code (hpcjob.store.staging): a dataset is copied, never staged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hpcjob.job.spec import SpecError

TRAINERS, DATA, ALL = "trainers", "data", "all"
ROLES = (TRAINERS, DATA, ALL)
BLOB, SHARE = "blob", "share"
# The job's variable: what each task copies
# ({"sources": [...], "nodes": N, "timeout_s": S[, "cache_bytes": B]}).
SOURCES_VAR = "HPCJOB_DATASET_SOURCES"
# The node helper's: where the task finds its datasets, one subfolder each.
DATASETS_VAR = "HPCJOB_DATASETS"
# The node's own local folder (the profile's local_dir): the datasets' cache, and hpctorch's.
LOCAL_DIR_VAR = "HPCJOB_LOCAL_DIR"
# Each task's word that its copy is done, in the attempt's log folder: `<NODE>.json`, its figures.
DONE_FOLDER = ".hpcjob-datasets"
MAX_DATASETS = 32
# What the nodes copy Blob sources with, pinned (the `blob` extra in pyproject.toml pins the same: a test
# keeps them one), added to the job's environment by the client.
BLOB_REQUIREMENT = "azure-storage-blob==12.31.1"
# The variables a node reads a Blob source's credential from (the job's --secret); with neither, the
# node's managed identity, read with azure-identity, pinned and added the same way.
CONNECTION_STRING, SAS_TOKEN = "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN"
IDENTITY_REQUIREMENT = "azure-identity==1.25.1"
# Where a size with local NVMe disks has them, as one volume (the mount step assembles it).
NVME_MOUNT = "/mnt/nvme"
# Where an Azure VM's resource disk is mounted (the Linux agent's and cloud-init's), the local folder of a
# job that names none on a size without NVMe disks. UNVERIFIED on HPC Pack's own images.
RESOURCE_DISKS = ("/mnt/resource", "/mnt")
# Where an account's own host name ends (the public cloud and the national ones): the virtual-host form.
BLOB_SUFFIXES = (
    ".blob.core.windows.net",
    ".blob.core.chinacloudapi.cn",
    ".blob.core.usgovcloudapi.net",
)
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]")
# What a Windows folder cannot hold (the share is a Windows head node's): names and characters.
_WINDOWS_BAD = re.compile(r'[<>:"\\|?*\x00-\x1f]')
_WINDOWS_RESERVED = re.compile(r"(CON|PRN|AUX|NUL|COM[1-9]|LPT[1-9])(\..*)?", re.IGNORECASE)


@dataclass(frozen=True)
class Dataset:
    """One `--dataset`: where it is (`kind`, BLOB or SHARE), who copies it (`role`), the subfolder of
    HPCJOB_DATASETS it fills (`name`). A Blob source: the account's `endpoint` (what a client is made
    from), its `container` and `prefix` ("" or ending in /). A share source: `prefix`, the folder below
    the share's root."""

    text: str
    kind: str
    role: str
    name: str
    prefix: str
    endpoint: str = ""
    container: str = ""

    def on_node(self, share_root: str) -> dict[str, str]:
        """What the node helper reads of it: a share folder as the nodes mount it."""
        said = {"name": self.name, "kind": self.kind, "role": self.role}
        if self.kind == SHARE:
            return {**said, "path": f"{share_root}/{self.prefix}"}
        return {**said, "endpoint": self.endpoint, "container": self.container, "prefix": self.prefix}


def check_path_part(part: str, what: str) -> None:
    """One component of a path the nodes write as a file or folder name: never one that escapes its
    folder or one a Windows share cannot hold."""
    if part in ("", ".", ".."):
        said = repr(part) if part else "an empty name"
        raise SpecError(f"{what}: {said} in a path (no '.', '..' or '//')")
    if _WINDOWS_BAD.search(part) or part.endswith((".", " ")) or _WINDOWS_RESERVED.fullmatch(part):
        raise SpecError(f"{what}: {part!r} is not a name a Windows folder can hold")


def parse_dataset(given: str) -> Dataset:
    """`SOURCE[:ROLE]`, read; a bad one is a SpecError in one line."""
    text, role = given.strip(), TRAINERS
    head, _, tail = text.rpartition(":")
    if head and tail in ROLES:
        text, role = head, tail
    what = f"--dataset {text}"
    if not text:
        raise SpecError("--dataset: empty: give a Blob URL or a folder on the share")
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        return _blob(text, role, what)
    if text.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", text):
        raise SpecError(
            f"{what}: a folder on the share is relative to the share's root (datasets/imagenet), not an "
            "absolute path"
        )
    parts = text.strip("/").split("/")
    for part in parts:
        check_path_part(part, what)
    return Dataset(text, SHARE, role, parts[-1], "/".join(parts))


# scheme://[user@]host[:port][/path][?query][#fragment], read without urllib (the pure core imports no I/O).
_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<user>[^@/?#]*@)?(?P<host>[^:/?#]*)"
                  r"(?::(?P<port>[^/?#]*))?(?P<path>[^?#]*)(?P<rest>[?#].*)?", re.DOTALL)  # fmt: skip


def _blob(text: str, role: str, what: str) -> Dataset:
    url = _URL.fullmatch(text)
    if url is None:
        raise SpecError(f"{what}: not a URL")
    scheme = url["scheme"].lower()
    if scheme not in ("https", "http"):
        raise SpecError(f"{what}: a Blob source is an https:// URL (or http:// for an emulator)")
    if url["rest"]:
        raise SpecError(
            f"{what}: no query in the URL (a SAS is a secret: give it with --secret AZURE_STORAGE_SAS_TOKEN)"
        )
    if url["user"]:
        raise SpecError(f"{what}: no user or password in the URL: give credentials with --secret")
    host = url["host"].lower()
    if not re.fullmatch(r"[a-z0-9.-]+", host):
        raise SpecError(f"{what}: no host in the URL" if not host else f"{what}: {host!r} is not a host name")
    port = url["port"]
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise SpecError(f"{what}: port {port!r} is not a port number")
    parts = url["path"].split("/")
    parts = parts[1:] if parts and parts[0] == "" else parts
    if parts and parts[-1] == "":
        parts = parts[:-1]
    suffix = next((s for s in BLOB_SUFFIXES if host.endswith(s)), None)
    netloc = host if port is None else f"{host}:{int(port)}"
    if suffix is not None:
        if scheme != "https":
            raise SpecError(f"{what}: Azure Storage is reached over https://")
        account = host[: -len(suffix)]
        endpoint = f"https://{netloc}"
    else:
        if not parts:
            raise SpecError(f"{what}: a path-style URL names the account: http://HOST:PORT/ACCOUNT/CONTAINER")
        account, parts = parts[0], parts[1:]
        endpoint = f"{scheme}://{netloc}/{account}"
    if not _ACCOUNT.fullmatch(account):
        raise SpecError(f"{what}: {account!r} is not a storage account name (3-24 lowercase letters, digits)")
    if not parts:
        raise SpecError(f"{what}: no container in the URL: .../ACCOUNT/CONTAINER[/PREFIX]")
    container, below = parts[0], parts[1:]
    if not _CONTAINER.fullmatch(container):
        raise SpecError(
            f"{what}: {container!r} is not a container name (3-63 lowercase letters, digits, single hyphens)"
        )
    for part in below:
        check_path_part(part, what)
    prefix = "".join(f"{part}/" for part in below)
    return Dataset(text, BLOB, role, below[-1] if below else container, prefix, endpoint, container)


def parse_datasets(given: Iterable[str]) -> tuple[Dataset, ...]:
    """Every `--dataset`, each name once (they are the subfolders of HPCJOB_DATASETS)."""
    datasets = tuple(parse_dataset(text) for text in given)
    if len(datasets) > MAX_DATASETS:
        raise SpecError(f"--dataset: {len(datasets)} datasets, more than {MAX_DATASETS}")
    seen: dict[str, str] = {}
    for dataset in datasets:
        key = dataset.name.lower()  # one folder on a case-insensitive disk too
        if key in seen:
            raise SpecError(
                f"--dataset: {seen[key]} and {dataset.text} are both named {dataset.name!r} in "
                "HPCJOB_DATASETS: copy one of them under another folder"
            )
        seen[key] = dataset.text
    return datasets


def needs(dataset: Dataset, role: str) -> bool:
    """Whether a task of `role` (TRAINERS or DATA) copies `dataset`."""
    return dataset.role in (ALL, role)


def sources_value(
    datasets: Sequence[Dataset], share_root: str, nodes: int, timeout_s: float, cache_bytes: int | None = None
) -> str:
    """The job's SOURCES_VAR: the sources, the number of tasks whose copies the rendezvous waits for, how
    long it waits, and the cap of a user's cache on a node (absent: none)."""
    value: dict[str, object] = {
        "sources": [dataset.on_node(share_root.rstrip("/")) for dataset in datasets],
        "nodes": nodes,
        "timeout_s": timeout_s,
    }
    if cache_bytes:
        value["cache_bytes"] = cache_bytes
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def local_dir(given: str | None, vm_size: str | None) -> str | None:
    """The nodes' local folder: the profile's local_dir, else NVME_MOUNT on a size whose table row has
    NVMe disks; None: the node finds its resource disk, or the backend gives each node its own."""
    if given:
        return given
    from hpcjob.job.sizes import size_table

    size = size_table().find(vm_size) if vm_size else None
    return NVME_MOUNT if size is not None and size.nvme_disks else None


@dataclass(frozen=True)
class DatasetCopy:
    """What one node's task did for one source (its figures in DONE_FOLDER): bytes read from the source and
    from the node's cache, files, seconds."""

    node: str
    name: str
    bytes_source: int
    bytes_cache: int
    files: int
    seconds: float


def dataset_copies(data: object) -> list[DatasetCopy]:
    """A task's figures file, read as untrusted (a job's files are its owner's to write): what holds the
    right types, the rest left out."""
    if not isinstance(data, dict) or not isinstance(data.get("node"), str):
        return []
    copies = []
    for one in data.get("datasets") or ():
        if not isinstance(one, dict):
            continue
        counts = [one.get(key) for key in ("bytes_source", "bytes_cache", "files")]
        whole = [n for n in counts if type(n) is int and n >= 0]
        seconds = one.get("seconds")
        if (
            isinstance(one.get("name"), str)
            and len(whole) == 3
            and isinstance(seconds, int | float)
            and not isinstance(seconds, bool)
            and 0 <= seconds < 1e9
        ):
            source, cache, files = whole
            copies.append(
                DatasetCopy(data["node"][:64], one["name"][:255], source, cache, files, float(seconds))
            )
    return copies


def size_text(count: float) -> str:
    """Bytes for people, in powers of 1,000 (as the nodes say them)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000.0
    return f"{count:.0f} bytes"


def copies_line(copies: Sequence[DatasetCopy]) -> str:
    """The summary's line: what the nodes read, from the source and from their caches, and the slowest."""
    nodes = {copy.node for copy in copies}
    took: dict[str, float] = {}
    for copy in copies:
        took[copy.node] = took.get(copy.node, 0.0) + copy.seconds
    slowest = max(took, key=lambda node: took[node])
    source, cache = sum(c.bytes_source for c in copies), sum(c.bytes_cache for c in copies)
    return (
        f"datasets: {size_text(source)} from the sources, {size_text(cache)} from the nodes' caches, on "
        f"{len(nodes)} node(s); the slowest {took[slowest]:.1f} s ({slowest})"
    )


def blob_packages(secrets: Iterable[str]) -> tuple[str, ...]:
    """What a job with a Blob source adds to its environment: the SDK, and azure-identity where the job
    hands its nodes no credential (`secrets`: its --secret names), so that they use their managed identity."""
    given = {CONNECTION_STRING, SAS_TOKEN} & set(secrets)
    return (BLOB_REQUIREMENT,) if given else (BLOB_REQUIREMENT, IDENTITY_REQUIREMENT)


def names_package(requirements: str, requirement: str) -> bool:
    """Whether a requirements file already names the package `requirement` pins (a version of the user's
    own wins); names compared as pip does (case, and -, _ and . alike)."""
    name = re.split(r"[=<>!~\[ ;]", requirement, maxsplit=1)[0]
    pattern = r"[-_.]".join(re.escape(part) for part in re.split(r"[-_.]", name))
    return (
        re.search(rf"^\s*{pattern}(?![A-Za-z0-9_.-])", requirements, re.IGNORECASE | re.MULTILINE) is not None
    )
