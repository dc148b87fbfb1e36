"""A new GPU cluster from HPC Pack's ARM template ("Single head node cluster for Linux workloads"): what
to ask Azure for, checked before anything is deployed, and the `az` commands that deploy it.

The size table (hpcjob.job.sizes, on the ground floor) and the template's JSON come in as data, the
commands go out as argument lists; hpcjob/azure/az.py runs them. What a size costs is hpcjob.store.prices's
answer, asked without the network. The template is referred to by a URL
pinned to a commit and its content by its SHA-256, never by a moving branch (its defaults have changed
before). A copy of it comes with the package (hpcjob/azure/arm/): a request is checked against that copy,
with no network; `az` deploys from the pinned URL, whose content is the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpcjob.job.sizes import X86_64, SizeTable, size_table

if TYPE_CHECKING:
    from hpcjob.store.prices import HourlyPrice

TEMPLATE_COMMIT = "dea762e0b8150a2fcf9788a8226a48e74f9cd366"  # Azure/hpcpack-template, 2025-03-13
TEMPLATE_PATH = "GeneratedTemplates/new-1hn-lnxcn-no-ad.json"
TEMPLATE_URL = f"https://raw.githubusercontent.com/Azure/hpcpack-template/{TEMPLATE_COMMIT}/{TEMPLATE_PATH}"
TEMPLATE_SHA256 = "1be3ea21ffda6f7b6101d20e72250a97801f98d1bc2afd93a5620fdd6fdab75b"
SECRET_PARAMETERS = ("adminPassword", "authenticationKey")
DEFAULT_IMAGE = "Ubuntu_22.04_HPC_Gen2"  # the newest HPC image of the template: NVIDIA driver included
DEFAULT_PREFIX = "IaaSLnxCN"
# The template's Linux nodes join these groups (HPC Pack's default groups); there is no GPU group.
NODE_GROUP = "LinuxNodes"
# The template's nested deployment that makes the cluster's Key Vault and, in it, the self-signed
# certificate CN=HPCPackCommunication; its output certSettings.thumbprint (SHA-1, as Windows gives it) is
# the head node's SSL certificate (`SSLThumbprint: certSettings.thumbprint`): Azure/hpcpack-template
# @dea762e Bicep/shared/key-vault-with-cert.bicep L88, Bicep/new-1hn-lnxcn-no-ad.bicep L242. The vault
# uses role-based access and gives the deploying user no data role, so the certificate itself cannot be
# downloaded (Forbidden); the thumbprint in the deployment's outputs needs no Key Vault role at all.
CERTIFICATE_DEPLOYMENT = "KeyVaultWithCert"
# UNVERIFIED: the share of a no-AD head node, \\<clusterName>\CcpSpoolDir (facts/hpcpack-arm-and-sample.md).
SHARE = "//{name}/CcpSpoolDir"
# Azure's reserved administrator names (the VM API refuses them).
RESERVED_USERS = frozenset(
    (
        *("administrator", "admin", "admin1", "admin2", "adm", "root", "guest", "owner", "server", "sql"),
        *("support", "support_388945a0", "sys", "console", "backup", "aspnet", "actuser", "david", "john"),
        *(
            "user",
            "user1",
            "user2",
            "user3",
            "user4",
            "user5",
            "test",
            "test1",
            "test2",
            "test3",
            "1",
            "123",
            "a",
        ),
    )
)
_CLUSTER_NAME = re.compile(r"[a-z][a-z0-9]{2,14}")
_RESOURCE_GROUP = re.compile(r"[-\w.()]{1,90}")
_LOCATION = re.compile(r"[a-z0-9]{2,40}")
_ADMIN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,19}")
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9]{0,11}")


@dataclass(frozen=True)
class OnboardRequest:
    """What the user asked for (`hpcjob cluster onboard`)."""

    name: str
    resource_group: str
    location: str
    vm_size: str
    nodes: int
    admin_user: str = "hpcadmin"
    image: str = DEFAULT_IMAGE
    node_prefix: str = DEFAULT_PREFIX
    head_node_size: str | None = None
    spot: bool = False  # the compute nodes as Spot VMs (useSpotInstanceForComputeNodes)
    identity: str | None = None  # a user-assigned managed identity's resource ID, given to every node

    @property
    def deployment(self) -> str:
        return f"hpcjob-{self.name}"

    @property
    def node_names(self) -> list[str]:
        """As the template names them: the prefix and a 3-digit index from 000."""
        return [f"{self.node_prefix}{index:03d}" for index in range(self.nodes)]


@dataclass(frozen=True)
class Secrets:
    """Never in argv, a file, a log or printed: they reach `az` on its standard input only."""

    admin_password: str = field(repr=False)
    authentication_key: str = field(repr=False)

    def parameters(self) -> dict[str, dict[str, str]]:
        return {
            "adminPassword": {"value": self.admin_password},
            "authenticationKey": {"value": self.authentication_key},
        }


# A user-assigned managed identity, by its resource ID (Microsoft.ManagedIdentity/userAssignedIdentities:
# a name of 3 to 128 letters, digits, - and _, starting with a letter or digit).
_IDENTITY = re.compile(
    r"/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]{1,90}/providers/"
    r"Microsoft\.ManagedIdentity/userAssignedIdentities/[A-Za-z0-9][A-Za-z0-9_-]{2,127}",
    re.IGNORECASE,
)


def identity_problem(identity: str) -> str | None:
    """Why `identity` is not a user-assigned identity's resource ID (None: it is)."""
    if _IDENTITY.fullmatch(identity):
        return None
    return (
        f"--identity {identity!r} must be a user-assigned identity's resource ID: /subscriptions/ID/"
        "resourceGroups/RG/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME (az identity show "
        "--query id)"
    )


