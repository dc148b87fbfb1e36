#!/usr/bin/env python3
"""hpcjob's execution filter for HPC Pack's Linux node agent: mount a share the administrator allowed,
for the job's owner, with the owner's own credentials, so that nobody ever writes a password onto a node.

It runs as root and every cluster user writes the environment of their own jobs, so it takes nothing
from a job but the choice of a share an administrator allowed at install time (FILTERS/hpcjob-mounts.json,
root's own): the share, the mount root and the mount options are the administrator's. Each user gets
the share at a mount point of their own, MOUNT ROOT/USER, mounted with their credentials and owned by
them alone (uid, gid, 0700), so no job of another user ever reaches the share with their SMB identity.
Always nosuid,nodev; never over a symlink or a system folder.

How the agent calls it (Azure/hpcpack-linux-agent, see the README's facts): OnJobTaskStart.sh at the first
task of a job on a node, with the task as JSON on stdin and the owner's user name and password in
m_Item3/m_Item4; OnTaskStart.sh at later tasks of that job there, without them. Its stdout and stderr are
read together as the one JSON value the agent goes on with, so this writes that JSON and nothing else:
its own words go to a root-only log, and to the task in HPCJOB_MOUNT_RESULT ("mounted", "already
mounted" or "failed: <why>", one line). A start it does not understand passes through byte for byte.

Runs on every Python 3 a node may have, 3.6 on: standard library only, bytes in and out (no locale).
"""

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

REQUEST_VAR = "HPCJOB_MOUNT"
RESULT_VAR = "HPCJOB_MOUNT_RESULT"
# What the filter did with the node's local NVMe disks, where the administrator's file names them
# ("local_disks": {"mount": "/mnt/nvme", "devices": "/dev/nvme*n1"}): "ready", "assembled ..." or "failed:".
LOCAL_DISK_RESULT_VAR = "HPCJOB_LOCAL_DISK_RESULT"
# The label of the file system the filter makes on them, and the name of their RAID 0 array: what tells a
# volume of its own (mounted again after a reboot) from a disk it must never touch.
LOCAL_DISK_LABEL = "hpcjob-local"
DEVICE_PATTERN = re.compile(r"/dev/[A-Za-z0-9_*?/\[\]-]+")
NVME_DEVICES = "/dev/nvme*n1"  # each NVMe disk's first (on Azure's sizes, only) namespace
MOUNTED = "mounted"
ALREADY_MOUNTED = "already mounted"
CONFIG_FILE = "hpcjob-mounts.json"
NO_ACCOUNT_YET = "has no account on this node yet"
FILTERS_DIR = "/opt/hpcnodemanager/filters"  # where the agent looks for execution filters
# Emulated nodes (hpcjob.emulator) keep the filter's own files (filters, lock, log) under a folder of
# their own. The agent starts a filter with PATH alone, and nothing of a job reaches this environment.
NODE_ROOT_VAR = "HPCJOB_NODE_ROOT"
NODE_ROOT = os.environ.get(NODE_ROOT_VAR, "").rstrip("/")
RUN_DIR = "/run/hpcjob"  # the lock: root's only, so no user can hold or pre-create it
LOG_FILE = "/var/log/hpcjob/mount-filter.log"
# The head node waits 40 s for a task to start and then sends the start again: stay well under it.
# The administrator's file may lower it (timeout_s); the lock gets at most 40% of it.
# Under the head node's 40 s with room for the agent's own work (sudo, cgexec, making the account).
BUDGET_S = 15.0
MAX_BUDGET_S = 20.0
CHECK_TIMEOUT_S = 5.0
# Mount options an administrator may allow; the filter adds the identity and safety options itself.
# Not krb5 (its tickets would be root's, the mounting process's: not the owner's identity), not SMB1
# (its Unix extensions override the modes), not `hard` (a hung server would hang the check for ever).
ALLOWED_OPTIONS = re.compile(
    r"(vers=(2\.0|2\.1|3|3\.0|3\.02|3\.1\.1|3\.11|default)|sec=(ntlmssp|ntlmsspi|ntlmv2|ntlmv2i)"
    r"|cache=(strict|loose|none)|(actimeo|acregmax|acdirmax|rsize|wsize|echo_interval|port)=[0-9]+"
    r"|iocharset=[A-Za-z0-9_-]+|seal|nobrl|noserverino|serverino|mfsymlinks|soft|ro|rw|noexec|nocase|noacl)"
)
FORCED_OPTIONS = "nosuid,nodev,nounix,forceuid,forcegid,file_mode=0700,dir_mode=0700"
# Mount roots never allowed: system folders, the agent's own, and places other users write.
SYSTEM_FOLDERS = (
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/opt/hpcnodemanager",
    "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/usr", "/var",
)  # fmt: skip
PLAIN_PATH = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9._-]*)+")
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
DOMAIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9.-]*)?")
MAX_PASSWORD = 512  # bytes: mount.cifs's MOUNT_PASSWD_SIZE (cifs-utils mount.cifs.c)
MAX_USER_NAME = 32  # characters: useradd's limit, and so the longest account the agent can make
JOBS_DIR = RUN_DIR + "/jobs"  # who owns each job, as the agent named them at its first task here
JOB_RECORD_DAYS = 30  # records of jobs started longer ago than this are dropped
SHOWN = 160  # characters of a job's own text quoted in a refusal, so the reason always fits one line
UNC = re.compile(r"//[A-Za-z0-9][A-Za-z0-9.-]*(/[^/\\\x00-\x1f|,]+)+")


