"""The REST client, request by request, against the HPC Pack Swagger spec (paths, parameters, bodies)."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import ssl
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from hpcjob.backends.rest import (
    CancelError,
    RestClient,
    RestError,
    RestUnsure,
    wait_for_job,
)
from hpcjob.backends.scheduler import (
    TASKS_NAMED,
    PollPolicy,
    RetryPolicy,
    choose_nodes,
    follow_job,
    job_summary,
    pin_certificate,
    refuse_taken_names,
    run_job_names,
)
from hpcjob.cli.tables import format_summary
from hpcjob.emulator.tls import make_certificate
from hpcjob.job.plan import make_plan
from hpcjob.job.results import JobInfo, NodeInfo, TaskInfo
from hpcjob.job.spec import SpecError
from hpcjob.store.share import LocalFolder

from .conftest import REFERENCE, cluster_spec

SPEC_2019 = yaml.safe_load((REFERENCE / "hpcpack-rest-api" / "hpcpack.yaml").read_text())
SPEC_2016 = yaml.safe_load((REFERENCE / "hpcpack-rest-api" / "2016" / "hpcpack.yaml").read_text())


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        section, name = node["$ref"].split("/")[-2:]
        node = spec[section][name]
    return node


def operation(method: str, path: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The spec and operation a request matches, with its parameters; fails when none does."""
    for spec in (SPEC_2019, SPEC_2016):
        for template, ops in spec["paths"].items():
            pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
            if re.match(pattern, path) and method.lower() in ops:
                op = ops[method.lower()]
                params = [_resolve(spec, p) for p in op.get("parameters", []) + ops.get("parameters", [])]
                return spec, op, params
    raise AssertionError(f"{method} {path} is not in the HPC Pack REST API spec")


def check_schema(spec: dict[str, Any], schema: dict[str, Any], value: Any, where: str) -> None:
    schema = _resolve(spec, schema)
    kind = schema.get("type")
    if kind == "string":
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
    elif kind == "integer":
        assert isinstance(value, int), f"{where}: {value!r} is not an integer"
    elif kind == "array":
        assert isinstance(value, list), f"{where}: {value!r} is not an array"
        for item in value:
            check_schema(spec, schema.get("items", {}), item, where + "[]")
    elif kind == "object" or "properties" in schema:
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        for name in schema.get("required", []):
            assert name in value, f"{where}: {name} missing"
        for name, sub in schema.get("properties", {}).items():
            if name in value and value[name] is not None:
                check_schema(spec, sub, value[name], f"{where}.{name}")


@dataclass
class Response:
    status_code: int
    body: Any = None
    reason: str = ""

    @property
    def content(self) -> bytes:
        return b"" if self.body is None else json.dumps(self.body).encode()

    @property
    def text(self) -> str:
        return self.body if isinstance(self.body, str) else self.content.decode()

    def json(self) -> Any:
        return self.body


Handler = Callable[[str, str, dict[str, str], Any], Response]


@dataclass
class SpecSession:
    """A stand-in for requests.Session that checks every request against the spec, then asks `handler`."""

    handler: Handler
    sent: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    auth: Any = None
    verify: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        url: str,
        params: Any = None,
        json: Any = None,
        timeout: Any = None,
        verify: Any = None,
    ) -> Response:
        path = url.removeprefix("https://head/hpc")
        params = dict(params or {})
        spec, op, declared = operation(method, path)
        query = {p["name"] for p in declared if p["in"] == "query"}
        assert set(params) <= query, f"{method} {path}: undeclared query parameters {set(params) - query}"
        body = [p for p in declared if p["in"] == "body"]
        if json is not None:
            assert body, f"{method} {path} takes no body"
            check_schema(spec, body[0]["schema"], json, f"{method} {path} body")
        elif body:
            assert not body[0].get("required"), f"{method} {path} needs a body"
        assert timeout is not None, "every request needs a timeout"
        self.verify = verify
        self.sent.append((method, path, params, json))
        response = self.handler(method, path, params, json)
        if 200 <= response.status_code < 300 and response.body is not None:
            schema = op["responses"].get(response.status_code, {}).get("schema")
            if schema:
                check_schema(spec, schema, response.body, f"{method} {path} response")
        return response


