"""The PowerShell module (powershell/HpcTorch) against the CLI it wraps, with no PowerShell here.

The module turns each command's bound parameters into hpcjob arguments through one table ($script:Cli)
and one rule (ConvertTo-HpcTorchArgument). These tests read the table and each command's param block
from the parsed module (tree-sitter-powershell), build the argument list for tables of parameter sets
by that rule, and hand it to the click command itself (make_context: click's own parser and types), so
that the module and the CLI cannot drift apart: a CLI option without a parameter, a parameter without an
option, or a list of allowed values that differs fails here.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import tree_sitter

from hpcjob.cli import cli

from .artefact_checks import descendants, node_text, parse_powershell, ps_unquote

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "powershell" / "HpcTorch"
PSM1 = MODULE / "HpcTorch.psm1"
# The parameters each command handles itself rather than handing to hpcjob; never a secret in argv.
OWN = {
    "Credential",
    "AdminPassword",
    "AuthenticationKey",
    "State",
    "Timeout",
}
# Wait-HpcTorchJob polls `status` itself: its -PollSeconds is the module's, not an option; -Follow chooses
# `hpcjob wait` instead.
OWN_BY_COMMAND = {"Wait-HpcTorchJob": {"PollSeconds", "Follow"}}
SECRET_TYPES = {"pscredential", "securestring"}
# Single-expression wrappers of the grammar, between a value and its expression.
WRAPPERS = {
    "pipeline", "pipeline_chain", "logical_expression", "bitwise_expression", "comparison_expression",
    "additive_expression", "multiplicative_expression", "format_expression", "range_expression",
    "array_literal_expression", "unary_expression", "statement_list", "key_expression",
}  # fmt: skip


def _named(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    return [c for c in node.named_children if c.type != "comment"]


class Evaluator:
    """The values of the module's data: string literals, @(...) arrays, @{...} tables, script
    variables assigned before, and `+` of tables. Anything else is an error: the table stays data."""

    def __init__(self, source: bytes) -> None:
        self.source = source
        self.variables: dict[str, Any] = {}

    def value(self, node: tree_sitter.Node) -> Any:
        kids = _named(node)
        if node.type in WRAPPERS and len(kids) == 1:
            return self.value(kids[0])
        if node.type == "additive_expression":
            left, right = (self.value(k) for k in kids)
            return {**left, **right} if isinstance(left, dict) else [*left, *right]
        if node.type == "array_literal_expression":
            return [self.value(k) for k in kids]
        if node.type == "array_expression":
            if not kids:
                return []
            inner = self.value(kids[0])
            return inner if isinstance(inner, list) else [inner]
        if node.type == "hash_literal_expression":
            return {} if not kids else self.table(kids[0])
        if node.type == "string_literal":
            text = node_text(self.source, node)
            assert text[0] == "'", f"only verbatim strings in the module's data: {text}"
            return ps_unquote(text)
        if node.type == "simple_name":
            return node_text(self.source, node)
        if node.type == "variable":
            return self.variables[node_text(self.source, node).removeprefix("$script:").lstrip("$")]
        raise AssertionError(f"not data: {node.type} {node_text(self.source, node)!r}")

    def table(self, body: tree_sitter.Node) -> dict[str, Any]:
        entries = {}
        for entry in _named(body):
            key, value = _named(entry)
            entries[str(self.value(key))] = self.value(value)
        return entries


@dataclass
class Parameter:
    name: str
    type: str  # the type literal without brackets, lower case: string, string[], int, switch, ...
    valid_set: list[str] | None = None
    valid_range: tuple[float, float] | None = None
    attributes: list[str] = field(default_factory=list)


@dataclass
class Function:
    name: str
    parameters: dict[str, Parameter]
    help: str
    binding: str  # the CmdletBinding attribute's text


@dataclass
class Module:
    cli: dict[str, dict[str, Any]]
    functions: dict[str, Function]
    exported: list[str]


def _parameter(source: bytes, node: tree_sitter.Node) -> Parameter:
    name = node_text(source, next(c for c in node.named_children if c.type == "variable"))[1:]
    parameter = Parameter(name, "object")
    for attribute in (n for n in descendants(node) if n.type == "attribute"):
        text = node_text(source, attribute)
        if attribute.named_children and attribute.named_children[0].type == "type_literal":
            parameter.type = text[1:-1].lower()
            continue
        parameter.attributes.append(text)
        if text.startswith("[ValidateSet("):
            strings = [n for n in descendants(attribute) if n.type == "string_literal"]
            parameter.valid_set = [ps_unquote(node_text(source, n)) for n in strings]
        elif match := re.fullmatch(r"\[ValidateRange\(([\d.]+), ([\d.]+)\)\]", text):
            parameter.valid_range = (float(match[1]), float(match[2]))
    return parameter


def load_module() -> Module:
    source, root = parse_powershell(PSM1.read_text(encoding="utf-8"))
    assert not root.has_error
    evaluator = Evaluator(source)
    functions = {}
    for node in _named(_named(root)[0]):
        if node.type == "function_statement":
            name = node_text(source, next(c for c in node.children if c.type == "function_name"))
            block = next((n for n in descendants(node) if n.type == "param_block"), None)
            parameters = {}
            binding = ""
            if block is not None:
                binding = node_text(source, block).split("param(")[0]
                for p in (n for n in descendants(block) if n.type == "script_parameter"):
                    parameter = _parameter(source, p)
                    parameters[parameter.name] = parameter
            comments = [node_text(source, n) for n in descendants(node) if n.type == "comment"]
            functions[name] = Function(name, parameters, "\n".join(comments), binding)
            continue
        assignment = next((n for n in descendants(node) if n.type == "assignment_expression"), None)
        if assignment is not None and node.type == "pipeline":
            target, _, value = _named(assignment)
            variable = node_text(source, target).removeprefix("$script:")
            if value is not None and not variable.startswith("$"):
                with contextlib.suppress(AssertionError, KeyError):  # not data: no test reads it
                    evaluator.variables[variable] = evaluator.value(value)
    exported = re.search(r"Export-ModuleMember -Function @\(([^)]*)\)", source.decode())
    assert exported is not None
    names = re.findall(r"'([A-Za-z-]+)'", exported[1])
    return Module(evaluator.variables["Cli"], functions, names)


MOD = load_module()
PUBLIC = [name for name in MOD.exported]


def click_command(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command that `words` name, and the words after its name (options the module fixes)."""
    command: click.Command = cli
    rest = list(words)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        found = command.get_command(click.Context(command), rest.pop(0))
        assert found is not None
        command = found
    return command, rest