Config = Dict[str, Any]  # {"shares": [{"unc", "mount_root", "options"}], "timeout_s": seconds,
#                          "containers": {"images": [prefix], "options": [phrase], "volumes": [path[:ro]]}}
# The node agent's Docker variables (Azure/hpcpack-linux-agent @ f50e911 nodemanager/scripts/common.sh
# L127-173, core/Process.cpp L151-152): a task runs in a container when CCP_DOCKER_IMAGE is not empty,
# and its scripts read these back from the task's variables file, a line each, with unanchored greps.
DOCKER_VARS = (
    "CCP_DOCKER_IMAGE", "CCP_DOCKER_START_OPTION", "CCP_DOCKER_VOLUMES", "CCP_DOCKER_NVIDIA",
    "CCP_DOCKER_SKIP_SSH_SETUP", "CCP_DOCKER_DEBUG",
)  # fmt: skip
CONTAINER_REFUSED = 3  # the filter's exit code for a start the container policy refuses (filter.sh)
# An image reference as Docker reads it (distribution/reference @ 0965666a6ade2e06035fe352e38344be1e68951a:
# regexp.go's grammar; normalize.go splitDockerDomain: the first of several components is the registry when
# it holds '.' or ':', is localhost or holds a capital, index.docker.io is docker.io, and a name of one
# component on docker.io is library/NAME; reference.go: a repository path of 255 characters at most) with
# the digests opencontainers/go-digest @ 137fd2bb009d6540304bc01b3c7758777514e430 registers (algorithm.go:
# sha256 and sha512, lower-case hex). No bracketed IPv6 registry: `[` is a glob in the agent's unquoted
# `docker run ... $image`, and the characters here are all a shell leaves alone.
REGISTRY = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]+)?"
)
PATH_COMPONENT = re.compile(r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
MAX_REPOSITORY = 255
DOCKER_HUB = "docker.io"
# What the daemon takes for an image's ID, not a name: 64 hex digits and a digest (ParseAnyReference,
# normalize.go), and a name it has no image of is looked up as the start of an ID (moby/moby @
# a299a19b45c2f075c1e73805400ad5404940b778 daemon/images/image.go getImage: "Search based on ID"), so any
# image already on the node could run under a name the policy allowed.
IMAGE_ID = re.compile(r"[0-9a-f]+|sha(256|384|512):[0-9a-f]+")
ImageReference = Tuple[str, Tuple[str, ...], Optional[str], Optional[str]]  # registry, path, tag, digest
ImageRule = Tuple[str, Tuple[str, ...], str, Optional[str]]  # registry, path, what (BELOW...), tag/digest
OPTION_WORD = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9-]*(=[A-Za-z0-9._:/-]+)?|[A-Za-z0-9._:/=-]+")
PLAIN_WORD = re.compile(r"[A-Za-z0-9]*")


class Refused(Exception):
    """Why the share was not mounted, in one line for the task."""


def main(argv: List[str]) -> int:
    event = argv[1] if len(argv) > 1 else "job-task-start"
    if event == "check-install":
        return check_install(sys.stdin.buffer.read())
    raw = sys.stdin.buffer.read()
    try:
        # NaN, Infinity or a number past a double would come back out as text that is not JSON: such a
        # start is not one this filter reads, and passes on as the agent wrote it.
        request = json.loads(raw.decode("utf-8"), parse_constant=not_json)
        json.dumps(request, allow_nan=False)
        env = request["m_Item2"]["environmentVariables"]
        if not isinstance(env, dict):
            raise TypeError("environmentVariables")
    except (ValueError, KeyError, TypeError, RecursionError):
        env = None
    refusal = container_refusal(env, raw)
    if refusal:
        log("refused a container:", refusal)
        sys.stdout.write("hpcjob's execution filter refused this task: " + refusal + "\n")
        return CONTAINER_REFUSED
    wanted = env.get(REQUEST_VAR) if env is not None else None
    if env is None or not isinstance(wanted, str):
        sys.stdout.buffer.write(raw)  # not for this filter: passed on byte for byte
        return 0
    started = time.monotonic()
    try:
        result = handle(event, wanted, request, env, started)
    except Refused as why:
        result = "failed: " + one_line(str(why))
    except Exception as err:  # a bug here must not stop every job of every user on the node
        result = f"failed: hpcjob's filter met an error ({type(err).__name__}); see {LOG_FILE} on the node"
        log("error", type(err).__name__)  # never its text: it may quote what it was given
    env[RESULT_VAR] = result
    disks = local_disks_result(started)
    if disks:
        env[LOCAL_DISK_RESULT_VAR] = disks
    ids = request.get("m_Item1") if isinstance(request.get("m_Item1"), dict) else {}
    log(
        "job {!r} task {!r} {} of {!r}: {} ({:.1f} s)".format(
            ids.get("JobId"), ids.get("TaskId"), event, user_name(request.get("m_Item3")), result,
            time.monotonic() - started,
        )
    )  # fmt: skip
    # The agent's own compact form, ASCII (a lone surrogate in a job's text cannot break it).
    sys.stdout.buffer.write(json.dumps(request, separators=(",", ":")).encode("ascii"))
    return 0