def check_request(request: OnboardRequest, table: SizeTable) -> dict[str, str]:
    """Every problem of the request, one line each, by the template parameter it concerns (nothing is
    deployed while there is one)."""
    problems: dict[str, str] = {}
    if not _CLUSTER_NAME.fullmatch(request.name):
        problems["clusterName"] = (
            f"cluster name {request.name!r} must be 3 to 15 lowercase letters and digits, starting with a "
            "letter (it is also the head node's computer name)"
        )
    if not _RESOURCE_GROUP.fullmatch(request.resource_group) or request.resource_group.endswith("."):
        problems["resource group"] = (
            f"resource group {request.resource_group!r} must be 1 to 90 letters, digits and - _ . ( ), "
            "not ending with a dot"
        )
    if not _LOCATION.fullmatch(request.location):
        problems["location"] = f"location {request.location!r} must be an Azure region name, such as eastus"
    if request.admin_user.lower() in RESERVED_USERS or not _ADMIN.fullmatch(request.admin_user):
        problems["adminUsername"] = (
            f"admin user {request.admin_user!r} must be 1 to 20 letters, digits and _ . -, starting with a "
            "letter, and not a name Azure reserves (admin, administrator, root, ...)"
        )
    if not _PREFIX.fullmatch(request.node_prefix):
        problems["computeNodeNamePrefix"] = (
            f"node prefix {request.node_prefix!r} must be 1 to 12 letters and digits"
        )
    if request.identity is not None and (why := identity_problem(request.identity)):
        problems["identity"] = why
    problems.update(_check_size_and_image(request, table))
    return problems


def _check_size_and_image(request: OnboardRequest | GrowRequest, table: SizeTable) -> dict[str, str]:
    if isinstance(request, GrowRequest) and request.data:  # CPU nodes: any image of the template's
        if request.vm_size not in table.cpu_sizes:
            return {
                "computeNodeVMSize": f"{request.vm_size} is not a CPU size hpcjob knows for data nodes; "
                f"choose one of {', '.join(sorted(table.cpu_sizes))} (hpcjob/job/sizes.json)"
            }
        return {}
    size = table.sizes.get(request.vm_size)
    if request.vm_size in table.fractional:
        return {
            "computeNodeVMSize": f"{request.vm_size} has {table.fractional[request.vm_size]}, not whole "
            "GPUs: CUDA and NCCL training needs whole GPUs; choose a size from hpcjob/job/sizes.json, "
            "such as Standard_NC24ads_A100_v4"
        }
    if size is None:
        return {
            "computeNodeVMSize": f"{request.vm_size} is not a GPU size hpcjob knows; choose one of "
            f"{', '.join(sorted(table.sizes))} (hpcjob/job/sizes.json)"
        }
    if size.cpu_arch != X86_64:  # GB200 v6: Grace, Arm64
        return {
            "computeNodeVMSize": f"{request.vm_size} runs {size.cpu_arch} (Arm64) images only, and none of "
            "the pinned template's images (its computeNodeImage values) is one: deploy such nodes yourself "
            "and join them to the cluster, then choose them by node group or name"
        }
    if "_HPC" not in request.image or request.image.startswith("SLES"):  # SLES HPC: drivers UNVERIFIED
        return {
            "computeNodeImage": f"image {request.image} has no NVIDIA driver, and the template installs "
            f"none: a GPU size needs an HPC image, such as {DEFAULT_IMAGE}"
        }
    if size.gen2_only and not request.image.endswith("_Gen2"):
        return {
            "computeNodeImage": f"{request.vm_size} runs Generation 2 images only, and {request.image} is "
            f"Generation 1: use {DEFAULT_IMAGE}"
        }
    return {}


