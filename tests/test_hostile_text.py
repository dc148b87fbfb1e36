"""No value can change the structure of a generated text: job XML, mount job XML, clusrun line,
PowerShell script, JSON plan. Each hostile value either comes back exactly from every artefact, read
the way its consumer reads it (tests/artefact_checks.py), or is refused with a SpecError.

Each check is a property (hypothesis) of hostile text: fragments of every kind in KINDS and single
characters of any kind, joined. The first three fragments of each kind, the known nasty ones, are explicit
examples of every property, so each run checks each kind whatever the random draw."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hpcjob.job.plan import JobPlan, make_plan
from hpcjob.job.render import clusrun_text, job_xml, powershell_text
from hpcjob.job.render.text import ps_quote
from hpcjob.job.spec import JobSpec, SpecError, parse_share
from hpcjob.runner import render_owner

from .artefact_checks import (
    PS_QUOTES,
    check_all,
    check_clusrun,
    check_job_xml,
    check_powershell,
    ps_read_string,
    ps_unquote,
)
from .conftest import REPO, RUN_ID, cluster_spec

# The red team's value: in a here-string, CR then '@ ended the job file and the next line ran.
EXPLOIT = "x\r'@\rWrite-Host PWNED\r@'\ry"
# Hostile text by kind, each kind's known nasty ones first: the first three are NASTY.
KINDS: dict[str, tuple[str, ...]] = {
    # Ends a PowerShell here-string (any of the four single quotes, or a double quote) and runs a line.
    "here-string end": (
        EXPLOIT,
        '\n"@\nWrite-Host PWNED\n@"',
        "\r\n\u2019@\r\nWrite-Host PWNED\r\n@\u2019",
        *(
            f"{eol}{quote}@\nWrite-Host PWNED\n@{quote}"
            for eol in ("\r", "\n", "\r\n")
            for quote in PS_QUOTES
        ),
        '"@',
    ),
    # Ends a line: of the script, of a comment, of a variable the node agent reads back by line.
    "line break": ("\n", "\r\n", "\u2028", "\r", "\u2029"),
    # Ends a string: PowerShell's single quotes (the four of its language specification), cmd.exe's ".
    "quote": ("\u2019", "'", '"', "\u2018", "\u201a", "\u201b"),
    # C0, DEL and C1: XML 1.0 carries none of C0 but TAB, LF and CR; a terminal acts on some.
    "control character": (
        "\x00",
        "\x85",
        "\x1b",
        *map(chr, range(0x00, 0x20)),
        "\x7f",
        *map(chr, range(0x80, 0xA0)),
    ),
    # PowerShell's subexpression, escape and variables: code in a double-quoted string.
    "PowerShell code": ("$(Write-Host PWNED)", "`n`r", "$env:TEMP", "`"),
    # cmd.exe's variables (expanded in quotes too), escape, separators and redirection.
    "cmd.exe code": ("%PATH%", "&& calc", "!PATH!", "^", "&", "|", "<", ">"),
    # Escapes a quote for clusrun's argument parser and Windows' command lines.
    "backslash": ('\\"', "\\"),
    "XML markup": ("]]>", "<!--", "&amp;"),
    # Ò is C3 92 in UTF-8; in cp1252 (Windows PowerShell 5.1 without a BOM) 92 is U+2019, a quote.
    "non-ASCII": ("Ò", "emoji 🚀", "日本語", "naïve ünïcödé"),
    # Lone surrogates (UTF-8 cannot encode them) and noncharacters (XML 1.0 cannot carry U+FFFE, U+FFFF).
    "not a character": ("\ud800", "\uffff", "\ufffe", "\udfff"),
    "blank": ("", " "),
}
HOSTILE = [value for values in KINDS.values() for value in values]
NASTY = [value for values in KINDS.values() for value in values[:3]]

# Single characters: every class that matters, often, and any other now and then.
HOSTILE_CHARS = st.sampled_from(
    [
        *PS_QUOTES,
        *'\r\n\t\x00\x1b\x7f\x85\x9b\u2028\u2029`$()%!^&|<>"\\@;# -=,./:',
        *("Ò", "日", "🚀", "\ud800", "\udfff", "\ufffe", "\uffff"),
    ]
)
ANY_CHAR = st.one_of(HOSTILE_CHARS, st.characters(exclude_categories=()))
ANY_TEXT = st.text(alphabet=ANY_CHAR, max_size=30)
# Fragments of any kind and single characters, joined: several kinds in one value, or one kind twice
# (a here-string's end, then a start).
HOSTILE_TEXT = st.lists(st.one_of(st.sampled_from(HOSTILE), ANY_CHAR), max_size=4).map("".join)
# Text the spec's fields take: the carried path, not only the refused one.
PLAIN_TEXT = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._$=,:/ -]{0,12}", fullmatch=True)
# Printable ASCII: what reaches cmd.exe, and a field's one character too many.
ASCII_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
FIELD_TEXT = st.one_of(PLAIN_TEXT, ASCII_TEXT, HOSTILE_TEXT)

Test = Callable[..., None]


def nasty_examples(test: Test) -> Test:
    """Each known nasty value as an explicit example of the property's `value`."""
    for value in NASTY:
        test = example(value=value)(test)
    return test


