"""hpcjob's node helper for datasets: each task copies the job's datasets onto its node's own disk before
the program starts (`--dataset`; hpcjob.job.datasets says what the job names).

node.sh runs it, as the job's owner, in the job folder, after the task's secrets are read:

    HPCJOB_DATASETS=$(python3 .hpcjob/datasets.py) && export HPCJOB_DATASETS

It prints the folder that holds one subfolder per source this task's role needs, and says on stderr what it
read. Each node keeps what it copied, in its local folder (HPCJOB_LOCAL_DIR), its owner's alone:

    <local>/hpcjob/<user>/            0700, nobody else's (the checks of env.py's environments)
        .lock                         held while a task changes the cache (two jobs of the user on a node)
        datasets/<key>/v<N>/          a copy of a source: its files
        datasets/<key>/current.json   the last good copy's version, each file's key (what the source says
                                      of it, unread) and size
        datasets/<key>/used           its time: when a task last used the source
        runs/<attempt>-<node>.json    the task that holds the view: its process (and exit record), and the
                                      copies it reads
        runs/<attempt>-<node>/<name>  a link to the copy the task reads: its HPCJOB_DATASETS

A file is fetched again only when what its source says of it changed: a share file's size and time, a
blob's Content-MD5 where set, else its ETag and size. A new copy is built beside the old one (unchanged
files linked, changed ones fetched and checked: the blob's MD5 where set, else the size) and becomes the
current one only whole: a copy that fails leaves the last good one, and the task fails in one line naming
the node. A running task keeps reading the copy it started with: an older copy, and a whole source, is
removed only once no live task holds it (its process is gone). The cache is kept under the job's cap
(`cache_bytes`) and, when a copy needs room, made smaller, the least recently used source first.
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
from typing import Any, Dict, List, Optional, Set, Tuple

import env  # type: ignore[import-not-found,unused-ignore]  # beside this one in .hpcjob/: a user's folder

SOURCES_VAR = "HPCJOB_DATASET_SOURCES"
CONNECTION_STRING, SAS_TOKEN = "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN"
LOCAL_DIR_VAR = "HPCJOB_LOCAL_DIR"
DONE_FOLDER = ".hpcjob-datasets"
CHUNK = 1 << 20  # bytes read and written at a time: a copy's memory is this per thread
THREADS = 8
# Where an Azure VM's resource disk is mounted, when the job names no local folder and its size has no NVMe
# disks (hpcjob.job.datasets.RESOURCE_DISKS: a test keeps them one).
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
    connection = os.environ.get(CONNECTION_STRING)
    if connection:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(connection)
        if service.url.rstrip("/") != source["endpoint"].rstrip("/"):
            # The account the URL names is the one read, with the string's key.
            service = BlobServiceClient(source["endpoint"], credential=service.credential)
        return service.get_container_client(source["container"])
    credential = os.environ.get(SAS_TOKEN)  # type: Any
    if not credential:
        try:
            from azure.identity import ManagedIdentityCredential
        except ImportError:
            raise CopyError(
                "no credential for %s: give %s or %s with --secret (or azure-identity, on nodes with a "
                "managed identity)" % (source["endpoint"], CONNECTION_STRING, SAS_TOKEN)
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


def read_manifest(path: str) -> Dict[str, Any]:
    """A source's current.json: {"version": folder, "files": {name: [key, size]}}; {} where none is whole."""
    kept = read_json(path)
    return kept if isinstance(kept.get("files"), dict) else {}


