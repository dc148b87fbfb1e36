"""Jobs that run: the agent's way of starting a task, state machines, failure, cancel, no leftovers."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from hpcjob.backends.local import free_port
from hpcjob.emulator import HeadNode

from .conftest import GRACE, Client, job_xml, task_xml


def pinned_job(tmp_path: Path, first: str, second: str, *, nodes: str = "LOCALHOST,GPU02", **job: str) -> str:
    """hpcjob's job shape: Node unit, Min=Max=N, exclusive, fail on task failure, one pinned task per node."""
    attributes = dict(
        Name="ddp",
        UnitType="Node",
        MinNodes="2",
        MaxNodes="2",
        AutoCalculateMin="false",
        AutoCalculateMax="false",
        RequestedNodes=nodes,
        IsExclusive="true",
        FailOnTaskFailure="true",
    )
    attributes.update(job)
    pinned = dict(MinNodes="1", MaxNodes="1", WorkDirectory=str(tmp_path))
    tasks = [
        task_xml(command, Name=f"t-{node}", RequiredNodes=node, StdOutFilePath=f"logs/{node}.out",
                 StdErrFilePath=f"logs/{node}.err", **pinned)
        for command, node in zip((first, second), nodes.split(","), strict=True)
    ]  # fmt: skip
    return job_xml(*tasks, **attributes)