def build_arguments(entry: dict[str, Any], bound: dict[str, Any], what_if: bool = False) -> list[str]:
    """ConvertTo-HpcTorchArgument's rule, as the module states it: words; for each bound parameter of
    Options in name order, a switch as its option, a table as option=K=V per key in order, a list as
    option=item per item, else option=value; -WhatIf's option; '--'; then the Arguments in order."""
    arguments = list(entry["Words"])
    for name in sorted(entry["Options"], key=str.lower):
        if name not in bound:
            continue
        option, value = entry["Options"][name], bound[name]
        if value is True or value is False:
            if value:
                arguments.append(option)
        elif isinstance(value, dict):
            arguments += [f"{option}={k}={value[k]}" for k in sorted(value, key=str.lower)]
        else:
            arguments += [f"{option}={item}" for item in (value if isinstance(value, list) else [value])]
    if what_if and "WhatIf" in entry:
        arguments.append(entry["WhatIf"])
    arguments.append("--")
    for name in entry["Arguments"]:
        if name in bound:
            value = bound[name]
            arguments += [str(v) for v in (value if isinstance(value, list) else [value])]
    return arguments


def parse_with_click(entry: dict[str, Any], arguments: list[str]) -> dict[str, Any]:
    """What click makes of the arguments: the command's parameters, parsed and converted."""
    command, fixed = click_command(entry["Words"])
    names = len(entry["Words"]) - len(fixed)  # the words that name the command, not options
    return dict(command.make_context("hpcjob", arguments[names:]).params)


def function_of(key: str) -> Function:
    return MOD.functions[key.split(":")[0]]


def test_every_powershell_file_parses_without_an_error_node() -> None:
    files = sorted(
        path
        for pattern in ("*.ps1", "*.psm1", "*.psd1")
        for path in ROOT.rglob(pattern)
        if ".venv" not in path.parts and ".git" not in path.parts
    )
    assert {p.name for p in files} >= {"HpcTorch.psm1", "HpcTorch.psd1", "Onboard.ps1"}
    for path in files:
        assert not parse_powershell(path.read_text(encoding="utf-8"))[1].has_error, path
    assert parse_powershell("function F { param([string]$x }")[1].has_error  # the check can fail