def process_start(pid: int) -> Optional[str]:
    """When a process started (its /proc stat's start time: a pid used again is another process), "" where
    the node has no /proc, None where the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return ""


def pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def holds(holder: Dict[str, Any]) -> bool:
    """Whether the task a view's holder names still runs: its process, started when it says, where it is in
    this process's pid namespace; a task in another (a container of `--image`, whose processes are not seen
    from here) until its exit record (node.sh's) is there."""
    if holder.get("pidns", "") != pid_namespace():
        return bool(holder.get("exit")) and not os.path.exists(holder["exit"])
    pid = holder.get("pid")
    start = process_start(pid) if isinstance(pid, int) else None
    return start is not None and start == holder.get("start")


class Cache:
    """A user's cache on this node (the caller holds its lock): which copies live tasks hold, what may be
    dropped to make room or to keep under the cap, never a source this task uses (`keep`)."""

    def __init__(self, folder: str, keep: List[str], cap: Any) -> None:
        self.folder = folder
        self.datasets = os.path.join(folder, "datasets")
        self.runs = os.path.join(folder, "runs")
        self.keep = set(keep)
        self.cap = int(cap) if cap else None
        self.held: Set[str] = set()
        for path in (self.datasets, self.runs):
            os.makedirs(path, mode=0o700, exist_ok=True)

    def tidy(self) -> None:
        """Forget the views of tasks that ended, and the copies nobody reads (older versions, a build a
        task that died left)."""
        for name in os.listdir(self.runs):
            path = os.path.join(self.runs, name)
            if name.endswith(".json"):
                holder = read_json(path)
                if holds(holder):
                    self.held.update(holder.get("copies") or [])
                    continue
                os.remove(path)
                path = path[: -len(".json")]
            elif os.path.exists(path + ".json"):
                continue
            if os.path.islink(path):
                os.remove(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        for key in os.listdir(self.datasets):
            folder = os.path.join(self.datasets, key)
            current = read_manifest(os.path.join(folder, "current.json")).get("version")
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                if name not in ("current.json", "used", current) and path not in self.held:
                    shutil.rmtree(path, ignore_errors=True)

    def sizes(self) -> List[Tuple[float, str, int]]:
        """Each source's (last use, key, bytes of its current copy), least recently used first."""
        found = []
        for key in os.listdir(self.datasets):
            folder = os.path.join(self.datasets, key)
            files = read_manifest(os.path.join(folder, "current.json")).get("files", {})
            try:
                used = os.stat(os.path.join(folder, "used")).st_mtime
            except OSError:
                used = 0.0
            found.append((used, key, sum(int(size) for _, size in files.values())))
        return sorted(found)

    def droppable(self) -> List[Tuple[float, str, int]]:
        """What may go, least recently used first: no source this task uses, none a live task reads."""
        out = []
        for used, key, size in self.sizes():
            folder = os.path.join(self.datasets, key)
            if key in self.keep or any(path.startswith(folder + os.sep) for path in self.held):
                continue
            out.append((used, key, size))
        return out

    def drop(self, key: str, why: str) -> int:
        folder = os.path.join(self.datasets, key)
        files = read_manifest(os.path.join(folder, "current.json")).get("files", {})
        size = sum(int(each) for _, each in files.values())
        shutil.rmtree(folder, ignore_errors=True)
        env.say("dataset cache on %s: dropped %s (%s, %s)" % (node(), key, _size(size), why))
        return size

    def make_room(self, needed: int) -> int:
        """Free bytes on the cache's disk, after dropping the least recently used sources it may until
        `needed` fit."""
        free = shutil.disk_usage(self.folder).free
        for _, key, _ in self.droppable():
            if free >= needed:
                break
            self.drop(key, "room for a copy")
            free = shutil.disk_usage(self.folder).free
        return free

    def trim(self) -> None:
        """Under the cap: the least recently used sources no live task reads dropped first."""
        if self.cap is None:
            return
        total = sum(size for _, _, size in self.sizes())
        for _, key, _ in self.droppable():
            if total <= self.cap:
                return
            total -= self.drop(key, "over the cap of %s" % _size(self.cap))
        if total > self.cap:
            env.say(
                "dataset cache on %s: %s kept, over the cap of %s: running jobs read it"
                % (node(), _size(total), _size(self.cap))
            )


def read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path) as file:
            said = json.load(file)
    except (OSError, ValueError):
        return {}
    return said if isinstance(said, dict) else {}


def copy_source(source: Dict[str, Any], cache: Cache) -> Dict[str, Any]:
    """Bring the cache's copy of `source` up to date (the caller holds the cache's lock): its figures, and
    the copy's folder in "copy"."""
    began = time.time()
    folder = os.path.join(cache.datasets, source_key(source))
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

    manifest_path = os.path.join(folder, "current.json")
    manifest = read_manifest(manifest_path)
    held = manifest.get("files", {})
    current = os.path.join(folder, str(manifest.get("version")))
    unchanged = [
        name
        for name, (key, size) in listing.items()
        if held.get(name) == [key, size] and _size_of(os.path.join(current, name)) == size
    ]
    wanted = sorted(set(listing) - set(unchanged))
    needed = sum(listing[name][1] for name in wanted)
    with open(os.path.join(folder, "used"), "a"):
        os.utime(os.path.join(folder, "used"))
    if not wanted and sorted(held) == sorted(listing):
        return _figures(source, 0, sum(size for _, size in listing.values()), len(listing), began, current)
    free = cache.make_room(needed)
    if needed > free:
        raise CopyError(
            "%s has %s free at %s, the dataset %s needs %s more"
            % (node(), _size(free), cache.folder, source["name"], _size(needed))
        )
    version = "v%d" % int(time.time() * 1e6)
    building = os.path.join(folder, version)
    try:
        os.makedirs(building, mode=0o700)
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
        # The copy becomes the current one in one step; the last one stays while a live task reads it.
        env.write_atomically(
            manifest_path,
            json.dumps({"version": version, "files": {n: list(v) for n, v in listing.items()}}),
        )
    except CopyError:
        shutil.rmtree(building, ignore_errors=True)
        raise
    except Exception as exc:  # a source that went away, a full disk, the SDK's errors: the old copy stays
        shutil.rmtree(building, ignore_errors=True)
        raise CopyError("copying %s: %s" % (source["name"], _first_line(exc))) from None
    if current not in cache.held:
        shutil.rmtree(current, ignore_errors=True)
    return _figures(source, needed, sum(listing[n][1] for n in unchanged), len(listing), began, building)


def _figures(
    source: Dict[str, Any], read: int, cached: int, files: int, began: float, copy: str
) -> Dict[str, Any]:
    return {
        "name": source["name"],
        "bytes_source": read,
        "bytes_cache": cached,
        "files": files,
        "seconds": round(time.time() - began, 3),
        "copy": copy,
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
    """Until every task of the job has said its copy is done (a file each), at most `timeout_s`; at once
    where another node's task ended first (its exit record, node.sh's, beside the folder): it never will."""
    log_dir = os.path.dirname(done_folder)
    deadline = time.time() + timeout_s
    while True:
        try:
            ready = sorted(
                name[: -len(".json")] for name in os.listdir(done_folder) if name.endswith(".json")
            )
            ended = sorted(
                name[: -len(".exit")]
                for name in os.listdir(log_dir)
                if name.endswith(".exit") and name[: -len(".exit")] not in ready
            )
        except OSError:
            ready, ended = [], []
        if len(ready) >= nodes:
            return
        if ended:
            raise CopyError(
                "%s ended before its datasets were copied (its log says why): the job cannot start"
                % ", ".join(ended)
            )
        if time.time() > deadline:
            raise CopyError(
                "%d of the job's %d nodes copied their datasets within %ds (done: %s): the others are slow "
                "or failed (--dataset-timeout)" % (len(ready), nodes, timeout_s, ", ".join(ready) or "none")
            )
        time.sleep(1.0)


def main(role: str, task_pid: int) -> str:
    """Copy what this task's role needs, hold it for the task's process `task_pid` (node.sh's shell: the
    copies it reads stay while it lives), say the figures and wait for the other tasks: the task's folder."""
    job = json.loads(os.environ[SOURCES_VAR])
    mine = [s for s in job["sources"] if s["role"] in ("all", role)]
    root = os.path.join(local_folder(), "hpcjob")
    if not os.path.isdir(root):
        # Anyone's to make their folder in, as /tmp: mode 1777 (the node's mount step makes it as root).
        with contextlib.suppress(OSError):
            os.makedirs(root, exist_ok=True)
            os.chmod(root, 0o1777)
    log_dir = os.environ["HPCJOB_LOG_DIR"]
    attempt = os.path.basename(log_dir.rstrip("/"))
    figures = []
    with open(os.path.join(env.owner_folder(root, on_node=True), ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job of this user on this node waits its turn
        cache = Cache(os.path.dirname(lock.name), [source_key(s) for s in mine], job.get("cache_bytes"))
        cache.tidy()
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
        view = os.path.join(cache.runs, "%s-%s" % (attempt, node()))
        copies = [said.pop("copy") for said in figures]
        # The holder first: a view without one is a leftover, removed by the next task's tidy().
        holder = {
            "pid": task_pid,
            "start": process_start(task_pid),
            "pidns": pid_namespace(),
            "exit": os.path.join(log_dir, node() + ".exit"),
            "copies": copies,
        }
        env.write_atomically(view + ".json", json.dumps(holder))
        shutil.rmtree(view, ignore_errors=True)
        os.makedirs(view, mode=0o700)
        for index, source in enumerate(mine):
            os.symlink(copies[index], os.path.join(view, source["name"]))
        cache.held.update(copies)
        cache.trim()
    done_folder = os.path.join(log_dir, DONE_FOLDER)
    os.makedirs(done_folder, exist_ok=True)
    env.write_atomically(
        os.path.join(done_folder, node() + ".json"), json.dumps({"node": node(), "datasets": figures})
    )
    wait_for_all(done_folder, int(job["nodes"]), float(job["timeout_s"]))
    return view


if __name__ == "__main__":
    try:
        print(
            main(
                sys.argv[1] if len(sys.argv) > 1 else "trainers",
                int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid(),
            )
        )
    except CopyError as exc:
        env.fail("%s: %s" % (node(), exc))