def check_secrets(secrets: Secrets) -> list[str]:
    """Azure's rules for a VM administrator password (the value is never shown)."""
    password = secrets.admin_password
    classes = sum(
        (
            any(c.islower() for c in password),
            any(c.isupper() for c in password),
            any(c.isdigit() for c in password),
            any(not c.isalnum() for c in password),
        )
    )
    # The template gives the one password to the Windows head node (at most 123) and to the Linux nodes
    # (at most 72): the Linux limit is the one that holds.
    if not 12 <= len(password) <= 72 or classes < 3:
        return [
            "the admin password must be 12 to 72 characters (the Linux nodes' limit) with three of: a "
            "lowercase letter, an uppercase letter, a digit, a special character"
        ]
    return []


def template_parameters(request: OnboardRequest, table: SizeTable) -> dict[str, Any]:
    """The parameters file's values (no secrets), by the template's names."""
    return {
        "clusterName": request.name,
        "headNodeVMSize": request.head_node_size or table.head_node_size,
        "computeNodeImage": request.image,
        "computeNodeNamePrefix": request.node_prefix,
        "computeNodeNumber": request.nodes,
        "computeNodeVMSize": request.vm_size,
        "adminUsername": request.admin_user,
        # The REST API is reached at the head node's public name (the template's only output).
        "createPublicIPAddressForHeadNode": "Yes",
        # Spot nodes: the template gives each node VM priority Spot and evictionPolicy Deallocate, and no
        # billingProfile (no maximum price): docs/facts/azure-cli-and-hpcpack-template.md section 10.
        **({"useSpotInstanceForComputeNodes": "Yes"} if request.spot else {}),
    }


def check_parameters(values: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, str]:
    """`values` (the secrets' names included) against the template's own parameter definitions: known
    names, types, allowed values, lengths and ranges, and every required parameter given; by name."""
    definitions = template.get("definitions", {})
    declared = template.get("parameters", {})
    problems: dict[str, str] = {}
    for name, value in values.items():
        if name not in declared:
            problems[name] = f"the template has no parameter {name!r}"
            continue
        spec = dict(declared[name])
        ref = spec.pop("$ref", None)
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            spec = {**definitions.get(ref.removeprefix("#/definitions/"), {}), **spec}
        if (problem := _check_value(name, value, spec)) is not None:
            problems[name] = problem
    for name, spec in declared.items():
        if "defaultValue" not in spec and name not in values and not spec.get("nullable"):
            problems[name] = f"the template needs parameter {name!r}, and it is not given"
    return problems


def _check_value(name: str, value: Any, spec: Mapping[str, Any]) -> str | None:
    kind = str(spec.get("type", "")).lower()
    wanted = {"string": str, "securestring": str, "int": int, "bool": bool}.get(kind)
    if wanted is not None and (type(value) is not wanted):
        return f"parameter {name} must be of type {kind}, not {type(value).__name__}"
    allowed = spec.get("allowedValues")
    if allowed is not None and value not in allowed:
        shown = "(hidden)" if kind == "securestring" else repr(value)
        return f"parameter {name} is {shown}; the template allows {', '.join(map(str, allowed))}"
    if isinstance(value, str):
        low, high = spec.get("minLength", 0), spec.get("maxLength", len(value))
        if not low <= len(value) <= high:
            return f"parameter {name} must be {low} to {high} characters long"
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = spec.get("minValue", value), spec.get("maxValue", value)
        if not low <= value <= high:
            return f"parameter {name} is {value}; the template allows {low} to {high}"
    return None


# `az vm list-usage`'s row of every vCPU in the region, whatever the family ("Total Regional vCPUs").
REGIONAL_TOTAL = "cores"
# Spot VMs count against one regional quota of their own, across all families, and not against the
# standard ones (MicrosoftDocs/azure-docs articles/quotas/spot-quota.md @02d00dc8; spot-vms.md: "a separate
# quota pool"). Its row: localizedValue "Total Regional Low-priority vCPUs" (verified: the Quotas docs'
# queries), name.value lowPriorityCores (UNVERIFIED: public `az vm list-usage` dumps): either matches.
SPOT_TOTAL, SPOT_TOTAL_LABEL = "lowPriorityCores", "Total Regional Low-priority vCPUs"


