"""Fault injection: answers with a status, delays before/after processing, dropped connections."""

from __future__ import annotations

import time

import pytest
import requests

from hpcjob.emulator import HeadNode

from .conftest import Client, job_xml, task_xml


def test_next_request_answers_a_status(client: Client, head: HeadNode) -> None:
    fault = head.inject(method="get", path=r"/cluster/version$", status=503, times=2)
    assert client.get("/cluster/version", spec=False).status_code == 503
    failed = client.get("/cluster/version", spec=False)
    assert failed.status_code == 503 and "503" in failed.text
    assert client.get("/cluster/version").status_code == 200
    assert fault.hits == 2
    assert client.get("/cluster/activeHeadNode").status_code == 200  # other paths untouched


def test_an_injected_error_does_not_process_the_request(client: Client, head: HeadNode) -> None:
    head.inject(method="POST", path=r"/jobs$", status=500, body="Internal Server Error")
    response = client.post("/jobs", json=[], spec=False)
    assert (response.status_code, response.text) == (500, "Internal Server Error")
    assert client.rows("/jobs") == []


def test_a_create_that_times_out_still_creates_the_job(client: Client, head: HeadNode) -> None:
    head.inject(method="POST", path=r"/jobs/jobFile$", delay_after=2.0, times=1)
    xml = job_xml(task_xml("echo hi"), Name="unique-name-123")
    with pytest.raises(requests.exceptions.ReadTimeout):
        client.post("/jobs/jobFile", json=xml, timeout=0.5)
    # The client looks the job up by its unique name.
    jobs = client.rows("/jobs", properties="Id,Name,State", rowsPerRead="1000")
    assert [(j["Name"], j["State"]) for j in jobs] == [("unique-name-123", "Configuring")]


def test_delay_before(client: Client, head: HeadNode) -> None:
    head.inject(path=r"/cluster/version", delay_before=0.4)
    started = time.monotonic()
    assert client.get("/cluster/version").status_code == 200
    assert time.monotonic() - started >= 0.4


def test_dropped_connections(client: Client, head: HeadNode) -> None:
    head.inject(method="POST", path=r"/jobs$", drop="before")
    with pytest.raises(requests.exceptions.ConnectionError):
        client.post("/jobs", json=[{"Name": "Name", "Value": "lost"}])
    assert client.rows("/jobs") == []  # not processed
    head.inject(method="POST", path=r"/jobs$", drop="after")
    with pytest.raises(requests.exceptions.ConnectionError):
        client.post("/jobs", json=[{"Name": "Name", "Value": "made"}])
    assert [j["Name"] for j in client.rows("/jobs")] == ["made"]  # processed, answer lost
    assert client.post("/jobs", json=[]).status_code == 200


def test_faults_until_cleared_and_the_request_log(client: Client, head: HeadNode) -> None:
    head.requests.clear()
    head.inject(path=r"/jobs/\d+$", status=502, times=None)
    for _ in range(3):
        assert client.get("/jobs/1", spec=False).status_code == 502
    head.clear_faults()
    assert client.get("/jobs/1").status_code == 404
    assert len(head.requests) == 4
    assert head.requests.count("GET", r"/jobs/\d+$") == 4
    assert head.requests[0] == ("GET", "/hpc/jobs/1", "")
    client.get("/jobs", params={"properties": "Id,State"})
    method, path, query = head.requests[-1]
    assert (method, path) == ("GET", "/hpc/jobs") and "properties=Id%2CState" in query