def test_the_manifest_exports_the_module_s_public_commands_each_with_help_and_examples() -> None:
    manifest = (MODULE / "HpcTorch.psd1").read_text(encoding="utf-8")
    listed = re.search(r"FunctionsToExport\s*=\s*@\(([^)]*)\)", manifest)
    assert listed is not None
    assert re.findall(r"'([A-Za-z-]+)'", listed[1]) == PUBLIC
    assert "RootModule        = 'HpcTorch.psm1'" in manifest
    expected = {
        "Submit-HpcTorchJob", "Get-HpcTorchJob", "Wait-HpcTorchJob", "Stop-HpcTorchJob",
        "Receive-HpcTorchJobLog", "Get-HpcTorchNode", "Mount-HpcTorchShare", "Test-HpcTorchCluster",
        "New-HpcTorchCluster", "Invoke-HpcTorchJob", "Receive-HpcTorchJobResult",
    }  # fmt: skip
    assert set(PUBLIC) == expected
    for name in PUBLIC:
        function = MOD.functions[name]
        assert ".SYNOPSIS" in function.help and ".EXAMPLE" in function.help, name
        assert "[CmdletBinding(" in function.binding, name
        # Each parameter's help names a real parameter; approved verbs only.
        for documented in re.findall(r"\.PARAMETER (\w+)", function.help):
            assert documented in function.parameters, (name, documented)
        assert name.split("-")[0] in {
            "Submit",
            "Get",
            "Wait",
            "Stop",
            "Receive",
            "Mount",
            "Test",
            "New",
            "Invoke",
        }


@pytest.mark.parametrize("key", sorted(MOD.cli))
def test_each_parameter_is_an_option_of_the_command_and_each_option_a_parameter(key: str) -> None:
    entry = MOD.cli[key]
    function = function_of(key)
    command, fixed = click_command(entry["Words"])
    by_option = {opt: p for p in command.params for opt in [*p.opts, *getattr(p, "secondary_opts", [])]}
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    own = OWN | OWN_BY_COMMAND.get(function.name, set())
    if ":" not in key:  # the function's whole param block: every parameter handed on, or its own
        handed = {
            name
            for other, each in MOD.cli.items()
            if other.split(":")[0] == key
            for name in [*each["Options"], *each["Arguments"]]
        }
        assert set(function.parameters) - own == handed, key
    for name, option in entry["Options"].items():
        assert option in by_option, (
            f"{key}: -{name} maps to {option}, which `hpcjob {' '.join(entry['Words'])}` lacks"
        )
        parameter = function.parameters[name]
        assert parameter.type not in SECRET_TYPES, f"{key}: a secret would reach the command line"
        click_param = by_option[option]
        if isinstance(click_param.type, click.Choice):
            assert parameter.valid_set is not None and sorted(parameter.valid_set) == sorted(
                click_param.type.choices
            ), f"{key}: -{name}'s ValidateSet is not {option}'s choices"
        if getattr(click_param, "is_flag", False):
            assert parameter.type == "switch", f"{key}: {option} is a flag, -{name} must be a switch"
        if getattr(click_param, "multiple", False):
            assert parameter.type in ("string[]", "hashtable"), (
                f"{key}: {option} repeats; -{name} is one value"
            )
    # Every option of the command is a parameter, set by the module, or left out on purpose.
    covered = set(entry["Options"].values()) | set(fixed) | set(entry.get("Unexposed", []))
    covered |= {entry["WhatIf"]} if "WhatIf" in entry else set()
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names = set(param.opts) | set(param.secondary_opts)
            assert names & covered or "--help" in names, (
                f"{key}: `hpcjob {' '.join(entry['Words'])}` has {param.opts[-1]}, which no parameter of "
                f"{function.name} gives: add one to the module (and $script:Cli), or to Unexposed"
            )
    assert len(entry["Arguments"]) == len(arguments), (
        f"{key}: one parameter for each of the command's arguments"
    )


