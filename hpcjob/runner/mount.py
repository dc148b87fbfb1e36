"""The share mounted on the nodes by hpcjob's execution filter, installed first by an administrator."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner.access import ClusterAccess, Progress, new_run_id, profile_mount_point

if TYPE_CHECKING:
    from hpcjob.job.plan import AllowedShare, ContainerPolicy
    from hpcjob.job.results import MountResult
    from hpcjob.store.config import ClusterProfile


@dataclass(frozen=True)
class MountRequest:
    """What `hpcjob mount` mounts: the share and the filter's options as an administrator allows them
    (`allowed`, for every user's folder of its mount root), this user's mount point, and the nodes (none:
    every usable node of `group`)."""

    allowed: AllowedShare
    point: str
    group: str | None
    nodes: tuple[str, ...]
    containers: ContainerPolicy | None = None  # with --install: the administrator's container policy
    local_disks: str | None = None  # with --install: where the filter assembles the nodes' NVMe disks


def mount_request(
    profile: ClusterProfile,
    share: str | None,
    mount_point: str | None,
    mount_options: str | None,
    node_group: str | None,
    node_names: Iterable[str],
    allow_images: Sequence[str] = (),
    allow_docker_options: Sequence[str] = (),
    allow_volumes: Sequence[str] = (),
    local_disks: str | None = None,
) -> MountRequest:
    """The mount as asked (the profile filling in), checked: the share, a mount point that is the user's
    own folder of its mount root, the filter's options from its short list, the group's name; the
    container policy to install, when images are allowed; and where the filter assembles the nodes' free
    NVMe disks (`local_disks`: a path, or "none"; not given: /mnt/nvme on a size whose row has NVMe
    disks)."""
    from hpcjob.job.plan import AllowedShare, ContainerPolicy, user_mount_point
    from hpcjob.job.spec import FILTER_MOUNT_OPTIONS, GROUP_NAME, parse_node_names, parse_share

    unc = share or profile.share
    if unc is None:
        raise SpecError(
            "no share to mount: give --share //HEADNODE/CcpSpoolDir[/folder], or add it to cluster "
            f"{profile.name}"
        )
    point = mount_point or profile_mount_point(profile)
    root = point.rstrip("/").rpartition("/")[0] or "/"
    if user_mount_point(root, profile.user) != point.rstrip("/"):
        mine = user_mount_point("/app", profile.user)
        raise SpecError(
            f"the mount point {point} is not a folder of your own: hpcjob's execution filter mounts the "
            f"share for {profile.user} at MOUNT ROOT/<user name>, such as {mine}"
        )
    options = FILTER_MOUNT_OPTIONS if mount_options is None else mount_options
    allowed = AllowedShare.checked(parse_share(unc).unc, root, options)
    group = node_group or profile.node_group
    if group is not None and not GROUP_NAME.fullmatch(group):
        raise SpecError(f"--node-group {group!r} is not a valid node group name")
    names = tuple(node_names)
    containers = None
    if allow_images:
        containers = ContainerPolicy.checked(allow_images, allow_docker_options, allow_volumes, [root])
    elif allow_docker_options or allow_volumes:
        raise SpecError("a container policy names its images: give --allow-image PREFIX")
    return MountRequest(
        allowed, point, group, parse_node_names(names) if names else (), containers,
        _local_disks(local_disks, profile.vm_size),
    )  # fmt: skip


def _local_disks(given: str | None, vm_size: str | None) -> str | None:
    from hpcjob.job.datasets import NVME_MOUNT
    from hpcjob.job.sizes import size_table
    from hpcjob.node.mount_filter import check_local_disks

    if given == "none":
        return None
    if given is None:
        size = size_table().find(vm_size) if vm_size else None
        return NVME_MOUNT if size is not None and size.nvme_disks else None
    try:
        check_local_disks({"mount": given})
    except ValueError as err:
        raise SpecError(f"--local-disks: {err}") from None
    return given


def mount_preview(request: MountRequest, *, install: bool) -> str:
    """What `hpcjob mount` would do on the nodes it names, sending nothing (`mount --dry-run`): with
    `install`, the filter's install command (as root), then the mount job, as job XML."""
    from hpcjob.job.plan import mount_step
    from hpcjob.job.render import JobShape, mount_check_job_xml
    from hpcjob.job.render.text import filter_install_command

    nodes = request.nodes
    if not nodes:
        raise SpecError("--dry-run asks the cluster nothing: name the nodes with --node")
    lines = []
    if install:
        lines.append(f"# would run as root on {', '.join(nodes)} (clusrun /user:system or an admin job):")
        lines.append(filter_install_command([request.allowed], request.containers, request.local_disks))
    step = mount_step(request.allowed.unc, request.point, request.allowed.options, nodes)
    job = mount_check_job_xml(new_run_id("mount"), step, JobShape(nodes))  # named: no group (mount_share)
    lines.append(f"# would submit, as you, the mount job:\n{job}")
    return "\n".join(lines)


def prepare_share(cluster: ClusterAccess, unc: str) -> str:
    """An administrator's: hpcjob/ on the share made theirs, with every cluster user allowed to make a
    folder of their own in it and nobody else to move it (hpcjob.store.share.SmbFolder.prepare_common). What
    was done, in a line; a share that cannot be reached is said, not raised: the filter is installed."""
    from hpcjob.job.spec import SHARE_FOLDER, parse_share
    from hpcjob.store.share import ShareError

    profile = cluster.profile
    try:
        folder = cluster.share(parse_share(unc), None, profile.smb_server, profile.smb_port)
        try:
            folder.prepare_common(SHARE_FOLDER)
        finally:
            folder.close()
    except (ShareError, SpecError) as exc:
        return (
            f"hpcjob: warning: {SHARE_FOLDER}/ on the share was not prepared ({exc}): until it is, users' "
            "uploads are refused once another user owns it"
        )
    return (
        f"hpcjob: {SHARE_FOLDER}/ on the share is an administrator's: each user makes a folder of their own "
        "there"
    )


def mount_share(
    cluster: ClusterAccess, request: MountRequest, *, install: bool, progress: Progress
) -> list[MountResult]:
    """Mount the share on the nodes for the profile's user, as a job of theirs whose start has hpcjob's
    execution filter mount it (with `install`, the filter is installed first, as root: an HPC
    administrator's job); a node where the user's account was made only by that job is mounted again.
    Each node's result."""
    from hpcjob.job.plan import mount_step
    from hpcjob.job.render import JobShape
    from hpcjob.job.render.text import filter_install_command
    from hpcjob.node.mount_filter import NO_ACCOUNT_YET

    backend, allowed, group = cluster.backend, request.allowed, request.group
    nodes = request.nodes or tuple(n.name for n in backend.nodes(group) if n.usable)
    if not nodes:
        raise SpecError(f"no online, healthy node {f'in group {group}' if group else 'in the cluster'}")
    # Named nodes are the job's candidates themselves: a group would narrow them (its default Intersect
    # keeps out a named node of another group, a CPU data node's), so the job names none.
    kept_to = None if request.nodes else group
    shape = JobShape(nodes, kept_to, None, None)
    if install:
        command = filter_install_command([allowed], request.containers, request.local_disks)
        ok, said = backend.install_filter(command, shape, progress)
        for line in said.splitlines():
            progress(line)
        if not ok:
            raise HpcjobError(
                "installing hpcjob's execution filter failed on some node (see above): it needs an HPC "
                "administrator"
            )
        progress(prepare_share(cluster, allowed.unc))
    # The job's name is unique: a lost answer is recovered by looking the job up by name.
    step = mount_step(allowed.unc, request.point, allowed.options, nodes)
    results = backend.mount(new_run_id("mount"), step, shape, progress)
    # A user's first job on a node makes their account there, after the filter ran: mount again there.
    new = tuple(r.node for r in results if NO_ACCOUNT_YET in r.message)
    if new:
        progress(f"your account was made just now on {', '.join(new)}: mounting there again")
        step = mount_step(allowed.unc, request.point, allowed.options, new)
        again = backend.mount(new_run_id("mount"), step, JobShape(new, kept_to), progress)
        retried = {r.node.upper(): r for r in again}
        results = [retried.get(r.node.upper(), r) for r in results]
    return results