def pids_of(path: Path, timeout: float = 10.0) -> list[int]:
    """Wait for a task to write its pids (one per line) and return them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().split()
            if len(lines) >= 2:
                return [int(p) for p in lines]
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_two_pinned_tasks_run_like_the_agent_runs_them(
    client: Client, head: HeadNode, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    command = 'echo "$CCP_JOBID $CCP_TASKID $CCP_NODES|$CCP_NODES_CORES|$CCP_NUMCPUS|$PWD|$NCCL_DEBUG"'
    xml = pinned_job(tmp_path, command, command).replace(
        "<Tasks>",
        "<EnvironmentVariables><Variable><Name>NCCL_DEBUG</Name><Value>WARN</Value></Variable>"
        "</EnvironmentVariables>\n<Tasks>",
    )
    job_id = client.submit_xml(xml)
    assert client.wait(job_id) == "Finished"
    for task_id, node in ((1, "LOCALHOST"), (2, "GPU02")):
        text = (tmp_path / "logs" / f"{node}.out").read_text()
        assert text == f"{job_id} {task_id} 1 {node} 4|1 {node} 4|4|{tmp_path}|WARN\n"
        assert (tmp_path / "logs" / f"{node}.err").read_text() == ""
    job = client.props(f"/jobs/{job_id}")
    assert job["State"] == "Finished"
    assert job["AllocatedNodes"] == "LOCALHOST,GPU02"
    assert job["IsExclusive"] == "True" and job["FailOnTaskFailure"] == "True"
    assert job["UnitType"] == "Node" and job["MinNodes"] == job["MaxNodes"] == "2"
    assert job["StartTime"] and job["EndTime"] and job["SubmitTime"]
    tasks = client.rows(
        f"/jobs/{job_id}/tasks", properties="TaskId,State,ExitCode,AllocatedNodes,Output,Name"
    )
    assert [(t["TaskId"], t["State"], t["ExitCode"], t["AllocatedNodes"]) for t in tasks] == [
        (f"{job_id}.1", "Finished", "0", "LOCALHOST"),
        (f"{job_id}.2", "Finished", "0", "GPU02"),
    ]
    assert all(t["Output"] == "" for t in tasks)  # both streams went to files
    assert head.job_history(job_id) == [
        "Configuring",
        "Submitted",
        "Validating",
        "Queued",
        "Running",
        "Finished",
    ]


def test_output_keeps_the_first_1500_bytes_of_each_stream(client: Client) -> None:
    job_id = client.submit_xml(
        job_xml(
            task_xml("head -c 4000 /dev/zero | tr '\\0' a; echo; echo oops >&2"),
            task_xml("echo to-file; echo err-only >&2", StdOutFilePath="/dev/null"),
        )
    )
    assert client.wait(job_id) == "Finished"
    first = client.props(f"/jobs/{job_id}/tasks/1", properties="Output")["Output"]
    assert first == "a" * 1500 + "oops\n"
    second = client.props(f"/jobs/{job_id}/tasks/2", properties="Output")["Output"]
    assert second == "err-only\n"


def test_a_missing_work_directory_fails_the_task_at_once(client: Client, tmp_path: Path) -> None:
    started = time.monotonic()
    job_id = client.submit_xml(pinned_job(tmp_path / "not-mounted", "echo never", "sleep 600"))
    assert client.wait(job_id) == "Failed"
    assert time.monotonic() - started < GRACE + 5
    # Both tasks fail at once: whichever the scheduler saw first failed the job, the other may be canceled.
    tasks = [
        client.props(f"/jobs/{job_id}/tasks/{n}", properties="State,ExitCode,ErrorMessage,Output")
        for n in (1, 2)
    ]
    failed = [task for task in tasks if task["State"] == "Failed"]
    assert failed and all(task["State"] in ("Canceled", "Failed") for task in tasks)
    assert failed[0]["ExitCode"] == "1"  # bash: cd: ...: No such file or directory
    assert "No such file or directory" in failed[0]["Output"]
    assert "exit code 1" in failed[0]["ErrorMessage"]


def test_failing_task_with_fail_on_task_failure_stops_the_others(
    client: Client, head: HeadNode, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    # The long task starts a child in a session of its own: it must be found and stopped too.
    long_task = "setsid sleep 600 & echo $! > pids; echo $$ >> pids; sleep 600"
    fail_later = 'until [ "$(wc -l < pids)" -ge 2 ]; do sleep 0.05; done; exit 3'
    job_id = client.submit_xml(pinned_job(tmp_path, long_task, fail_later))
    pids = pids_of(tmp_path / "pids")
    started = time.monotonic()
    assert client.wait(job_id) == "Failed"
    assert time.monotonic() - started < GRACE + 4
    failed = client.props(f"/jobs/{job_id}/tasks/2", properties="State,ExitCode,ErrorMessage")
    assert failed == {"State": "Failed", "ExitCode": "3", "ErrorMessage": failed["ErrorMessage"]}
    assert "exit code 3" in failed["ErrorMessage"]
    stopped = client.props(f"/jobs/{job_id}/tasks/1", properties="State,ExitCode")
    assert stopped == {"State": "Canceled", "ExitCode": "130"}  # SIGINT
    job = client.props(f"/jobs/{job_id}", properties="State,ErrorMessage")
    assert f"{job_id}.2" in job["ErrorMessage"]
    assert head.job_history(job_id)[-2:] == ["Canceling", "Failed"]
    assert not any(alive(pid) for pid in pids)
    assert not head.live_processes()


def test_a_task_that_ignores_sigint_is_killed_after_the_grace_period(client: Client, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    stubborn = "trap '' INT; (trap '' INT; sleep 600) & echo $! > pids; echo $$ >> pids; sleep 600"
    job_id = client.submit_xml(pinned_job(tmp_path, stubborn, "sleep 600"))
    pids = pids_of(tmp_path / "pids")
    assert client.wait(job_id, ("Running",)) == "Running"
    started = time.monotonic()
    assert client.post(f"/jobs/{job_id}/cancel", json="stop it").status_code == 204
    assert client.props(f"/jobs/{job_id}", properties="State")["State"] == "Canceling"
    assert client.wait(job_id) == "Canceled"
    took = time.monotonic() - started
    assert GRACE - 0.1 <= took < GRACE + 4
    tasks = client.rows(f"/jobs/{job_id}/tasks", properties="State,ExitCode")
    assert tasks == [{"State": "Canceled", "ExitCode": "137"}, {"State": "Canceled", "ExitCode": "130"}]
    assert not any(alive(pid) for pid in pids)


def test_cancel_a_running_job(client: Client, head: HeadNode, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    job_id = client.submit_xml(pinned_job(tmp_path, "sleep 600", "sleep 600"))
    assert client.wait(job_id, ("Running",)) == "Running"
    client.wait_task(job_id, 2, ("Running",))
    response = client.post(f"/jobs/{job_id}/cancel", params={"forced": "false"}, json="Canceled by test.")
    assert response.status_code == 204
    assert client.wait(job_id) == "Canceled"
    job = client.props(f"/jobs/{job_id}", properties="State,ErrorMessage,EndTime")
    assert job["ErrorMessage"] == "Canceled by test."
    assert [t["State"] for t in client.rows(f"/jobs/{job_id}/tasks")] == ["Canceled", "Canceled"]
    assert head.job_history(job_id)[-3:] == ["Running", "Canceling", "Canceled"]
    assert head.task_history(job_id, 1)[-2:] == ["Canceling", "Canceled"]


def test_forced_cancel_kills_at_once(make_head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    head = make_head(grace_period=30.0)
    client = Client(head)
    (tmp_path / "logs").mkdir()
    job_id = client.submit_xml(pinned_job(tmp_path, "trap '' INT; sleep 600", "sleep 600"))
    client.wait_task(job_id, 1, ("Running",))
    started = time.monotonic()
    assert client.post(f"/jobs/{job_id}/cancel", params={"forced": "true"}).status_code == 204
    assert client.wait(job_id) == "Canceled"
    assert time.monotonic() - started < 5
    assert client.props(f"/jobs/{job_id}/tasks/1", properties="ExitCode")["ExitCode"] == "137"
    assert client.props(f"/jobs/{job_id}", properties="ErrorMessage")["ErrorMessage"].startswith(
        "Canceled by"
    )


def test_cancel_an_ended_job_is_refused(client: Client) -> None:
    job_id = client.submit_xml(job_xml(task_xml("true")))
    assert client.wait(job_id) == "Finished"
    refused = client.post(f"/jobs/{job_id}/cancel")
    assert refused.status_code == 400
    assert refused.text == "Jobs in the Finished state cannot be canceled."
    canceled = client.post("/jobs", json=[]).json()
    assert client.post(f"/jobs/{canceled}/cancel").status_code == 204
    again = client.post(f"/jobs/{canceled}/cancel")
    assert (again.status_code, again.text) == (400, "Jobs in the Canceled state cannot be canceled.")


def test_cancel_a_running_task_fails_it(client: Client) -> None:
    job_id = client.submit_xml(job_xml(task_xml("sleep 600"), task_xml("sleep 600"), RunUntilCanceled="true"))
    client.wait_task(job_id, 1, ("Running",))
    assert client.post(f"/jobs/{job_id}/tasks/1/cancel", json="task stop").status_code == 204
    assert client.wait_task(job_id, 1, ("Failed",)) == "Failed"
    task = client.props(f"/jobs/{job_id}/tasks/1", properties="State,ErrorMessage")
    assert task == {"State": "Failed", "ErrorMessage": "task stop"}
    assert client.props(f"/jobs/{job_id}", properties="State")["State"] == "Running"  # RunUntilCanceled
    assert client.post(f"/jobs/{job_id}/tasks/1/cancel").status_code == 400
    assert client.post(f"/jobs/{job_id}/tasks/1/requeue").status_code == 204
    client.wait_task(job_id, 1, ("Running",))
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 204
    assert client.wait(job_id) == "Canceled"


def test_without_fail_on_task_failure_the_job_fails_at_the_end(client: Client) -> None:
    job_id = client.submit_xml(job_xml(task_xml("exit 2"), task_xml("sleep 0.5; echo done")))
    assert client.wait(job_id) == "Failed"
    tasks = client.rows(f"/jobs/{job_id}/tasks", properties="State,ExitCode,Output")
    assert tasks == [
        {"State": "Failed", "ExitCode": "2", "Output": ""},
        {"State": "Finished", "ExitCode": "0", "Output": "done\n"},
    ]


def test_validation_failures(client: Client) -> None:
    cases = {
        "does not exist": job_xml(task_xml("true"), RequestedNodes="LOCALHOST,NOSUCH"),
        "match its": job_xml(task_xml("true"), UnitType="Node", MinNodes="9", MaxNodes="9"),
        "UnitType": job_xml(task_xml("true"), UnitType="Socket"),
        "not among": job_xml(task_xml("true", RequiredNodes="CPU04"), RequestedNodes="LOCALHOST,GPU02"),
        "group": job_xml(task_xml("true"), NodeGroups="NoSuchGroup"),
        "no tasks": job_xml(),
    }
    for expected, xml in cases.items():
        job_id = client.submit_xml(xml)
        assert client.wait(job_id) == "Failed", expected
        assert expected in client.props(f"/jobs/{job_id}", properties="ErrorMessage")["ErrorMessage"]


def test_jobs_wait_for_free_online_healthy_nodes_in_order(
    client: Client, head: HeadNode, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    first = client.submit_xml(pinned_job(tmp_path, "sleep 600", "sleep 600"))
    assert client.wait(first, ("Running",)) == "Running"
    # Needs GPU02, held exclusively by the first job.
    second = client.submit_xml(job_xml(task_xml("echo second"), UnitType="Node", RequestedNodes="GPU02"))
    # Would fit on CPU04 but queues behind the second (first come, first served).
    third = client.submit_xml(job_xml(task_xml("echo third"), UnitType="Node", RequestedNodes="CPU04"))
    # GPU03 is Offline.
    time.sleep(0.5)
    assert client.props(f"/jobs/{second}", properties="State")["State"] == "Queued"
    assert client.props(f"/jobs/{third}", properties="State")["State"] == "Queued"
    assert client.post(f"/jobs/{first}/cancel").status_code == 204
    assert client.wait(second) == "Finished"
    assert client.wait(third) == "Finished"
    offline = client.submit_xml(job_xml(task_xml("echo late"), UnitType="Node", RequestedNodes="GPU03"))
    time.sleep(0.3)
    assert client.props(f"/jobs/{offline}", properties="State")["State"] == "Queued"
    head.set_node("GPU03", state="Online", health="Warning")
    time.sleep(0.3)
    assert client.props(f"/jobs/{offline}", properties="State")["State"] == "Queued"
    head.set_node("GPU03", health="OK")
    assert client.wait(offline) == "Finished"


def test_an_unreachable_node_fails_its_tasks(client: Client, head: HeadNode, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    job_id = client.submit_xml(pinned_job(tmp_path, "sleep 600", "sleep 600"))
    client.wait_task(job_id, 2, ("Running",))
    head.set_node("GPU02", health="Error")
    assert client.wait(job_id) == "Failed"
    task = client.props(f"/jobs/{job_id}/tasks/2", properties="State,ErrorMessage")
    assert task == {"State": "Failed", "ErrorMessage": "The node GPU02 became unreachable."}
    head.set_node("GPU02", health="OK")


def test_no_task_process_outlives_the_head_node(make_head, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    head = make_head(grace_period=30.0)
    client = Client(head)
    # A daemon: double fork and a session of its own, reparented away from the task at once.
    command = f"(setsid sleep 600 & echo $! > {tmp_path}/pids); echo $$ >> {tmp_path}/pids; sleep 600"
    job_id = client.submit_xml(job_xml(task_xml(command)))
    pids = pids_of(tmp_path / "pids")
    assert all(alive(pid) for pid in pids)
    assert client.props(f"/jobs/{job_id}", properties="State")["State"] == "Running"
    started = time.monotonic()
    head.close()
    assert time.monotonic() - started < 5
    assert not any(alive(pid) for pid in pids)


def test_the_emulator_password_never_reaches_a_task(make_head, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HPCJOB_EMULATOR_PASSWORD", "do-not-leak")
    head = make_head()
    client = Client(head)
    job_id = client.submit_xml(job_xml(task_xml("env")))
    assert client.wait(job_id) == "Finished"
    output = client.props(f"/jobs/{job_id}/tasks/1", properties="Output")["Output"]
    assert "CCP_JOBID=" in output
    assert "do-not-leak" not in output


def test_the_first_node_hosts_a_rendezvous_the_others_reach_by_name(client: Client, tmp_path: Path) -> None:
    """What torchrun's c10d rendezvous needs: a task on another node connects to <first node>:<port>."""
    port = free_port()
    (tmp_path / "logs").mkdir()
    first_node = 'import os, socket; name = os.environ["CCP_NODES"].split()[1]; '
    serve = (
        first_node
        + f"s = socket.create_server((name, {port})); c, _ = s.accept(); print(c.recv(64).decode())"
    )
    reach = (
        "import socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        c = socket.create_connection(('LOCALHOST', {port})); break\n"
        "    except OSError: time.sleep(0.05)\n"
        "c.sendall(b'hello from ' + __import__('os').environ['CCP_NODES'].split()[1].encode())"
    )
    job_id = client.submit_xml(
        pinned_job(
            tmp_path, f"{sys.executable} -c {shlex.quote(serve)}", f"{sys.executable} -c {shlex.quote(reach)}"
        )
    )
    assert client.wait(job_id) == "Finished", client.rows(f"/jobs/{job_id}/tasks", properties="ErrorMessage")
    assert (tmp_path / "logs" / "LOCALHOST.out").read_text() == "hello from GPU02\n"


