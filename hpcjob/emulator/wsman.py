"""The WS-Management front door of the emulated head node: the Windows Remote Shell protocol (MS-WSMV)
that WinRM clients such as pywinrm speak, at /wsman.

A shell is created (Create), a command started in it (Command), its stdin sent (Send), its output and
exit code read (Receive, until CommandState/Done), the command stopped (Signal) and the shell removed
(Delete). Other actions get the documented ActionNotSupported fault. Replies to Signal and Delete, like
every reply, carry RelatesTo = the request's MessageID. A command runs in its own thread once its stdin
has ended; what it does is up to the `Runner` (hpcjob.emulator.powershell), which acts on the SAME
Cluster as the REST front door.
"""

from __future__ import annotations

import base64
import re
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from hpcjob.emulator.api import Reply, Request
from hpcjob.emulator.base import Actor

NS = {
    "s": "http://www.w3.org/2003/05/soap-envelope",
    "a": "http://schemas.xmlsoap.org/ws/2004/08/addressing",
    "w": "http://schemas.dmtf.org/wbem/wsman/1/wsman.xsd",
    "rsp": "http://schemas.microsoft.com/wbem/wsman/1/windows/shell",
    "x": "http://schemas.xmlsoap.org/ws/2004/09/transfer",
}
TRANSFER = "http://schemas.xmlsoap.org/ws/2004/09/transfer"
SHELL = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell"
CMD_RESOURCE = f"{SHELL}/cmd"
DONE = f"{SHELL}/CommandState/Done"
RUNNING = f"{SHELL}/CommandState/Running"
SOAP_CONTENT = "application/soap+xml;charset=UTF-8"
# The fault code a Receive answers when no output came within the operation timeout (MS-WSMV 2.2.4.9,
# ERROR_WSMAN_OPERATION_TIMEDOUT); clients send the Receive again.
TIMED_OUT_CODE = 2150858793
MAX_WAIT_S = 5.0  # the longest a Receive waits for output, whatever OperationTimeout says
# The largest message a listener takes: MaxEnvelopeSizekb, 500 by default since WinRM 2.0.
MAX_ENVELOPE_BYTES = 500 * 1024

# (stdout, stderr, exit code) of a command line and its stdin, run as `actor`.
Runner = Callable[[Actor, str, list[str], bytes], tuple[bytes, bytes, int]]


@dataclass
class _Command:
    executable: str
    arguments: list[str]
    stdin: bytearray = field(default_factory=bytearray)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    started: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class _Shell:
    owner: str
    commands: dict[str, _Command] = field(default_factory=dict)