def container_refusal(env: Optional[Dict[str, Any]], raw: bytes) -> str:
    """Why the administrator's container policy refuses this start ("" when it does not, or when there is
    no policy): the image, the `docker run` options and the volumes the agent would use must be ones the
    administrator allowed, and nothing may reach the agent's greps of the variables file but those.
    `env`: the start's variables, None where the filter could not read it (`raw`)."""
    try:
        policy = read_config().get("containers")
    except Refused as why:
        if not os.path.lexists(config_path()):
            return ""  # nothing installed: no policy
        return f"the container policy cannot be read ({why})" if b"CCP_DOCKER_" in raw else ""
    if policy is None:
        return ""
    if env is None:  # not a start this filter reads: refused only if it might name a container
        return "a task start the filter cannot read names a container" if b"CCP_DOCKER_" in raw else ""
    image = env.get("CCP_DOCKER_IMAGE")
    if not image:
        return ""  # no container: the agent reads none of the variables file
    for name, value in env.items():
        if "CCP_DOCKER_" in str(name).upper() and name not in DOCKER_VARS:
            return f"variable {shown(str(name))}: only the node agent's own names may hold CCP_DOCKER_"
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            return f"variable {shown(str(name))}: a line break in a container's variables"
        if name not in DOCKER_VARS and "CCP_DOCKER_" in value.upper():
            return f"variable {shown(str(name))}: its value names the node agent's Docker settings"
    refusal = image_refusal(image, policy["images"])
    if refusal:
        return refusal
    left = env.get("CCP_DOCKER_START_OPTION", "").split()
    phrases = sorted((p.split() for p in policy["options"]), key=len, reverse=True)
    while left:
        phrase = next((p for p in phrases if left[: len(p)] == p), None)
        if phrase is None:
            return f"docker option {shown(left[0])} is not one the administrator allowed"
        left = left[len(phrase) :]
    volumes = env.get("CCP_DOCKER_VOLUMES", "")
    for volume in volumes.split(",") if volumes else ():  # an empty one is a bare -v: it takes the next word
        refusal = volume_refusal(volume, policy["volumes"])
        if refusal:
            return refusal
    for name in ("CCP_DOCKER_NVIDIA", "CCP_DOCKER_SKIP_SSH_SETUP", "CCP_DOCKER_DEBUG"):
        if not PLAIN_WORD.fullmatch(env.get(name, "")):
            return f"variable {name}: a plain word, as the node agent reads it unquoted"
    return ""


def image_refusal(image: str, allowed: List[str]) -> str:
    """Why the image is not one the administrator allowed ("" when it is), compared as Docker reads both."""
    try:
        reference = image_reference(image)
    except ValueError as why:
        return f"image {shown(image)}{why}"
    rules = [image_rule(entry) for entry in allowed]  # checked when the policy was read
    if any(image_allowed(reference, rule) for rule in rules):
        return ""
    registry, path, tag, digest = reference
    read = registry + "/" + "/".join(path) + ("@" + digest if digest else ":" + (tag or "latest"))
    return (
        f"image {shown(image)} is not one the administrator allowed: Docker reads it as {shown(read)} "
        f"(allowed: {', '.join(allowed)})"
    )


def image_reference(text: str) -> ImageReference:
    """The registry, repository path, tag and digest Docker reads in `text`; ValueError says why it is not
    one (its words follow the image's name in a refusal)."""
    if IMAGE_ID.fullmatch(text):
        raise ValueError(
            ": Docker may read it as the ID of an image already on the node; name it with its registry "
            "(docker.io/library/NAME)"
        )
    malformed = " is not a well-formed image reference: "
    name, at, digest = text.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise ValueError(
            f"{malformed}digest {digest[:SHOWN]!r} is not sha256:<64 hex digits> or sha512:<128>"
        )
    first, slash, rest = name.partition("/")
    registry, path = (first, rest) if slash and is_registry(first) else (DOCKER_HUB, name)
    registry = DOCKER_HUB if registry == "index.docker.io" else registry
    if registry == DOCKER_HUB and "/" not in path:
        path = "library/" + path  # Docker Hub's official images
    path, colon, tag = path.partition(":")  # after the registry: no ':' but the tag's is left
    if not REGISTRY.fullmatch(registry):
        raise ValueError(f"{malformed}registry {registry[:SHOWN]!r} is not a host name or address[:port]")
    parts = path.split("/")
    for part in parts:
        if not PATH_COMPONENT.fullmatch(part):
            raise ValueError(
                f"{malformed}repository path component {part[:SHOWN]!r} is not lower-case letters and digits "
                "joined by . _ __ or dashes"
            )
    if len(path) > MAX_REPOSITORY:
        raise ValueError(f"{malformed}its repository path is longer than {MAX_REPOSITORY} characters")
    if colon and not TAG.fullmatch(tag):
        raise ValueError(
            f"{malformed}tag {tag[:SHOWN]!r} is not 1 to 128 letters, digits, _ . or -, first no . or -"
        )
    return registry, tuple(parts), tag if colon else None, digest if at else None


def is_registry(first: str) -> bool:
    """Whether Docker reads the first of several components of a name as its registry (splitDockerDomain)."""
    return first == "localhost" or "." in first or ":" in first or first.lower() != first


# What an administrator's image entry allows of a registry and repository path, by how it ends.
BELOW = "every repository below"  # REGISTRY/ or REGISTRY/PATH/ (whole components: nvidia/ is no nvidia-x/)
ANY = "any tag or digest"  # NAME:
BY_DIGEST = "by digest only"  # NAME@
TAGGED = "this tag"  # NAME:TAG, without a digest (Docker runs the digest, whatever the tag says)
DIGESTED = "this digest"  # NAME[:TAG]@DIGEST