def props(**values: object) -> list[dict[str, str]]:
    return [{"Name": k, "Value": str(v)} for k, v in values.items()]


def client_with(handler: Handler, **retry: float) -> tuple[RestClient, SpecSession, list[float]]:
    session = SpecSession(handler)
    slept: list[float] = []
    client = RestClient(
        "https://head/hpc",
        "alice",
        "secret",
        session=session,
        sleep=slept.append,
        clock=lambda: sum(slept),  # time passes only in the client's sleeps
        retry=RetryPolicy(deadline_s=retry.get("deadline_s", 60.0)),
    )
    return client, session, slept


def test_create_and_submit_send_the_job_file_as_a_json_string() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/jobFile":
            return Response(200, 42)
        return Response(204)

    client, session, _ = client_with(handler)
    assert client.create_job("<Job/>", "run-1") == 42
    client.submit(42)
    assert [(m, p, b) for m, p, _, b in session.sent] == [
        ("POST", "/jobs/jobFile", "<Job/>"),
        ("POST", "/jobs/42/submit", None),
    ]
    assert session.auth == ("alice", "secret") and session.verify is True


def test_a_create_that_timed_out_is_found_by_its_name_not_sent_twice() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/jobFile":
            raise requests.Timeout("read timed out")  # the server made job 7 all the same
        assert params["owner"] == "alice"
        return Response(
            200, [{"Properties": props(Id=6, Name="other")}, {"Properties": props(Id=7, Name="run-1")}]
        )

    client, session, _ = client_with(handler)
    assert client.create_job("<Job/>", "run-1") == 7
    assert [p for _, p, _, _ in session.sent].count("/jobs/jobFile") == 1


def test_a_create_that_never_arrived_is_sent_again() -> None:
    attempts = []

    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/jobFile":
            attempts.append(1)
            if len(attempts) == 1:
                raise requests.ConnectionError("connection refused")
            return Response(200, 8)
        return Response(200, [])

    client, _, _ = client_with(handler)
    assert client.create_job("<Job/>", "run-1") == 8
    assert len(attempts) == 2


