"""hpcjob's node helper for datasets: each task copies the job's datasets onto its node's own disk before
the program starts (`--dataset`; hpcjob.job.datasets says what the job names).

node.sh runs it, as the job's owner, in the job folder, after the task's secrets are read:

    HPCJOB_DATASETS=$(python3 .hpcjob/datasets.py) && export HPCJOB_DATASETS

It prints the folder that holds one subfolder per source this task's role needs, and says on stderr what it
read. Each node keeps what it copied, in its local folder (HPCJOB_LOCAL_DIR), its owner's alone:

    <local>/hpcjob/<user>/            0700, nobody else's (the checks of env.py's environments)
        .lock                         held while a copy changes the cache (two jobs of the user on a node)
        datasets/<key>/current/       the last good copy of a source: its files
        datasets/<key>/current.json   each file's key (what the source says of it, unread) and size
        runs/<attempt>-<node>/<name>  a link to a source's `current`: the task's HPCJOB_DATASETS

A file is fetched again only when what its source says of it changed: a share file's size and time, a
blob's Content-MD5 where set, else its ETag and size. A new copy is built beside the old one (unchanged
files linked, changed ones fetched and checked: the blob's MD5 where set, else the size) and takes its place
only whole: a copy that fails leaves the last good one, and the task fails in one line naming the node.
Then the task writes its figures to the attempt's log folder (`.hpcjob-datasets/<NODE>.json`) and waits
until every task of the job has (the rendezvous waits for the slowest node), at most the job's timeout.

Runs with any Python 3.6+ on the node; a Blob source needs azure-storage-blob (the job's environment).
"""

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from typing import Any, Dict, List, Tuple

import env  # type: ignore[import-not-found,unused-ignore]  # beside this one in .hpcjob/: a user's folder

SOURCES_VAR = "HPCJOB_DATASET_SOURCES"
LOCAL_DIR_VAR = "HPCJOB_LOCAL_DIR"
DONE_FOLDER = ".hpcjob-datasets"
CHUNK = 1 << 20  # bytes read and written at a time: a copy's memory is this per thread
THREADS = 8
# Where an Azure VM's resource disk is mounted (the Linux agent's and cloud-init's), when the job names no
# local folder and its size has no NVMe disks. UNVERIFIED on HPC Pack's own images.
RESOURCE_DISKS = ("/mnt/resource", "/mnt")


class CopyError(Exception):
    """Why a copy could not be made, in one line (the node is named when it is said)."""


def node() -> str:
    return os.environ.get("HPCJOB_NODE") or os.uname()[1].split(".")[0]


def local_folder() -> str:
    """The node's local folder: the job's HPCJOB_LOCAL_DIR, else its resource disk as /proc/mounts says."""
    given = os.environ.get(LOCAL_DIR_VAR)
    if given:
        return given
    try:
        with open("/proc/mounts") as mounts:
            points = {line.split()[1] for line in mounts if len(line.split()) > 1}
    except OSError:
        points = set()
    for point in RESOURCE_DISKS:
        if point in points:
            return point
    raise CopyError(
        "no local folder for the datasets: the job names none (local_dir in the cluster's profile) and no "
        "resource disk is mounted at %s" % " or ".join(RESOURCE_DISKS)
    )


def checked_name(relative: str, what: str) -> str:
    """A file's path below its source, as a path below the copy: never one that leaves it."""
    parts = relative.split("/")
    if relative.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise CopyError("%s: %r is not a file name a copy can hold" % (what, relative))
    return relative


# -- what a source holds -------------------------------------------------------------------------------


def share_listing(path: str) -> Dict[str, Tuple[str, int]]:
    """Every regular file below a share folder: its key (size and time) and size. Links are not followed."""
    if not os.path.isdir(path):
        raise CopyError("%s is not a folder on the share" % path)
    found = {}  # type: Dict[str, Tuple[str, int]]
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        for name in files:
            full = os.path.join(folder, name)
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                continue
            relative = checked_name(os.path.relpath(full, path).replace(os.sep, "/"), path)
            found[relative] = ("%d:%d" % (info.st_size, info.st_mtime_ns), info.st_size)
    if not found:
        raise CopyError("%s holds no files" % path)
    return found


def share_fetch(path: str, relative: str, out: Any, expected: Tuple[str, int]) -> None:
    with open(os.path.join(path, relative), "rb") as source:
        shutil.copyfileobj(source, out, CHUNK)