def _family_key(name: str) -> str:
    """Quota family names are compared without case, spaces, _ or -: Azure spells one family differently
    in different places (list-skus "Standard NDASv4_A100 Family", list-usage standardNDASv4_A100Family)."""
    return re.sub(r"[\s_-]", "", name).casefold()


def offered_family(request: OnboardRequest | GrowRequest, skus: list[Mapping[str, Any]]) -> str | None:
    """The size's quota family as `az vm list-skus` names it ("" when it names none), or None when the
    size is not offered to this subscription in the region (the deployment would fail with
    SkuNotAvailable after minutes)."""
    for row in skus:
        if str(row.get("name", "")).casefold() == request.vm_size.casefold():
            return str(row.get("family") or "")
    return None


def quota_problems(
    request: OnboardRequest, table: SizeTable, usage: list[Mapping[str, Any]], family: str | None = None
) -> list[str]:
    """Whether the subscription's vCPU quotas in the region leave room for the cluster (`usage`: what
    `az vm list-usage` answers; `family`: the size's family as az names it, else the table's): the
    nodes' family (or, Spot nodes, the regional Spot quota), the head node's, and the regional total."""
    head = request.head_node_size in (None, table.head_node_size)  # another head size: its family unknown
    return node_quota_problems(
        request.location, request.vm_size, request.nodes, request.spot, table, usage, family, head_node=head
    )


def node_quota_problems(
    location: str,
    vm_size: str,
    count: int,
    spot: bool,
    table: SizeTable,
    usage: list[Mapping[str, Any]],
    family: str | None = None,
    *,
    head_node: bool = False,
) -> list[str]:
    """Whether the quotas leave room for `count` more nodes of `vm_size` (and the head node, when it is to
    be made too): what `az vm list-usage` counts as used already needs no more room."""
    size = table.any_size(vm_size)
    nodes = size.vcpus * count
    who = f"{count} x {vm_size}{' (Spot)' if spot else ''}"
    if spot:  # their own regional quota only
        wanted, total, what = [(SPOT_TOTAL, nodes, who)], 0, ""
    else:
        # A size without a published family (MI300X): az's, which onboarding asks for first.
        named_family = family or size.quota_family or f"the quota family of {vm_size}"
        wanted, total, what = [(named_family, nodes, who)], nodes, who
    if head_node:
        wanted.append(
            (table.head_node_quota_family, table.head_node_vcpus, f"the head node ({table.head_node_size})")
        )
        total += table.head_node_vcpus
        what = f"{what} and the head node" if what else "the head node"
    if total:
        wanted.append((REGIONAL_TOTAL, total, what))
    needed: dict[str, tuple[str, int, str]] = {}
    for name, vcpus, named in wanted:  # the head node may share the nodes' family
        key = _family_key(name)
        if key in needed:
            _, before, earlier = needed[key]
            vcpus, named = before + vcpus, f"{earlier} and {named}"
        needed[key] = (name, vcpus, named)
    rows: dict[str, Mapping[str, Any]] = {}
    for row in usage:
        names = row.get("name") or {}
        rows[_family_key(str(names.get("value", "")))] = row
        if str(names.get("localizedValue", "")) == SPOT_TOTAL_LABEL:
            rows[_family_key(SPOT_TOTAL)] = row
    labels = {REGIONAL_TOTAL: "Total Regional vCPUs", _family_key(SPOT_TOTAL): SPOT_TOTAL_LABEL}
    problems = []
    for key, (name, vcpus, named) in needed.items():
        label = labels.get(key, name)
        found = rows.get(key)
        if found is None:
            problems.append(f"no {label} quota in {location}: ask for it (Azure portal, Quotas) first")
            continue
        free = int(found.get("limit", 0)) - int(found.get("currentValue", 0))
        if free < vcpus:
            problems.append(
                f"{named} need {vcpus} vCPUs of {label} in {location}, and the quota leaves {free}: "
                "ask for more (Azure portal, Quotas) or choose fewer nodes"
            )
    return problems