@pytest.mark.parametrize("key", sorted(k for k in MOD.cli if ":" not in k))
def test_every_parameter_set_at_once_is_accepted_by_the_click_command(key: str, tmp_path: Path) -> None:
    """Each parameter bound to a value its validation accepts (the ends of its range, the first of its
    set): click parses the whole list, and each option arrives with the value given."""
    entry = MOD.cli[key]
    function = function_of(key)
    folder = str(tmp_path)
    special = {
        "Share": "//HEADNODE/CcpSpoolDir/app",
        "MountPoint": folder,
        "OutputFolder": folder,
        "Script": str(tmp_path / "train.py"),
        "Template": str(tmp_path / "template.json"),
        "Name": "gpu1",
        "Runtime": "90m",
        "Environment": {"FOO": "x=1", "BAR": "y"},
        "Python": "python3",
        "RunId": "train-1",
        "JobFolder": "hpcjob/train",
        "Id": "42",
        "ArgumentList": ["--epochs", "5", "-x", "--"],
    }
    (tmp_path / "train.py").write_text("")
    (tmp_path / "template.json").write_text("{}")
    bound: dict[str, Any] = {}
    for name in [*entry["Options"], *entry["Arguments"]]:
        parameter = function.parameters[name]
        if name in special:
            bound[name] = special[name]
        elif parameter.type == "switch":
            bound[name] = True
        elif parameter.valid_set:
            bound[name] = parameter.valid_set[-1]
        elif parameter.valid_range:
            low, high = parameter.valid_range
            bound[name] = int(high) if parameter.type == "int" else high
            bound[name] = int(low) if parameter.type == "int" and low >= 1 else bound[name]
        elif parameter.type == "hashtable":
            bound[name] = {"key": "value"}
        elif parameter.type == "string[]":
            bound[name] = ["GPU001", "GPU002"]
        else:
            bound[name] = "x"
    parsed = parse_with_click(entry, build_arguments(entry, bound))
    command, _ = click_command(entry["Words"])
    by_option = {opt: p for p in command.params for opt in [*p.opts, *getattr(p, "secondary_opts", [])]}
    for name, option in entry["Options"].items():
        if name not in bound:
            continue
        param = by_option[option]
        got = parsed[param.name]
        if option in getattr(param, "secondary_opts", []):
            assert got is False, (key, name)
            continue
        given = bound[name]
        if isinstance(given, dict):
            assert sorted(got) == sorted(f"{k}={v}" for k, v in given.items()), (key, name)
        elif isinstance(given, list):
            assert list(got) == given, (key, name)
        elif given is True:
            assert got is True, (key, name)
        else:
            assert str(got) == str(given) or got == given or float(got) == float(given), (key, name, got)


SETS = [
    (
        "Submit-HpcTorchJob",
        {"Script": "train.py", "ArgumentList": ["--epochs", "5", "--lr=0.1"], "Nodes": 2, "Wait": True,
         "Node": ["GPU001", "GPU002"], "Environment": {"NCCL_DEBUG": "INFO"}, "NoMountStep": True},
        {"nodes": 2, "wait": True, "node_names": ("GPU001", "GPU002"), "env": ("NCCL_DEBUG=INFO",),
         "mount_step": False, "script": "train.py", "script_args": ("--epochs", "5", "--lr=0.1"),
         "as_json": True, "dry_run": False},
    ),
    (
        "Submit-HpcTorchJob",
        {"Script": "-odd.py", "Name": "--wait", "WhatIf": True},
        {"script": "-odd.py", "name": "--wait", "wait": False, "dry_run": True},
    ),
    ("Get-HpcTorchJob", {"Id": "-7"}, {"job": "-7", "as_json": True}),
    ("Get-HpcTorchJob:List", {"Last": 5, "Cluster": "prod", "Tag": {"exp": "a b"}, "Since": "7d"},
     {"last": 5, "cluster_name": "prod", "as_json": True, "tag_items": ("exp=a b",), "since": "7d"}),
    ("Wait-HpcTorchJob:Follow", {"Id": "exp-1", "MaxCost": 50},
     {"run": "exp-1", "max_cost": 50.0, "as_json": True}),
    ("Stop-HpcTorchJob", {"Id": "12", "Force": True, "Backend": "winrm"},
     {"job": "12", "force": True, "backend_kind": "winrm"}),
    ("Receive-HpcTorchJobLog", {"Id": "12", "Follow": True, "Node": "GPU2"},
     {"follow": True, "only_node": "GPU2"}),
    ("Mount-HpcTorchShare", {"Node": ["A"], "Install": True, "WhatIf": True},
     {"node_names": ("A",), "install": True, "dry_run": True, "as_json": True}),
    ("Invoke-HpcTorchJob", {"Script": "t.py", "Nodes": 2, "Quiet": True},
     {"local": True, "quiet": True, "nodes": 2, "as_json": True}),
    ("New-HpcTorchCluster", {"Name": "gpu1", "ResourceGroup": "rg", "Location": "eastus", "Nodes": 2,
                             "VmSize": "Standard_NC24ads_A100_v4", "WhatIf": True},
     {"name": "gpu1", "print_only": True, "node_count": 2, "what_if": False}),
]  # fmt: skip


