"""JobPlan -> the cluster-run mount command and the plan as JSON."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import jinja2

from hpcjob.plan import JobPlan
from hpcjob.spec import SpecError


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("hpcjob.render", "templates"),
        autoescape=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def clusrun_text(plan: JobPlan) -> str:
    """The `clusrun` command that mounts the share on the job's nodes, for cmd.exe on the head node."""
    if plan.mount is None:
        raise SpecError("no share given: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    # The whole Linux command travels as one double-quoted cmd.exe argument.
    for bad in '"%^':
        if bad in plan.mount.command:
            raise SpecError(f"the mount command holds {bad!r}, which cmd.exe would change")
    return _templates().get_template("clusrun.cmd.j2").render(mount=plan.mount)


def plan_json(plan: JobPlan) -> str:
    data = dataclasses.asdict(plan)
    data["env"] = dict(plan.env)
    data["world_size"] = plan.world_size
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