def fabric_warning(request: OnboardRequest, table: SizeTable) -> str | None:
    """A multi-node cluster of a size without InfiniBand: its DDP all-reduce goes over TCP on Ethernet,
    many times slower than over an ND size's InfiniBand (docs/facts/azure-gpu-fabric-and-nccl.md)."""
    size = table.sizes[request.vm_size]
    if request.nodes < 2 or size.infiniband is not None:
        return None
    fast = sorted(
        name
        for name, other in table.sizes.items()
        if other.infiniband and "UNVERIFIED" not in other.infiniband
    )
    return (
        f"{request.vm_size} has no InfiniBand: DDP across its {request.nodes} nodes goes over TCP on "
        f"Ethernet, many times slower than on a size with it ({', '.join(fast)})"
    )


def hourly_cost(request: OnboardRequest, table: SizeTable) -> str:
    """What the new cluster costs an hour, in one line: its nodes and its head node at the prices
    hpcjob.store.prices answers without the network (the cache, else the size table, each price with
    its date and source)."""
    from hpcjob.job.prices import LINUX, SPOT, WINDOWS
    from hpcjob.store.prices import hourly_price

    head_size = request.head_node_size or table.head_node_size
    head = hourly_price(head_size, request.location, WINDOWS, network=False)
    nodes = hourly_price(request.vm_size, request.location, SPOT if request.spot else LINUX, network=False)
    ask = f"`hpcjob prices --size {request.vm_size} --region {request.location}`"
    head_said = (
        f"the head node about ${head.usd_per_hour:.2f}" if head.usd_per_hour is not None
        else f"the head node's price {head.unknown}"
    )  # fmt: skip
    if request.spot:
        each = (
            f"about ${nodes.usd_per_hour:.2f} ({_price_from(nodes)})" if nodes.usd_per_hour is not None
            else f"{nodes.unknown}, at most the list price"
        )  # fmt: skip
        return (
            f"{head_said} an hour, and each Spot node the Spot price of the hour, {each}: no maximum price "
            f"is set, so Azure evicts them only when it needs the room ({ask})"
        )
    if nodes.usd_per_hour is None or head.usd_per_hour is None:
        why = nodes.unknown if nodes.usd_per_hour is None else f"{head_said}"
        return f"not known offline ({why}): {ask} asks Azure"
    total = request.nodes * nodes.usd_per_hour + head.usd_per_hour
    return (
        f"about ${total:.2f} an hour while it runs ({request.nodes} x {request.vm_size} at "
        f"${nodes.usd_per_hour:.2f} and the head node at ${head.usd_per_hour:.2f}; {_price_from(nodes)}; "
        f"{ask} asks Azure)"
    )


def grow_cost(request: GrowRequest) -> str:
    """What the new nodes of a grow add an hour, in a few words, at the prices hpcjob.store.prices
    answers without the network."""
    from hpcjob.job.prices import LINUX, SPOT
    from hpcjob.store.prices import hourly_price

    nodes = hourly_price(request.vm_size, request.location, SPOT if request.spot else LINUX, network=False)
    ask = f"`hpcjob prices --size {request.vm_size} --region {request.location}`"
    if request.spot:
        each = (
            f"about ${nodes.usd_per_hour:.2f}, {_price_from(nodes)}" if nodes.usd_per_hour is not None
            else f"{nodes.unknown}"
        )  # fmt: skip
        return f"each at the Spot price of the hour ({each}); {ask}"
    if nodes.usd_per_hour is None:
        return f"not known offline ({nodes.unknown}): {ask} asks Azure"
    return f"about ${request.nodes * nodes.usd_per_hour:.2f} an hour more ({_price_from(nodes)})"


def _price_from(price: HourlyPrice) -> str:
    """Where a price came from, in a few words."""
    from hpcjob.job.prices import FROM_TABLE

    found = price.prices
    if found is None:
        return "no price"
    if found.source == FROM_TABLE:
        where = "" if found.region == price.region else f", {found.region}'s"
        return f"hpcjob's own table of {found.asked}{where}, UNVERIFIED: check the Azure pricing calculator"
    return f"the Azure Retail Prices API, asked {found.asked}"


