"""hpcjob over WinRM, end to end: the CLI, pywinrm, and the emulator's WS-Management front door, which
shares its cluster with the REST one. Jobs use a stand-in for the nodes' Python (seconds, no torch);
the contract suite (test_backend_contract.py) covers failing and canceled jobs on every backend."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcjob.backends import open_backend
from hpcjob.backends.scheduler import RetryPolicy
from hpcjob.emulator import HeadNode
from hpcjob.emulator.base import Actor
from hpcjob.emulator.nodes import NodeSpec
from hpcjob.job.render.winrm import SCRIPTS, bootstrap_command, script_input, winrm_script
from hpcjob.store.config import ClusterProfile

from .artefact_checks import parse_powershell
from .conftest import Result, empty_script, stand_in_python

PASSWORD = "Winrm-s3cret-Pw!"


@pytest.fixture
def head() -> Iterator[HeadNode]:
    with HeadNode(users={"alice": PASSWORD}, grace_period=2.0) as started:
        yield started


@pytest.fixture
def share(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.fixture
def hpcjob(
    head: HeadNode, share: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> Callable[..., Result]:
    """The CLI with the cluster `emu` reached over WinRM (NTLM), its share a folder here."""
    return cli_with_profile(PASSWORD, **winrm_profile(head, share, "HPC\\alice"), node_group="GPUNodes")


def winrm_profile(head: HeadNode, share: Path, user: str) -> dict[str, Any]:
    """A cluster profile for `user` on `head` over WinRM, its share the folder `share` here."""
    return {
        "url": head.url,
        "user": user,
        "ca_bundle": head.ca_file,
        "backend": "winrm",
        "winrm_url": head.wsman_url,
        "share": "//HEADNODE/CcpSpoolDir/app",
        "mount_point": str(share),
        "local_share": str(share),
    }


def job_args(tmp_path: Path, body: str = 'echo "hello from $CCP_NODES"') -> list[str]:
    python = stand_in_python(tmp_path, body)
    return ["--no-mount-step", "--python", str(python), str(empty_script(tmp_path))]


def test_submit_wait_status_logs_and_nodes_over_winrm(
    hpcjob: Callable[..., Result], head: HeadNode, tmp_path: Path
) -> None:
    listed = hpcjob("nodes")
    assert listed.code == 0, listed.err
    assert listed.out.splitlines()[0].split() == ["NODE", "STATE", "HEALTH", "USE", "CORES", "GPUS", "GROUPS"]
    assert [line.split()[0] for line in listed.out.splitlines()[1:]] == ["LOCALHOST", "NODE002", "NODE003"]

    done = hpcjob("submit", "--wait", "-n", "2", "--run-id", "w-1", *job_args(tmp_path))
    assert done.code == 0, done.err
    assert "job train Finished" in done.out and "LOCALHOST" in done.out and "NODE002" in done.out
    assert head.wsman.shells_created == 2  # nodes; then submit and its whole --wait: one shell

    job_id = next(line for line in done.out.splitlines() if line.startswith("submitted job ")).split()[2]
    shown = hpcjob("status", job_id)
    assert shown.code == 0 and shown.out.startswith(f"job {job_id} (w-1) Finished, exit code 0")
    logs = hpcjob("logs", "w-1")
    assert logs.code == 0, logs.err
    assert "[LOCALHOST] hello from 1 LOCALHOST" in logs.out and "[NODE002] hello from 1 NODE002" in logs.out


def test_a_job_that_fails_on_one_node_exits_with_its_code_and_names_it(
    hpcjob: Callable[..., Result], tmp_path: Path
) -> None:
    body = 'case "$CCP_NODES" in *NODE002*) echo "boom" >&2; exit 7;; esac; sleep 30'
    failed = hpcjob("submit", "--wait", "-n", "2", "--run-id", "w-2", *job_args(tmp_path, body))
    assert failed.code == 7, failed.err
    assert "first failure: the task on NODE002, exit code 7" in failed.out


def test_one_status_poll_is_one_remote_command(
    hpcjob: Callable[..., Result], head: HeadNode, tmp_path: Path
) -> None:
    nodes = [f"--node={n}" for n in ("LOCALHOST", "NODE002", "NODE003")]
    assert hpcjob("submit", "--wait", "--run-id", "w-3", *nodes, *job_args(tmp_path)).code == 0
    before, actions = head.wsman.commands_run, len(head.wsman.actions)
    assert hpcjob("status", "w-3").code == 0
    assert head.wsman.commands_run - before == 1
    # Six WS-Management messages, whatever the number of tasks (NTLM adds its handshake once).
    assert head.wsman.actions[actions:] == ["Create", "Command", "Send", "Receive", "Signal", "Delete"]


def test_a_wrong_password_is_one_line_and_exit_1(
    hpcjob: Callable[..., Result], head: HeadNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMU_PW", "not-the-password")
    refused = hpcjob("nodes")
    assert refused.code == 1
    assert refused.err == (
        f"hpcjob: error: the head node refused the credentials of HPC\\alice (WinRM at {head.wsman_url}): "
        "check the user name and password, and that the user may use WinRM\n"
    )


def profile_for(head: HeadNode, **changes: Any) -> ClusterProfile:
    values: dict[str, Any] = {
        "name": "emu",
        "url": head.url,
        "user": "alice",
        "ca_bundle": head.ca_file,
        "backend": "winrm",
        "winrm_url": head.wsman_url,
    }
    values.update(changes)
    return ClusterProfile(**{k: v for k, v in values.items() if v is not None})


def fingerprint(head: HeadNode) -> str:
    host, port = head.wsman_url.split("//")[1].split("/")[0].rsplit(":", 1)
    pem = ssl.get_server_certificate((host, int(port)))
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def test_certificates_unknown_pinned_and_mismatched_and_an_unreachable_head_node(head: HeadNode) -> None:
    untrusted = open_backend("winrm", profile_for(head, ca_bundle=None), PASSWORD)
    with pytest.raises(Exception, match=r"^the head node's certificate at https://.* failed verification \("):
        untrusted.nodes(None)
    pinned = open_backend(
        "winrm", profile_for(head, ca_bundle=None, cert_fingerprint=fingerprint(head)), PASSWORD
    )
    assert [n.name for n in pinned.nodes(None)][:1] == ["LOCALHOST"]
    pinned.close()
    wrong = open_backend("winrm", profile_for(head, ca_bundle=None, cert_fingerprint="ab" * 32), PASSWORD)
    with pytest.raises(Exception, match="its fingerprint is not the cluster profile's cert_fingerprint"):
        wrong.nodes(None)
    gone = open_backend("winrm", profile_for(head, winrm_url="https://127.0.0.1:9/wsman"), PASSWORD)
    gone.session.retry = RetryPolicy(first_wait_s=0.1, deadline_s=1.0)  # the same retries, in a second
    started = time.monotonic()
    with pytest.raises(Exception, match=r"^cannot reach the head node's WinRM at https://127.0.0.1:9/wsman"):
        gone.nodes(None)
    assert 0.5 < time.monotonic() - started < 10  # it retried up to its deadline, not once


def test_a_500_node_job_submits(tmp_path: Path) -> None:
    """The job XML of 500 nodes (about 300 KB) travels over stdin: no command line grows with it."""
    nodes = [NodeSpec(f"GPU{i:03d}", groups=("GPUNodes",)) for i in range(500)]
    # Slow steps: the job is canceled while still Submitted, before 500 tasks would start here.
    with HeadNode(nodes, users={"alice": PASSWORD}, step_delay=30.0) as head:
        backend = open_backend("winrm", profile_for(head), PASSWORD)
        from hpcjob.job.spec import JobSpec

        spec = JobSpec(script=str(empty_script(tmp_path)), nodes=500, node_group="GPUNodes")
        plan = backend.plan(spec, "big-1")
        job_id = backend.submit(plan, mount=False, progress=lambda line: None, record=lambda step: None)
        assert head.job_state(int(job_id)) in ("Submitted", "Validating", "Queued")
        with head.cluster.lock:
            assert len(head.cluster.job(int(job_id)).tasks) == 500
        longest = max(len(line) for line in head.wsman.command_lines)
        assert longest == len(" ".join([bootstrap_command()[0], *bootstrap_command()[1]])) < 2000
        from hpcjob.store.runs import RunRecord

        record = RunRecord("big-1", "big", "winrm", "big", plan.nodes, job_id=job_id, cluster="emu")
        assert backend.cancel(record, force=True) is None
        backend.close()


@pytest.mark.parametrize("backend", ["winrm", "rest"])
def test_the_password_appears_only_inside_the_credential(
    hpcjob: Callable[..., Result], head: HeadNode, tmp_path: Path, backend: str
) -> None:
    """Not in any argv on this machine (the tasks', the emulator's, hpcjob's), not in the command lines
    the head node ran, not in any script text, not in the emulator's logs, not in any output: over WinRM
    it travels only inside stdin's credential, over REST only in the Authorization header."""
    body = f"cat /proc/[0-9]*/cmdline > {tmp_path}/argv.txt 2>/dev/null; true"
    run = ["--backend", backend, "--run-id", f"secret-{backend}"]
    result = hpcjob("submit", "--wait", "-n", "2", *run, *job_args(tmp_path, body))
    assert result.code == 0, result.err
    assert PASSWORD.encode() not in (tmp_path / "argv.txt").read_bytes()
    assert all(PASSWORD not in line for line in head.wsman.command_lines)
    assert all(PASSWORD not in text for text in head.powershell.scripts_run)
    assert all(PASSWORD not in str(record) for record in [*head.wsman_requests, *head.requests])
    assert PASSWORD not in result.out + result.err
    logs = hpcjob("logs", f"secret-{backend}")
    assert PASSWORD not in logs.out + logs.err
    assert (head.wsman.commands_run > 0) == (backend == "winrm")  # the backend asked was the one used


# -- the scripts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_matches_its_golden_file_and_parses(
    name: str, golden: Callable[[str, str], None]
) -> None:
    text = winrm_script(name)
    golden(f"winrm/{name}.ps1", text)
    assert not parse_powershell(text)[1].has_error
    assert text.isascii()


