"""`hpcjob cluster onboard`'s steps: check the request against the pinned ARM template and in Azure
(logged in, the size offered, the quotas, the resource group, a soft-deleted vault in the way), write
the parameters file, deploy, write the profile, then mount the share and run the doctor's checks. The
request's and the template's rules are hpcjob.azure.template's (pure); this module does the asking. It prints
nothing: progress goes to a callback, warnings are HpcjobWarning, and what it must ask a person it asks
through the callbacks it is given."""

from __future__ import annotations

import json
import os
import secrets
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.azure.data import ARM_DIR, ARM_PACKAGE
from hpcjob.job.sizes import size_table
from hpcjob.job.spec import SpecError
from hpcjob.runner import ClusterAccess, HpcjobWarning, Progress
from hpcjob.store.credentials import ADMIN_PASSWORD_ENV, AUTH_KEY_ENV
from hpcjob.store.power import NodeKind

if TYPE_CHECKING:
    from hpcjob.azure.template import (
        AzCommands,
        DeletedVault,
        GrowCommands,
        GrowRequest,
        OnboardRequest,
        Secrets,
    )
    from hpcjob.checks.cluster import Checkup
    from hpcjob.job.results import MountResult
    from hpcjob.job.sizes import SizeTable
    from hpcjob.store.config import ClusterProfile


@dataclass(frozen=True)
class OnboardOptions:
    """How to onboard: `what_if`, Azure's preview instead of a deployment; `print_only`, the parameters
    file and the az commands, and nothing run; `check`, mount and doctor once deployed."""

    out_dir: Path | None = None
    template_file: Path | None = None
    password_env: str = ADMIN_PASSWORD_ENV
    key_env: str = AUTH_KEY_ENV
    what_if: bool = False
    purge_deleted_vault: bool = False
    print_only: bool = False
    check: bool = True
    poll_interval_s: float = 15.0
    make_default: bool = False

    @property
    def key_from_env(self) -> bool:
        """Whether the nodes' key is the user's own (its variable set), not one hpcjob makes."""
        return bool(os.environ.get(self.key_env))


@dataclass
class Onboarded:
    """What onboarding did: the parameters file and the az commands; Azure's `preview` (what-if); the new
    cluster's `profile`, and once checked, its `mounts` and `checkup` (a step that failed: in `failed`,
    with the command to run it again)."""

    parameters_file: Path
    commands: AzCommands
    preview: str | None = None
    profile: ClusterProfile | None = None
    mounts: list[MountResult] = field(default_factory=list)
    checkup: Checkup | None = None
    failed: list[str] = field(default_factory=list)


