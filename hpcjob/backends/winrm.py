"""The head node over WinRM: PowerShell with the HPC Pack cmdlets, for sites that open WinRM but not the
REST API. Needs pywinrm (`pip install 'hpcjob[winrm]'`).

Every operation is ONE remote command in one shell that lives as long as the backend: the same short
command line each time (render.winrm.bootstrap_command), and the script with its data over the
command's stdin (WS-Man Send, in pieces under the listener's envelope limit), so no value is ever part
of a command line and no command-line limit applies: a 500-node job's XML goes the same way as a 2-node
job's. The job id, states and nodes come back as JSON, never scraped from a sentence. The user's
password reaches the head node only inside stdin, where the submit script makes it a PSCredential.
HTTPS on 5986 by default, the certificate verified against the CAs requests trusts (certifi), a CA
bundle, or a pinned SHA-256 fingerprint. Reads are retried when the connection fails; changes are not.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpcjob.backends import OFFLINE_TIMEOUT_S, ONLINE_TIMEOUT_S
from hpcjob.backends.scheduler import (
    GROUP_TEXT,
    OFFLINE,
    ONLINE,
    PollPolicy,
    RetryPolicy,
    certificate_failure,
    cluster_plan,
    follow_job,
    is_offline,
    is_online,
    mount_failure,
    mount_results,
    on_cluster,
    pin_certificate,
    put_in_group,
    recorded_job_id,
    scheduler_time,
    wait_for_nodes,
)
from hpcjob.extras import missing_extra
from hpcjob.job.plan import mount_job_name
from hpcjob.job.results import ENDED_JOB_STATES, JobInfo, NodeInfo, Submission, TaskInfo
from hpcjob.job.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Watch
    from hpcjob.job.plan import JobPlan, MountStep
    from hpcjob.job.render import JobShape
    from hpcjob.job.results import MountResult
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord

Progress = Callable[[str], None]
# The scripts that only read: run again when the connection fails.
READS = frozenset({"status", "outputs", "nodes", "busy", "find"})
# Bytes of stdin per WS-Man Send: 96 KiB, 128 KiB once in base64, under any listener's envelope limit.
STDIN_CHUNK = 96 * 1024


class WinRMError(HpcjobError):
    """The head node refused or failed a command; one line, in its own words."""


class WinRMUnsure(WinRMError):
    """The connection failed during a command: it may or may not have run."""


class WinRMSession:
    """One shell on the head node, opened at the first command and kept for every later one (so that
    `--wait` polls over one authenticated connection)."""

    def __init__(
        self,
        profile: ClusterProfile,
        password: str,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            from winrm.protocol import Protocol
        except ImportError:
            raise missing_extra("winrm", "the winrm backend") from None
        self.url = profile.wsman_url
        self.user = profile.user
        transport = profile.winrm_transport or "ntlm"
        import certifi

        # As the REST client: the profile's CA bundle, else the CAs requests trusts (not whatever
        # REQUESTS_CA_BUNDLE says, which pywinrm would otherwise take).
        options: dict[str, Any] = {"ca_trust_path": profile.ca_bundle or certifi.where()}
        self.protocol = Protocol(
            self.url,
            transport=transport,  # type: ignore[arg-type]  # one of WINRM_TRANSPORTS, checked by the profile
            username=profile.user,
            password=password,
            server_cert_validation="ignore" if profile.insecure or profile.cert_fingerprint else "validate",
            # TLS protects the messages; NTLM's own sealing is for plain HTTP only.
            message_encryption="auto" if transport != "basic" else "never",
            **options,
        )
        if profile.cert_fingerprint:
            _pin(self.protocol, profile.cert_fingerprint)
        self.shell_id: str | None = None
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.clock = clock

    def run(self, script: str, data: Mapping[str, Any]) -> list[Any]:
        """Run one of hpcjob's scripts with `data` on the head node; what it output (a JSON list).

        A script that only reads (`READS`) is run again, in a new shell, when the connection fails,
        with backoff within the retry deadline; one that changes the cluster is sent once."""
        deadline = self.clock() + self.retry.deadline_s
        waits = iter(self.retry.waits())
        while True:
            try:
                return self._run_once(script, data)
            except WinRMUnsure:
                wait = next(waits)
                if script not in READS or self.clock() + wait > deadline:
                    raise
                self.shell_id = None  # the shell may be gone with the connection: open another
                self.sleep(wait)

    def _run_once(self, script: str, data: Mapping[str, Any]) -> list[Any]:
        from hpcjob.job.render.winrm import bootstrap_command, script_input

        command, arguments = bootstrap_command()
        stdin = script_input(script, data)
        with _translated(self):
            if self.shell_id is None:
                self.shell_id = self.protocol.open_shell()
            command_id = self.protocol.run_command(self.shell_id, command, list(arguments))
            try:
                # In pieces: one WS-Man message may not exceed the listener's MaxEnvelopeSizekb (500 KB
                # by default, 150 KB on older systems), and base64 makes each piece a third larger.
                for start in range(0, max(len(stdin), 1), STDIN_CHUNK):
                    last = start + STDIN_CHUNK >= len(stdin)
                    piece = stdin[start : start + STDIN_CHUNK]
                    self.protocol.send_command_input(self.shell_id, command_id, piece, end=last)
                out, err, code = self.protocol.get_command_output(self.shell_id, command_id)
            finally:
                self.protocol.cleanup_command(self.shell_id, command_id)
        if code != 0:
            words = _one_line(error_text(err.decode("utf-8", "replace"))) or f"exit code {code}"
            raise WinRMError(f"the head node: {words}")
        # The answer is the last line: warnings or a cmdlet's Write-Host may come before it.
        answer = (out.decode("utf-8", "replace").strip().splitlines() or ["[]"])[-1]
        try:
            result = json.loads(answer)
        except json.JSONDecodeError:
            raise WinRMError(f"the head node's answer is not JSON: {answer[:200]!r}") from None
        return result if isinstance(result, list) else [result]

    def close(self) -> None:
        """Close the shell; the HTTP session stays as it was set up (a pinned certificate stays pinned)."""
        if self.shell_id is not None:
            shell, self.shell_id = self.shell_id, None
            try:
                with _translated(self):
                    self.protocol.close_shell(shell, close_session=False)
            except WinRMError:
                pass  # the head node closes an idle shell itself
        session = self.protocol.transport.session
        if session is not None:
            session.close()


@contextlib.contextmanager
def _translated(session: WinRMSession) -> Iterator[None]:
    """pywinrm's and requests' exceptions as one line that says which: credentials, certificate,
    unreachable, or the head node's fault message."""
    import requests
    from winrm.exceptions import InvalidCredentialsError, WinRMTransportError, WSManFaultError
    from winrm.exceptions import WinRMError as PyWinRMError

    url, user = session.url, session.user
    try:
        yield
    except InvalidCredentialsError:
        raise WinRMError(
            f"the head node refused the credentials of {user} (WinRM at {url}): check the user name and "
            "password, and that the user may use WinRM"
        ) from None
    except WSManFaultError as exc:
        raise WinRMError(f"the head node: {_one_line(exc.reason)}") from None
    except requests.exceptions.SSLError as exc:
        reason = certificate_failure(exc)
        raise WinRMError(
            f"the head node's certificate at {url} failed verification ({reason or 'TLS error'}): give the "
            "cluster's CA with --ca-bundle, or pin it with --cert-fingerprint"
        ) from None
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise WinRMUnsure(f"cannot reach the head node's WinRM at {url}: {type(exc).__name__}") from None
    except WinRMTransportError as exc:
        raise WinRMError(f"WinRM at {url}: HTTP {exc.code}: {_one_line(exc.response_text)[:300]}") from None
    except PyWinRMError as exc:  # such as a transport whose extra is not installed (kerberos, credssp)
        raise WinRMError(f"WinRM at {url}: {_one_line(str(exc))}") from None