def image_rule(entry: str) -> ImageRule:
    """An administrator's image entry as Docker would read it; ValueError says why it is not one."""
    try:
        if entry.endswith("/"):
            parts = entry[:-1].split("/")
            registry, path = (
                (parts[0], parts[1:]) if is_registry(parts[0]) and parts[0] else (DOCKER_HUB, parts)
            )
            registry = DOCKER_HUB if registry == "index.docker.io" else registry
            # A real name beneath checks every component the entry holds.
            image_reference("/".join([registry, *path, "x"]) if path else registry + "/x/x")
            return registry, tuple(path), BELOW, None
        if entry.endswith((":", "@")):
            registry, named, tag, digest = image_reference(entry[:-1])
            if tag or digest:
                raise ValueError(": a tag or digest, then a trailing : or @")
            return registry, named, ANY if entry.endswith(":") else BY_DIGEST, None
        registry, named, tag, digest = image_reference(entry)
    except ValueError as why:
        raise ValueError(f"image prefix {entry!r}{why}") from None
    if digest:
        return registry, named, DIGESTED, digest
    if tag:
        return registry, named, TAGGED, tag
    raise ValueError(
        f"image prefix {entry!r} must be a registry or repository ending in / (or : or @), or one image "
        "with its tag or digest"
    )


def image_allowed(image: ImageReference, rule: ImageRule) -> bool:
    registry, path, tag, digest = image
    allowed_registry, allowed_path, what, value = rule
    if registry != allowed_registry:
        return False
    if what == BELOW:
        return len(path) > len(allowed_path) and path[: len(allowed_path)] == allowed_path
    if path != allowed_path:
        return False
    if what == ANY:
        return True
    if what == BY_DIGEST:
        return digest is not None
    if what == DIGESTED:
        return digest == value
    return digest is None and (tag or "latest") == value


def volume_refusal(volume: str, allowed: List[str]) -> str:
    """Why the volume is refused ("" when it is not): SOURCE:SOURCE[:ro], SOURCE an allowed folder or below
    one (`PATH:ro` allows it read-only), and what docker would mount is SOURCE itself (folder_refusal)."""
    source, _, rest = volume.partition(":")
    target, _, mode = rest.partition(":")
    refused = f"volume {shown(volume)} is not one the administrator allowed"
    if target != source or mode not in ("", "ro") or not PLAIN_PATH.fullmatch(source):
        return refused
    if "/../" in source + "/" or "/./" in source + "/":
        return refused
    covering = []
    for entry in allowed:
        path, _, only = entry.partition(":")
        if (source == path or source.startswith(path.rstrip("/") + "/")) and (mode == "ro" or only != "ro"):
            covering.append(path.rstrip("/"))
    if not covering:
        return refused
    why = folder_refusal(max(covering, key=len), source)
    return f"volume {shown(volume)}: {why}" if why else ""


def folder_refusal(folder: str, source: str) -> str:
    """Why docker might mount something else than `source` ("" when not): a symlink at or below the
    administrator's `folder` (the kernel follows it when docker mounts the path), or a folder from `folder`
    down to the source's own that someone other than root may write (they could put a link there after
    this check: a check is no lock, see docs/packages-and-images.md). Sticky or not: a user may replace
    what they own in a sticky folder. The source itself may be anyone's: the folder above it keeps them
    from replacing it. What does not exist yet, docker makes as root, in a folder only root may write."""
    if source == folder:
        return ""  # the administrator's own choice, a link of theirs included
    path = folder
    try:
        info = os.stat(folder)  # followed: the administrator's folder may be a link of theirs
    except OSError as err:
        return "" if err.errno == errno.ENOENT else f"cannot look at {path}: {err.strerror}"
    for part in source[len(folder) + 1 :].split("/"):
        if not stat.S_ISDIR(info.st_mode):
            return f"{path} is not a folder"
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return (
                f"{path} may be written by others than root (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):04o}): a link put there after this check is what docker "
                "would mount"
            )
        path += "/" + part
        try:
            info = os.lstat(path)
        except OSError as err:
            return "" if err.errno == errno.ENOENT else f"cannot look at {path}: {err.strerror}"
        if stat.S_ISLNK(info.st_mode):
            return f"{path} is a symlink: docker would mount what it points to"
    return ""


def check_policy(policy: Dict[str, List[str]]) -> None:
    """An administrator's container policy, checked as the filter reads it (ValueError says what)."""
    if not policy["images"]:
        raise ValueError("a container policy names at least one image prefix")
    for image in policy["images"]:
        image_rule(image)  # read as Docker reads it: `registry.corp` is no registry.corp.evil.com/x
    for phrase in policy["options"]:
        if not phrase.split() or not all(OPTION_WORD.fullmatch(w) for w in phrase.split()):
            raise ValueError(f"docker option {phrase!r} is not plain words (no quotes, globs or $)")
    for entry in policy["volumes"]:
        path, _, only = entry.partition(":")
        if not PLAIN_PATH.fullmatch(path) or only not in ("", "ro") or "/../" in path + "/":
            raise ValueError(f"volume {entry!r} is not an absolute folder, with :ro or nothing after it")


def not_json(constant: str) -> None:
    raise ValueError(constant + " is not JSON")


