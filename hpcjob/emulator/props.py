"""Job and task properties as the scheduler knows them: names, kinds, defaults, and value parsing.

Every value travels as a string (RestProperty). Values are stored already normalised (booleans as
``True``/``False`` like .NET's ``bool.ToString()``, enums by name), so a GET returns what a set stored.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_INT = 2147483647


class PropError(ValueError):
    """A property name or value the scheduler would refuse (answered as 400)."""


@dataclass(frozen=True)
class Prop:
    name: str
    kind: str  # str | int | bool | enum | list | time | priority
    default: str = ""
    choices: tuple[str, ...] = ()  # enum names, in the order of their numeric values
    settable: bool = True
    live: bool = False  # may still change once the job is submitted
    secret: bool = False  # accepted on input, never stored nor returned


UNIT_TYPES = ("Core", "Socket", "Node", "Gpu")
NODE_GROUP_OPS = ("Intersect", "Uniform", "Union")
TASK_TYPES = ("Basic", "ParametricSweep", "NodePrep", "NodeRelease", "Service")
PRIORITIES = ("Lowest", "BelowNormal", "Normal", "AboveNormal", "Highest")

JOB_STATES = (
    "Configuring",
    "Submitted",
    "Validating",
    "ExternalValidation",
    "Queued",
    "Running",
    "Finishing",
    "Finished",
    "Failed",
    "Canceled",
    "Canceling",
)
TASK_STATES = (
    "Configuring",
    "Submitted",
    "Validating",
    "Queued",
    "Dispatching",
    "Running",
    "Finishing",
    "Finished",
    "Failed",
    "Canceled",
    "Canceling",
)
ENDED = frozenset({"Finished", "Failed", "Canceled"})


def _p(
    name: str,
    kind: str = "str",
    default: str = "",
    *,
    choices: tuple[str, ...] = (),
    live: bool = False,
    secret: bool = False,
) -> Prop:
    return Prop(name, kind, default, choices=choices, live=live, secret=secret)


def _ro(name: str, kind: str = "str", default: str = "") -> Prop:
    return Prop(name, kind, default, settable=False)


def _int(name: str, default: str = "0", live: bool = False) -> Prop:
    return Prop(name, "int", default, live=live)


def _bool(name: str, default: str = "False", live: bool = False) -> Prop:
    return Prop(name, "bool", default, live=live)


JOB_PROPS: tuple[Prop, ...] = (
    _ro("Id", "int"),
    _p("Name", live=True),
    _ro("Owner"),
    _p("UserName", live=True),
    _p("Password", secret=True),
    _p("Project", live=True),
    _p("JobTemplate", default="Default"),
    _ro("State", default="Configuring"),
    _ro("PreviousState", default="Configuring"),
    _p("UnitType", "enum", "Core", choices=UNIT_TYPES),
    _int("MinCores", "1"),
    _int("MaxCores", "1"),
    _int("MinSockets", "1"),
    _int("MaxSockets", "1"),
    _int("MinNodes", "1"),
    _int("MaxNodes", "1"),
    _bool("AutoCalculateMin", "True"),
    _bool("AutoCalculateMax", "True"),
    _p("RequestedNodes", "list"),
    _p("NodeGroups", "list"),
    _p("NodeGroupOp", "enum", "Intersect", choices=NODE_GROUP_OPS),
    _bool("IsExclusive"),
    _bool("RunUntilCanceled", live=True),
    _bool("FailOnTaskFailure"),
    _p("Priority", "priority", "Normal", live=True),
    _int("ExpandedPriority", "2000", live=True),
    _int("RuntimeSeconds", live=True),
    _p("OrderBy"),
    _p("SoftwareLicense"),
    _int("MinCoresPerNode"),
    _int("MaxCoresPerNode"),
    _int("MinMemory"),
    _int("MaxMemory"),
    _int("EstimatedProcessMemory"),
    _bool("NotifyOnStart", live=True),
    _bool("NotifyOnCompletion", live=True),
    _p("EmailAddress", live=True),
    _p("HoldUntil", "time", live=True),
    _bool("SingleNode"),
    _p("JobValidExitCodes"),
    _p("ParentJobIds", "list"),
    _p("ChildJobIds", "list"),
    _int("TaskExecutionFailureRetryLimit"),
    _bool("FailDependentTasks"),
    _bool("Preemptable", "True"),
    _int("Progress", live=True),
    _p("ProgressMessage", live=True),
    _int("TargetResourceCount"),
    _p("ServiceName"),
    _p("Pool"),
    _p("ClientSource"),
    _ro("CreateTime", "time"),
    _ro("SubmitTime", "time"),
    _ro("StartTime", "time"),
    _ro("EndTime", "time"),
    _ro("ChangeTime", "time"),
    _ro("ErrorMessage"),
    _ro("AllocatedNodes", "list"),
    _ro("ExcludedNodes", "list"),
    _ro("RequeueCount", "int", "0"),
    _ro("AutoRequeueCount", "int", "0"),
    _ro("HasRuntime", "bool", "False"),
    _ro("CanGrow", "bool", "False"),
    _ro("CanShrink", "bool", "False"),
    _ro("PendingReason", default="None"),
    _ro("JobType", default="Batch"),
)

TASK_PROPS: tuple[Prop, ...] = (
    _ro("TaskId"),
    _ro("JobTaskId", "int"),
    _ro("InstanceId", "int", "0"),
    _ro("ParentJobId", "int"),
    _p("Name"),
    _ro("State", default="Configuring"),
    _ro("PreviousState", default="Configuring"),
    _p("CommandLine"),
    _int("MinCores", "1"),
    _int("MaxCores", "1"),
    _int("MinNodes", "1"),
    _int("MaxNodes", "1"),
    _int("MinSockets", "1"),
    _int("MaxSockets", "1"),
    _int("RuntimeSeconds"),
    _bool("IsExclusive"),
    _bool("IsRerunnable", "True"),
    _p("StdOutFilePath"),
    _p("StdErrFilePath"),
    _p("StdInFilePath"),
    _p("WorkDirectory"),
    _p("RequiredNodes", "list"),
    _p("DependsOn", "list"),
    _p("Type", "enum", "Basic", choices=TASK_TYPES),
    _int("StartValue"),
    _int("EndValue"),
    _int("IncrementValue", "1"),
    _int("GroupId"),
    _p("TaskValidExitCodes"),
    _bool("FailJobOnFailure"),
    _int("FailJobOnFailureCount", "1"),
    _p("RequestedNodeGroup"),
    _p("UserBlob"),
    _ro("CreateTime", "time"),
    _ro("SubmitTime", "time"),
    _ro("StartTime", "time"),
    _ro("EndTime", "time"),
    _ro("ChangeTime", "time"),
    _ro("ExitCode", "int", "0"),
    _ro("ErrorMessage"),
    _ro("Output"),
    _ro("AllocatedNodes", "list"),
    _ro("AllocatedCoreIds", "list"),
    _ro("RequeueCount", "int", "0"),
    _ro("AutoRequeueCount", "int", "0"),
    _ro("ExecutionFailureRetryCount", "int", "0"),
    _ro("HasRuntime", "bool", "False"),
    _ro("IsServiceConcluded", "bool", "False"),
    _ro("IsParametric", "bool", "False"),
)

JOB_BY_KEY = {p.name.lower(): p for p in JOB_PROPS}
TASK_BY_KEY = {p.name.lower(): p for p in TASK_PROPS}

# The job XML import map (facts/hpcpack-jobs.md section 1, reference/job-xml-import-map.json): lower-case
# attribute -> property. Anything else on <Job>/<Task> is silently ignored, as the scheduler does.
JOB_XML_ATTRIBUTES: dict[str, str] = {
    a.lower(): a
    for a in [
        "Name",
        "Project",
        "JobTemplate",
        "UnitType",
        "MinCores",
        "MaxCores",
        "MinSockets",
        "MaxSockets",
        "MinNodes",
        "MaxNodes",
        "AutoCalculateMin",
        "AutoCalculateMax",
        "RequestedNodes",
        "NodeGroups",
        "NodeGroupOp",
        "IsExclusive",
        "RunUntilCanceled",
        "FailOnTaskFailure",
        "Priority",
        "RuntimeSeconds",
        "OrderBy",
        "SoftwareLicense",
        "MinCoresPerNode",
        "MaxCoresPerNode",
        "MinMemory",
        "MaxMemory",
        "EstimatedProcessMemory",
        "NotifyOnStart",
        "NotifyOnCompletion",
        "EmailAddress",
        "HoldUntil",
        "SingleNode",
        "JobValidExitCodes",
        "ParentJobIds",
        "TaskExecutionFailureRetryLimit",
        "FailDependentTasks",
    ]
}

TASK_XML_ATTRIBUTES: dict[str, str] = {
    a.lower(): a
    for a in [
        "Name",
        "CommandLine",
        "MinCores",
        "MaxCores",
        "MinNodes",
        "MaxNodes",
        "MinSockets",
        "MaxSockets",
        "RuntimeSeconds",
        "IsExclusive",
        "IsRerunnable",
        "StdOutFilePath",
        "StdErrFilePath",
        "StdInFilePath",
        "WorkDirectory",
        "RequiredNodes",
        "DependsOn",
        "Type",
        "StartValue",
        "EndValue",
        "IncrementValue",
        "GroupId",
        "TaskValidExitCodes",
        "FailJobOnFailure",
        "FailJobOnFailureCount",
        "RequestedNodeGroup",
    ]
}
TASK_XML_ATTRIBUTES.update(
    {"stdout": "StdOutFilePath", "stderr": "StdErrFilePath", "stdin": "StdInFilePath", "depend": "DependsOn"}
)


def defaults(table: tuple[Prop, ...]) -> dict[str, str]:
    return {p.name: p.default for p in table if not p.secret}


def lookup(table: Mapping[str, Prop], name: str, what: str) -> Prop:
    prop = table.get(name.strip().lower())
    if prop is None:
        raise PropError(f"The {what} property '{name}' does not exist.")
    return prop


def parse_value(prop: Prop, value: str) -> str:
    """Check and normalise one input value the way the scheduler's setters do."""
    text = value.strip()
    if prop.kind == "str":
        return value
    if prop.kind == "int":
        try:
            number = int(text)
        except ValueError:
            raise PropError(f"The value '{value}' of property {prop.name} is not an integer.") from None
        if number < 0 and prop.name not in ("ExitCode",):
            raise PropError(f"The value of property {prop.name} must not be negative: {value}.")
        return str(number)
    if prop.kind == "bool":
        return parse_bool(text, prop.name)
    if prop.kind == "enum":
        return parse_enum(text, prop.choices, prop.name)
    if prop.kind == "priority":
        return parse_enum(text, PRIORITIES, prop.name)
    if prop.kind == "list":
        return join_list(split_list(value))
    if prop.kind == "time":
        return format_time(parse_time(text)) if text else ""
    raise AssertionError(prop.kind)


