"""A stand-in for the Azure CLI, put on PATH as `az` by tests/test_onboard.py.

It follows the real one (azure-cli 2.91.0; docs/facts/azure-cli-and-hpcpack-template.md), never hpcjob:
- each command takes only its own options (and az's global ones), and refuses the rest as argparse does,
  with exit code 2; a missing required option likewise;
- answers in az's shapes: `vm list-usage` gives currentValue and limit as strings and spells quota
  families its own way, `vm list-skus` its way (with spaces), `--size` matches a substring, and sizes
  the subscription may not use are left out;
- Azure Resource Manager's checks: a deployment's parameters against the template (the copy the tests
  keep), a resource group that does not exist (what-if and create: ResourceGroupNotFound, exit code 3);
- the template's Key Vault (named from the resource group) uses role-based access and the deploying user
  has no data role: `keyvault certificate download` is Forbidden (and refuses an existing --file first,
  as az does); its nested deployment KeyVaultWithCert gives the certificate's SHA-1 thumbprint;
- deleting a resource group soft-deletes its vault; a vault of the same name cannot be made again until
  it is purged (the deployment fails on it with ConflictError);
- the template's VMs (`vm list`, az's flattened shape): the head node, tagged for the add-nodes template,
  and the nodes, Spot ones with priority Spot and evictionPolicy Deallocate; the add-nodes template
  (`--template-uri` names which) checked against its own copy, `--parameters KEY=VALUE` typed by the
  template as az types it, the head node and the network it joins looked up, and a node of a name that
  exists refused; `vm list-usage` has the Spot VMs' own regional quota.

It records each call's arguments (and, for the commands that read `@-`, the NAMES of the parameters it got
on stdin, never their values) to $FAKE_AZ_LOG, one JSON object per line. Knobs (environment):
FAKE_AZ_STATE (a folder for its state), FAKE_AZ_QUOTA (vCPUs free in the A100 family, default 1000),
FAKE_AZ_REGIONAL (Total Regional vCPUs free, default 2000), FAKE_AZ_SLOW_DELETE=1 (`group delete --no-wait`
leaves the group Deleting, its vault not yet soft-deleted), FAKE_AZ_NOT_OFFERED (a size the subscription
may not use), FAKE_AZ_FAIL=1 (the deployment fails on a node VM), FAKE_AZ_DNS (the head node's name),
FAKE_AZ_CERT (a PEM file: the certificate the Key Vault made), FAKE_AZ_LOGGED_OUT=1, FAKE_AZ_SPOT_QUOTA
(Spot vCPUs free in the region, default 1000).
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

# The templates the tests keep (tests/reference/arm), by the file name that ends a --template-uri.
TEMPLATES = Path(__file__).resolve().parent / "reference" / "arm" / "GeneratedTemplates"
TEMPLATE = TEMPLATES / "new-1hn-lnxcn-no-ad.json"
ADD_NODES = TEMPLATES / "add-lnx-compute-nodes.json"
STATE_DIR = Path(os.environ["FAKE_AZ_STATE"])
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
RESOURCES = [
    ("Microsoft.Network/virtualNetworks", "{name}vnet"),
    ("Microsoft.KeyVault/vaults", "{vault}"),
    ("Microsoft.Network/publicIPAddresses", "{name}PublicIp"),
    ("Microsoft.Compute/virtualMachines", "{name}"),
    ("Microsoft.Compute/virtualMachines", "IaaSLnxCN000"),
    ("Microsoft.Compute/virtualMachines", "IaaSLnxCN001"),
]
GLOBAL = {"--output", "-o", "--query", "--only-show-errors", "--debug", "--verbose", "--subscription"}
# What `deployment group create` and `what-if` both take.
DEPLOYMENT = {
    *("--resource-group", "-g", "--name", "-n", "--template-uri", "-u", "--template-file", "-f"),
    *("--parameters", "-p", "--mode", "--no-prompt", "--validation-level"),
}
# Each command's options as azure-cli declares them (its _params.py), by the name hpcjob may use; the
# value-less ones (flags) in FLAGS. Required ones are listed second.
COMMANDS: dict[str, tuple[set[str], set[str]]] = {
    "account show": (set(), set()),
    "vm list-usage": ({"--location", "-l"}, {"--location"}),
    "vm list-skus": ({"--location", "-l", "--size", "-s", "--resource-type", "-r", "--zone", "--all"}, set()),
    "keyvault list-deleted": ({"--resource-type"}, set()),
    "keyvault purge": ({"--name", "-n", "--hsm-name", "--location", "-l", "--no-wait"}, set()),
    "keyvault certificate download": (
        {"--vault-name", "--name", "-n", "--file", "-f", "--encoding", "-e", "--version", "-v", "--id"},
        {"--file"},
    ),
    "group exists": ({"--name", "-n", "--resource-group", "-g"}, {"--name"}),
    "group show": ({"--name", "-n", "--resource-group", "-g"}, {"--name"}),
    "group create": (
        {"--name", "-n", "--location", "-l", "--tags", "--managed-by"},
        {"--name", "--location"},
    ),
    "group delete": (
        {"--name", "-n", "--yes", "-y", "--no-wait", "--force-deletion-types", "-f"},
        {"--name"},
    ),
    "deployment group what-if": (
        DEPLOYMENT | {"--result-format", "-r", "--no-pretty-print", "--exclude-change-types", "-x"},
        {"--resource-group"},
    ),
    "deployment group create": (
        DEPLOYMENT | {"--no-wait", "--what-if", "-c", "--confirm-with-what-if", "--rollback-on-error"},
        {"--resource-group"},
    ),
    "deployment group show": ({"--resource-group", "-g", "--name", "-n"}, {"--resource-group", "--name"}),
    # vm/_params.py L534-539 (azure-cli 2.91.0): --vmss, --show-details/-d, and the resource group.
    "vm list": ({"--resource-group", "-g", "--vmss", "--show-details", "-d"}, set()),
    "deployment operation group list": (
        {"--resource-group", "-g", "--name", "-n"},
        {"--resource-group", "--name"},
    ),
    # vm/aaz/latest/vm/_deallocate.py and _start.py (azure-cli 2.91.0): the VM by --ids (id_part "name")
    # or by resource group and name; --no-wait (AZ_SUPPORT_NO_WAIT).
    "vm deallocate": ({"--ids", "--resource-group", "-g", "--name", "-n", "--vm-name", "--no-wait"}, set()),
    "vm start": ({"--ids", "--resource-group", "-g", "--name", "-n", "--vm-name", "--no-wait"}, set()),
    # vm/_params.py ('vm identity assign': --identities nargs='*', --role, --scope; the VM's name and group).
    "vm identity assign": (
        {"--ids", "--resource-group", "-g", "--name", "-n", "--identities", "--role", "--scope"},
        set(),
    ),
}
FLAGS = {"--all", "--yes", "-y", "--no-wait", "--only-show-errors", "--debug", "--verbose", "--no-prompt",
         "--no-pretty-print", "--what-if", "-c", "--confirm-with-what-if",
         "--show-details", "-d"}  # fmt: skip
# A size's family as `vm list-skus` gives it, and its quota row as `vm list-usage` does
# (docs/facts/azure-cli-and-hpcpack-template.md section 1).
SKUS = {
    "Standard_NC24ads_A100_v4": ("StandardNCADSA100v4Family", 24),
    "Standard_NC96ads_A100_v4": ("StandardNCADSA100v4Family", 96),
    "Standard_NC4as_T4_v3": ("Standard NCASv3_T4 Family", 4),
    "Standard_ND96asr_v4": ("Standard NDASv4_A100 Family", 96),
    "Standard_ND96isr_H100_v5": ("standardNDSH100v5Family", 96),
    "Standard_DS4_v2": ("standardDSv2Family", 8),
    "Standard_F16s_v2": ("standardFSv2Family", 16),
}
USAGE = {
    "standardNCADSA100v4Family": "Standard NCADS_A100_v4 Family vCPUs",
    "standardNCASv3_T4Family": "Standard NCASv3_T4 Family vCPUs",
    "standardNDASv4_A100Family": "Standard NDASv4_A100 Family vCPUs",
    "standardNDSH100v5Family": "Standard NDSH100v5 Family vCPUs",
    "standardDSv2Family": "Standard DSv2 Family vCPUs",
    "standardFSv2Family": "Standard FSv2 Family vCPUs",
}


def fail(message: str, code: int = 1) -> None:
    print(f"ERROR: {message}", file=sys.stderr)
    raise SystemExit(code)


def parse(command: str, words: list[str]) -> dict[str, list[str]]:
    """The options of one command by their long name, as argparse would take them."""
    allowed, required = COMMANDS[command]
    given: dict[str, list[str]] = {}
    unknown = []
    index = 0
    while index < len(words):
        word = words[index]
        if word not in allowed | GLOBAL:
            unknown.append(word)
            index += 1
            continue
        if word in FLAGS:
            given.setdefault(word, []).append("")
            index += 1
            continue
        if index + 1 >= len(words):
            fail(f"argument {word}: expected one argument", 2)
        values = []
        index += 1
        while index < len(words) and not (words[index].startswith("-") and words[index] != "-"):
            values.append(words[index])
            index += 1
        given.setdefault(word, []).extend(values)
    if unknown:
        fail(f"unrecognized arguments: {' '.join(unknown)}", 2)
    short = {
        "-n": "--name",
        "-g": "--resource-group",
        "-l": "--location",
        "-f": "--file",
        "-p": "--parameters",
    }
    for alias, long in short.items():
        if alias in given:
            given.setdefault(long, []).extend(given.pop(alias))
    missing = sorted(required - set(given))
    if missing:
        fail(f"the following arguments are required: {', '.join(missing)}", 2)
    return given


def load() -> dict[str, Any]:
    path = STATE_DIR / "state.json"
    if path.exists():
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    return {"groups": {}, "vaults": {}, "deleted_vaults": {}, "deployments": {}, "vms": {}, "grows": {}}


def save(state: dict[str, Any]) -> None:
    (STATE_DIR / "state.json").write_text(json.dumps(state))


def vault_name(group: str) -> str:
    # take('<group>-kv-<uniqueString(resourceGroup().id)>', 24): a stand-in for uniqueString.
    return f"{group}-kv-{hashlib.sha256(group.lower().encode()).hexdigest()[:13]}"[:24]


def template_of(options: dict[str, list[str]]) -> Path:
    """The template a deployment names, by the file name at the end of its --template-uri."""
    uri = (options.get("--template-uri") or options.get("-u") or [""])[0]
    found = {path.name: path for path in (TEMPLATE, ADD_NODES)}.get(uri.rsplit("/", 1)[-1])
    if found is None:
        fail(f"Unable to retrieve url {uri}")  # what az says of a template it cannot fetch
    assert found is not None
    return found


def parameters(values: list[str], stdin: str, template: Path = TEMPLATE) -> dict[str, Any]:
    """The deployment's parameters as az merges them, in order (azure-cli 2.91.0 resource/custom.py
    L163-212 _process_parameters): each @file or @- (stdin), which az has read before (core's @ prefix),
    a JSON object, or KEY=VALUE, whose value takes KEY's type in the template (L128-160
    _try_parse_key_value_object: int(), 'true', or the text; an unknown KEY is refused)."""
    declared = json.loads(template.read_text())
    merged: dict[str, Any] = {}
    for source in values:
        text = stdin if source == "@-" else Path(source[1:]).read_text() if source.startswith("@") else source
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            key, equals, value = text.partition("=")
            if not equals:
                fail(f"Unable to parse parameter: {text}")
            spec = declared["parameters"].get(key)
            if spec is None:
                allowed = ", ".join(sorted(declared["parameters"]))
                fail(f"unrecognized template parameter '{key}'. Allowed parameters: {allowed}")
            ref = spec.get("$ref", "").removeprefix("#/definitions/")
            kind = str(
                spec.get("type") or declared.get("definitions", {}).get(ref, {}).get("type", "")
            ).lower()
            typed: Any = int(value) if kind == "int" else value.lower() == "true" if kind == "bool" else value
            merged[key] = {"value": typed}
            continue
        merged.update(data.get("parameters", data))
    return merged


def check_against_template(given: dict[str, Any], template: Path = TEMPLATE) -> None:
    declared = json.loads(template.read_text())["parameters"]
    unknown = sorted(set(given) - set(declared))
    if unknown:
        fail(f"InvalidTemplate: the template has no parameter(s) {', '.join(unknown)}")
    missing = sorted(n for n, spec in declared.items() if "defaultValue" not in spec and n not in given)
    if missing:
        fail(f"InvalidTemplate: missing value(s) for parameter(s) {', '.join(missing)}")


def need_group(state: dict[str, Any], group: str) -> None:
    if group.lower() not in state["groups"]:
        fail(f"(ResourceGroupNotFound) Resource group '{group}' could not be found.", 3)


def operations(state: dict[str, Any], group: str) -> list[dict[str, Any]]:
    info = state["deployments"].get(group.lower())
    if info is None:
        fail("(DeploymentNotFound) Deployment 'x' could not be found.", 3)
    done = min(len(RESOURCES), int((time.time() - info["time"]) / 0.2) + 1)
    rows = []
    for index, (kind, name) in enumerate(RESOURCES[:done]):
        props: dict[str, Any] = {"provisioningState": "Succeeded", "duration": "PT1M2S"}
        inner = None
        if info["conflict"] and kind == "Microsoft.KeyVault/vaults":
            inner = {
                "code": "ConflictError",
                "message": f"A vault with the same name already exists in deleted state. You need to either "
                f"recover or purge existing key vault. Vault name: '{info['names']['vault']}'.",
            }
        elif info["fail"] and index == len(RESOURCES) - 1:
            inner = {
                "code": "SkuNotAvailable",
                "message": "The requested size for resource 'IaaSLnxCN001' is currently not available in "
                "location 'eastus'.",
            }
        if inner is not None:
            props["provisioningState"] = "Failed"
            props["statusMessage"] = {
                "status": "Failed",
                "error": {
                    "code": "ResourceDeploymentFailure",
                    "message": "The resource operation completed with terminal provisioning state 'Failed'.",
                    "details": [inner],
                },
            }
        props["targetResource"] = {"resourceType": kind, "resourceName": name.format(**info["names"])}
        rows.append({"operationId": f"op{index}", "properties": props})
    rows.append(
        {"operationId": "end", "properties": {"provisioningState": "Succeeded", "targetResource": None}}
    )
    return rows


def deploy(state: dict[str, Any], options: dict[str, list[str]], stdin: str) -> None:
    group = options["--resource-group"][0]
    need_group(state, group)
    if template_of(options) == ADD_NODES:
        deploy_nodes(state, options, stdin)
        return
    given = parameters(options.get("--parameters", []), stdin)
    check_against_template(given)
    vault = vault_name(group)
    names = {"name": given["clusterName"]["value"], "vault": vault}
    conflict = vault in state["deleted_vaults"]
    failing = bool(os.environ.get("FAKE_AZ_FAIL")) or conflict
    state["deployments"][group.lower()] = {
        "time": time.time(),
        "names": names,
        "fail": bool(os.environ.get("FAKE_AZ_FAIL")),
        "conflict": conflict,
    }
    save(state)
    time.sleep(0.2 * len(RESOURCES) + 0.1)
    if failing:
        fail(json.dumps({"code": "DeploymentFailed", "message": "At least one resource operation failed."}))
    state["vaults"][vault] = group
    # The VMs it made: the head node (tagged with the vault's certificate, as head-node.bicep tags it, for
    # the add-nodes template to find) and the nodes, prefix + 3 digits from 000.
    value = {name: spec["value"] for name, spec in given.items()}
    spot = value.get("useSpotInstanceForComputeNodes") == "Yes"
    head_size = value.get("headNodeVMSize", "Standard_DS4_v2")
    vms = [vm(group, value["clusterName"], head_size, False, {"KV_Name": vault})]
    prefix = value.get("computeNodeNamePrefix", "IaaSLnxCN")
    vms += [
        vm(group, f"{prefix}{index:03d}", value.get("computeNodeVMSize", "Standard_D3_v2"), spot)
        for index in range(int(value.get("computeNodeNumber", 10)))
    ]
    state["vms"][group.lower()] = vms
    state.setdefault("vnets", {})[group.lower()] = [f"{value['clusterName']}vnet"]
    der = ssl.PEM_cert_to_DER_cert(Path(os.environ["FAKE_AZ_CERT"]).read_text())
    state["deployments"][group.lower()]["thumbprint"] = hashlib.sha1(der).hexdigest().upper()
    save(state)
    dns = os.environ.get("FAKE_AZ_DNS", f"{names['name']}abc.eastus.cloudapp.azure.com")
    outputs = {"clusterDNSName": {"type": "String", "value": dns}}
    name = options["--name"][0]
    print(json.dumps({"name": name, "properties": {"provisioningState": "Succeeded", "outputs": outputs}}))


def vm(group: str, name: str, size: str, spot: bool, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """A VM as `az vm list` gives it: the service's object with its properties flattened into it
    (azure-cli 2.91.0 vm/aaz/latest/vm/_list.py L69-72, client_flatten=True); a template's Spot node has
    priority Spot and evictionPolicy Deallocate (Bicep/shared/compute-node.bicep L238-239 @dea762e)."""
    return {
        "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.Compute/"
        f"virtualMachines/{name}",
        "name": name,
        "type": "Microsoft.Compute/virtualMachines",
        "location": "eastus",
        "tags": tags or {},
        "hardwareProfile": {"vmSize": size},
        "priority": "Spot" if spot else "Regular",
        **({"evictionPolicy": "Deallocate"} if spot else {}),
        "provisioningState": "Succeeded",
    }


def deploy_nodes(state: dict[str, Any], options: dict[str, list[str]], stdin: str) -> None:
    """The add-nodes template (Bicep/add-lnx-compute-nodes.bicep @dea762e): it reads the head node VM's
    tags (the first name of clusterConnectionString, in this resource group: an `existing` resource), puts
    the nodes in the named network, and names them prefix + padLeft(start + i, 3). A node of a name that
    exists already would be that VM redeployed with another password: Azure refuses to change a VM's
    osProfile (PropertyChangeNotAllowed; the message UNVERIFIED)."""
    group, name = options["--resource-group"][0], options["--name"][0]
    given = parameters(options.get("--parameters", []), stdin, ADD_NODES)
    check_against_template(given, ADD_NODES)
    value = {key: spec["value"] for key, spec in given.items()}
    vms = state["vms"].setdefault(group.lower(), [])
    head = value["clusterConnectionString"].split(",")[0].split(".")[0]
    if not any(v["name"].lower() == head.lower() and v["tags"] for v in vms):
        fail(f"(ResourceNotFound) The Resource 'Microsoft.Compute/virtualMachines/{head}' under resource "
             f"group '{group}' was not found.", 3)  # fmt: skip
    if value["virtualNetworkName"] not in state.get("vnets", {}).get(group.lower(), []):
        fail(f"(InvalidResourceReference) Resource /subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/"
             f"providers/Microsoft.Network/virtualNetworks/{value['virtualNetworkName']} referenced by the "
             "nodes was not found.")  # fmt: skip
    start, spot = int(value.get("computeNodeNameStartIndex", 0)), value.get("useSpotInstances") == "Yes"
    names = [
        f"{value['computeNodeNamePrefix']}{start + i:03d}"
        for i in range(int(value.get("computeNodeNumber", 10)))
    ]
    taken = [n for n in names if n.lower() in {v["name"].lower() for v in vms}]
    state["grows"].setdefault(group.lower(), {})[name] = {"time": time.time(), "nodes": names, "taken": taken}
    save(state)
    time.sleep(0.2 * (len(names) + 2) + 0.1)
    if taken:
        fail(
            f"(PropertyChangeNotAllowed) Changing property 'osProfile.adminPassword' is not allowed. "
            f"({taken[0]})"
        )
    vms += [vm(group, n, value.get("computeNodeVMSize", "Standard_D3_v2"), spot) for n in names]
    save(state)
    print(json.dumps({"name": name, "properties": {"provisioningState": "Succeeded", "outputs": {}}}))


def grow_operations(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The add-nodes deployment's rows: its nested deployments, the nodes' (create<node>) and the two that
    read the head node's tags."""
    parts = ["keyvaultandcert", "monitor", *(f"create{node}" for node in info["nodes"])]
    done = min(len(parts), int((time.time() - info["time"]) / 0.2) + 1)
    rows = []
    for index, part in enumerate(parts[:done]):
        props: dict[str, Any] = {"provisioningState": "Succeeded", "duration": "PT2M"}
        if part.removeprefix("create") in info["taken"]:
            props["provisioningState"] = "Failed"
            said = {"code": "PropertyChangeNotAllowed",
                    "message": "Changing property 'osProfile.adminPassword' is not allowed."}  # fmt: skip
            props["statusMessage"] = {"status": "Failed", "error": said}
        props["targetResource"] = {"resourceType": "Microsoft.Resources/deployments", "resourceName": part}
        rows.append({"operationId": f"op{index}", "properties": props})
    return rows


