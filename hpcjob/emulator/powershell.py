"""What the emulated head node does with a command run over WinRM: Windows PowerShell 5.1 with the HPC
Pack snap-in, for the scripts a client sends, acting on the same Cluster as the REST front door.

There is no PowerShell here, so this is not an interpreter of the language. It does what a head node
does with a script that reads its text and data from stdin (the form hpcjob's bootstrap has):
- a command that is not `powershell.exe` gets cmd.exe's "not recognized" error;
- the encoded command and the script from stdin are parsed (tree-sitter-powershell): a syntax error is
  PowerShell's ParserError;
- every command the script calls must exist, and every parameter it names must be one the cmdlet has
  (the documented parameter sets below): anything else gets PowerShell's own error;
- the HPC cmdlets the script calls say what it does (create and submit a job, read one with its tasks,
  list jobs, cancel, list nodes), done on the Cluster as the user who authenticated, with the values
  the script reads from `$Data`; what it outputs are the properties the script's `[pscustomobject]@{}`
  names, read from the emulated HpcJob/HpcTask/HpcNode by those names (a misspelt property is $null,
  as in PowerShell), serialised as ConvertTo-Json does.
Errors come out as the script's stderr with exit code 1, in the head node's words.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcjob.emulator import api as A
from hpcjob.emulator import props as P
from hpcjob.emulator.base import Actor, ApiError
from hpcjob.emulator.cluster import Cluster
from hpcjob.emulator.jobs import Job, Task
from hpcjob.emulator.nodes import NODE_HEALTHS, NODE_STATES, Node

# Documented parameters of each command the scripts may call, plus PowerShell's common parameters. The
# HPC cmdlets': their reference pages (learn.microsoft.com/powershell/module/hpc/<cmdlet>, from
# MicrosoftDocs/windows-powershell-docs docset/winserver2012r2-ps/hpc/*.md @ 93986fd2fff9; the same as
# the hpcpack2016 pages they link to: UNVERIFIED word for word).
COMMON = (
    "ErrorAction", "ErrorVariable", "WarningAction", "WarningVariable", "InformationAction",
    "InformationVariable", "Verbose", "Debug", "OutVariable", "OutBuffer", "PipelineVariable",
)  # fmt: skip
CMDLETS: dict[str, tuple[str, ...]] = {
    "Get-Command": ("Name", "Module", "CommandType"),
    "Add-Type": ("AssemblyName", "TypeDefinition", "Path", "Language"),
    "Add-PSSnapin": ("Name", "PassThru"),
    "ConvertTo-SecureString": ("String", "AsPlainText", "Force", "Key", "SecureKey"),
    "New-Object": ("TypeName", "ArgumentList", "Property", "ComObject"),
    "Remove-Item": ("Path", "LiteralPath", "Force", "Recurse"),
    "Out-Null": ("InputObject",),
    "Out-String": ("InputObject", "Width", "Stream"),
    "clusrun.exe": (),  # a program: its arguments are its own (the script's $Data says them)
    "ConvertFrom-Json": ("InputObject",),
    "ConvertTo-Json": ("InputObject", "Depth", "Compress"),
    "Where-Object": ("FilterScript", "Property", "Value"),
    "ForEach-Object": ("Process", "Begin", "End", "MemberName"),
    "Set-HpcJobCredential": ("Credential", "Scheduler", "SoftCard", "Thumbprint"),
    "New-HpcJob": (
        "CustomProperties", "EmailAddress", "EstimatedProcessMemory", "Exclusive", "FailDependentTasks",
        "FailOnTaskFailure", "Holduntil", "Job", "JobEnv", "JobFile", "License", "MaxCoresPerNode",
        "MaxMemoryPerNode", "MinCoresPerNode", "MinMemoryPerNode", "Name", "NodeGroupOp", "NodeGroups",
        "NotifyOnCompletion", "NotifyOnStart", "NumCores", "NumGpus", "NumNodes", "NumSockets", "OrderBy",
        "ParentJobIds", "Priority", "Progress", "ProgressMessage", "Project", "RequestedNodes", "RunTime",
        "RunUntilCanceled", "Scheduler", "SingleNode", "TaskExecutionFailureRetryLimit", "TemplateName",
        "ValidExitCodes",
    ),
    "Submit-HpcJob": ("Job", "Id", "Credential", "Scheduler"),
    "Get-HpcJob": (
        "Id", "State", "Name", "Project", "TemplateName", "Pool", "Owner", "BeginSubmitDate", "EndSubmitDate",
        "NodeName", "Scheduler",
    ),
    "Get-HpcTask": ("Job", "JobId", "TaskId", "SubTaskId", "State", "Scheduler"),
    "Stop-HpcJob": ("Id", "Job", "Message", "State", "Force", "Graceful", "Scheduler", "WhatIf", "Confirm"),
    "Get-HpcNode": (
        "Name", "GroupName", "Group", "State", "Health", "HealthState", "TemplateName", "Location",
        "Scheduler",
    ),
    "Set-HpcNodeState": ("State", "Force", "Async", "Name", "Node", "Scheduler", "WhatIf", "Confirm"),
    # The node group cmdlets (MicrosoftDocs/windows-powershell-docs docset/winserver2012r2-ps/hpc/:
    # Get-HpcGroup.md @ dcdd9811, New-HpcGroup.md @ 5ad383a7, Add-HpcGroup.md @ 1095f968).
    "Get-HpcGroup": ("Name", "Id", "Scheduler"),
    "New-HpcGroup": ("Name", "Description", "Scheduler"),
    "Add-HpcGroup": ("Name", "Id", "NodeName", "Node", "Scheduler"),
}  # fmt: skip
# Set-HpcNodeState without -Async waits for the states to take effect ("If any of the jobs have the Run
# until canceled property set, the operation to take the node offline does not return"): the emulator
# waits this long at most, then fails the script.
SYNC_NODE_STATE_S = 30.0
HPC = frozenset(name for name in CMDLETS if "-Hpc" in name)
# Get-HpcNode -Health: the NodeHealth enum (its page), which has Unreachable; -HealthState takes the
# NodeHealthState enum, the REST API's NodeHealth (OK, Warning, Error, Transitional, Unapproved).
HPC_NODE_HEALTHS = ("OK", "Unreachable", "OngoingOperation", "DiagnosticFailed", "ProvisioningFailed")
_KNOWN = {name.lower(): name for name in CMDLETS}
# The value of a `Key = <value>` entry of a @{ } literal that reads a property ([string]$_.Name, $job.Id)
# or a variable ($state): the property's name, or the variable's with its $.
_PROPERTY = re.compile(r"(\[string\])?\s*(?:\$\w+\.(\w+)|(\$\w+))", re.IGNORECASE)
_DATA_KEY = re.compile(r"\$Data\.(\w+)", re.IGNORECASE)


class ScriptError(Exception):
    """What PowerShell writes to stderr for a failing script."""


@dataclass(frozen=True)
class Script:
    """A parsed script: the commands it calls with their parameters, the properties it outputs, and the
    `$Data` values it reads."""

    text: str
    commands: tuple[tuple[str, tuple[str, ...]], ...]
    # (key, as string, what it reads) of each output field: a property's name, or a $variable
    fields: tuple[tuple[str, bool, str], ...]
    data_keys: frozenset[str]
    list_field: str | None = None  # a field holding a list of objects, whose fields come after it
    list_at: int = 0  # how many of `fields` come before it
    # (command, parameter, the argument's text as written) of each parameter given an argument
    arguments: tuple[tuple[str, str, str], ...] = ()

    @property
    def hpc(self) -> list[str]:
        return [name for name, _ in self.commands if name in HPC]

    def calls(self, name: str) -> bool:
        return name in self.hpc

    def params(self, name: str) -> set[str]:
        return {p.lower() for command, params in self.commands if command == name for p in params}

    def argument(self, command: str, param: str) -> str | None:
        """The text of the argument the script gives `-param` of `command` (the first call's)."""
        return next(
            (text for c, p, text in self.arguments if c == command and p.lower() == param.lower()), None
        )


class PowerShellHost:
    """Runs the commands the WS-Management front door receives. `check_password(user, password)` says
    whether a credential a script makes is the user's."""

    def __init__(self, cluster: Cluster, check_password: Callable[[str, str], bool]) -> None:
        self.cluster = cluster
        self.check_password = check_password
        self.scripts_run: list[str] = []  # the text of each script, for tests: never the data
        # What a head node's cmdlets may add, set by tests: a cmdlet's warning, which Windows
        # PowerShell 5.1 writes to stdout as "WARNING: ..." unless $WarningPreference silences it, and
        # the CLIXML block of progress records it writes to stderr (its module loading, for example).
        self.warnings: dict[str, str] = {}
        self.clixml_progress = False
        # False: the tasks' Output property is empty, as for a head node that kept none of it (its size
        # and which end it keeps are UNVERIFIED: 4 KB in Add-HpcTask's page, the "last 5K" in 2016 U1's).
        self.keeps_output = True
        # Users whose credentials a script cached on the cluster (Set-HpcJobCredential): for tests.
        self.cached_credentials: set[str] = set()
        self._lock = threading.Lock()

    def __call__(
        self, actor: Actor, executable: str, arguments: list[str], stdin: bytes
    ) -> tuple[bytes, bytes, int]:
        name = executable.lower().rsplit("\\", 1)[-1].removesuffix(".exe")
        if name != "powershell":
            words = "is not recognized as an internal or external command,\noperable program or batch file."
            return b"", _crlf(f"'{executable}' {words}"), 1
        try:
            outer = parse(_encoded_command(arguments))
            if not _reads_script_from_stdin(outer.text):
                raise ScriptError(
                    "The emulated head node runs only a script that reads its text from stdin: "
                    "[Console]::In.ReadToEnd() | ConvertFrom-Json, then [ScriptBlock]::Create."
                )
            request = _json_object(stdin)
            script = parse(str(_member(request, "Script") or ""))
            data = _member(request, "Data")
            with self._lock:
                self.scripts_run.append(script.text)
            result = self._run(script, data if isinstance(data, dict) else {}, actor)
            warned = "" if _silences_warnings(outer.text) else self._warned(script)
        except ScriptError as err:
            return b"", self._noise() + _crlf(str(err)), 1
        answer = json.dumps(result, separators=(",", ":"))
        return _crlf(warned) + answer.encode("utf-8"), self._noise(), 0

    def _warned(self, script: Script) -> str:
        return "".join(f"WARNING: {self.warnings[name]}\n" for name in script.hpc if name in self.warnings)

    def _noise(self) -> bytes:
        return _crlf(CLIXML_PROGRESS) if self.clixml_progress else b""

    # -- what a script does ---------------------------------------------------------------------

    def _run(self, script: Script, data: dict[str, Any], actor: Actor) -> list[Any]:
        def value(key: str) -> Any:
            if key.lower() not in script.data_keys:
                raise ScriptError(f"the script does not read $Data.{key}")
            return _member(data, key)

        try:
            if any(name == "clusrun.exe" for name, _ in script.commands):
                return [self._clusrun(script, value("Nodes"), str(value("CommandBase64") or ""), actor)]
            if script.calls("Submit-HpcJob") and script.calls("New-HpcJob"):
                if script.calls("Set-HpcJobCredential"):
                    self.cached_credentials.add(actor.name)
                given = "credential" in script.params("Submit-HpcJob") or script.calls("Set-HpcJobCredential")
                if not given:
                    raise ScriptError(
                        "The job cannot be submitted: no credentials (this session has no console)."
                    )
                user = str(value("User") or "")
                if user.rpartition("\\")[2].lower() != actor.name.lower():
                    raise ScriptError(f"Submit-HpcJob : The credentials are not those of {actor.name}.")
                if not self.check_password(user, str(value("Password") or "")):
                    raise ScriptError("The user name or password is incorrect.")
                job_id = self.cluster.create_job_from_xml(actor, str(value("JobXml") or ""))
                try:
                    self.cluster.submit(actor, job_id, [])
                except ApiError as err:
                    self.cluster.cancel_job(actor, job_id, "submission by hpcjob failed", True)
                    raise ScriptError(
                        f"submitting job {job_id} failed, and hpcjob canceled it: {err.message}"
                    ) from None
                return [self._fields(script, {"Id": job_id})]
            if script.calls("Stop-HpcJob"):
                job = self.cluster.job(_int(value("JobId")))
                state = job.state
                force = bool(value("Force")) and "force" in script.params("Stop-HpcJob")
                canceled = not (
                    state in ("Finished", "Failed", "Canceled") or (state == "Canceling" and not force)
                )
                if canceled:
                    self.cluster.cancel_job(actor, int(job.props["Id"]), str(value("Message") or ""), force)
                return [self._fields(script, {"$canceled": canceled, "$state": state})]
            if script.calls("Set-HpcNodeState"):
                return self._set_node_state(script, value, actor)
            if script.calls("Add-HpcGroup"):
                return self._add_to_group(script, value, actor)
            if script.calls("Get-HpcNode"):
                if not actor.admin:
                    # The cmdlet's page: "You must be a cluster administrator to run this cmdlet
                    # successfully" (the words of its error: the emulator's own).
                    refused = "Get-HpcNode : Access is denied: you must be a cluster administrator."
                    if re.search(r"\bcatch\b", script.text, re.IGNORECASE):  # the script's catch answers
                        return [self._fields(script, {"$refused": refused})]
                    raise ScriptError(refused)
                group = value("Group") if "groupname" in script.params("Get-HpcNode") else None
                wanted = {
                    key: _enum_values(script, value, param, choices)
                    for key, param, choices in (
                        ("NetBiosName", "Name", None),
                        ("NodeState", "State", NODE_STATES),
                        ("NodeHealth", "Health", HPC_NODE_HEALTHS),
                        ("HealthState", "HealthState", NODE_HEALTHS),
                    )
                }
                with self.cluster.lock:
                    nodes = [n for n in self.cluster.nodes.values() if not group or n.in_group(str(group))]
                    found = [_node_object(n) for n in nodes]
                    found = [
                        o
                        for o in found
                        if all(w is None or str(o[k]).lower() in w for k, w in wanted.items())
                    ]
                    return [self._fields(script, o) for o in found]
            if script.calls("Get-HpcTask"):
                with self.cluster.lock:
                    job = self.cluster.job(_int(value("JobId")))
                    tasks = [_task_object(t) for t in job.tasks]
                    for task in tasks if not self.keeps_output else []:
                        task["Output"] = ""
                    if script.list_field is not None:
                        return [self._fields(script, {**_job_object(job), script.list_field: tasks})]
                    return [self._fields(script, t) for t in tasks]
            if script.calls("Get-HpcJob"):
                states = None if "state" not in script.params("Get-HpcJob") else _state_filter(script)
                jobs = self.cluster.list_jobs(
                    owner=_owner_filter(script, actor),
                    states=states,
                    group=None,
                    changed_since=None,
                    node_names=None,
                )
                if "name" in script.params("Get-HpcJob"):
                    names = {str(n) for n in value("Names") or []}
                    jobs = [j for j in jobs if j.props.get("Name") in names]
                with self.cluster.lock:
                    return [self._fields(script, _job_object(j)) for j in jobs]
        except ApiError as err:
            raise ScriptError(err.message) from None
        raise ScriptError("The emulated head node does not know what this script does: it calls "
                          f"{', '.join(script.hpc) or 'no HPC cmdlet'}.")  # fmt: skip

    def _add_to_group(self, script: Script, value: Callable[[str], Any], actor: Actor) -> list[Any]:
        """`Add-HpcGroup -Name G -NodeName N[,N]`, after `New-HpcGroup -Name G` where Get-HpcGroup finds
        none (hpcjob's group script): the nodes in the group, the group made first where the script makes
        it. Administrators' cmdlets. Outputs nothing the script reads. A node the cluster does not know:
        the head node's `unknown_group_node` ("skip": -NodeName is "a filter parameter", no error "as
        long as you specify at least one node that does exist", Add-HpcGroup's page; the words of the
        errors are the emulator's own)."""
        cmdlet = "Add-HpcGroup"
        if not actor.admin:
            raise ScriptError(f"{cmdlet} : Access is denied: you must be a cluster administrator.")
        groups = _values(script, value, cmdlet, "Name")
        names = [n.strip() for item in _values(script, value, cmdlet, "NodeName") for n in item.split(",")]
        if len(groups) != 1 or not names or not all(names):
            raise ScriptError(f"{cmdlet} : Missing an argument for parameter 'Name' or 'NodeName'.")
        with self.cluster.lock:
            known = {g.lower() for g in self.cluster.groups()}
            if groups[0].lower() not in known:  # New-HpcGroup is a statement of its own, before
                if not script.calls("New-HpcGroup"):
                    raise ScriptError(f"{cmdlet} : The node group {groups[0]} was not found.")
                described = _values(script, value, "New-HpcGroup", "Description")
                self.cluster.create_group(groups[0], described[0] if described else "")
            if not any(name.lower() in self.cluster.nodes for name in names):
                raise ScriptError(f"{cmdlet} : No node named {', '.join(names)} was found.")
            try:
                self.cluster.move_nodes(groups[0], "add", names)
            except ApiError as err:
                raise ScriptError(f"{cmdlet} : {err.message}") from None
        return []

    def _set_node_state(self, script: Script, value: Callable[[str], Any], actor: Actor) -> list[Any]:
        """`Set-HpcNodeState -Name N[,N] -State Online|Offline [-Force] [-Async]` (its page: Rejected is
        the third state, not emulated; -Force only with Offline, straight to Offline without Draining;
        -Async returns at once, else the cmdlet waits for the states; a cluster administrator's cmdlet).
        Outputs nothing the scripts read: they ask Get-HpcNode for the states."""
        cmdlet = "Set-HpcNodeState"
        if not actor.admin:
            raise ScriptError(f"{cmdlet} : Access is denied: you must be a cluster administrator.")
        names = [n.strip() for item in _values(script, value, cmdlet, "Name") for n in item.split(",")]
        states = _values(script, value, cmdlet, "State")
        if not names or not all(names) or len(states) != 1:
            raise ScriptError(f"{cmdlet} : Missing an argument for parameter 'Name' or 'State'.")
        state = next((s for s in ("Online", "Offline", "Rejected") if s.lower() == states[0].lower()), None)
        if state is None or state == "Rejected":
            raise ScriptError(
                f"{cmdlet} : Cannot bind parameter 'State': the emulated head node sets Online or Offline, "
                f"not {states[0]}."
            )
        force = _switch(script, value, cmdlet, "Force")
        if force and state != "Offline":
            raise ScriptError(f"{cmdlet} : You can only use -Force when you specify Offline for -State.")
        for name in names:
            self.cluster.node(name)  # an unknown node is refused before any is changed
        for name in names:
            self.cluster.set_node_state(name, state, force=force)
        if not _switch(script, value, cmdlet, "Async"):
            deadline = time.monotonic() + SYNC_NODE_STATE_S
            with self.cluster.lock:
                while any(self.cluster.node(n).state != state for n in names):
                    if time.monotonic() > deadline:
                        raise ScriptError(f"{cmdlet} : the emulated head node gave up waiting for {state}.")
                    self.cluster.changed.wait(timeout=0.1)
        return []

    def _clusrun(self, script: Script, nodes: Any, command_base64: str, actor: Actor) -> dict[str, Any]:
        """`clusrun /user:system /nodes:A,B "echo B64 | base64 -d | bash"`: an administrator's right; the
        command runs on each node as root. The output has a header per node (its exact text is
        UNVERIFIED: clients must not parse it); the exit code is 1 when a node failed."""
        if not actor.admin:
            raise ScriptError("clusrun : Only HPC administrators can run commands as the system account.")
        if not isinstance(nodes, list) or not nodes:
            raise ScriptError("clusrun : No nodes were specified.")
        try:
            base64.b64decode(command_base64, validate=True)
        except (binascii.Error, ValueError):
            raise ScriptError("the command is not base64") from None
        lines, failed = [], 0
        for node in nodes:
            try:
                code, output = self.cluster.run_as_system(
                    str(node), f"echo {command_base64} | base64 -d | bash"
                )
            except ApiError as err:
                code, output = 1, err.message
            failed += code != 0
            lines.append(
                f"-------------------------- {str(node).upper()} returns {code} --------------------------"
            )
            lines.append(output.rstrip("\n"))
        lines.append(f"{len(nodes) - failed} Node(s) succeeded")
        lines.append(f"{failed} Node(s) failed")
        return self._fields(
            script, {"$lastexitcode": 1 if failed else 0, "$output": "\r\n".join(lines) + "\r\n"}
        )

    @staticmethod
    def _fields(script: Script, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object the script outputs: its fields' keys, each read from `obj` by the property the
        script names; a list field's objects get the fields written after it."""
        fields = script.fields
        if script.list_field is not None:
            fields, inner = fields[: script.list_at], fields[script.list_at :]
        out = {key: _cast(obj.get(prop), as_string) for key, as_string, prop in fields}
        if script.list_field is not None:
            out[script.list_field] = [
                {key: _cast(item.get(prop), as_string) for key, as_string, prop in inner}
                for item in obj.get(script.list_field) or []
            ]
        return out


def parse(text: str) -> Script:
    """A script's commands, output fields and $Data keys; PowerShell's ParserError for bad syntax."""
    import tree_sitter_powershell
    from tree_sitter import Language, Parser

    tree = Parser(Language(tree_sitter_powershell.language())).parse(text.encode("utf-8"))
    if tree.root_node.has_error:
        raise ScriptError("ParserError: the script has a syntax error (the emulated head node's parser).")
    commands: list[tuple[str, tuple[str, ...]]] = []
    arguments: list[tuple[str, str, str]] = []
    fields: list[tuple[str, bool, str]] = []
    list_field: str | None = None
    list_at = 0
    stack = [tree.root_node]
    while stack:  # depth first, in the order of the text
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.type == "command":
            command = _command(node)
            if command is not None:
                commands.append(command)
                arguments.extend((command[0], p, text) for p, text in _arguments(node, command[0]))
        elif node.type == "hash_entry":
            key = _text_of(next(c for c in node.children if c.type == "key_expression"))
            value = _text_of(next((c for c in node.children if c.type == "pipeline"), node)).rstrip(";")
            read = _PROPERTY.fullmatch(value.strip())
            if read is not None:
                fields.append((key, bool(read[1]), read[2] or read[3].lower()))
            elif value.strip().startswith("@(") and list_field is None:
                list_field, list_at = key, len(fields)  # the entries that follow are its objects'
    data_keys = frozenset(k.lower() for k in _DATA_KEY.findall(text))
    return Script(text, tuple(commands), tuple(fields), data_keys, list_field, list_at, tuple(arguments))


def _text_of(node: Any) -> str:
    return (node.text or b"").decode("utf-8")


def _command(node: Any) -> tuple[str, tuple[str, ...]] | None:
    """A command's name and the parameters it names; PowerShell's error for an unknown one."""
    name_node = next((c for c in node.children if c.type in ("command_name", "command_name_expr")), None)
    if name_node is None:
        return None
    name = _text_of(name_node)
    if not re.fullmatch(r"[\w.-]+", name):
        return None  # `& (expression)`: what it calls is a value, read elsewhere (the bootstrap's)
    known = _KNOWN.get(name.lower())
    if known is None:
        raise ScriptError(
            f"The term '{name}' is not recognized as the name of a cmdlet, function, script file, or "
            "operable program."
        )
    if not CMDLETS[known]:
        return known, ()  # a program takes any arguments
    params = [
        _parameter(known, _text_of(element))
        for child in node.children
        if child.type == "command_elements"
        for element in child.children
        if element.type == "command_parameter"
    ]
    return known, tuple(params)


def _arguments(node: Any, cmdlet: str) -> list[tuple[str, str]]:
    """Each parameter of a command that is given an argument, with the argument's text: what follows
    `-Name` (or `-Name:`) up to the next parameter, `Unreachable,OK` or `$Data.Health`."""
    if not CMDLETS.get(cmdlet):
        return []
    found: list[tuple[str, str]] = []
    param: str | None = None
    text = ""
    elements = [e for c in node.children if c.type == "command_elements" for e in c.children]
    for element in [*elements, None]:
        if element is None or element.type == "command_parameter":
            if param is not None and text:
                found.append((param, text))
            if element is not None:
                param, text = _parameter(cmdlet, _text_of(element)), ""
        elif element.type != "command_argument_sep" and param is not None:
            text += _text_of(element)
    return found


def _parameter(cmdlet: str, written: str) -> str:
    """The parameter `-Name` or `-Name:value` names, as PowerShell binds it: a unique prefix will do."""
    name = written.lstrip("-").split(":", 1)[0]
    candidates = [p for p in (*CMDLETS[cmdlet], *COMMON) if p.lower().startswith(name.lower())]
    exact = [p for p in candidates if p.lower() == name.lower()]
    if exact or len(candidates) == 1:
        return (exact or candidates)[0]
    raise ScriptError(f"{cmdlet} : A parameter cannot be found that matches parameter name '{name}'.")


def _encoded_command(arguments: list[str]) -> str:
    for index, argument in enumerate(arguments):
        lowered = argument.lower()
        if len(lowered) >= 2 and "-encodedcommand".startswith(lowered) and lowered != "-":
            try:
                return base64.b64decode(arguments[index + 1], validate=True).decode("utf-16-le")
            except (IndexError, binascii.Error, UnicodeDecodeError):
                raise ScriptError(
                    "Cannot process the command because the value of -EncodedCommand is not valid."
                ) from None
    raise ScriptError("The emulated head node runs PowerShell only with -EncodedCommand.")


def _reads_script_from_stdin(text: str) -> bool:
    compact = text.replace(" ", "").lower()
    return "[console]::in.readtoend()" in compact and "[scriptblock]::create(" in compact


def _json_object(stdin: bytes) -> dict[str, Any]:
    try:
        value = json.loads(stdin.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ScriptError("ConvertFrom-Json : Invalid JSON primitive.") from None
    if not isinstance(value, dict):
        raise ScriptError("The input is not a JSON object.")
    return value


def _member(obj: Mapping[str, Any], name: str) -> Any:
    """A property, by name without regard to case, as PowerShell reads one; $null when absent."""
    return next((v for k, v in obj.items() if k.lower() == name.lower()), None)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ScriptError(f'Cannot convert value "{value}" to type "System.Int32".') from None


def _cast(value: Any, as_string: bool) -> Any:
    if as_string:
        return "" if value is None else str(value)
    return value


def _state_filter(script: Script) -> set[str] | None:
    """`Get-HpcJob -State X`: All, or the one state the script names."""
    match = re.search(r"Get-HpcJob\s+-State\s+(\w+)", script.text, re.IGNORECASE)
    state = match.group(1) if match else "All"
    return None if state.lower() == "all" else {state}


def _owner_filter(script: Script, actor: Actor) -> str | None:
    """`Get-HpcJob -Owner NAME`: that user's jobs (no wildcards: `*` names no user); without it, every
    user's jobs when -State, -Id or -Name is given, else the caller's own (the cmdlet's documented
    default: "only ... jobs ... that belong to the current user, unless you specify the job ID, the
    state, or the owner")."""
    match = re.search(r"Get-HpcJob\b[^\n|]*-Owner\s+(\S+)", script.text, re.IGNORECASE)
    if match:
        return match.group(1).strip("'\"")
    return None if script.params("Get-HpcJob") & {"state", "id", "name"} else actor.name


def _values(script: Script, value: Callable[[str], Any], cmdlet: str, param: str) -> list[str]:
    """What the script gives `-param` of `cmdlet`: written out (`-State Offline`, `-Name 'A','B'`) or
    read from `$Data.Key` (a list or one value); [] when not given."""
    text = script.argument(cmdlet, param)
    if text is None:
        return []
    data = _DATA_KEY.fullmatch(text.strip())
    if data is not None:
        given = value(data.group(1))
        return [str(v) for v in (given if isinstance(given, list) else [given]) if v is not None]
    return [i.strip().strip("'\"") for i in text.strip().removeprefix("@(").rstrip(")").split(",")]


def _switch(script: Script, value: Callable[[str], Any], cmdlet: str, param: str) -> bool:
    """Whether a switch of `cmdlet` is on: named bare (`-Async`), or `-Force:$true`, or
    `-Force:([bool]$Data.Force)` with a true value."""
    if param.lower() not in script.params(cmdlet):
        return False
    text = (script.argument(cmdlet, param) or "").strip()
    if not text:
        return True
    data = _DATA_KEY.search(text)
    if data is not None:
        return bool(value(data.group(1)))
    return text.lower().strip("()") == "$true"


def _enum_values(
    script: Script, value: Callable[[str], Any], param: str, choices: tuple[str, ...] | None
) -> set[str] | None:
    """The lower-case values the script gives Get-HpcNode's `-param` (None: not given): written out
    (`-Health Unreachable,OK`) or read from `$Data.Key`; an enum's value must be one of `choices`."""
    text = script.argument("Get-HpcNode", param)
    if text is None:
        return None
    data = _DATA_KEY.fullmatch(text.strip())
    if data is not None:
        given = value(data.group(1))
        items = [str(v) for v in (given if isinstance(given, list) else [given]) if v is not None]
    else:
        items = [i.strip().strip("'\"") for i in text.strip().removeprefix("@(").rstrip(")").split(",")]
    names = choices or ()
    for item in items if names else ():
        if item.lower() not in (c.lower() for c in names):
            raise ScriptError(
                f"Get-HpcNode : Cannot bind parameter '{param}'. Cannot convert value \"{item}\": "
                f"specify one of the following enumerator names and try again: {', '.join(names)}"
            )
    return {i.lower() for i in items}


def _job_object(job: Job) -> dict[str, Any]:
    return {
        "Id": int(job.props["Id"]),
        "Name": job.props.get("Name", ""),
        "State": job.state,
        "ErrorMessage": job.props.get("ErrorMessage", ""),
        "AllocatedNodes": A.job_value(job, "AllocatedNodes"),
        "RequeueCount": int(job.props["RequeueCount"]),
        "AutoRequeueCount": int(job.props["AutoRequeueCount"]),
    }


def _task_object(task: Task) -> dict[str, Any]:
    code = A.task_value(task, "ExitCode")
    return {
        "TaskId": A.task_value(task, "TaskId"),
        "Name": A.task_value(task, "Name"),
        "State": task.state,
        "ExitCode": int(code) if code.lstrip("-").isdigit() else 0,
        "RequiredNodes": A.task_value(task, "RequiredNodes"),
        "AllocatedNodes": A.task_value(task, "AllocatedNodes"),
        "ErrorMessage": A.task_value(task, "ErrorMessage"),
        "Output": A.task_value(task, "Output"),
        "StartTime": _invariant_time(A.task_value(task, "StartTime")),
        "EndTime": _invariant_time(A.task_value(task, "EndTime")),
    }


def _invariant_time(text: str) -> str:
    """A task's time as `[string]$_.StartTime` gives it: PowerShell casts with the invariant culture
    (MM/dd/yyyy HH:mm:ss); an unset one as empty."""
    return P.parse_time(text).strftime("%m/%d/%Y %H:%M:%S") if text else ""


def _node_object(node: Node) -> dict[str, Any]:
    """An HpcNode. NodeHealth is Unreachable once the head node gave up on the node (the -Health enum),
    else its health; HealthState is its health (the -HealthState enum; the property's name UNVERIFIED)."""
    return {
        "NetBiosName": node.name,
        "NodeState": node.state,
        "NodeHealth": "Unreachable" if node.unreachable else node.health,
        "HealthState": node.health,
        "ProcessorCores": node.cores,
        "Groups": ", ".join(node.groups),
    }


# What Windows PowerShell 5.1 writes to a redirected stderr for its progress records (a real shape: the
# "Preparing modules for first use." record of a session's first module load).
CLIXML_PROGRESS = (
    "#< CLIXML\n"
    '<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04"><Obj S="progress" '
    'RefId="0"><TN RefId="0"><T>System.Management.Automation.PSCustomObject</T><T>System.Object</T></TN>'
    '<MS><I64 N="SourceId">1</I64><PR N="Record"><AV>Preparing modules for first use.</AV><AI>0</AI><Nil />'
    "<PI>-1</PI><PC>-1</PC><T>Completed</T><SR>-1</SR><SD> </SD></PR></MS></Obj></Objs>"
)


def _silences_warnings(text: str) -> bool:
    return re.search(r"\$WarningPreference\s*=\s*'SilentlyContinue'", text, re.IGNORECASE) is not None


def _crlf(text: str) -> bytes:
    return (text.replace("\n", "\r\n") + "\r\n").encode("utf-8")
