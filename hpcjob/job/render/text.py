"""JobPlan -> the cluster-run mount command, a PowerShell submission script, and the plan as JSON.

No value may change the structure of what it is written into. The PowerShell script carries the job
XML as base64 (no value can end it), every other value in a single-quoted string, and only printable
ASCII. The cmd.exe line carries only what cmd.exe reads as plain text. Anything else is refused with a
SpecError rather than written.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import re
from collections.abc import Sequence
from functools import cache

import jinja2

from hpcjob.job.plan import AllowedShare, ContainerPolicy, JobPlan, MountStep
from hpcjob.job.render.job_xml import job_xml
from hpcjob.job.spec import SpecError
from hpcjob.node.mount_filter import CONFIG_FILE as FILTER_CONFIG
from hpcjob.node.mount_filter import FILTERS_DIR, NODE_ROOT_VAR

# PowerShell reads all four as a single quote (language spec 2.3.5.2, single-quote-character): any
# of them ends a single-quoted string, and two in a row stand for the second.
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
_PS_QUOTE = re.compile(f"[{PS_SINGLE_QUOTES}]")
# A value in a script comment: a comment ends at a line break, so only plain validated text goes there.
_PS_COMMENT_VALUE = re.compile(r"[A-Za-z0-9 ._/:,=()-]*")
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
# The whole script: printable ASCII lines.
_PS_SCRIPT_BAD = re.compile(r"[^\x20-\x7e\n]")
# Base64 characters per line of the job file in the script: short enough for any editor.
_BASE64_LINE = 100
# Inside a double-quoted cmd.exe argument: printable ASCII without `"` (ends the quotes), `%` (expands
# variables even in quotes), `!` and `^` (delayed expansion) and `\` (escapes a quote for clusrun's
# argument parser). Windows PowerShell 5.1 passes `"` to a native program unescaped, so the same holds.
_CMD_QUOTED = re.compile(r"[ #$&'()*+,\-./0-9:;<=>?@A-Z\[\]_`a-z{|}~]*")
_CMD_NODE_LIST = re.compile(r"[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*")
# Shown as \u escapes in JSON: C1 controls (a terminal may act on them) and line breaks that are not
# CR or LF; json.dumps already escapes the C0 controls.
_JSON_INVISIBLE = re.compile("[\x7f-\x9f\u2028\u2029]")


def ps_quote(text: str) -> str:
    """A PowerShell single-quoted string: nothing in it expands; each single quote is doubled."""
    return "'" + _PS_QUOTE.sub(lambda m: m.group() * 2, text) + "'"


def ps_string(text: str) -> str:
    """A value for the script, quoted: printable ASCII only, so that no line of the script holds a
    string's second line (a reader would take it for code) and any code page reads it the same."""
    bad = _NOT_PRINTABLE_ASCII.search(text)
    if bad:
        raise SpecError(f"{text!r} holds {bad.group()!r}, which the PowerShell script does not carry")
    return ps_quote(text)


def ps_comment(text: str) -> str:
    """A value for a script comment, where a line break would start code: plain text only."""
    if not _PS_COMMENT_VALUE.fullmatch(text):
        raise SpecError(f"{text!r} cannot be written into a PowerShell comment")
    return text


@cache
def templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcjob.job.render", "templates"),
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["ps_string"] = ps_string
    environment.filters["ps_comment"] = ps_comment
    return environment