def parse_bool(text: str, name: str) -> str:
    low = text.strip().lower()
    if low in ("true", "1"):
        return "True"
    if low in ("false", "0"):
        return "False"
    raise PropError(f"The value '{text}' of property {name} is not a Boolean (true/false).")


def parse_enum(text: str, choices: tuple[str, ...], name: str) -> str:
    for choice in choices:
        if choice.lower() == text.lower():
            return choice
    if text.isdigit() and int(text) < len(choices):
        return choices[int(text)]
    raise PropError(f"The value '{text}' of property {name} is not one of: {', '.join(choices)}.")


def parse_runtime(text: str) -> str:
    """XML ``Runtime``: ``Infinite``, ``MM``, ``HH:MM`` or ``DD:HH:MM`` -> RuntimeSeconds."""
    if text.strip().lower() == "infinite":
        return "0"
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise PropError(f"The value '{text}' of Runtime is not Infinite, MM, HH:MM or DD:HH:MM.")
    numbers = [int(p) for p in parts]
    scale = {1: (60,), 2: (3600, 60), 3: (86400, 3600, 60)}[len(numbers)]
    return str(sum(n * s for n, s in zip(numbers, scale, strict=True)))


def split_list(value: str) -> list[str]:
    return [item.strip() for item in re.split(r"[,;]", value) if item.strip()]