def xml_char(char: str) -> bool:
    """XML 1.0's Char production: what a job file can carry at all."""
    code = ord(char)
    return (
        code in (0x9, 0xA, 0xD)
        or 0x20 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )


def carriable(*values: str) -> bool:
    return all(xml_char(c) for value in values for c in value)


def plain(spec: JobSpec) -> JobPlan:
    """The same job with plain environment values and script arguments: the shape to keep."""
    plain_spec = dataclasses.replace(spec, env=tuple((k, "x") for k, _ in spec.env), script_args=())
    return make_plan(plain_spec, plain_spec.node_names, RUN_ID)


def check_values(env_value: str, args: tuple[str, ...], **fields: object) -> None:
    """The job with `env_value` in an environment variable and `args` for the script: refused exactly
    when a job file cannot carry them, else carried exactly by every artefact."""

    def make(value: str = env_value) -> JobSpec:
        env = (("NOTE", value), ("NCCL_DEBUG", "WARN"))
        return cluster_spec(2, env=env, script_args=args, command_limit=100_000, **fields)

    line_break = "\n" in env_value or "\r" in env_value
    if not carriable(env_value, *args) or line_break:
        # The node agent reads a container's variables back by line (issue 31): no line break in a value.
        with pytest.raises(SpecError, match=r"control character a job file cannot carry|no line break"):
            make()
        if not carriable(env_value, *args):
            return
    spec = make("x" if line_break else env_value)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    # Past the spec too: the renderers carry any value exactly.
    plan = dataclasses.replace(plan, env=tuple((k, env_value if k == "NOTE" else v) for k, v in plan.env))
    check_all(plan, (spec.script_name, *args), plain(spec))


@settings(max_examples=40, deadline=None)
@given(value=HOSTILE_TEXT)
@nasty_examples
def test_a_hostile_environment_value_is_carried_exactly_or_refused(value: str) -> None:
    check_values(value, ())
    check_values(f"a{value}b{value}", ())
    check_values(value, (), share=None, node_group=None)


@settings(max_examples=40, deadline=None)
@given(value=HOSTILE_TEXT)
@nasty_examples
def test_a_hostile_script_argument_is_carried_exactly_or_refused(value: str) -> None:
    check_values("x", (value,))
    check_values("x", (f"--a={value}", value, f"{value}{value}"))


@settings(max_examples=100, deadline=None)
@given(env_value=ANY_TEXT, args=st.lists(ANY_TEXT, max_size=4).map(tuple))
@example(env_value=EXPLOIT, args=(EXPLOIT,))
@example(env_value="\r\n\u2019@\r\nWrite-Host PWNED", args=("\r", "\u2018@"))
def test_any_environment_value_and_script_arguments(env_value: str, args: tuple[str, ...]) -> None:
    check_values(env_value, args)


RENDER_POWERSHELL = ("render", "--format", "powershell", "--node", "A", "--run-id", RUN_ID)