def handle(event: str, wanted: str, request: Dict[str, Any], env: Dict[str, str], started: float) -> str:
    """What the filter did for a job that asks for `wanted` ("UNC|MOUNT POINT")."""
    parts = wanted.split("|")
    if len(parts) != 2:
        raise Refused(REQUEST_VAR + " must be UNC|MOUNT POINT: the options are the administrator's")
    share, point = parts
    config = read_config()
    budget = float(config.get("timeout_s", BUDGET_S))
    deadline = started + budget
    owner, password = request.get("m_Item3"), request.get("m_Item4")
    first = event == "job-task-start" and isinstance(password, str)
    job = job_id(request)
    # A later task of the job on this node: the agent names no owner and gives no password, so the
    # owner is the one the filter recorded at the job's first task here, never what the job names.
    if first:
        user, as_root = user_name(owner), runs_as_root(owner, env)
        if not user:
            raise Refused("the node agent named no job owner for this task")
        record_owner(job, user, as_root)
    else:
        user, as_root = recorded_owner(job)
    allowed = allowed_share(config, share, point, user)
    point = allowed["mount_root"].rstrip("/") + "/" + user  # what was asked for, as the filter spells it
    try:
        check_mount_root(point, "mount point")  # a user named like a folder root uses (/opt, hpcnodemanager)
    except ValueError as err:
        raise Refused(str(err)) from None
    # The folders above it first: a stat of the point itself hangs on a share whose server is gone, and
    # `mountpoint` bounds that; the point is looked at (never through a link) once it answered.
    safe_folder(allowed["mount_root"], strict_last=True)
    with node_lock(started + 0.4 * budget):
        if is_mounted(point, deadline):
            owned_by_owner(point, 0 if as_root else account_uid(user))
            return ALREADY_MOUNTED
        if not first:
            raise Refused(
                f"{point} is not mounted, and the node agent hands the owner's password only to the "
                "first task of a job on a node: run hpcjob mount, then the job"
            )
        account = (0, 0) if as_root else local_account(user)
        old = os.umask(0o022)
        try:
            safe_folder(point, make=True)
        finally:
            os.umask(old)
        options = ",".join(
            o for o in (allowed["options"], FORCED_OPTIONS, "uid={},gid={}".format(*account)) if o
        )
        mount(allowed["unc"], point, options, str(owner), str(password), deadline)  # as the admin spelt it
    return MOUNTED


def local_disks_result(started: float) -> str:
    """local_disks under the node's lock, within what is left of the filter's time: what it did, or
    "failed: why" (the task goes on: the share's mount is its own result)."""
    try:
        config = read_config()
        if not config.get("local_disks"):
            return ""
        deadline = started + float(config.get("timeout_s", BUDGET_S))
        with node_lock(deadline):
            result = local_disks(config, deadline)
    except Refused as why:
        result = "failed: " + one_line(str(why))
    except Exception as err:  # as handle's: never stop the task's start
        result = f"failed: hpcjob's filter met an error ({type(err).__name__}); see {LOG_FILE} on the node"
        log("error", type(err).__name__)
    log("local disks:", result)
    return result


def local_disks(config: Config, deadline: float) -> str:
    """The node's local NVMe disks as one volume at the administrator's mount point, made once and
    mounted again after a reboot (the caller holds the node's lock): what was done, in a line ("" where
    the file names none). Only disks the administrator's pattern names with no partition table, no file
    system or other signature and nothing mounted (lsblk, blkid): never the OS or the resource disk,
    never a disk that holds anything. The volume's `hpcjob` folder is everyone's to make their own
    folder in, as /tmp (hpcjob/node/datasets.py keeps each user's there)."""
    entry = config.get("local_disks")
    if not entry:
        return ""
    point = str(entry["mount"])
    safe_folder(point)
    if not is_mounted(point, deadline):
        safe_folder(point, make=True)  # never mounted over what a folder holds
        devices = entry.get("devices", NVME_DEVICES)
        patterns = [devices] if isinstance(devices, str) else list(devices)
        volume = labelled_volume(patterns, deadline)
        if volume:
            mount_local(volume, point, deadline)
            said = "mounted its volume again at " + point
        else:
            disks = free_disks(patterns, deadline)
            if not disks:
                raise Refused(f"no free disk matches {' '.join(patterns)} to assemble at {point}")
            volume = disks[0] if len(disks) == 1 else raid0(disks, deadline)
            make_file_system(volume, deadline)
            mount_local(volume, point, deadline)
            said = f"assembled {len(disks)} disk(s) into one volume at {point}"
    else:
        said = "ready"
    shared = os.path.join(point, "hpcjob")
    if not os.path.lexists(shared):
        os.mkdir(shared, 0o755)
        os.chmod(shared, 0o1777)
    return said


def command_output(argv: List[str], deadline: float) -> Tuple[Optional[int], str]:
    """A short command's exit code (None: it did not end in time) and output, bounded by the deadline."""
    said_path = os.path.join(private_folder(NODE_ROOT + RUN_DIR), f"disk-{os.getpid()}.txt")
    try:
        code = bounded(argv, max(1.0, deadline - time.monotonic()), said_path)
        with open(said_path, "rb") as f:
            said = f.read(1 << 20).decode("utf-8", "replace")
    finally:
        if os.path.lexists(said_path):
            os.unlink(said_path)
    return code, said


def checked_run(argv: List[str], deadline: float) -> str:
    code, said = command_output(argv, deadline)
    if code != 0:
        why = "no answer in time" if code is None else one_line(said) or f"exit code {code}"
        raise Refused(f"{argv[0]}: {why}")
    return said


def labelled_volume(patterns: List[str], deadline: float) -> str:
    """The volume this filter made before, after a reboot found again: its RAID array, or one of the
    administrator's disks, whose file system has the filter's label as the disk itself says (blkid's
    low-level probe: its cache may name a disk that is gone); "" where none is."""
    import glob

    array = "/dev/md/" + LOCAL_DISK_LABEL
    if os.path.exists("/proc/mdstat") and not os.path.exists(array):
        command_output(["mdadm", "--assemble", "--scan"], deadline)  # a reboot leaves the array apart
    for path in [array, *sorted({path for pattern in patterns for path in glob.glob(pattern)})]:
        if os.path.exists(path):
            code, said = command_output(["blkid", "-p", "-s", "LABEL", "-o", "value", path], deadline)
            if code == 0 and said.strip() == LOCAL_DISK_LABEL:
                return path
    return ""