def test_the_bootstrap_command_line_is_fixed_short_and_parses(golden: Callable[[str, str], None]) -> None:
    command, arguments = bootstrap_command()
    line = " ".join([command, *arguments])
    golden("winrm/bootstrap-command.txt", line + "\n")
    script = base64.b64decode(arguments[-1]).decode("utf-16-le")
    assert not parse_powershell(script)[1].has_error
    assert len(line) < 2000  # far below cmd.exe's 8191, and below the few KB -EncodedCommand takes


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=20),
        st.one_of(st.text(), st.lists(st.text(), max_size=5), st.integers(), st.booleans(), st.none()),
        max_size=6,
    ),
    st.sampled_from(SCRIPTS),
)
def test_no_value_can_change_a_script(data: dict[str, Any], name: str) -> None:
    """Whatever the values (quotes, here-string ends, CR, NUL, every control character), the stdin is
    ASCII JSON whose Script is the template's text, unchanged, and whose Data gives the values back."""
    stdin = script_input(name, data)
    assert stdin.isascii() and b"\r" not in stdin and b"\n" not in stdin
    request = json.loads(stdin)
    assert request == {"Script": winrm_script(name), "Data": data}


def test_the_emulator_refuses_what_powershell_would(head: HeadNode) -> None:
    """An unknown cmdlet or parameter, a syntax error, or a program that is not PowerShell."""
    from hpcjob.emulator.base import Actor

    alice = Actor("alice", admin=True)
    command, arguments = bootstrap_command()

    def run(script: str) -> tuple[bytes, bytes, int]:
        stdin = json.dumps({"Script": script, "Data": {}}).encode()
        return head.powershell(alice, command, list(arguments), stdin)

    assert run("Get-HpcJobs -Id 1")[1].startswith(b"The term 'Get-HpcJobs' is not recognized")
    assert b"parameter name 'Identity'" in run("Get-HpcJob -Identity 1")[1]
    assert run("Get-HpcJob -Id (")[1].startswith(b"ParserError")
    out, err, code = head.powershell(alice, "hostname", [], b"")
    assert (out, code) == (b"", 1) and err.startswith(b"'hostname' is not recognized")


