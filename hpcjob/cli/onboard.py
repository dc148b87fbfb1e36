"""`hpcjob cluster onboard` (a new GPU cluster from HPC Pack's ARM template) and `hpcjob cluster delete`."""

from __future__ import annotations

import json
import os
import secrets
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcjob.cli.app import cluster

if TYPE_CHECKING:
    from hpcjob.config import ClusterProfile
    from hpcjob.onboard import AzCommands, DeletedVault, OnboardRequest, Secrets, SizeTable

# The size table and the parameters template: package data (hpcjob/arm/), so an installed hpcjob has them.
ARM_PACKAGE, ARM_DIR = "hpcjob", "arm"
PASSWORD_ENV = "HPCJOB_ADMIN_PASSWORD"  # as hpcjob.config names them (kept out of the tasks' environment)
KEY_ENV = "HPCJOB_AUTH_KEY"


@cluster.command("onboard")
@click.argument("name")
@click.option("--resource-group", required=True, metavar="RG", help="A new resource group for the cluster.")
@click.option("--location", required=True, metavar="REGION", help="Azure region, e.g. eastus.")
@click.option(
    "--vm-size", required=True, metavar="SIZE", help="GPU size of the nodes, e.g. Standard_NC24ads_A100_v4."
)
@click.option("--nodes", "node_count", required=True, type=int, help="Compute nodes (1 to 500).")
@click.option("--admin-user", default="hpcadmin", show_default=True, help="Administrator of every VM.")
@click.option("--image", default=None, metavar="IMAGE", help="Node image [default: Ubuntu_22.04_HPC_Gen2].")
@click.option(
    "--node-prefix", default=None, metavar="PREFIX", help="Node names' prefix [default: IaaSLnxCN]."
)
@click.option("--head-node-size", default=None, metavar="SIZE", help="[default: Standard_DS4_v2]")
@click.option(
    "--password-env",
    default=PASSWORD_ENV,
    show_default=True,
    metavar="VARIABLE",
    help="Read the admin password from this variable; prompted for when it is not set.",
)
@click.option(
    "--key-env",
    default=KEY_ENV,
    show_default=True,
    metavar="VARIABLE",
    help="Read the nodes' authentication key from this variable; generated when it is not set.",
)
@click.option(
    "--what-if",
    is_flag=True,
    help="Check, then show what Azure would create (az ... what-if; a resource group that does not exist "
    "yet is made for it and deleted after it).",
)
@click.option(
    "--purge-deleted-vault",
    is_flag=True,
    help="Purge the soft-deleted Key Vault of an earlier cluster in a resource group of the same name "
    "(asked for on a terminal): the template makes a vault of the same name.",
)
@click.option(
    "--print-only", is_flag=True, help="Check, write the parameters file and print the az commands."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the parameters file [default: ./hpcjob-onboard-NAME].",
)
@click.option(
    "--template",
    "template_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A local copy of the pinned template to check against (its SHA-256 must match).",
)
@click.option("--no-check", is_flag=True, help="Do not mount the share and run `hpcjob doctor` afterwards.")
@click.option(
    "--poll-interval", type=float, default=15.0, show_default=True, help="Seconds between progress polls."
)
@click.option("--default", "make_default", is_flag=True, help="Make the new cluster the default.")
def cluster_onboard(
    name: str,
    node_count: int,
    password_env: str,
    key_env: str,
    what_if: bool,
    purge_deleted_vault: bool,
    print_only: bool,
    out_dir: Path | None,
    template_file: Path | None,
    no_check: bool,
    poll_interval: float,
    make_default: bool,
    **options: Any,
) -> None:
    """Deploy a GPU cluster NAME from HPC Pack's ARM template ("Single head node cluster for Linux
    workloads", pinned to a commit), then write its profile, mount the share on its nodes and run
    `hpcjob doctor`.

    Everything is checked before anything is deployed. The admin password and the nodes' authentication
    key reach `az` on its standard input only. Needs the Azure CLI, logged in (`az login`), and Owner or
    User Access Administrator on the subscription (the template assigns roles).
    """
    from hpcjob.azure import load_template, run_az
    from hpcjob.onboard import (
        DEFAULT_IMAGE,
        DEFAULT_PREFIX,
        TEMPLATE_SHA256,
        TEMPLATE_URL,
        OnboardRequest,
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
    from hpcjob.spec import SpecError

    request = OnboardRequest(
        name=name,
        resource_group=options["resource_group"],
        location=options["location"],
        vm_size=options["vm_size"],
        nodes=node_count,
        admin_user=options["admin_user"],
        image=options["image"] or DEFAULT_IMAGE,
        node_prefix=options["node_prefix"] or DEFAULT_PREFIX,
        head_node_size=options["head_node_size"],
    )
    table = _size_table()
    parameters = template_parameters(request, table)
    template = load_template(template_file, TEMPLATE_URL, TEMPLATE_SHA256)
    hidden = {"adminPassword": "x" * 12, "authenticationKey": "x"}  # names and types; values come later
    # The request's own words win where both see a problem with the same parameter.
    problems = {**check_parameters({**parameters, **hidden}, template), **check_request(request, table)}
    if problems:
        raise SpecError("\nhpcjob: error: ".join(problems.values()))
    folder = (out_dir or Path(f"hpcjob-onboard-{name}")).absolute()
    parameters_file = folder / "parameters.json"
    commands = az_commands(request, str(parameters_file))
    from_env = password_env in os.environ
    secret = _secrets(password_env, key_env, print_only)
    if secret is not None:
        if bad := check_secrets(secret):
            raise SpecError(bad[0])
        account = run_az(commands.account)  # logged in, or az says so in one line
        click.echo(f"hpcjob: checking {request.vm_size} and the vCPU quotas in {request.location}", err=True)
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
        if in_the_way and what_if:  # Azure's preview does not see it: say it here
            names = ", ".join(vault.name for vault in in_the_way)
            click.echo(
                f"hpcjob: warning: the deployment itself would need the soft-deleted Key Vault {names} "
                "purged first (--purge-deleted-vault)",
                err=True,
            )
        elif in_the_way:
            _consent_to_purge(request.resource_group, in_the_way, purge_deleted_vault)

    folder.mkdir(parents=True, exist_ok=True)
    parameters_file.write_text(_parameters_text(parameters), encoding="utf-8")
    click.echo(f"hpcjob: parameters (no secrets) in {parameters_file}", err=True)
    click.echo(f"hpcjob: {request.nodes} x {request.vm_size}: {hourly_cost(request, table)}", err=True)
    slow = fabric_warning(request, table)
    if slow is not None:
        click.echo(f"hpcjob: warning: {slow}", err=True)
    if print_only:
        for argv in (commands.group, commands.deploy):
            click.echo(" ".join(argv))
        click.echo(
            "# the deploy command reads the secrets on its standard input, as JSON: "
            '{"adminPassword": {"value": "..."}, "authenticationKey": {"value": "..."}}'
        )
        return
    assert secret is not None
    secrets_json = json.dumps(secret.parameters())
    if what_if:
        _what_if(request, commands, secrets_json, make_group=not group_exists)
        return
    for vault in in_the_way:
        click.echo(f"hpcjob: purging the deleted Key Vault {vault.name} (a few minutes)", err=True)
        run_az(commands.purge(vault))
    dns = _deploy(request, commands, secrets_json, poll_interval)
    profile = _write_profile(
        request, table, commands, dns, password_env if from_env else None, secret, make_default
    )
    if not no_check:
        _check(profile)
    click.echo(f"cluster {name} is ready: next, `hpcjob nodes --cluster {name}`, then `hpcjob submit ...`")


def _size_table() -> SizeTable:
    from hpcjob.onboard import SizeTable

    sizes = resources.files(ARM_PACKAGE) / ARM_DIR / "sizes.json"
    return SizeTable.from_data(json.loads(sizes.read_text(encoding="utf-8")))


def _parameters_text(parameters: dict[str, Any]) -> str:
    import jinja2

    from hpcjob.onboard import TEMPLATE_URL

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


def _secrets(password_env: str, key_env: str, print_only: bool) -> Secrets | None:
    """The admin password (the variable, else a prompt) and the nodes' key (the variable, else new)."""
    from hpcjob.onboard import Secrets
    from hpcjob.spec import SpecError

    if print_only:
        return None  # nothing runs: no secret is needed
    password = os.environ.get(password_env)
    if password is None:
        if not sys.stdin.isatty():
            raise SpecError(f"no terminal to ask for the admin password: set {password_env}")
        password = click.prompt(
            "Admin password for the new cluster", hide_input=True, confirmation_prompt=True
        )
    return Secrets(password, os.environ.get(key_env) or secrets.token_hex(32))


def _deleting(group: Any) -> bool:
    """Whether `az group show` says the group is on its way out (an earlier `cluster delete`)."""
    return isinstance(group, dict) and (group.get("properties") or {}).get("provisioningState") == "Deleting"


def _consent_to_purge(resource_group: str, vaults: list[DeletedVault], given: bool) -> None:
    """A soft-deleted vault of an earlier cluster would make the deployment fail after minutes: purge it
    only with the user's word (the flag, or yes on a terminal)."""
    from hpcjob.spec import SpecError

    names = ", ".join(f"{v.name} (kept until {v.purge_date or 'its purge date'})" for v in vaults)
    said = (
        f"the Key Vault of an earlier cluster in resource group {resource_group} is soft-deleted, and the "
        f"template makes one of the same name: {names}"
    )
    if given:
        return
    if not sys.stdin.isatty():
        raise SpecError(f"{said}; purge it with --purge-deleted-vault, or choose another resource group")
    click.echo(f"hpcjob: {said}", err=True)
    click.confirm("Purge it for good (its keys and certificates cannot be recovered after)?", abort=True)


def _what_if(request: OnboardRequest, commands: AzCommands, secrets_json: str, *, make_group: bool) -> None:
    """Azure's own preview. It needs the resource group to exist: one that does not yet is made for it,
    empty and free, and deleted after it, so that nothing is left behind."""
    from hpcjob.azure import run_az, run_az_text
    from hpcjob.onboard import delete_command

    if make_group:
        click.echo(
            f"hpcjob: resource group {request.resource_group} does not exist yet: made for the preview, "
            "deleted after it",
            err=True,
        )
        run_az(commands.group)
    try:
        click.echo(run_az_text(commands.what_if, secrets_json).rstrip())
    finally:
        if make_group:
            run_az(delete_command(request.resource_group, wait=True))


def _deploy(request: OnboardRequest, commands: AzCommands, secrets_json: str, poll_interval: float) -> str:
    """Create the resource group and deploy into it; the head node's public name."""
    from hpcjob.azure import AzError, deploy, run_az
    from hpcjob.onboard import cluster_dns_name

    def progress(line: str) -> None:
        click.echo(f"hpcjob: {line}", err=True)

    progress(f"resource group {request.resource_group} in {request.location}")
    run_az(commands.group)
    progress(f"deploying {request.deployment} (tens of minutes; each resource as it finishes)")
    dns = cluster_dns_name(deploy(commands, secrets_json, progress, poll_s=poll_interval))
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
    make_default: bool,
) -> ClusterProfile:
    """The new cluster's profile: the REST API at the head node's public name, its certificate pinned by
    the thumbprint the deployment gives, the admin's password where it came from, one process per GPU of
    the size."""
    from hpcjob.azure import AzError, run_az
    from hpcjob.config import KEYRING_SERVICE, ClusterProfile, save_profile
    from hpcjob.onboard import CERTIFICATE_DEPLOYMENT, NODE_GROUP, SHARE, certificate_thumbprint

    try:
        thumbprint = certificate_thumbprint(run_az(commands.certificate) or {})
    except AzError:
        thumbprint = None
    if thumbprint is None:
        click.echo(
            f"hpcjob: warning: the deployment {CERTIFICATE_DEPLOYMENT} names no certificate thumbprint: pin "
            f"the head node's certificate with `hpcjob cluster add {request.name} ... --cert-fingerprint`",
            err=True,
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
    )
    path = save_profile(profile, make_default)
    click.echo(
        f"hpcjob: cluster {request.name} saved in {path} (nodes {', '.join(request.node_names)})", err=True
    )
    return profile


