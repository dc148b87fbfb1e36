"""`hpcjob submit/status/cancel` against the emulated head node, with faults on the wire: a submit or a
cancel that fails, answers lost, reused run ids. No share and no torch: the jobs' tasks fail at `cd`
at once, or are plain shell commands made here; the CLI runs in this process (its `main`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from hpcjob.backends.rest import RestClient, RestError, submit_job
from hpcjob.emulator import HeadNode
from hpcjob.job.options import JobOptions
from hpcjob.job.results import Submission
from hpcjob.store.runs import RunRecord, find_run, save_run

from .conftest import Result

PASSWORD = "emu-Pw-2"
SUBMIT = r"/jobs/\d+/submit$"
CANCEL = r"/jobs/\d+/cancel$"


@pytest.fixture
def head() -> Iterator[HeadNode]:
    # A long grace period: a task that ignores SIGINT keeps its job in Canceling.
    with HeadNode(users={"alice": PASSWORD}, grace_period=30.0) as started:
        yield started


@pytest.fixture
def client(head: HeadNode) -> RestClient:
    return RestClient(head.url, "alice", PASSWORD, verify=head.ca_file)


@pytest.fixture
def hpcjob(head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]]) -> Callable[..., Result]:
    """The CLI with a profile `emu` for the head node (default cluster, group GPUNodes)."""
    return cli_with_profile(
        PASSWORD,
        url=head.url,
        user="alice",
        ca_bundle=head.ca_file,
        node_group="GPUNodes",
    )


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "code" / "train.py"
    path.parent.mkdir()
    path.write_text("print('never runs: there is no share')\n")
    return str(path)


def submit(hpcjob: Callable[..., Result], script: str, run_id: str) -> Result:
    return hpcjob("submit", "--no-mount-step", "-n", "1", "--run-id", run_id, script)


def job_file(name: str, *commands: str) -> str:
    tasks = "".join(f"<Task CommandLine={quoteattr(c)} />" for c in commands)
    return (
        f'<Job Version="3.000" Name="{name}" xmlns="http://schemas.microsoft.com/HPCS2008R2/scheduler/">'
        f"<Tasks>{tasks}</Tasks></Job>"
    )


def the_job(client: RestClient, name: str) -> int:
    job_id = client.find_job(name)
    assert job_id is not None, f"no job {name}"
    return job_id


def test_a_failed_submit_and_a_failed_cancel_say_both_and_what_is_left(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    head.inject(method="POST", path=SUBMIT, status=400, body="The job cannot be submitted now.")
    head.inject(method="POST", path=CANCEL, status=500, body="Internal Server Error")
    result = submit(hpcjob, script, "exp-1")
    job = the_job(client, "exp-1")
    assert result.code == 1
    assert result.err.splitlines()[-1] == (
        f"hpcjob: error: submitting job {job} failed: POST /jobs/{job}/submit: HTTP 400: The job cannot be "
        f"submitted now.; canceling it failed too: POST /jobs/{job}/cancel: HTTP 500: Internal Server "
        f"Error; job {job} was left in Configuring on cluster emu: cancel it with "
        f"`hpcjob cancel {job} --cluster emu`"
    )
    assert head.job_state(job) == "Configuring"
    # The run was recorded with its job before the submit, and ends failed, saying why: the run id still
    # finds the job.
    record = find_run("exp-1")
    assert (record.state, record.job_id, record.cluster) == ("failed", str(job), "emu")
    assert record.failure == result.err.splitlines()[-1].removeprefix("hpcjob: error: ") + (
        " (while submitting the job)"
    )
    canceled = hpcjob("cancel", "exp-1")
    assert (canceled.code, canceled.out) == (0, f"job {job} canceled\n")
    assert head.job_state(job) == "Canceled"


def test_a_submit_whose_answer_was_lost_goes_on_when_the_scheduler_has_it(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    head.inject(method="POST", path=SUBMIT, drop="after")  # submitted, but no answer comes back
    result = submit(hpcjob, script, "exp-1")
    job = the_job(client, "exp-1")
    assert result.code == 0, result.err
    assert f"the submit request of job {job} got no answer, but the scheduler has the job (" in result.out
    assert f"submitted job {job} (run exp-1)" in result.out
    assert head.requests.count("POST", SUBMIT) == 1
    assert head.wait_job(job) == "Failed"  # no share: the task fails at `cd`; hpcjob canceled nothing
    assert "Canceled" not in head.job_history(job) and "Canceling" not in head.job_history(job)
    assert find_run("exp-1").state == "submitted"


def test_a_submit_that_never_arrived_is_sent_once_more(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    head.inject(method="POST", path=SUBMIT, drop="before")  # not processed, no answer
    result = submit(hpcjob, script, "exp-1")
    job = the_job(client, "exp-1")
    assert result.code == 0, result.err
    assert (
        f"the submit request of job {job} got no answer and the job is still Configuring: sending it "
        "once more" in result.out
    )
    assert head.requests.count("POST", SUBMIT) == 2
    assert head.wait_job(job) == "Failed"


def test_a_submit_lost_twice_is_canceled_and_says_why(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    head.inject(method="POST", path=SUBMIT, drop="before", times=2)
    result = submit(hpcjob, script, "exp-1")
    job = the_job(client, "exp-1")
    assert result.code == 1
    assert result.err == (
        f"hpcjob: error: the submit request of job {job} got no answer twice (last: POST /jobs/{job}/submit: "
        f"ConnectionError talking to {head.url}), and the job is still Configuring; hpcjob canceled job "
        f"{job} so that it does not run unseen\n"
    )
    assert head.job_state(job) == "Canceled"
    record = find_run("exp-1")
    assert (record.state, record.job_id) == ("failed", str(job))
    assert record.failure is not None and f"hpcjob canceled job {job} so that" in record.failure


@pytest.fixture
def mounting(
    head: HeadNode, cli_with_profile: Callable[..., Callable[..., Result]], tmp_path: Path
) -> Callable[..., Result]:
    """The CLI with a profile `emu` whose jobs have a mount step: its share a folder here (no SMB), and
    no execution filter on the emulated nodes, so that the mount job fails."""
    share = tmp_path / "share"
    share.mkdir()
    return cli_with_profile(
        PASSWORD,
        url=head.url,
        user="alice",
        ca_bundle=head.ca_file,
        node_group="GPUNodes",
        share="//HEAD/CcpSpoolDir",
        local_share=str(share),
        mount_point=str(tmp_path / "mnt"),
    )


def test_a_failed_mount_step_ends_the_run_failed_with_why(
    mounting: Callable[..., Result], script: str, client: RestClient
) -> None:
    result = mounting("submit", "-n", "1", "--run-id", "exp-1", script)
    assert result.code == 1
    said = result.err.splitlines()[-1].removeprefix("hpcjob: error: ")
    assert said.startswith("the mount job ") and "execution filter is not installed" in said
    record = find_run("exp-1")
    assert (record.state, record.job_id) == ("failed", None)  # never "mounting": nothing goes on
    assert record.mount_job_id == str(the_job(client, "exp-1-mount"))
    assert record.failure == f"{said} (while mounting the share)"
    listed = mounting("runs", "--state", "failed", "--json")
    assert [run["run_id"] for run in json.loads(listed.out)] == ["exp-1"]
    shown = mounting("runs", "show", "exp-1")
    assert "  state:    failed\n" in shown.out and f"  why:      {record.failure}\n" in shown.out


def test_ctrl_c_during_the_mount_step_ends_the_run_failed(
    mounting: Callable[..., Result], script: str, client: RestClient
) -> None:
    from hpcjob.runner.submit import submit_to_cluster

    def progress(line: str) -> None:
        if line.startswith("mounting the share"):  # the mount job is submitted: hpcjob waits for it
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        submit_to_cluster(
            JobOptions(script, nodes=1, run_id="exp-1"),
            "emu",
            None,
            mount_step=True,
            progress=progress,
            command="",
        )
    record = find_run("exp-1")
    assert (record.state, record.failure) == ("failed", "interrupted (Ctrl-C) while mounting the share")
    assert record.mount_job_id == str(the_job(client, "exp-1-mount")) and record.job_id is None


def test_a_network_down_while_creating_the_job_ends_the_run_failed(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    head.inject(method="POST", path=r"/jobs/jobFile$", drop="before", times=None)
    result = submit(hpcjob, script, "exp-1")
    assert result.code == 1 and len(result.err.splitlines()) == 1, result.err
    record = find_run("exp-1")
    assert (record.state, record.job_id) == ("failed", None)
    assert record.failure == result.err.removeprefix("hpcjob: error: ").rstrip() + " (while creating the job)"
    assert client.find_job("exp-1") is None


def test_a_reused_run_id_is_refused_before_anything_is_sent(
    hpcjob: Callable[..., Result], script: str, head: HeadNode, client: RestClient
) -> None:
    first = submit(hpcjob, script, "exp-1")
    assert first.code == 0, first.err
    # Nodes, busy nodes, the name check, create, submit: as many for 1 node as for 128.
    assert len(head.requests) == 5
    job = the_job(client, "exp-1")
    head.requests.clear()
    again = submit(hpcjob, script, "exp-1")
    assert (again.code, again.out) == (2, "")
    assert again.err == (
        f"hpcjob: error: run id 'exp-1' is taken: job {job} on cluster emu has it (see `hpcjob runs show "
        "exp-1`); choose another --run-id, or leave it out for a new one\n"
    )
    assert len(head.requests) == 0
    # Made elsewhere: this machine has no record of it, the cluster has.
    other = client.create_job(job_file("exp-2", "true"), "exp-2")
    head.requests.clear()
    taken = submit(hpcjob, script, "exp-2")
    assert taken.code == 2
    assert taken.err == (
        f"hpcjob: error: job {other} on cluster emu is already named 'exp-2': the run id names the run's "
        "jobs and must be new; choose another --run-id, or leave it out for a new one\n"
    )
    assert head.requests.count("POST", r"/jobs") == 0
    client.cancel(other, "test")


def test_a_run_recorded_before_its_job_was_made_is_found_by_name(
    hpcjob: Callable[..., Result], client: RestClient
) -> None:
    # hpcjob stopped between the create and its answer: the record has no job id, the cluster a job.
    save_run(RunRecord("exp-1", "train", "rest", "train", ("LOCALHOST",), cluster="emu", state="creating"))
    missing = hpcjob("status", "exp-1")
    assert missing.code == 2
    assert missing.err == (
        "hpcjob: error: run exp-1 has no job on cluster emu: its submission stopped before the job was made\n"
    )
    job = client.create_job(job_file("exp-1", "true"), "exp-1")
    shown = hpcjob("status", "exp-1")
    assert shown.code == 0 and shown.out.startswith(f"job {job} (exp-1) Configuring\n")
    assert (hpcjob("cancel", "exp-1").out, client.job(job).state) == ("run exp-1 canceled\n", "Canceled")


def test_status_shows_exit_codes_of_ended_tasks_only_and_a_canceling_job_cancels_fine(
    hpcjob: Callable[..., Result], head: HeadNode, client: RestClient
) -> None:
    job = client.create_job(job_file("held", "trap '' INT; sleep 60", "exit 3", "true"), "held")
    client.submit(job)
    deadline = time.monotonic() + 20
    while [t.state for t in client.job_with_tasks(job).tasks] != ["Running", "Failed", "Finished"]:
        assert time.monotonic() < deadline, client.job_with_tasks(job)
        time.sleep(0.1)
    shown = hpcjob("status", str(job))
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0] == f"job {job} (held) Running"
    assert lines[1].split() == ["TASK", "NODE", "STATE", "EXIT", "CODE", "ERROR"]
    assert [line.split()[:4:2] + line.split()[3:4] for line in lines[2:]] == [
        ["1", "Running", "-"],
        ["2", "Failed", "3"],
        ["3", "Finished", "0"],
    ]
    assert lines[1].index("EXIT CODE") == lines[2].index("-")  # a table: columns line up
    tasks = json.loads(hpcjob("status", str(job), "--json").out)["tasks"]
    assert [(t["state"], t["exit_code"]) for t in tasks] == [
        ("Running", None),
        ("Failed", 3),
        ("Finished", 0),
    ]

    assert client.cancel(job, "test") is None
    assert head.wait_job(job, states=("Canceling",)) == "Canceling"  # the task ignores SIGINT
    again = hpcjob("cancel", str(job))
    assert (again.code, again.out) == (0, f"job {job} was already being canceled (Canceling)\n")
    forced = hpcjob("cancel", "--force", str(job))
    assert (forced.code, forced.out) == (0, f"job {job} canceled\n")
    assert head.wait_job(job, timeout=10) == "Canceled"


def test_a_mount_job_left_behind_is_named_with_both_errors(head: HeadNode, client: RestClient) -> None:
    head.inject(method="POST", path=SUBMIT, status=400, body="No.")
    head.inject(method="POST", path=CANCEL, status=400, body="Not now.")
    mount = (job_file("exp-1-mount", "true"), "/app")
    with pytest.raises(RestError) as info:
        submit_job(client, "exp-1", job_file("exp-1", "true"), mount, lambda line: None)
    job = the_job(client, "exp-1-mount")
    assert str(info.value) == (
        f"submitting the mount job {job} failed: POST /jobs/{job}/submit: HTTP 400: No.; canceling it "
        f"failed too: POST /jobs/{job}/cancel: HTTP 400: Not now.; the mount job {job} was left in "
        f"Configuring: cancel it with `hpcjob cancel {job}`"
    )
    assert client.find_job("exp-1") is None  # the job itself was never made
    assert head.job_state(job) == "Configuring"


def test_each_step_is_recorded_before_the_next(head: HeadNode, client: RestClient) -> None:
    steps: list[Submission] = []

    def record(step: Submission) -> None:
        # Each record comes before the request it announces.
        steps.append(step)
        assert head.requests.count("POST", r"/jobs/jobFile$") == {"creating": 0, "mounting": 1}.get(
            step.state, 2
        )

    mount = (job_file("exp-1-mount", "true"), "/app")
    job = submit_job(client, "exp-1", job_file("exp-1", "true"), mount, lambda line: None, record=record)
    mount_job = the_job(client, "exp-1-mount")
    assert steps == [
        Submission("creating"),
        Submission("mounting", mount_job_id=str(mount_job)),
        Submission("created", job_id=str(job), mount_job_id=str(mount_job)),
        Submission("submitted", job_id=str(job), mount_job_id=str(mount_job)),
    ]
    assert head.wait_job(job) == "Finished"
