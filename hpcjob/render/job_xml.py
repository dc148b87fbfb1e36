"""JobPlan -> HPC Pack job XML, as `job submit /jobfile:` and `POST /jobs/jobFile` take it.

The scheduler silently ignores attribute names it does not know, so only names from its import map
are written (facts/hpcpack-jobs.md section 1; reference/job-xml-import-map.json), in the order the
scheduler's own exporter uses, with lower-case booleans.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hpcjob.plan import JobPlan

JOB_NAMESPACE = "http://schemas.microsoft.com/HPCS2008R2/scheduler/"
JOB_VERSION = "3.000"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def job_xml(plan: JobPlan) -> str:
    n = str(len(plan.nodes))
    job = ET.Element("Job")
    job.set("Version", JOB_VERSION)
    job.set("Name", plan.name)
    job.set("IsExclusive", _bool(True))
    job.set("UnitType", "Node")
    job.set("AutoCalculateMax", _bool(False))
    job.set("AutoCalculateMin", _bool(False))
    job.set("FailOnTaskFailure", _bool(True))
    job.set("MinNodes", n)
    job.set("MaxNodes", n)
    job.set("RequestedNodes", ",".join(plan.nodes))
    if plan.node_group:
        job.set("NodeGroups", plan.node_group)
    # The exporter writes xmlns last; ElementTree keeps insertion order.
    job.set("xmlns", JOB_NAMESPACE)
    if plan.env:
        variables = ET.SubElement(job, "EnvironmentVariables")
        for name, value in plan.env:
            variable = ET.SubElement(variables, "Variable")
            ET.SubElement(variable, "Name").text = name
            ET.SubElement(variable, "Value").text = value
    tasks = ET.SubElement(job, "Tasks")
    for task in plan.tasks:
        element = ET.SubElement(tasks, "Task")
        element.set("Name", task.name)
        element.set("CommandLine", task.command_line)
        element.set("MinNodes", "1")
        element.set("MaxNodes", "1")
        element.set("RequiredNodes", task.node)
        element.set("IsRerunnable", _bool(False))
        element.set("WorkDirectory", task.work_directory)
        element.set("StdOutFilePath", task.stdout_path)
        element.set("StdErrFilePath", task.stderr_path)
    ET.indent(job, space="  ")
    body = ET.tostring(job, encoding="unicode")
    return f'<?xml version="1.0" encoding="utf-8"?>\n{body}\n'
