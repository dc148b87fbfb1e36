"""A submitted run followed: to its summary (hang watch included), and its nodes' output read back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcjob.job.spec import HpcjobError, SpecError
from hpcjob.runner.access import ClusterAccess, Progress, StoppedWaiting, backend_for_run, run_folder

if TYPE_CHECKING:
    from hpcjob.backends import Backend
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobInfo, JobSummary, RootCause
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder


def follow_run(
    backend: Backend,
    record: RunRecord,
    plan: JobPlan,
    open_folder: Callable[[], ShareFolder | None],
    started: float,
    progress: Progress,
) -> JobSummary:
    """Follow the run to its end and sum it up: the scheduler knows the tasks' states; the run's folder
    (`open_folder`: the share, the local folder, or None) which rank failed first, and the metrics. A job
    with a hang bound is watched through its folder, and ended when it hangs (hpcjob.runner.watch). An
    interrupted wait raises StoppedWaiting; the job goes on."""
    from hpcjob.backends.scheduler import job_summary
    from hpcjob.runner.cost import run_price
    from hpcjob.runner.watch import HangFound, end_hung_job, hang_watch, hung_summary
    from hpcjob.store.runs import record_end
    from hpcjob.store.secrets import remove_attempt_secrets
    from hpcjob.store.share import ShareError

    def opened(without: str) -> ShareFolder | None:
        try:
            return open_folder()
        except ShareError as exc:
            progress(f"hpcjob: warning: {exc}: {without}")
            return None

    # A watched job's folder is read all along; another's only once it has ended.
    folder = None
    if plan.hang_timeout_s is not None:
        folder = opened("the job is not watched for hangs (its ranks' beats are there)")
    watch = hang_watch(plan, folder, record.log_folder) if folder is not None else None
    hang = None
    try:
        try:
            info = backend.wait(record, progress, watch)
        except HangFound as found:
            assert folder is not None
            info, hang = end_hung_job(backend, record, plan, found.hang, folder, progress)
    except BaseException as exc:
        if folder is not None:
            folder.close()
        if not isinstance(exc, KeyboardInterrupt):
            raise
        job = record.job_id or record.run_id
        raise StoppedWaiting(f"stopped waiting; job {job} goes on (hpcjob cancel {job} ends it)") from None
    if folder is None:
        folder = opened("the summary has only what the scheduler knows")
    try:
        summary = job_summary(
            info,
            plan,
            info.wall_s(time.monotonic() - started),
            folder,
            record.log_folder,
            lambda: backend.task_outputs(record),
        )
        if hang is not None:
            summary = hung_summary(summary, hang)
        summary.price, summary.data_price = run_price(
            record.cluster, progress, for_data_nodes=bool(plan.data_node_names)
        )
        with contextlib.suppress(HpcjobError):  # the job's end matters more than its history
            record_end(summary)
        remove_attempt_secrets(folder, plan, progress)  # --secret: the attempt's file, once it has ended
        return summary
    finally:
        if folder is not None:
            folder.close()


class RunOutput:
    """What a run's nodes wrote, as (node, "stdout" or "stderr", line), read from the run's folder (the
    share, or this machine's folder for a local run); for a submitted job whose share cannot be reached,
    the scheduler's copy of each task's output instead (HPC Pack keeps only its first 1500 bytes on Linux
    nodes), with `warning` saying why. `only_node`: that node's alone. Close it when done."""

    def __init__(
        self,
        record: RunRecord,
        smb: tuple[str | None, str | None, int] = (None, None, 445),
        only_node: str | None = None,
    ) -> None:
        from hpcjob.store.logs import RunLogs

        self.record = record
        self.warning: str | None = None
        self.exit_code: int | None = None  # once `lines(follow=True)` has seen the run end
        self.scheduler_copy: list[tuple[str, str]] | None = None  # (node, its task's Output)
        self._folder: ShareFolder | None = None
        self._scheduler_end: Callable[[], int | None] | None = None
        if record.cluster is not None:  # the cluster knows whether the job has ended
            self._for_cluster(*smb)
        else:
            self._folder = run_folder(record, *smb)
            if record.backend in _local_backends():
                backend = backend_for_run(record)
                self._scheduler_end = lambda: _exit_code(backend.status(record))
        copy: list[tuple[str, str]] = self.scheduler_copy or []
        self.nodes = [node for node, _ in copy]
        self._logs: RunLogs | None = None
        if self._folder is not None:
            self._logs = RunLogs(self._folder, record.log_folder, record.nodes)
            self.nodes = self._logs.nodes
        if only_node is not None:
            self._only(only_node)

    def _for_cluster(self, smb_user: str | None, smb_server: str | None, smb_port: int) -> None:
        from hpcjob.job.spec import parse_share
        from hpcjob.store.share import LocalFolder, ShareError

        record = self.record
        cluster = ClusterAccess(record.cluster, record.backend)  # one password: head node and share
        backend = cluster.backend
        self._scheduler_end = lambda: _exit_code(backend.status(record))
        backend.status(record)  # a run whose job was never made has no logs: this says so, in one line
        if record.local_root:
            self._folder = LocalFolder(Path(record.local_root))
            return
        if not record.share:
            why = (
                f"run {record.run_id} was submitted without a share"
                if record.job_folder
                else f"job {record.job_id} was not submitted from this machine: its share and folder are "
                "unknown"
            )
            self.warning = (
                f"{why}, so hpcjob cannot read its log files; showing the scheduler's copy of each task's "
                "output, which holds only its first 1500 bytes (give the share with `hpcjob logs --share "
                f"UNC --job-folder PATH`, or add it to cluster {record.cluster})"
            )
        else:
            try:
                self._folder = cluster.share(
                    parse_share(record.share),
                    smb_user or record.smb_user,
                    smb_server or record.smb_server,
                    record.smb_port or smb_port,
                )
                return
            except ShareError as exc:
                self.warning = (
                    f"{exc}; showing the scheduler's copy of each task's output, which holds only its "
                    "first 1500 bytes"
                )
        self.scheduler_copy = backend.task_outputs(record)

    def _only(self, only_node: str) -> None:
        from hpcjob.store.logs import RunLogs

        match = [n for n in self.nodes if n.upper() == only_node.upper()]
        if not match:
            where = f"{self._folder.describe()}/{self.record.log_folder}" if self._folder else "its output"
            known = ", ".join(self.nodes) or f"none yet in {where}"
            self.close()
            raise SpecError(f"run {self.record.run_id} has no node {only_node!r}; its nodes: {known}")
        self.nodes = match
        if self._logs is not None and self._folder is not None:
            self._logs = RunLogs(self._folder, self.record.log_folder, match)
        if self.scheduler_copy is not None:
            self.scheduler_copy = [(n, text) for n, text in self.scheduler_copy if n in match]

    def lines(
        self, *, follow: bool = False, poll_s: float = 1.0, idle_timeout_s: float = 60.0
    ) -> Iterator[tuple[str, str, str]]:
        """Each node's lines in node order: what is there now, or with `follow`, new lines as they come
        until the run has ended (`exit_code` then says how), or until a task has failed and nothing came
        for `idle_timeout_s` (a killed task writes no end mark)."""
        if self._logs is None:  # the scheduler's copy: all there is, at once
            for node, text in self.scheduler_copy or ():
                for line in text.splitlines():
                    yield node, "stdout", line
            return  # its job's end is not followed: the copy is all there will be
        logs = self._logs
        quiet_since = time.monotonic()
        while True:
            logs.look()  # one listing of the log folder a poll: the reads below take what changed
            ended = self._ended() if follow else 0
            said = False
            for node, stream, line in logs.lines(final=ended is not None):
                said = True
                yield node, stream, line
            if ended is not None:
                self.exit_code = ended if follow else None
                return
            if said:
                quiet_since = time.monotonic()
            failed = [code for code in logs.exit_codes().values() if code != 0]
            if failed and time.monotonic() - quiet_since > idle_timeout_s:
                self.exit_code = failed[0]
                return
            time.sleep(poll_s)

    def _ended(self) -> int | None:
        assert self._logs is not None
        ended = self._logs.ended()
        if ended is None and self._scheduler_end is not None:
            ended = self._scheduler_end()
        return ended

    def latest_step(self) -> dict[str, Any] | None:
        """While the run goes on, its training's newest line of metrics over time (None once it ended,
        or before its first step)."""
        if self._logs is None:
            return None
        steps = [t for t in self._logs.timeline() if t.get("event") == "step"]
        try:
            running = self._ended() is None
        except HpcjobError:  # a local run whose process was killed: ended, without a summary
            running = False
        return steps[-1] if steps and running else None

    def first_failure(self) -> RootCause | None:
        """What failed first in the run, as its summary said it (this machine's history), else as its
        folder's exit records say; None where nothing failed, or neither can be read."""
        from hpcjob.store.logs import read_root_cause
        from hpcjob.store.runs import find_entry

        try:
            summary = find_entry(self.record.run_id).summary
        except HpcjobError:
            summary = None
        if summary is not None and summary.run_id == self.record.run_id:
            return summary.root_cause
        if self._folder is None:
            return None
        try:
            return read_root_cause(self._folder, self.record.log_folder)
        except (HpcjobError, OSError):
            return None

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()


def _local_backends() -> tuple[str, ...]:
    from hpcjob.backends import BACKENDS
    from hpcjob.job.spec import CLUSTER_BACKENDS

    return tuple(kind for kind in BACKENDS if kind not in CLUSTER_BACKENDS)


def _exit_code(info: JobInfo) -> int | None:
    return info.exit_code() if info.ended else None
