"""Following a job with a --hang-timeout: its ranks' beats read from the run's folder while the backend
waits, and a hung job ended by the usual cancel path, its flight recorders dumped first, the hang its
root cause (hpcjob.job.hangs says how a hang is told and whom it blames)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from hpcjob.job.hangs import HANG_EXIT_CODE, Hang, HangWatch, beat_interval
from hpcjob.job.results import RootCause, State

if TYPE_CHECKING:
    from hpcjob.backends import Backend, Progress, Watch
    from hpcjob.job.plan import JobPlan
    from hpcjob.job.results import JobInfo, JobSummary
    from hpcjob.store.runs import RunRecord
    from hpcjob.store.share import ShareFolder

# How many beats the ranks get to dump their flight recorders before the job is canceled.
DUMP_BEATS = 2


class HangFound(Exception):
    """Raised out of a backend's wait when the job has hung."""

    def __init__(self, hang: Hang) -> None:
        super().__init__(hang.reason)
        self.hang = hang


def hang_watch(plan: JobPlan, folder: ShareFolder, log_folder: str) -> Watch | None:
    """What a wait looks at for the job's hang bound, reading its beats once a beat (None: no bound): rank
    0's, and every rank's where rank 0 beat without its collectives moving on, or stopped beating."""
    from hpcjob.backends import Watch
    from hpcjob.store.logs import read_beats

    if plan.hang_timeout_s is None:
        return None
    every_s = beat_interval(plan.hang_timeout_s)
    hangs = HangWatch(plan.hang_timeout_s, plan.world_size)
    last = -every_s
    every_rank_read = False  # the first look reads them all: the picture rank 0's beat then adds to

    def look() -> None:
        nonlocal last, every_rank_read
        now = time.monotonic()
        if now - last < every_s:
            return
        last = now
        try:
            if every_rank_read:
                if hangs.moved(read_beats(folder, log_folder, ranks=(0,)), now):
                    return  # rank 0 moved on: not hung, the other ranks' beats need not be read this time
                if 0 < hangs.silent_s(0, now) < 2 * every_s:
                    return  # rank 0 has not beaten since the last look (a look between two beats): wait
            beats = read_beats(folder, log_folder)
            every_rank_read = True
        except Exception:  # smbprotocol raises many kinds; the wait goes on whatever
            return  # the share did not answer this time: the beats are read again next time
        hang = hangs.look(beats, now)
        if hang is not None:
            raise HangFound(hang)

    return Watch(look, every_s)


def end_hung_job(
    backend: Backend, record: RunRecord, plan: JobPlan, hang: Hang, folder: ShareFolder, progress: Progress
) -> tuple[JobInfo, Hang]:
    """Have the ranks that still beat say where they are and dump their flight recorders into the log
    folder (they look for the request once a beat: they get DUMP_BEATS beats), cancel the job as `hpcjob
    cancel` does, and follow it to its end: its status, and the hang with where the blamed rank was."""
    from hpcjob.store.logs import read_stacks, request_dumps

    assert plan.hang_timeout_s is not None
    progress(f"hpcjob: {describe(hang)}; ending the job")
    every_s = beat_interval(plan.hang_timeout_s)
    try:
        request_dumps(folder, record.log_folder)
        deadline = time.monotonic() + DUMP_BEATS * every_s
        stacks: dict[int, str | None] = dict.fromkeys(hang.beating)
        while time.monotonic() < deadline and None in stacks.values():
            time.sleep(min(1.0, every_s))
            for rank in [r for r, text in stacks.items() if text is None]:
                stacks[rank] = read_stacks(folder, record.log_folder, rank)
        said = stacks.get(hang.rank) if hang.rank is not None else None
        if said:
            hang = hang.with_place(said)
    except Exception:  # the dumps are a help (the share may fail in many ways): the job ends anyway
        pass
    finally:
        backend.cancel(record, force=False)
    return backend.wait(record, progress), hang


def describe(hang: Hang) -> str:
    where = f"rank {hang.rank} on {hang.node}" if hang.rank is not None and hang.node else "the job"
    return f"{where} {hang.reason}"


def hung_summary(summary: JobSummary, hang: Hang) -> JobSummary:
    """The summary of a job hpcjob canceled as hung: failed, with the hang as its root cause. A job that
    ended by itself meanwhile keeps its own end."""
    if summary.state is not State.CANCELED:
        return summary
    cause = RootCause(
        node=hang.node or "",
        exit_code=HANG_EXIT_CODE,
        time=time.time(),
        rank=hang.rank,
        reason=hang.reason,
    )
    return replace(summary, state=State.FAILED, exit_code=HANG_EXIT_CODE, root_cause=cause)
