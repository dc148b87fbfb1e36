"""A record of the runs this client started, so that `hpcjob logs RUN_ID` knows where to look.

One JSON object a line in `$XDG_STATE_HOME/hpcjob/runs.jsonl` (default ~/.local/state). It holds
where the run's files are (a local path, or a share and how to reach it), never a credential. A run
on a cluster is recorded before its first job is created, and again at each step (`state`, the job
ids): the latest record of a run id supersedes the earlier ones, so that no job hpcjob made is left
without a record that points to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.spec import SpecError

if TYPE_CHECKING:
    from hpcjob.plan import JobPlan


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    name: str
    backend: str
    job_folder: str
    nodes: tuple[str, ...]
    local_root: str | None = None
    share: str | None = None
    smb_server: str | None = None
    smb_port: int | None = None
    smb_user: str | None = None
    job_id: str | None = None
    cluster: str | None = None
    # On a cluster: creating, mounting, created, submitted or canceled (rest.Submission); else None.
    state: str | None = None
    mount_job_id: str | None = None
    # A local run: the hpcjob process that runs it, as (pid, start time in clock ticks), so that
    # `status` and `cancel` in another shell find it, and never a process that reused its pid.
    pid: int | None = None
    pid_start: int | None = None

    @classmethod
    def of(cls, plan: JobPlan, job_folder: str, backend: str, **where: Any) -> RunRecord:
        return cls(
            run_id=plan.run_id,
            name=plan.name,
            backend=backend,
            job_folder=job_folder,
            nodes=plan.nodes,
            **where,
        )

    @property
    def log_folder(self) -> str:
        """The run's log folder, relative to the share folder."""
        return f"{self.job_folder}/logs/{self.run_id}"


def runs_file() -> Path:
    from hpcjob.config import user_folder

    return user_folder("state") / "runs.jsonl"


def save_run(record: RunRecord) -> None:
    path = runs_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def _records_newest_first() -> Iterator[RunRecord]:
    path = runs_file()
    # A line torn or garbled by hand is skipped, not fatal: the others still find their runs.
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    known = {f.name for f in fields(RunRecord)}
    for line in reversed(lines):
        try:
            data = json.loads(line)
            data["nodes"] = tuple(data.get("nodes", ()))
            # Keys of a newer hpcjob are skipped, not fatal.
            yield RunRecord(**{k: v for k, v in data.items() if k in known})
        except (json.JSONDecodeError, TypeError, AttributeError):
            continue


def recorded_runs() -> list[RunRecord]:
    """Each run this machine started or rendered, newest first, as its latest record says."""
    seen: set[str] = set()
    latest = []
    for record in _records_newest_first():
        if record.run_id not in seen:
            seen.add(record.run_id)
            latest.append(record)
    return latest


def find_run(run_id: str, cluster: str | None = None) -> RunRecord:
    """The latest record of `run_id` (or of the job id a backend gave it, on `cluster` if named)."""
    for record in _records_newest_first():
        if run_id in (record.run_id, record.job_id) and cluster in (None, record.cluster):
            return record
    where = f" for cluster {cluster}" if cluster else ""
    raise SpecError(
        f"no run {run_id!r} recorded on this machine{where}: give its --share or --mount-point and "
        "--job-folder"
    )


# The state of a run id that `render` made up without staging anything: the job folder's current run,
# which later renders of the same job folder reuse, so that the job file and the mount step agree.
RENDERED = "rendered"


def current_manual_run(job_folder: str, share: str | None) -> RunRecord | None:
    """The newest run rendered or staged by hand (`render`) for this job folder of this share."""
    for record in _records_newest_first():
        if record.backend == "manual" and record.job_folder == job_folder and record.share == share:
            return record
    return None


def check_new_run_id(run_id: str) -> None:
    """Refuse a run id this machine has recorded: it names the job on the cluster, the rendezvous and
    the log folder, so a second run under it would mix with the first. Call it before anything is sent."""
    for record in _records_newest_first():
        if record.run_id == run_id and record.state != RENDERED:  # only rendered: nothing ran under it
            if record.job_id is not None:
                used = f"job {record.job_id} on cluster {record.cluster}"
            elif record.cluster is not None:
                used = f"a submission to cluster {record.cluster}"
            else:
                used = f"a {record.backend} run"
            raise SpecError(
                f"run id {run_id!r} is taken: {used} has it (see {runs_file()}); choose another "
                "--run-id, or leave it out for a new one"
            )
