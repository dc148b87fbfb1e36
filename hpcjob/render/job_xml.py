"""JobPlan -> HPC Pack job XML, as `job submit /jobfile:` and `POST /jobs/jobFile` take it.

The scheduler silently ignores attribute names it does not know, so only names from its import map
are written (facts/hpcpack-jobs.md section 1; reference/job-xml-import-map.json), in the order the
scheduler's own exporter uses, with lower-case booleans. The job's Name is the run id: unique, so a
client can find its job again after a lost answer.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from hpcjob.plan import JobPlan
from hpcjob.spec import NOT_XML, SpecError

JOB_NAMESPACE = "http://schemas.microsoft.com/HPCS2008R2/scheduler/"
JOB_VERSION = "3.000"
# HPC Pack maps an administrator's job to root on Linux nodes only when the job asks for it
# (facts/hpcpack-jobs.md section 5, user mapping).
ROOT_ENV = (("CCP_MAP_ADMIN_USER", "0"),)
# Written as character references: a parser reads a raw CR in text as LF, so only &#13; gives it back;
# C1 controls (a terminal may act on them) and Unicode line breaks stay visible in the file.
_AS_REFERENCE = re.compile("[\r\x7f-\x9f\u2028\u2029]")


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _job(
    name: str,
    plan: JobPlan,
    exclusive: bool,
    env: Sequence[tuple[str, str]],
    runtime_s: int | None,
) -> tuple[ET.Element, ET.Element]:
    n = str(len(plan.nodes))
    job = ET.Element("Job")
    job.set("Version", JOB_VERSION)
    job.set("Name", name)
    if plan.job_template:
        job.set("JobTemplate", plan.job_template)
    job.set("IsExclusive", _bool(exclusive))
    job.set("UnitType", "Node")
    job.set("AutoCalculateMax", _bool(False))
    job.set("AutoCalculateMin", _bool(False))
    job.set("FailOnTaskFailure", _bool(True))
    if plan.priority:
        job.set("Priority", plan.priority)
    if runtime_s:
        job.set("RuntimeSeconds", str(runtime_s))  # seconds: no ambiguity of the [[DD:]HH:]MM form
    job.set("MinNodes", n)
    job.set("MaxNodes", n)
    job.set("RequestedNodes", ",".join(plan.nodes))
    if plan.node_group:
        job.set("NodeGroups", plan.node_group)
    job.set("xmlns", JOB_NAMESPACE)  # the exporter writes xmlns last; ElementTree keeps the order
    if env:
        variables = ET.SubElement(job, "EnvironmentVariables")
        for key, value in env:
            variable = ET.SubElement(variables, "Variable")
            ET.SubElement(variable, "Name").text = key
            ET.SubElement(variable, "Value").text = value
    return job, ET.SubElement(job, "Tasks")


def _task(tasks: ET.Element, name: str, command_line: str, node: str, **paths: str) -> None:
    task = ET.SubElement(tasks, "Task")
    task.set("Name", name)
    task.set("CommandLine", command_line)
    task.set("MinNodes", "1")
    task.set("MaxNodes", "1")
    task.set("RequiredNodes", node)
    task.set("IsRerunnable", _bool(False))
    for attribute, value in paths.items():
        task.set(attribute, value)


def _text(job: ET.Element) -> str:
    ET.indent(job, space="  ")
    body = ET.tostring(job, encoding="unicode")
    # The spec refuses these; this keeps a plan built any other way from giving a broken job file.
    bad = NOT_XML.search(body)
    if bad:
        raise SpecError(f"the job holds {bad.group()!r}, a character a job file cannot carry")
    # ElementTree writes such characters only where a value holds them, in text or an attribute, and
    # there a reference stands for the same character.
    body = _AS_REFERENCE.sub(lambda m: f"&#{ord(m.group())};", body)
    return f'<?xml version="1.0" encoding="utf-8"?>\n{body}\n'


def job_xml(plan: JobPlan) -> str:
    """The training job: exclusive nodes, one pinned torchrun task per node, logs on the share."""
    job, tasks = _job(plan.run_id, plan, True, plan.env, plan.runtime_s)
    for task in plan.tasks:
        _task(
            tasks,
            task.name,
            task.command_line,
            task.node,
            WorkDirectory=task.work_directory,
            StdOutFilePath=task.stdout_path,
            StdErrFilePath=task.stderr_path,
        )
    return _text(job)


def mount_job_xml(plan: JobPlan) -> str:
    """The mount step as a job, where only the REST API reaches the cluster (no clusrun): one pinned
    task per node that runs the mount command as root (the submitter must be an HPC administrator).
    Same template and priority as the job; not its run-time limit, which is for the training."""
    if plan.mount is None:
        raise SpecError("no share given: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    job, tasks = _job(f"{plan.run_id}-mount", plan, False, ROOT_ENV, None)
    for node in plan.nodes:
        _task(tasks, f"mount {node}", plan.mount.command, node)
    return _text(job)