class WsManFault(Exception):
    """A SOAP fault: the subcode (a QName of NS), the reason, and a WS-Man fault code if any."""

    def __init__(self, subcode: str, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.subcode = subcode
        self.reason = reason
        self.code = code


class WsMan:
    """The /wsman endpoint. `runner` runs each command. For tests: `actions` (each request's action),
    `command_lines` (what a process list on the head node would show), `shells_created`,
    `commands_run`."""

    base_path = "/wsman"
    auth_schemes: tuple[str, ...] = ("Negotiate", "Basic")

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._shells: dict[str, _Shell] = {}
        self._lock = threading.Lock()
        self.commands_run = 0
        self.shells_created = 0
        self.actions: list[str] = []  # the last part of each request's Action: Create, Command, ...
        self.command_lines: list[str] = []  # what a process list on the head node would show

    def handle(self, request: Request) -> Reply:
        message_id = ""
        try:
            if request.method != "POST":
                return Reply(405, "The requested resource does not support this method.", text=True)
            if len(request.body) > MAX_ENVELOPE_BYTES:
                raise WsManFault(
                    "w:EncodingLimit",
                    "The WS-Management service cannot process the request because the request size exceeds "
                    f"the maximum envelope size (MaxEnvelopeSizekb = {MAX_ENVELOPE_BYTES // 1024}).",
                    2150858762,
                )
            try:
                envelope = ET.fromstring(request.body)
            except ET.ParseError:
                raise WsManFault(
                    "w:SchemaValidationError", "The SOAP XML in the message is not valid."
                ) from None
            message_id = _text(envelope, "s:Header/a:MessageID")
            action = _text(envelope, "s:Header/a:Action")
            self.actions.append(action.rsplit("/", 1)[-1])
            body, reply_action = self._dispatch(action, envelope, request.actor)
            return _soap(200, reply_action, message_id, body)
        except WsManFault as fault:
            return _soap(500, "http://schemas.dmtf.org/wbem/wsman/1/wsman/fault", message_id, _fault(fault))

    def _dispatch(self, action: str, envelope: ET.Element, actor: Actor) -> tuple[str, str]:
        if action == f"{TRANSFER}/Create":
            return self._create(envelope, actor), f"{TRANSFER}/CreateResponse"
        if action == f"{TRANSFER}/Delete":
            with self._lock:
                self._shell(envelope, actor, remove=True)
            return "", f"{TRANSFER}/DeleteResponse"
        if action == f"{SHELL}/Command":
            return self._command(envelope, actor), f"{SHELL}/CommandResponse"
        if action == f"{SHELL}/Send":
            return self._send(envelope, actor), f"{SHELL}/SendResponse"
        if action == f"{SHELL}/Receive":
            return self._receive(envelope, actor), f"{SHELL}/ReceiveResponse"
        if action == f"{SHELL}/Signal":
            self._signal(envelope, actor)
            return "<rsp:SignalResponse/>", f"{SHELL}/SignalResponse"
        raise WsManFault(
            "a:ActionNotSupported", f"The action {action or '(none)'} is not supported by the service."
        )

    # -- the actions ----------------------------------------------------------------------------

    def _create(self, envelope: ET.Element, actor: Actor) -> str:
        resource = _text(envelope, "s:Header/w:ResourceURI")
        if resource != CMD_RESOURCE:
            raise WsManFault("w:DestinationUnreachable", f"The resource URI {resource} is not supported.")
        shell_id = str(uuid.uuid4()).upper()
        with self._lock:
            self._shells[shell_id] = _Shell(owner=actor.name.lower())
            self.shells_created += 1
        return (
            "<x:ResourceCreated><a:Address>http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous"
            f"</a:Address><a:ReferenceParameters><w:ResourceURI>{CMD_RESOURCE}</w:ResourceURI>"
            f'<w:SelectorSet><w:Selector Name="ShellId">{shell_id}</w:Selector></w:SelectorSet>'
            f"</a:ReferenceParameters></x:ResourceCreated><rsp:Shell><rsp:ShellId>{shell_id}</rsp:ShellId>"
            "<rsp:State>Connected</rsp:State></rsp:Shell>"
        )

    def _command(self, envelope: ET.Element, actor: Actor) -> str:
        line = envelope.find("s:Body/rsp:CommandLine", NS)
        if line is None:
            raise WsManFault("w:SchemaValidationError", "The CommandLine element is missing.")
        executable = _text(line, "rsp:Command").strip().strip('"')
        # The head node joins the command and its arguments into one command line (clients send the
        # arguments in one element or several); split back into words, as the program's C runtime does.
        arguments = [word for a in line.findall("rsp:Arguments", NS) for word in (a.text or "").split()]
        command_id = str(uuid.uuid4()).upper()
        with self._lock:
            shell = self._shell(envelope, actor)
            shell.commands[command_id] = _Command(executable, arguments)
            self.command_lines.append(" ".join([executable, *arguments]))
        return f"<rsp:CommandResponse><rsp:CommandId>{command_id}</rsp:CommandId></rsp:CommandResponse>"

    def _send(self, envelope: ET.Element, actor: Actor) -> str:
        for stream in envelope.findall("s:Body/rsp:Send/rsp:Stream", NS):
            command = self._command_of(envelope, actor, stream.get("CommandId", ""))
            with command.changed:
                command.stdin += base64.b64decode(stream.text or "")
                if stream.get("End", "").lower() == "true" and not command.started:
                    self._start(command, actor)
        return "<rsp:SendResponse/>"

    def _receive(self, envelope: ET.Element, actor: Actor) -> str:
        desired = envelope.find("s:Body/rsp:Receive/rsp:DesiredStream", NS)
        command_id = desired.get("CommandId", "") if desired is not None else ""
        command = self._command_of(envelope, actor, command_id)
        with command.changed:
            if not command.started and not _reads_stdin(command):
                self._start(command, actor)
            if not (command.stdout or command.stderr or command.exit_code is not None):
                command.changed.wait(min(_timeout(envelope), MAX_WAIT_S))
            if not (command.stdout or command.stderr or command.exit_code is not None):
                raise WsManFault(
                    "w:TimedOut",
                    "The WS-Management service cannot complete the operation within the time specified "
                    "in OperationTimeout.",
                    TIMED_OUT_CODE,
                )
            out, err = bytes(command.stdout), bytes(command.stderr)
            command.stdout.clear()
            command.stderr.clear()
            done = command.exit_code is not None
        streams = "".join(
            f'<rsp:Stream Name="{name}" CommandId="{command_id}">{_b64(data)}</rsp:Stream>'
            for name, data in (("stdout", out), ("stderr", err))
            if data
        )
        if done:
            state = (
                f'<rsp:CommandState CommandId="{command_id}" State="{DONE}">'
                f"<rsp:ExitCode>{command.exit_code}</rsp:ExitCode></rsp:CommandState>"
            )
        else:
            state = f'<rsp:CommandState CommandId="{command_id}" State="{RUNNING}"/>'
        return f"<rsp:ReceiveResponse>{streams}{state}</rsp:ReceiveResponse>"

    def _signal(self, envelope: ET.Element, actor: Actor) -> None:
        signal = envelope.find("s:Body/rsp:Signal", NS)
        command_id = signal.get("CommandId", "") if signal is not None else ""
        with self._lock:
            shell = self._shell(envelope, actor)
            shell.commands.pop(command_id, None)  # terminate: the command and its output are gone

    # -- plumbing -------------------------------------------------------------------------------

    def _start(self, command: _Command, actor: Actor) -> None:
        command.started = True
        self.commands_run += 1

        def run() -> None:
            out, err, code = self.runner(actor, command.executable, command.arguments, bytes(command.stdin))
            with command.changed:
                command.stdout += out
                command.stderr += err
                command.exit_code = code
                command.changed.notify_all()

        threading.Thread(target=run, name="hpcjob-emulator-wsman-command", daemon=True).start()

    def _shell(self, envelope: ET.Element, actor: Actor, remove: bool = False) -> _Shell:
        shell_id = ""
        for selector in envelope.findall("s:Header/w:SelectorSet/w:Selector", NS):
            if selector.get("Name") == "ShellId":
                shell_id = (selector.text or "").strip()
        shell = self._shells.get(shell_id)
        if shell is None or shell.owner != actor.name.lower():
            raise WsManFault(
                "w:InvalidSelectors",
                f"The request for the Windows Remote Shell with ShellId {shell_id} failed because the shell "
                "was not found on the server.",
            )
        if remove:
            del self._shells[shell_id]
        return shell

    def _command_of(self, envelope: ET.Element, actor: Actor, command_id: str) -> _Command:
        with self._lock:
            command = self._shell(envelope, actor).commands.get(command_id)
        if command is None:
            raise WsManFault("w:InvalidSelectors", f"The command {command_id} was not found in the shell.")
        return command


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _reads_stdin(command: _Command) -> bool:
    """PowerShell reading a script from stdin waits for it to end; other commands start at once."""
    return command.executable.lower().removesuffix(".exe") == "powershell"


def _text(element: ET.Element, path: str) -> str:
    found = element.find(path, NS)
    return (found.text or "").strip() if found is not None else ""


def _timeout(envelope: ET.Element) -> float:
    """The request's OperationTimeout (xs:duration such as PT20.000S), in seconds."""
    match = re.fullmatch(r"PT([0-9.]+)S", _text(envelope, "s:Header/w:OperationTimeout"))
    return float(match.group(1)) if match else 60.0


def _soap(status: int, action: str, relates_to: str, body: str) -> Reply:
    header = (
        f"<a:Action>{escape(action)}</a:Action>"
        f"<a:MessageID>uuid:{uuid.uuid4()}</a:MessageID>"
        "<a:To>http://schemas.xmlsoap.org/ws/2004/08/addressing/role/anonymous</a:To>"
        f"<a:RelatesTo>{escape(relates_to)}</a:RelatesTo>"
    )
    namespaces = " ".join(f'xmlns:{prefix}="{uri}"' for prefix, uri in NS.items())
    envelope = (
        f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xml:lang="en-US" {namespaces}>'
        f"<s:Header>{header}</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    )
    return Reply(status, envelope, text=True, content_type=SOAP_CONTENT)


def _fault(fault: WsManFault) -> str:
    detail = (
        f'<s:Detail><f:WSManFault xmlns:f="http://schemas.microsoft.com/wbem/wsman/1/wsmanfault" '
        f'Code="{fault.code}" Machine="HEADNODE"><f:Message>{escape(fault.reason)}</f:Message>'
        "</f:WSManFault></s:Detail>"
        if fault.code is not None
        else ""
    )
    return (
        "<s:Fault><s:Code><s:Value>s:Receiver</s:Value><s:Subcode>"
        f"<s:Value>{fault.subcode}</s:Value></s:Subcode></s:Code>"
        f'<s:Reason><s:Text xml:lang="en-US">{escape(fault.reason)}</s:Text></s:Reason>{detail}</s:Fault>'
    )
