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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.azure.data import ARM_DIR, ARM_PACKAGE, size_table
from hpcjob.job.spec import SpecError
from hpcjob.runner import ClusterAccess, HpcjobWarning, Progress

if TYPE_CHECKING:
    from hpcjob.azure.template import AzCommands, DeletedVault, OnboardRequest, Secrets, SizeTable
    from hpcjob.checks.cluster import Checkup
    from hpcjob.job.results import MountResult
    from hpcjob.store.config import ClusterProfile

PASSWORD_ENV = (
    "HPCJOB_ADMIN_PASSWORD"  # as hpcjob.store.config names them (kept out of the tasks' environment)
)
KEY_ENV = "HPCJOB_AUTH_KEY"


@dataclass(frozen=True)
class OnboardOptions:
    """How to onboard: `what_if`, Azure's preview instead of a deployment; `print_only`, the parameters
    file and the az commands, and nothing run; `check`, mount and doctor once deployed."""

    out_dir: Path | None = None
    template_file: Path | None = None
    password_env: str = PASSWORD_ENV
    key_env: str = KEY_ENV
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


def parameters_text(parameters: Mapping[str, Any]) -> str:
    import jinja2

    from hpcjob.azure.template import TEMPLATE_URL

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(ARM_PACKAGE, ARM_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    text = environment.get_template("parameters.json.j2").render(
        parameters=parameters, template_url=TEMPLATE_URL
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
    )
    if not options.key_from_env:
        _keep_key(request.name, secret.authentication_key)
    path = save_profile(profile, options.make_default)
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