def free_disks(patterns: List[str], deadline: float) -> List[str]:
    """The disks `pattern` names that hold nothing: whole disks (no partitions), nothing mounted, and no
    signature blkid's low-level probe finds (file system, partition table, RAID member)."""
    import glob

    found = []
    for path in sorted({path for pattern in patterns for path in glob.glob(pattern)}):
        try:
            if not stat.S_ISBLK(os.stat(path).st_mode):
                continue
        except OSError:
            continue
        # Its partitions and mounts (the kernel's, through sysfs); what it holds, read from the disk itself
        # by blkid's low-level probe (lsblk's FSTYPE is udev's record, which may be old).
        code, said = command_output(["lsblk", "-J", "-o", "NAME,MOUNTPOINT", path], deadline)
        if code != 0:
            continue
        device = (json.loads(said).get("blockdevices") or [{}])[0]
        if device.get("children") or device.get("mountpoint"):
            continue
        code, _ = command_output(["blkid", "-p", path], deadline)
        if code == 2:  # blkid: nothing found on it
            found.append(path)
    return found


def raid0(disks: List[str], deadline: float) -> str:
    if not os.path.exists("/proc/mdstat"):
        raise Refused(f"{len(disks)} disks to assemble, and this kernel has no RAID (md) driver")
    volume = "/dev/md/" + LOCAL_DISK_LABEL
    argv = ["mdadm", "--create", volume, "--run", "--level=0", f"--raid-devices={len(disks)}"]
    checked_run([*argv, "--name=" + LOCAL_DISK_LABEL, *disks], deadline)
    return volume


def make_file_system(volume: str, deadline: float) -> None:
    """XFS where the node has its tools (what Azure's HPC images use for the NVMe array, and quick to make
    on many terabytes), else ext4 with its tables made later, in the background: seconds either way."""
    import shutil

    if shutil.which("mkfs.xfs"):
        checked_run(["mkfs.xfs", "-f", "-K", "-L", LOCAL_DISK_LABEL, volume], deadline)
    else:
        options = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
        checked_run(["mkfs.ext4", "-q", "-F", "-L", LOCAL_DISK_LABEL, "-E", options, volume], deadline)


def mount_local(volume: str, point: str, deadline: float) -> None:
    checked_run(["mount", "-o", "noatime,nosuid,nodev", volume, point], deadline)


def job_id(request: Dict[str, Any]) -> int:
    """The job's id as the agent gave it (m_Item1.JobId): the key of the owner's record."""
    ids = request.get("m_Item1")
    number = ids.get("JobId") if isinstance(ids, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number < 2**31:
        raise Refused("the node agent named no job id for this task")
    return number


def runs_as_root(owner: object, env: Dict[str, str]) -> bool:
    """Whether the agent runs the owner's tasks as root: an HPC administrator unless
    CCP_MAP_ADMIN_USER=1, and the Windows system account (clusrun /user:system). Azure/hpcpack-linux-agent
    @ f50e911 nodemanager/core/RemoteExecutor.cpp L42-62 (StartJobAndTask), and its .NET agent's
    SetupUserAccountAsync."""
    if str(owner).lower() == "nt authority\\system":
        return True
    return env.get("CCP_ISADMIN") == "1" and env.get("CCP_MAP_ADMIN_USER") != "1"


def record_owner(job: int, user: str, as_root: bool) -> None:
    """Keep the owner the agent named at the job's first task here, in a folder only root may enter."""
    folder = private_folder(NODE_ROOT + JOBS_DIR)
    now = time.time()
    for name in os.listdir(folder):  # a job that ended long ago needs its record no more
        path = os.path.join(folder, name)
        try:
            if now - os.lstat(path).st_mtime > JOB_RECORD_DAYS * 86400:
                os.unlink(path)
        except OSError:
            pass
    path = os.path.join(folder, f"{job}.json")
    new = f"{path}.{os.getpid()}"  # a requeued first task may record the same job at once
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"user": user, "root": as_root}, f)
    os.rename(new, path)


def recorded_owner(job: int) -> Tuple[str, bool]:
    """The owner recorded at the job's first task here, and whether the agent runs them as root."""
    path = os.path.join(private_folder(NODE_ROOT + JOBS_DIR), f"{job}.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(4096).decode("utf-8"))
        user, as_root = record["user"], record["root"]
    except (OSError, ValueError, KeyError, TypeError):
        raise Refused(
            f"job {job} started no task here with its owner named, so the filter does not know whose "
            "mount this task may use"
        ) from None
    if user_name(user) != user or not isinstance(as_root, bool):
        raise Refused(f"the filter's record of job {job} is not one it wrote")
    return user, as_root


def account_uid(user: str) -> Optional[int]:
    """The uid of the account the agent runs `user`'s tasks as, None while it has none."""
    try:
        return local_account(user)[0]
    except Refused:
        return None


def owned_by_owner(point: str, uid: Optional[int]) -> None:
    """Trust "already mounted" only for the owner's own folder: no link (`mountpoint` follows one, to a
    mount of anyone's choosing), owned by root or the owner (`uid`; None: root only), and writable by
    nobody else."""
    try:
        info = os.lstat(point)
    except OSError as err:
        raise Refused(f"cannot look at {point}: {err.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise Refused(f"{point} is a symlink: the filter never mounts through one")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, uid) or info.st_mode & 0o022:
        raise Refused(f"{point} is mounted, but not as the filter mounts it for its owner alone")


def allowed_share(config: Config, share: str, point: str, user: str) -> Dict[str, str]:
    """The administrator's entry for this share whose mount point for `user` is `point`."""
    offered = []
    entries: List[Dict[str, str]] = config["shares"]
    for entry in entries:
        if entry["unc"].lower() == share.lower():
            mine = entry["mount_root"].rstrip("/") + "/" + user
            if point.rstrip("/") == mine:
                return entry
            offered.append(mine)
    if offered:
        raise Refused(f"the mount point for {share} is {offered[0]} for {user}, not {shown(point)}")
    shares = ", ".join(e["unc"] for e in config["shares"]) or "none"
    raise Refused(f"not a share the administrator allowed on this node (allowed: {shares}): {shown(share)}")


def config_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), CONFIG_FILE)


