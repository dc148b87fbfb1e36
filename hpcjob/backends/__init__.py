"""The one interface to every place a job can run, and the registry of the backends that implement it.

The CLI talks to a `Backend` and to nothing behind it: it never asks which kind it holds. A backend is
one module under hpcjob/backends/ with a function `open_backend(profile, password)`; adding one is that
module and one line in BACKENDS. Modules are imported only when used, so `hpcjob --help` stays fast.

A run is named to a backend by its RunRecord (hpcjob.store.runs): the record of a run started here, or one
made for a bare job id of the cluster. Everything a backend returns is a shared type of hpcjob.job.results.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hpcjob.job.plan import JobPlan, MountStep
    from hpcjob.job.render import JobShape
    from hpcjob.job.results import JobInfo, MountResult, NodeInfo, Submission
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord

Progress = Callable[[str], None]
# How long a node state change may take before hpcjob gives up (seconds): Offline waits for the jobs
# that still run there to end (a drain), Online only for the head node to make the change.
OFFLINE_TIMEOUT_S = 600.0
ONLINE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Watch:
    """What to look at while a job runs (its ranks' beats): `look` is called at least every `every_s`
    seconds of a wait, and ends the wait by raising."""

    look: Callable[[], None]
    every_s: float


# name -> module; the module's open_backend(profile, password) returns the Backend.
BACKENDS = {
    "local": "hpcjob.backends.local",
    "rest": "hpcjob.backends.rest",
    "winrm": "hpcjob.backends.winrm",
}


class Backend(Protocol):
    """Where jobs run: this machine, or a cluster's head node (over its REST API or WinRM)."""

    kind: str

    def nodes(self, group: str | None) -> list[NodeInfo]:
        """The nodes (of `group`), with their state, health, cores and GPUs where known."""
        ...

    def busy_nodes(self) -> set[str]:
        """The nodes (upper case) that running jobs hold now."""
        ...

    def take_offline(
        self, nodes: Sequence[str], *, force: bool, progress: Progress, timeout_s: float = OFFLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        """Take `nodes` offline (a cluster administrator's right) and wait, at most `timeout_s`, until
        the head node shows them Offline; their states. A node that runs a job drains first (Draining
        until its jobs end) unless `force`: at once where the head node can (PowerShell's -Force);
        REST has no forced Offline, and there a Draining node counts as taken (it takes no new job)."""
        ...

    def bring_online(
        self, nodes: Sequence[str], *, progress: Progress, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        """Bring `nodes` online (a cluster administrator's right) and wait, at most `timeout_s`, until
        the head node shows them Online; their states."""
        ...

    def add_to_group(self, group: str, nodes: Sequence[str]) -> list[str]:
        """Put `nodes` in node group `group` (a cluster administrator's right), made first where the
        cluster has no such group; the group's members after it, as the head node lists them. Where one
        of `nodes` is not among them, whether the head node said so or not: GroupJoinError
        (hpcjob.backends.scheduler), one line naming each node that did not join."""
        ...

    def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
        """The job for `spec` on nodes this backend chooses (the spec's, else idle usable ones), as
        attempt `attempt` of run `run_id`. Refuses a job name that exists already (a lost answer is
        recovered by looking the job up by name)."""
        ...

    def submit(
        self, plan: JobPlan, *, mount: bool, progress: Progress, record: Callable[[Submission], None]
    ) -> str:
        """Start the job (after mounting the share on its nodes when `mount`); its job id. `record` hears
        of each step before the next starts, so that no job made is ever left unrecorded."""
        ...

    def status(self, run: RunRecord) -> JobInfo:
        """The job's state and each task's (node, state, exit code once ended)."""
        ...

    def wait(self, run: RunRecord, progress: Progress, watch: Watch | None = None) -> JobInfo:
        """Follow the job until it ends, reporting each change of state (and looking at `watch` while it
        runs); its final status."""
        ...

    def cancel(self, run: RunRecord, *, force: bool) -> str | None:
        """Cancel the job: None when this did it, else the state that made it needless (Canceling, or
        an ended state)."""
        ...

    def task_outputs(self, run: RunRecord) -> list[tuple[str, str]]:
        """(node, output) of each task as the scheduler keeps it: for logs when the share is out of reach."""
        ...

    def mount(self, name: str, step: MountStep, shape: JobShape, progress: Progress) -> list[MountResult]:
        """Have each node of `shape` mount the share (`step`) with a job named `name` of the user's own,
        through hpcjob's execution filter; what each node did."""
        ...

    def run_on_nodes(
        self, name: str, command: str, shape: JobShape, progress: Progress
    ) -> tuple[JobInfo, list[tuple[str, str]]]:
        """Run `command` on each node of `shape` in a job named `name` of the user's own (one task per
        node, not a gang) until it ends: the job, and each node's output as the scheduler keeps it."""
        ...

    def version(self) -> str | None:
        """The head node's HPC Pack version, where the backend can ask (None: it cannot)."""
        ...

    def install_filter(self, command: str, shape: JobShape, progress: Progress) -> tuple[bool, str]:
        """Run the filter's install `command` as root on the nodes of `shape` (an administrator's right):
        whether every node succeeded, and what they printed."""
        ...

    def close(self) -> None:
        """Let go of connections."""
        ...


def open_backend(kind: str, profile: ClusterProfile | None, password: str | None) -> Backend:
    """The backend `kind`, for `profile` (None for local) with its password."""
    from hpcjob.job.spec import SpecError

    if kind not in BACKENDS:
        raise SpecError(f"unknown backend {kind!r}: one of {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[kind])
    backend: Backend = module.open_backend(profile, password)
    return backend
