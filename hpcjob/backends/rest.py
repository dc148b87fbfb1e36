"""The HPC Pack REST API (`https://<head node>/hpc`, HPC Pack 2016 Update 3 and 2019).

Contract: shared/reference/hpcpack-rest-api/hpcpack.yaml; behaviour: facts/hpcpack-rest.md. Bodies are
JSON: property lists `[{"Name": .., "Value": ..}]` with string values. A job is created from the
generated job XML with `POST /jobs/jobFile`, then submitted; its state is polled. Reads are retried
on connection errors, timeouts and 5xx, with backoff, within a deadline. A create is never blindly
repeated: after a failure that may have reached the server, the job is looked up by its unique name
(so names must be new: scheduler.cluster_plan checks). Nor is a submit: after a lost answer, the job's state
says whether the scheduler has it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
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
from hpcjob.job.plan import mount_job_name
from hpcjob.job.results import ENDED_JOB_STATES, JobInfo, NodeInfo, State, Submission, TaskInfo
from hpcjob.job.spec import HpcjobError, SpecError

if TYPE_CHECKING:
    from hpcjob.backends import Watch
    from hpcjob.job.plan import JobPlan, MountStep
    from hpcjob.job.render import JobShape
    from hpcjob.job.results import MountResult
    from hpcjob.job.spec import JobSpec
    from hpcjob.store.config import ClusterProfile
    from hpcjob.store.runs import RunRecord

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
    "StartTime",
    "EndTime",
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


def properties(items: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """A RestProperty list as a dict; names compared without case, as the server does."""
    found = {}
    for p in items:  # 1,000 tasks' rows a poll: one look-up a key where the server spells it so
        name = p["Name"] if "Name" in p else p.get("name", "")
        value = p["Value"] if "Value" in p else p.get("value", "")
        found[str(name).lower()] = str(value or "")
    return found


class RestClient:
    """One head node's REST API. `session` is a requests.Session (or a stand-in in tests)."""

    def __init__(
        self,
        base_url: str,
        user: str,
        password: str,
        *,
        verify: bool | str = True,
        fingerprint: str | None = None,
        retry: RetryPolicy | None = None,
        session: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import requests  # a base dependency, imported here to keep the CLI's start-up light

        self._requests = requests
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.retry = retry or RetryPolicy()
        self.session = session or requests.Session()
        self.session.auth = (user, password)
        self.verify = verify
        if fingerprint is not None:
            pin_certificate(self.session, fingerprint)
            self.verify = False  # the pin is the verification (scheduler.pin_certificate)
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
            job_id=str(job_id),
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
                    start=scheduler_time(p.get("starttime", "")),
                    end=scheduler_time(p.get("endtime", "")),
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
            return [_node_info(r) for r in rows]
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

    def named_nodes(self, names: Collection[str]) -> list[NodeInfo]:
        """The nodes called one of `names`, in one request (HPC Pack 2019's `/cluster/nodes?names=`)."""
        rows = self.read("/cluster/nodes", {"names": ",".join(names)}) or []
        return [_node_info(row) for row in rows]

    def add_to_group(self, group: str, nodes: Sequence[str]) -> list[str]:
        """Put `nodes` in node group `group`, made first where the cluster has none of that name (SPEC19:
        `POST /cluster/nodeGroups` createNodeGroup, then `PATCH /cluster/nodeGroups/{name}/nodes`
        moveNodesOfGroup with a NodeGroupOperation `add`): the group's members after it, read back
        (getNodesOfGroup); GroupJoinError where one of `nodes` is not among them, whether the head node
        said so or not (the spec declares no error for an unknown node)."""
        from urllib.parse import quote

        path = f"/cluster/nodeGroups/{quote(group, safe='')}/nodes"
        return put_in_group(
            group,
            nodes,
            lambda: self._add_to_group(group, nodes, path),
            lambda: [str(name) for name in self.read(path) or []],
            unsure=(RestUnsure,),  # lost twice: what the members say
        )

    def _add_to_group(self, group: str, nodes: Sequence[str], path: str) -> None:
        """createNodeGroup where needed, then moveNodesOfGroup at `path`. Both are idempotent for what
        they leave, so a lost answer is asked again."""
        known = {str(row.get("Name", "")).lower() for row in self.read("/cluster/nodeGroups") or []}
        operation = {"GroupName": group, "Operation": "add", "NodeNames": list(nodes)}
        for attempt in (1, 2):
            try:
                if group.lower() not in known:
                    self.write("POST", "/cluster/nodeGroups", body={"Name": group, "Description": GROUP_TEXT})
                    known.add(group.lower())
                self.write("PATCH", path, body=operation)
                return
            except RestUnsure:
                if attempt == 2:
                    raise
                self.sleep(self.retry.first_wait_s)
                known = {str(row.get("Name", "")).lower() for row in self.read("/cluster/nodeGroups") or []}
            except RestError as exc:
                if "HTTP 403" in str(exc):
                    raise RestError(
                        f"the head node refused to put nodes in group {group} for {self.user} (HTTP 403): "
                        "it is a cluster administrator's right"
                    ) from None
                raise
        raise AssertionError("unreachable")

    def operate_node(self, name: str, operation: str) -> None:
        """`POST /cluster/nodes/{name}/operations/{operation}` (takeOffline, bringOnline): 202, done
        asynchronously (the caller reads the node's state for the result). The same request twice does
        no harm, so a lost answer is asked once more."""
        from urllib.parse import quote

        path = f"/cluster/nodes/{quote(name, safe='')}/operations/{operation}"
        for attempt in (1, 2):
            try:
                self.write("POST", path)
                return
            except RestUnsure:
                if attempt == 2:
                    raise
                self.sleep(self.retry.first_wait_s)
            except RestError as exc:
                if "HTTP 403" in str(exc):
                    raise RestError(
                        f"the head node refused to {operation} {name} for {self.user} (HTTP 403): it is a "
                        "cluster administrator's right"
                    ) from None
                if "HTTP 404" not in str(exc):
                    raise
                raise RestError(
                    f"{exc}: the head node knows no node {name}, or its REST API has no node operations "
                    "(HPC Pack 2016's has none: use the winrm backend)"
                ) from None

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


def _node_info(row: Mapping[str, Any]) -> NodeInfo:
    """A typed Node of HPC Pack 2019's `/cluster/nodes`."""
    return NodeInfo(
        name=str(row["Name"]),
        state=str(row.get("State", "")),
        health=str(row.get("Health", "")),
        groups=tuple(row.get("Groups") or ()),
        cores=int(row["Cores"]) if isinstance(row.get("Cores"), int | float) else None,
        gpus=len(row["GpuInfo"]) if isinstance(row.get("GpuInfo"), list) else None,
    )


def _raise_if_untrusted(exc: BaseException, url: str) -> None:
    """A certificate that failed verification, at once: retrying cannot make it trusted."""
    reason = certificate_failure(exc)
    if reason is not None:
        raise RestError(
            f"the head node's certificate at {url} failed verification ({reason}): give the cluster's CA "
            "with `hpcjob cluster add ... --ca-bundle PATH`, or pin its certificate with --cert-fingerprint"
        ) from None


def submit_job(
    client: RestClient,
    run_id: str,
    job_file: str,
    mount: tuple[str, str] | None,
    progress: Callable[[str], None],
    *,
    cluster: str = "",
    record: Callable[[Submission], None] = lambda step: None,
    poll: PollPolicy | None = None,
) -> int:
    """Create and submit the job (after the mount job, if any, has finished); its id.

    `job_file` and the mount job's file come rendered: a backend builds no command line. The names must
    be new (scheduler.cluster_plan). `record` hears of each step before the next one starts; `cluster`
    names the cluster in messages; `poll` is how the mount job is followed. A job whose submit fails is
    canceled, so that nothing half-made is left in the scheduler; when that fails too, the error says so,
    and what is left where.
    """
    step = Submission("creating")
    record(step)
    if mount is not None:
        mount_file, mount_point = mount
        mount_id = client.create_job(mount_file, mount_job_name(run_id))
        step = Submission("mounting", mount_job_id=str(mount_id))
        record(step)
        _submit_or_cancel(client, mount_id, "the mount job", cluster, progress, step, record)
        progress(f"mounting the share at {mount_point} on the nodes (job {mount_id})")
        mounted = wait_for_job(client, mount_id, lambda line: None, poll=poll)
        if mounted.state != State.FINISHED:
            outputs = [(t.node, client.task_output(mount_id, t.task_id)) for t in mounted.tasks]
            raise RestError(mount_failure(str(mount_id), mount_results(mounted, outputs)))
    job_id = client.create_job(job_file, run_id)
    step = Submission("created", job_id=str(job_id), mount_job_id=step.mount_job_id)
    record(step)
    _submit_or_cancel(client, job_id, "job", cluster, progress, step, record)
    record(Submission("submitted", job_id=str(job_id), mount_job_id=step.mount_job_id))
    return job_id


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
            left = f"{where} may be left{on_cluster(cluster)} (its state could not be read)"
        else:
            left = f"{where} was left in {cancel_failed.state}{on_cluster(cluster)}"
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


def wait_for_job(
    client: RestClient,
    job_id: int,
    progress: Callable[[str], None],
    *,
    poll: PollPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    watch: Watch | None = None,
) -> JobInfo:
    """Poll the job (two requests a poll, whatever its size) until it ends, reporting each change."""
    return follow_job(lambda: client.job_with_tasks(job_id), progress, poll=poll, sleep=sleep, watch=watch)


Progress = Callable[[str], None]


class RestBackend:
    """The Backend over the REST API (hpcjob.backends.Backend)."""

    kind = "rest"

    def __init__(self, client: RestClient, cluster: str, poll: PollPolicy | None = None) -> None:
        self.client = client
        self.cluster = cluster
        self.poll = poll  # None: follow_job's default

    def nodes(self, group: str | None) -> list[NodeInfo]:
        return self.client.nodes(group)

    def busy_nodes(self) -> set[str]:
        return self.client.busy_nodes()

    def add_to_group(self, group: str, nodes: Sequence[str]) -> list[str]:
        return self.client.add_to_group(group, nodes)

    def take_offline(
        self, nodes: Sequence[str], *, force: bool, progress: Progress, timeout_s: float = OFFLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        """takeOffline each node, then read them until Offline. REST's takeOffline has no force
        (the spec): with `force`, a node that drains (a job runs there) counts as taken."""
        for name in nodes:
            self.client.operate_node(name, "takeOffline")
        return wait_for_nodes(
            lambda: self.client.named_nodes(nodes),
            nodes,
            is_offline(force),
            wanted=OFFLINE,
            timeout_s=timeout_s,
            progress=progress,
            poll=self.poll,
        )

    def bring_online(
        self, nodes: Sequence[str], *, progress: Progress, timeout_s: float = ONLINE_TIMEOUT_S
    ) -> list[NodeInfo]:
        for name in nodes:
            self.client.operate_node(name, "bringOnline")
        return wait_for_nodes(
            lambda: self.client.named_nodes(nodes),
            nodes,
            is_online,
            wanted=ONLINE,
            timeout_s=timeout_s,
            progress=progress,
            poll=self.poll,
        )

    def plan(self, spec: JobSpec, run_id: str, attempt: int = 1) -> JobPlan:
        find = self.client.find_jobs
        return cluster_plan(spec, run_id, self.nodes, self.busy_nodes, find, self.cluster, attempt)

    def submit(
        self,
        plan: JobPlan,
        *,
        mount: bool,
        progress: Callable[[str], None],
        record: Callable[[Submission], None],
    ) -> str:
        from hpcjob.job.render import job_xml, mount_job_xml

        steps = (mount_job_xml(plan), plan.mount.mount_point) if mount and plan.mount else None
        job_id = submit_job(
            self.client,
            plan.job_name,
            job_xml(plan),
            steps,
            progress,
            cluster=self.cluster,
            record=record,
            poll=self.poll,
        )
        return str(job_id)

    def job_id(self, run: RunRecord) -> int:
        return recorded_job_id(run, self.client.find_jobs, self.cluster)

    def status(self, run: RunRecord) -> JobInfo:
        return self.client.job_with_tasks(self.job_id(run))

    def wait(self, run: RunRecord, progress: Callable[[str], None], watch: Watch | None = None) -> JobInfo:
        return wait_for_job(self.client, self.job_id(run), progress, poll=self.poll, watch=watch)

    def cancel(self, run: RunRecord, *, force: bool) -> str | None:
        return self.client.cancel(self.job_id(run), "Canceled by hpcjob", forced=force)

    def task_outputs(self, run: RunRecord) -> list[tuple[str, str]]:
        job_id = self.job_id(run)
        return [
            (task.node, self.client.task_output(job_id, task.task_id))
            for task in self.client.job_with_tasks(job_id).tasks
        ]

    def mount(self, name: str, step: MountStep, shape: JobShape, progress: Progress) -> list[MountResult]:
        from hpcjob.job.render import mount_check_job_xml

        return mount_results(*self._node_job(name, mount_check_job_xml(name, step, shape), progress))

    def run_on_nodes(
        self, name: str, command: str, shape: JobShape, progress: Progress
    ) -> tuple[JobInfo, list[tuple[str, str]]]:
        from hpcjob.job.render import node_job_xml

        return self._node_job(name, node_job_xml(name, command, shape), progress)

    def _node_job(self, name: str, xml: str, progress: Progress) -> tuple[JobInfo, list[tuple[str, str]]]:
        job_id = submit_job(self.client, name, xml, None, progress, cluster=self.cluster)
        info = wait_for_job(self.client, job_id, progress, poll=self.poll)
        return info, [(t.node, self.client.task_output(job_id, t.task_id)) for t in info.tasks]

    def version(self) -> str | None:
        return self.client.version()

    def install_filter(self, command: str, shape: JobShape, progress: Progress) -> tuple[bool, str]:
        from hpcjob.job.render import admin_job_xml

        name = f"hpcjob-filter-install-{int(time.time())}"
        job_id = submit_job(
            self.client, name, admin_job_xml(name, command, shape), None, progress, cluster=self.cluster
        )
        info = wait_for_job(self.client, job_id, progress, poll=self.poll)
        said = "\n".join(
            f"{t.node}: {self.client.task_output(job_id, t.task_id).strip() or t.error}" for t in info.tasks
        )
        return info.state == State.FINISHED, said

    def close(self) -> None:
        self.client.session.close()


def open_backend(profile: ClusterProfile | None, password: str | None) -> RestBackend:
    if profile is None or password is None:
        raise SpecError("the REST backend needs a cluster profile: hpcjob cluster add NAME --url ...")
    if profile.insecure:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the CLI warns, once
    client = RestClient(
        profile.api_base, profile.user, password, verify=profile.verify, fingerprint=profile.cert_fingerprint
    )
    return RestBackend(client, profile.name, PollPolicy.at_most(profile.poll_interval))