def blob_container(source: Dict[str, Any]) -> Any:
    """The source's container, with the job's credential: a connection string or a SAS from --secret, else
    a managed identity (azure-identity)."""
    try:
        from azure.storage.blob import ContainerClient
    except ImportError:
        raise CopyError(
            "a Blob dataset needs azure-storage-blob on the node: add it to the job's --requirements"
        ) from None
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(connection)
        if service.url.rstrip("/") != source["endpoint"].rstrip("/"):
            # The account the URL names is the one read, with the string's key.
            service = BlobServiceClient(source["endpoint"], credential=service.credential)
        return service.get_container_client(source["container"])
    credential = os.environ.get("AZURE_STORAGE_SAS_TOKEN")  # type: Any
    if not credential:
        try:
            from azure.identity import ManagedIdentityCredential
        except ImportError:
            raise CopyError(
                "no credential for %s: give AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_SAS_TOKEN with "
                "--secret (or azure-identity, on nodes with a managed identity)" % source["endpoint"]
            ) from None
        credential = ManagedIdentityCredential()
    return ContainerClient(source["endpoint"], source["container"], credential=credential)


def blob_listing(container: Any, prefix: str) -> Dict[str, Tuple[str, int]]:
    """Every blob below the prefix: its key (Content-MD5 where set, else ETag and size) and size."""
    found = {}  # type: Dict[str, Tuple[str, int]]
    for blob in container.list_blobs(name_starts_with=prefix):
        relative = checked_name(blob.name[len(prefix) :], "blob %s" % blob.name)
        md5 = blob.content_settings.content_md5 if blob.content_settings else None
        key = "md5:" + bytes(md5).hex() if md5 else "etag:%s:%d" % (blob.etag, blob.size)
        found[relative] = (key, int(blob.size))
    if not found:
        raise CopyError("no blobs below %s/%s" % (container.container_name, prefix))
    return found


def blob_fetch(container: Any, prefix: str, relative: str, out: Any, expected: Tuple[str, int]) -> None:
    downloader = container.download_blob(prefix + relative, max_concurrency=1)
    digest = hashlib.md5() if expected[0].startswith("md5:") else None
    for chunk in downloader.chunks():
        out.write(chunk)
        if digest is not None:
            digest.update(chunk)
    if digest is not None and "md5:" + digest.hexdigest() != expected[0]:
        raise CopyError("blob %s%s: its bytes are not its Content-MD5" % (prefix, relative))


# -- the copy --------------------------------------------------------------------------------------------


def source_key(source: Dict[str, Any]) -> str:
    """A source's folder in the cache: its name, and a digest of where it is."""
    where = source.get("path") or "%s/%s/%s" % (source["endpoint"], source["container"], source["prefix"])
    return "%s-%s" % (source["name"], hashlib.sha256(where.encode()).hexdigest()[:16])


def read_manifest(path: str) -> Dict[str, List[Any]]:
    try:
        with open(path) as manifest:
            kept = json.load(manifest)
        return kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        return {}


