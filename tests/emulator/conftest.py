"""Fixtures for the HPC Pack emulator tests: a started head node and a client that checks every answer
against the REST spec."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from hpcjob.emulator import HeadNode, NodeSpec

from .spec_check import check

PASSWORD = "s3cret-Pw"  # a test password: the emulator must never print or log it
GRACE = 1.0
GPU = ("ComputeNodes", "LinuxNodes", "GPUNodes")
NODES = [
    NodeSpec("LOCALHOST", groups=GPU, cores=4),
    NodeSpec("GPU02", groups=GPU, cores=4),
    NodeSpec("GPU03", groups=GPU, cores=4, state="Offline"),
    NodeSpec("CPU04", groups=("ComputeNodes", "LinuxNodes"), cores=8),
]


class Client:
    """requests against the head node; every answer is checked against the spec for its path."""

    def __init__(self, head: HeadNode, user: str = "alice", password: str = PASSWORD) -> None:
        self.head = head
        self.session = requests.Session()
        self.session.auth = (user, password)
        # Not session.verify: REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE in the environment would win over it.
        self.session.trust_env = False
        self.session.verify = head.ca_file

    def request(self, method: str, path: str, *, spec: bool = True, **kwargs: Any) -> requests.Response:
        response = self.session.request(
            method, self.head.url + path, timeout=kwargs.pop("timeout", 10), **kwargs
        )
        if spec:
            check(
                method,
                requests.utils.urlparse(response.url).path,
                response.status_code,
                response.content,
                response.headers.get("Content-Type", ""),
            )
        return response

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    # ----------------------------------------------------------------------------- conveniences

    def props(self, path: str, **params: str) -> dict[str, str]:
        response = self.get(path, params=params)
        assert response.status_code == 200, response.text
        return {p["Name"]: p["Value"] for p in response.json()}

    def rows(self, path: str, **params: str) -> list[dict[str, str]]:
        response = self.get(path, params=params)
        assert response.status_code == 200, response.text
        return [{p["Name"]: p["Value"] for p in row["Properties"]} for row in response.json()]

    def submit_xml(self, xml: str) -> int:
        created = self.post("/jobs/jobFile", json=xml)
        assert created.status_code == 200, created.text
        job_id = created.json()
        assert isinstance(job_id, int)
        submitted = self.post(f"/jobs/{job_id}/submit")
        assert submitted.status_code == 204, submitted.text
        return job_id

    def wait(
        self, job_id: int, states: tuple[str, ...] = ("Finished", "Failed", "Canceled"), timeout=20.0
    ) -> str:
        """Poll like a client: GET /jobs/{id}?properties=State until one of ``states``."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.props(f"/jobs/{job_id}", properties="State")["State"]
            if state in states:
                return state
            assert time.monotonic() < deadline, f"job {job_id} still {state}"
            time.sleep(0.05)

    def wait_task(self, job_id: int, task_id: int, states: tuple[str, ...], timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.props(f"/jobs/{job_id}/tasks/{task_id}", properties="State")["State"]
            if state in states:
                return state
            assert time.monotonic() < deadline, f"task {job_id}.{task_id} still {state}"
            time.sleep(0.05)


@pytest.fixture
def head() -> Iterator[HeadNode]:
    with HeadNode(
        NODES, users={"alice": PASSWORD, "bob": "bob-pw"}, admins={"alice"}, grace_period=GRACE
    ) as started:
        yield started
        assert not started.live_processes(), "a task process outlived its job"


@pytest.fixture
def client(head: HeadNode) -> Client:
    return Client(head)


@pytest.fixture
def make_head() -> Iterator[Callable[..., HeadNode]]:
    """Start a head node with other settings; closed at the end of the test."""
    started: list[HeadNode] = []

    def make(**kwargs: Any) -> HeadNode:
        kwargs.setdefault("users", {"alice": PASSWORD})
        kwargs.setdefault("grace_period", GRACE)
        node = HeadNode(kwargs.pop("nodes", NODES), **kwargs).start()
        started.append(node)
        return node

    yield make
    for node in started:
        node.close()


def job_xml(*tasks: str, **job: str) -> str:
    """A job file like hpcjob writes: root with the scheduler namespace, attributes as given."""
    attributes = " ".join(f'{k}="{v}"' for k, v in job.items())
    return (
        f'<?xml version="1.0" encoding="utf-8"?>\n<Job Version="3.000" {attributes} '
        'xmlns="http://schemas.microsoft.com/HPCS2008R2/scheduler/">\n<Tasks>\n'
        + "\n".join(tasks)
        + "\n</Tasks>\n</Job>\n"
    )


def task_xml(command: str, **attributes: str) -> str:
    from xml.sax.saxutils import quoteattr

    rest = " ".join(f"{k}={quoteattr(v)}" for k, v in attributes.items())
    return f"<Task {rest} CommandLine={quoteattr(command)} />"