def test_a_lost_connection_during_submit_finds_the_job_by_name(head: HeadNode, tmp_path: Path) -> None:
    """The connection drops after the head node ran the submit: the job is found, not made twice."""
    # Basic: one HTTP request a message, so that the fault finds the Receive (NTLM adds a handshake).
    backend = open_backend("winrm", profile_for(head, winrm_transport="basic"), PASSWORD)
    from hpcjob.job.spec import JobSpec

    spec = JobSpec(script=str(empty_script(tmp_path)), nodes=1, node_names=("LOCALHOST",))
    plan = backend.plan(spec, "lost-1")
    # Command, Send, then the Receive that carries the submit's answer: the command ran, the answer
    # never arrives.
    head.inject(method="POST", path=r"^/wsman$", drop="after", skip=2)
    seen: list[str] = []
    job_id = backend.submit(plan, mount=False, progress=seen.append, record=lambda step: None)
    with head.cluster.lock:
        named = [j for j in head.cluster.jobs.values() if j.props.get("Name") == "lost-1"]
    assert [str(j.props["Id"]) for j in named] == [job_id]
    assert any("the answer to the submit was lost" in line for line in seen)
    backend.close()


# -- behaviour both cluster backends share ------------------------------------------------------------


@pytest.fixture
def two_users() -> Iterator[HeadNode]:
    with HeadNode(users={"alice": PASSWORD, "bob": "Bob-pw-2"}, grace_period=30.0) as started:
        yield started


