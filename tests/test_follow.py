"""Issue 33: a run's follower taken up again from the run history (`hpcjob wait`, Run.wait()), one at a
time under the run's lock; a profile's default --retries; --max-cost. Against a backend of this file's
(the attempts' ends are told, not run): tests/test_retries.py runs it end to end on the emulator."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import hpcjob
from hpcjob.job.plan import JobPlan, make_plan
from hpcjob.job.prices import Price
from hpcjob.job.render import plan_json
from hpcjob.job.results import JobInfo, JobSummary, NodeInfo, NodeResult, State, Submission
from hpcjob.job.spec import HpcjobError, JobSpec
from hpcjob.runner import Retries, follow_attempts, take_up
from hpcjob.store.followers import FollowedElsewhere, follower_lock, lock_file
from hpcjob.store.runs import RunRecord, find_entry, record_attempt_end, save_run

from .conftest import Result

RUN = "train-1"
SPEC = JobSpec(script="train.py", nodes=2)
PRICE = Price("Standard_NC24ads_A100_v4", "eastus", False, 10.0, "2026-11-27", "api")


@dataclass
class Cluster:
    """A backend whose nodes are GPU1 (always healthy) and the others, lost once they ran an attempt
    (the first attempt ran on GPU1, GPU2): each attempt's plan takes GPU1 and the first node never used."""

    submitted: list[JobPlan] = field(default_factory=list)
    canceled: list[str | None] = field(default_factory=list)
    used: set[str] = field(default_factory=lambda: {"GPU1", "GPU2"})
    kind: str = "rest"

    def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
        fresh = next(f"GPU{n}" for n in range(2, 100) if f"GPU{n}" not in self.used)
        return make_plan(spec, ("GPU1", fresh), run_id, attempt=attempt)

    def submit(
        self, plan: JobPlan, *, mount: bool, progress: Any, record: Callable[[Submission], None]
    ) -> str:
        self.submitted.append(plan)
        self.used.update(plan.nodes)
        job_id = str(10 + plan.attempt)
        record(Submission("submitted", job_id=job_id))
        return job_id

    def status(self, run: RunRecord) -> JobInfo:
        return JobInfo(str(run.job_id), run.run_id, "Failed", "")

    def nodes(self, group: str | None) -> list[NodeInfo]:
        return [NodeInfo(n, "Online" if n == "GPU1" else "Offline", "OK") for n in sorted(self.used)]

    def cancel(self, run: RunRecord, *, force: bool) -> str | None:
        self.canceled.append(run.job_id)
        return None


def summary_of(record: RunRecord, plan: JobPlan, state: State, price: Price | None) -> JobSummary:
    """An hour of each of the attempt's nodes: $20 at PRICE."""
    code = 0 if state is State.FINISHED else 1
    nodes = [NodeResult(n, state, code, task_start=0.0, task_end=3600.0) for n in plan.nodes]
    return JobSummary(
        plan.name, record.run_id, state, code, 1.0, plan.job_dir, plan.log_dir, nodes,
        job_id=record.job_id, price=price,
    )  # fmt: skip


def ending(states: Sequence[State], price: Price | None) -> Callable[..., JobSummary]:
    """follow_run, as each attempt ends: attempt N in states[N - 1]."""

    def follow(backend: Any, record: RunRecord, plan: JobPlan, *args: Any) -> JobSummary:
        return summary_of(record, plan, states[record.attempt - 1], price)

    return follow