def _check(profile: ClusterProfile) -> None:
    """`hpcjob mount --install`, then `hpcjob doctor`, on the new cluster; a failure is a warning (the
    cluster exists), with the command to run again."""
    from hpcjob.cli.app import cli

    for step in (["mount", "--install"], ["doctor"]):
        command = [*step, "--cluster", profile.name]
        try:
            cli.main(command, prog_name="hpcjob", standalone_mode=False)
            continue
        except SystemExit as exc:  # doctor's verdict: it has printed every check
            failed, why = bool(exc.code), "a check failed"
        except Exception as exc:  # whatever went wrong, the deployment stands
            failed, why = True, " ".join(str(exc).split())
        if failed:
            click.echo(
                f"hpcjob: warning: `hpcjob {' '.join(command)}` failed ({why}); run it again", err=True
            )


@cluster.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cluster_delete(name: str, yes: bool) -> None:
    """Delete the Azure resource group that `cluster onboard` made for NAME (every VM, disk, address and
    vault in it), then its profile."""
    from hpcjob.azure import run_az
    from hpcjob.config import get_profile, remove_profile
    from hpcjob.onboard import delete_command
    from hpcjob.spec import SpecError

    profile = get_profile(name)
    if profile.resource_group is None:
        raise SpecError(
            f"cluster {name} was not made by `hpcjob cluster onboard`: delete it in Azure yourself"
        )
    if not yes:
        if not sys.stdin.isatty():
            raise SpecError("no terminal to confirm on: give --yes")
        click.confirm(
            f"Delete resource group {profile.resource_group} and everything in it (cluster {name})?",
            abort=True,
        )
    run_az(delete_command(profile.resource_group))
    remove_profile(name)
    click.echo(f"cluster {name}: resource group {profile.resource_group} is being deleted; profile removed")