def job_file(name: str, *commands: str, pinned: str = "") -> str:
    from xml.sax.saxutils import quoteattr

    required = f' RequiredNodes="{pinned}"' if pinned else ""
    tasks = "".join(f"<Task CommandLine={quoteattr(c)}{required} />" for c in commands)
    return (
        f'<Job Version="3.000" Name="{name}" xmlns="http://schemas.microsoft.com/HPCS2008R2/scheduler/">'
        f"<Tasks>{tasks}</Tasks></Job>"
    )


@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_busy_nodes_are_those_any_users_running_jobs_hold(two_users: HeadNode, backend: str) -> None:
    from hpcjob.backends.rest import RestClient

    bob = RestClient(two_users.url, "bob", "Bob-pw-2", verify=two_users.ca_file)
    job = bob.create_job(job_file("bobs", "sleep 60", pinned="NODE003"), "bobs")
    bob.submit(job)
    two_users.wait_job(job, states=("Running",))
    seen = open_backend(backend, profile_for(two_users, backend=backend), PASSWORD)
    try:
        assert seen.busy_nodes() == {"NODE003"}
    finally:
        seen.close()
        bob.cancel(job, "test", forced=True)


@pytest.mark.parametrize("backend", ["rest", "winrm"])
def test_the_schedulers_copy_of_output_and_a_forced_cancel_of_a_canceling_job(
    two_users: HeadNode, backend: str
) -> None:
    from hpcjob.backends.rest import RestClient
    from hpcjob.store.runs import RunRecord

    alice = RestClient(two_users.url, "alice", PASSWORD, verify=two_users.ca_file)
    said = alice.create_job(job_file("said", "echo 'héllo from the node'", pinned="NODE002"), "said")
    alice.submit(said)
    assert two_users.wait_job(said) == "Finished"
    stubborn = alice.create_job(job_file("stubborn", "trap '' INT; sleep 60"), "stubborn")
    alice.submit(stubborn)
    two_users.wait_job(stubborn, states=("Running",))
    seen = open_backend(backend, profile_for(two_users, backend=backend), PASSWORD)
    try:
        run = RunRecord("said", "said", backend, "x", ("NODE002",), job_id=str(said), cluster="emu")
        assert seen.task_outputs(run) == [("NODE002", "héllo from the node\n")]
        run = RunRecord("stubborn", "stubborn", backend, "x", (), job_id=str(stubborn), cluster="emu")
        assert seen.cancel(run, force=False) is None
        assert two_users.wait_job(stubborn, states=("Canceling",)) == "Canceling"  # it ignores SIGINT
        assert seen.cancel(run, force=False) == "Canceling"
        assert seen.cancel(run, force=True) is None
        assert two_users.wait_job(stubborn, timeout=10) == "Canceled"
    finally:
        seen.close()


def test_a_pinned_certificate_stays_pinned_after_close(head: HeadNode) -> None:
    backend = open_backend(
        "winrm", profile_for(head, ca_bundle=None, cert_fingerprint=fingerprint(head)), PASSWORD
    )
    assert backend.nodes(None)
    backend.close()
    session = backend.session.protocol.transport.session  # type: ignore[attr-defined]
    assert type(session.get_adapter(head.wsman_url)).__name__ == "Pinned"
    assert backend.nodes(None)  # used again: still through the pinned adapter
    backend.close()