def _pin(protocol: Any, fingerprint: str) -> None:
    """pywinrm's session with the certificate pinned (scheduler.pin_certificate)."""
    session = protocol.transport.build_session()
    pin_certificate(session, fingerprint)
    protocol.transport.session = session


def _node_of(task: Mapping[str, Any]) -> str:
    """A task's node: where it ran, else where it was pinned."""
    return str(task.get("AllocatedNodes") or task.get("RequiredNodes") or "").split(",")[0].strip()


_CLIXML = re.compile(r"#< CLIXML\s*(<Objs\b.*?</Objs>)", re.DOTALL)
_CLIXML_ERROR = re.compile(r'<S S="Error">(.*?)</S>', re.DOTALL)
_CLIXML_ESCAPE = re.compile(r"_x([0-9A-Fa-f]{4})_")


def error_text(stderr: str) -> str:
    """What Windows PowerShell said on stderr, as words: each CLIXML block (written when stderr is
    redirected) gives only its error records' text, decoded; its progress records, nothing."""

    def words(block: re.Match[str]) -> str:
        said = (
            html.unescape(_CLIXML_ESCAPE.sub(lambda m: chr(int(m[1], 16)), e))
            for e in _CLIXML_ERROR.findall(block[1])
        )
        return " ".join(said)

    return _CLIXML.sub(words, stderr)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class WinRMBackend:
    """The Backend over WinRM (hpcjob.backends.Backend)."""

    kind = "winrm"

    def __init__(
        self, session: WinRMSession, cluster: str, user: str, password: str, poll: PollPolicy | None = None
    ) -> None:
        self.session = session
        self.cluster = cluster
        self.poll = poll  # None: follow_job's default
        self._user = user
        self._password = password

    def nodes(self, group: str | None) -> list[NodeInfo]:
        rows = self.session.run("nodes", {"Group": group})
        if rows and isinstance(rows[0], dict) and rows[0].get("Refused"):
            why = _one_line(str(rows[0]["Refused"]))
            raise WinRMError(
                f"the head node would not list its nodes to {self._user} ({why}): Get-HpcNode is a cluster "
                "administrator's cmdlet; name the nodes with --node NAME (repeatable)"
            )
        return [
            NodeInfo(
                name=str(row.get("NetBiosName") or ""),
                state=str(row.get("NodeState") or ""),
                health=str(row.get("NodeHealth") or ""),
                groups=tuple(g.strip() for g in str(row.get("Groups") or "").split(",") if g.strip()),
                cores=row["ProcessorCores"] if isinstance(row.get("ProcessorCores"), int) else None,
            )
            for row in rows
        ]

    def busy_nodes(self) -> set[str]:
        return {
            node.strip().upper()
            for row in self.session.run("busy", {})
            for node in str(row.get("AllocatedNodes") or "").split(",")
            if node.strip()
        }

    def take_offline(
        self, nodes: Sequence[str], *, force: bool, progress: Progress, timeout_s: float = OFFLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        """Set-HpcNodeState -State Offline [-Force] -Async, then Get-HpcNode until Offline."""
        self.session.run("offline", {"Names": list(nodes), "Force": force})
        return wait_for_nodes(
            lambda: self.nodes(None),
            nodes,
            is_offline(False),
            wanted=OFFLINE,
            timeout_s=timeout_s,
            progress=progress,
            poll=self.poll,
        )

    def add_to_group(self, group: str, nodes: Sequence[str]) -> list[str]:
        """New-HpcGroup where the group is missing, then Add-HpcGroup; its members, as Get-HpcNode says.
        GroupJoinError where one of `nodes` is not among them, whether the cmdlet failed or not (its
        -NodeName is a filter: a node it does not know is no error)."""
        return put_in_group(
            group,
            nodes,
            lambda: self.session.run(
                "group", {"Group": group, "Names": list(nodes), "Description": GROUP_TEXT}
            ),
            lambda: [node.name for node in self.nodes(group)],
            unsure=(WinRMUnsure,),  # the script is sent once: a lost answer is what the members say
        )

    def bring_online(
        self, nodes: Sequence[str], *, progress: Progress, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        """Set-HpcNodeState -State Online -Async, then Get-HpcNode until Online."""
        self.session.run("online", {"Names": list(nodes)})
        return wait_for_nodes(
            lambda: self.nodes(None),
            nodes,
            is_online,
            wanted=ONLINE,
            timeout_s=timeout_s,
            progress=progress,
            poll=self.poll,
        )

    def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
        return cluster_plan(spec, run_id, self.nodes, self.busy_nodes, self._find, self.cluster, attempt)

    def submit(
        self, plan: JobPlan, *, mount: bool, progress: Progress, record: Callable[[Submission], None]
    ) -> str:
        from hpcjob.job.render import job_xml, mount_job_xml

        record(Submission("creating"))
        mount_id = None
        if mount and plan.mount is not None:
            mount_id = self._create_and_submit(mount_job_xml(plan), mount_job_name(plan.job_name), progress)
            record(Submission("mounting", mount_job_id=mount_id))
            progress(f"mounting the share at {plan.mount.mount_point} on the nodes (job {mount_id})")
            results = self._mount_results(int(mount_id), lambda line: None)
            if not all(r.ok for r in results):
                raise WinRMError(mount_failure(mount_id, results))
        job_id = self._create_and_submit(job_xml(plan), plan.job_name, progress)
        record(Submission("submitted", job_id=job_id, mount_job_id=mount_id))
        return job_id

    def _create_and_submit(self, xml: str, name: str, progress: Progress) -> str:
        """One command creates the job from its XML and submits it (canceling it when the submit fails).
        When the connection fails meanwhile, the job is looked up by its unique name."""
        data = {"User": self._user, "Password": self._password, "JobXml": xml}
        try:
            return str(self.session.run("submit", data)[0]["Id"])
        except WinRMUnsure as lost:
            found = self._find([name]).get(name)
            if found is None:
                raise WinRMError(f"{lost}; no job {name!r} was made{on_cluster(self.cluster)}") from None
            state = self._status(found).state
            if state == "Configuring":  # made, never submitted: nothing half-made is left behind
                self.session.run(
                    "cancel", {"JobId": found, "Force": True, "Message": "submission by hpcjob failed"}
                )
                raise WinRMError(
                    f"{lost}; job {found} was made but not submitted, and hpcjob canceled it"
                ) from None
            progress(
                f"the answer to the submit was lost, but the head node has job {found} ({name}, {state})"
            )
            return str(found)

    def _find(self, names: Collection[str]) -> dict[str, int]:
        return {str(row["Name"]): int(row["Id"]) for row in self.session.run("find", {"Names": names})}

    def job_id(self, run: RunRecord) -> int:
        return recorded_job_id(run, self._find, self.cluster)

    def _status(self, job_id: int) -> JobInfo:
        rows = self.session.run("status", {"JobId": job_id})
        if not rows:
            raise WinRMError(f"the head node said nothing of job {job_id}")
        job = rows[0]
        tasks = []
        for row in job.get("Tasks") or []:
            state = str(row.get("State") or "")
            code = row.get("ExitCode")
            node = _node_of(row)
            task_id = str(row.get("TaskId") or "0").split(".")[-1]
            tasks.append(
                TaskInfo(
                    task_id=int(task_id) if task_id.isdigit() else 0,
                    name=str(row.get("Name") or ""),
                    state=state,
                    # Before a task ends, its exit code means nothing.
                    exit_code=int(code) if isinstance(code, int) and state in ENDED_JOB_STATES else None,
                    node=node,
                    error=str(row.get("ErrorMessage") or ""),
                    start=scheduler_time(str(row.get("StartTime") or "")),
                    end=scheduler_time(str(row.get("EndTime") or "")),
                )
            )
        return JobInfo(
            job_id=str(job.get("Id", job_id)),
            name=str(job.get("Name") or ""),
            state=str(job.get("State") or ""),
            error=str(job.get("ErrorMessage") or ""),
            tasks=tuple(sorted(tasks, key=lambda t: t.task_id)),
        )

    def status(self, run: RunRecord) -> JobInfo:
        return self._status(self.job_id(run))

    def wait(self, run: RunRecord, progress: Progress, watch: Watch | None = None) -> JobInfo:
        job_id = self.job_id(run)
        return follow_job(lambda: self._status(job_id), progress, poll=self.poll, watch=watch)

    def cancel(self, run: RunRecord, *, force: bool) -> str | None:
        rows = self.session.run(
            "cancel", {"JobId": self.job_id(run), "Force": force, "Message": "Canceled by hpcjob"}
        )
        answer = rows[0] if rows else {}
        return None if answer.get("Canceled") else str(answer.get("State") or "")

    def task_outputs(self, run: RunRecord) -> list[tuple[str, str]]:
        return self._outputs(self.job_id(run))

    def _outputs(self, job_id: int) -> list[tuple[str, str]]:
        rows = self.session.run("outputs", {"JobId": job_id})
        return [(_node_of(row), str(row.get("Output") or "")) for row in rows]

    def _mount_results(self, job_id: int, progress: Progress) -> list[MountResult]:
        return mount_results(*self._finished(job_id, progress))

    def _finished(self, job_id: int, progress: Progress) -> tuple[JobInfo, list[tuple[str, str]]]:
        return follow_job(lambda: self._status(job_id), progress, poll=self.poll), self._outputs(job_id)

    def mount(self, name: str, step: MountStep, shape: JobShape, progress: Progress) -> list[MountResult]:
        from hpcjob.job.render import mount_check_job_xml

        job_id = self._create_and_submit(mount_check_job_xml(name, step, shape), name, progress)
        return self._mount_results(int(job_id), progress)

    def run_on_nodes(
        self, name: str, command: str, shape: JobShape, progress: Progress
    ) -> tuple[JobInfo, list[tuple[str, str]]]:
        from hpcjob.job.render import node_job_xml

        return self._finished(
            int(self._create_and_submit(node_job_xml(name, command, shape), name, progress)), progress
        )

    def version(self) -> str | None:
        return None  # UNVERIFIED how the HPC cmdlets report it (Get-HpcClusterProperty -Version?): not asked

    def install_filter(self, command: str, shape: JobShape, progress: Progress) -> tuple[bool, str]:
        """clusrun /user:system on the nodes, the command in base64 (no quoting can change it)."""
        encoded = base64.b64encode(command.encode("utf-8")).decode("ascii")
        progress(f"clusrun /user:system on {len(shape.nodes)} node(s)")
        answer = self.session.run("clusrun", {"Nodes": list(shape.nodes), "CommandBase64": encoded})
        row = answer[0] if answer else {}
        return row.get("ExitCode") == 0, str(row.get("Output") or "")

    def close(self) -> None:
        self.session.close()


def open_backend(profile: ClusterProfile | None, password: str | None) -> WinRMBackend:
    if profile is None or password is None:
        raise SpecError(
            "the winrm backend needs a cluster profile: hpcjob cluster add NAME --backend winrm ..."
        )
    return WinRMBackend(
        WinRMSession(profile, password),
        profile.name,
        profile.user,
        password,
        PollPolicy.at_most(profile.poll_interval),
    )
