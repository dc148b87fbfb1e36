"""What HPC Pack's Linux agent does with a task (facts/hpcpack-jobs.md section 5), on a test-bed host.

`cmd.sh` = "#!/bin/bash" + the task's CommandLine, run by /bin/bash in the WorkDirectory with stdout
and stderr to the task's files, with the job's environment variables and CCP_JOBID, CCP_TASKID and
CCP_NODES set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from hpcjob.job.render import JOB_NAMESPACE

from .bed import TestBed
from .hosts import Host

NAMESPACE = f"{{{JOB_NAMESPACE}}}"


def start_task(
    host: Host,
    task: ET.Element,
    task_id: int,
    job_id: str,
    folder: Path,
    job_env: dict[str, str],
    cpus: str | None = None,
) -> subprocess.Popen[str]:
    """Start one task of a job XML on `host`, with the job's environment variables; `folder` (new) holds
    its cmd.sh, as the agent's task folder. `cpus` (a benchmark's: `0` or `1-3`): the task runs on those
    CPUs of this machine alone, as on a host of its own size."""
    folder.mkdir(parents=True)
    (folder / "cmd.sh").write_text("#!/bin/bash\n\n" + (task.get("CommandLine") or ""), encoding="utf-8")
    (folder / "run.sh").write_text(
        f'cd "{task.get("WorkDirectory")}" || exit $?\n'
        f'/bin/bash {folder}/cmd.sh > "{task.get("StdOutFilePath")}" 2> "{task.get("StdErrFilePath")}"\n'
    )
    env = {
        **job_env,
        # This Python first: the command's `python3` is the one with torch.
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "CCP_JOBID": job_id,
        "CCP_TASKID": str(task_id),
        "CCP_NODES": f"1 {host.hpc_name} 2",
    }
    pinned = ["taskset", "-c", cpus] if cpus else []
    return host.run([*pinned, "/bin/bash", str(folder / "run.sh")], env=env)


def start_job(
    bed: TestBed, job: ET.Element, job_id: str, folder: Path, cpus: Mapping[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start every task of a job XML on the host its RequiredNodes names, each with the job's
    EnvironmentVariables, as the agent gives them to every task, and the task's own over them; `cpus`:
    each node's CPUs (start_task), by HPC Pack node name. The hosts share this machine's disk: each gets a
    local folder of its own (HPCJOB_LOCAL_DIR, where the job names none), as a node has its own disk, kept
    from one job to the next while the bed lasts."""
    env = variables_of(job)
    tasks = job.findall(f"{NAMESPACE}Tasks/{NAMESPACE}Task")
    return [
        start_task(
            bed[task.get("RequiredNodes") or ""],
            task,
            index,
            job_id,
            folder / f"task{index}",
            {
                "HPCJOB_LOCAL_DIR": str(bed.local_folder(task.get("RequiredNodes") or "")),
                **env,
                **variables_of(task),
            },
            (cpus or {}).get(task.get("RequiredNodes") or ""),
        )
        for index, task in enumerate(tasks, 1)
    ]


def variables_of(element: ET.Element) -> dict[str, str]:
    """A job's or a task's own EnvironmentVariables (not those of the tasks under a job)."""
    return {
        variable.findtext(f"{NAMESPACE}Name") or "": variable.findtext(f"{NAMESPACE}Value") or ""
        for variable in element.findall(f"{NAMESPACE}EnvironmentVariables/{NAMESPACE}Variable")
    }


def kill_node_processes(hpc_name: str, run_id: str) -> int:
    """SIGKILL every process of one node's task of a run, as a host that dies takes them all."""
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CCP_NODES=1 {hpc_name} 2".encode() in environ and any(run_id.encode() in e for e in environ):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed += 1
    return killed