def join_list(items: list[str]) -> str:
    return ",".join(items)


def as_bool(value: str) -> bool:
    return value == "True"


def format_time(when: dt.datetime | None) -> str:
    """The server's DateTime format, ``M/d/yyyy h:mm:ss tt`` (GET /cluster/info/dateTimeFormat)."""
    if when is None:
        return ""
    hour = when.hour % 12 or 12
    return (
        f"{when.month}/{when.day}/{when.year} {hour}:{when.minute:02d}:{when.second:02d} "
        f"{'AM' if when.hour < 12 else 'PM'}"
    )


_TIME_FORMATS = (
    "%m/%d/%Y %I:%M:%S %p",
    "%m/%d/%Y %H:%M:%S",
    "%m/%d/%Y",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
)


def parse_time(text: str) -> dt.datetime:
    text = text.strip()
    for fmt in _TIME_FORMATS:
        try:
            return dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise PropError(f"'{text}' is not a date and time (expected M/d/yyyy h:mm:ss tt).") from None
    return parsed.astimezone().replace(tzinfo=None) if parsed.tzinfo else parsed


def valid_exit_codes(spec: str) -> list[tuple[int, int]] | None:
    """``0,1,3..5,min..-1`` -> ranges; None when the spec is empty (the default: only 0 succeeds)."""
    if not spec.strip():
        return None
    ranges: list[tuple[int, int]] = []
    for item in split_list(spec):
        low, _, high = item.partition("..")
        try:
            a = -MAX_INT - 1 if low.strip().lower() == "min" else int(low)
            b = a if not high else (MAX_INT if high.strip().lower() == "max" else int(high))
        except ValueError:
            raise PropError(f"'{spec}' is not a list of exit codes (e.g. 0,1,3..5).") from None
        ranges.append((a, b))
    return ranges


def exit_code_ok(code: int, ranges: list[tuple[int, int]] | None) -> bool:
    if ranges is None:
        return code == 0
    return any(a <= code <= b for a, b in ranges)