def _checked_mount(plan: JobPlan) -> MountStep:
    """The mount step, if cmd.exe (and clusrun's own argument parsing) would take it as plain text."""
    if plan.mount is None:
        raise SpecError("no share given: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    nodes = ",".join(plan.mount.nodes)
    if not _CMD_NODE_LIST.fullmatch(nodes):
        raise SpecError(f"node list {nodes!r} holds a character clusrun's /nodes: cannot carry")
    bad = _CMD_QUOTED.sub("", plan.mount.command)
    if bad:
        raise SpecError(f"the mount command holds {bad[0]!r}, which cmd.exe would change")
    return plan.mount


def clusrun_text(plan: JobPlan) -> str:
    """The `clusrun` command that mounts the share on the job's nodes, for cmd.exe on the head node."""
    return templates().get_template("clusrun.cmd.j2").render(mount=_checked_mount(plan))


def _base64_lines(data: bytes) -> list[str]:
    encoded = base64.b64encode(data).decode("ascii")
    return [encoded[i : i + _BASE64_LINE] for i in range(0, len(encoded), _BASE64_LINE)]


def powershell_text(plan: JobPlan) -> str:
    """A script for the head node: the mount step with clusrun, then the job from its XML."""
    mount = _checked_mount(plan) if plan.mount is not None else None
    text = (
        templates()
        .get_template("submit.ps1.j2")
        .render(plan=plan, mount=mount, job_file=_base64_lines(job_xml(plan).encode("utf-8")))
    )
    # Windows PowerShell 5.1 reads a script without a BOM in the ANSI code page, where UTF-8 bytes can
    # turn into quotes (in cp1252, 92 is U+2019): ASCII reads the same in every code page. The filters
    # check each value; this checks the whole, the template's own text included.
    bad = _PS_SCRIPT_BAD.search(text)
    if bad:
        raise SpecError(f"the PowerShell script would hold {bad.group()!r}; it carries printable ASCII only")
    return text


def plan_json(plan: JobPlan) -> str:
    data = dataclasses.asdict(plan)
    data["env"] = dict(plan.env)
    data["world_size"] = plan.world_size
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    # Such characters occur only inside JSON strings, where the escape means the same character.
    return _JSON_INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


FILTER_FILE = "hpcjob_mount_filter.py"
ENTRY_FILE = "hpcjob_filter.sh"
# The agent runs OnJobTaskStart.sh at a job's first task on a node and OnTaskStart.sh at its later ones;
# hpcjob's filter.sh is both, and a site's own filter under either name runs after it.
FILTER_EVENTS = ("OnJobTaskStart", "OnTaskStart")
CHAINED_SUFFIX = ".hpcjob-next.sh"


def _packed(data: bytes) -> str:
    """gzip, then base64: one word that no shell quoting changes, a third of the file's size."""
    return base64.b64encode(gzip.compress(data, mtime=0)).decode("ascii")


def filter_config(
    shares: Sequence[AllowedShare], containers: ContainerPolicy | None = None, local_disks: str | None = None
) -> str:
    """FILTERS/hpcjob-mounts.json: the shares jobs may name, and nothing else a job can change; the
    administrator's container policy, when there is one; and where the nodes' free NVMe disks are
    assembled, when they are."""
    config: dict[str, object] = {"shares": [dataclasses.asdict(share) for share in shares]}
    if containers is not None:
        config["containers"] = {k: list(v) for k, v in dataclasses.asdict(containers).items()}
    if local_disks is not None:
        config["local_disks"] = {"mount": local_disks}
    return json.dumps(config, indent=2) + "\n"


def filter_install_command(
    shares: Sequence[AllowedShare], containers: ContainerPolicy | None = None, local_disks: str | None = None
) -> str:
    """Bash, run as root on each node (clusrun /user:system, or an administrator's job): install
    hpcjob's execution filter (hpcjob/node/mount_filter.py behind filter.sh, as OnJobTaskStart.sh and
    OnTaskStart.sh), the shares it may mount, the container policy it applies (none: containers as
    the agent runs them) and where it assembles the nodes' free NVMe disks (none: it leaves them). A
    filter already there is kept and chained after hpcjob's; installing again
    replaces hpcjob's files, the allowed shares and the policy, nothing else. No secret is in it: the
    filter gets each job owner's credentials from the node agent."""
    from importlib import resources

    if not shares:
        raise SpecError("no share to allow: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    node = resources.files("hpcjob") / "node"
    code = _packed((node / "mount_filter.py").read_bytes())
    entry = _packed((node / "filter.sh").read_bytes())
    config = _packed(filter_config(shares, containers, local_disks).encode("utf-8"))
    policy = "with a container policy" if containers else "with no container policy"
    if local_disks:
        policy += f", its free NVMe disks at {local_disks}"
    # Each file is written beside, then renamed over the old one: an agent starting a filter meanwhile
    # runs the old file or the new, never half of one.
    chain = " ".join(
        f'{{ [ ! -e "$d/{event}.sh" ] || grep -qF {FILTER_FILE} "$d/{event}.sh" || '
        f'mv "$d/{event}.sh" "$d/{event}{CHAINED_SUFFIX}"; }} && put 755 {event}.sh < "$d/{ENTRY_FILE}" &&'
        for event in FILTER_EVENTS
    )
    # The new filter checks the shares and their mount roots on the node before anything is replaced
    # (a mount root in a folder others may write is refused): with python3, or RHEL 8's platform-python.
    return (
        f'umask 022; d=${NODE_ROOT_VAR}{FILTERS_DIR}; mkdir -p "$d" && chmod go-w "$d" && '
        'put() { cat > "$d/.hpcjob-new" && chmod "$1" "$d/.hpcjob-new" && '
        'mv -f "$d/.hpcjob-new" "$d/$2"; } && '
        "{ py=$(command -v python3 || command -v /usr/libexec/platform-python) || "
        '{ echo "hpcjob: no python3 on $(hostname): the execution filter needs it" >&2; false; }; } && '
        f"echo {code} | base64 -d | gunzip | put 755 .hpcjob-filter && "
        f"echo {config} | base64 -d | gunzip | put 644 .hpcjob-config && "
        '"$py" -I "$d/.hpcjob-filter" check-install < "$d/.hpcjob-config" && '
        f'mv -f "$d/.hpcjob-filter" "$d/{FILTER_FILE}" || {{ rm -f "$d/.hpcjob-filter" "$d/.hpcjob-config"; '
        "false; } && "
        f"echo {entry} | base64 -d | gunzip | put 755 {ENTRY_FILE} && "
        f"{chain} "
        f'mv -f "$d/.hpcjob-config" "$d/{FILTER_CONFIG}" && '
        f'echo "hpcjob: execution filter installed in $d on $(hostname), {policy}"'
    )