# `vm deallocate` and `vm start` of VMs by --ids, one job per id as azure-cli core runs them (a failing
# id among others only warned of), with `--no-wait`; each takes FAKE_AZ_VM_DELAY seconds (default 0.5).
# What each shows meanwhile and after in `vm list --show-details`: its `powerState` is the instance view's
# PowerState display statuses joined (vm/custom.py get_vm_details); "VM running" is PowerState/running's
# (MicrosoftDocs/azure-compute-docs @3255b21d articles/virtual-machines/states-billing.md), the others
# by the same pattern (UNVERIFIED).
POWER = {"deallocate": ("VM deallocating", "VM deallocated"), "start": ("VM starting", "VM running")}


def power_state(state: dict[str, Any], row: dict[str, Any]) -> str:
    """A VM's powerState now: running unless a deallocate or start of it says otherwise."""
    change = state.get("power", {}).get(str(row["id"]).lower())
    if change is None:
        return "VM running"
    during, after = POWER[change["action"]]
    return after if time.time() >= change["at"] else during


def power(state: dict[str, Any], action: str, options: dict[str, list[str]]) -> None:
    """`vm deallocate` / `vm start` of each VM named (--ids, else --resource-group and --name), as
    azure-cli core runs an --ids list (commands/__init__.py AzCliCommandInvoker.execute): one job per id;
    one failing alone is its error; with others, a warning each, and exit 0 unless every one failed.
    Each takes FAKE_AZ_VM_DELAY seconds, waited for unless --no-wait."""
    ids = options.get("--ids") or []
    if not ids:
        group, name = (options.get("--resource-group") or [""])[0], (options.get("--name") or [""])[0]
        if not group or not name:
            fail("usage error: --ids IDS [IDS ...] | --resource-group NAME --name NAME", 2)
        need_group(state, group)
        ids = [f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.Compute/"
               f"virtualMachines/{name}"]  # fmt: skip
    known = {str(v["id"]).lower() for vms in state.get("vms", {}).values() for v in vms}
    delay = float(os.environ.get("FAKE_AZ_VM_DELAY", "0.5"))
    failed = []
    for vm_id in ids:
        if vm_id.lower() not in known:
            parts = vm_id.split("/")
            group = parts[4] if len(parts) > 4 else "?"
            failed.append((vm_id, f"(ResourceNotFound) The Resource 'Microsoft.Compute/virtualMachines/"
                                  f"{parts[-1]}' under resource group '{group}' was not found."))  # fmt: skip
            continue
        state.setdefault("power", {})[vm_id.lower()] = {"action": action, "at": time.time() + delay}
    save(state)
    if len(failed) == 1 and len(ids) == 1:
        fail(failed[0][1], 3)
    for vm_id, message in failed:
        print(f'WARNING: {vm_id}: "{message}"', file=sys.stderr)
    if failed and len(failed) == len(ids):
        fail("Encountered more than one exception.")
    if failed:
        print("WARNING: Encountered more than one exception.", file=sys.stderr)
    if "--no-wait" not in options:
        time.sleep(delay)


