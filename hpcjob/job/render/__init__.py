"""JobPlan -> the artefacts people and schedulers read: job XML, cluster-run text, JSON. Pure: no I/O."""

from hpcjob.job.render.job_xml import (
    JOB_NAMESPACE,
    JobShape,
    admin_job_xml,
    job_xml,
    mount_check_job_xml,
    mount_job_xml,
    node_job_xml,
)
from hpcjob.job.render.text import clusrun_text, plan_json, powershell_text

__all__ = [
    "JOB_NAMESPACE",
    "JobShape",
    "admin_job_xml",
    "clusrun_text",
    "job_xml",
    "mount_check_job_xml",
    "mount_job_xml",
    "node_job_xml",
    "plan_json",
    "powershell_text",
]