def test_the_red_team_exploit_is_inert(tmp_path: Path) -> None:
    """`hpcjob render --format powershell --env $'FOO=x\\r\\'@\\rWrite-Host PWNED\\r@\\'\\ry'`."""
    script = tmp_path / "script.py"
    script.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *RENDER_POWERSHELL, "--env", f"FOO={EXPLOIT}", str(script)],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    # A line break in --env is refused in one line (the node agent reads variables back by line)...
    assert result.returncode == 2 and result.stderr.decode().count("\n") == 1
    assert b"no line break" in result.stderr and not result.stdout
    # ...and in a script argument, or a value past the spec, it is inert.
    result = subprocess.run(
        [sys.executable, "-m", "hpcjob.cli", *RENDER_POWERSHELL, "--env", "FOO=x", str(script), EXPLOIT],
        capture_output=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode("ascii")  # bytes: text mode would turn the CRs it must not hold into LF
    assert "PWNED" not in text and "\r" not in text
    spec = JobSpec(
        script=str(script),
        script_args=(EXPLOIT,),
        node_names=("A",),
        env=(("FOO", "x"),),
        owner=render_owner(),
    )
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert text == powershell_text(plan)  # what the command line rendered, exactly
    check_powershell(plan, powershell_text(plan), powershell_text(plain(spec)))
    check_job_xml(plan, ("script.py", EXPLOIT), job_xml(plan))
    past = dataclasses.replace(plan, env=(("FOO", EXPLOIT),))
    check_powershell(past, powershell_text(past), powershell_text(plan))


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.text(alphabet=ANY_CHAR), HOSTILE_TEXT))
@nasty_examples
@example(value="it's \u2018a\u2019 \u201ab\u201b ''")
@example(value="\u2019\u2019\u2019")
def test_ps_quote_gives_back_any_text(value: str) -> None:
    quoted = ps_quote(value)
    assert ps_unquote(quoted) == value
    # The string ends where ps_quote's does, with code after it (the script's next word).
    assert ps_read_string(quoted + " ; Write-Host 'PWNED'", 0) == (value, len(quoted))


# -- values the spec validates: refused, or carried exactly ---------------------------------------------

FIELDS: dict[str, Callable[[str], dict[str, object]]] = {
    "name": lambda v: {"name": v},
    "node": lambda v: {"node_names": ("GPUNODE001", v)},
    "node_group": lambda v: {"node_group": v},
    "share": lambda v: {"share": parse_share(f"//HEADNODE/CcpSpoolDir/{v}")},
    "mount_options": lambda v: {"mount_options": v},
    "mount_point": lambda v: {"mount_point": f"/app{v}"},
    "job_folder": lambda v: {"job_folder": f"hpcjob/{v}"},
    "python": lambda v: {"python": v},
    "script": lambda v: {"script": f"dir/{v}.py"},
}


def check_field(field: str, value: str, run_id: str = RUN_ID) -> None:
    """A job with `value` in `field`: refused with a SpecError, or carried exactly everywhere."""
    try:
        overrides = FIELDS[field](value)
        spec = cluster_spec(2, command_limit=100_000, **overrides)
        plan = make_plan(spec, spec.node_names, run_id)
    except SpecError as exc:
        assert "\n" not in str(exc) and "\r" not in str(exc)  # one line
        return
    reference = make_plan(cluster_spec(2), cluster_spec(2).node_names, RUN_ID)
    check_all(plan, (spec.script_name, *spec.script_args), reference)


@pytest.mark.parametrize("field", FIELDS)
@settings(max_examples=20, deadline=None)
@given(value=FIELD_TEXT)
@nasty_examples
def test_a_hostile_value_in_a_validated_field_is_carried_exactly_or_refused(field: str, value: str) -> None:
    check_field(field, value)
    check_field(field, f"a{value}a")


@settings(max_examples=40, deadline=None)
@given(value=FIELD_TEXT)
@nasty_examples
def test_a_hostile_run_id_is_carried_exactly_or_refused(value: str) -> None:
    check_field("name", "run_ddp", run_id=value)
    check_field("name", "run_ddp", run_id=f"a{value}a")


# -- the renderers' own guards, for plans built past the spec ------------------------------------------