def recorded(retries: Retries, **record: Any) -> tuple[RunRecord, JobPlan]:
    """Run RUN on cluster lab, as submit records it: its first attempt submitted as job 11 on GPU1, GPU2."""
    plan = make_plan(SPEC, ("GPU1", "GPU2"), RUN)
    first = RunRecord.of(plan, SPEC.job_folder, "rest", cluster="lab", job_id="11", state="submitted")
    first = replace(first, **record)
    follow = json.dumps({"mount_step": False, "retries": retries.to_dict()})
    save_run(
        first, command="hpcjob submit", plan=plan_json(plan), spec=json.dumps(SPEC.to_dict()), follow=follow
    )
    return first, plan


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The backend of every run here (follow_run is each test's own)."""
    backend = Cluster()
    monkeypatch.setattr("hpcjob.runner.access.backend_for_run", lambda record, *args: backend)
    return backend


def fast(retries: int, **more: Any) -> Retries:
    return Retries(retries, settle_s=0, poll_s=0, **more)


def test_attempts_stop_once_they_cost_more_than_max_cost(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$20 an attempt: after the first ($20) a second starts under --max-cost 25; after it ($40), none."""
    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", ending([State.FAILED] * 3, PRICE))
    retries = fast(5, max_cost_usd=25.0)
    first, plan = recorded(retries)
    said: list[str] = []
    latest, summary = follow_attempts(
        cluster, SPEC, first, plan, lambda: None, 0.0, said.append, retries, mount_step=False
    )  # fmt: skip
    assert [p.attempt for p in cluster.submitted] == [2] and latest.attempt == 2
    stop = "no other attempt: the run's attempts cost $40.00, more than --max-cost $25.00"
    assert summary.events == [
        "attempt 1 (job 11 on GPU1, GPU2): GPU2 was lost",
        "attempt 2 (job 12 on GPU1, GPU3): GPU3 was lost",
        stop,
    ]
    assert stop in said
    kept = find_entry(RUN).attempts
    assert [(a.attempt, a.retried, a.usage(None).cost_usd) for a in kept] == [
        (1, True, 20.0),
        (2, False, 20.0),
    ]


def test_a_run_without_prices_is_not_bounded_and_says_so_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", ending([State.FAILED] * 3, None))
    retries = fast(2, max_cost_usd=1.0)
    first, plan = recorded(retries)
    said: list[str] = []
    _, summary = follow_attempts(
        cluster, SPEC, first, plan, lambda: None, 0.0, said.append, retries, mount_step=False
    )  # fmt: skip
    assert len(cluster.submitted) == 2 and summary.events[-1] == "no attempt left: --retries 2"
    warned = [line for line in said if "--max-cost" in line]
    assert warned == [
        f"hpcjob: warning: --max-cost: run {RUN}'s cost is unknown (no attempt has a price: the cluster "
        "profile names no --vm-size and --region), so it cannot be bounded: its attempts go on"
    ]


def test_a_follower_taken_up_goes_on_from_the_history(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower of attempt 1 stopped (killed after GPU2 was lost): another takes the run up from the
    history alone, with its recorded retries, spec and mount step, and the next attempt's plan, spec and
    job replace the first's there."""
    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", ending([State.FAILED, State.FINISHED], PRICE))
    recorded(fast(1))
    said: list[str] = []
    latest, summary = take_up(RUN, said.append, command="hpcjob wait")
    assert (summary.state, latest.attempt, latest.job_id) == (State.FINISHED, 2, "12")
    assert summary.events == ["attempt 1 (job 11 on GPU1, GPU2): GPU2 was lost"]
    assert "attempt 1 of 2 ended: GPU2 was lost; attempt 2 next" in said
    entry = find_entry(RUN)
    assert (entry.record.attempt, entry.record.job_id) == (2, "12")
    assert entry.plan is not None and JobPlan.from_dict(entry.plan).nodes == ("GPU1", "GPU3")
    assert [(a.attempt, a.cause) for a in entry.attempts] == [(1, "node lost"), (2, "finished")]
    assert hpcjob.Run.find(RUN).plan == JobPlan.from_dict(entry.plan)  # the newest attempt's
    # Taken up once more: the run has ended, and says so again, starting nothing.
    again = take_up(RUN, said.append, command="hpcjob wait")[1]
    assert again.state is State.FINISHED and len(cluster.submitted) == 1


def cut_short(state: str | None, job_id: str | None, failure: str | None = None) -> None:
    """Run RUN's attempt 1 ended (GPU2 lost), and its attempt 2 recorded as its follower left it, while
    it was submitted: at `state` (None: planned, nothing sent)."""
    first, plan = recorded(fast(2))
    record_attempt_end(first, summary_of(first, plan, State.FAILED, None), "node lost", "GPU2 was lost", True)
    save_run(replace(first, attempt=2, nodes=("GPU1", "GPU3"), job_id=job_id, state=state, failure=failure))


def test_an_attempt_planned_and_not_sent_is_submitted_as_itself(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hpcjob.runner.attempts.follow_run", ending([State.FAILED, State.FINISHED], None))
    cut_short(None, None)
    said: list[str] = []
    latest, summary = take_up(RUN, said.append, command="hpcjob wait")
    assert f"attempt 2 of run {RUN} was not submitted yet: submitting it now" in said
    assert [p.attempt for p in cluster.submitted] == [2] and cluster.canceled == []
    assert (summary.state, latest.attempt, latest.job_id) == (State.FINISHED, 2, "12")


@pytest.mark.parametrize(
    ("state", "job_id", "said"),
    [
        ("created", "12", "its submission was cut short while created (its job, if made, canceled)"),
        ("failed", None, "its submission failed (boom (while creating the job)); its job, if made, canceled"),
    ],
)
def test_an_attempt_half_submitted_is_canceled_and_the_next_goes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, state: str, job_id: str | None, said: str
) -> None:
    """Its job created, not submitted (its follower stopped), or its submission failed (the network):
    that job canceled, the attempt counted as one that ran nothing."""
    monkeypatch.setattr(
        "hpcjob.runner.attempts.follow_run", ending([State.FAILED] * 2 + [State.FINISHED], None)
    )
    cut_short(state, job_id, failure="boom (while creating the job)" if state == "failed" else None)
    latest, summary = take_up(RUN, lambda line: None, command="hpcjob wait")
    assert cluster.canceled == [job_id] and [p.attempt for p in cluster.submitted] == [3]
    assert summary.state is State.FINISHED and latest.attempt == 3
    # Attempt 1, judged by the follower that stopped, is told too: the run's summary has every attempt.
    assert summary.events == ["attempt 1 (job 11 on GPU1, GPU2): GPU2 was lost", f"attempt 2: {said}"]
    kept = {a.attempt: (a.cause, a.retried, a.summary) for a in find_entry(RUN).attempts}
    assert kept[2] == ("submission cut short", True, None)


def test_a_second_follower_says_who_follows_and_starts_nothing(
    cli_with_profile: Callable[..., Callable[..., Result]], cluster: Cluster
) -> None:
    hpcjob_cli = cli_with_profile("pw", url="https://head", user="alice")
    recorded(fast(1))
    with follower_lock(RUN, "hpcjob submit --wait train.py"):
        done = hpcjob_cli("wait", RUN)
        who = re.escape(f"process {os.getpid()} on {socket.gethostname()}")
        with pytest.raises(FollowedElsewhere, match=who):
            hpcjob.Run.find(RUN).wait()
    assert done.code == 1 and done.out == "" and len(done.err.splitlines()) == 1
    assert done.err.startswith(
        f"hpcjob: error: run {RUN} is followed by another hpcjob (process {os.getpid()} "
    )
    assert (
        ": hpcjob submit --wait train.py); it starts the run's attempts, and this one starts none" in done.err
    )
    assert cluster.submitted == []


def test_a_killed_follower_leaves_no_lock_behind() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\nfrom hpcjob.store.followers import follower_lock\n"
            f"with follower_lock({RUN!r}, 'hpcjob wait'):\n"
            "    print('held', flush=True)\n    time.sleep(60)\n"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        held = rf"\(process {holder.pid} on .*: hpcjob wait\)"
        with pytest.raises(FollowedElsewhere, match=held), follower_lock(RUN, "hpcjob wait"):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        with follower_lock(RUN, "hpcjob wait"):  # the system let go of it
            assert json.loads(lock_file(RUN).read_text())["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait()


def test_a_run_of_another_machine_s_history_is_one_line(
    cli_with_profile: Callable[..., Callable[..., Result]],
) -> None:
    hpcjob_cli = cli_with_profile("pw", url="https://head", user="alice")
    done = hpcjob_cli("wait", "nope-1")
    assert (done.code, done.out) == (2, "") and done.err == (
        "hpcjob: error: no run 'nope-1' in this machine's history: only the machine that started a run "
        "holds its history (its attempts and retries), so follow it there; `hpcjob status JOB_ID` shows a "
        "job from anywhere\n"
    )
    with pytest.raises(HpcjobError, match="only the machine that started a run holds its history"):
        hpcjob.Run.find("42").wait()  # a job of the cluster, not of this machine's


def test_a_profile_gives_submit_its_default_retries(
    cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> None:
    from hpcjob.cli.options import retries_of
    from hpcjob.store.config import get_profile

    hpcjob_cli = cli_with_profile("pw", url="https://head", user="alice")
    added = hpcjob_cli("cluster", "add", "lab", "--url", "https://head", "--user", "alice", "--retries", "3")
    assert added.code == 0, added.err
    assert "retries = 3" in (tmp_path / "clusters.toml").read_text()
    options = {"retries": None, "retry_on": "outside", "node_wait": "10m", "max_cost": None}
    assert retries_of(options, get_profile("lab")).retries == 3
    assert retries_of({**options, "retries": 0}, get_profile("lab")).retries == 0  # given, it stands
    assert retries_of(options, get_profile("emu")).retries == 0  # a profile without one
    bad = hpcjob_cli("cluster", "add", "lab", "--url", "https://head", "--user", "alice", "--retries", "101")
    assert bad.code == 2 and "--retries" in bad.err