def parameters_text(
    parameters: Mapping[str, Any],
    template_url: str | None = None,
    generator: str = "hpcjob cluster onboard",
    secrets: tuple[str, ...] = ("adminPassword", "authenticationKey"),
) -> str:
    """A deployment parameters file of `parameters` for the template at `template_url` (default: the
    cluster's), naming the secrets that are not in it."""
    import jinja2

    from hpcjob.azure.template import TEMPLATE_URL

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(ARM_PACKAGE, ARM_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    text = environment.get_template("parameters.json.j2").render(
        parameters=parameters,
        template_url=template_url or TEMPLATE_URL,
        generator=generator,
        secrets=f"{' and '.join(secrets)} are not here: hpcjob hands them to az on its standard input",
    )
    json.loads(text)  # a template that stops making JSON is caught here, not by az
    return text + "\n"


def onboard(
    request: OnboardRequest,
    options: OnboardOptions,
    *,
    ask_password: Callable[[], str] | None,
    confirm_purge: Callable[[str], None] | None,
    progress: Progress,
) -> Onboarded:
    """Onboard the cluster `request` asks for. `ask_password`: the admin password when its variable is
    not set (None: nobody to ask); `confirm_purge(why)`: raises unless a person agrees to purge a
    soft-deleted vault (None: nobody to ask, --purge-deleted-vault is needed)."""
    from hpcjob.azure.az import load_template, run_az
    from hpcjob.azure.template import (
        TEMPLATE_SHA256,
        az_commands,
        check_parameters,
        check_request,
        check_secrets,
        fabric_warning,
        hourly_cost,
        offered_family,
        quota_problems,
        template_parameters,
        vaults_in_the_way,
    )

    table = size_table()
    parameters = template_parameters(request, table)
    template = load_template(options.template_file, TEMPLATE_SHA256)
    hidden = {"adminPassword": "x" * 12, "authenticationKey": "x"}  # names and types; values come later
    # The request's own words win where both see a problem with the same parameter.
    problems = {**check_parameters({**parameters, **hidden}, template), **check_request(request, table)}
    if problems:
        raise SpecError("\nhpcjob: error: ".join(problems.values()))
    folder = (options.out_dir or Path(f"hpcjob-onboard-{request.name}")).absolute()
    done = Onboarded(folder / "parameters.json", az_commands(request, str(folder / "parameters.json")))
    commands = done.commands
    from_env = options.password_env in os.environ
    secret = None if options.print_only else _secrets(options, ask_password)  # nothing runs: none needed
    in_the_way: list[DeletedVault] = []
    group_exists = False
    if secret is not None:
        if bad := check_secrets(secret):
            raise SpecError(bad[0])
        account = run_az(commands.account)  # logged in, or az says so in one line
        progress(f"hpcjob: checking {request.vm_size} and the vCPU quotas in {request.location}")
        family = offered_family(request, run_az(commands.skus) or [])
        if family is None:
            raise SpecError(
                f"{request.vm_size} is not offered to this subscription in {request.location} (az vm "
                "list-skus): choose another region or size, or ask Azure support to enable it"
            )
        if quotas := quota_problems(request, table, run_az(commands.usage) or [], family):
            raise SpecError("\nhpcjob: error: ".join(quotas))
        group_exists = bool(run_az(commands.group_exists))
        if group_exists and _deleting(run_az(commands.group_show)):
            raise SpecError(
                f"resource group {request.resource_group} is still being deleted: wait for it (az group "
                f"wait --deleted --name {request.resource_group}), then onboard again"
            )
        deleted = run_az(commands.deleted_vaults) or []
        in_the_way = vaults_in_the_way(request, str(account.get("id", "")), deleted)
        if in_the_way and options.what_if:  # Azure's preview does not see it: say it here
            names = ", ".join(vault.name for vault in in_the_way)
            _warn(
                f"the deployment itself would need the soft-deleted Key Vault {names} purged first "
                "(--purge-deleted-vault)"
            )
        elif in_the_way and not options.purge_deleted_vault:
            _consent_to_purge(request.resource_group, in_the_way, confirm_purge)

    folder.mkdir(parents=True, exist_ok=True)
    done.parameters_file.write_text(parameters_text(parameters), encoding="utf-8")
    progress(f"hpcjob: parameters (no secrets) in {done.parameters_file}")
    progress(f"hpcjob: {request.nodes} x {request.vm_size}: {hourly_cost(request, table)}")
    slow = fabric_warning(request, table)
    if slow is not None:
        _warn(slow)
    if secret is None:
        return done
    secrets_json = json.dumps(secret.parameters())
    if options.what_if:
        done.preview = _what_if(
            request, commands, secrets_json, make_group=not group_exists, progress=progress
        )
        return done
    for vault in in_the_way:
        progress(f"hpcjob: purging the deleted Key Vault {vault.name} (a few minutes)")
        run_az(commands.purge(vault))
    dns = _deploy(request, commands, secrets_json, options.poll_interval_s, progress)
    if request.identity:
        _assign_identity(request, commands, progress)
    done.profile = _write_profile(
        request, table, commands, dns, options.password_env if from_env else None, secret, options, progress
    )
    if options.check:
        _check(done, progress)
    return done


def _warn(message: str) -> None:
    warnings.warn(message, HpcjobWarning, stacklevel=3)


def _secrets(options: OnboardOptions, ask_password: Callable[[], str] | None) -> Secrets:
    """The admin password (the variable, else asked for) and the nodes' key (the variable, else new)."""
    from hpcjob.azure.template import Secrets

    password = os.environ.get(options.password_env)
    if password is None:
        if ask_password is None:
            raise SpecError(f"no terminal to ask for the admin password: set {options.password_env}")
        password = ask_password()
    return Secrets(password, os.environ.get(options.key_env) or secrets.token_hex(32))


def _deleting(group: Any) -> bool:
    """Whether `az group show` says the group is on its way out (an earlier `cluster delete`)."""
    return isinstance(group, dict) and (group.get("properties") or {}).get("provisioningState") == "Deleting"


def _consent_to_purge(
    resource_group: str, vaults: list[DeletedVault], confirm: Callable[[str], None] | None
) -> None:
    """A soft-deleted vault of an earlier cluster would make the deployment fail after minutes: purge it
    only with the user's word (the flag, or a person's yes)."""
    names = ", ".join(f"{v.name} (kept until {v.purge_date or 'its purge date'})" for v in vaults)
    said = (
        f"the Key Vault of an earlier cluster in resource group {resource_group} is soft-deleted, and the "
        f"template makes one of the same name: {names}"
    )
    if confirm is None:
        raise SpecError(f"{said}; purge it with --purge-deleted-vault, or choose another resource group")
    confirm(said)


def _what_if(
    request: OnboardRequest, commands: AzCommands, secrets_json: str, *, make_group: bool, progress: Progress
) -> str:
    """Azure's own preview. It needs the resource group to exist: one that does not yet is made for it,
    empty and free, and deleted after it, so that nothing is left behind."""
    from hpcjob.azure.az import run_az, run_az_text
    from hpcjob.azure.template import delete_command

    if make_group:
        progress(
            f"hpcjob: resource group {request.resource_group} does not exist yet: made for the preview, "
            "deleted after it"
        )
        run_az(commands.group)
    try:
        return run_az_text(commands.what_if, secrets_json).rstrip()
    finally:
        if make_group:
            run_az(delete_command(request.resource_group, wait=True))


def _deploy(
    request: OnboardRequest, commands: AzCommands, secrets_json: str, poll_s: float, progress: Progress
) -> str:
    """Create the resource group and deploy into it; the head node's public name."""
    from hpcjob.azure.az import AzError, deploy, run_az
    from hpcjob.azure.template import cluster_dns_name

    progress(f"hpcjob: resource group {request.resource_group} in {request.location}")
    run_az(commands.group)
    progress(f"hpcjob: deploying {request.deployment} (tens of minutes; each resource as it finishes)")
    dns = cluster_dns_name(
        deploy(commands, secrets_json, lambda line: progress(f"hpcjob: {line}"), poll_s=poll_s)
    )
    if not dns:
        raise AzError(
            f"the deployment {request.deployment} succeeded but names no head node (clusterDNSName)"
        )
    return dns


def _assign_identity(request: OnboardRequest, commands: AzCommands, progress: Progress) -> None:
    """The user-assigned identity given to each node VM, so that their tasks read Blob Storage with it
    (azure-identity's ManagedIdentityCredential; the identity needs a data role on the account, such as
    Storage Blob Data Reader, which an owner of the account grants)."""
    from hpcjob.azure.az import run_az

    assert request.identity is not None
    name = request.identity.rsplit("/", 1)[-1]
    progress(f"hpcjob: giving the {request.nodes} node(s) the managed identity {name}")
    for vm in request.node_names:
        run_az(commands.assign_identity(request.resource_group, vm, request.identity))


def _write_profile(
    request: OnboardRequest,
    table: SizeTable,
    commands: AzCommands,
    dns: str,
    password_env: str | None,
    secret: Secrets,
    options: OnboardOptions,
    progress: Progress,
) -> ClusterProfile:
    """The new cluster's profile: the REST API at the head node's public name, its certificate pinned by
    the thumbprint the deployment gives, the admin's password where it came from, one process per GPU of
    the size, and the size (its NCCL settings) and region (its price)."""
    from hpcjob.azure.az import AzError, run_az
    from hpcjob.azure.template import CERTIFICATE_DEPLOYMENT, NODE_GROUP, SHARE, certificate_thumbprint
    from hpcjob.store.config import KEYRING_SERVICE, ClusterProfile, save_profile
    from hpcjob.store.power import RUNNING, PowerRecord, keep_power_record, now_utc

    try:
        thumbprint = certificate_thumbprint(run_az(commands.certificate) or {})
    except AzError:
        thumbprint = None
    if thumbprint is None:
        _warn(
            f"the deployment {CERTIFICATE_DEPLOYMENT} names no certificate thumbprint: pin the head node's "
            f"certificate with `hpcjob cluster add {request.name} ... --cert-fingerprint`"
        )
    password = f"env:{password_env}" if password_env else "prompt"
    if password_env is None:
        try:
            import keyring

            keyring.set_password(
                KEYRING_SERVICE, f"{request.name}:{request.name}\\{request.admin_user}", secret.admin_password
            )
            password = "keyring"
        except Exception:  # no keyring package or no backend: asked for when needed
            pass
    profile = ClusterProfile(
        name=request.name,
        url=f"https://{dns}",
        user=f"{request.name}\\{request.admin_user}",  # a local account of the head node (no AD)
        password=password,
        cert_fingerprint=thumbprint,
        share=SHARE.format(name=request.name.upper()),
        smb_server=dns,
        node_group=NODE_GROUP,
        gpus_per_node=table.sizes[request.vm_size].gpus,
        resource_group=request.resource_group,
        vm_size=request.vm_size,
        region=request.location,  # with the size, the price runs are counted at
        spot=request.spot,  # useSpotInstanceForComputeNodes: Spot nodes are counted at the Spot price
        identity=request.identity,  # what `cluster grow` gives its new nodes too
    )
    if not options.key_from_env:
        _keep_key(request.name, secret.authentication_key)
    path = save_profile(profile, options.make_default)
    # `cluster list` then says its state and cost an hour from the start, as `cluster start` would.
    keep_power_record(
        PowerRecord(
            cluster=request.name,
            resource_group=request.resource_group,
            state=RUNNING,
            as_of=now_utc(),
            nodes=(NodeKind(request.vm_size, request.spot, request.nodes),),
            head_size=request.head_node_size or table.head_node_size,
            region=request.location,
        )
    )
    progress(f"hpcjob: cluster {request.name} saved in {path} (nodes {', '.join(request.node_names)})")
    return profile


def _key_entry(cluster: str) -> str:
    """The keyring entry (service hpcjob.store.config.KEYRING_SERVICE) of a cluster's nodes' key."""
    return f"{cluster}:authenticationKey"


def _keep_key(cluster: str, key: str) -> None:
    """Keep the nodes' authentication key that hpcjob made in the system keyring: nodes added later
    (`cluster grow`) need the same key as the head node, which keeps it in its registry
    (ClusterAuthenticationKey); without a keyring, say that it is kept nowhere."""
    from hpcjob.store.config import KEYRING_SERVICE

    try:
        import keyring

        keyring.set_password(KEYRING_SERVICE, _key_entry(cluster), key)
    except Exception:  # no keyring package or no backend
        _warn(
            f"the nodes' authentication key hpcjob made for cluster {cluster} is kept nowhere (no system "
            "keyring): `hpcjob cluster grow` cannot add nodes to it; onboard with HPCJOB_AUTH_KEY set to "
            "keep the key yourself"
        )


def _check(done: Onboarded, progress: Progress) -> None:
    """`hpcjob mount --install`, then `hpcjob doctor`, on the new cluster. A step that fails goes in
    `done.failed` with the command to run it again: the cluster exists whatever they find."""
    from hpcjob.checks.cluster import checkup
    from hpcjob.runner import mount_request, mount_share

    profile = done.profile
    assert profile is not None

    access: list[ClusterAccess] = []  # opened once, for both: a password asked for is asked once

    def cluster() -> ClusterAccess:
        if not access:
            access.append(ClusterAccess(profile.name))
        return access[0]

    def mount() -> str | None:
        request = mount_request(profile, None, None, None, None, ())
        done.mounts = mount_share(cluster(), request, install=True, progress=progress)
        return None if all(r.ok for r in done.mounts) else "a node failed"

    def doctor() -> str | None:
        done.checkup = checkup(cluster(), progress=progress)
        return "a check failed" if done.checkup.failed else None

    for command, step in (("mount --install", mount), ("doctor", doctor)):
        try:
            why = step()
        except Exception as exc:  # whatever went wrong, the deployment stands
            why = " ".join(str(exc).split())
        if why is not None:
            done.failed.append(f"`hpcjob {command} --cluster {profile.name}` failed ({why}); run it again")


@dataclass(frozen=True)
class GrowOptions:
    """How to grow: `print_only`, the parameters file and the az commands, and nothing asked or run;
    `online_timeout_s`, how long to wait for the head node to see the new nodes online; `check`, install
    hpcjob's execution filter on them and mount the share (`hpcjob mount --install`) once they are."""

    out_dir: Path | None = None
    key_env: str = AUTH_KEY_ENV
    print_only: bool = False
    check: bool = True
    poll_interval_s: float = 15.0
    online_timeout_s: float = 1800.0


@dataclass
class Grown:
    """What growing did: the parameters file and the az commands; the new nodes (`nodes`), those the
    head node sees online, and once checked, their `mounts` (a step that failed: in `failed`)."""

    parameters_file: Path
    commands: GrowCommands
    request: GrowRequest
    nodes: list[str] = field(default_factory=list)
    online: list[str] = field(default_factory=list)
    mounts: list[MountResult] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def grow(
    cluster: str | None,
    count: int,
    options: GrowOptions,
    *,
    vm_size: str | None = None,
    spot: bool = False,
    image: str | None = None,
    node_prefix: str | None = None,
    data: bool = False,
    progress: Progress,
) -> Grown:
    """Add `count` compute nodes to `cluster` (a profile hpcjob onboarded: it knows the resource group)
    with the template's add-nodes template (Spot VMs when `spot`), named after every node that exists
    (the VMs in the resource group and the nodes the head node knows), then wait until the head node sees
    them online. `data`: CPU data nodes (`--data-nodes`) of a CPU size `vm_size`, put in the profile's
    data_node_group (CPUNodes where it names none), which the profile then names with their size."""
    import time

    from hpcjob.azure.az import AzError, deploy, load_template, run_az
    from hpcjob.azure.template import (
        ADD_NODES_PATH,
        ADD_NODES_SECRETS,
        ADD_NODES_SHA256,
        ADD_NODES_URL,
        DEFAULT_IMAGE,
        DEFAULT_PREFIX,
        GrowRequest,
        Secrets,
        check_grow,
        check_parameters,
        check_secrets,
        grow_commands,
        grow_parameters,
        next_start_index,
        node_quota_problems,
        offered_family,
        vm_names,
    )
    from hpcjob.store.config import get_profile

    profile = get_profile(cluster)
    if profile.resource_group is None:
        raise SpecError(
            f"cluster {profile.name} was not made by `hpcjob cluster onboard`: hpcjob adds nodes only to the "
            "clusters it onboarded (their profile knows the resource group)"
        )
    size = vm_size or (profile.data_vm_size if data else profile.vm_size)
    if size is None or profile.region is None:
        missing = " and ".join(k for k, v in (("vm_size", size), ("region", profile.region)) if v is None)
        raise SpecError(
            f"cluster {profile.name}'s profile names no {missing}: give them to `hpcjob cluster add`"
        )
    request = GrowRequest(
        cluster=profile.name,
        resource_group=profile.resource_group,
        location=profile.region,
        vm_size=size,
        nodes=count,
        admin_user=profile.user.rpartition("\\")[2],  # onboarding's NAME\\<admin user>
        spot=spot,
        image=image or DEFAULT_IMAGE,
        node_prefix=node_prefix or (DATA_PREFIX if data else DEFAULT_PREFIX),
        data=data,
        identity=profile.identity,  # onboarding's: the new nodes read Blob datasets as the others do
    )
    table = size_table()
    parameters = grow_parameters(request)
    template = load_template(None, ADD_NODES_SHA256, ADD_NODES_PATH.rsplit("/", 1)[-1])
    # Names and types of what the command line and stdin add; their values come later.
    later = {"computeNodeNameStartIndex": 0, "adminPasswordOrKey": "x", "authenticationKey": "x"}
    problems = {**check_parameters({**parameters, **later}, template), **check_grow(request, table)}
    if problems:
        raise SpecError("\nhpcjob: error: ".join(problems.values()))
    folder = (options.out_dir or Path(f"hpcjob-grow-{profile.name}")).absolute()
    parameters_file = folder / "parameters.json"
    deployment = request.deployment(time.strftime("%Y%m%d-%H%M%S"))
    if options.print_only:
        done = Grown(parameters_file, grow_commands(request, str(parameters_file), deployment, None), request)
        _write_grow_parameters(done, parameters, ADD_NODES_URL, ADD_NODES_SECRETS, table, progress)
        return done

    key = _cluster_key(profile.name, options.key_env)
    access = ClusterAccess(profile.name)  # the admin's password: the profile's user is the admin
    if bad := check_secrets(Secrets(access.password, key)):
        raise SpecError(f"{bad[0]}: the profile's password is not one the new nodes' admin may have")
    commands = grow_commands(request, str(parameters_file), deployment, None)
    run_az(commands.account)  # logged in, or az says so in one line
    progress(
        f"hpcjob: the VMs of resource group {request.resource_group}, and {request.vm_size} in "
        f"{request.location}"
    )
    names = vm_names(run_az(commands.vm_list) or [])
    if request.cluster.casefold() not in {name.casefold() for name in names}:
        raise AzError(
            f"resource group {request.resource_group} has no VM {request.cluster}, the head node that the "
            "new nodes join: was it deleted?"
        )
    family = offered_family(request, run_az(commands.skus) or [])
    if family is None:
        raise SpecError(
            f"{request.vm_size} is not offered to this subscription in {request.location} (az vm list-skus): "
            "choose another size"
        )
    usage = run_az(commands.usage) or []
    if quotas := node_quota_problems(request.location, request.vm_size, count, spot, table, usage, family):
        raise SpecError("\nhpcjob: error: ".join(quotas))
    known = [node.name for node in access.backend.nodes(None)]
    start = next_start_index(request.node_prefix, [*names, *known])
    done = Grown(parameters_file, grow_commands(request, str(parameters_file), deployment, start), request)
    done.nodes = request.node_names(start)
    _write_grow_parameters(done, parameters, ADD_NODES_URL, ADD_NODES_SECRETS, table, progress)
    if not data and (request.vm_size, spot) != (profile.vm_size, bool(profile.spot)):
        _warn(
            f"the new nodes are {request.vm_size}{', Spot' if spot else ''} and cluster {profile.name}'s "
            f"profile says {profile.vm_size}{', Spot' if profile.spot else ''}: runs on them are counted at "
            "the profile's price"
        )
    secrets_json = json.dumps(
        {"adminPasswordOrKey": {"value": access.password}, "authenticationKey": {"value": key}}
    )
    progress(
        f"hpcjob: deploying {deployment}: {', '.join(done.nodes)} (minutes; each resource as it finishes)"
    )
    deploy(
        done.commands, secrets_json, lambda line: progress(f"hpcjob: {line}"), poll_s=options.poll_interval_s
    )
    _count_grown(profile.name, request.resource_group, NodeKind(request.vm_size, spot, len(done.nodes)))
    done.online = _wait_online(access, done.nodes, options, progress)
    if data:
        _make_data_nodes(access, request.vm_size, done.online, progress)
    if options.check:
        _mount_new(access, done, progress)
    return done


def _make_data_nodes(access: ClusterAccess, vm_size: str, nodes: list[str], progress: Progress) -> None:
    """The new CPU nodes in the data nodes' group (made where the cluster has none), and the profile
    naming the group and their size: `--data-nodes` chooses from it, a run's cost counts them at it.
    A node that did not join is an error naming it (the backend reads the members back); the profile
    names the group all the same where some did, as they are data nodes."""
    from hpcjob.backends.scheduler import GroupJoinError
    from hpcjob.store.config import get_profile, save_profile

    group = access.profile.data_node_group or DATA_GROUP
    partly: GroupJoinError | None = None
    try:
        members = access.backend.add_to_group(group, nodes)
        progress(f"hpcjob: node group {group} now holds {', '.join(members)}")
    except GroupJoinError as failed:
        if not failed.joined:
            raise
        partly = failed
    saved = get_profile(access.profile.name)  # as the file has it, not as this session filled it in
    save_profile(replace(saved, data_node_group=group, data_vm_size=vm_size))
    if partly is not None:
        raise partly


# The data nodes' group and their names' prefix, where the profile names none (`cluster grow --data`).
DATA_GROUP = "CPUNodes"
DATA_PREFIX = "IaaSCpuDN"


def _count_grown(cluster: str, resource_group: str, grown: NodeKind) -> None:
    """The new VMs counted in the cluster's record (`cluster list`'s cost an hour), once deployed: they
    cost from then on. A stopped cluster's record is left for `cluster start` to count again."""
    from hpcjob.store.power import RUNNING, keep_power_record, now_utc, power_record

    before = power_record(cluster, resource_group)
    if before is None or before.state != RUNNING:
        return
    kinds = {(kind.size, kind.spot): kind.count for kind in before.nodes}
    kinds[(grown.size, grown.spot)] = kinds.get((grown.size, grown.spot), 0) + grown.count
    nodes = tuple(NodeKind(size, spot, count) for (size, spot), count in sorted(kinds.items()))
    keep_power_record(replace(before, as_of=now_utc(), nodes=nodes))


def _write_grow_parameters(
    done: Grown,
    parameters: Mapping[str, Any],
    template_url: str,
    secret_names: tuple[str, ...],
    table: SizeTable,
    progress: Progress,
) -> None:
    request = done.request
    done.parameters_file.parent.mkdir(parents=True, exist_ok=True)
    done.parameters_file.write_text(
        parameters_text(parameters, template_url, "hpcjob cluster grow", secret_names), encoding="utf-8"
    )
    progress(f"hpcjob: parameters (no secrets) in {done.parameters_file}")
    from hpcjob.azure.template import grow_cost

    cost = grow_cost(request)  # hpcjob.store.prices's answer, without the network
    progress(f"hpcjob: {request.nodes} x {request.vm_size}{' (Spot)' if request.spot else ''}: {cost}")


def _cluster_key(cluster: str, variable: str) -> str:
    """The nodes' authentication key the cluster was onboarded with: its variable, else the keyring."""
    from hpcjob.store.config import KEYRING_SERVICE

    if os.environ.get(variable):
        return os.environ[variable]
    try:
        import keyring

        kept = keyring.get_password(KEYRING_SERVICE, _key_entry(cluster))
    except Exception:  # no keyring package or no backend
        kept = None
    if not kept:
        raise SpecError(
            f"the nodes' authentication key of cluster {cluster} is not known here: set {variable} to the "
            "key it was onboarded with (new nodes must have the head node's)"
        )
    return str(kept)


def _wait_online(
    access: ClusterAccess, names: list[str], options: GrowOptions, progress: Progress
) -> list[str]:
    """Wait until the head node sees every one of `names` online and healthy (their agents register once
    their VMs have started); each change said once. The names online; past the timeout, an error that
    says where each one is."""
    import time

    from hpcjob.job.spec import HpcjobError

    deadline = time.monotonic() + options.online_timeout_s
    said: dict[str, str] = {}
    while True:
        seen = {node.name.casefold(): node for node in access.backend.nodes(None)}
        where = {}
        for name in names:
            node = seen.get(name.casefold())
            where[name] = "not seen yet" if node is None else f"{node.state}, {node.health}"
            if said.get(name) != where[name]:
                said[name] = where[name]
                progress(f"hpcjob: {name}: {where[name]}")
        online = [name for name in names if (node := seen.get(name.casefold())) is not None and node.usable]
        if len(online) == len(names):
            return online
        if time.monotonic() >= deadline:
            waiting = ", ".join(f"{name} ({where[name]})" for name in names if name not in online)
            raise HpcjobError(
                f"the new VMs are there, and after {_took(options.online_timeout_s)} the head node sees "
                f"{len(online)} of {len(names)} online: {waiting}; look again with `hpcjob nodes "
                f"--cluster {access.profile.name}`"
            )
        time.sleep(min(options.poll_interval_s, max(deadline - time.monotonic(), 0.0)))


def _took(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} minutes" if minutes and not rest else f"{round(seconds)} seconds"


def _mount_new(access: ClusterAccess, done: Grown, progress: Progress) -> None:
    """`hpcjob mount --install` on the new nodes: a failure goes in `done.failed`, the nodes stay."""
    from hpcjob.runner import mount_request, mount_share

    try:
        request = mount_request(access.profile, None, None, None, None, done.online)
        done.mounts = mount_share(access, request, install=True, progress=progress)
        why = None if all(r.ok for r in done.mounts) else "a node failed"
    except Exception as exc:  # whatever went wrong, the nodes stand
        why = " ".join(str(exc).split())
    if why is not None:
        nodes = " ".join(f"--node {name}" for name in done.online)
        done.failed.append(
            f"`hpcjob mount --install --cluster {access.profile.name} {nodes}` failed ({why}); run it again"
        )