def test_reads_are_retried_with_backoff_within_a_deadline() -> None:
    answers = [Response(503), Response(502)]

    def flaky(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if answers:
            return answers.pop(0)
        return Response(200, "5.3.6420.0")

    client, _, slept = client_with(flaky)
    assert client.version() == "5.3.6420.0"
    assert len(slept) == 2 and slept[1] > slept[0]

    def down(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        raise requests.ConnectionError("no route")

    client, session, slept = client_with(down, deadline_s=10.0)
    with pytest.raises(
        RestError, match=r"no answer from https://head/hpc within 10 s \(last: ConnectionError\)"
    ):
        client.version()
    assert sum(slept) <= 10.0 and len(session.sent) >= 3


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_one_line(status: int) -> None:
    client, _, _ = client_with(lambda *a: Response(status, "Unauthorized"))
    with pytest.raises(RestError) as info:
        client.version()
    assert str(info.value).startswith(f"the head node refused the credentials of alice (HTTP {status})")
    assert "secret" not in str(info.value)


def test_other_client_errors_show_the_servers_message() -> None:
    client, _, _ = client_with(lambda *a: Response(400, "The job XML is invalid:\r\n line 3."))
    with pytest.raises(RestError, match=r"^POST /jobs/jobFile: HTTP 400: The job XML is invalid: line 3\.$"):
        client.create_job("<Job", "run-1")


def test_cancel_is_idempotent() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path.endswith("/cancel"):
            assert params == {"forced": "false"} and body == "Canceled by hpcjob"
            return Response(400, "Jobs in the Finished state cannot be canceled.")
        return Response(200, props(Id=3, Name="run-1", State="Finished"))

    client, _, _ = client_with(handler)
    assert client.cancel(3, "Canceled by hpcjob") == "Finished"


@pytest.mark.parametrize(
    ("answer", "state", "outcome"),
    [
        # Someone canceled it already: the scheduler refuses a second cancel (unforced) while it stops.
        (Response(400, "Jobs in the Canceling state cannot be canceled."), "Canceling", "Canceling"),
        # Our cancel's answer was lost, but the job shows it worked.
        (requests.ConnectionError("reset"), "Canceling", None),
        (Response(502, "Bad Gateway"), "Canceled", None),
    ],
)
def test_cancel_of_a_job_being_canceled_is_a_success(
    answer: Response | Exception, state: str, outcome: str | None
) -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path.endswith("/cancel"):
            if isinstance(answer, Exception):
                raise answer
            return answer
        return Response(200, props(Id=3, Name="run-1", State=state))

    client, _, _ = client_with(handler)
    assert client.cancel(3, "Canceled by hpcjob") == outcome


def test_a_failed_cancel_says_the_state_it_left() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path.endswith("/cancel"):
            return Response(403, "Forbidden")
        return Response(200, props(Id=3, Name="run-1", State="Running"))

    client, _, _ = client_with(handler)
    with pytest.raises(CancelError) as info:
        client.cancel(3, "Canceled by hpcjob")
    assert info.value.state == "Running"


def test_the_exit_code_of_a_task_that_has_not_ended_is_unknown() -> None:
    # The REST API reports ExitCode 0 for tasks that have not ended.
    states = ["Queued", "Running", "Canceling", "Finished", "Failed", "Canceled"]

    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/5/tasks":
            rows = [
                props(
                    TaskId=f"5.{i}", JobTaskId=i, State=state, ExitCode=0 if i < 5 else 1, AllocatedNodes="N1"
                )
                for i, state in enumerate(states, 1)
            ]
            return Response(200, [{"Properties": row} for row in rows])
        return Response(200, props(Id=5, Name="r", State="Running"))

    client, _, _ = client_with(handler)
    info = client.job_with_tasks(5)
    assert [(t.state, t.exit_code) for t in info.tasks] == [
        ("Queued", None),
        ("Running", None),
        ("Canceling", None),
        ("Finished", 0),
        ("Failed", 1),
        ("Canceled", 1),
    ]


def test_a_run_whose_job_names_are_taken_is_refused_in_one_request() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        assert (params["owner"], params["sortJobsBy"], params["asc"]) == ("alice", "Id", "false")
        rows = [props(Id=9, Name="exp-2-mount"), props(Id=8, Name="other"), props(Id=3, Name="exp-1")]
        return Response(200, [{"Properties": row} for row in rows])

    client, session, _ = client_with(handler)
    assert client.find_jobs(["exp-1", "exp-2-mount", "new"]) == {"exp-2-mount": 9, "exp-1": 3}

    def check_new_job_names(client: RestClient, run_id: str, mount: bool, cluster: str) -> None:
        names = run_job_names(run_id, mount)
        refuse_taken_names(names, client.find_jobs(names), cluster)

    with pytest.raises(SpecError) as info:
        check_new_job_names(client, "exp-1", mount=False, cluster="prod")
    assert str(info.value) == (
        "job 3 on cluster prod is already named 'exp-1': the run id names the run's jobs and must be new; "
        "choose another --run-id, or leave it out for a new one"
    )
    check_new_job_names(client, "exp-2", mount=False, cluster="prod")
    with pytest.raises(SpecError, match=r"^job 9 on cluster prod is already named 'exp-2-mount'"):
        check_new_job_names(client, "exp-2", mount=True, cluster="prod")
    assert len(session.sent) == 4  # one listing each


def test_status_of_a_128_node_job_is_two_requests() -> None:
    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/9/tasks":
            assert int(params["rowsPerRead"]) >= 128
            return Response(
                200,
                [
                    {
                        "Properties": props(
                            TaskId=f"9.{i}",
                            JobTaskId=i,
                            Name=f"torchrun N{i:03d}",
                            State="Failed" if i == 5 else "Canceled",
                            ExitCode=3 if i == 5 else 130,
                            AllocatedNodes=f"N{i:03d}",
                        )
                    }
                    for i in range(128, 0, -1)
                ],
            )
        return Response(200, props(Id=9, Name="run-9", State="Failed", ErrorMessage="task failed"))

    client, session, _ = client_with(handler)
    info = client.job_with_tasks(9)
    assert len(session.sent) == 2
    assert [t.task_id for t in info.tasks] == list(range(1, 129))
    assert info.tasks[4].node == "N005" and info.exit_code() == 3


def test_nodes_from_2019_else_the_2016_api() -> None:
    node = {"Name": "GPU1", "State": "Online", "Health": "OK", "Groups": ["GPUNodes"]}
    client, session, _ = client_with(lambda *a: Response(200, [node]))
    assert client.nodes("GPUNodes") == [NodeInfo("GPU1", "Online", "OK", ("GPUNodes",))]
    assert session.sent[0][2] == {"group": "GPUNodes"}

    def old(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/cluster/nodes":
            return Response(404, "Not Found")
        if path == "/nodes/groups/GPUNodes":
            return Response(200, ["GPU1"])
        return Response(
            200,
            [
                {"Properties": props(Name="GPU1", State="Online")},
                {"Properties": props(Name="CPU1", State="Online")},
            ],
        )

    client, _, _ = client_with(old)
    assert [n.name for n in client.nodes("GPUNodes")] == ["GPU1"]


def test_choose_nodes_prefers_idle_healthy_online_nodes() -> None:
    nodes = [
        NodeInfo("GPU3", "Online", "OK"),
        NodeInfo("GPU1", "Online", "OK"),
        NodeInfo("GPU2", "Offline", "OK"),
        NodeInfo("GPU4", "Online", "Error"),
        NodeInfo("GPU5", "Online", "OK"),
    ]
    assert choose_nodes(nodes, 2, {"GPU1"}, "GPUNodes") == ("GPU3", "GPU5")
    assert choose_nodes(nodes, 3, {"GPU1"}, "GPUNodes") == ("GPU3", "GPU5", "GPU1")
    with pytest.raises(SpecError) as info:
        choose_nodes(nodes, 4, set(), "GPUNodes")
    assert str(info.value) == (
        "4 node(s) needed but only 3 online, healthy and not excluded in group GPUNodes; found: "
        "GPU3 (Online, OK), GPU1 (Online, OK), GPU2 (Offline, OK), GPU4 (Online, Error), GPU5 (Online, OK)"
    )
    # An excluded node is never chosen, however idle; the error says why it was passed over.
    assert choose_nodes(nodes, 2, {"GPU1"}, "GPUNodes", exclude=("gpu3",)) == ("GPU5", "GPU1")
    with pytest.raises(SpecError, match=r"only 2 online, healthy and not excluded .* GPU3 \(excluded\)"):
        choose_nodes(nodes, 3, set(), "GPUNodes", exclude=("GPU3",))


def test_waiting_backs_off_while_nothing_changes_and_reports_changes() -> None:
    states = iter(["Queued", "Queued", "Queued", "Running", "Running", "Finished"])
    current = {"state": "Queued"}

    def handler(method: str, path: str, params: dict[str, str], body: Any) -> Response:
        if path == "/jobs/4":
            current["state"] = next(states)
            return Response(200, props(Id=4, Name="r", State=current["state"]))
        task_state = {"Queued": "Queued", "Running": "Running", "Finished": "Finished"}[current["state"]]
        return Response(
            200,
            [
                {
                    "Properties": props(
                        TaskId="4.1",
                        JobTaskId=1,
                        Name="t",
                        State=task_state,
                        ExitCode=0,
                        RequiredNodes="GPU1",
                    )
                }
            ],
        )

    client, _, _ = client_with(handler)
    lines: list[str] = []
    waits: list[float] = []
    info = wait_for_job(client, 4, lines.append, poll=PollPolicy(1.0, 2.0, 3.0), sleep=waits.append)
    assert info.state == "Finished"
    assert lines == [
        "job 4: Queued",
        "GPU1: Queued",
        "job 4: Running",
        "GPU1: Running",
        "job 4: Finished",
        "GPU1: Finished (exit code 0)",
    ]
    assert waits == [1.0, 2.0, 3.0, 1.0, 2.0]


def test_a_job_of_many_tasks_is_told_as_counts_naming_only_the_tasks_that_failed() -> None:
    """1,000 nodes starting are a line a change of the counts, not a line a task (issue 42); a failed
    task is still named with its exit code. A job of TASKS_NAMED tasks keeps a line a task."""
    size = TASKS_NAMED + 1

    def job(states: list[str], codes: dict[int, int] | None = None) -> JobInfo:
        tasks = tuple(
            TaskInfo(i + 1, f"t{i}", state,
                     (codes or {}).get(i, 0) if state in ("Finished", "Failed") else None, f"GPU{i:02d}")
            for i, state in enumerate(states)
        )  # fmt: skip
        ended = all(state in ("Finished", "Failed") for state in states)
        return JobInfo("9", "r", "Failed" if ended else "Running", "", tasks=tasks)

    polls = iter([
        job(["Queued"] * size),
        job(["Running"] * 5 + ["Queued"] * (size - 5)),
        job(["Running"] * size),
        job(["Running"] * (size - 1) + ["Failed"], {size - 1: 3}),
        job(["Finished"] * (size - 1) + ["Failed"], {size - 1: 3}),
    ])  # fmt: skip
    lines: list[str] = []
    follow_job(lambda: next(polls), lines.append, sleep=lambda s: None)
    last = f"GPU{size - 1:02d}"
    assert lines == [
        "job 9: Running",
        f"{size} tasks: {size} Queued",
        f"{size} tasks: {size - 5} Queued, 5 Running",
        f"{size} tasks: {size} Running",
        f"{last}: Failed (exit code 3)",
        f"{size} tasks: 1 Failed, {size - 1} Running",
        "job 9: Failed",
        f"{size} tasks: 1 Failed, {size - 1} Finished",
    ]
    few: list[str] = []
    follow_job(lambda: job(["Finished"] * TASKS_NAMED), few.append, sleep=lambda s: None)
    assert few == ["job 9: Failed"] + [f"GPU{i:02d}: Finished (exit code 0)" for i in range(TASKS_NAMED)]


def test_a_profile_s_poll_interval_is_the_longest_wait_and_bounds_the_first() -> None:
    assert PollPolicy.at_most(None) == PollPolicy()
    assert PollPolicy.at_most(60.0) == PollPolicy(first_wait_s=1.0, max_wait_s=60.0)
    assert PollPolicy.at_most(0.25) == PollPolicy(first_wait_s=0.25, max_wait_s=0.25)


class _VersionHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a version, as /hpc/cluster/version does."""

    def do_GET(self) -> None:
        body = json.dumps("6.3.8328.0").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def self_signed_head(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real HTTPS server on 127.0.0.1 with a self-signed certificate: its URL and its certificate."""
    cert, key = make_certificate(str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _VersionHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hpc", cert
    finally:
        server.shutdown()
        server.server_close()


def test_a_certificate_that_fails_verification_is_reported_at_once(self_signed_head: tuple[str, str]) -> None:
    url, cert = self_signed_head
    slept: list[float] = []
    client = RestClient(url, "alice", "secret", verify=True, sleep=slept.append, clock=lambda: sum(slept))
    expected = (
        rf"^the head node's certificate at {re.escape(url)} failed verification \(self.signed certificate\): "
        r"give the cluster's CA with `hpcjob cluster add \.\.\. --ca-bundle PATH`, or pin its certificate "
        r"with --cert-fingerprint$"
    )
    started = time.monotonic()
    with pytest.raises(RestError, match=expected):
        client.version()  # a read: not retried
    with pytest.raises(RestError, match=expected) as info:
        client.submit(1)  # a write: refused in the handshake, so surely not sent
    assert not isinstance(info.value, RestUnsure)
    assert slept == [] and time.monotonic() - started < 5.0
    # The same server, trusted: the failure was the certificate's, nothing else.
    assert RestClient(url, "alice", "secret", verify=cert).version() == "6.3.8328.0"


@pytest.mark.parametrize("digest", ["sha256", "sha1"])
def test_a_pinned_certificate_is_trusted_by_its_fingerprint_alone(
    self_signed_head: tuple[str, str], digest: str
) -> None:
    """HPC Pack's own certificate is self-signed with no host name in it: the profile pins it by its
    SHA-256 fingerprint or by the SHA-1 thumbprint that the Azure template's deployment gives."""
    url, cert = self_signed_head
    der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text())
    thumbprint = hashlib.new(digest, der).hexdigest().upper()  # as Windows shows it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no InsecureRequestWarning: the pin verified the server
        assert RestClient(url, "alice", "secret", fingerprint=thumbprint).version() == "6.3.8328.0"
    wrong = "ab" * (len(thumbprint) // 2)
    slept: list[float] = []
    client = RestClient(
        url, "alice", "secret", fingerprint=wrong, sleep=slept.append, clock=lambda: sum(slept)
    )
    with pytest.raises(RestError, match=r"failed verification \(its fingerprint is not the cluster"):
        client.version()
    assert slept == []


def test_the_pin_holds_through_an_https_proxy_too() -> None:
    """requests builds the pool manager of a proxy apart from the direct one: both must carry the pin."""
    session = requests.Session()
    pin_certificate(session, "AB" * 20)
    adapter = session.get_adapter("https://head.contoso.com")
    assert adapter.poolmanager.connection_pool_kw["assert_fingerprint"] == "ab" * 20
    proxied = adapter.proxy_manager_for("http://proxy.contoso.com:3128")
    assert proxied.connection_pool_kw["assert_fingerprint"] == "ab" * 20


def test_a_submitted_job_ends_with_the_summary_of_a_local_run(tmp_path: Path) -> None:
    """submit --wait prints what run --local prints: from the scheduler's states and the share's files."""
    spec = cluster_spec(2)
    plan = make_plan(spec, spec.node_names, "r-7")
    logs = tmp_path / "hpcjob" / "run_ddp" / "logs" / "r-7"
    (logs / ".hpcjob-exits").mkdir(parents=True)
    (logs / ".hpcjob-exits" / "rank-5").write_text("10.5 5 137 GPUNODE002 SIGKILL\n")
    (logs / "GPUNODE002.exit").write_text("137 10.9\n")
    (logs / "GPUNODE001.out").write_text('epoch 1\nHPCJOB_METRICS {"accuracy": 0.91234}\n')
    info = JobInfo(
        job_id="42",
        name="r-7",
        state="Failed",
        error="Task 2 failed",
        tasks=(
            TaskInfo(1, "torchrun GPUNODE001", "Canceled", 130, "GPUNODE001"),
            TaskInfo(2, "torchrun GPUNODE002", "Failed", 1, "GPUNODE002", "exit code 1"),
        ),
    )
    summary = job_summary(info, plan, 125.0, LocalFolder(tmp_path), "hpcjob/run_ddp/logs/r-7")
    assert (summary.exit_code, summary.job_id, summary.metrics) == (137, "42", {"accuracy": 0.91234})
    assert format_summary(summary).splitlines()[:5] == [
        "job run_ddp Failed in 2 min 5 s, exit code 137 (run r-7)",
        "  NODE        STATE     EXIT CODE",
        "  GPUNODE001  Canceled  130",
        "  GPUNODE002  Failed    1",
        "  first failure: rank 5 on GPUNODE002, killed by SIGKILL (exit code 137)",
    ]
    # Without the share, the task the scheduler failed is the first failure, with its error.
    alone = job_summary(info, plan, 125.0, None, "")
    assert alone.root_cause is not None and alone.root_cause.describe() == (
        "the task on GPUNODE002, exit code 1: exit code 1"
    )
    assert alone.exit_code == 1 and alone.metrics is None