def read_config() -> Config:
    """The administrator's allowed shares: a file that only root can have written, checked again here."""
    path = config_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise Refused(
            f"no allowed shares on this node ({err.strerror}): an HPC administrator runs "
            "hpcjob mount --install"
        ) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise Refused(f"{path} is not root's alone: the filter ignores it")
        try:
            config: Config = json.loads(f.read().decode("utf-8"))
            for entry in config["shares"]:
                check_entry(entry)
            if config.get("containers") is not None:
                check_policy(config["containers"])
            if config.get("local_disks") is not None:
                check_local_disks(config["local_disks"])
            timeout = config.get("timeout_s", BUDGET_S)
            if not isinstance(timeout, (int, float)) or not 1 <= timeout <= MAX_BUDGET_S:
                raise ValueError(f"timeout_s must be a number of seconds from 1 to {MAX_BUDGET_S:.0f}")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise Refused(f"{path} is not a valid list of shares ({err})") from None
    return config


def check_entry(entry: Dict[str, str]) -> None:
    """An administrator's entry, checked as if a user had written it: the file may be edited by hand."""
    if not UNC.fullmatch(entry["unc"]):
        raise ValueError("share {!r} is not //SERVER/SHARE[/folder]".format(entry["unc"]))
    check_mount_root(entry["mount_root"])
    for option in filter(None, entry["options"].split(",")):
        if not ALLOWED_OPTIONS.fullmatch(option):
            raise ValueError(f"mount option {option!r} is not one the filter allows")


def check_local_disks(entry: Dict[str, str]) -> None:
    """The administrator's local disks: a mount point in no system folder, devices by a pattern below /dev."""
    check_mount_root(entry["mount"], "local disks' mount point")
    devices = entry.get("devices", NVME_DEVICES)
    for pattern in [devices] if isinstance(devices, str) else devices:
        if not isinstance(pattern, str) or not DEVICE_PATTERN.fullmatch(pattern) or ".." in pattern:
            raise ValueError(f"local disks {pattern!r} is not a pattern of devices below /dev")


def check_mount_root(path: str, what: str = "mount root") -> None:
    """A mount root (or a user's mount point, `what`): a plain absolute path, in no system folder."""
    if not PLAIN_PATH.fullmatch(path) or "/../" in path + "/" or "/./" in path + "/":
        raise ValueError(f"{what} {path!r} is not a plain absolute path")
    for system in SYSTEM_FOLDERS:
        if path == system or path.startswith(system + "/"):
            raise ValueError(f"{what} {path} is a system folder")


def user_name(owner: object) -> str:
    """The job owner's account on the node as the agent names it: DOMAIN\\name is name (it strips the
    domain; RemoteExecutor.cpp L67-69). "" for a name the filter does not take (name@domain among them,
    which the agent would keep whole)."""
    if not isinstance(owner, str):
        return ""
    name = owner.rsplit("\\", 1)[-1]
    return name if USER_NAME.fullmatch(name) and len(name) <= MAX_USER_NAME else ""


def local_account(user: str) -> Tuple[int, int]:
    """The uid and gid of the account the node agent runs a user's tasks as (not an administrator's,
    see runs_as_root): their name without the domain, `hpc_faked_root` for a user named root
    (RemoteExecutor.cpp L56-69). The agent makes a missing account after this filter ran, at the job's
    start."""
    import pwd  # here: the client imports this module's rules on Windows too

    try:
        account = pwd.getpwnam("hpc_faked_root" if user == "root" else user)
        return account.pw_uid, account.pw_gid
    except KeyError:
        pass
    raise Refused(f"{user} {NO_ACCOUNT_YET}: the node agent makes it when their first job starts there")


