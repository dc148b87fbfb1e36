"""JobPlan -> the cluster-run mount command, a PowerShell submission script, and the plan as JSON."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import jinja2

from hpcjob.plan import JobPlan
from hpcjob.render.job_xml import job_xml
from hpcjob.spec import SpecError


def ps_quote(text: str) -> str:
    """A PowerShell single-quoted string: nothing in it expands; a quote is doubled."""
    return "'" + text.replace("'", "''") + "'"


@cache
def _templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcjob.render", "templates"),
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["ps_quote"] = ps_quote
    return environment


def clusrun_text(plan: JobPlan) -> str:
    """The `clusrun` command that mounts the share on the job's nodes, for cmd.exe on the head node."""
    if plan.mount is None:
        raise SpecError("no share given: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    # The whole Linux command travels as one double-quoted cmd.exe argument.
    for bad in '"%^':
        if bad in plan.mount.command:
            raise SpecError(f"the mount command holds {bad!r}, which cmd.exe would change")
    return _templates().get_template("clusrun.cmd.j2").render(mount=plan.mount)


def powershell_text(plan: JobPlan) -> str:
    """A script for the head node: the mount step with clusrun, then the job from its XML."""
    xml = job_xml(plan)
    if "\n'@" in xml:  # it would end the here-string that carries the job file
        raise SpecError(
            "the job file holds a line starting with '@, which the PowerShell script cannot carry"
        )
    return _templates().get_template("submit.ps1.j2").render(plan=plan, xml=xml)


def plan_json(plan: JobPlan) -> str:
    data = dataclasses.asdict(plan)
    data["env"] = dict(plan.env)
    data["world_size"] = plan.world_size
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