def with_mount_command(command: str, nodes: tuple[str, ...] = ("GPUNODE001", "GPUNODE002")) -> JobPlan:
    spec = cluster_spec(2)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    assert plan.mount is not None
    return dataclasses.replace(plan, mount=dataclasses.replace(plan.mount, command=command, nodes=nodes))


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(ASCII_TEXT, HOSTILE_TEXT))
@nasty_examples
def test_the_clusrun_line_refuses_what_cmd_exe_would_act_on(value: str) -> None:
    plan = with_mount_command(f"echo {value} && mount /app")
    reference = powershell_text(with_mount_command("echo x && mount /app"))
    try:
        text = clusrun_text(plan)
    except SpecError as exc:
        assert "\n" not in str(exc)
        with pytest.raises(SpecError, match="the mount command holds"):  # the same line in PowerShell
            powershell_text(plan)
        return
    check_clusrun(plan, text)
    check_powershell(plan, powershell_text(plan), reference)


@pytest.mark.parametrize(
    "bad", ['"', "%", "!", "^", "\\", "\r", "\n", "\x00", "\u2019", "Ò", "\x85"], ids=ascii
)
def test_the_mount_step_refuses_characters_cmd_exe_or_clusrun_would_change(bad: str) -> None:
    plan = with_mount_command(f"mount {bad} /app")
    with pytest.raises(SpecError, match="the mount command holds"):
        clusrun_text(plan)
    with pytest.raises(SpecError, match="the mount command holds"):
        powershell_text(plan)


@pytest.mark.parametrize("node", ["A&calc", "A B", 'A"', "A%X%", "A\r\nB", "A'B"], ids=ascii)
def test_the_mount_step_refuses_a_node_list_cmd_exe_would_change(node: str) -> None:
    plan = with_mount_command("mount /app", nodes=("GPUNODE001", node))
    with pytest.raises(SpecError, match="node list"):
        clusrun_text(plan)
    with pytest.raises(SpecError, match="node list"):
        powershell_text(plan)


def _tasks(text: str) -> list[dict[str, str]]:
    return [dict(e.attrib) for e in ET.fromstring(text.encode()).iter() if e.tag.endswith("}Task")]


def test_the_job_xml_refuses_what_xml_cannot_carry_even_past_the_spec() -> None:
    spec = cluster_spec(2)
    plan = dataclasses.replace(make_plan(spec, spec.node_names, RUN_ID), env=(("NOTE", "a\x00b"),))
    with pytest.raises(SpecError, match="cannot carry"):
        job_xml(plan)
    with pytest.raises(SpecError, match="cannot carry"):
        powershell_text(plan)


def test_cr_in_an_environment_value_is_written_as_a_reference() -> None:
    spec = cluster_spec(2, env=(("NOTE", "x"),))
    plan = make_plan(spec, spec.node_names, RUN_ID)  # past the spec, which refuses a line break
    text = job_xml(dataclasses.replace(plan, env=(("NOTE", "a\rb\r\nc\u2028d\x85e"),)))
    assert "<Value>a&#13;b&#13;\nc&#8232;d&#133;e</Value>" in text


PAST_THE_SPEC: dict[str, Callable[[JobPlan, str], JobPlan]] = {
    "run_id": lambda plan, v: dataclasses.replace(plan, run_id=v),
    "log_dir": lambda plan, v: dataclasses.replace(plan, log_dir=v),
    "job_dir": lambda plan, v: dataclasses.replace(plan, job_dir=v),
    "node": lambda plan, v: dataclasses.replace(plan, nodes=("GPUNODE001", v)),
    "node_group": lambda plan, v: dataclasses.replace(plan, node_group=v),
    "rdzv_endpoint": lambda plan, v: dataclasses.replace(plan, rdzv_endpoint=v),
    "env name": lambda plan, v: dataclasses.replace(plan, env=((v, "x"),)),
}


@pytest.mark.parametrize("field", PAST_THE_SPEC)
@settings(max_examples=20, deadline=None)
@given(value=HOSTILE_TEXT)
@nasty_examples
def test_the_powershell_script_keeps_its_shape_for_a_plan_built_past_the_spec(field: str, value: str) -> None:
    """Comments take only plain text, strings any, and the script stays ASCII: or a SpecError."""
    spec = cluster_spec(2)
    plan = make_plan(spec, spec.node_names, RUN_ID)
    hostile = PAST_THE_SPEC[field](plan, f"a{value}")
    try:
        text = powershell_text(hostile)
    except SpecError as exc:
        assert "\n" not in str(exc)
        return
    check_powershell(hostile, text, powershell_text(plan))