def safe_folder(target: str, make: bool = False, strict_last: bool = False) -> None:
    """Refuse a mount point reached through a symlink, or under a folder that someone other than root
    may change (they could swap a folder for a symlink between this check and the mount). A sticky
    folder such as /tmp is safe for what root owns in it: others cannot rename or remove that; but not
    as the mount root (`strict_last`), where others could make a user's folder, or a link, first.
    `make`: make the missing folders, one at a time, each checked once made (never through a link that
    someone slipped in meanwhile), and the last must be empty; else stop at the first missing one."""
    path = ""
    for part in target.strip("/").split("/"):
        path += "/" + part
        try:
            if make and not os.path.lexists(path):
                os.mkdir(path, 0o755)
            info = os.lstat(path)
        except OSError as err:
            if err.errno == errno.ENOENT and not make:
                return
            raise Refused(f"cannot make {path}: {err.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise Refused(f"{path} is a symlink: the filter never mounts through one")
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(f"{path} is not a folder")
        last = strict_last and path == "/" + target.strip("/")
        loose = info.st_mode & 0o022 and (last or not info.st_mode & stat.S_ISVTX)
        if info.st_uid != os.geteuid() or loose:
            raise Refused(f"{path} may be changed by others than root")
    if make and os.listdir(target):
        raise Refused(f"{target} is not empty: the filter mounts only on an empty folder")


class node_lock:
    """One mount at a time on the node: tasks of several jobs may start at once. The lock's folder is
    root's alone, checked, so no user's task can hold the lock or plant it."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.fd = -1

    def __enter__(self) -> "node_lock":
        import fcntl  # here: the client imports this module's rules on Windows too

        folder = private_folder(NODE_ROOT + RUN_DIR)
        self.fd = os.open(os.path.join(folder, "mount.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > self.until:
                os.close(self.fd)
                raise Refused("another mount on this node held the lock too long")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def private_folder(path: str) -> str:
    """`path`, a folder only root may enter, made so if missing; refused if anyone else could. Its
    parent, if made here, is made the same way (makedirs would make it open to all)."""
    if path.startswith(NODE_ROOT + RUN_DIR + "/"):
        private_folder(NODE_ROOT + RUN_DIR)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as err:
        raise Refused(f"cannot make {path[len(NODE_ROOT) :]}: {err.strerror}") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise Refused(f"{path[len(NODE_ROOT) :]} is not root's alone: the filter will not use it")
    return path


def bounded(argv: List[str], seconds: float, output: str = os.devnull, password: str = "") -> Optional[int]:
    """Run `argv` in a session of its own, its output into the file `output`: its exit code, or None
    when it did not end in `seconds` (then it and whatever it started are killed). A file, not a pipe:
    something it started could hold a pipe open, and Python 3.6 waits for the pipe after a timeout.
    `password` reaches it through a pipe named by PASSWD_FD (mount.cifs reads it there)."""
    fds: Tuple[int, ...] = ()
    env = dict(os.environ)
    if password:
        read, write = os.pipe()
        os.write(write, password.encode("utf-8"))  # short (checked): the pipe holds it all
        os.close(write)
        fds, env["PASSWD_FD"] = (read,), str(read)
    try:
        with open(output, "wb") as out:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                pass_fds=fds, env=env,
            )  # fmt: skip
    finally:
        for fd in fds:
            os.close(fd)
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass  # stuck in the kernel (a CIFS server gone): it is left, the filter goes on
        return None


def is_mounted(target: str, deadline: float) -> bool:
    wait = max(0.5, min(CHECK_TIMEOUT_S, deadline - time.monotonic()))
    code = bounded(["mountpoint", "-q", target], wait)
    if code is None:
        raise Refused(f"{target} did not answer in {wait:.0f} s (a share that hangs)")
    return code == 0


def mount(share: str, target: str, options: str, owner: str, password: str, deadline: float) -> None:
    """mount.cifs with the owner's name in its options and their password through a pipe (PASSWD_FD):
    the password is never in an argument (every process list shows those), a file or the mount table.
    The name and domain go to the kernel's option string unescaped: plain names only."""
    domain, _, name = owner.rpartition("\\")
    if not USER_NAME.fullmatch(name) or not DOMAIN.fullmatch(domain):
        raise Refused("the owner's user or domain name holds characters the filter does not pass to mount")
    if any(c in password for c in "\r\n\x00") or len(password.encode("utf-8")) > MAX_PASSWORD:
        raise Refused("the password holds a line break or is too long for mount.cifs")
    said_path = os.path.join(private_folder(NODE_ROOT + RUN_DIR), f"mount-{os.getpid()}.txt")
    identity = f"username={name}" + (f",domain={domain}" if domain else "")
    left = max(1.0, deadline - time.monotonic())
    try:
        code = bounded(
            ["mount", "-t", "cifs", share, target, "-o", f"{identity},{options}"], left, said_path, password
        )
        with open(said_path, "rb") as f:
            said = f.read(4096).decode("utf-8", "replace")
    finally:
        if os.path.lexists(said_path):
            os.unlink(said_path)
    if code is None:
        raise Refused(f"mount of {share} gave no answer in {left:.0f} s (is the server reachable?)")
    if code != 0:
        said = said.replace(password, "***") if password else said
        raise Refused(one_line(said) or f"mount exit code {code}")


def check_install(config_text: bytes) -> int:
    """`mount --install` on this node, before anything is written: the administrator's shares as the
    filter will read them, and each mount root in a place that only root can change (no mount root in a
    folder others may write, such as /tmp). One line and exit code 1 when not."""
    try:
        config = json.loads(config_text.decode("utf-8"))
        for entry in config["shares"]:
            check_entry(entry)
            safe_folder(entry["mount_root"], strict_last=True)
        if config.get("containers") is not None:
            check_policy(config["containers"])
        if config.get("local_disks") is not None:
            check_local_disks(config["local_disks"])
    except (ValueError, KeyError, TypeError) as err:
        print(f"hpcjob: the allowed shares are not valid ({err})")
        return 1
    except Refused as why:
        print(f"hpcjob: mount root refused: {why}")
        return 1
    return 0


def shown(text: str) -> str:
    """A job's own text in a refusal, cut so that the reason stays on its one line."""
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def log(*words: str) -> None:
    """A line in the filter's own log, root's alone. Never stdin, never a password; never raises."""
    try:
        folder = os.path.dirname(NODE_ROOT + LOG_FILE)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(NODE_ROOT + LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "ab") as f:
            line = time.strftime("%Y-%m-%dT%H:%M:%S ") + one_line(" ".join(words)) + "\n"
            f.write(line.encode("utf-8", "replace"))
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
