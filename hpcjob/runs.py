"""A record of the runs this client started, so that `hpcjob logs RUN_ID` knows where to look.

One JSON object a line in `$XDG_STATE_HOME/hpcjob/runs.jsonl` (default ~/.local/state). It holds
where the run's files are (a local path, or a share and how to reach it), never a credential.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
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
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "hpcjob" / "runs.jsonl"


def save_run(record: RunRecord) -> None:
    path = runs_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(record)) + "\n")


def find_run(run_id: str) -> RunRecord:
    """The latest record of `run_id` (or of the job id a backend gave it)."""
    path = runs_file()
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if run_id in (data.get("run_id"), data.get("job_id")):
            data["nodes"] = tuple(data.get("nodes", ()))
            return RunRecord(**data)
    raise SpecError(
        f"no run {run_id!r} recorded on this machine: give its --share or --mount-point and --job-folder"
    )