HOSTILE_TEXT = st.one_of(
    st.sampled_from(
        ["'@\nWrite-Host PWNED\n@'", '"; Stop-Computer; "', "$(Remove-Item C:\\)", "`n`r", "\u2019@"]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE_TEXT)
def test_hostile_values_reach_the_scheduler_exactly_over_winrm(
    head: HeadNode, tmp_path: Path, value: str
) -> None:
    """A job whose environment holds hostile text: the head node creates exactly that job (the value
    travelled as data, through the same fixed scripts), and nothing else ran."""
    from hpcjob.job.spec import JobSpec

    backend = open_backend("winrm", profile_for(head), PASSWORD)
    before = list(head.powershell.scripts_run)
    spec = JobSpec(
        script=str(empty_script(tmp_path)), nodes=1, node_names=("LOCALHOST",), env=(("NOTE", "x"),)
    )
    run_id = f"h-{len(before)}"
    plan = backend.plan(spec, run_id)
    # Past the spec (which refuses a line break in a value): the transport carries any value exactly.
    plan = dataclasses.replace(plan, env=tuple((k, value if k == "NOTE" else v) for k, v in plan.env))
    job_id = backend.submit(plan, mount=False, progress=lambda line: None, record=lambda step: None)
    with head.cluster.lock:
        job = head.cluster.job(int(job_id))
        assert (job.props["Name"], job.env["NOTE"]) == (run_id, value)  # exactly, beside hpcjob's own
    assert set(head.powershell.scripts_run[len(before) :]) <= {winrm_script(n) for n in SCRIPTS}
    head.cluster.cancel_job(Actor("alice", admin=True), int(job_id), "test", True)
    backend.close()


def test_a_cmdlets_warning_never_corrupts_the_answer(hpcjob: Callable[..., Result], head: HeadNode) -> None:
    """Windows PowerShell 5.1 writes a cmdlet's warning to stdout ("WARNING: ..."), before the answer."""
    head.powershell.warnings["Get-HpcNode"] = "The node group GPUNodes is deprecated."
    head.powershell.warnings["Get-HpcJob"] = "Some jobs are not shown."
    listed = hpcjob("nodes", "--json")
    assert listed.code == 0, listed.err
    assert [n["name"] for n in json.loads(listed.out)] == ["LOCALHOST", "NODE002", "NODE003"]


def test_an_error_behind_clixml_progress_is_shown_as_its_message_only(
    hpcjob: Callable[..., Result], head: HeadNode
) -> None:
    """PowerShell writes progress records to a redirected stderr as a CLIXML block: never shown."""
    head.powershell.clixml_progress = True
    assert hpcjob("nodes").code == 0
    missing = hpcjob("status", "4242")
    assert missing.code != 0
    [line] = missing.err.splitlines()
    assert "CLIXML" not in line and "<Objs" not in line and "4242" in line, line


def test_clixml_error_records_are_their_messages_and_everything_else_is_dropped() -> None:
    from hpcjob.backends.winrm import error_text

    block = (
        '#< CLIXML\r\n<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
        '<Obj S="progress" RefId="0"><TN RefId="0"><T>System.Object</T></TN></Obj>'
        '<S S="Error">Get-HpcJob : The job 7 &lt;x&gt; was not found._x000D__x000A_</S>'
        '<S S="Error">At line:1 char:1_x000D__x000A_</S></Objs>'
    )
    assert " ".join(error_text(block + "plain words").split()) == (
        "Get-HpcJob : The job 7 <x> was not found. At line:1 char:1 plain words"
    )


def test_an_ordinary_user_is_told_to_name_nodes_and_can_submit_to_named_ones(
    tmp_path: Path, share: Path, cli_with_profile: Callable[..., Callable[..., Result]]
) -> None:
    """Get-HpcNode is a cluster administrator's cmdlet (its page's note): a user who is not one gets one
    line that says how to go on, and a job on named nodes never asks for the node list."""
    with HeadNode(users={"alice": "Admin-pw-1", "bob": PASSWORD}, admins=["alice"]) as head:
        hpcjob = cli_with_profile(PASSWORD, **winrm_profile(head, share, "HPC\\bob"))
        listed = hpcjob("nodes")
        assert listed.code == 1
        [line] = listed.err.splitlines()
        assert "Get-HpcNode is a cluster administrator's cmdlet; name the nodes with --node NAME" in line
        done = hpcjob("submit", "--wait", "--node", "NODE002", "--run-id", "b-1", *job_args(tmp_path))
        assert done.code == 0, done.err


def test_the_password_is_given_to_the_submission_and_never_cached_on_the_cluster(
    hpcjob: Callable[..., Result], head: HeadNode, tmp_path: Path
) -> None:
    done = hpcjob("submit", "-n", "1", "--run-id", "c-1", *job_args(tmp_path))
    assert done.code == 0, done.err
    assert head.powershell.cached_credentials == set()


def test_a_mount_job_whose_output_the_scheduler_did_not_keep_is_read_from_its_state(
    hpcjob: Callable[..., Result], head: HeadNode, share: Path
) -> None:
    head.powershell.keeps_output = False
    user_point = share / "alice"
    user_point.mkdir()
    shown = hpcjob("mount", "--json", "--node", "NODE002", "--mount-point", str(user_point))
    assert shown.code == 1  # no filter on the node: the task fails, and says nothing the scheduler kept
    [result] = json.loads(shown.out)
    assert (
        result["result"] == "failed" and "the scheduler kept none of the task's output" in result["message"]
    )
