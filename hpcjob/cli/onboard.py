"""`hpcjob cluster onboard` (a new GPU cluster from HPC Pack's ARM template), `hpcjob cluster grow` (more
nodes for it, from the template's add-nodes template) and `hpcjob cluster delete`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hpcjob.cli.app import cluster
from hpcjob.cli.options import AZURE, CREDENTIALS, OTHER, OUTPUT, headed
from hpcjob.store.credentials import ADMIN_PASSWORD_ENV, AUTH_KEY_ENV


@cluster.command(
    "onboard",
    short_help="Deploy a GPU cluster NAME on Azure, from HPC Pack's template.",
    groups=headed(
        {
            AZURE: "resource_group location vm_size node_count spot data_nodes data_vm_size admin_user image "
            "node_prefix head_node_size identity template_file",
            CREDENTIALS: "password_env key_env",
            OUTPUT: "what_if print_only out_dir",
            OTHER: "purge_deleted_vault no_check poll_interval make_default",
        }
    ),
    epilog="""\b
    Examples:
      hpcjob cluster onboard gpu1 --resource-group rg-gpu1 --location eastus \\
          --vm-size Standard_NC24ads_A100_v4 --nodes 2 --what-if
      hpcjob cluster onboard gpu1 --resource-group rg-gpu1 --location eastus \\
          --vm-size Standard_NC24ads_A100_v4 --nodes 2 --default
      hpcjob cluster onboard gpu2 --resource-group rg-gpu2 --location eastus \\
          --vm-size Standard_NC24ads_A100_v4 --nodes 4 --spot
    """,
)
@click.argument("name")
@click.option("--resource-group", required=True, metavar="RG", help="A new resource group for the cluster.")
@click.option("--location", required=True, metavar="REGION", help="Azure region, e.g. eastus.")
@click.option(
    "--vm-size", required=True, metavar="SIZE", help="GPU size of the nodes, e.g. Standard_NC24ads_A100_v4."
)
@click.option("--nodes", "node_count", required=True, type=int, metavar="N", help="Compute nodes (1 to 500).")
@click.option(
    "--spot",
    is_flag=True,
    help="Make the compute nodes Spot VMs: cheaper, evicted (deallocated) when Azure needs the room; no "
    "maximum price. A run that loses one goes on elsewhere with --retries.",
)
@click.option(
    "--data-nodes",
    type=click.IntRange(1, 500),
    metavar="M",
    help="And M CPU data nodes of --data-vm-size, in their own node group, once the cluster is up "
    "(`cluster grow --data`): see --data-nodes of run and submit.",
)
@click.option("--data-vm-size", metavar="SIZE", help="CPU size of the data nodes, e.g. Standard_F16s_v2.")
@click.option(
    "--admin-user", default="hpcadmin", show_default=True, metavar="USER", help="Administrator of every VM."
)
@click.option("--image", default=None, metavar="IMAGE", help="Node image [default: Ubuntu_22.04_HPC_Gen2].")
@click.option(
    "--node-prefix", default=None, metavar="PREFIX", help="Node names' prefix [default: IaaSLnxCN]."
)
@click.option(
    "--head-node-size",
    default=None,
    metavar="SIZE",
    help="The head node's VM size [default: Standard_DS4_v2].",
)
@click.option(
    "--identity",
    default=None,
    metavar="RESOURCE_ID",
    help="A user-assigned managed identity (az identity show --query id) for every node, and for the nodes "
    "`cluster grow` adds: their jobs read Blob --dataset sources with it, no credential handed to them. "
    "Give it a data role on the storage account (Storage Blob Data Reader).",
)
@click.option(
    "--password-env",
    default=ADMIN_PASSWORD_ENV,
    show_default=True,
    metavar="VARIABLE",
    help="Read the admin password from this variable; prompted for when it is not set.",
)
@click.option(
    "--key-env",
    default=AUTH_KEY_ENV,
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
    "--poll-interval",
    type=float,
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between progress polls.",
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
    from hpcjob.azure.onboard import OnboardOptions, onboard
    from hpcjob.azure.template import DEFAULT_IMAGE, DEFAULT_PREFIX, OnboardRequest
    from hpcjob.cli.tables import checkup_lines, mount_lines
    from hpcjob.job.sizes import size_table
    from hpcjob.job.spec import SpecError

    data_nodes, data_size = options.pop("data_nodes"), options.pop("data_vm_size")
    if (data_nodes is None) != (data_size is None):
        raise SpecError("--data-nodes and --data-vm-size go together: how many CPU data nodes, of which size")
    cpu_sizes = size_table().cpu_sizes
    if data_size is not None and data_size not in cpu_sizes:  # before anything is deployed
        raise SpecError(
            f"--data-vm-size {data_size} is not a CPU size hpcjob knows for data nodes; choose one of "
            f"{', '.join(sorted(cpu_sizes))}"
        )

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
        spot=options["spot"],
        identity=options["identity"],
    )
    terminal = sys.stdin.isatty()

    def ask_password() -> str:
        return str(
            click.prompt("Admin password for the new cluster", hide_input=True, confirmation_prompt=True)
        )

    def confirm_purge(why: str) -> None:
        click.echo(f"hpcjob: {why}", err=True)
        click.confirm("Purge it for good (its keys and certificates cannot be recovered after)?", abort=True)

    done = onboard(
        request,
        OnboardOptions(
            out_dir=out_dir,
            template_file=template_file,
            password_env=password_env,
            key_env=key_env,
            what_if=what_if,
            purge_deleted_vault=purge_deleted_vault,
            print_only=print_only,
            check=not no_check,
            poll_interval_s=poll_interval,
            make_default=make_default,
        ),
        ask_password=ask_password if terminal else None,
        confirm_purge=confirm_purge if terminal else None,
        progress=lambda line: click.echo(line, err=True),
    )
    then_data = f"hpcjob cluster grow {name} {data_nodes} --data --vm-size {data_size}"
    if print_only:
        for argv in (done.commands.group, done.commands.deploy):
            click.echo(" ".join(argv))
        if (identity := request.identity) is not None:
            for vm in request.node_names:
                click.echo(" ".join(done.commands.assign_identity(request.resource_group, vm, identity)))
        click.echo(
            "# the deploy command reads the secrets on its standard input, as JSON: "
            '{"adminPassword": {"value": "..."}, "authenticationKey": {"value": "..."}}'
        )
        if data_nodes:
            click.echo(f"# then the data nodes: {then_data}")
        return
    if done.preview is not None:
        click.echo(done.preview)
        return
    for line in mount_lines(done.mounts) if done.mounts else ():
        click.echo(line)
    for line in checkup_lines(done.checkup) if done.checkup else ():
        click.echo(line)
    for failed in done.failed:
        click.echo(f"hpcjob: warning: {failed}", err=True)
    if data_nodes:  # the same way as any nodes added to a running cluster
        from hpcjob.azure.onboard import GrowOptions, grow

        click.echo(f"hpcjob: the cluster is up; now its {data_nodes} data node(s): {then_data}", err=True)
        grown = grow(
            name,
            data_nodes,
            GrowOptions(
                out_dir=out_dir / "data-nodes" if out_dir else None,  # beside onboarding's parameters
                key_env=key_env,
                check=not no_check,
                poll_interval_s=poll_interval,
            ),
            vm_size=data_size,
            data=True,
            progress=lambda line: click.echo(line, err=True),
        )
        for line in mount_lines(grown.mounts) if grown.mounts else ():
            click.echo(line)
        click.echo(
            f"cluster {name}: {len(grown.online)} data node(s) in their group: {', '.join(grown.online)}"
        )
    click.echo(f"cluster {name} is ready: next, `hpcjob nodes --cluster {name}`, then `hpcjob submit ...`")


@cluster.command(
    "grow",
    short_help="Add N compute nodes to a cluster hpcjob onboarded.",
    groups=headed(
        {
            AZURE: "vm_size spot data image node_prefix",
            CREDENTIALS: "key_env",
            OUTPUT: "print_only out_dir",
            OTHER: "no_check online_timeout poll_interval",
        }
    ),
    epilog="""\b
    Examples:
      hpcjob cluster grow gpu1 2          # 2 more nodes of the profile's size
      hpcjob cluster grow gpu1 4 --spot   # 4 Spot nodes
      hpcjob cluster grow 2 --vm-size Standard_NC48ads_A100_v4 --print-only
      hpcjob cluster grow gpu1 2 --data --vm-size Standard_F16s_v2  # data nodes
    """,
)
@click.argument("words", nargs=-1, required=True, metavar="[NAME] N")
@click.option("--vm-size", default=None, metavar="SIZE", help="The new nodes' size [default: the profile's].")
@click.option(
    "--spot",
    is_flag=True,
    help="Make the new nodes Spot VMs: evicted (deallocated) when Azure needs the room; no maximum price.",
)
@click.option(
    "--data",
    is_flag=True,
    help="The new nodes are CPU data nodes (--data-nodes): a CPU size, put in the profile's data node "
    "group (CPUNodes where it names none), which the profile then names with their size.",
)
@click.option("--image", default=None, metavar="IMAGE", help="Node image [default: Ubuntu_22.04_HPC_Gen2].")
@click.option(
    "--node-prefix",
    default=None,
    metavar="PREFIX",
    help="The new nodes' names' prefix; their index follows the highest of the existing nodes' "
    "[default: IaaSLnxCN, with --data IaaSCpuDN].",
)
@click.option(
    "--key-env",
    default=AUTH_KEY_ENV,
    show_default=True,
    metavar="VARIABLE",
    help="Read the nodes' authentication key (the cluster's, as onboarded) from this variable; else from "
    "the system keyring, where onboarding keeps a key it made.",
)
@click.option(
    "--print-only",
    is_flag=True,
    help="Check, write the parameters file and print the az commands (no network).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the parameters file [default: ./hpcjob-grow-NAME].",
)
@click.option("--no-check", is_flag=True, help="Do not mount the share on the new nodes afterwards.")
@click.option(
    "--online-timeout",
    default="30m",
    show_default=True,
    metavar="DURATION",
    help="How long to wait for the head node to see the new nodes online.",
)
@click.option(
    "--poll-interval",
    type=float,
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between progress polls.",
)
def cluster_grow(
    words: tuple[str, ...],
    vm_size: str | None,
    spot: bool,
    data: bool,
    image: str | None,
    node_prefix: str | None,
    key_env: str,
    print_only: bool,
    out_dir: Path | None,
    no_check: bool,
    online_timeout: str,
    poll_interval: float,
) -> None:
    """Add N compute nodes to cluster NAME (default: the default cluster), which `hpcjob cluster
    onboard` made, with the ARM template's add-nodes template (pinned to the same commit): in its resource
    group and network, named after every node there is, Spot VMs with --spot. Then wait until the head
    node sees them online, and mount the share on them.

    The admin password (the profile's) and the nodes' authentication key reach `az` on its standard input
    only. Needs the Azure CLI, logged in (`az login`).
    """
    from hpcjob.azure.onboard import GrowOptions, grow
    from hpcjob.cli.tables import mount_lines
    from hpcjob.job.spec import SpecError, parse_duration

    if len(words) > 2:
        raise SpecError(f"cluster grow takes [NAME] N, not {len(words)} arguments")
    name, count_text = (None, words[0]) if len(words) == 1 else words
    if not count_text.isdigit():
        raise SpecError(f"N {count_text!r} must be a whole number of nodes: cluster grow [NAME] N")
    if not poll_interval > 0:
        raise SpecError("--poll-interval must be more than 0 seconds")
    done = grow(
        name,
        int(count_text),
        GrowOptions(
            out_dir=out_dir,
            key_env=key_env,
            print_only=print_only,
            check=not no_check,
            poll_interval_s=poll_interval,
            online_timeout_s=parse_duration(online_timeout, "--online-timeout"),
        ),
        vm_size=vm_size,
        spot=spot,
        image=image,
        node_prefix=node_prefix,
        data=data,
        progress=lambda line: click.echo(line, err=True),
    )
    request = done.request
    if print_only:
        for argv in (done.commands.vm_list, done.commands.deploy):
            click.echo(" ".join(argv))
        click.echo(
            f"# START: the first index after the existing {request.node_prefix}<index> nodes (the VMs az vm "
            "list shows, and the nodes the head node knows): `hpcjob cluster grow` finds it itself"
        )
        click.echo(
            "# the deploy command reads the secrets on its standard input, as JSON: "
            '{"adminPasswordOrKey": {"value": "..."}, "authenticationKey": {"value": "..."}}'
        )
        return
    for line in mount_lines(done.mounts) if done.mounts else ():
        click.echo(line)
    for failed in done.failed:
        click.echo(f"hpcjob: warning: {failed}", err=True)
    kind = f"{request.vm_size}{', Spot' if request.spot else ''}"
    plural = "s" if len(done.online) != 1 else ""
    click.echo(
        f"cluster {request.cluster}: {len(done.online)} new node{plural} online ({kind}): "
        f"{', '.join(done.online)}"
    )


@cluster.command(
    "delete",
    short_help="Delete the Azure resource group of NAME, then its profile.",
    epilog="""\b
    Examples:
      hpcjob cluster delete gpu1
    """,
)
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def cluster_delete(name: str, yes: bool) -> None:
    """Delete the Azure resource group that `cluster onboard` made for NAME (every VM, disk, address and
    vault in it), then its profile."""
    from hpcjob.azure.az import run_az
    from hpcjob.azure.template import delete_command
    from hpcjob.job.spec import SpecError
    from hpcjob.store.config import get_profile, remove_profile

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
