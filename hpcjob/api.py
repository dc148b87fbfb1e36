"""hpcjob from Python: submit a run, follow it, read its logs, cancel it, look runs up, render a job, with
the same runner, the same checks and the same one-line errors as the command line.

    import hpcjob

    run = hpcjob.submit("train.py", args=["--epochs", "2"], nodes=2, gpus_per_node=4, cluster="prod")
    summary = run.wait(progress=print)      # the fields of `hpcjob run --local --json`
    for node, stream, line in run.logs():   # stream: "stdout" or "stderr"
        ...
    hpcjob.Run.find("train-20261125-101500-ab12").status()
    run.pull("results/")                    # its checkpoints, outputs and logs, only what changed
    hpcjob.list_runs(last=5)
    hpcjob.render_job("train.py", node_names=["NODE1", "NODE2"])["xml"]

`cluster=None` runs the job on this machine (its nodes are local processes), in a process of its own:
`status`, `wait`, `logs` and `cancel` work from anywhere, as for a cluster's job.
Every error is an `hpcjob.HpcjobError` (bad input: its subclass `hpcjob.SpecError`) whose message is the
line the command line prints; warnings are `hpcjob.HpcjobWarning`. Nothing here prints or exits.
"""

from __future__ import annotations

import atexit
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob import runner
from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner import HpcjobWarning, StoppedWaiting

if TYPE_CHECKING:
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobInfo, JobSummary
    from hpcjob.runner import PullReport
    from hpcjob.store.runs import HistoryEntry, RunRecord

atexit.register(runner.close_backends)  # a WinRM shell counts against the user's quota on the head node


def _quiet(line: str) -> None:
    """Progress nobody asked to see."""


@dataclass
class Run:
    """One run: submitted from here (`submit`), or found again by its run id or job id (`Run.find`)."""

    record: RunRecord
    plan: JobPlan | None = None
    summary: JobSummary | None = None  # once `wait` has seen it end
    _started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def job_id(self) -> str | None:
        """The scheduler's job id (a local run's: its run id)."""
        return self.record.job_id

    @classmethod
    def find(cls, run_or_job_id: str, cluster: str | None = None) -> Run:
        """A run this machine started (by run id or job id), or a job of the cluster by its job id."""
        record = runner.run_of(run_or_job_id, cluster)
        return cls(record, runner.recorded_plan(record.run_id))

    def status(self) -> JobInfo:
        """The job's state and its tasks' as the scheduler (or this machine) sees them now (with the
        GPUs' use where the logs are on this machine), as `hpcjob status` says it."""
        return runner.run_status(self.record)[0]

    def wait(
        self, progress: Callable[[str], None] | None = None, *, max_cost: float | None = None
    ) -> JobSummary:
        """Follow the run to its end (each change of state to `progress`) and sum it up: the nodes' exit
        codes, the rank that failed first and why, the training's metrics. As `hpcjob wait`: a run of a
        cluster goes on in more attempts as its retries say (`max_cost`, US dollars: no other attempt
        once its attempts cost more), and this follower holds the run's lock while it follows (another
        one following it already: an HpcjobError that says which). Only the machine that started a run
        holds its history, and so can follow it."""
        if not self.record.job_folder:  # a bare job id of the cluster: no run of this machine's
            raise SpecError(runner.not_in_history(self.run_id))
        command = f"hpcjob.Run.find({self.run_id!r}).wait()"
        self.record, self.summary = runner.take_up(
            self.run_id, progress or _quiet, command=command, max_cost_usd=max_cost
        )
        self.plan = runner.recorded_plan(self.run_id)
        return self.summary

    def logs(
        self, follow: bool = False, poll_s: float = 1.0, node: str | None = None
    ) -> Iterator[tuple[str, str, str]]:
        """Each line the nodes wrote (`node`: that node's alone), as (node, "stdout" or "stderr", line):
        what is there now, or with `follow`, new lines as they come until the job has ended. Where the
        share cannot be reached, the scheduler's copy of each task's output (its first 1500 bytes; an
        `HpcjobWarning` says why)."""
        output = runner.RunOutput(self.record, only_node=node)
        try:
            if output.warning:
                warnings.warn(output.warning, HpcjobWarning, stacklevel=2)
            yield from output.lines(follow=follow, poll_s=poll_s)
        finally:
            output.close()

    def cancel(self, force: bool = False) -> str | None:
        """Cancel the job: None, or the state it had already ended in (or "Canceling")."""
        return runner.cancel_run(self.record, force=force)

    def pull(self, to: str | Path | None = None, progress: Callable[[str], None] | None = None) -> PullReport:
        """Copy the run's checkpoints, output folder and logs from the share into `to` [default:
        ./RUN_ID], as `to/checkpoints`, `to/outputs` and `to/logs`, only what changed since the last
        pull there (`hpcjob pull`): what was copied, what was there already, what was skipped and why
        (a link, a FIFO, a name that is no plain file name: whoever can write the share put it there).
        A line per folder to `progress`."""
        return runner.pull_run(self.run_id, to, progress=progress or _quiet)