@pytest.mark.parametrize(("key", "bound", "expected"), SETS)
def test_parameter_sets_arrive_as_the_cli_s_own_values(
    key: str, bound: dict[str, Any], expected: dict[str, Any]
) -> None:
    what_if = bool(bound.pop("WhatIf", False))
    parsed = parse_with_click(MOD.cli[key], build_arguments(MOD.cli[key], bound, what_if))
    assert {k: parsed[k] for k in expected} == expected


def test_no_secret_is_ever_an_argument_and_credentials_go_through_the_environment() -> None:
    text = PSM1.read_text(encoding="utf-8")
    for function in MOD.functions.values():
        for parameter in function.parameters.values():
            if parameter.type in SECRET_TYPES:
                assert all(parameter.name not in e["Options"] for e in MOD.cli.values())
                assert all(parameter.name not in e["Arguments"] for e in MOD.cli.values())
    from hpcjob.store.config import (
        ADMIN_PASSWORD_ENV,
        AUTH_KEY_ENV,
        CREDENTIAL_PASSWORD_ENV,
        CREDENTIAL_USER_ENV,
    )

    for variable in (CREDENTIAL_USER_ENV, CREDENTIAL_PASSWORD_ENV, ADMIN_PASSWORD_ENV, AUTH_KEY_ENV):
        assert f"'{variable}'" in text  # the module's names are hpcjob's
    # The one place a process starts: with the argument list built from the table, nothing else.
    assert re.findall(r"& \$\w+ @\w+", text) == ["& $executable @native"]
    assert "$native = ConvertTo-NativeArgument $arguments" in text


def test_scripts_onboard_is_the_module_s_command() -> None:
    script = (ROOT / "scripts" / "Onboard.ps1").read_text(encoding="utf-8")
    assert "powershell\\HpcTorch\\HpcTorch.psd1" in script and "New-HpcTorchCluster @args" in script
    assert "if ($failed) { exit 1 }" in script


@pytest.mark.parametrize("function_name", ["Submit-HpcTorchJob", "Invoke-HpcTorchJob"])
def test_each_job_option_of_the_table_is_a_parameter_that_takes_what_the_option_takes(
    function_name: str,
) -> None:
    """hpcjob.job.options is the one table of the job's options: each with a flag is a parameter of both
    job commands, named from it, mapped to that flag in $script:JobOptions, and as strict as the option
    (the same range, set, switch or list): a value PowerShell lets through, hpcjob takes."""
    from hpcjob.job.options import CHOICE, COUNT, NAMES, PAIRS, SWITCH, job_options

    function = function_of(function_name)
    mapped = MOD.cli[function_name]["Options"]
    int32_max = 2**31 - 1
    for _, how in job_options():
        if how.flag is None:
            continue
        name = how.parameter
        assert name is not None and name in function.parameters, f"{function_name} lacks -{name} ({how.flag})"
        assert mapped[name] == how.flag, f"-{name} maps to {mapped[name]}, not {how.flag}"
        parameter = function.parameters[name]
        if how.kind == COUNT:
            wanted = (float(how.low or 0), float(how.high or int32_max))
            assert parameter.valid_range == wanted, f"-{name}: ValidateRange{wanted}, as {how.flag}"
        elif how.kind == CHOICE:
            assert parameter.valid_set == list(how.choices), f"-{name}: ValidateSet{how.choices}"
        elif how.kind == SWITCH:
            assert parameter.type == "switch", f"-{name} is a switch, as {how.flag}"
        elif how.kind == NAMES:
            assert parameter.type == "string[]", f"-{name} takes names, as {how.flag} repeats"
        elif how.kind == PAIRS:
            assert parameter.type == "hashtable", f"-{name} takes NAME=VALUE pairs"
        else:
            assert parameter.type == "string", f"-{name} takes the text {how.flag} reads"
