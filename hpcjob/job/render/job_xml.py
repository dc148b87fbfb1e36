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
from dataclasses import dataclass

from hpcjob.job.plan import (
    LOCAL_DISK_RESULT_VAR,
    LOCAL_DISKS_SAID,
    MOUNT_RESULT_VAR,
    JobPlan,
    MountStep,
    mount_job_name,
)
from hpcjob.job.spec import NOT_XML, SpecError

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


@dataclass(frozen=True)
class JobShape:
    """What every job hpcjob makes shares with its run's training job: its nodes, group and options."""

    nodes: tuple[str, ...]
    node_group: str | None = None
    job_template: str | None = None
    priority: str | None = None

    @classmethod
    def of(cls, plan: JobPlan) -> JobShape:
        """The plan's: with data nodes, every node of both roles and no node group, for a group's default
        Intersect would leave the other role's nodes out and the job would never start (the job's
        RequestedNodes alone are its candidates: docs/facts/ and the team's two-roles fact sheet §A.2)."""
        group = None if plan.data_node_names else plan.node_group
        return cls(plan.all_nodes, group, plan.job_template, plan.priority)


def _job(
    name: str,
    shape: JobShape,
    *,
    exclusive: bool,
    fail_on_task_failure: bool,
    env: Sequence[tuple[str, str]],
    runtime_s: int | None,
) -> tuple[ET.Element, ET.Element]:
    """The job element. The training job has its nodes to itself and, as a gang, ends when one task
    fails; an elastic one goes on (its other nodes re-form without the lost one), and so do the per-node
    jobs (mount, install), so that every node reports."""
    n = str(len(shape.nodes))
    job = ET.Element("Job")
    job.set("Version", JOB_VERSION)
    job.set("Name", name)
    if shape.job_template:
        job.set("JobTemplate", shape.job_template)
    job.set("IsExclusive", _bool(exclusive))
    job.set("UnitType", "Node")
    job.set("AutoCalculateMax", _bool(False))
    job.set("AutoCalculateMin", _bool(False))
    job.set("FailOnTaskFailure", _bool(fail_on_task_failure))
    if shape.priority:
        job.set("Priority", shape.priority)
    if runtime_s:
        job.set("RuntimeSeconds", str(runtime_s))  # seconds: no ambiguity of the [[DD:]HH:]MM form
    job.set("MinNodes", n)
    job.set("MaxNodes", n)
    job.set("RequestedNodes", ",".join(shape.nodes))
    if shape.node_group:
        job.set("NodeGroups", shape.node_group)
    job.set("xmlns", JOB_NAMESPACE)  # the exporter writes xmlns last; ElementTree keeps the order
    _variables(job, env)
    return job, ET.SubElement(job, "Tasks")


def _variables(parent: ET.Element, env: Sequence[tuple[str, str]]) -> None:
    """A job's or a task's EnvironmentVariables (the same shape for both)."""
    if env:
        variables = ET.SubElement(parent, "EnvironmentVariables")
        for key, value in env:
            variable = ET.SubElement(variables, "Variable")
            ET.SubElement(variable, "Name").text = key
            ET.SubElement(variable, "Value").text = value


def _task(
    tasks: ET.Element,
    name: str,
    command_line: str,
    node: str,
    env: Sequence[tuple[str, str]] = (),
    **paths: str,
) -> None:
    task = ET.SubElement(tasks, "Task")
    task.set("Name", name)
    task.set("CommandLine", command_line)
    task.set("MinNodes", "1")
    task.set("MaxNodes", "1")
    task.set("RequiredNodes", node)
    task.set("IsRerunnable", _bool(False))
    for attribute, value in paths.items():
        task.set(attribute, value)
    _variables(task, env)


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
    """The training job: exclusive nodes, one pinned torchrun task per node, logs on the share. All
    MinNodes=MaxNodes nodes start it, elastic or not: an elastic job only outlives losing some."""
    job, tasks = _job(
        plan.job_name,
        JobShape.of(plan),
        exclusive=True,
        fail_on_task_failure=plan.min_nodes is None,
        env=plan.env,
        runtime_s=plan.runtime_s,
    )
    for task in plan.tasks:
        _task(
            tasks,
            task.name,
            task.command_line,
            task.node,
            task.env,
            WorkDirectory=task.work_directory,
            StdOutFilePath=task.stdout_path,
            StdErrFilePath=task.stderr_path,
        )
    return _text(job)


# Each task of a mount job: what hpcjob's execution filter did on its node, failing unless mounted; first
# what it did with the node's local disks, where the administrator's file names them.
MOUNT_CHECK = (
    f'l=${LOCAL_DISK_RESULT_VAR}; [ -z "$l" ] || echo "{LOCAL_DISKS_SAID}$l"; '
    f'r=${MOUNT_RESULT_VAR}; echo "${{r:-failed: the hpcjob execution filter is not installed on this node: '
    'an HPC administrator runs hpcjob mount --install once}"; case $r in mounted|"already mounted") ;; '
    "*) exit 1;; esac"
)


def mount_job_xml(plan: JobPlan) -> str:
    """The run's mount job (`<run id>-mount`), on the run's nodes, before its training job."""
    if plan.mount is None:
        raise SpecError("no share given: name it with --share //HEADNODE/CcpSpoolDir[/folder]")
    return mount_check_job_xml(mount_job_name(plan.job_name), plan.mount, JobShape.of(plan))


def mount_check_job_xml(name: str, step: MountStep, shape: JobShape) -> str:
    """A job of the user's own that has each node mount the share: one pinned task per node, whose start
    has hpcjob's execution filter mount it (as root, with the user's credentials, which the node agent
    gives the filter), and which says what the filter did: mounted, already mounted, or why not. Its
    output stays with the scheduler (no files: the share may not be there)."""
    return node_job_xml(name, MOUNT_CHECK, shape, step.env, "mount")


def admin_job_xml(name: str, command: str, shape: JobShape) -> str:
    """A job that runs `command` as root on each node (one pinned task per node): only an HPC
    administrator's job runs as root, and only when it asks for it (CCP_MAP_ADMIN_USER=0)."""
    return node_job_xml(name, command, shape, ROOT_ENV, "root")


def node_job_xml(
    name: str, command: str, shape: JobShape, env: Sequence[tuple[str, str]] = (), label: str = "probe"
) -> str:
    """A job that runs `command` on each node of `shape`, one pinned task per node ("<label> NODE"),
    each reporting on its own (not a gang); its output stays with the scheduler."""
    job, tasks = _job(name, shape, exclusive=False, fail_on_task_failure=False, env=env, runtime_s=None)
    for node in shape.nodes:
        _task(tasks, f"{label} {node}", command, node)
    return _text(job)
