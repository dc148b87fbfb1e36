"""The HPC Pack REST API (`https://<head node>/hpc`, HPC Pack 2016 Update 3 and 2019).

Contract: shared/reference/hpcpack-rest-api/hpcpack.yaml; behaviour: facts/hpcpack-rest.md. Bodies are
JSON: property lists `[{"Name": .., "Value": ..}]` with string values. A job is created from the
generated job XML with `POST /jobs/jobFile`, then submitted; its state is polled. Reads are retried
on connection errors, timeouts and 5xx, with backoff, within a deadline. A create is never blindly
repeated: after a failure that may have reached the server, the job is looked up by its unique name
(so names must be new: check_new_job_names). Nor is a submit: after a lost answer, the job's state
says whether the scheduler has it.
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcjob.results import (
    ENDED_JOB_STATES,
    JobInfo,
    JobSummary,
    NodeInfo,
    NodeResult,
    RootCause,
    State,
    TaskInfo,
    find_metrics,
    job_exit_code,
)
from hpcjob.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.plan import JobPlan
    from hpcjob.share import ShareFolder

JOB_PROPERTIES = ("Id", "Name", "State", "ErrorMessage", "AllocatedNodes")
TASK_PROPERTIES = (
    "TaskId",
    "JobTaskId",
    "Name",
    "State",
    "ExitCode",
    "ErrorMessage",
    "RequiredNodes",
    "AllocatedNodes",
)
# Enough to list every task of a job in one request (the server's default page is 10 rows).
ROWS_PER_READ = 1000
# Tasks end in the same three states; before that the REST API reports ExitCode 0, which means nothing.
ENDED_TASK_STATES = ENDED_JOB_STATES
CONFIGURING = "Configuring"
CANCELING = "Canceling"


class RestError(HpcjobError):
    """A request the head node refused or could not answer; one line."""


class CancelError(RestError):
    """A cancel that failed; `state` is the job's state read afterwards (None: it could not be read)."""

    def __init__(self, message: str, state: str | None) -> None:
        super().__init__(message)
        self.state = state


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for reads: first wait, growth, longest wait, and the total deadline of one call."""

    first_wait_s: float = 0.5
    factor: float = 2.0
    max_wait_s: float = 8.0
    deadline_s: float = 60.0
    timeout_s: float = 30.0

    def waits(self) -> Iterable[float]:
        wait = self.first_wait_s
        while True:
            yield wait * random.uniform(0.8, 1.2)  # jitter: many clients do not retry in step
            wait = min(wait * self.factor, self.max_wait_s)


def properties(items: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """A RestProperty list as a dict; names compared without case, as the server does."""
    return {
        str(p.get("Name", p.get("name", ""))).lower(): str(p.get("Value", p.get("value", "")) or "")
        for p in items
    }


class RestClient:
    """One head node's REST API. `session` is a requests.Session (or a stand-in in tests)."""

    def __init__(
        self,
        base_url: str,
        user: str,
        password: str,
        *,
        verify: bool | str = True,
        retry: RetryPolicy | None = None,
        session: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            import requests
        except ImportError as exc:
            raise SpecError("the REST API needs the rest extra: pip install 'hpcjob[rest]'") from exc
        self._requests = requests
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.retry = retry or RetryPolicy()
        self.session = session or requests.Session()
        self.session.auth = (user, password)
        self.verify = verify
        self.session.headers.update({"Accept": "application/json"})
        self.sleep = sleep
        self.clock = clock

    # -- plumbing --------------------------------------------------------------------------------

    def _send(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> Any:
        # verify per request: requests lets REQUESTS_CA_BUNDLE override a session's verify, but not this.
        kwargs: dict[str, Any] = {"params": params, "timeout": self.retry.timeout_s, "verify": self.verify}
        if body is not None:
            kwargs["json"] = body
        return self.session.request(method, self.base_url + path, **kwargs)

    def _check(self, method: str, path: str, response: Any) -> Any:
        status = response.status_code
        if status in (401, 403):
            raise RestError(
                f"the head node refused the credentials of {self.user} (HTTP {status}): check the user name "
                "and password, and that the user may use the cluster"
            )
        if status >= 400:
            message = " ".join((response.text or "").split())[:300] or response.reason
            raise RestError(f"{method} {path}: HTTP {status}: {message}")
        if status == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise RestError(f"{method} {path}: the answer is not JSON: {response.text[:200]!r}") from None

    def read(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """A GET, retried on connection errors, timeouts and 5xx until the deadline."""
        deadline = self.clock() + self.retry.deadline_s
        waits = iter(self.retry.waits())
        while True:
            try:
                response = self._send("GET", path, params=params)
                if response.status_code < 500:
                    return self._check("GET", path, response)
                problem = f"HTTP {response.status_code}"
            except (self._requests.ConnectionError, self._requests.Timeout) as exc:
                _raise_if_untrusted(exc, self.base_url)
                problem = type(exc).__name__
            wait = next(waits)
            if self.clock() + wait > deadline:
                raise RestError(
                    f"GET {path}: no answer from {self.base_url} within "
                    f"{self.retry.deadline_s:.0f} s (last: {problem})"
                )
            self.sleep(wait)

    def write(self, method: str, path: str, body: Any = None, params: Mapping[str, str] | None = None) -> Any:
        """A request that changes the cluster: sent once; the caller decides about a retry."""
        try:
            response = self._send(method, path, params=params, body=body)
        except (self._requests.ConnectionError, self._requests.Timeout) as exc:
            _raise_if_untrusted(exc, self.base_url)  # refused in the handshake: nothing was sent
            raise RestUnsure(f"{method} {path}: {type(exc).__name__} talking to {self.base_url}") from None
        if response.status_code >= 500:
            raise RestUnsure(f"{method} {path}: HTTP {response.status_code}: {response.text[:200]}")
        return self._check(method, path, response)

    # -- operations ------------------------------------------------------------------------------

    def version(self) -> str:
        return str(self.read("/cluster/version"))

    def create_job(self, job_xml: str, unique_name: str) -> int:
        """`POST /jobs/jobFile`, at most one job: after a failure that may have reached the server,
        look the job up by its unique name before sending again."""
        for attempt in range(3):
            try:
                return int(self.write("POST", "/jobs/jobFile", body=job_xml))
            except RestUnsure:
                existing = self.find_job(unique_name)
                if existing is not None:
                    return existing
                if attempt == 2:
                    raise
                self.sleep(self.retry.first_wait_s * (attempt + 1))
        raise AssertionError("unreachable")

    def find_job(self, name: str) -> int | None:
        """The id of this user's job called `name`, if any (the newest)."""
        return self.find_jobs((name,)).get(name)

    def find_jobs(self, names: Collection[str]) -> dict[str, int]:
        """The ids of this user's jobs called one of `names` (the newest of each), from one listing:
        one request per 1000 of the user's jobs, stopping once every name is found."""
        wanted = set(names)
        found: dict[str, int] = {}
        start = 0
        while True:
            params = {
                "properties": "Id,Name",
                "owner": self.user,
                "rowsPerRead": str(ROWS_PER_READ),
                "startRow": str(start),
                "sortJobsBy": "Id",
                "asc": "false",
            }
            rows = self.read("/jobs", params) or []
            for row in rows:
                props = properties(row.get("Properties", []))
                name = props.get("name", "")
                if name in wanted and name not in found:
                    found[name] = int(props["id"])
            if len(found) == len(wanted) or len(rows) < ROWS_PER_READ:
                return found
            start += ROWS_PER_READ

    def submit(self, job_id: int) -> None:
        self.write("POST", f"/jobs/{job_id}/submit")

    def cancel(self, job_id: int, message: str, forced: bool = False) -> str | None:
        """Cancel the job: None when this request did it, else the state that made it needless:
        Canceling (on its way already; the scheduler refuses a second cancel unless forced) or an
        ended state. Otherwise raises CancelError, with the state read after the failure."""
        try:
            self.write("POST", f"/jobs/{job_id}/cancel", body=message, params={"forced": str(forced).lower()})
            return None
        except RestError as exc:
            failed = exc
        try:
            state = self.job(job_id).state
        except RestError:
            raise CancelError(str(failed), None) from None
        if isinstance(failed, RestUnsure) and state in (CANCELING, "Canceled"):
            return None  # the answer was lost, not the cancel
        if state == CANCELING or state in ENDED_JOB_STATES:
            return state
        raise CancelError(str(failed), state) from None

    def job(self, job_id: int) -> JobInfo:
        props = properties(self.read(f"/jobs/{job_id}", {"properties": ",".join(JOB_PROPERTIES)}) or [])
        return JobInfo(
            job_id=job_id,
            name=props.get("name", ""),
            state=props.get("state", ""),
            error=props.get("errormessage", ""),
        )

    def job_with_tasks(self, job_id: int) -> JobInfo:
        """The job and all its tasks: two requests, whatever the number of tasks."""
        job = self.job(job_id)
        rows = (
            self.read(
                f"/jobs/{job_id}/tasks",
                {"properties": ",".join(TASK_PROPERTIES), "rowsPerRead": str(ROWS_PER_READ)},
            )
            or []
        )
        tasks = []
        for row in rows:
            p = properties(row.get("Properties", []))
            state = p.get("state", "")
            exit_code = p.get("exitcode", "") if state in ENDED_TASK_STATES else ""
            node = (p.get("allocatednodes") or p.get("requirednodes") or "").split(",")[0].strip()
            tasks.append(
                TaskInfo(
                    task_id=int(p.get("jobtaskid") or p.get("taskid", "0").split(".")[-1] or 0),
                    name=p.get("name", ""),
                    state=state,
                    exit_code=int(exit_code) if exit_code.lstrip("-").isdigit() else None,
                    node=node,
                    error=p.get("errormessage", ""),
                )
            )
        return JobInfo(
            job_id=job.job_id,
            name=job.name,
            state=job.state,
            error=job.error,
            tasks=tuple(sorted(tasks, key=lambda t: t.task_id)),
        )

    def task_output(self, job_id: int, task_id: int) -> str:
        props = properties(self.read(f"/jobs/{job_id}/tasks/{task_id}", {"properties": "Output"}) or [])
        return props.get("output", "")

    def nodes(self, group: str | None = None) -> list[NodeInfo]:
        """The nodes (of a group), HPC Pack 2019's `/cluster/nodes`, else 2016's `/nodes`."""
        try:
            rows = self.read("/cluster/nodes", {"group": group} if group else None) or []
            return [
                NodeInfo(
                    name=str(r["Name"]),
                    state=str(r.get("State", "")),
                    health=str(r.get("Health", "")),
                    groups=tuple(r.get("Groups") or ()),
                    cores=int(r["Cores"]) if isinstance(r.get("Cores"), int | float) else None,
                    gpus=len(r["GpuInfo"]) if isinstance(r.get("GpuInfo"), list) else None,
                )
                for r in rows
            ]
        except RestError as exc:
            if "HTTP 404" not in str(exc):
                raise
        names = None
        if group:
            names = {str(n).upper() for n in self.read(f"/nodes/groups/{group}") or []}
        rows = self.read("/nodes", {"properties": "Name,State,Health,NumCores"}) or []
        found = []
        for row in rows:
            p = properties(row.get("Properties", []))
            if names is None or p.get("name", "").upper() in names:
                found.append(
                    NodeInfo(
                        name=p.get("name", ""),
                        state=p.get("state", ""),
                        health=p.get("health", "OK"),
                        groups=(group,) if group else (),
                        cores=int(p["numcores"]) if p.get("numcores", "").isdigit() else None,
                    )
                )
        return found

    def busy_nodes(self) -> set[str]:
        """Nodes that running jobs hold now (upper case)."""
        rows = (
            self.read(
                "/jobs",
                {
                    "properties": "Id,AllocatedNodes",
                    "$filter": "JobState eq Running",
                    "rowsPerRead": str(ROWS_PER_READ),
                },
            )
            or []
        )
        busy: set[str] = set()
        for row in rows:
            allocated = properties(row.get("Properties", [])).get("allocatednodes", "")
            busy.update(n.strip().upper() for n in allocated.split(",") if n.strip())
        return busy


class RestUnsure(RestError):
    """A write that may or may not have reached the server (timeout, dropped connection, 5xx)."""


def _raise_if_untrusted(exc: BaseException, url: str) -> None:
    """A certificate that failed verification, at once: retrying cannot make it trusted."""
    reason = _verification_failure(exc)
    if reason is not None:
        raise RestError(
            f"the head node's certificate at {url} failed verification ({reason}): give the cluster's CA "
            "with `hpcjob cluster add ... --ca-bundle PATH`"
        ) from None


def _verification_failure(exc: BaseException) -> str | None:
    """The reason of the ssl.SSLCertVerificationError that requests and urllib3 wrap, if any."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return str(current.verify_message or current.reason or "certificate verify failed").rstrip(".")
        # requests keeps urllib3's error in args; urllib3's MaxRetryError keeps its cause in .reason.
        linked = (*current.args, current.__cause__, current.__context__, getattr(current, "reason", None))
        todo.extend(item for item in linked if isinstance(item, BaseException))
    return None


def choose_nodes(
    nodes: Sequence[NodeInfo],
    count: int,
    busy: set[str],
    group: str | None,
    exclude: Sequence[str] = (),
) -> tuple[str, ...]:
    """`count` usable nodes (Online, health OK, not excluded), idle ones first, in name order within
    each kind."""
    excluded = {name.upper() for name in exclude}
    usable = [n for n in nodes if n.usable and n.name.upper() not in excluded]
    ordered = sorted(usable, key=lambda n: (n.name.upper() in busy, n.name.upper()))
    if len(ordered) < count:
        where = f"in group {group}" if group else "in the cluster"
        found = ", ".join(
            f"{n.name} ({'excluded' if n.name.upper() in excluded else f'{n.state}, {n.health}'})"
            for n in nodes
        )
        raise SpecError(
            f"{count} node(s) needed but only {len(usable)} online, healthy and not excluded {where}; "
            f"found: {found or 'none'}"
        )
    return tuple(n.name for n in ordered[:count])


def mount_job_name(run_id: str) -> str:
    return f"{run_id}-mount"


def check_new_job_names(client: RestClient, run_id: str, mount: bool, cluster: str = "") -> None:
    """Refuse a run whose job names are taken on the cluster (one listing of the user's jobs): a create
    whose answer was lost looks its job up by name, and must never find an older job."""
    names = [run_id, mount_job_name(run_id)] if mount else [run_id]
    found = client.find_jobs(names)
    for name in names:
        if name in found:
            raise SpecError(
                f"job {found[name]}{_on(cluster)} is already named {name!r}: the run id names the run's "
                "jobs and must be new; choose another --run-id, or leave it out for a new one"
            )


@dataclass(frozen=True)
class Submission:
    """How far a submission got, reported before each next step so that the run's record always points
    to every job made: creating (no job yet, but a create's lost answer may have made one), mounting
    (the mount job exists), created (the job exists, not submitted), submitted, or canceled (hpcjob
    canceled the job, or the mount job, whose submit failed)."""

    state: str
    job_id: int | None = None
    mount_job_id: int | None = None


def submit_job(
    client: RestClient,
    run_id: str,
    job_file: str,
    mount: tuple[str, str] | None,
    progress: Callable[[str], None],
    *,
    cluster: str = "",
    record: Callable[[Submission], None] = lambda step: None,
) -> int:
    """Create and submit the job (after the mount job, if any, has finished); its id.

    `job_file` and the mount job's file come rendered: a backend builds no command line. The names must
    be new (check_new_job_names). `record` hears of each step before the next one starts; `cluster`
    names the cluster in messages. A job whose submit fails is canceled, so that nothing half-made is
    left in the scheduler; when that fails too, the error says so, and what is left where.
    """
    step = Submission("creating")
    record(step)
    if mount is not None:
        mount_file, mount_point = mount
        mount_id = client.create_job(mount_file, mount_job_name(run_id))
        step = Submission("mounting", mount_job_id=mount_id)
        record(step)
        _submit_or_cancel(client, mount_id, "the mount job", cluster, progress, step, record)
        progress(f"mounting the share at {mount_point} on the nodes (job {mount_id})")
        mounted = wait_for_job(client, mount_id, lambda line: None)
        if mounted.state != State.FINISHED:
            reasons = "; ".join(
                f"{t.node}: {t.error or t.state}" for t in mounted.tasks if t.state != "Finished"
            )
            raise RestError(
                f"the mount job {mount_id} {mounted.state}: {reasons or mounted.error} (it needs an HPC "
                "administrator; or mount once with `hpcjob render --format clusrun`, then --no-mount-step)"
            )
    job_id = client.create_job(job_file, run_id)
    step = Submission("created", job_id=job_id, mount_job_id=step.mount_job_id)
    record(step)
    _submit_or_cancel(client, job_id, "job", cluster, progress, step, record)
    record(Submission("submitted", job_id=job_id, mount_job_id=step.mount_job_id))
    return job_id


def _on(cluster: str) -> str:
    return f" on cluster {cluster}" if cluster else ""


def _submit_or_cancel(
    client: RestClient,
    job_id: int,
    what: str,
    cluster: str,
    progress: Callable[[str], None],
    step: Submission,
    record: Callable[[Submission], None],
) -> None:
    """Submit; when that fails, cancel the job. The error names both failures, if the cancel fails too,
    and the job left behind, with the command that cancels it."""
    try:
        _submit(client, job_id, what, progress)
        return
    except Exception as exc:  # whatever stopped the submit, the job must not stay half-made
        failed = exc
    unsure = isinstance(failed, RestUnsure)
    # A lost answer explains itself (_submit); a refusal needs saying what was refused.
    head = str(failed) if unsure else f"submitting {what} {job_id} failed: {failed or type(failed).__name__}"
    try:
        already = client.cancel(job_id, "submission by hpcjob failed")
    except CancelError as cancel_failed:
        where = f"{what} {job_id}"
        if cancel_failed.state is None:
            left = f"{where} may be left{_on(cluster)} (its state could not be read)"
        else:
            left = f"{where} was left in {cancel_failed.state}{_on(cluster)}"
        command = f"hpcjob cancel {job_id}" + (f" --cluster {cluster}" if cluster else "")
        raise RestError(
            f"{head}; canceling it failed too: {cancel_failed}; {left}: cancel it with `{command}`"
        ) from failed
    record(Submission("canceled", job_id=step.job_id, mount_job_id=step.mount_job_id))
    if already is None:
        done = f"hpcjob canceled {what} {job_id}" + (" so that it does not run unseen" if unsure else "")
    else:
        done = f"{what} {job_id} is {already}"
    raise RestError(f"{head}; {done}") from failed


def _submit(client: RestClient, job_id: int, what: str, progress: Callable[[str], None]) -> None:
    """Submit the job. When the answer is lost, its state tells whether the scheduler took the submit:
    still Configuring means no, and the submit is sent once more (twice in all); any other state means
    yes, and the job goes on. Raises RestUnsure, with the story, when the job is still Configuring."""
    for attempt in (1, 2):
        try:
            client.submit(job_id)
            return
        except RestUnsure as exc:
            lost = exc
        story = f"the submit request of {what} {job_id} got no answer" + (" twice" if attempt == 2 else "")
        try:
            state = client.job(job_id).state
        except RestError as exc:
            raise RestUnsure(f"{story} ({lost}), and its state could not be read ({exc})") from None
        if state != CONFIGURING:
            progress(f"{story}, but the scheduler has the job ({state})")
            return
        if attempt == 1:
            progress(f"{story} and the job is still {state}: sending it once more")
    raise RestUnsure(f"{story} (last: {lost}), and the job is still {CONFIGURING}")


@dataclass(frozen=True)
class PollPolicy:
    """Status polling: quick while things change, slower while they do not."""

    first_wait_s: float = 1.0
    factor: float = 1.5
    max_wait_s: float = 15.0


def job_summary(
    info: JobInfo, plan: JobPlan, wall_time_s: float, folder: ShareFolder | None, log_folder: str
) -> JobSummary:
    """The end of a submitted job as every backend reports it (the summary `run --local` prints).

    The scheduler knows the tasks' states; the share (`folder`, with the run's `log_folder` in it)
    knows what failed first and the training program's metrics. Without the share, the task the
    scheduler failed (the others it canceled, FailOnTaskFailure) is the first failure.
    """
    from hpcjob.logs import read_root_cause

    by_node = {task.node.upper(): task for task in info.tasks}
    nodes = []
    for planned in plan.tasks:
        task = by_node.get(planned.node.upper())
        state = State(task.state) if task and task.state in set(State) else State.CANCELED
        nodes.append(
            NodeResult(
                planned.node,
                state,
                task.exit_code if task else None,
                stdout_path=planned.stdout_path,
                stderr_path=planned.stderr_path,
            )
        )
    cause = None
    if info.state == State.FAILED:
        cause = read_root_cause(folder, log_folder) if folder is not None else None
        failed = [t for t in info.tasks if t.state == State.FAILED]
        if cause is None and failed:
            first = failed[0]
            reason = " ".join(first.error.split())
            cause = RootCause(node=first.node, exit_code=first.exit_code or 1, time=0.0, reason=reason)
    lines: list[str] = []
    if folder is not None:
        for planned in plan.tasks:
            try:
                text = folder.read_bytes(f"{log_folder}/{planned.node}.out").decode("utf-8", "replace")
            except FileNotFoundError:
                continue
            lines.extend(text.splitlines())
    failed_codes = [t.exit_code for t in info.tasks if t.state == State.FAILED and t.exit_code]
    return JobSummary(
        name=plan.name,
        run_id=plan.run_id,
        state=State(info.state),
        exit_code=job_exit_code(info.state, failed_codes[0] if failed_codes else None, cause),
        wall_time_s=round(wall_time_s, 3),
        job_dir=plan.job_dir,
        log_dir=plan.log_dir,
        nodes=nodes,
        root_cause=cause,
        metrics=find_metrics(lines),
        job_id=str(info.job_id),
    )


def wait_for_job(
    client: RestClient,
    job_id: int,
    progress: Callable[[str], None],
    *,
    poll: PollPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> JobInfo:
    """Poll the job (two requests a poll, whatever its size) until it ends, reporting each change."""
    poll = poll or PollPolicy()
    seen: dict[str, str] = {}
    wait = poll.first_wait_s
    while True:
        info = client.job_with_tasks(job_id)
        changes = _changes(info, seen)
        for line in changes:
            progress(line)
        if info.ended:
            return info
        wait = poll.first_wait_s if changes else min(wait * poll.factor, poll.max_wait_s)
        sleep(wait)


def _changes(info: JobInfo, seen: dict[str, str]) -> list[str]:
    lines = []
    job_line = f"job {info.job_id}: {info.state}" + (f" ({info.error})" if info.error else "")
    if seen.get("") != job_line:
        seen[""] = job_line
        lines.append(job_line)
    for task in info.tasks:
        key = f"task{task.task_id}"
        line = f"{task.node or task.name}: {task.state}"
        if task.exit_code is not None and task.state in ENDED_JOB_STATES:
            line += f" (exit code {task.exit_code})"
        if seen.get(key) != line:
            seen[key] = line
            lines.append(line)
    return lines