def answer(command: str, options: dict[str, list[str]], stdin: str) -> Any:
    state = load()
    first = {key: values[0] if values else "" for key, values in options.items()}
    if command in ("vm deallocate", "vm start"):
        power(state, command.split()[1], options)
        return None
    if command == "vm list" and {"--show-details", "-d"} & set(options):
        plain = {key: values for key, values in options.items() if key not in ("--show-details", "-d")}
        return [{**row, "powerState": power_state(state, row)} for row in answer(command, plain, stdin)]
    if command == "account show":
        return {"id": SUBSCRIPTION, "name": "Test", "user": {"name": "alice"}}
    if command == "vm list-skus":
        hidden = os.environ.get("FAKE_AZ_NOT_OFFERED", "")
        size = first.get("--size", "").lower()
        return [
            {"name": name, "family": family, "resourceType": "virtualMachines", "locations": ["eastus"],
             "capabilities": [{"name": "vCPUs", "value": str(vcpus)}], "restrictions": []}
            for name, (family, vcpus) in SKUS.items()
            if size in name.lower() and name != hidden
        ]  # fmt: skip
    if command == "vm list-usage":
        free = {"standardNCADSA100v4Family": int(os.environ.get("FAKE_AZ_QUOTA", "1000"))}
        rows = [
            {"currentValue": "0", "limit": str(free.get(value, 1000)), "localName": local,
             "name": {"localizedValue": local, "value": value}, "unit": "Count"}
            for value, local in USAGE.items()
        ]  # fmt: skip
        regional = os.environ.get("FAKE_AZ_REGIONAL", "2000")
        spot = os.environ.get("FAKE_AZ_SPOT_QUOTA", "1000")  # Spot VMs' own regional quota
        rows.append(
            {"currentValue": "0", "limit": spot, "localName": "Total Regional Low-priority vCPUs",
             "name": {"localizedValue": "Total Regional Low-priority vCPUs", "value": "lowPriorityCores"},
             "unit": "Count"}
        )  # fmt: skip
        rows.append(
            {"currentValue": "0", "limit": regional, "localName": "Total Regional vCPUs",
             "name": {"localizedValue": "Total Regional vCPUs", "value": "cores"}, "unit": "Count"}
        )  # fmt: skip
        return rows
    if command == "keyvault list-deleted":
        kind = first.get("--resource-type")
        if kind not in (None, "vault", "hsm"):
            fail("Unsupported resource type: " + str(kind))
        return [
            {"id": f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.KeyVault/locations/eastus/"
                   f"deletedVaults/{name}",
             "name": name, "type": "Microsoft.KeyVault/deletedVaults",
             "properties": {"vaultId": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
                            f"Microsoft.KeyVault/vaults/{name}", "location": "eastus",
                            "deletionDate": "2026-11-20T10:00:00+00:00",
                            "scheduledPurgeDate": "2027-02-18T10:00:00+00:00", "purgeProtectionEnabled": None,
                            "tags": {}}}
            for name, group in state["deleted_vaults"].items()
            if kind != "hsm"
        ]  # fmt: skip
    if command == "keyvault purge":
        name = first.get("--name", "")
        if name not in state["deleted_vaults"]:
            fail(f"No deleted Vault or HSM was found with name {name}")
        del state["deleted_vaults"][name]
        save(state)
        return None
    if command == "keyvault certificate download":
        if Path(first["--file"]).exists():
            fail(f"File or directory named '{first['--file']}' already exists.")
        fail(
            "(Forbidden) Caller is not authorized to perform action on resource.\nIf role assignments, deny "
            "assignments or role definitions were changed recently, please observe propagation time.\n"
            "Action: 'Microsoft.KeyVault/vaults/secrets/getSecret/action'\nCode: Forbidden"
        )
    if command == "group exists":
        return first["--name"].lower() in state["groups"]
    if command == "group show":
        need_group(state, first["--name"])
        group = state["groups"][first["--name"].lower()]
        deleting = first["--name"].lower() in state.get("deleting", [])
        return {"id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}", "name": group,
                "properties": {"provisioningState": "Deleting" if deleting else "Succeeded"}}  # fmt: skip
    if command == "group create":
        group = first["--name"]
        if group.lower() in state.get("deleting", []):
            fail(
                f"(ResourceGroupBeingDeleted) The resource group '{group}' is in deprovisioning state and "
                "cannot perform this operation."
            )
        state["groups"][group.lower()] = group
        save(state)
        return {"id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}", "name": group,
                "properties": {"provisioningState": "Succeeded"}}  # fmt: skip
    if command == "group delete":
        group = first["--name"]
        need_group(state, group)
        if "--no-wait" in options and os.environ.get("FAKE_AZ_SLOW_DELETE"):  # still there, on its way out
            state.setdefault("deleting", []).append(group.lower())
            save(state)
            return None
        del state["groups"][group.lower()]
        for vault, owner in list(state["vaults"].items()):
            if owner.lower() == group.lower():  # soft delete: the name stays taken
                del state["vaults"][vault]
                state["deleted_vaults"][vault] = owner
        state["deployments"].pop(group.lower(), None)
        state["vms"].pop(group.lower(), None)
        state["grows"].pop(group.lower(), None)
        save(state)
        return None
    if command == "deployment group what-if":
        need_group(state, first["--resource-group"])
        template = template_of(options)
        check_against_template(parameters(options.get("--parameters", []), stdin, template), template)
        print("Resource and property changes are indicated with this symbol:\n  + Create\n")
        print("Resource changes: 23 to create.")
        return None
    if command == "deployment group create":
        deploy(state, options, stdin)
        return None
    if command == "deployment group show":
        info = state["deployments"].get(first["--resource-group"].lower()) or {}
        if first["--name"] != "KeyVaultWithCert" or "thumbprint" not in info:
            fail(f"(DeploymentNotFound) Deployment '{first['--name']}' could not be found.", 3)
        settings = {
            "thumbprint": info["thumbprint"],
            "url": "https://x.vault.azure.net/secrets/HPCPackCommunication/1",
            "vaultName": info["names"]["vault"],
            "vaultResourceGroup": first["--resource-group"],
        }
        return {"name": "KeyVaultWithCert", "properties": {"provisioningState": "Succeeded",
                "outputs": {"certSettings": {"type": "Object", "value": settings}}}}  # fmt: skip
    if command == "deployment operation group list":
        grown = state["grows"].get(first["--resource-group"].lower(), {}).get(first["--name"])
        return operations(state, first["--resource-group"]) if grown is None else grow_operations(grown)
    if command == "vm identity assign":
        group, name, identity = (
            first.get("--resource-group", ""),
            first.get("--name", ""),
            first.get("--identities"),
        )
        need_group(state, group)
        if name.lower() not in {str(v["name"]).lower() for v in state["vms"].get(group.lower(), [])}:
            fail(f"(ResourceNotFound) The Resource 'Microsoft.Compute/virtualMachines/{name}' under resource "
                 f"group '{group}' was not found.", 3)  # fmt: skip
        if identity and "/providers/Microsoft.ManagedIdentity/userAssignedIdentities/" not in identity:
            fail(f"(InvalidIdentityValues) Invalid value for the identities '{identity}'.")
        state.setdefault("identities", {})[f"{group.lower()}/{name.lower()}"] = identity or "[system]"
        save(state)
        given = {identity: {"clientId": "c", "principalId": "p"}} if identity else {}
        return {"type": "UserAssigned" if identity else "SystemAssigned", "userAssignedIdentities": given}
    if command == "vm list":
        group = first.get("--resource-group")
        if group is None:
            return [v for vms in state["vms"].values() for v in vms]
        need_group(state, group)
        return state["vms"].get(group.lower(), [])
    fail(f"'{command}' is not in the fake az")
    return None


def main() -> None:
    args = sys.argv[1:]
    stdin = sys.stdin.read() if "@-" in args else ""
    entry: dict[str, object] = {"argv": args}
    if stdin:
        entry["stdin_parameters"] = sorted(json.loads(stdin))
    with open(os.environ["FAKE_AZ_LOG"], "a") as log:
        log.write(json.dumps(entry) + "\n")
    if os.environ.get("FAKE_AZ_LOGGED_OUT"):
        fail("Please run 'az login' to setup account.")
    words = [a for a in args[:4] if not a.startswith("-")]
    command = next((" ".join(words[:n]) for n in (4, 3, 2) if " ".join(words[:n]) in COMMANDS), None)
    if command is None:
        fail(f"'{' '.join(words)}' is not in the fake az", 2)
    assert command is not None
    result = answer(command, parse(command, args[len(command.split()) :]), stdin)
    if result is not None:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