def test_requeue_and_finish_a_job(client: Client, head: HeadNode) -> None:
    """BVT RequeueJobTest: cancel -> Canceled -> requeue -> Running -> finish -> Finished."""
    job_id = client.submit_xml(job_xml(task_xml("sleep 600"), RunUntilCanceled="true"))
    client.wait_task(job_id, 1, ("Running",))
    assert client.post(f"/jobs/{job_id}/requeue").status_code == 400
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 204
    assert client.wait(job_id) == "Canceled"
    assert client.post(f"/jobs/{job_id}/requeue").status_code == 204
    client.wait_task(job_id, 1, ("Running",))
    job = client.props(f"/jobs/{job_id}", properties="State,RequeueCount,ErrorMessage")
    assert job == {"State": "Running", "RequeueCount": "1", "ErrorMessage": ""}
    assert client.post(f"/jobs/{job_id}/finish", json="done").status_code == 204
    assert client.wait(job_id) == "Finished"
    assert head.job_history(job_id)[-4:] == ["Queued", "Running", "Finishing", "Finished"]
    assert client.props(f"/jobs/{job_id}/tasks/1", properties="State")["State"] == "Canceled"


def test_each_node_of_a_job_runs_on_cpus_of_its_own(client: Client, tmp_path: Path) -> None:
    """As separate machines: a rank that sizes its threads by the CPUs it sees takes none of the other
    node's (every node on every CPU, a 2-node job of training/run_ddp.py trained 10x slower than the
    same job with `run --local`)."""
    import os

    (tmp_path / "logs").mkdir()
    command = "grep Cpus_allowed_list /proc/self/status"
    job_id = client.submit_xml(pinned_job(tmp_path, command, command))
    assert client.wait(job_id) == "Finished"
    seen = [(tmp_path / "logs" / f"{node}.out").read_text().split()[-1] for node in ("LOCALHOST", "GPU02")]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        assert seen[0] != seen[1], seen  # a share each, none in common
        mine = [{int(c) for c in part.replace("-", ",").split(",")} for part in seen]
        assert not mine[0] & mine[1]
    else:
        assert seen == [str(cpus[0])] * 2  # one CPU: they take turns