@dataclass(frozen=True)
class AzCommands:
    """The `az` command lines of an onboarding, in the order they run. `deploy` and `what_if` read the
    secrets' JSON on standard input (`--parameters @-`)."""

    account: list[str]
    skus: list[str]
    usage: list[str]
    deleted_vaults: list[str]
    group_exists: list[str]
    group_show: list[str]
    group: list[str]
    what_if: list[str]
    deploy: list[str]
    operations: list[str]
    certificate: list[str]

    @staticmethod
    def purge(vault: DeletedVault) -> list[str]:
        return ["az", "keyvault", "purge", "--name", vault.name, "--location", vault.location]

    @staticmethod
    def assign_identity(resource_group: str, vm: str, identity: str) -> list[str]:
        """The identity given to one node VM: the pinned template's own nodes get none (its compute-node
        module takes a userAssignedIdentity, which the template passes no value of: only the add-nodes
        template has the parameter), so onboarding assigns it once they are deployed (azure-cli
        vm/_params.py: `vm identity assign --identities`, space-separated)."""
        return [
            "az", "vm", "identity", "assign", "--resource-group", resource_group, "--name", vm,
            "--identities", identity, "--output", "json",
        ]  # fmt: skip


def az_commands(request: OnboardRequest, parameters_file: str) -> AzCommands:
    rg = ["--resource-group", request.resource_group]
    template = ["--name", request.deployment, "--template-uri", TEMPLATE_URL]
    parameters = ["--parameters", f"@{parameters_file}", "--parameters", "@-"]
    return AzCommands(
        account=["az", "account", "show", "--output", "json"],
        skus=_skus_command(request.location, request.vm_size),
        usage=["az", "vm", "list-usage", "--location", request.location, "--output", "json"],
        deleted_vaults=["az", "keyvault", "list-deleted", "--resource-type", "vault", "--output", "json"],
        group_exists=["az", "group", "exists", "--name", request.resource_group, "--output", "json"],
        group_show=["az", "group", "show", "--name", request.resource_group, "--output", "json"],
        group=[
            "az", "group", "create", "--name", request.resource_group, "--location", request.location,
            "--tags", "created-by=hpcjob", f"hpcjob-cluster={request.name}", "--output", "json",
        ],
        what_if=["az", "deployment", "group", "what-if", *rg, *template, *parameters],
        deploy=["az", "deployment", "group", "create", *rg, *template, *parameters, "--output", "json"],
        operations=[
            "az", "deployment", "operation", "group", "list", *rg, "--name", request.deployment,
            "--output", "json",
        ],
        certificate=[
            "az", "deployment", "group", "show", *rg, "--name", CERTIFICATE_DEPLOYMENT, "--output", "json",
        ],
    )  # fmt: skip


# The add-nodes template of the same commit: Linux compute nodes joined to a running cluster
# (Azure/hpcpack-template @dea762e GeneratedTemplates/add-lnx-compute-nodes.json, from
# Bicep/add-lnx-compute-nodes.bicep; docs/facts/azure-cli-and-hpcpack-template.md section 11).
ADD_NODES_PATH = "GeneratedTemplates/add-lnx-compute-nodes.json"
ADD_NODES_URL = f"https://raw.githubusercontent.com/Azure/hpcpack-template/{TEMPLATE_COMMIT}/{ADD_NODES_PATH}"
ADD_NODES_SHA256 = "9ca008f7fd4303f92a1658914fd0461fb4e45b599df00cafa0905a95acea628e"
ADD_NODES_SECRETS = ("adminPasswordOrKey", "authenticationKey")
# What the pinned template names the cluster's network and availability set
# (Bicep/new-1hn-lnxcn-no-ad.bicep L113-118): the new nodes join the same.
VNET, SUBNET, AVAILABILITY_SET = "{name}vnet", "Subnet-1", "{name}-avset"
# Where a print-only grow cannot know the first new node's index (it asks nobody).
START_PLACEHOLDER = "START"
_RDMA_A_SERIES = ("Standard_A8", "Standard_A9")


@dataclass(frozen=True)
class GrowRequest:
    """More compute nodes for a cluster hpcjob onboarded (`hpcjob cluster grow`). `cluster`: the cluster's
    name, which is its head node's VM and computer name."""

    cluster: str
    resource_group: str
    location: str
    vm_size: str
    nodes: int
    admin_user: str
    spot: bool = False
    image: str = DEFAULT_IMAGE
    node_prefix: str = DEFAULT_PREFIX
    data: bool = False  # CPU data nodes (`--data-nodes`): a CPU size, no GPU image needed
    identity: str | None = None  # a user-assigned managed identity's resource ID, given to the new nodes

    def deployment(self, stamp: str) -> str:
        return f"hpcjob-{self.cluster}-grow-{stamp}"

    def node_names(self, start: int) -> list[str]:
        """As the add-nodes template names them: the prefix and the index from `start`, 3 digits at least
        (padLeft(string(i + computeNodeNameStartIndex), 3, '0'))."""
        return [f"{self.node_prefix}{index:03d}" for index in range(start, start + self.nodes)]