def copy_source(source: Dict[str, Any], cache: str) -> Dict[str, Any]:
    """Bring the cache's copy of `source` up to date (the caller holds the cache's lock): its figures."""
    began = time.time()
    folder = os.path.join(cache, "datasets", source_key(source))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if source["kind"] == "share":
        listing = share_listing(source["path"])

        def fetch(relative: str, out: Any, expected: Tuple[str, int]) -> None:
            share_fetch(source["path"], relative, out, expected)

    else:
        container = blob_container(source)
        try:
            listing = blob_listing(container, source["prefix"])
        except CopyError:
            raise
        except Exception as exc:  # the SDK's: a container or account not there, a refused credential
            raise CopyError("cannot list %s: %s" % (source_key(source), _first_line(exc))) from None

        def fetch(relative: str, out: Any, expected: Tuple[str, int]) -> None:
            blob_fetch(container, source["prefix"], relative, out, expected)

    current = os.path.join(folder, "current")
    manifest_path = current + ".json"
    held = read_manifest(manifest_path) if os.path.isdir(current) else {}
    unchanged = [
        name
        for name, (key, size) in listing.items()
        if held.get(name) == [key, size] and _size_of(os.path.join(current, name)) == size
    ]
    wanted = sorted(set(listing) - set(unchanged))
    needed = sum(listing[name][1] for name in wanted)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise CopyError(
            "%s has %s free at %s, the dataset %s needs %s more"
            % (node(), _size(free), cache, source["name"], _size(needed))
        )
    if not wanted and sorted(held) == sorted(listing):
        return _figures(source, 0, sum(size for _, size in listing.values()), len(listing), began)
    building = os.path.join(folder, "next-%d" % os.getpid())
    shutil.rmtree(building, ignore_errors=True)
    try:
        for name in unchanged:  # the new copy shares the old one's unchanged files
            target = os.path.join(building, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.link(os.path.join(current, name), target)

        def one(name: str) -> None:
            target = os.path.join(building, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target + ".part", "wb") as out:
                fetch(name, out, listing[name])
            if _size_of(target + ".part") != listing[name][1]:
                raise CopyError(
                    "%s: %d bytes read, %d expected" % (name, _size_of(target + ".part"), listing[name][1])
                )
            os.rename(target + ".part", target)

        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            for done in [pool.submit(one, name) for name in wanted]:
                done.result()
        env.write_atomically(
            manifest_path + ".next", json.dumps({n: list(v) for n, v in listing.items()}, sort_keys=True)
        )
        old = os.path.join(folder, "old-%d" % os.getpid())
        if os.path.isdir(current):
            os.rename(current, old)
        os.rename(building, current)
        os.rename(manifest_path + ".next", manifest_path)
        shutil.rmtree(old, ignore_errors=True)
    except CopyError:
        shutil.rmtree(building, ignore_errors=True)
        raise
    except Exception as exc:  # a source that went away, a full disk, the SDK's errors: the old copy stays
        shutil.rmtree(building, ignore_errors=True)
        raise CopyError("copying %s: %s" % (source["name"], _first_line(exc))) from None
    return _figures(source, needed, sum(listing[n][1] for n in unchanged), len(listing), began)


def _figures(source: Dict[str, Any], read: int, cached: int, files: int, began: float) -> Dict[str, Any]:
    return {
        "name": source["name"],
        "bytes_source": read,
        "bytes_cache": cached,
        "files": files,
        "seconds": round(time.time() - began, 3),
    }


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _size(count: float) -> str:
    """Bytes for people, as hpcjob.job.datasets.size_text (a node file imports nothing of hpcjob)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return ("%d %s" if unit == "bytes" else "%.1f %s") % (count, unit)
        count /= 1000.0
    return "%d bytes" % count


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "%s: %s" % (type(exc).__name__, lines[0] if lines else "")


# -- the task's part -------------------------------------------------------------------------------------


def wait_for_all(done_folder: str, nodes: int, timeout_s: float) -> None:
    """Until every task of the job has said its copy is done (a file each), at most `timeout_s`."""
    deadline = time.time() + timeout_s
    while True:
        try:
            ready = sorted(
                name[: -len(".json")] for name in os.listdir(done_folder) if name.endswith(".json")
            )
        except OSError:
            ready = []
        if len(ready) >= nodes:
            return
        if time.time() > deadline:
            raise CopyError(
                "%d of the job's %d nodes copied their datasets within %ds (done: %s): the others are slow "
                "or failed (--dataset-timeout)" % (len(ready), nodes, timeout_s, ", ".join(ready) or "none")
            )
        time.sleep(1.0)


def main(role: str) -> str:
    job = json.loads(os.environ[SOURCES_VAR])
    mine = [s for s in job["sources"] if s["role"] in ("all", role)]
    root = os.path.join(local_folder(), "hpcjob")
    if not os.path.isdir(root):
        # Anyone's to make their folder in, as /tmp: mode 1777 (the node's mount step makes it as root).
        with contextlib.suppress(OSError):
            os.makedirs(root, exist_ok=True)
            os.chmod(root, 0o1777)
    cache = env.owner_folder(root, on_node=True)
    log_dir = os.environ["HPCJOB_LOG_DIR"]
    attempt = os.path.basename(log_dir.rstrip("/"))
    view = os.path.join(cache, "runs", "%s-%s" % (attempt, node()))
    figures = []
    with open(os.path.join(cache, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job of this user on this node waits its turn
        for source in mine:
            said = copy_source(source, cache)
            figures.append(said)
            env.say(
                "dataset %s on %s: %s from the source, %s from the node's cache, %d file(s), %.1f s"
                % (
                    said["name"],
                    node(),
                    _size(said["bytes_source"]),
                    _size(said["bytes_cache"]),
                    said["files"],
                    said["seconds"],
                )
            )
        shutil.rmtree(view, ignore_errors=True)
        os.makedirs(view, mode=0o700)
        for source in mine:
            os.symlink(
                os.path.join(cache, "datasets", source_key(source), "current"),
                os.path.join(view, source["name"]),
            )
    done_folder = os.path.join(log_dir, DONE_FOLDER)
    os.makedirs(done_folder, exist_ok=True)
    env.write_atomically(
        os.path.join(done_folder, node() + ".json"), json.dumps({"node": node(), "datasets": figures})
    )
    wait_for_all(done_folder, int(job["nodes"]), float(job["timeout_s"]))
    return view


if __name__ == "__main__":
    try:
        print(main(sys.argv[1] if len(sys.argv) > 1 else "trainers"))
    except CopyError as exc:
        env.fail("%s: %s" % (node(), exc))
