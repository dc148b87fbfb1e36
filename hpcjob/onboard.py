"""A new GPU cluster from HPC Pack's ARM template ("Single head node cluster for Linux workloads"): what
to ask Azure for, checked before anything is deployed, and the `az` commands that deploy it.

Pure: the size table (hpcjob/arm/sizes.json) and the template's JSON come in as data, the commands go out
as argument lists; hpcjob/azure.py runs them. The template is referred to by a URL pinned to a commit and
its content by its SHA-256, never by a moving branch (its defaults have changed before).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TEMPLATE_COMMIT = "dea762e0b8150a2fcf9788a8226a48e74f9cd366"  # Azure/hpcpack-template, 2025-03-13
TEMPLATE_PATH = "GeneratedTemplates/new-1hn-lnxcn-no-ad.json"
TEMPLATE_URL = f"https://raw.githubusercontent.com/Azure/hpcpack-template/{TEMPLATE_COMMIT}/{TEMPLATE_PATH}"
TEMPLATE_SHA256 = "1be3ea21ffda6f7b6101d20e72250a97801f98d1bc2afd93a5620fdd6fdab75b"
SECRET_PARAMETERS = ("adminPassword", "authenticationKey")
DEFAULT_IMAGE = "Ubuntu_22.04_HPC_Gen2"  # the newest HPC image of the template: NVIDIA driver included
DEFAULT_PREFIX = "IaaSLnxCN"
# The template's Linux nodes join these groups (HPC Pack's default groups); there is no GPU group.
NODE_GROUP = "LinuxNodes"
# The certificate the template's deployment script makes in the cluster's Key Vault.
CERTIFICATE_NAME = "HPCPackCommunication"
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
class GpuSize:
    name: str
    gpus: int
    gpu: str
    vcpus: int
    gen2_only: bool
    quota_family: str
    usd_per_hour: float


@dataclass(frozen=True)
class SizeTable:
    """hpcjob/arm/sizes.json: the GPU sizes hpcjob onboards, the fractional ones it refuses, the head
    node's."""

    sizes: Mapping[str, GpuSize]
    fractional: Mapping[str, str]
    head_node_size: str
    head_node_usd_per_hour: float
    prices_as_of: str

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SizeTable:
        sizes = {
            name: GpuSize(
                name,
                int(row["gpus"]),
                str(row["gpu"]),
                int(row["vcpus"]),
                row["generation"] == "gen2",
                str(row["quota_family"]),
                float(row["usd_per_hour"]),
            )
            for name, row in data["sizes"].items()
        }
        head = data["head_node"]
        return cls(
            sizes,
            dict(data["fractional"]),
            str(head["size"]),
            float(head["usd_per_hour"]),
            str(data["prices_as_of"]),
        )


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
    problems.update(_check_size_and_image(request, table))
    return problems


def _check_size_and_image(request: OnboardRequest, table: SizeTable) -> dict[str, str]:
    size = table.sizes.get(request.vm_size)
    if request.vm_size in table.fractional:
        return {
            "computeNodeVMSize": f"{request.vm_size} has {table.fractional[request.vm_size]}, not whole "
            "GPUs: CUDA and NCCL training needs whole GPUs; choose a size from hpcjob/arm/sizes.json, "
            "such as Standard_NC24ads_A100_v4"
        }
    if size is None:
        return {
            "computeNodeVMSize": f"{request.vm_size} is not a GPU size hpcjob knows; choose one of "
            f"{', '.join(sorted(table.sizes))} (hpcjob/arm/sizes.json)"
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
    if not 12 <= len(password) <= 123 or classes < 3:
        return [
            "the admin password must be 12 to 123 characters with three of: a lowercase letter, an "
            "uppercase letter, a digit, a special character"
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


def quota_problem(request: OnboardRequest, table: SizeTable, usage: list[Mapping[str, Any]]) -> str | None:
    """Whether the subscription's vCPU quota of the size's family in the region leaves room for the nodes
    (`usage`: what `az vm list-usage` answers)."""
    size = table.sizes[request.vm_size]
    needed = size.vcpus * request.nodes
    for row in usage:
        if row.get("name", {}).get("value") == size.quota_family:
            free = int(row.get("limit", 0)) - int(row.get("currentValue", 0))
            if free < needed:
                return (
                    f"{request.nodes} x {request.vm_size} need {needed} vCPUs of {size.quota_family} in "
                    f"{request.location}, and the quota leaves {free}: ask for more (Azure portal, Quotas) "
                    "or choose fewer nodes"
                )
            return None
    return f"no {size.quota_family} quota in {request.location}: ask for it (Azure portal, Quotas) first"


def hourly_cost(request: OnboardRequest, table: SizeTable) -> str:
    size = table.sizes[request.vm_size]
    total = request.nodes * size.usd_per_hour + table.head_node_usd_per_hour
    return (
        f"about ${total:.2f} an hour while it runs ({request.nodes} x {request.vm_size} at "
        f"${size.usd_per_hour:.2f} and the head node at ${table.head_node_usd_per_hour:.2f}; list prices "
        f"{table.prices_as_of}, UNVERIFIED: check the Azure pricing calculator)"
    )


@dataclass(frozen=True)
class AzCommands:
    """The `az` command lines of an onboarding, in the order they run. `deploy` and `what_if` read the
    secrets' JSON on standard input (`--parameters @-`)."""

    account: list[str]
    usage: list[str]
    group: list[str]
    what_if: list[str]
    deploy: list[str]
    operations: list[str]
    vaults: list[str]

    def certificate(self, vault: str, path: str) -> list[str]:
        return [
            "az", "keyvault", "certificate", "download", "--vault-name", vault, "--name", CERTIFICATE_NAME,
            "--file", path, "--encoding", "PEM",
        ]  # fmt: skip


def az_commands(request: OnboardRequest, parameters_file: str) -> AzCommands:
    rg = ["--resource-group", request.resource_group]
    template = ["--name", request.deployment, "--template-uri", TEMPLATE_URL]
    parameters = ["--parameters", f"@{parameters_file}", "--parameters", "@-"]
    return AzCommands(
        account=["az", "account", "show", "--output", "json"],
        usage=["az", "vm", "list-usage", "--location", request.location, "--output", "json"],
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
        vaults=[
            "az", "resource", "list", *rg, "--resource-type", "Microsoft.KeyVault/vaults", "--output", "json",
        ],
    )  # fmt: skip


def delete_command(resource_group: str) -> list[str]:
    return ["az", "group", "delete", "--name", resource_group, "--yes", "--no-wait"]


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