def is_rdma_capable(vm_size: str) -> bool:
    """The templates' rule (Bicep/add-lnx-compute-nodes.bicep L110, shared/types-and-vars.bicep
    isRDMACapable), as the size table holds it for its sizes (rdma); for another size the rule itself:
    an A8 or A9, or an r in the size's second `_` field (ND96asr, NC24rs)."""
    known = size_table().find(vm_size)
    if known is not None:
        return known.rdma
    parts = vm_size.split("_")
    return vm_size in _RDMA_A_SERIES or (len(parts) > 1 and "r" in parts[1].lower())


def check_grow(request: GrowRequest, table: SizeTable) -> dict[str, str]:
    """Every problem of the request that needs nobody asked, by the template parameter it concerns."""
    problems: dict[str, str] = {}
    if not _PREFIX.fullmatch(request.node_prefix):
        problems["computeNodeNamePrefix"] = (
            f"node prefix {request.node_prefix!r} must be 1 to 12 letters and digits"
        )
    problems.update(_check_size_and_image(request, table))
    return problems


def grow_parameters(request: GrowRequest) -> dict[str, Any]:
    """The add-nodes template's parameters (no secrets, and not the first node's index, which is given on
    the command line once the existing nodes are known), by its names: the cluster's network, the nodes
    in the cluster's availability set where the pinned template puts them (RDMA-capable sizes: its
    availabilitySetOption Auto, Bicep/new-1hn-lnxcn-no-ad.bicep L125 and L287), the admin's password
    for the nodes as onboarding gave them."""
    return {
        "computeNodeNamePrefix": request.node_prefix,
        "computeNodeNumber": request.nodes,
        "computeNodeImage": request.image,
        "computeNodeVMSize": request.vm_size,
        "adminUsername": request.admin_user,
        "authenticationType": "password",
        "virtualNetworkName": VNET.format(name=request.cluster),
        "subnetName": SUBNET,
        "availabilitySetName": AVAILABILITY_SET.format(name=request.cluster)
        if is_rdma_capable(request.vm_size)
        else "",
        "clusterConnectionString": request.cluster,  # the head node's name: no domain
        "useSpotInstances": "Yes" if request.spot else "No",
        # The add-nodes template's own (Bicep/add-lnx-compute-nodes.bicep L3-89): each new VM gets it.
        **({"userAssignedIdentity": request.identity} if request.identity else {}),
    }


_INDEXED = re.compile(r"(.*?)(\d{3,})")


def next_start_index(prefix: str, names: Iterable[str]) -> int:
    """The first index after every node named `prefix` + digits among `names` (VMs and the head node's
    nodes; names compare without case, as Azure's and HPC Pack's do): new nodes collide with none."""
    used = [
        int(match.group(2))
        for name in names
        if (match := _INDEXED.fullmatch(name)) is not None and match.group(1).casefold() == prefix.casefold()
    ]
    return max(used) + 1 if used else 0


def vm_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The VMs' names, as `az vm list` gives them."""
    return [str(row.get("name", "")) for row in rows if row.get("name")]


@dataclass(frozen=True)
class GrowCommands:
    """The `az` command lines of a grow, in the order they run. `deploy` reads the secrets' JSON on
    standard input (`--parameters @-`)."""

    account: list[str]
    vm_list: list[str]
    skus: list[str]
    usage: list[str]
    deploy: list[str]
    operations: list[str]


def grow_commands(
    request: GrowRequest, parameters_file: str, deployment: str, start: int | None
) -> GrowCommands:
    """`start`: the first new node's index (None: not known, START_PLACEHOLDER in its place)."""
    rg = ["--resource-group", request.resource_group]
    index = START_PLACEHOLDER if start is None else str(start)
    return GrowCommands(
        account=["az", "account", "show", "--output", "json"],
        vm_list=["az", "vm", "list", *rg, "--output", "json"],
        skus=_skus_command(request.location, request.vm_size),
        usage=["az", "vm", "list-usage", "--location", request.location, "--output", "json"],
        # az merges the --parameters in order; KEY=VALUE takes the template's type for KEY (azure-cli
        # 2.91.0 resource/custom.py L128-160 _try_parse_key_value_object, L163-212 _process_parameters).
        deploy=[
            "az", "deployment", "group", "create", *rg, "--name", deployment, "--template-uri", ADD_NODES_URL,
            "--parameters", f"@{parameters_file}", "--parameters", f"computeNodeNameStartIndex={index}",
            "--parameters", "@-", "--output", "json",
        ],
        operations=[
            "az", "deployment", "operation", "group", "list", *rg, "--name", deployment, "--output", "json",
        ],
    )  # fmt: skip