def submit(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    cluster: str | None = None,
    backend: str | None = None,
    mount_step: bool = True,
    wait: bool = False,
    retries: int | None = None,
    retry_on: str = "outside",
    max_cost: float | None = None,
    progress: Callable[[str], None] | None = None,
    tags: Mapping[str, str] | None = None,
    **options: Any,
) -> Run:
    """Submit SCRIPT (its folder is the code) with ARGS: to `cluster` (a profile's name; its backend
    unless `backend` names another), or with cluster=None to this machine. `options`: the job's, by the
    names of hpcjob.job.options.JobOptions (the command line's, read the same way, each with its help
    there): nodes=2, gpus_per_node=4, node_names=["GPU1", "GPU2"], env={"K": "V"}, runtime_s=5400 (or
    "90m"), requirements="requirements.txt" (None: requirements.txt beside the script, if there is one;
    no_env=True: none), resume_from=RUN (an earlier run of this machine's whose latest checkpoint the new
    run starts from), secrets=["HF_TOKEN"] (names of this process's environment variables whose values
    reach the tasks in a file only you may read, never in the job or the history; the profile's come
    first), run_id, name, image, ... An unknown name is a SpecError that says the nearest. With `wait`,
    the returned run's `summary` is set. `retries` more attempts follow one that ended for a cause
    outside the program (`retry_on="any"`: any failure), as `--retries` [default: the cluster profile's
    retries, else 0], while the run is followed (`wait`, or later `Run.wait()`), none once they cost more
    than `max_cost` US dollars (a cluster's runs: a local one has no price)."""
    from hpcjob.job.options import JobOptions

    said = progress or _quiet
    job = JobOptions.read({"script": str(script), "script_args": tuple(args), **options})
    if max_cost is not None and cluster is None:
        raise SpecError("max_cost needs a cluster: a local run has no price")
    if retries is None and cluster is not None:
        from hpcjob.store.config import get_profile

        retries = get_profile(cluster).retries
    again = runner.Retries(retries or 0, retry_on, max_cost_usd=max_cost)
    command = f"hpcjob.submit({str(script)!r}, args={list(args)!r}, cluster={cluster!r})"
    if cluster is None:
        record, plan = runner.submit_local(job, progress=said, command=command, tags=tags, retries=again)
        run = Run(record, plan)
        if wait:
            run.wait(said)
        return run
    record, plan, summary = runner.submit_to_cluster(
        job, cluster, backend, mount_step=mount_step, progress=said, command=command, tags=tags,
        wait=wait, retries=again,
    )  # fmt: skip
    run = Run(record, plan)
    run.summary = summary
    return run


def list_runs(
    *,
    cluster: str | None = None,
    state: str | None = None,
    tags: Mapping[str, str] | None = None,
    last: int | None = None,
) -> list[HistoryEntry]:
    """The runs this machine started, newest first (`hpcjob runs`): of `cluster` (local runs: "local"
    is their backend, see `backend`), in `state`, with every one of `tags`, the `last` ones."""
    from hpcjob.store.runs import history

    return history(cluster=cluster, state=state, tags=tags, last=last)


def render_job(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    node_names: Sequence[str],
    **options: Any,
) -> dict[str, str]:
    """The job for SCRIPT on `node_names`, contacting nothing: {"xml": the job file, "powershell": the
    head node's submit script, "json": the plan, and with a `share` (a UNC), "clusrun": the mount step
    and submit commands}. Job options by the names of hpcjob.job.options.JobOptions, as `submit` takes
    them; `owner`, whose folder on the share holds the job folder, as the command line's render takes it
    [default: the default cluster profile's user, else this machine's]."""
    from hpcjob.job.options import JobOptions

    fields = {"script": str(script), "script_args": tuple(args), "node_names": tuple(node_names), **options}
    if "owner" not in fields:
        fields["owner"] = runner.render_owner()
    job = JobOptions.read(fields)
    return runner.render_job(runner.job_spec(job), job.run_id)


__all__ = [
    "HpcjobError",
    "HpcjobWarning",
    "Run",
    "SpecError",
    "StoppedWaiting",
    "list_runs",
    "render_job",
    "submit",
]
