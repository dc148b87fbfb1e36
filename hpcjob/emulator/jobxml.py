"""Read a job XML file the way the scheduler's importer does (facts/hpcpack-jobs.md section 1).

Elements are found by local name (namespace and ``Version`` are not checked), attribute names match
case-insensitively, attributes outside the import map are silently ignored, and a value that does not
parse is an error.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from hpcjob.emulator.props import (
    JOB_BY_KEY,
    JOB_XML_ATTRIBUTES,
    TASK_BY_KEY,
    TASK_XML_ATTRIBUTES,
    Prop,
    PropError,
    parse_runtime,
    parse_value,
)


@dataclass
class TaskDraft:
    props: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, str] = field(default_factory=dict)


@dataclass
class JobDraft:
    props: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, str] = field(default_factory=dict)
    tasks: list[TaskDraft] = field(default_factory=list)
    has_dependencies: bool = False


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _children(element: ET.Element, name: str) -> list[ET.Element]:
    return [child for child in element if _local(child.tag).lower() == name.lower()]


def _text(element: ET.Element, name: str) -> str:
    found = _children(element, name)
    return (found[0].text or "") if found else ""


def _pairs(element: ET.Element, container: str, item: str) -> dict[str, str]:
    """``<EnvironmentVariables><Variable><Name/><Value/>`` and ``<CustomProperties><Term>...``."""
    pairs: dict[str, str] = {}
    for box in _children(element, container):
        for entry in _children(box, item):
            name = _text(entry, "Name").strip()
            if not name:
                raise PropError(f"A <{item}> in <{container}> has no <Name>.")
            pairs[name] = _text(entry, "Value")
    return pairs


def _attributes(
    element: ET.Element, known: dict[str, str], table: dict[str, Prop], what: str
) -> dict[str, str]:
    props: dict[str, str] = {}
    given: set[str] = set()
    for raw_name, value in element.attrib.items():
        key = _local(raw_name).lower()
        given.add(key)
        if key == "runtime":
            props["RuntimeSeconds"] = parse_runtime(value)
        elif key in ("minimumnumberofprocessors", "maximumnumberofprocessors"):
            # Legacy alias: processor counts are cores.
            target = "MinCores" if key.startswith("min") else "MaxCores"
            props[target] = parse_value(table[target.lower()], value)
            if what == "job":
                props["UnitType"] = "Core"
        elif key in known:
            name = known[key]
            try:
                props[name] = parse_value(table[name.lower()], value)
            except PropError as err:
                raise PropError(f"<{what.capitalize()}> attribute {_local(raw_name)}: {err}") from None
        # Anything else: silently ignored, as the importer does.
    if what == "job":
        # The importer turns AutoCalculate off for a bound that is given explicitly (FixPropConflicts).
        for bound in ("min", "max"):
            explicit = any(f"{bound}{unit}" in given for unit in ("cores", "nodes", "sockets"))
            if explicit and f"autocalculate{bound}" not in given:
                props[f"AutoCalculate{bound.capitalize()}"] = "False"
    return props


def parse_job_xml(text: str) -> JobDraft:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise PropError(f"The job XML is not well-formed: {err}.") from None
    if _local(root.tag).lower() != "job":
        raise PropError(f"The root element of a job XML must be <Job>, not <{_local(root.tag)}>.")
    draft = JobDraft(
        props=_attributes(root, JOB_XML_ATTRIBUTES, JOB_BY_KEY, "job"),
        env=_pairs(root, "EnvironmentVariables", "Variable"),
        custom=_pairs(root, "CustomProperties", "Term"),
    )
    draft.has_dependencies = any(len(_children(d, "Parent")) for d in _children(root, "Dependencies"))
    for tasks in _children(root, "Tasks"):
        for task in _children(tasks, "Task"):
            draft.tasks.append(
                TaskDraft(
                    props=_attributes(task, TASK_XML_ATTRIBUTES, TASK_BY_KEY, "task"),
                    env=_pairs(task, "EnvironmentVariables", "Variable"),
                    custom=_pairs(task, "CustomProperties", "Term"),
                )
            )
    return draft
