"""Checks that each generated text carries the plan's values exactly and keeps its own structure.

Each check reads the text back the way its consumer does (an XML parser, json, bash word splitting,
PowerShell's and cmd.exe's rules for quotes) and compares every value with the plan. The shape the
text must keep is given by a reference: the same job rendered from plain values.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shlex
import unicodedata
import xml.etree.ElementTree as ET
from typing import Any

import tree_sitter
import tree_sitter_powershell

from hpcjob.job.plan import JobPlan
from hpcjob.job.render import JOB_NAMESPACE, clusrun_text, job_xml, mount_job_xml, plan_json, powershell_text
from hpcjob.job.render.job_xml import MOUNT_CHECK

NS = {"j": JOB_NAMESPACE}
# The PowerShell language specification, 2.3.5.2: single-quote-character.
PS_QUOTES = "'\u2018\u2019\u201a\u201b"
BASE64_LINE = re.compile(r"    '[A-Za-z0-9+/=]+'")
# What cmd.exe acts on even inside double quotes (variables, delayed expansion), and what it acts on
# outside them (command separators, redirection, escapes, grouping).
CMD_ANYWHERE = set("%!^")
CMD_OUTSIDE_QUOTES = set("&|<>^()")


def no_invisible(text: str, allowed: str) -> None:
    """No control character (C0, DEL, C1) but `allowed`, and no Unicode line or paragraph separator."""
    for char in text:
        assert char in allowed or unicodedata.category(char) != "Cc", repr(char)
        assert char not in "\u2028\u2029", repr(char)


# -- job XML -------------------------------------------------------------------------------------------


def script_argv(command_line: str) -> list[str]:
    """The script and its arguments, split as bash splits the CommandLine (shlex follows bash's quotes)."""
    words = shlex.split(command_line)
    return words[words.index(".hpcjob/worker.py") + 1 :]


def check_job_xml(plan: JobPlan, argv: tuple[str, ...], text: str) -> None:
    """`argv`: the script's name and arguments."""
    no_invisible(text, "\n\t")
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == f"{{{JOB_NAMESPACE}}}Job"
    assert root.get("Name") == plan.run_id
    assert root.get("RequestedNodes") == ",".join(plan.nodes)
    assert root.get("NodeGroups") == plan.node_group
    variables = root.findall("j:EnvironmentVariables/j:Variable", NS)
    assert [
        (v.findtext("j:Name", namespaces=NS), v.findtext("j:Value", namespaces=NS)) for v in variables
    ] == list(plan.env)
    tasks = root.findall("j:Tasks/j:Task", NS)
    assert [dict(t.attrib) for t in tasks] == [
        {
            "Name": t.name,
            "CommandLine": t.command_line,
            "MinNodes": "1",
            "MaxNodes": "1",
            "RequiredNodes": t.node,
            "IsRerunnable": "false",
            "WorkDirectory": t.work_directory,
            "StdOutFilePath": t.stdout_path,
            "StdErrFilePath": t.stderr_path,
        }
        for t in plan.tasks
    ]
    for task in tasks:
        assert script_argv(task.get("CommandLine", "")) == list(argv)


def check_mount_job_xml(plan: JobPlan, text: str) -> None:
    assert plan.mount is not None
    no_invisible(text, "\n\t")
    root = ET.fromstring(text.encode("utf-8"))
    assert root.get("Name") == f"{plan.run_id}-mount"
    # Every node reports its mount: one node's failure does not cancel the others' tasks.
    assert (root.get("FailOnTaskFailure"), root.get("IsExclusive")) == ("false", "false")
    variables = root.findall("j:EnvironmentVariables/j:Variable", NS)
    # The user's own job: the execution filter mounts what HPCJOB_MOUNT names; the task says what it did.
    assert [
        (v.findtext("j:Name", namespaces=NS), v.findtext("j:Value", namespaces=NS)) for v in variables
    ] == [("HPCJOB_MOUNT", plan.mount.filter_request)]
    assert plan.mount.filter_request == f"{plan.mount.share_unc}|{plan.mount.mount_point}"
    tasks = root.findall("j:Tasks/j:Task", NS)
    assert [(t.get("RequiredNodes"), t.get("CommandLine")) for t in tasks] == [
        (node, MOUNT_CHECK) for node in plan.nodes
    ]


# -- JSON ----------------------------------------------------------------------------------------------


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def check_plan_json(plan: JobPlan, text: str) -> None:
    no_invisible(text, "\n")
    expected = _lists(dataclasses.asdict(plan))
    expected["env"] = dict(plan.env)
    expected["world_size"] = plan.world_size
    assert json.loads(text) == expected


# -- cmd.exe -------------------------------------------------------------------------------------------


def cmd_words(line: str) -> list[str]:
    """Split one cmd.exe line into its words, refusing anything cmd.exe would act on."""
    assert line.isascii() and line.isprintable(), repr(line)
    words, word, quoted = [], "", False
    for char in line:
        assert char not in CMD_ANYWHERE, char
        if char == '"':
            quoted = not quoted
        elif char == " " and not quoted:
            words.append(word)
            word = ""
            continue
        elif not quoted:
            assert char not in CMD_OUTSIDE_QUOTES, char
        word += char
    assert not quoted
    return [*words, word]


def check_clusrun(plan: JobPlan, text: str) -> None:
    assert plan.mount is not None
    assert text.endswith("\n") and text.count("\n") == 1 and "\r" not in text
    words = cmd_words(text.removesuffix("\n"))
    assert words[:3] == ["clusrun", "/user:system", "/nodes:" + ",".join(plan.mount.nodes)]
    # clusrun's own argument parser treats a backslash before a quote as an escape
    assert "\\" not in words[3]
    assert words[3:] == [f'"{plan.mount.command}"']


# -- PowerShell ----------------------------------------------------------------------------------------


def ps_read_string(text: str, start: int) -> tuple[str, int]:
    """Read the single-quoted string at text[start] as PowerShell's tokenizer does: any of the four
    quotes ends it, unless another follows, and then the second is the character. Returns the value
    and the index after the closing quote."""
    assert text[start] in PS_QUOTES
    value, i = [], start + 1
    while i < len(text):
        if text[i] in PS_QUOTES:
            if i + 1 < len(text) and text[i + 1] in PS_QUOTES:
                value.append(text[i + 1])
                i += 2
                continue
            return "".join(value), i + 1
        value.append(text[i])
        i += 1
    raise AssertionError(f"unterminated string: {text[start:]!r}")


def ps_unquote(literal: str) -> str:
    value, end = ps_read_string(literal, 0)
    assert end == len(literal), f"the string ends early: {literal[:end]!r} of {literal!r}"
    return value


def parse_powershell(text: str) -> tuple[bytes, tree_sitter.Node]:
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
    source = text.encode()
    return source, parser.parse(source).root_node


def powershell_errors(text: str) -> bool:
    return parse_powershell(text)[1].has_error


def _verbatim(node: tree_sitter.Node) -> bool:
    return node.type == "string_literal" and [c.type for c in node.children] == ["verbatim_string_characters"]


def ps_shape(text: str) -> tuple[str, list[str], list[str]]:
    """The script with each comment as #_, each single-quoted string as '_' and the job file's base64
    array as @(_); the strings' values in order; the base64 lines."""
    source, root = parse_powershell(text)
    assert not root.has_error
    cuts: list[tuple[int, int, str]] = []
    values: list[str] = []
    chunks: list[str] = []

    def walk(node: tree_sitter.Node) -> None:
        if node.type == "array_expression":
            strings = [n for n in descendants(node) if n.type == "string_literal"]
            chunks.extend(ps_unquote(node_text(source, n)) for n in strings)
            assert all(_verbatim(n) for n in strings)
            cuts.append((node.start_byte, node.end_byte, "@(_)"))
            return
        if node.type == "comment":
            cuts.append((node.start_byte, node.end_byte, "#_"))
            return
        if _verbatim(node):
            values.append(ps_unquote(node_text(source, node)))
            cuts.append((node.start_byte, node.end_byte, "'_'"))
            return
        for child in node.children:
            walk(child)

    walk(root)
    shape, last = b"", 0
    for start, end, placeholder in cuts:
        shape += source[last:start] + placeholder.encode()
        last = end
    return (shape + source[last:]).decode(), values, chunks


def descendants(node: tree_sitter.Node) -> list[tree_sitter.Node]:
    found = []
    for child in node.children:
        found.append(child)
        found.extend(descendants(child))
    return found


def node_text(source: bytes, node: tree_sitter.Node) -> str:
    return source[node.start_byte : node.end_byte].decode()


def check_powershell(plan: JobPlan, text: str, reference: str) -> None:
    """`text` is the script for `plan`; `reference` a script for a job with plain values and the same
    parts (mount step, node group, environment)."""
    # Windows PowerShell 5.1 reads a script without a BOM in the ANSI code page: ASCII reads the same
    # everywhere, and the parser below (which knows only the ASCII quote) reads it as PowerShell does.
    assert text.isascii()
    no_invisible(text, "\n")
    # As many lines as the reference but for the job file's base64 lines, comments where it has them:
    # no value made a line of its own (splitlines breaks at every line break: CR, LF, U+2028...).
    lines = [line for line in text.splitlines() if not BASE64_LINE.fullmatch(line)]
    reference_lines = [line for line in reference.splitlines() if not BASE64_LINE.fullmatch(line)]
    assert [line.startswith("#") for line in lines] == [line.startswith("#") for line in reference_lines]
    shape, values, chunks = ps_shape(text)
    assert shape == ps_shape(reference)[0]
    expected = ["Stop", plan.run_id, plan.log_dir]
    if plan.mount is not None:
        expected += ["/nodes:" + ",".join(plan.mount.nodes), plan.mount.command]
    assert values == [*expected, ".xml"]
    assert base64.b64decode("".join(chunks), validate=True) == job_xml(plan).encode("utf-8")


# -- all of them ---------------------------------------------------------------------------------------


def check_all(plan: JobPlan, argv: tuple[str, ...], reference: JobPlan) -> None:
    """Every artefact of `plan` carries its values exactly (`argv`: the script and its arguments);
    `reference` is a plan with plain values and the same parts."""
    check_job_xml(plan, argv, job_xml(plan))
    check_plan_json(plan, plan_json(plan))
    check_powershell(plan, powershell_text(plan), powershell_text(reference))
    if plan.mount is not None:
        check_mount_job_xml(plan, mount_job_xml(plan))
        check_clusrun(plan, clusrun_text(plan))
