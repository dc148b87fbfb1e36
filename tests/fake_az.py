"""A stand-in for the Azure CLI, put on PATH as `az` by tests/test_onboard.py.

It records each call's arguments (and, for the commands that read `@-`, the NAMES of the parameters it
got on stdin, never their values) to $FAKE_AZ_LOG, one JSON object per line, and answers with JSON
shaped like real `az` output. Like Azure Resource Manager, it checks a deployment's parameters against
the template (the copy the tests keep): every name known, every required one given. Knobs (environment):
FAKE_AZ_STATE (a folder for its state), FAKE_AZ_QUOTA (vCPUs free, default 1000), FAKE_AZ_FAIL=1 (the
deployment fails on a node VM), FAKE_AZ_DNS (the head node's name), FAKE_AZ_CERT (a PEM file for the
Key Vault certificate), FAKE_AZ_LOGGED_OUT=1.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

TEMPLATE = (
    Path(__file__).resolve().parent / "reference" / "arm" / "GeneratedTemplates" / "new-1hn-lnxcn-no-ad.json"
)
STATE = Path(os.environ["FAKE_AZ_STATE"])
RESOURCES = [
    ("Microsoft.Network/virtualNetworks", "{name}vnet"),
    ("Microsoft.KeyVault/vaults", "{rg}-kv-abc123"),
    ("Microsoft.Network/publicIPAddresses", "{name}PublicIp"),
    ("Microsoft.Compute/virtualMachines", "{name}"),
    ("Microsoft.Compute/virtualMachines", "IaaSLnxCN000"),
    ("Microsoft.Compute/virtualMachines", "IaaSLnxCN001"),
]


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def fail(message: str) -> None:
    print(f"ERROR: {message}", file=sys.stderr)
    raise SystemExit(1)


def parameters(args: list[str], stdin: str) -> dict[str, object]:
    """The deployment's parameters as az merges them: each --parameters, @file or @- (stdin)."""
    merged: dict[str, object] = {}
    for i, arg in enumerate(args):
        if arg == "--parameters":
            source = args[i + 1]
            text = stdin if source == "@-" else Path(source[1:]).read_text()
            data = json.loads(text)
            merged.update(data.get("parameters", data))
    return merged


def check_against_template(given: dict[str, object]) -> None:
    declared = json.loads(TEMPLATE.read_text())["parameters"]
    unknown = sorted(set(given) - set(declared))
    if unknown:
        fail(f"InvalidTemplate: the template has no parameter(s) {', '.join(unknown)}")
    missing = sorted(n for n, spec in declared.items() if "defaultValue" not in spec and n not in given)
    if missing:
        fail(f"InvalidTemplate: missing value(s) for parameter(s) {', '.join(missing)}")


def operations(args: list[str]) -> list[dict[str, object]]:
    started = STATE / "deploy-started"
    if not started.exists():
        fail("DeploymentNotFound: Deployment 'x' could not be found.")
    info = json.loads(started.read_text())
    done = min(len(RESOURCES), int((time.time() - info["time"]) / 0.2) + 1)
    rows = []
    for index, (kind, name) in enumerate(RESOURCES[:done]):
        state = "Succeeded"
        props: dict[str, object] = {"provisioningState": state, "duration": "PT1M2S"}
        if info["fail"] and index == len(RESOURCES) - 1:
            props["provisioningState"] = "Failed"
            props["statusMessage"] = {
                "status": "Failed",
                "error": {
                    "code": "ResourceDeploymentFailure",
                    "message": "The resource operation completed with terminal provisioning state 'Failed'.",
                    "details": [
                        {
                            "code": "SkuNotAvailable",
                            "message": "The requested size for resource 'IaaSLnxCN001' is currently not "
                            "available in location 'eastus'.",
                        }
                    ],
                },
            }
        props["targetResource"] = {"resourceType": kind, "resourceName": name.format(**info["names"])}
        rows.append({"operationId": f"op{index}", "properties": props})
    rows.append(
        {"operationId": "end", "properties": {"provisioningState": "Succeeded", "targetResource": None}}
    )
    return rows


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
    command = " ".join(a for a in args[:4] if not a.startswith("-"))
    if command.startswith("account show"):
        print(
            json.dumps(
                {"id": "00000000-0000-0000-0000-000000000001", "name": "Test", "user": {"name": "alice"}}
            )
        )
    elif command.startswith("vm list-usage"):
        free = int(os.environ.get("FAKE_AZ_QUOTA", "1000"))
        a100 = {"value": "standardNCADSA100v4Family", "localizedValue": "Standard NCADS_A100_v4 Family vCPUs"}
        cores = {"value": "cores", "localizedValue": "Total Regional vCPUs"}
        rows = [
            {"name": a100, "currentValue": 0, "limit": free},
            {"name": cores, "currentValue": 0, "limit": 2000},
        ]
        print(json.dumps(rows))
    elif command.startswith("group create"):
        rg = option(args, "--name")
        print(json.dumps({"id": f"/subscriptions/x/resourceGroups/{rg}", "name": rg,
                          "properties": {"provisioningState": "Succeeded"}}))  # fmt: skip
    elif command.startswith("deployment group what-if"):
        check_against_template(parameters(args, stdin))
        print("Resource and property changes are indicated with this symbol:\n  + Create\n")
        print("Resource changes: 23 to create.")
    elif command.startswith("deployment group create"):
        given = parameters(args, stdin)
        check_against_template(given)
        names = {"name": given["clusterName"]["value"], "rg": option(args, "--resource-group")}  # type: ignore[index]
        failing = bool(os.environ.get("FAKE_AZ_FAIL"))
        (STATE / "deploy-started").write_text(
            json.dumps({"time": time.time(), "names": names, "fail": failing})
        )
        time.sleep(0.2 * len(RESOURCES) + 0.1)
        if failing:
            fail(
                json.dumps({"code": "DeploymentFailed", "message": "At least one resource operation failed."})
            )
        dns = os.environ.get("FAKE_AZ_DNS", f"{names['name']}abc.eastus.cloudapp.azure.com")
        outputs = {"clusterDNSName": {"type": "String", "value": dns}}
        print(
            json.dumps(
                {
                    "name": option(args, "--name"),
                    "properties": {"provisioningState": "Succeeded", "outputs": outputs},
                }
            )
        )
    elif command.startswith("deployment operation group"):
        print(json.dumps(operations(args)))
    elif command.startswith("resource list"):
        rg = option(args, "--resource-group")
        print(json.dumps([{"name": f"{rg}-kv-abc123", "type": "Microsoft.KeyVault/vaults"}]))
    elif command.startswith("keyvault certificate download"):
        shutil.copy(os.environ["FAKE_AZ_CERT"], option(args, "--file"))
    elif command.startswith("group delete"):
        pass
    else:
        fail(f"'{command}' is not in the fake az")


if __name__ == "__main__":
    main()