def _skus_command(location: str, vm_size: str) -> list[str]:
    # Without --all: the sizes this subscription may use in the region (azure-cli vm/custom.py
    # list_skus drops those restricted NotAvailableForSubscription); --size matches a substring.
    return [
        "az", "vm", "list-skus", "--location", location, "--size", vm_size,
        "--resource-type", "virtualMachines", "--output", "json",
    ]  # fmt: skip


@dataclass(frozen=True)
class DeletedVault:
    """A soft-deleted Key Vault, as `az keyvault list-deleted` reports it."""

    name: str
    location: str
    vault_id: str
    purge_date: str


def vaults_in_the_way(
    request: OnboardRequest, subscription_id: str, deleted: list[Mapping[str, Any]]
) -> list[DeletedVault]:
    """Soft-deleted vaults that an earlier cluster in a resource group of this name left: the template
    would make a vault of the same name, and Azure refuses it while the deleted one is kept. The name is
    take('<resource group>-kv-<uniqueString(resourceGroup().id)>', 24), soft-deleted for 90 days with its
    group, with no purge protection (key-vault-with-cert.bicep)."""
    group = f"/subscriptions/{subscription_id}/resourcegroups/{request.resource_group}/".casefold()
    prefix = f"{request.resource_group}-kv-"[:24].casefold()
    found = []
    for row in deleted:
        props = row.get("properties") or {}
        vault = DeletedVault(
            str(row.get("name", "")),
            str(props.get("location", "")),
            str(props.get("vaultId", "")),
            str(props.get("scheduledPurgeDate", "")),
        )
        if vault.vault_id.casefold().startswith(group) and vault.name.casefold().startswith(prefix):
            found.append(vault)
    return found


_THUMBPRINT = re.compile(r"[0-9A-Fa-f]{40}")


def certificate_thumbprint(deployment: Mapping[str, Any]) -> str | None:
    """The head node certificate's SHA-1 thumbprint from the KeyVaultWithCert deployment's outputs
    (`az deployment group show`), or None when it has none."""
    outputs = (deployment.get("properties") or {}).get("outputs") or {}
    settings = (outputs.get("certSettings") or {}).get("value") or {}
    thumbprint = str(settings.get("thumbprint") or "")
    return thumbprint.upper() if _THUMBPRINT.fullmatch(thumbprint) else None


def delete_command(resource_group: str, *, wait: bool = False) -> list[str]:
    return ["az", "group", "delete", "--name", resource_group, "--yes", *([] if wait else ["--no-wait"])]


@dataclass(frozen=True)
class Operation:
    """One resource of a deployment as `az deployment operation group list` reports it."""

    resource: str
    state: str
    duration: str
    error: str

    @classmethod
    def from_az(cls, row: Mapping[str, Any]) -> Operation | None:
        props = row.get("properties") or {}
        target = props.get("targetResource") or {}
        if not target.get("resourceType"):
            return None  # the deployment's own bookkeeping row
        status = props.get("statusMessage") or {}
        error = status.get("error") if isinstance(status, dict) else None
        message = ""
        if isinstance(error, dict):
            message = _innermost_error(error)
        return cls(
            f"{target.get('resourceType')} {target.get('resourceName', '')}".strip(),
            str(props.get("provisioningState", "")),
            str(props.get("duration", "")),
            message,
        )


def _innermost_error(error: Mapping[str, Any]) -> str:
    """Azure nests the real reason in `details`; the deepest message says it."""
    details = error.get("details")
    if isinstance(details, list) and details and isinstance(details[0], dict):
        inner = _innermost_error(details[0])
        if inner:
            return inner
    text = " ".join(str(error.get("message", "")).split())
    code = error.get("code")
    return f"{code}: {text}" if code and text else text


def cluster_dns_name(deployment: Mapping[str, Any]) -> str:
    """The head node's public name, the template's one output."""
    outputs = (deployment.get("properties") or {}).get("outputs") or {}
    return str((outputs.get("clusterDNSName") or {}).get("value") or "")
